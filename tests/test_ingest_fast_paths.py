"""The ingest's fast paths give exactly the answers of the straightforward code they replaced.

Receiving an entry decodes its header (crdt/entry.py ``decode_entry``) and its payload's Yjs
update (crdt/yjs.py ``decode_append_update``) with shortcuts for the common shapes (a one-row
update, a writer's entry whose prev is its only parent, short strings read inline), builds
frozen records without their dataclass ``__init__`` (crdt/frozen.py), and stores entries that
need no normalising without copying them (node/storage.py). The references below are the
decoders as they were before those shortcuts; on every input, valid or not, the decoders must
return equal results or refuse with the same reason and the same message.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import memmesh.crdt.entry as E
import memmesh.crdt.yjs as Y
from memmesh.auth.keys import SigningKey
from memmesh.crdt.entry import Entry, StoreDescriptor, decode_entry, sign_entry
from memmesh.crdt.errors import RejectedError, UpdateRejected
from memmesh.crdt.frozen import builder
from memmesh.crdt.storage import StoredEntry
from memmesh.crdt.yjs import decode_append_update, encode_rows
from memmesh.node.storage import SqliteStorage

# --- the references: the decoders before their fast paths --------------------------------

def _ref_any(data: bytes, pos: int, depth: int) -> tuple[Any, int]:
    """Read one lib0 Any at pos. depth = container levels still allowed below this point."""
    tag = data[pos]
    pos += 1
    if tag == 119:
        b = data[pos]
        if b < 0x80:  # a short string, inline: the most common value by far
            end = pos + 1 + b
            if end > len(data):
                Y._reject("yjs.truncated", "string runs past the end of the update")
            return data[pos + 1:end].decode(), end
        return Y._str(data, pos)
    if tag == 125:
        b = data[pos]
        if b < 0x40:  # one byte, positive, no continuation
            return b, pos + 1
        return Y._int(data, pos)
    if tag == 118 or tag == 117:
        # Checked before descending: the corpus holds a 20,000-deep bomb.
        if depth <= 0:
            Y._reject("yjs.depth", "value nested deeper than the allowed depth")
        b = data[pos]
        if b < 0x80:
            n = b
            pos += 1
        else:
            n, pos = Y._uint(data, pos)
        # Every element takes at least one byte: refuse absurd counts up front.
        if n > len(data) - pos:
            Y._reject("yjs.truncated", "container count runs past the end of the update")
        depth -= 1
        if tag == 117:
            arr: list[Any] = []
            append = arr.append
            for _ in range(n):
                v, pos = _ref_any(data, pos, depth)
                append(v)
            return arr, pos
        obj = {}
        size = len(data)
        for _ in range(n):
            b = data[pos]
            if b < 0x80:  # short key, inline
                end = pos + 1 + b
                if end > size:
                    Y._reject("yjs.truncated", "string runs past the end of the update")
                k = data[pos + 1:end].decode()
                pos = end
            else:
                k, pos = Y._str(data, pos)
            obj[k], pos = _ref_any(data, pos, depth)
        return obj, pos
    if tag == 120:
        return True, pos
    if tag == 121:
        return False, pos
    if tag == 126:
        return None, pos
    if tag == 123:
        if pos + 8 > len(data):
            Y._reject("yjs.truncated", "float64 runs past the end of the update")
        return Y._F64.unpack_from(data, pos)[0], pos + 8
    if tag == 124:
        if pos + 4 > len(data):
            Y._reject("yjs.truncated", "float32 runs past the end of the update")
        return Y._F32.unpack_from(data, pos)[0], pos + 4
    if tag == 116:
        start, end = Y._span(data, pos, "Uint8Array")
        return data[start:end], end
    if tag == 122:
        if pos + 8 > len(data):
            Y._reject("yjs.truncated", "bigint runs past the end of the update")
        return Y._I64.unpack_from(data, pos)[0], pos + 8
    if tag == 127:
        Y._reject("yjs.any_tag", "Any value 'undefined' (tag 127) is not storable")
    Y._reject("yjs.any_tag", f"unknown Any tag {tag}")


def _ref_decode(data: bytes, root: str, client: int, max_depth: int, max_rows: int) -> Y.DecodedUpdate:
    n = len(data)
    num_clients, pos = Y._uint(data, 0)
    if num_clients != 1:
        if num_clients == 0:
            ds, pos = Y._uint(data, pos)
            if ds:
                Y._reject("yjs.delete_set", "update deletes items; append-only stores never delete")
            if pos != n:
                Y._reject("yjs.trailing_bytes", "bytes after the end of the update")
            Y._reject("yjs.empty", "update inserts no rows")
        Y._reject("yjs.clients", f"update has {num_clients} client sections, expected 1")
    num_structs, pos = Y._uint(data, pos)
    if num_structs == 0:
        Y._reject("yjs.empty", "update inserts no rows")
    if num_structs > max_rows:
        Y._reject("yjs.too_many_rows", f"{num_structs} rows in one update (limit {max_rows})")
    author, pos = Y._uint(data, pos)
    if author != client:
        Y._reject("yjs.clients", f"update written as client {author}, author is client {client}")
    clock, pos = Y._uint(data, pos)
    if clock + num_structs > Y._SAFE:
        Y._reject("yjs.varint", "clock range above 2**53-1")
    prefix = f"{client}/"
    head = Y._item_head(root)
    hlen = len(head)
    rows = []
    for i in range(num_structs):
        # One slice compare covers info byte, parentInfo and root name of a well-formed row.
        end = pos + hlen
        if data[pos:end] != head:
            Y._head_reason(data, pos, root)
        key, pos = Y._str(data, end)
        if not key.startswith(prefix):
            Y._reject("yjs.key_prefix", f"row key {key!r} does not start with {prefix!r}")
        if data[pos] != 1:
            cnt, _ = Y._uint(data, pos)
            Y._reject("yjs.any_count", f"ContentAny holds {cnt} values, expected exactly 1")
        value, pos = _ref_any(data, pos + 1, max_depth)
        rows.append(Y.Row(key, value, clock + i))
    if data[pos] != 0:
        Y._uint(data, pos)  # an overlong 0 is a varint error
        Y._reject("yjs.delete_set", "update deletes items; append-only stores never delete")
    if pos + 1 != n:
        Y._reject("yjs.trailing_bytes", "bytes after the end of the update")
    return Y.DecodedUpdate(client, clock, num_structs, tuple(rows))


def ref_decode_append_update(
    data: bytes,
    *,
    root: str,
    client: int,
    max_depth: int = Y.MAX_DEPTH,
    max_rows: int = 10_000,
) -> Y.DecodedUpdate:
    if not 0 <= max_depth <= Y._DEPTH_CEILING:
        raise ValueError(f"max_depth must be within 0..{Y._DEPTH_CEILING}")
    if type(data) is not bytes:
        data = bytes(data)
    try:
        return _ref_decode(data, root, client, max_depth, max_rows)
    except IndexError:
        raise UpdateRejected("yjs.truncated", "update ends in the middle of a field") from None
    except UnicodeDecodeError:
        raise UpdateRejected("yjs.utf8", "string is not valid UTF-8") from None


def ref_decode_entry(
    header: bytes,
    payloads: Mapping[str, bytes | None] | None = None,
    *,
    expected_db: str | None = None,
    verify_signature: bool = True,
) -> E.Entry:
    payloads = payloads or {}
    if not isinstance(header, (bytes, bytearray)):
        raise E._reject("entry.format", "a header is bytes")
    header = bytes(header)
    if len(header) > E.MAX_HEADER_BYTES:
        raise E._reject("entry.size", f"header of {len(header)} bytes exceeds {E.MAX_HEADER_BYTES}")
    total = len(header) + sum(len(p) for p in payloads.values() if p is not None)
    if total > E.MAX_ENTRY_BYTES:
        raise E._reject("entry.size", f"entry of {total} bytes exceeds {E.MAX_ENTRY_BYTES}")
    for name, update in payloads.items():
        if update is not None and len(update) > E.MAX_PAYLOAD_BYTES:
            raise E._reject("entry.size", f"payload of store {name!r} has {len(update)} bytes, more than {E.MAX_PAYLOAD_BYTES}")
    if len(header) < 70 or header[0] != 0x92 or header[-66:-64] != E._SIG_TRAILER:
        raise E._reject("entry.format", "a signed header is the msgpack array [body, 64-byte signature]")
    body_bytes = header[1:-66]
    signature = header[-64:]
    try:
        body = msgpack.unpackb(
            body_bytes,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_bin_len=E.MAX_HEADER_BYTES,
            max_str_len=E.MAX_HEADER_BYTES,
            max_array_len=E.MAX_PARENTS + 8,
            max_map_len=E.MAX_STORES + 16,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise E._reject("entry.format", f"header body is not valid msgpack: {exc.__class__.__name__}") from None
    if type(body) is not dict:
        raise E._reject("entry.format", "header body must be a map")
    is_root = "db" not in body
    expected_keys = E._BODY_KEYS_ROOT if is_root else E._BODY_KEYS
    if tuple(body) != expected_keys:
        raise E._reject("entry.format", f"header fields must be exactly {', '.join(expected_keys)} in that order")
    if body["v"] != E.FORMAT_VERSION or type(body["v"]) is not int:
        raise E._reject("entry.version", f"unsupported entry format version {body['v']!r}")
    author = E._raw32(body["author"], "author")
    seq = E._uint(body["seq"], "seq")
    ts = E._uint(body["ts"], "ts", 2**63 - 1)
    prev_raw = body["prev"]
    prev = None if prev_raw is None else E.raw_to_id(E._raw32(prev_raw, "prev"))
    parents_raw = body["parents"]
    if type(parents_raw) is not list or len(parents_raw) > E.MAX_PARENTS:
        raise E._reject("entry.format", f"parents must be a list of at most {E.MAX_PARENTS} ids")
    for p in parents_raw:
        E._raw32(p, "a parent id")
    if any(a >= b for a, b in zip(parents_raw, parents_raw[1:])):
        raise E._reject("entry.canonical", "parents must be sorted and unique")
    parents = tuple(E.raw_to_id(p) for p in parents_raw)
    nonce = None
    db = None
    if is_root:
        nonce = body["nonce"]
        if type(nonce) is not bytes or len(nonce) != 16:
            raise E._reject("entry.format", "a root entry carries a 16-byte nonce")
        if parents or prev is not None or seq != 0:
            raise E._reject("entry.format", "a root entry has no parents, no prev and seq 0")
    else:
        db = E.raw_to_id(E._raw32(body["db"], "db"))
        if not parents:
            raise E._reject("entry.format", "a non-root entry names at least one parent")
        if (seq == 0) != (prev is None):
            raise E._reject("entry.format", "prev is empty exactly when seq is 0")
    stores_raw = body["stores"]
    if type(stores_raw) is not dict or not stores_raw or len(stores_raw) > E.MAX_STORES:
        raise E._reject("entry.format", f"stores must be a map of 1..{E.MAX_STORES} descriptors")
    names = list(stores_raw)
    if len(names) > 1 and names != sorted(names, key=lambda n: n.encode("utf-8")):
        raise E._reject("entry.canonical", "store names must be in byte order")
    client = E.client_id_for(author)
    stores: dict[str, E.StoreDescriptor] = {}
    for name, desc in stores_raw.items():
        if not name or len(name) > E.MAX_STORE_NAME:
            raise E._reject("entry.format", f"a store name is 1..{E.MAX_STORE_NAME} characters")
        if type(desc) is not list or len(desc) != 5:
            raise E._reject("entry.format", f"descriptor of store {name!r} is [sha256, length, client, clock, clock_len]")
        sha, length, dclient, clock, clock_len = desc
        if (type(sha) is bytes and len(sha) == 32 and type(length) is int and 0 <= length <= E.MAX_PAYLOAD_BYTES
                and type(dclient) is int and 0 <= dclient <= E.MAX_SAFE_INT and type(clock) is int
                and 0 <= clock <= E.MAX_SAFE_INT and type(clock_len) is int and 0 <= clock_len <= E.MAX_SAFE_INT):
            d = E.StoreDescriptor(sha, length, dclient, clock, clock_len)
        else:  # the same checks one by one, for the message of the first that fails
            d = E.StoreDescriptor(
                E._raw32(sha, f"{name} sha256"),
                E._uint(length, f"{name} length", E.MAX_PAYLOAD_BYTES),
                E._uint(dclient, f"{name} client"),
                E._uint(clock, f"{name} clock"),
                E._uint(clock_len, f"{name} clock_len"),
            )
        if d.clock_len == 0 or d.clock_end > E.MAX_SAFE_INT:
            raise E._reject("entry.format", f"store {name!r} covers an empty or out-of-range clock range")
        if d.client != client:
            raise E._reject("entry.client", f"store {name!r} claims Yjs client {d.client}, the author writes as {client}")
        stores[name] = d
    # Exact canonical form: one logical header has one byte string, hence one id.
    if E._pack(body) != body_bytes:
        raise E._reject("entry.canonical", "header body is not in canonical msgpack form")
    checked: dict[str, bytes | None] = {}
    for name, update in payloads.items():
        described = stores.get(name)
        if described is None:
            raise E._reject("entry.payload", f"payload for store {name!r} that the header does not describe")
        if update is None:
            checked[name] = None
            continue
        if len(update) != described.length:
            raise E._reject("entry.payload", f"payload of store {name!r} has {len(update)} bytes, the header says {described.length}")
        if hashlib.sha256(update).digest() != described.sha256:
            raise E._reject("entry.payload", f"payload of store {name!r} does not match its sha256")
        checked[name] = bytes(update)
    for name in stores:
        checked.setdefault(name, None)
    if verify_signature:
        started = E.verifystats.clock()
        ok = E.verify(author, E.DOMAIN_ENTRY, body_bytes, signature)
        E.verifystats.VERIFIED.add(1, E.verifystats.clock() - started)
        if not ok:
            raise E._reject("entry.signature", "signature does not verify for the author's key")
    entry_id = E.id_of(header)
    if expected_db is not None:
        if is_root and entry_id != expected_db:
            raise E._reject("entry.db", "a root entry of another database")
        if not is_root and db != expected_db:
            raise E._reject("entry.db", f"entry belongs to database {db}, not {expected_db}")
    return E.Entry(entry_id, header, author, seq, prev, parents, ts, db, nonce, stores, checked)


# --- comparing outcomes --------------------------------------------------------------------


def outcome(fn: Callable[[], Any]) -> tuple[Any, ...]:
    """What a call gave: its result, or the reason and message of its refusal, or the type
    of any other exception (which must then be the same for both)."""
    try:
        return ("ok", fn())
    except RejectedError as exc:
        return ("refused", exc.reason, str(exc))
    except Exception as exc:  # noqa: BLE001 - compared, never swallowed: both must raise alike
        return ("raised", type(exc).__name__)


def mutate(data: bytes, how: str, at: int, byte: int) -> bytes:
    if not data:
        return bytes([byte])
    at %= len(data) + (1 if how == "insert" else 0)
    if how == "flip":
        return data[:at] + bytes([data[at] ^ (1 << (byte % 8))]) + data[at + 1:]
    if how == "set":
        return data[:at] + bytes([byte]) + data[at + 1:]
    if how == "insert":
        return data[:at] + bytes([byte]) + data[at:]
    if how == "delete":
        return data[:at] + data[at + 1:]
    if how == "truncate":
        return data[:at]
    return data


mutations = st.tuples(st.sampled_from(["none", "flip", "set", "insert", "delete", "truncate"]),
                      st.integers(0, 1 << 16), st.integers(0, 255))

# --- Yjs updates ---------------------------------------------------------------------------

# Lengths around the one- and two-byte varuint boundaries (127/128, 16383/16384).
long_text = st.sampled_from([0, 1, 126, 127, 128, 129, 300, 16383, 16384, 16385]).map(lambda n: "é" * (n // 2) + "x" * (n % 2))
scalars = (st.none() | st.booleans() | st.integers(-(2**31) + 1, 2**31 - 1) | st.floats(allow_nan=False)
           | st.text(max_size=140) | long_text | st.binary(max_size=140))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=140), inner, max_size=4),
                      max_leaves=12)
clients = st.sampled_from([0, 1, 127, 128, 16383, 16384, 4735441072398640, 2**53 - 1]) | st.integers(0, 2**53 - 1)
clocks = st.sampled_from([0, 1, 127, 128, 129, 16383, 16384, 2**53 - 3]) | st.integers(0, 1 << 22)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(client=clients, clock=clocks, rows=st.lists(values, min_size=1, max_size=3), root=st.sampled_from(["memory", "_settings", "m"]),
       change=mutations, other_client=st.booleans(), max_rows=st.sampled_from([10_000, 1, 0]), max_depth=st.sampled_from([32, 1, 0]))
@example(client=4735441072398640, clock=300, rows=[{"key": "k", "value": "x" * 129, "tags": ["t"]}], root="memory",
         change=("none", 0, 0), other_client=False, max_rows=10_000, max_depth=32)
def test_yjs_decoder_agrees_with_the_reference(client: int, clock: int, rows: list[Any], root: str,
                                                change: tuple[str, int, int], other_client: bool,
                                                max_rows: int, max_depth: int) -> None:
    clock = min(clock, 2**53 - 1 - len(rows))
    data = mutate(encode_rows(client, clock, root, [(f"{client}/{clock + i}", v) for i, v in enumerate(rows)]), *change)
    as_client = (client + 1) % 2**53 if other_client else client
    got = outcome(lambda: decode_append_update(data, root=root, client=as_client, max_depth=max_depth, max_rows=max_rows))
    want = outcome(lambda: ref_decode_append_update(data, root=root, client=as_client, max_depth=max_depth, max_rows=max_rows))
    assert got == want


@settings(max_examples=600, deadline=None)
@given(data=st.binary(max_size=64), prefix=st.sampled_from([b"", b"\x01\x01", b"\x01\x02", b"\x00", b"\x01\x01\x01\x81"]),
       client=st.sampled_from([0, 1, 128, 2**53 - 1, -1, 2**60]))
def test_yjs_decoder_agrees_on_arbitrary_bytes(data: bytes, prefix: bytes, client: int) -> None:
    blob = prefix + data
    got = outcome(lambda: decode_append_update(blob, root="memory", client=client))
    want = outcome(lambda: ref_decode_append_update(blob, root="memory", client=client))
    assert got == want
    assert got[0] != "raised"  # nothing but a refusal escapes, whatever the bytes


CORPUS = Path(__file__).parent / "data" / "yjs-memory-store"


@pytest.mark.parametrize("case", json.loads((CORPUS / "manifest.json").read_text())["cases"], ids=lambda c: c["file"])
def test_yjs_decoder_agrees_on_the_corpus(case: dict[str, Any]) -> None:
    """Real yjs updates (and the nesting bomb), as their author and as another client."""
    data = (CORPUS / case["file"]).read_bytes()
    for client in (case["client"], case["client"] + 1):
        got = outcome(lambda c=client: decode_append_update(data, root="memory", client=c))  # type: ignore[misc]
        assert got == outcome(lambda c=client: ref_decode_append_update(data, root="memory", client=c))  # type: ignore[misc]


def _overlong(data: bytes, field: bytes, spelled: bytes) -> bytes:
    at = data.index(field)
    return data[:at] + spelled + data[at + len(field):]


@pytest.mark.parametrize("field, spelled", [
    (b"w\x02ab", b"w\x82\x00ab"),  # a short string's length, as two bytes
    (b"w\x82\x01", b"w\x82\x81\x00"),  # a two-byte length, as three
    (b"\x05(", b"\x85\x00("),  # the clock, as two bytes
    (b"\x81\x01(", b"\x81\x81\x00("),  # a two-byte clock, as three
])
def test_yjs_fast_paths_leave_overlong_varuints_to_the_strict_reader(field: bytes, spelled: bytes) -> None:
    """The inline one- and two-byte reads refuse what lib0 never writes (a trailing zero group)."""
    client = 7
    clock = 5 if field.startswith(b"\x05") else 129
    good = encode_rows(client, clock, "memory", [(f"{client}/{clock}", ["ab", "x" * 130])])
    bad = _overlong(good, field, spelled)
    got = outcome(lambda: decode_append_update(bad, root="memory", client=client))
    assert got == outcome(lambda: ref_decode_append_update(bad, root="memory", client=client))
    assert got[:2] == ("refused", "yjs.varint")
    assert outcome(lambda: decode_append_update(good, root="memory", client=client))[0] == "ok"


# --- entry headers -------------------------------------------------------------------------

KEYS = [SigningKey.from_seed(bytes([n]) * 32) for n in (1, 2)]


def _entries() -> list[tuple[bytes, dict[str, bytes | None], str]]:
    """Signed entries of several shapes: (header, payloads, the database id)."""
    a, b = KEYS
    ca, cb = E.client_id_for(a.public.raw), E.client_id_for(b.public.raw)
    root = sign_entry(a, db=None, seq=0, prev=None, parents=(), ts=1, nonce=b"n" * 16,
                      payloads={"_settings": (encode_rows(ca, 0, "_settings", [(f"{ca}/0", {"op": "grant"})]), 0, 1)})
    one = sign_entry(a, db=root.id, seq=1, prev=root.id, parents=(root.id,), ts=2,
                     payloads={"memory": (encode_rows(ca, 0, "memory", [(f"{ca}/0", {"value": "v" * 200})]), 0, 1)})
    other = sign_entry(b, db=root.id, seq=0, prev=None, parents=(root.id,), ts=3,
                       payloads={"memory": (encode_rows(cb, 0, "memory", [(f"{cb}/0", "x")]), 0, 1)})
    merge = sign_entry(a, db=root.id, seq=2, prev=one.id, parents=(one.id, other.id), ts=4,
                       payloads={"memory": (encode_rows(ca, 1, "memory", [(f"{ca}/1", 1), (f"{ca}/2", 2)]), 1, 2),
                                 "notes": (encode_rows(ca, 0, "notes", [(f"{ca}/0", None)]), 0, 1)})
    return [(e.header, dict(e.payloads), root.id) for e in (root, one, other, merge)]


ENTRIES = _entries()


@settings(max_examples=800, deadline=None)
@given(which=st.integers(0, len(ENTRIES) - 1), change=mutations, payload_change=mutations,
       drop=st.sampled_from(["none", "payload", "all", "extra"]), db=st.sampled_from(["none", "own", "other"]),
       as_bytearray=st.booleans())
def test_entry_decoder_agrees_with_the_reference(which: int, change: tuple[str, int, int],
                                                 payload_change: tuple[str, int, int], drop: str, db: str,
                                                 as_bytearray: bool) -> None:
    header, payloads, db_id = ENTRIES[which]
    header = mutate(header, *change)
    name = sorted(payloads)[-1]
    payloads = dict(payloads)
    payloads[name] = mutate(payloads[name] or b"", *payload_change) if payload_change[0] != "none" else payloads[name]
    if drop == "payload":
        payloads[name] = None
    elif drop == "all":
        payloads = {}
    elif drop == "extra":
        payloads["unknown"] = b"x"
    expected = {"none": None, "own": db_id, "other": "sha256:" + "0" * 64}[db]
    given_header: bytes | bytearray = bytearray(header) if as_bytearray else header
    got = outcome(lambda: decode_entry(given_header, payloads, expected_db=expected, verify_signature=False))
    want = outcome(lambda: ref_decode_entry(given_header, payloads, expected_db=expected, verify_signature=False))
    assert got == want


AUTHOR = KEYS[0].public.raw
ids32 = st.sampled_from([b"\x01" * 32, b"\x02" * 32, b"\x03" * 31, "x" * 32, None, 5])
ints = st.sampled_from([-1, 0, 1, 2, 2**31, 2**53 - 2, 2**53 - 1, 2**53, 2**63 - 1, 2**63, 2**64 - 1, True, 1.0])
descriptors = st.lists(st.one_of(st.just(b"s" * 32), st.just(E.client_id_for(AUTHOR)), ints, ids32), min_size=4, max_size=6) | st.fixed_dictionaries({
    "sha": st.sampled_from([b"s" * 32, b"s" * 31, "s"]), "length": ints,
    "client": st.sampled_from([E.client_id_for(AUTHOR), 1, -1, 2**53]), "clock": ints, "clock_len": ints,
}).map(lambda d: [d["sha"], d["length"], d["client"], d["clock"], d["clock_len"]])
near_bodies = st.fixed_dictionaries({
    "author": st.just(AUTHOR) | ids32,
    "db": st.just(b"\x09" * 32) | ids32,
    "nonce": st.sampled_from([b"n" * 16, b"n" * 15, None]),
    "parents": st.lists(st.sampled_from([b"\x01" * 32, b"\x02" * 32, b"\x03" * 32]), max_size=3) | st.just([b"\x01" * 31]) | st.just("p"),
    "prev": st.sampled_from([None, b"\x01" * 32, b"\x02" * 32, b"\x01" * 31]),
    "seq": ints, "ts": ints, "v": st.sampled_from([1, 2, True, 1.0, "1"]),
    "stores": st.dictionaries(st.sampled_from(["memory", "a", "", "z" * 129]), descriptors, max_size=2) | st.just([]),
}, optional={"extra": st.just(1)})


@settings(max_examples=1500, deadline=None)
@given(body=near_bodies, root=st.booleans(), signature=st.binary(min_size=64, max_size=64))
def test_entry_decoder_agrees_on_made_up_bodies(body: dict[str, Any], root: bool, signature: bytes) -> None:
    """Bodies near an entry's, every field at and past its bounds: every check, in order."""
    del body["nonce" if not root else "db"]
    ordered = dict(sorted(body.items()))
    header = b"\x92" + msgpack.packb(ordered, use_bin_type=True) + b"\xc4\x40" + signature
    got = outcome(lambda: decode_entry(header, {}, verify_signature=False))
    want = outcome(lambda: ref_decode_entry(header, {}, verify_signature=False))
    assert got == want


