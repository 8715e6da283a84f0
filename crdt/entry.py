"""The signed entry: header encoding, signing, ids and payload checks (sans-IO).

An entry's signed header is the canonical msgpack encoding of ``[body, signature]``:

* ``body`` is a map with keys in byte order (see docs/protocol.md for every field);
* ``signature`` is Ed25519 over ``b"memmesh/v1\\0entry\\0" + msgpack(body)``;
* the entry id is ``sha256:<hex>`` of the whole signed header, byte for byte.

The pycrdt update of each store travels beside the header. The header carries, per store,
its sha256, length, Yjs client id and clock range, so a payload can be erased later while the
header, its id and signature (and every later entry) still verify.

Every check here is a pure function of the bytes: nothing depends on the database's state.
Checks that need state (parents, feed order, authorisation, Yjs shapes) live in database.py.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial

import msgpack

from memmesh.auth.keys import DOMAIN_ENTRY, SigningKey, public_key_str, verify
from memmesh.crdt import verifystats
from memmesh.crdt.errors import EntryRejected
from memmesh.crdt.frozen import builder
from memmesh.crdt.verify_process import verify_split

FORMAT_VERSION = 1
ID_PREFIX = "sha256:"

# Size caps (see docs/protocol.md). A header is small; a payload holds one transaction's rows
# (a memory row and its embedding vector fit many times over).
MAX_HEADER_BYTES = 16 * 1024
MAX_PARENTS = 64
MAX_STORES = 16
MAX_STORE_NAME = 128
MAX_PAYLOAD_BYTES = 1024 * 1024
MAX_ENTRY_BYTES = 2 * 1024 * 1024
MAX_SAFE_INT = 2**53 - 1  # Yjs client ids and clocks are JavaScript-safe integers

_BODY_KEYS_ROOT = ("author", "nonce", "parents", "prev", "seq", "stores", "ts", "v")
_BODY_KEYS = ("author", "db", "parents", "prev", "seq", "stores", "ts", "v")
_SIG_TRAILER = b"\xc4\x40"  # msgpack bin8 of length 64
_CLIENT_DOMAIN = b"memmesh/yjs-client/v1\x00"


def id_of(header: bytes) -> str:
    return ID_PREFIX + hashlib.sha256(header).hexdigest()


_HEX = frozenset("0123456789abcdef")


def id_to_raw(entry_id: str) -> bytes:
    # One id, one spelling: lowercase hex only (bytes.fromhex would also take uppercase and spaces).
    if (not isinstance(entry_id, str) or not entry_id.startswith(ID_PREFIX) or len(entry_id) != 71
            or not _HEX.issuperset(entry_id[7:])):
        raise EntryRejected("entry.id", f"an entry id looks like 'sha256:<64 lowercase hex digits>', got {entry_id!r}")
    return bytes.fromhex(entry_id[7:])


def raw_to_id(raw: bytes) -> str:
    return ID_PREFIX + raw.hex()


@lru_cache(maxsize=4096)
def client_id_for(author: bytes) -> int:
    """The Yjs client id an author must write with: 53 bits derived from its public key."""
    digest = hashlib.sha256(_CLIENT_DOMAIN + author).digest()
    return int.from_bytes(digest[:8], "big") & MAX_SAFE_INT


@lru_cache(maxsize=4096)
def _key_text(author: bytes) -> str:
    # The pipeline asks an entry for its author's key text several times (feeds, verdicts,
    # observers): one encoding per author rather than one per question.
    return public_key_str(author)


@dataclass(frozen=True, slots=True)
class StoreDescriptor:
    """What the signed header says about one store's payload."""

    sha256: bytes
    length: int
    client: int
    clock: int
    clock_len: int

    @property
    def clock_end(self) -> int:
        return self.clock + self.clock_len


@dataclass(frozen=True, slots=True)
class Entry:
    """A decoded, signature-checked entry. ``header`` is the exact signed bytes."""

    id: str
    header: bytes
    author: bytes
    seq: int
    prev: str | None
    parents: tuple[str, ...]
    ts: int
    db: str | None  # None for the root entry: its own id is the database id
    nonce: bytes | None
    stores: Mapping[str, StoreDescriptor]
    payloads: Mapping[str, bytes | None]  # None: payload erased (or not carried)

    @property
    def is_root(self) -> bool:
        return self.db is None

    @property
    def author_key(self) -> str:
        return _key_text(self.author)

    @property
    def client(self) -> int:
        return client_id_for(self.author)


