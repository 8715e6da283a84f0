"""Sync messages: typed records and their strict msgpack encoding (sans-IO, no sockets).

Every body on the sync API is one msgpack map with string keys. Keys, entry ids and database
ids travel as their raw 32 bytes; an entry travels as ``[header, {store: update | nil}]``
exactly as it is stored (signed bytes are never re-encoded). Decoding untrusted bytes either
returns a well-formed message or raises ``MessageError`` with a reason code: never another
exception, never unbounded memory (msgpack limits first, then every field's type and range).
docs/protocol.md section 6 specifies each message.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import msgpack

from auth.keys import public_key_str
from crdt.entry import MAX_ENTRY_BYTES, MAX_HEADER_BYTES, MAX_PAYLOAD_BYTES, MAX_STORES, raw_to_id, id_to_raw
from crdt.errors import RejectedError

PROTOCOL_VERSION = 1
MAX_BODY_BYTES = 8 * 1024 * 1024  # a page of entries, or a push, plus framing
DEFAULT_PAGE_BYTES = 2 * 1024 * 1024 + 64 * 1024  # at least one entry of the largest size
MAX_PAGE_BYTES = 6 * 1024 * 1024
MAX_ENTRIES_PER_MESSAGE = 20_000
MAX_AUTHORS = 100_000
MAX_WANT = 10_000
MAX_EVIDENCE_PER_AUTHOR = 256
MAX_PEERS = 256
MAX_ADDRS = 8
MAX_ADDR_LEN = 300
MAX_TEXT = 4096
U53 = 2**53 - 1

EntryWire = tuple[bytes, dict[str, bytes | None]]


class MessageError(RejectedError):
    """A sync body that is not a well-formed message of its kind."""


def _bad(detail: str) -> MessageError:
    return MessageError("sync.bad_message", detail)


def pack(obj: Mapping[str, Any]) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(body: bytes) -> dict[str, Any]:
    if not isinstance(body, (bytes, bytearray)):
        raise _bad("a body is bytes")
    if len(body) > MAX_BODY_BYTES:
        raise MessageError("sync.too_large", f"body of {len(body)} bytes exceeds {MAX_BODY_BYTES}")
    try:
        obj = msgpack.unpackb(
            bytes(body), raw=False, strict_map_key=True, use_list=True,
            max_bin_len=MAX_ENTRY_BYTES, max_str_len=MAX_TEXT * 4,
            max_array_len=max(MAX_ENTRIES_PER_MESSAGE, MAX_WANT), max_map_len=MAX_AUTHORS, max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise _bad(f"body is not msgpack: {exc.__class__.__name__}") from None
    if type(obj) is not dict:
        raise _bad("a body is a map")
    return obj


# ------------------------------------------------------------------------ field readers
def _fields(obj: Mapping[str, Any], required: Sequence[str], optional: Sequence[str] = ()) -> None:
    keys = set(obj)
    missing = [k for k in required if k not in keys]
    extra = sorted(keys - set(required) - set(optional))
    if missing or extra:
        raise _bad(f"fields missing {missing} or unknown {extra}")


def _raw32(value: Any, what: str) -> bytes:
    if type(value) is not bytes or len(value) != 32:
        raise _bad(f"{what} must be 32 bytes")
    return value


def _uint(value: Any, what: str, limit: int = U53) -> int:
    if type(value) is not int or not 0 <= value <= limit:
        raise _bad(f"{what} must be an integer in 0..{limit}")
    return value


def _seq_or_none(value: Any, what: str) -> int:
    if type(value) is not int or not -1 <= value <= U53:
        raise _bad(f"{what} must be an integer in -1..{U53}")
    return value


def _list(value: Any, what: str, limit: int) -> list:
    if type(value) is not list or len(value) > limit:
        raise _bad(f"{what} must be a list of at most {limit} items")
    return value


def _text(value: Any, what: str, limit: int = MAX_TEXT) -> str:
    if type(value) is not str or len(value) > limit:
        raise _bad(f"{what} must be a string of at most {limit} characters")
    return value


def _key(value: Any, what: str) -> str:
    return public_key_str(_raw32(value, what))


# -------------------------------------------------------------------- shared structures
Feeds = dict[str, tuple[int, str | None]]  # author -> (highest seq, its entry id)
Evidence = dict[str, list[str]]  # flagged author -> entry ids kept as evidence


def encode_feeds(feeds: Mapping[str, tuple[int, str | None]]) -> dict[bytes, list]:
    from auth.keys import PublicKey

    return {PublicKey.parse(a).raw: [seq, None if head is None else id_to_raw(head)] for a, (seq, head) in feeds.items()}


def decode_feeds(value: Any) -> Feeds:
    if type(value) is not dict or len(value) > MAX_AUTHORS:
        raise _bad(f"feeds must be a map of at most {MAX_AUTHORS} authors")
    out: Feeds = {}
    for author, pos in value.items():
        if type(pos) is not list or len(pos) != 2:
            raise _bad("a feed position is [seq, head]")
        head = None if pos[1] is None else raw_to_id(_raw32(pos[1], "a feed head"))
        out[_key(author, "a feed author")] = (_seq_or_none(pos[0], "a feed seq"), head)
    return out


def encode_evidence(evidence: Mapping[str, Sequence[str]]) -> dict[bytes, list[bytes]]:
    from auth.keys import PublicKey

    return {PublicKey.parse(a).raw: [id_to_raw(i) for i in ids[:MAX_EVIDENCE_PER_AUTHOR]] for a, ids in evidence.items()}


def decode_evidence(value: Any) -> Evidence:
    if type(value) is not dict or len(value) > MAX_AUTHORS:
        raise _bad("evidence must be a map of authors")
    return {_key(a, "an evidence author"): [raw_to_id(_raw32(i, "an evidence id"))
                                             for i in _list(ids, "evidence ids", MAX_EVIDENCE_PER_AUTHOR)]
            for a, ids in value.items()}


def encode_entries(entries: Sequence[EntryWire]) -> list[list]:
    return [[header, dict(payloads)] for header, payloads in entries]


def decode_entries(value: Any) -> list[EntryWire]:
    """Entries as they travel; their content is checked by the database's pipeline."""
    out: list[EntryWire] = []
    for item in _list(value, "entries", MAX_ENTRIES_PER_MESSAGE):
        if type(item) is not list or len(item) != 2:
            raise _bad("an entry is [header, payloads]")
        header, payloads = item
        if type(header) is not bytes or len(header) > MAX_HEADER_BYTES:
            raise _bad(f"an entry header is at most {MAX_HEADER_BYTES} bytes")
        if type(payloads) is not dict or len(payloads) > MAX_STORES:
            raise _bad(f"entry payloads are a map of at most {MAX_STORES} stores")
        checked: dict[str, bytes | None] = {}
        for store, data in payloads.items():
            if type(store) is not str or not store or len(store) > 128:
                raise _bad("a store name is a non-empty string of at most 128 characters")
            if data is not None and (type(data) is not bytes or len(data) > MAX_PAYLOAD_BYTES):
                raise _bad(f"a payload is nil or at most {MAX_PAYLOAD_BYTES} bytes")
            checked[store] = data
        out.append((header, checked))
    return out