BOUNDS = [-1, 0, 1, 2**53 - 2, 2**53 - 1, 2**53, 2**63 - 1, 2**63, True, 1.5, None, b"x"]


@pytest.mark.parametrize("field", ["seq", "ts", "length", "client", "clock", "clock_len", "v"])
@pytest.mark.parametrize("value", BOUNDS)
def test_entry_decoder_agrees_at_every_bound(field: str, value: Any) -> None:
    """One valid entry with one field at or past its bound (and the clock range around the
    largest safe integer)."""
    header, payloads, db_id = ENTRIES[1]
    body = msgpack.unpackb(header[1:-66], raw=False)
    if field in ("seq", "ts", "v"):
        body[field] = value
    else:
        desc = body["stores"]["memory"]
        desc[["sha", "length", "client", "clock", "clock_len"].index(field)] = value
        if field == "clock" and isinstance(value, int) and value > 2:
            desc[4] = 2  # a range that may run past 2**53 - 1
    forged = b"\x92" + msgpack.packb(body, use_bin_type=True) + header[-66:]
    for carried in ({}, payloads):
        got = outcome(lambda p=carried: decode_entry(forged, p, expected_db=db_id, verify_signature=False))  # type: ignore[misc]
        assert got == outcome(lambda p=carried: ref_decode_entry(forged, p, expected_db=db_id, verify_signature=False))  # type: ignore[misc]


