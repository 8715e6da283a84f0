"""The root of memmesh's typed errors.

They live in auth/ because it is the bottom layer (imports flow node -> tickets -> crdt ->
auth); crdt.errors re-exports them. Rejections of untrusted input carry a short stable
``reason`` code (e.g. ``"entry.signature"``) used by tests, logs and per-peer counters, and a
human sentence in ``str(err)``.
"""
from __future__ import annotations


class MemmeshError(Exception):
    """Base of all typed memmesh errors."""


class RejectedError(MemmeshError):
    """Input refused by a validation rule; nothing was changed."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        self.detail = detail
        super().__init__(detail or reason)


class AuthError(RejectedError):
    """An operation the AuthSettings do not allow."""


class KeyFormatError(MemmeshError, ValueError):
    """A key, seed or signature in the wrong form."""
