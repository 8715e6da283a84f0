"""Typed errors shared by every layer.

Every error a user can meet is a MemmeshError. Rejections of untrusted input carry a short
stable ``reason`` code (e.g. ``"entry.signature"``) that tests, logs and per-peer counters
use, plus a human sentence in ``str(err)``.
"""
from __future__ import annotations


from auth.errors import AuthError, KeyFormatError, MemmeshError, RejectedError

__all__ = [
    "MemmeshError", "RejectedError", "AuthError", "KeyFormatError", "UpdateRejected",
    "EntryRejected", "StorageError", "DamagedError",
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
