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

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import msgpack

from memmesh.auth.keys import public_key_str
from memmesh.crdt.entry import MAX_ENTRY_BYTES, MAX_HEADER_BYTES, MAX_PAYLOAD_BYTES, MAX_STORES, raw_to_id, id_to_raw
from memmesh.crdt.errors import RejectedError

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


# ---------------------------------------------------------------- bounded decoding
# msgpack's own limits bound each container, not their sum: 8 MiB of arrays of empty maps
# builds 8 million dicts (over 500 MiB). So a body is walked against the shape its message
# type can take, and a container is refused from its header (its element count and kind)
# before anything inside it is built: what is built is at most what the type can hold, and
# every built object took at least one byte of the body.
@dataclass(frozen=True, slots=True)
class Arr:
    """A list of at most ``limit`` items, each of shape ``item`` (None: a scalar)."""

    limit: int
    item: Any = None


class Tup:
    """A list whose items have the shapes given by position (at most that many)."""

    __slots__ = ("items",)

    def __init__(self, *items: Any) -> None:
        self.items = items


@dataclass(frozen=True, slots=True)
class MapOf:
    """A map of at most ``limit`` scalar keys to values of shape ``value``."""

    limit: int
    value: Any = None


class Fields:
    """A map with str keys among ``shapes`` (name -> shape of its value)."""

    __slots__ = ("shapes",)

    def __init__(self, **shapes: Any) -> None:
        self.shapes = shapes


# An error body, or any body whose type is not known: a flat map of a few scalar fields.
FLAT = MapOf(16)
_ARRAYS = frozenset(range(0x90, 0xA0)) | {0xDC, 0xDD}
_MAPS = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}
_CONTAINERS = _ARRAYS | _MAPS


def _unpacker(body: bytes) -> msgpack.Unpacker:
    up = msgpack.Unpacker(None, raw=False, strict_map_key=True, use_list=True, max_buffer_size=max(1, len(body)),
                          max_bin_len=MAX_ENTRY_BYTES, max_str_len=MAX_TEXT * 4, max_array_len=MAX_ENTRIES_PER_MESSAGE,
                          max_map_len=MAX_AUTHORS, max_ext_len=0)
    up.feed(body)
    return up


def _walk(up: msgpack.Unpacker, body: bytes, shape: Any, what: str) -> Any:
    pos = up.tell()
    if pos >= len(body):
        raise _bad("body is not msgpack: it ends inside a value")
    tag = body[pos]
    if tag in _ARRAYS:
        if isinstance(shape, Arr):
            n = up.read_array_header()
            if n > shape.limit:
                raise _bad(f"{what} must be a list of at most {shape.limit} items")
            inner = f"{what}[]"
            if shape.item is None:
                return [_scalar(up, body, inner) for _ in range(n)]
            return [_walk(up, body, shape.item, inner) for _ in range(n)]
        if isinstance(shape, Tup):
            n = up.read_array_header()
            if n > len(shape.items):
                raise _bad(f"{what} must be a list of {len(shape.items)} items")
            return [_walk(up, body, shape.items[i], f"{what}[{i}]") for i in range(n)]
        raise _bad(f"{what} must not be a list")
    if tag in _MAPS:
        if isinstance(shape, MapOf):
            n = up.read_map_header()
            if n > shape.limit:
                raise _bad(f"{what} must be a map of at most {shape.limit} entries")
            out: dict = {}
            value, inner = shape.value, f"{what}{{}}"
            for _ in range(n):
                key = _scalar(up, body, "a map key")
                if type(key) not in (str, bytes):
                    raise _bad(f"the keys of {what} are strings or bytes")
                out[key] = _scalar(up, body, inner) if value is None else _walk(up, body, value, inner)
            return out
        if isinstance(shape, Fields):
            n = up.read_map_header()
            if n > len(shape.shapes):
                raise _bad(f"{what} has at most the fields {sorted(shape.shapes)}")
            out = {}
            for _ in range(n):
                name = _scalar(up, body, "a field name")
                if name not in shape.shapes:
                    raise _bad(f"unknown field {str(name)[:40]!r}")
                if name in out:  # one reading per field: the db checked first is the db served
                    raise _bad(f"field {name!r} is given twice")
                out[name] = _walk(up, body, shape.shapes[name], name)
            return out
        raise _bad(f"{what} must not be a map")
    return up.unpack()  # a scalar: bounded by max_str_len / max_bin_len, ext refused


def _scalar(up: msgpack.Unpacker, body: bytes, what: str) -> Any:
    pos = up.tell()
    if pos >= len(body):
        raise _bad("body is not msgpack: it ends inside a value")
    if body[pos] in _CONTAINERS:
        raise _bad(f"{what} must not be a list or a map")
    return up.unpack()


