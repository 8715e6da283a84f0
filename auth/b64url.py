"""base64url without padding: the one spelling of keys, signatures and secrets on the wire.

``b64url_decode`` accepts the text with or without padding and raises ``ValueError`` (a
``binascii.Error`` or a ``UnicodeEncodeError``) on what is not base64url; callers turn that
into their own typed error and, where one spelling is required, compare
``b64url_encode(raw) == text``.
"""
from __future__ import annotations

import base64

__all__ = ["b64url_encode", "b64url_decode"]


def b64url_encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode((text + "=" * (-len(text) % 4)).encode("ascii"))
