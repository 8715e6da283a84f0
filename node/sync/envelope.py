"""Signed sync requests and responses (sans-IO: headers and bytes in, verdicts out).

Every sync request, pull and push alike, is signed by the calling peer's key over the method,
the path, the body's sha256, the target node's key, the time and a nonce (domain
``sync-request``); the server keeps a replay window and a cache of the nonces it saw in it.
Every response is signed by the serving node over its status, the body's sha256, the request's
nonce and the caller's key (domain ``sync-response``), so a client knows it reached the key it
meant and that the answer is to its own request. docs/protocol.md section 6.1 has the bytes.
"""
from __future__ import annotations

import binascii
import hashlib
import os
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import msgpack

from memmesh.auth.b64url import b64url_decode, b64url_encode
from memmesh.auth.errors import KeyFormatError
from memmesh.auth.keys import DOMAIN_SYNC_REQUEST, DOMAIN_SYNC_RESPONSE, PublicKey, SigningKey, verify
from memmesh.crdt.errors import RejectedError

H_KEY = "memmesh-key"
H_TARGET = "memmesh-target"
H_TIME = "memmesh-time"
H_NONCE = "memmesh-nonce"
H_SIGNATURE = "memmesh-signature"
ANY_TARGET = "*"  # only for hello: the caller does not know the node's key yet
WINDOW_MS = 60_000
MAX_NONCES = 200_000


class EnvelopeError(RejectedError):
    """A request or response whose signature, target, time or nonce does not hold."""


def _unb64(text: str, size: int, what: str) -> bytes:
    try:
        raw = b64url_decode(text)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise EnvelopeError("sync.unauthenticated", f"{what} is not base64url") from None
    if len(raw) != size or b64url_encode(raw) != text:
        raise EnvelopeError("sync.unauthenticated", f"{what} is not {size} bytes in canonical base64url")
    return raw


def request_message(method: str, path: str, body: bytes | bytearray, target: bytes, time_ms: int, nonce: bytes) -> bytes:
    """The bytes a request signature covers (with domain ``sync-request``)."""
    return msgpack.packb([method, path, hashlib.sha256(body).digest(), target, time_ms, nonce], use_bin_type=True)


def response_message(status: int, body: bytes, nonce: bytes, caller: bytes) -> bytes:
    """The bytes a response signature covers (with domain ``sync-response``)."""
    return msgpack.packb([status, hashlib.sha256(body).digest(), nonce, caller], use_bin_type=True)


def _target_raw(target: str) -> bytes:
    return b"\x00" * 32 if target == ANY_TARGET else PublicKey.parse(target).raw


@dataclass(frozen=True)
class SignedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    nonce: bytes
    target: str


def sign_request(key: SigningKey, method: str, path: str, body: bytes, target: str, time_ms: int,
                 nonce: bytes | None = None) -> SignedRequest:
    nonce = nonce if nonce is not None else os.urandom(16)
    sig = key.sign(DOMAIN_SYNC_REQUEST, request_message(method, path, body, _target_raw(target), time_ms, nonce))
    headers = {H_KEY: str(key.public), H_TARGET: target, H_TIME: str(time_ms), H_NONCE: nonce.hex(),
               H_SIGNATURE: b64url_encode(sig)}
    return SignedRequest(method, path, headers, body, nonce, target)


@dataclass(frozen=True)
class Caller:
    key: str
    nonce: bytes