def test_entry_decoder_checks_signatures_as_before() -> None:
    header, payloads, db_id = ENTRIES[3]
    assert decode_entry(header, payloads, expected_db=db_id) == ref_decode_entry(header, payloads, expected_db=db_id)
    forged = header[:-1] + bytes([header[-1] ^ 1])
    got = outcome(lambda: decode_entry(forged, payloads, expected_db=db_id))
    assert got == outcome(lambda: ref_decode_entry(forged, payloads, expected_db=db_id))
    assert got[:2] == ("refused", "entry.signature")


# --- records built without __init__ --------------------------------------------------------


def test_builder_makes_the_same_frozen_record() -> None:
    fields = ("sha256:" + "a" * 64, b"h", b"k" * 32, 3, None, ("p",), 7, None, b"n" * 16,
              {"m": StoreDescriptor(b"s" * 32, 1, 2, 3, 4)}, {"m": b"x"})
    built = builder(Entry)(*fields)
    plain = Entry(*fields)
    assert type(built) is Entry
    assert built == plain and hash(built.parents) == hash(plain.parents)
    assert dataclasses.astuple(built) == dataclasses.astuple(plain)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.seq = 4  # type: ignore[misc]
    assert repr(built) == repr(plain)


def test_builder_refuses_classes_it_cannot_build() -> None:
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class PostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    for cls in (NoSlots, PostInit, int):
        with pytest.raises(TypeError):
            builder(cls)


