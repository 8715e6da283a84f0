"""Sync messages: typed records and their strict msgpack encoding (sans-IO, no sockets).

Every body on the sync API is one msgpack map with string keys. Keys, entry ids and database
ids travel as their raw 32 bytes; an entry travels as ``[header, {store: update | nil}]``
exactly as it is stored (signed bytes are never re-encoded). Decoding untrusted bytes either
returns a well-formed message or raises ``MessageError`` with a reason code: never another
exception, never unbounded memory: the body is walked against its type's shape, each list and
map refused from its header before anything in it is built (``unpack``), then every field's
type and range is checked.
docs/protocol.md section 6 specifies each message.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack

from memmesh.crdt.entry import MAX_STORES, id_to_raw, raw_to_id
from memmesh.crdt.errors import RejectedError
from memmesh.node.sync.limits import (
    DEFAULT_PAGE_BYTES,
    MAX_ADDR_LEN,
    MAX_ADDRS,
    MAX_AUTHORS,
    MAX_BODY_BYTES,
    MAX_ENTRIES_PER_MESSAGE,
    MAX_EVIDENCE_PER_AUTHOR,
    MAX_PAGE_BYTES,
    MAX_PEERS,
    MAX_TEXT,
    MAX_WANT,
    PROTOCOL_VERSION,
    U53,
)
from memmesh.node.sync.wire import (
    FLAT,
    Arr,
    Fields,
    MapOf,
    MessageError,
    Tup,
    bad,
    bounded_list,
    check_fields,
    check_text,
    pack,
    peek_db,
    raw32,
    uint,
    unpack,
)
from memmesh.node.sync.wire_values import (
    EntryWire,
    Evidence,
    Feeds,
    PeerInfo,
    decode_cursor,
    decode_entries,
    decode_evidence,
    decode_feeds,
    decode_peers,
    encode_cursor,
    encode_entries,
    encode_evidence,
    encode_feeds,
    encode_peers,
)

# The sync API's vocabulary in one place (callers write m.PullRequest, m.MAX_BODY_BYTES, m.unpack):
# the bounds (limits.py), the body's strict decoding (wire.py), what messages carry
# (wire_values.py) and the messages themselves.
__all__ = [
    "CURSOR", "DEFAULT_PAGE_BYTES", "ENTRIES", "EVIDENCE", "FEEDS", "FLAT", "MAX_ADDRS", "MAX_ADDR_LEN", "MAX_AUTHORS",
    "MAX_BODY_BYTES", "MAX_ENTRIES_PER_MESSAGE", "MAX_EVIDENCE_PER_AUTHOR", "MAX_PAGE_BYTES", "MAX_PEERS",
    "MAX_TEXT", "MAX_WANT", "PEERS", "PROTOCOL_VERSION", "REPLIES", "REPLY_SHAPES", "REQUESTS", "REQUEST_SHAPES",
    "U53", "Arr", "EntryWire", "ErrorReply", "Evidence", "Feeds", "FeedsReply", "FeedsRequest", "Fields", "Hello",
    "MapOf", "MessageError", "PeerInfo", "PeersReply", "PeersRequest", "PullReply", "PullRequest", "PushReply",
    "PushRequest", "RedeemReply", "RedeemRequest", "Tup", "decode_entries", "decode_evidence", "decode_feeds",
    "decode_reply", "decode_request", "encode_entries", "encode_evidence", "encode_feeds", "pack", "peek_db",
    "redemption_message", "unpack",
]

# The shape of each message's body (see ``unpack``), from the limits of section 6.3.
_ID = None  # scalars: their type and size are checked by the decoders below
FEEDS = MapOf(MAX_AUTHORS, Tup(_ID, _ID))
EVIDENCE = MapOf(MAX_AUTHORS, Arr(MAX_EVIDENCE_PER_AUTHOR))
ENTRIES = Arr(MAX_ENTRIES_PER_MESSAGE, Tup(_ID, MapOf(MAX_STORES)))
PEERS = Arr(MAX_PEERS, Fields(addrs=Arr(MAX_ADDRS), key=_ID))
CURSOR = Tup(_ID, _ID)


@dataclass(frozen=True)
class Hello:
    shape: ClassVar[Fields] = Fields(v=_ID)  # its fields, the shape of its body
    op = "hello"
    version: int = PROTOCOL_VERSION

    def encode(self) -> dict:
        return {"v": self.version}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> Hello:
        check_fields(obj, cls.shape.shapes)
        return cls(uint(obj["v"], "v"))


@dataclass(frozen=True)
class FeedsRequest:
    """The caller's feed positions for a database: one round trip tells both sides what the
    other lacks."""

    shape: ClassVar[Fields] = Fields(db=_ID, evidence=EVIDENCE, feeds=FEEDS)  # its fields, the shape of its body
    op = "feeds"
    db: str
    feeds: Feeds
    evidence: Evidence = field(default_factory=dict)

    def encode(self) -> dict:
        return {"db": id_to_raw(self.db), "evidence": encode_evidence(self.evidence), "feeds": encode_feeds(self.feeds)}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> FeedsRequest:
        check_fields(obj, cls.shape.shapes)
        return cls(raw_to_id(raw32(obj["db"], "db")), decode_feeds(obj["feeds"]), decode_evidence(obj["evidence"]))


@dataclass(frozen=True)
class FeedsReply:
    shape: ClassVar[Fields] = Fields(evidence=EVIDENCE, feeds=FEEDS, lacking=_ID)  # its fields, the shape of its body
    feeds: Feeds
    evidence: Evidence
    lacking: int  # how many entries the caller lacks (from the feeds it sent)

    def encode(self) -> dict:
        return {"evidence": encode_evidence(self.evidence), "feeds": encode_feeds(self.feeds), "lacking": self.lacking}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> FeedsReply:
        check_fields(obj, cls.shape.shapes)
        return cls(decode_feeds(obj["feeds"]), decode_evidence(obj["evidence"]), uint(obj["lacking"], "lacking"))


@dataclass(frozen=True)
class PullRequest:
    """A page of what the caller lacks, after ``after`` in T order, at most ``max_bytes``."""

    shape: ClassVar[Fields] = Fields(after=CURSOR, db=_ID, evidence=EVIDENCE, feeds=FEEDS, max=_ID, want=Arr(MAX_WANT))  # its fields, the shape of its body
    op = "pull"
    db: str
    feeds: Feeds
    evidence: Evidence = field(default_factory=dict)
    want: tuple[str, ...] = ()
    after: tuple[int, str] | None = None
    max_bytes: int = DEFAULT_PAGE_BYTES

    def encode(self) -> dict:
        return {"after": encode_cursor(self.after), "db": id_to_raw(self.db),
                "evidence": encode_evidence(self.evidence), "feeds": encode_feeds(self.feeds),
                "max": self.max_bytes, "want": [id_to_raw(i) for i in self.want]}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> PullRequest:
        check_fields(obj, cls.shape.shapes)
        return cls(raw_to_id(raw32(obj["db"], "db")), decode_feeds(obj["feeds"]), decode_evidence(obj["evidence"]),
                   tuple(raw_to_id(raw32(i, "a wanted id")) for i in bounded_list(obj["want"], "want", MAX_WANT)),
                   decode_cursor(obj["after"]), uint(obj["max"], "max", MAX_PAGE_BYTES))


@dataclass(frozen=True)
class PullReply:
    shape: ClassVar[Fields] = Fields(after=CURSOR, entries=ENTRIES, more=_ID)  # its fields, the shape of its body
    entries: list[EntryWire]
    after: tuple[int, str] | None  # the cursor to ask from next
    more: bool

    def encode(self) -> dict:
        return {"after": encode_cursor(self.after), "entries": encode_entries(self.entries), "more": self.more}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> PullReply:
        check_fields(obj, cls.shape.shapes)
        if type(obj["more"]) is not bool:
            raise bad("more must be a boolean")
        return cls(decode_entries(obj["entries"]), decode_cursor(obj["after"]), obj["more"])


@dataclass(frozen=True)
class PushRequest:
    shape: ClassVar[Fields] = Fields(db=_ID, entries=ENTRIES)  # its fields, the shape of its body
    op = "push"
    db: str
    entries: list[EntryWire]

    def encode(self) -> dict:
        return {"db": id_to_raw(self.db), "entries": encode_entries(self.entries)}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> PushRequest:
        check_fields(obj, cls.shape.shapes)
        return cls(raw_to_id(raw32(obj["db"], "db")), decode_entries(obj["entries"]))


@dataclass(frozen=True)
class PushReply:
    shape: ClassVar[Fields] = Fields(duplicates=_ID, pending=_ID, refused=MapOf(256), stored=_ID)  # its fields, the shape of its body
    stored: int
    pending: int
    duplicates: int
    refused: dict[str, int]  # reason -> count

    def encode(self) -> dict:
        return {"duplicates": self.duplicates, "pending": self.pending, "refused": dict(self.refused), "stored": self.stored}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> PushReply:
        check_fields(obj, cls.shape.shapes)
        refused = obj["refused"]
        if type(refused) is not dict or len(refused) > 256:
            raise bad("refused is a map of reason -> count")
        return cls(uint(obj["stored"], "stored"), uint(obj["pending"], "pending"),
                   uint(obj["duplicates"], "duplicates"),
                   {check_text(k, "a reason", 64): uint(v, "a count") for k, v in refused.items()})


@dataclass(frozen=True)
class PeersRequest:
    """Peer exchange for one database: each side tells the other whom it syncs it with."""

    shape: ClassVar[Fields] = Fields(db=_ID, peers=PEERS)  # its fields, the shape of its body
    op = "peers"
    db: str
    peers: list[PeerInfo]

    def encode(self) -> dict:
        return {"db": id_to_raw(self.db), "peers": encode_peers(self.peers)}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> PeersRequest:
        check_fields(obj, cls.shape.shapes)
        return cls(raw_to_id(raw32(obj["db"], "db")), decode_peers(obj["peers"]))


@dataclass(frozen=True)
class PeersReply:
    shape: ClassVar[Fields] = Fields(peers=PEERS)  # its fields, the shape of its body
    peers: list[PeerInfo]

    def encode(self) -> dict:
        return {"peers": encode_peers(self.peers)}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> PeersReply:
        check_fields(obj, cls.shape.shapes)
        return cls(decode_peers(obj["peers"]))


@dataclass(frozen=True)
class RedeemRequest:
    """Redeem a ticket's single-use invite for the caller's own key, at ``perm`` at most the
    ticket's (see tickets/ and node/sync/sharing.py)."""

    shape: ClassVar[Fields] = Fields(db=_ID, perm=_ID, proof=_ID, ticket=_ID)  # its fields, the shape of its body
    op = "redeem"
    db: str
    ticket: str  # the ticket's text without its secret
    perm: str  # "admin", "write" or "read"
    proof: bytes  # the invite key's signature over redemption_message(db, caller, ticket, perm)

    def encode(self) -> dict:
        return {"db": id_to_raw(self.db), "perm": self.perm, "proof": self.proof, "ticket": self.ticket}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> RedeemRequest:
        check_fields(obj, cls.shape.shapes)
        proof = obj["proof"]
        if type(proof) is not bytes or len(proof) != 64:
            raise bad("proof is a 64-byte signature")
        if obj["perm"] not in ("admin", "write", "read"):
            raise bad("perm is admin, write or read")
        return cls(raw_to_id(raw32(obj["db"], "db")), check_text(obj["ticket"], "ticket"), obj["perm"], proof)