def _cursor(value: Any) -> tuple[int, str] | None:
    if value is None:
        return None
    if type(value) is not list or len(value) != 2:
        raise _bad("a cursor is [height, entry id] or nil")
    return _uint(value[0], "cursor height"), raw_to_id(_raw32(value[1], "cursor id"))


def _encode_cursor(cursor: tuple[int, str] | None) -> list | None:
    return None if cursor is None else [cursor[0], id_to_raw(cursor[1])]


def _addr(value: Any) -> str:
    text = _text(value, "an address", MAX_ADDR_LEN)
    if not text.startswith("http:"):
        raise _bad(f"an address looks like http:<host>:<port>, got {text[:40]!r}")
    return text


# ------------------------------------------------------------------------------ messages
@dataclass(frozen=True)
class PeerInfo:
    key: str
    addrs: tuple[str, ...]


def _encode_peers(peers: Sequence[PeerInfo]) -> list[dict]:
    from auth.keys import PublicKey

    return [{"key": PublicKey.parse(p.key).raw, "addrs": list(p.addrs[:MAX_ADDRS])} for p in peers[:MAX_PEERS]]


def _decode_peers(value: Any) -> list[PeerInfo]:
    out = []
    for item in _list(value, "peers", MAX_PEERS):
        if type(item) is not dict:
            raise _bad("a peer is a map")
        _fields(item, ("addrs", "key"))
        out.append(PeerInfo(_key(item["key"], "a peer key"),
                            tuple(_addr(a) for a in _list(item["addrs"], "peer addresses", MAX_ADDRS))))
    return out


