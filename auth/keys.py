"""Ed25519 keys and domain-separated signatures.

Pure: no file or network I/O. Keys are turned into bytes here; node/ writes them to disk
(mode 0600) and reads them back.

Public keys are written ``ed25519:<base64url without padding>`` (43 characters after the
prefix). Every signature covers ``b"memmesh/v1\\0" + domain + b"\\0" + message`` so that a
signature made for one purpose (an entry, a sync request, a ticket) can never be replayed as
another.
"""
from __future__ import annotations

import binascii
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from memmesh.auth.b64url import b64url_decode, b64url_encode
from memmesh.auth.errors import KeyFormatError

KEY_PREFIX = "ed25519:"
SIGNATURE_LEN = 64
PUBLIC_KEY_LEN = 32

# Signing domains. A new purpose gets a new domain; never reuse one.
DOMAIN_ENTRY = b"entry"
DOMAIN_SYNC_REQUEST = b"sync-request"
DOMAIN_SYNC_RESPONSE = b"sync-response"
DOMAIN_TICKET = b"ticket"
DOMAIN_TICKET_REDEEM = b"ticket-redeem"

_PREFIX = b"memmesh/v1\x00"




def _signed_message(domain: bytes, message: bytes) -> bytes:
    if not domain or b"\x00" in domain:
        raise ValueError("a signing domain is a non-empty byte string without NUL")
    return _PREFIX + domain + b"\x00" + message


def _unb64url(text: str) -> bytes:
    try:
        return b64url_decode(text)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise KeyFormatError(f"not base64url: {text!r}") from exc


@dataclass(frozen=True, slots=True)
class PublicKey:
    """An Ed25519 public key; compares and hashes by its 32 raw bytes."""

    raw: bytes

    def __post_init__(self) -> None:
        if len(self.raw) != PUBLIC_KEY_LEN:
            raise KeyFormatError(f"an Ed25519 public key is {PUBLIC_KEY_LEN} bytes, got {len(self.raw)}")

    @classmethod
    def parse(cls, text: object) -> PublicKey:
        """Parse ``ed25519:<base64url>`` (any other value is refused); raises KeyFormatError with the reason."""
        if not isinstance(text, str) or not text.startswith(KEY_PREFIX):
            raise KeyFormatError(f"a public key looks like 'ed25519:<base64url>', got {text!r}")
        body = text[len(KEY_PREFIX):]
        if len(body) != 43:
            raise KeyFormatError(f"a public key has 43 base64url characters after 'ed25519:', got {len(body)}")
        raw = _unb64url(body)
        key = cls(raw)
        if str(key) != text:  # reject non-canonical spellings (padding bits set)
            raise KeyFormatError(f"non-canonical public key spelling: {text!r}")
        return key

    def __str__(self) -> str:
        return KEY_PREFIX + b64url_encode(self.raw)

    def verify(self, domain: bytes, message: bytes, signature: bytes) -> bool:
        """True iff ``signature`` is this key's signature of ``message`` in ``domain``."""
        return verify(self.raw, domain, message, signature)


class _VerifierCache:
    """Parsed verifier objects by raw key: building one costs as much as a verification."""

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._cache: dict[bytes, Ed25519PublicKey] = {}

    def get(self, raw: bytes) -> Ed25519PublicKey:
        key = self._cache.get(raw)
        if key is None:
            if len(self._cache) >= self._limit:
                self._cache.clear()
            key = self._cache[raw] = Ed25519PublicKey.from_public_bytes(raw)
        return key


_verifiers = _VerifierCache()


def verify(raw_public_key: bytes, domain: bytes, message: bytes, signature: bytes) -> bool:
    """Verify with a raw 32-byte key (the hot path for received entries)."""
    if len(signature) != SIGNATURE_LEN or len(raw_public_key) != PUBLIC_KEY_LEN:
        return False
    try:
        _verifiers.get(raw_public_key).verify(signature, _signed_message(domain, message))
    except (InvalidSignature, ValueError):
        return False
    return True


class SigningKey:
    """An Ed25519 private key. Never stored in a synced database."""

    __slots__ = ("_key", "public")

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self.public = PublicKey(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> SigningKey:
        """The key for a 32-byte seed (RFC 8032 private key)."""
        if len(seed) != 32:
            raise KeyFormatError(f"an Ed25519 seed is 32 bytes, got {len(seed)}")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    def seed(self) -> bytes:
        return self._key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())

    def sign(self, domain: bytes, message: bytes) -> bytes:
        return self._key.sign(_signed_message(domain, message))

    def __repr__(self) -> str:  # never print the secret
        return f"SigningKey({self.public})"


def public_key_str(raw: bytes) -> str:
    return KEY_PREFIX + b64url_encode(raw)


# The private-key file format: one line, "ed25519-private:<base64url seed>". Parsing lives
# here so that node/ only moves bytes between this function and a 0600 file.
PRIVATE_PREFIX = "ed25519-private:"


def encode_private(key: SigningKey) -> bytes:
    return (PRIVATE_PREFIX + b64url_encode(key.seed()) + "\n").encode("ascii")


def decode_private(data: bytes) -> SigningKey:
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError as exc:
        raise KeyFormatError("a private key file holds one ASCII line") from exc
    if not text.startswith(PRIVATE_PREFIX):
        raise KeyFormatError("a private key file starts with 'ed25519-private:'")
    return SigningKey.from_seed(_unb64url(text[len(PRIVATE_PREFIX):]))