class RequestVerifier:
    """The server's side: signature, target, replay window and nonce cache."""

    def __init__(self, node_key: str, window_ms: int = WINDOW_MS, max_nonces: int = MAX_NONCES) -> None:
        self.node_key = node_key
        self._node_raw = PublicKey.parse(node_key).raw
        self.window_ms = window_ms
        self.max_nonces = max_nonces
        self._seen: OrderedDict[tuple[str, bytes], int] = OrderedDict()  # (caller, nonce) -> time
        # When the cache is full its oldest nonce is forgotten and requests signed at or before
        # that nonce's time are refused from then on (they could be replays): a flood of signed
        # requests under fresh keys pushes this floor up instead of refusing every caller.
        self._floor_ms = -1

    def verify(self, method: str, path: str, headers: Mapping[str, str], body: bytes | bytearray, now_ms: int,
               *, allow_any_target: bool = False) -> Caller:
        get = {k.lower(): v for k, v in headers.items()}.get
        # A header missing reads as empty, which is refused just the same.
        key, target, time_text, nonce_hex, sig_text = (get(h) or "" for h in (H_KEY, H_TARGET, H_TIME, H_NONCE,
                                                                               H_SIGNATURE))
        if not all((key, target, time_text, nonce_hex, sig_text)):
            raise EnvelopeError("sync.unauthenticated", "the request is not signed (memmesh-* headers missing)")
        try:
            caller = PublicKey.parse(key)
        except KeyFormatError:
            raise EnvelopeError("sync.unauthenticated", "memmesh-key is not a public key") from None
        if target == ANY_TARGET:
            if not allow_any_target:
                raise EnvelopeError("sync.wrong_target", "only hello may be sent without naming the node's key")
            target_raw = b"\x00" * 32
        elif target != self.node_key:
            raise EnvelopeError("sync.wrong_target", "the request is signed for another node")
        else:
            target_raw = self._node_raw
        # ASCII digits only: str.isdigit() also accepts "²" or "①", which int() refuses.
        if not (time_text.isascii() and time_text.isdigit()) or len(time_text) > 16:
            raise EnvelopeError("sync.unauthenticated", "memmesh-time is not a time in ms")
        t = int(time_text)
        try:  # fromhex skips whitespace: "00 11 ..." would be a shorter nonce
            nonce = bytes.fromhex(nonce_hex) if len(nonce_hex) == 32 and nonce_hex.isascii() else b""
        except ValueError:
            nonce = b""
        if len(nonce) != 16:
            raise EnvelopeError("sync.unauthenticated", "memmesh-nonce is not 16 bytes in hex")
        sig = _unb64(sig_text, 64, "memmesh-signature")
        if not verify(caller.raw, DOMAIN_SYNC_REQUEST, request_message(method, path, body, target_raw, t, nonce), sig):
            raise EnvelopeError("sync.unauthenticated", "the request signature does not verify")
        if abs(now_ms - t) > self.window_ms:
            raise EnvelopeError("sync.stale", f"the request time is {abs(now_ms - t) // 1000} s away from this "
                                              f"node's clock (window {self.window_ms // 1000} s): check the clocks")
        self._expire(now_ms)
        seen_key = (key, nonce)
        if seen_key in self._seen:
            raise EnvelopeError("sync.replay", "this request was already received (same nonce)")
        if t <= self._floor_ms:
            raise EnvelopeError("sync.busy", "too many requests in the replay window; sign the request "
                                             "again with the current time")
        while len(self._seen) >= self.max_nonces:
            _old, old_t = self._seen.popitem(last=False)
            self._floor_ms = max(self._floor_ms, old_t)
        self._seen[seen_key] = t
        return Caller(key, nonce)

    def _expire(self, now_ms: int) -> None:
        # Arrival order is close to time order; entries older than the window can go.
        while self._seen:
            (k, n), t = next(iter(self._seen.items()))
            if now_ms - t <= self.window_ms:
                break
            self._seen.popitem(last=False)


def sign_response(key: SigningKey, status: int, body: bytes, caller: Caller) -> dict[str, str]:
    sig = key.sign(DOMAIN_SYNC_RESPONSE, response_message(status, body, caller.nonce, PublicKey.parse(caller.key).raw))
    return {H_KEY: str(key.public), H_SIGNATURE: b64url_encode(sig)}


def verify_response(request: SignedRequest, caller_key: str, status: int, headers: Mapping[str, str],
                    body: bytes) -> str:
    """Check a response came from the node the request targeted (any node for hello); returns
    its key."""
    get = {k.lower(): v for k, v in headers.items()}.get
    key, sig_text = get(H_KEY), get(H_SIGNATURE)
    if not key or not sig_text:
        raise EnvelopeError("sync.unauthenticated", "the response is not signed: not a memmesh node")
    try:
        server = PublicKey.parse(key)
    except KeyFormatError:
        raise EnvelopeError("sync.unauthenticated", "the response's memmesh-key is not a public key") from None
    if request.target != ANY_TARGET and key != request.target:
        raise EnvelopeError("sync.wrong_node", f"reached node {key}, not {request.target} (a stale address?)")
    sig = _unb64(sig_text, 64, "the response signature")
    if not verify(server.raw, DOMAIN_SYNC_RESPONSE,
                  response_message(status, body, request.nonce, PublicKey.parse(caller_key).raw), sig):
        raise EnvelopeError("sync.unauthenticated", "the response signature does not verify")
    return key