@dataclass(frozen=True)
class Hello:
    op = "hello"
    version: int = PROTOCOL_VERSION

    def encode(self) -> dict:
        return {"v": self.version}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> "Hello":
        _fields(obj, ("v",))
        return cls(_uint(obj["v"], "v"))


@dataclass(frozen=True)
class FeedsRequest:
    """The caller's feed positions for a database: one round trip tells both sides what the
    other lacks."""

    op = "feeds"
    db: str
    feeds: Feeds
    evidence: Evidence = field(default_factory=dict)

    def encode(self) -> dict:
        return {"db": id_to_raw(self.db), "evidence": encode_evidence(self.evidence), "feeds": encode_feeds(self.feeds)}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> "FeedsRequest":
        _fields(obj, ("db", "evidence", "feeds"))
        return cls(raw_to_id(_raw32(obj["db"], "db")), decode_feeds(obj["feeds"]), decode_evidence(obj["evidence"]))


@dataclass(frozen=True)
class FeedsReply:
    feeds: Feeds
    evidence: Evidence
    lacking: int  # how many entries the caller lacks (from the feeds it sent)

    def encode(self) -> dict:
        return {"evidence": encode_evidence(self.evidence), "feeds": encode_feeds(self.feeds), "lacking": self.lacking}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> "FeedsReply":
        _fields(obj, ("evidence", "feeds", "lacking"))
        return cls(decode_feeds(obj["feeds"]), decode_evidence(obj["evidence"]), _uint(obj["lacking"], "lacking"))


@dataclass(frozen=True)
class PullRequest:
    """A page of what the caller lacks, after ``after`` in T order, at most ``max_bytes``."""

    op = "pull"
    db: str
    feeds: Feeds
    evidence: Evidence = field(default_factory=dict)
    want: tuple[str, ...] = ()
    after: tuple[int, str] | None = None
    max_bytes: int = DEFAULT_PAGE_BYTES

    def encode(self) -> dict:
        return {"after": _encode_cursor(self.after), "db": id_to_raw(self.db),
                "evidence": encode_evidence(self.evidence), "feeds": encode_feeds(self.feeds),
                "max": self.max_bytes, "want": [id_to_raw(i) for i in self.want]}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> "PullRequest":
        _fields(obj, ("after", "db", "evidence", "feeds", "max", "want"))
        return cls(raw_to_id(_raw32(obj["db"], "db")), decode_feeds(obj["feeds"]), decode_evidence(obj["evidence"]),
                   tuple(raw_to_id(_raw32(i, "a wanted id")) for i in _list(obj["want"], "want", MAX_WANT)),
                   _cursor(obj["after"]), _uint(obj["max"], "max", MAX_PAGE_BYTES))


@dataclass(frozen=True)
class PullReply:
    entries: list[EntryWire]
    after: tuple[int, str] | None  # the cursor to ask from next
    more: bool

    def encode(self) -> dict:
        return {"after": _encode_cursor(self.after), "entries": encode_entries(self.entries), "more": self.more}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> "PullReply":
        _fields(obj, ("after", "entries", "more"))
        if type(obj["more"]) is not bool:
            raise _bad("more must be a boolean")
        return cls(decode_entries(obj["entries"]), _cursor(obj["after"]), obj["more"])


@dataclass(frozen=True)
class PushRequest:
    op = "push"
    db: str
    entries: list[EntryWire]

    def encode(self) -> dict:
        return {"db": id_to_raw(self.db), "entries": encode_entries(self.entries)}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> "PushRequest":
        _fields(obj, ("db", "entries"))
        return cls(raw_to_id(_raw32(obj["db"], "db")), decode_entries(obj["entries"]))


@dataclass(frozen=True)
class PushReply:
    stored: int
    pending: int
    duplicates: int
    refused: dict[str, int]  # reason -> count

    def encode(self) -> dict:
        return {"duplicates": self.duplicates, "pending": self.pending, "refused": dict(self.refused), "stored": self.stored}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> "PushReply":
        _fields(obj, ("duplicates", "pending", "refused", "stored"))
        refused = obj["refused"]
        if type(refused) is not dict or len(refused) > 256:
            raise _bad("refused is a map of reason -> count")
        return cls(_uint(obj["stored"], "stored"), _uint(obj["pending"], "pending"),
                   _uint(obj["duplicates"], "duplicates"),
                   {_text(k, "a reason", 64): _uint(v, "a count") for k, v in refused.items()})