def redemption_message(db: str, importer: str, ticket: str, perm: str) -> bytes:
    """What an invite key signs to redeem its ticket (domain ``ticket-redeem``)."""
    import hashlib

    from memmesh.auth.keys import PublicKey

    return msgpack.packb([id_to_raw(db), PublicKey.parse(importer).raw,
                          hashlib.sha256(ticket.encode("ascii")).digest(), perm], use_bin_type=True)


@dataclass(frozen=True)
class RedeemReply:
    shape: ClassVar[Fields] = Fields(entry=_ID)  # its fields, the shape of its body
    entry: str  # the id of the settings entry that recorded the redemption

    def encode(self) -> dict:
        return {"entry": id_to_raw(self.entry)}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> RedeemReply:
        check_fields(obj, cls.shape.shapes)
        return cls(raw_to_id(raw32(obj["entry"], "entry")))


@dataclass(frozen=True)
class ErrorReply:
    shape: ClassVar[Fields] = Fields(error=_ID, message=_ID)  # its fields (any body may be one: decoded as FLAT)
    error: str  # a reason code, e.g. "sync.not_found"
    message: str

    def encode(self) -> dict:
        return {"error": self.error, "message": self.message}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> ErrorReply:
        check_fields(obj, cls.shape.shapes)
        return cls(check_text(obj["error"], "error", 64), check_text(obj["message"], "message"))