# Every entry received is decoded here: the records it yields are built without their
# dataclass __init__ (crdt/frozen.py), the unpacker's options are bound once.
_entry = builder(Entry)
_descriptor = builder(StoreDescriptor)
_sha256 = hashlib.sha256
_unpack = partial(
    msgpack.unpackb,
    raw=False,
    use_list=True,
    strict_map_key=True,
    max_bin_len=MAX_HEADER_BYTES,
    max_str_len=MAX_HEADER_BYTES,
    max_array_len=MAX_PARENTS + 8,
    max_map_len=MAX_STORES + 16,
    max_ext_len=0,
)


def _pack(obj: object) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def payload_descriptor(update: bytes, client: int, clock: int, clock_len: int) -> StoreDescriptor:
    return StoreDescriptor(hashlib.sha256(update).digest(), len(update), client, clock, clock_len)


def sign_entry(
    key: SigningKey,
    *,
    db: str | None,
    seq: int,
    prev: str | None,
    parents: tuple[str, ...] | list[str],
    ts: int,
    payloads: Mapping[str, tuple[bytes, int, int]],
    nonce: bytes | None = None,
) -> Entry:
    """Build and sign an entry. ``payloads`` maps store -> (update, clock, clock_len)."""
    author = key.public.raw
    client = client_id_for(author)
    stores = {
        name: payload_descriptor(update, client, clock, clock_len)
        for name, (update, clock, clock_len) in payloads.items()
    }
    body: dict[str, object] = {"author": author}
    if db is None:
        if nonce is None or len(nonce) != 16:
            raise ValueError("a root entry carries 16 bytes of nonce")
    else:
        body["db"] = id_to_raw(db)
    if nonce is not None:
        body["nonce"] = nonce
    body["parents"] = sorted(id_to_raw(p) for p in set(parents))
    body["prev"] = None if prev is None else id_to_raw(prev)
    body["seq"] = seq
    body["stores"] = {
        name: [d.sha256, d.length, d.client, d.clock, d.clock_len] for name, d in sorted(stores.items())
    }
    body["ts"] = ts
    body["v"] = FORMAT_VERSION
    body_bytes = _pack(body)
    signature = key.sign(DOMAIN_ENTRY, body_bytes)
    header = b"\x92" + body_bytes + _SIG_TRAILER + signature
    # Decode what we built: the same checks run for local and received entries.
    return decode_entry(header, {name: update for name, (update, _, _) in payloads.items()})


def _reject(reason: str, detail: str) -> EntryRejected:
    return EntryRejected(reason, detail)


def _uint(value: object, what: str, limit: int = MAX_SAFE_INT) -> int:
    if type(value) is not int or value < 0 or value > limit:
        raise _reject("entry.format", f"{what} must be an integer in 0..{limit}")
    return value


def _raw32(value: object, what: str) -> bytes:
    if type(value) is not bytes or len(value) != 32:
        raise _reject("entry.format", f"{what} must be 32 bytes")
    return value


