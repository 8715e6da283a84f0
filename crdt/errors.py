"""Typed errors shared by every layer.

Every error a user can meet is a MemmeshError. Rejections of untrusted input carry a short
stable ``reason`` code (e.g. ``"entry.signature"``) that tests, logs and per-peer counters
use, plus a human sentence in ``str(err)``.
"""
from __future__ import annotations

from memmesh.auth.errors import AuthError, KeyFormatError, MemmeshError, RejectedError

__all__ = [
    "MemmeshError", "RejectedError", "AuthError", "KeyFormatError", "UpdateRejected",
    "EntryRejected", "StorageError", "DamagedError", "WriteFailedError", "DiskFullError", "DiskIOError",
    "ReadOnlyError", "PendingFullError",
]


class UpdateRejected(RejectedError):
    """A Yjs update that the store's shape rules refuse."""


class EntryRejected(RejectedError):
    """A signed entry that fails validation (format, size, signature, feed, payload)."""


class StorageError(MemmeshError):
    """The durable store cannot do what was asked (full, corrupt, wrong version)."""


class DamagedError(StorageError):
    """Stored bytes fail their own checks (a torn or overwritten file, a damaged entry): what was
    written is not what is read back. The message names the file and what to do (restore a
    backup, or ``memmesh check --repair``, which fetches damaged entries again from peers)."""


class WriteFailedError(StorageError):
    """A write that could not commit (the disk refused it): it was rolled back, so nothing of it
    is stored, and the same write may be tried again once the cause is gone. Reads still work."""


class DiskFullError(WriteFailedError):
    """No room to write: the disk holding the file is full, or the file reached this process's
    file size limit (``ulimit -f``)."""


class DiskIOError(WriteFailedError):
    """The operating system reported an I/O error while writing (a failing disk, a lost mount)."""


class ReadOnlyError(WriteFailedError):
    """The file, its directory or its file system may not be written by this process."""


class PendingFullError(StorageError):
    """The storage's bound on entries waiting in the pending area refused one more: a refusal of
    that entry (``entry.pending_full``), not a failure of the disk."""