REQUESTS: dict[str, Any] = {m.op: m for m in (Hello, FeedsRequest, PullRequest, PushRequest, PeersRequest, RedeemRequest)}
REPLIES: dict[str, Any] = {"hello": Hello, "feeds": FeedsReply, "pull": PullReply, "push": PushReply,
                           "peers": PeersReply, "redeem": RedeemReply}
REQUEST_SHAPES: dict[str, Fields] = {op: cls.shape for op, cls in REQUESTS.items()}
REPLY_SHAPES: dict[str, Fields] = {op: cls.shape for op, cls in REPLIES.items()}

def decode_request(op: str, body: bytes | bytearray):
    cls = REQUESTS.get(op)
    if cls is None:
        raise MessageError("sync.unknown_op", f"no sync operation {op!r}")
    try:
        return cls.decode(unpack(body, REQUEST_SHAPES[op]))
    except RejectedError as exc:
        if isinstance(exc, MessageError):
            raise
        raise bad(str(exc)) from None  # e.g. a malformed id inside a field


def decode_reply(op: str, body: bytes):
    try:
        return REPLIES[op].decode(unpack(body, REPLY_SHAPES[op]))
    except RejectedError as exc:
        if isinstance(exc, MessageError):
            raise
        raise bad(str(exc)) from None