def decode_entry(
    header: bytes,
    payloads: Mapping[str, bytes | None] | None = None,
    *,
    expected_db: str | None = None,
    verify_signature: bool = True,
) -> Entry:
    """Parse and verify a signed header and its payloads; raises EntryRejected.

    Checks, in order of cost: sizes, framing, body format, canonical encoding, payloads
    against their descriptors, then the signature (``verify_signature=False`` leaves it to
    the caller, which must then call ``signature_ok`` or ``decode_many``). ``expected_db``: the database this entry is
    offered to; a root entry is accepted only as the root of the database with its own id.
    """
    payloads = payloads or {}
    if not isinstance(header, (bytes, bytearray)):
        raise _reject("entry.format", "a header is bytes")
    header = bytes(header)
    size = len(header)
    if size > MAX_HEADER_BYTES:
        raise _reject("entry.size", f"header of {size} bytes exceeds {MAX_HEADER_BYTES}")
    total = size
    for update in payloads.values():
        if update is not None:
            total += len(update)
    if total > MAX_ENTRY_BYTES:
        raise _reject("entry.size", f"entry of {total} bytes exceeds {MAX_ENTRY_BYTES}")
    for name, update in payloads.items():
        if update is not None and len(update) > MAX_PAYLOAD_BYTES:
            raise _reject("entry.size", f"payload of store {name!r} has {len(update)} bytes, more than {MAX_PAYLOAD_BYTES}")
    if size < 70 or header[0] != 0x92 or header[-66:-64] != _SIG_TRAILER:
        raise _reject("entry.format", "a signed header is the msgpack array [body, 64-byte signature]")
    body_bytes = header[1:-66]
    try:
        body = _unpack(body_bytes)
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise _reject("entry.format", f"header body is not valid msgpack: {exc.__class__.__name__}") from None
    if type(body) is not dict:
        raise _reject("entry.format", "header body must be a map")
    is_root = "db" not in body
    expected_keys = _BODY_KEYS_ROOT if is_root else _BODY_KEYS
    if tuple(body) != expected_keys:
        raise _reject("entry.format", f"header fields must be exactly {', '.join(expected_keys)} in that order")
    version = body["v"]
    if version != FORMAT_VERSION or type(version) is not int:
        raise _reject("entry.version", f"unsupported entry format version {version!r}")
    author = body["author"]
    if type(author) is not bytes or len(author) != 32:
        _raw32(author, "author")
    seq = body["seq"]
    if type(seq) is not int or not 0 <= seq <= MAX_SAFE_INT:
        _uint(seq, "seq")
    ts = body["ts"]
    if type(ts) is not int or not 0 <= ts <= 2**63 - 1:
        _uint(ts, "ts", 2**63 - 1)
    prev_raw = body["prev"]
    prev = None if prev_raw is None else ID_PREFIX + _raw32(prev_raw, "prev").hex()
    parents_raw = body["parents"]
    if type(parents_raw) is not list or len(parents_raw) > MAX_PARENTS:
        raise _reject("entry.format", f"parents must be a list of at most {MAX_PARENTS} ids")
    for p in parents_raw:
        if type(p) is not bytes or len(p) != 32:
            _raw32(p, "a parent id")
    if len(parents_raw) > 1 and any(a >= b for a, b in zip(parents_raw, parents_raw[1:])):
        raise _reject("entry.canonical", "parents must be sorted and unique")
    if prev is not None and len(parents_raw) == 1 and parents_raw[0] == prev_raw:  # prev is the only parent
        parents = (prev,)
    else:
        parents = tuple([ID_PREFIX + p.hex() for p in parents_raw])
    nonce = None
    db = None
    if is_root:
        nonce = body["nonce"]
        if type(nonce) is not bytes or len(nonce) != 16:
            raise _reject("entry.format", "a root entry carries a 16-byte nonce")
        if parents or prev is not None or seq != 0:
            raise _reject("entry.format", "a root entry has no parents, no prev and seq 0")
    else:
        db = ID_PREFIX + _raw32(body["db"], "db").hex()
        if not parents:
            raise _reject("entry.format", "a non-root entry names at least one parent")
        if (seq == 0) != (prev is None):
            raise _reject("entry.format", "prev is empty exactly when seq is 0")
    stores_raw = body["stores"]
    if type(stores_raw) is not dict or not stores_raw or len(stores_raw) > MAX_STORES:
        raise _reject("entry.format", f"stores must be a map of 1..{MAX_STORES} descriptors")
    if len(stores_raw) > 1:
        names = list(stores_raw)
        if names != sorted(names, key=lambda n: n.encode("utf-8")):
            raise _reject("entry.canonical", "store names must be in byte order")
    client = client_id_for(author)
    stores: dict[str, StoreDescriptor] = {}
    for name, desc in stores_raw.items():
        if not name or len(name) > MAX_STORE_NAME:
            raise _reject("entry.format", f"a store name is 1..{MAX_STORE_NAME} characters")
        if type(desc) is not list or len(desc) != 5:
            raise _reject("entry.format", f"descriptor of store {name!r} is [sha256, length, client, clock, clock_len]")
        sha, length, dclient, clock, clock_len = desc
        if not (type(sha) is bytes and len(sha) == 32 and type(length) is int and 0 <= length <= MAX_PAYLOAD_BYTES
                and type(dclient) is int and 0 <= dclient <= MAX_SAFE_INT and type(clock) is int
                and 0 <= clock <= MAX_SAFE_INT and type(clock_len) is int and 0 <= clock_len <= MAX_SAFE_INT):
            # the same checks one by one, for the message of the first that fails
            _raw32(sha, f"{name} sha256")
            _uint(length, f"{name} length", MAX_PAYLOAD_BYTES)
            _uint(dclient, f"{name} client")
            _uint(clock, f"{name} clock")
            _uint(clock_len, f"{name} clock_len")
        if clock_len == 0 or clock + clock_len > MAX_SAFE_INT:
            raise _reject("entry.format", f"store {name!r} covers an empty or out-of-range clock range")
        if dclient != client:
            raise _reject("entry.client", f"store {name!r} claims Yjs client {dclient}, the author writes as {client}")
        stores[name] = _descriptor(sha, length, dclient, clock, clock_len)
    # Exact canonical form: one logical header has one byte string, hence one id.
    if _pack(body) != body_bytes:
        raise _reject("entry.canonical", "header body is not in canonical msgpack form")
    checked: dict[str, bytes | None] = {}
    for name, update in payloads.items():
        described = stores.get(name)
        if described is None:
            raise _reject("entry.payload", f"payload for store {name!r} that the header does not describe")
        if update is None:
            checked[name] = None
            continue
        if len(update) != described.length:
            raise _reject("entry.payload", f"payload of store {name!r} has {len(update)} bytes, the header says {described.length}")
        if _sha256(update).digest() != described.sha256:
            raise _reject("entry.payload", f"payload of store {name!r} does not match its sha256")
        checked[name] = bytes(update)
    if len(checked) != len(stores):
        for name in stores:
            checked.setdefault(name, None)
    if verify_signature:
        started = verifystats.clock()
        ok = verify(author, DOMAIN_ENTRY, body_bytes, header[-64:])
        verifystats.VERIFIED.add(1, verifystats.clock() - started)
        if not ok:
            raise _reject("entry.signature", "signature does not verify for the author's key")
    entry_id = ID_PREFIX + _sha256(header).hexdigest()
    if expected_db is not None:
        if is_root and entry_id != expected_db:
            raise _reject("entry.db", "a root entry of another database")
        if not is_root and db != expected_db:
            raise _reject("entry.db", f"entry belongs to database {db}, not {expected_db}")
    return _entry(entry_id, header, author, seq, prev, parents, ts, db, nonce, stores, checked)