@dataclass(frozen=True)
class PeersRequest:
    """Peer exchange for one database: each side tells the other whom it syncs it with."""

    op = "peers"
    db: str
    peers: list[PeerInfo]

    def encode(self) -> dict:
        return {"db": id_to_raw(self.db), "peers": _encode_peers(self.peers)}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> "PeersRequest":
        _fields(obj, ("db", "peers"))
        return cls(raw_to_id(_raw32(obj["db"], "db")), _decode_peers(obj["peers"]))


@dataclass(frozen=True)
class PeersReply:
    peers: list[PeerInfo]

    def encode(self) -> dict:
        return {"peers": _encode_peers(self.peers)}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> "PeersReply":
        _fields(obj, ("peers",))
        return cls(_decode_peers(obj["peers"]))


@dataclass(frozen=True)
class RedeemRequest:
    """Redeem a ticket's single-use invite for the caller's own key, at ``perm`` at most the
    ticket's (see tickets/ and node/sync/sharing.py)."""

    op = "redeem"
    db: str
    ticket: str  # the ticket's text without its secret
    perm: str  # "admin", "write" or "read"
    proof: bytes  # the invite key's signature over redemption_message(db, caller, ticket, perm)

    def encode(self) -> dict:
        return {"db": id_to_raw(self.db), "perm": self.perm, "proof": self.proof, "ticket": self.ticket}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> "RedeemRequest":
        _fields(obj, ("db", "perm", "proof", "ticket"))
        proof = obj["proof"]
        if type(proof) is not bytes or len(proof) != 64:
            raise _bad("proof is a 64-byte signature")
        if obj["perm"] not in ("admin", "write", "read"):
            raise _bad("perm is admin, write or read")
        return cls(raw_to_id(_raw32(obj["db"], "db")), _text(obj["ticket"], "ticket"), obj["perm"], proof)


def redemption_message(db: str, importer: str, ticket: str, perm: str) -> bytes:
    """What an invite key signs to redeem its ticket (domain ``ticket-redeem``)."""
    import hashlib

    from auth.keys import PublicKey

    return msgpack.packb([id_to_raw(db), PublicKey.parse(importer).raw,
                          hashlib.sha256(ticket.encode("ascii")).digest(), perm], use_bin_type=True)


@dataclass(frozen=True)
class RedeemReply:
    entry: str  # the id of the settings entry that recorded the redemption

    def encode(self) -> dict:
        return {"entry": id_to_raw(self.entry)}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> "RedeemReply":
        _fields(obj, ("entry",))
        return cls(raw_to_id(_raw32(obj["entry"], "entry")))


@dataclass(frozen=True)
class ErrorReply:
    error: str  # a reason code, e.g. "sync.not_found"
    message: str

    def encode(self) -> dict:
        return {"error": self.error, "message": self.message}

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> "ErrorReply":
        _fields(obj, ("error", "message"))
        return cls(_text(obj["error"], "error", 64), _text(obj["message"], "message"))


REQUESTS: dict[str, Any] = {m.op: m for m in (Hello, FeedsRequest, PullRequest, PushRequest, PeersRequest, RedeemRequest)}
REPLIES: dict[str, Any] = {"hello": Hello, "feeds": FeedsReply, "pull": PullReply, "push": PushReply,
                           "peers": PeersReply, "redeem": RedeemReply}


def decode_request(op: str, body: bytes):
    cls = REQUESTS.get(op)
    if cls is None:
        raise MessageError("sync.unknown_op", f"no sync operation {op!r}")
    try:
        return cls.decode(unpack(body))
    except RejectedError as exc:
        if isinstance(exc, MessageError):
            raise
        raise _bad(str(exc)) from None  # e.g. a malformed id inside a field


def decode_reply(op: str, body: bytes):
    try:
        return REPLIES[op].decode(unpack(body))
    except RejectedError as exc:
        if isinstance(exc, MessageError):
            raise
        raise _bad(str(exc)) from None