# --- storing without a copy ----------------------------------------------------------------


def test_plain_and_normalised_entries_are_stored_alike(tmp_path: Any) -> None:
    """An entry stored as it is (bytes, a dict) and one check_entry normalises (a bytearray
    header, memoryview payloads, a read-only mapping) leave the same rows."""
    db = "sha256:" + "d" * 64

    def entry(n: int) -> tuple[str, bytes, dict[str, bytes | None]]:
        header = bytes([n]) * 80
        return "sha256:" + hashlib.sha256(header).hexdigest(), header, {"zeta": b"z%d" % n, "alpha": None, "mid": b"m"}

    stored = []
    for name, normalise in (("plain", False), ("copied", True)):
        storage = SqliteStorage(tmp_path / f"{name}.sqlite")
        storage.add_database(db)
        batch: list[StoredEntry] = []
        for n in range(3):
            entry_id, header, payloads = entry(n)
            if normalise:
                batch.append(StoredEntry(entry_id, bytearray(header),  # type: ignore[arg-type]
                                         MappingProxyType({s: (None if p is None else memoryview(p)) for s, p in payloads.items()})))  # type: ignore[misc]
            else:
                batch.append(StoredEntry(entry_id, header, payloads))
        assert storage.append(db, batch + batch[:1]) == 3
        stored.append([(e.id, e.header, dict(e.payloads)) for e in storage.entries(db)])
        storage.close()
    assert stored[0] == stored[1]
    assert [list(p) for _i, _h, p in stored[0]] == [["alpha", "mid", "zeta"]] * 3
