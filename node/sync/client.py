"""The client's side of a sync request: signing it for a node, and checking and decoding the
signed reply (or the typed error it carries)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memmesh.auth.keys import SigningKey
from memmesh.crdt.clock import now_ms as _now_ms
from memmesh.crdt.errors import MemmeshError, RejectedError
from memmesh.node.sync import messages as m
from memmesh.node.sync.envelope import ANY_TARGET, EnvelopeError, SignedRequest, sign_request, verify_response

PREFIX = "/sync/v1/"  # the sync API's paths: PREFIX + op


class SyncError(MemmeshError):
    """A sync request the peer answered with an error, or whose answer does not verify."""

    def __init__(self, reason: str, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class Outgoing:
    op: str
    request: SignedRequest


class Client:
    """Signs requests and checks responses (sans-IO: the caller moves the bytes)."""

    def __init__(self, key: SigningKey, clock: Callable[[], int] = _now_ms) -> None:
        self.key = key
        self.clock = clock

    def request(self, target: str, message: Any) -> Outgoing:
        body = m.pack(message.encode())
        return Outgoing(message.op, sign_request(self.key, "POST", PREFIX + message.op, body, target, self.clock()))

    def reply(self, out: Outgoing, status: int, headers: dict[str, str], body: bytes) -> tuple[str, Any]:
        """The verified reply (and the key of the node that sent it); SyncError otherwise."""
        try:
            node = verify_response(out.request, str(self.key.public), status, headers, body)
        except EnvelopeError as exc:
            # An unsigned error is the server refusing our signature, time or nonce.
            if status in (401, 503) and "memmesh-signature" not in {k.lower() for k in headers}:
                try:
                    err = m.ErrorReply.decode(m.unpack(body))
                    raise SyncError(err.error, err.message, status) from None
                except RejectedError:
                    pass
            raise SyncError(exc.reason, str(exc), status) from None
        if status != 200:
            try:
                err = m.ErrorReply.decode(m.unpack(body))
            except RejectedError as exc:
                raise SyncError("sync.bad_message", f"status {status} with a malformed body: {exc}", status) from None
            raise SyncError(err.error, err.message, status)
        try:
            return node, m.decode_reply(out.op, body)
        except RejectedError as exc:
            raise SyncError(exc.reason, str(exc), status) from None


def hello(client: Client, target: str = ANY_TARGET) -> Outgoing:
    return client.request(target, m.Hello())
