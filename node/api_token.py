"""HOME/api.token: the bearer token of the local HTTP API and of `memmesh mcp --http`.

Created by `memmesh init` (and by serve for a home made before the API existed), mode 0600
from the moment the file exists: whoever can read it can run every command, so it is guarded
like a key file, and a token file readable by others is refused with the chmod to run.
"""
from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from memmesh.auth.errors import MemmeshError

TOKEN_FILE = "api.token"
TOKEN_BYTES = 32  # secrets.token_urlsafe(32): 43 characters, 256 bits


class TokenError(MemmeshError):
    """The API token file is missing, empty or readable by others."""


def token_path(home: Path | str) -> Path:
    return Path(home) / TOKEN_FILE


def create_token(home: Path | str) -> bool:
    """Write a new token unless the home has one; True when this call wrote it."""
    path = token_path(home)
    try:
        # O_EXCL: a token that clients already hold is never replaced behind their back.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    try:
        os.write(fd, (secrets.token_urlsafe(TOKEN_BYTES) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(path, 0o600)  # the umask may have narrowed it; never wider
    return True


def read_token(home: Path | str) -> str:
    path = token_path(home)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise TokenError(f"no API token at {path}; `memmesh serve` creates one") from None
    if st.st_mode & 0o077:
        raise TokenError(f"API token file {path} is readable by other users (mode {st.st_mode & 0o777:o}); "
                         f"run: chmod 600 {path}")
    token = path.read_text().strip()
    if not token:
        raise TokenError(f"API token file {path} is empty; remove it and start serve again to get a new one")
    return token


def ensure_token(home: Path | str) -> str:
    """The home's token, created first if the home has none yet."""
    create_token(home)
    return read_token(home)


def matches(given: str, expected: str) -> bool:
    """Constant time: how long the comparison takes says nothing about the token. ``given``
    comes from a header: bytes that are not UTF-8 reach it as lone surrogates (the server
    decodes with surrogateescape); encoded with surrogatepass they simply do not match (the
    token is ASCII) instead of raising."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())