def signature_ok(entry: Entry) -> bool:
    return verify(entry.author, DOMAIN_ENTRY, entry.header[1:-66], entry.header[-64:])


def decode_unverified(
    items: Sequence[tuple[bytes, Mapping[str, bytes | None] | None]], *, expected_db: str | None = None
) -> list[Entry | EntryRejected]:
    """decode_entry of each item without its signature (the caller checks those); one result per
    item, in order: the entry or why it is refused."""
    out: list[Entry | EntryRejected] = []
    for header, payloads in items:
        try:
            out.append(decode_entry(header, payloads, expected_db=expected_db, verify_signature=False))
        except EntryRejected as exc:
            out.append(exc)
    return out


def decode_many(
    items: Sequence[tuple[bytes, Mapping[str, bytes | None] | None]], *, expected_db: str | None = None
) -> list[Entry | EntryRejected]:
    """decode_entry for a batch, signatures checked on two cores; one result per item, in order.

    Unlike decode_entry, the database is checked before the signature (as for every batch).
    """
    out = decode_unverified(items, expected_db=expected_db)
    parsed = [(i, e) for i, e in enumerate(out) if isinstance(e, Entry)]
    # cryptography's Ed25519 holds the GIL: a large batch is split with the worker process.
    oks = verify_split([(e.author, e.header[1:-66], e.header[-64:]) for _, e in parsed])
    for (i, _), ok in zip(parsed, oks):
        if not ok:
            out[i] = _reject("entry.signature", "signature does not verify for the author's key")
    return out
