"""Private keys on disk: one file per key, mode 0600, in the node's home.

This is the only place private key bytes touch the file system. The format is auth's
(``ed25519-private:<base64url seed>``); this module only moves bytes and sets permissions.
"""
from __future__ import annotations

import os
from pathlib import Path

from memmesh.auth.errors import MemmeshError
from memmesh.auth.keys import SigningKey, decode_private, encode_private


class KeyStoreError(MemmeshError):
    """A key file is missing, truncated, damaged or readable by others."""


def save_key(path: Path, key: SigningKey) -> None:
    """Write a new key file with mode 0600; refuses to overwrite an existing key."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    data = encode_private(key)
    # O_EXCL: never replace a key that something may still depend on.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise KeyStoreError(f"key file {path} already exists; not overwriting it") from exc
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(path, 0o600)  # the umask may have narrowed it further; never wider


_RESTORE = "restore it from a backup (memmesh backup copies keys/)"


def load_key(path: Path) -> SigningKey:
    """The key in ``path``; a missing, truncated or damaged file is one line naming it and saying
    to restore it (a private key exists nowhere else: it cannot be fetched from peers)."""
    try:
        st = path.stat()
    except FileNotFoundError as exc:
        raise KeyStoreError(f"key file {path} is missing; {_RESTORE}") from exc
    if st.st_mode & 0o077:
        raise KeyStoreError(
            f"key file {path} is readable by other users (mode {st.st_mode & 0o777:o}); "
            f"run: chmod 600 {path}"
        )
    data = path.read_bytes().strip()
    if not data:
        raise KeyStoreError(f"key file {path} is empty (truncated); {_RESTORE}")
    try:
        return decode_private(data)
    except ValueError:  # KeyFormatError is one; the decoder's text may quote the key: never shown
        if len(data) < _LENGTH and (data.startswith(_PREFIX) or _PREFIX.startswith(data)):
            what = f"truncated: {len(data)} of its {_LENGTH} characters"
        else:
            what = "damaged: it does not hold an Ed25519 private key"
        raise KeyStoreError(f"key file {path} is {what}; {_RESTORE}") from None


_PREFIX = b"ed25519-private:"
_LENGTH = len(_PREFIX) + 43  # the prefix and a 32-byte seed in unpadded base64url