def unpack(body: bytes, shape: Any = FLAT) -> dict[str, Any]:
    """The body's map, built only as far as ``shape`` (what its message type can hold) allows.
    Errors name the field as a path: ``entries[][1]{}`` is a payload of an entry."""
    if not isinstance(body, (bytes, bytearray)):
        raise _bad("a body is bytes")
    if len(body) > MAX_BODY_BYTES:
        raise MessageError("sync.too_large", f"body of {len(body)} bytes exceeds {MAX_BODY_BYTES}")
    if not body or body[0] not in _MAPS:
        raise _bad("a body is a map")
    try:
        up = _unpacker(body)
        obj = _walk(up, body, shape, "the body")
        extra = up.tell() != len(body)
    except MessageError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise _bad(f"body is not msgpack: {exc.__class__.__name__}") from None
    if extra:
        raise _bad("body is not msgpack: ExtraData")
    return obj


def peek_db(body: bytes) -> str | None:
    """The ``db`` field of a request body, read without building any other field (skipped at
    C speed): lets the server check the caller may read that database before the body is
    decoded. None when the body has no well-formed ``db``: the request is refused undecoded."""
    try:
        if not body or body[0] not in _MAPS:
            return None
        up = _unpacker(body)
        n = up.read_map_header()
        for _ in range(min(n, 8)):
            pos = up.tell()
            if pos >= len(body) or body[pos] in _ARRAYS or body[pos] in _MAPS:
                return None
            name = up.unpack()
            pos = up.tell()
            if name == "db":
                if pos >= len(body) or body[pos] != 0xC4:  # bin 8: 32 raw bytes
                    return None
                raw = up.unpack()
                return raw_to_id(raw) if type(raw) is bytes and len(raw) == 32 else None
            up.skip()
    except Exception:  # malformed: the full decode gives the typed error
        return None
    return None


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
    from memmesh.auth.keys import PublicKey

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
    from memmesh.auth.keys import PublicKey

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
    from memmesh.auth.keys import PublicKey

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

    from memmesh.auth.keys import PublicKey

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


# The shape of each message's body (see ``unpack``), from the limits of section 6.3.
_ID = None  # scalars: their type and size are checked by the decoders above
FEEDS = MapOf(MAX_AUTHORS, Tup(_ID, _ID))
EVIDENCE = MapOf(MAX_AUTHORS, Arr(MAX_EVIDENCE_PER_AUTHOR))
ENTRIES = Arr(MAX_ENTRIES_PER_MESSAGE, Tup(_ID, MapOf(MAX_STORES)))
PEERS = Arr(MAX_PEERS, Fields(addrs=Arr(MAX_ADDRS), key=_ID))
CURSOR = Tup(_ID, _ID)
REQUEST_SHAPES: dict[str, Any] = {
    "hello": Fields(v=_ID),
    "feeds": Fields(db=_ID, evidence=EVIDENCE, feeds=FEEDS),
    "pull": Fields(after=CURSOR, db=_ID, evidence=EVIDENCE, feeds=FEEDS, max=_ID, want=Arr(MAX_WANT)),
    "push": Fields(db=_ID, entries=ENTRIES),
    "peers": Fields(db=_ID, peers=PEERS),
    "redeem": Fields(db=_ID, perm=_ID, proof=_ID, ticket=_ID),
}
REPLY_SHAPES: dict[str, Any] = {
    "hello": Fields(v=_ID),
    "feeds": Fields(evidence=EVIDENCE, feeds=FEEDS, lacking=_ID),
    "pull": Fields(after=CURSOR, entries=ENTRIES, more=_ID),
    "push": Fields(duplicates=_ID, pending=_ID, refused=MapOf(256), stored=_ID),
    "peers": Fields(peers=PEERS),
    "redeem": Fields(entry=_ID),
}


def decode_request(op: str, body: bytes):
    cls = REQUESTS.get(op)
    if cls is None:
        raise MessageError("sync.unknown_op", f"no sync operation {op!r}")
    try:
        return cls.decode(unpack(body, REQUEST_SHAPES[op]))
    except RejectedError as exc:
        if isinstance(exc, MessageError):
            raise
        raise _bad(str(exc)) from None  # e.g. a malformed id inside a field


def decode_reply(op: str, body: bytes):
    try:
        return REPLIES[op].decode(unpack(body, REPLY_SHAPES[op]))
    except RejectedError as exc:
        if isinstance(exc, MessageError):
            raise
        raise _bad(str(exc)) from None
