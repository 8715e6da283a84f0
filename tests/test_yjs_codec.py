"""Tests of the strict Yjs v1 codec for append-only stores (crdt/yjs.py).

Corpus: tests/data/yjs-memory-store (real yjs 13.6.33 updates + one crafted nesting bomb).
The bomb must never be handed to pycrdt: only updates the decoder accepted are applied here.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pycrdt import Array, Doc, Map, Text

from memmesh.crdt.errors import MemmeshError, RejectedError, UpdateRejected
from memmesh.crdt.yjs import (
    MAX_DEPTH,
    DecodedUpdate,
    Row,
    check_append,
    decode_any,
    decode_append_update,
    encode_any,
    encode_gc,
    encode_rows,
)

DATA = Path(__file__).parent / "data" / "yjs-memory-store"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
CASES = MANIFEST["cases"]
CLIENT_OF = {c["file"]: c["client"] for c in CASES}

# Verdict per corpus file: "accept" or the exact reason code of the rejection.
EXPECTED = {
    "base_a_insert.bin": "accept",
    "a_two_new_keys_one_txn.bin": "accept",
    "b_overwrites_a_key.bin": "yjs.origin",
    "b_deletes_a_key.bin": "yjs.delete_set",
    "b_nested_map_value.bin": "yjs.struct_kind",
    "b_text_value.bin": "yjs.struct_kind",
    "b_other_root.bin": "yjs.parent",
    "b_any_object_value.bin": "accept",
    "b_array_insert_same_root_name.bin": "yjs.no_key",
    "a_overwrites_own_key.bin": "yjs.origin",
    "a_full_state.bin": "accept",
    "crafted_deep_nesting.bin": "yjs.depth",
}


# --- helpers -------------------------------------------------------------------------------


def vu(n: int) -> bytes:
    """lib0 varuint, written independently of the module under test."""
    out = bytearray()
    while True:
        if n > 0x7F:
            out.append(0x80 | (n & 0x7F))
            n >>= 7
        else:
            out.append(n)
            return bytes(out)


def vs(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return vu(len(b)) + b


def item(key: str | bytes, any_bytes: bytes, *, root: str | bytes = "memory", count: int = 1) -> bytes:
    """A hand-made row item: info 0x28, parent = root by name, parentSub key, ContentAny."""
    return b"\x28\x01" + vs(root) + vs(key) + vu(count) + any_bytes


def update(client: int, clock: int, structs: list[bytes], ds: bytes = b"\x00") -> bytes:
    return b"\x01" + vu(len(structs)) + vu(client) + vu(clock) + b"".join(structs) + ds


def state_clock(doc: Doc, client: int) -> int:
    """The clock of `client` in the doc's encoded state vector (0 if absent)."""
    sv = doc.get_state()
    pos = 0

    def rd() -> int:
        nonlocal pos
        v = shift = 0
        while True:
            b = sv[pos]
            pos += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return v

    for _ in range(rd()):
        c, clk = rd(), rd()
        if c == client:
            return clk
    return 0


def same(a: Any, b: Any) -> bool:
    """Structural equality that does not let True pass for 1 (numbers compare as numbers:
    pycrdt returns every number as float)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (bytes, bytearray)) or isinstance(b, (bytes, bytearray)):
        return isinstance(a, (bytes, bytearray)) and isinstance(b, (bytes, bytearray)) and a == b
    if isinstance(a, str) or isinstance(b, str):
        return type(a) is str and type(b) is str and a == b
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return False


def pycrdt_map_after(updates: list[bytes], root: str = "memory") -> dict:
    doc = Doc()
    m = doc.get(root, type=Map)
    for u in updates:
        doc.apply_update(u)
    return dict(m)


def pycrdt_insert(client: int, items: list[tuple[str, Any]], root: str = "memory", before=()) -> bytes:
    """What pycrdt emits for map[key] = value on new keys in one transaction."""
    doc = Doc(client_id=client)
    m = doc.get(root, type=Map)
    for k, v in before:
        m[k] = v
    state = doc.get_state()
    with doc.transaction():
        for k, v in items:
            m[k] = v
    return doc.get_update(state)


def reason_of(data: bytes, **kw: Any) -> str:
    kw.setdefault("root", "memory")
    with pytest.raises(UpdateRejected) as ei:
        decode_append_update(data, **kw)
    return ei.value.reason


def rows_as_dict(u: DecodedUpdate) -> dict:
    return {r.key: r.value for r in u.rows}


# --- 1. corpus -----------------------------------------------------------------------------


def test_expected_covers_manifest() -> None:
    assert MANIFEST["store_root"] == "memory"
    assert set(EXPECTED) == {c["file"] for c in CASES}
    for c in CASES:
        assert (EXPECTED[c["file"]] == "accept") == (c["verdict"] == "accept"), c["file"]


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_corpus_case(case: dict) -> None:
    next_clock: dict[int, int] = {}
    keys: set[str] = set()
    applied: list[bytes] = []
    for name in case["applies_on"] or []:
        author = CLIENT_OF.get(name, 1001)
        raw = (DATA / name).read_bytes()
        base = decode_append_update(raw, root="memory", client=author)
        check_append(base, next_clock=next_clock.get(author, 0), exists=keys.__contains__)
        next_clock[author] = base.clock + base.length
        keys.update(r.key for r in base.rows)
        applied.append(raw)

    raw = (DATA / case["file"]).read_bytes()
    client = case["client"]
    try:
        upd = decode_append_update(raw, root="memory", client=client)
        check_append(upd, next_clock=next_clock.get(client, 0), exists=keys.__contains__)
    except UpdateRejected as e:
        assert case["verdict"] == "reject", f"{case['file']} rejected: {e.reason} {e}"
        assert e.reason == EXPECTED[case["file"]]
        assert isinstance(e, RejectedError) and isinstance(e, MemmeshError)
        assert str(e)  # a human sentence
        return
    assert case["verdict"] == "accept" and EXPECTED[case["file"]] == "accept"
    assert upd.client == client and upd.length == len(upd.rows) >= 1
    assert [r.clock for r in upd.rows] == list(range(upd.clock, upd.clock + upd.length))
    # Accepted, hence safe for pycrdt: the store equals the rows the decoder saw.
    before = pycrdt_map_after(applied)
    after = pycrdt_map_after(applied + [raw])
    assert same({k: v for k, v in after.items() if k not in before}, rows_as_dict(upd))


def test_corpus_values() -> None:
    u = decode_append_update((DATA / "b_any_object_value.bin").read_bytes(), root="memory", client=2002)
    assert u.rows == (
        Row("2002/obj", {"key": "deploy", "value": "nix build", "tags": ["ops"], "n": 3, "ok": True}, 0),
    )
    assert type(u.rows[0].value["n"]) is int and u.rows[0].value["ok"] is True
    full = decode_append_update((DATA / "a_full_state.bin").read_bytes(), root="memory", client=1001)
    assert (full.client, full.clock, full.length) == (1001, 0, 3)
    assert rows_as_dict(full) == {"1001/k1": "v1", "1001/k2": "v2", "1001/k3": {"text": "v3", "tags": ["a", "b"]}}


def test_encode_rows_matches_yjs_bytes() -> None:
    """encode_rows produces byte-for-byte what yjs produced for the same map.set calls."""
    for name in ["base_a_insert.bin", "a_two_new_keys_one_txn.bin", "a_full_state.bin", "b_any_object_value.bin"]:
        raw = (DATA / name).read_bytes()
        u = decode_append_update(raw, root="memory", client=CLIENT_OF[name])
        assert encode_rows(u.client, u.clock, "memory", [(r.key, r.value) for r in u.rows]) == raw, name


def test_deep_bomb_rejected_by_depth_only() -> None:
    raw = (DATA / "crafted_deep_nesting.bin").read_bytes()
    assert len(raw) > 40_000
    assert reason_of(raw, client=2002) == "yjs.depth"
    # Even with a caller-raised limit it stays an UpdateRejected (no RecursionError).
    assert reason_of(raw, client=2002, max_depth=256) == "yjs.depth"
    with pytest.raises(ValueError):
        decode_append_update(raw, root="memory", client=2002, max_depth=100_000)


# --- 2. round trips with real pycrdt -------------------------------------------------------

SAMPLE_VALUES: list[Any] = [
    "text", "", "ünïcödé ✓ 🧠", 0, 1, -1, 63, 64, -64, 2**31 - 1, -(2**31 - 1), 2**31, 2**40,
    2**53 - 1, -(2**53 - 1), 1.5, 0.1, -2.75e-300, 1e300, True, False, None,
    [1, "a", None, [True]], {"text": "x", "tags": ["a", "b"], "n": 3, "w": 0.25, "o": {"p": None}},
    [], {},
]


@pytest.mark.parametrize("root", ["memory", "_settings", "embeddings:local/minilm", "r" * 200])
@pytest.mark.parametrize("client", [1, 1001, 2**32 + 7, 2**53 - 1])
def test_pycrdt_update_decodes(root: str, client: int) -> None:
    items = [(f"{client}/k{i}", v) for i, v in enumerate(SAMPLE_VALUES)]
    raw = pycrdt_insert(client, items, root=root)
    u = decode_append_update(raw, root=root, client=client)
    assert (u.client, u.clock, u.length) == (client, 0, len(items))
    assert [r.key for r in u.rows] == [k for k, _ in items]
    for r, (_, v) in zip(u.rows, items):
        assert same(r.value, v), (r.value, v)
    # A later transaction continues the author's clocks.
    raw2 = pycrdt_insert(client, [(f"{client}/later", "x")], root=root, before=items)
    u2 = decode_append_update(raw2, root=root, client=client)
    assert (u2.clock, u2.length, u2.rows[0].clock) == (len(items), 1, len(items))
    check_append(u2, next_clock=len(items), exists={k for k, _ in items}.__contains__)


@pytest.mark.parametrize("root", ["memory", "embeddings:local/minilm"])
def test_encode_rows_applies_in_pycrdt(root: str) -> None:
    c = 4242
    rows = [(f"{c}/k{i}", v) for i, v in enumerate(SAMPLE_VALUES)] + [(f"{c}/bin", b"\x00\xff" * 10)]
    raw = encode_rows(c, 0, root, rows)
    u = decode_append_update(raw, root=root, client=c)
    assert [(r.key, r.clock) for r in u.rows] == [(k, i) for i, (k, _) in enumerate(rows)]
    got = pycrdt_map_after([raw], root=root)
    assert same(got, dict(rows))
    for r, (_, v) in zip(u.rows, rows):
        assert same(r.value, v)


def test_any_type_mapping() -> None:
    # (value, lib0 bytes, decoded value); decoded types are checked exactly.
    table: list[tuple[Any, str, Any]] = [
        (None, "7e", None), (True, "78", True), (False, "79", False),
        (0, "7d00", 0), (1, "7d01", 1), (-1, "7d41", -1), (63, "7d3f", 63), (64, "7d8001", 64),
        (-64, "7dc001", -64), (2**31 - 1, "7dbfffffff0f", 2**31 - 1),
        (2**31, "7c4f000000", 2.0**31), (2**53 - 1, "7b433fffffffffffff", 2.0**53 - 1),
        (1.5, "7c3fc00000", 1.5), (0.1, "7b3fb999999999999a", 0.1),
        ("x", "770178", "x"), (b"ab", "74026162", b"ab"), ((1,), "75017d01", [1]),
        ({"a": 1}, "760101617d01", {"a": 1}),
    ]
    for value, hexbytes, decoded in table:
        assert encode_any(value).hex() == hexbytes, value
        got = decode_any(bytes.fromhex(hexbytes))
        assert got == decoded and type(got) is type(decoded), (value, got)
    # Other tags only yjs/yrs write: float32 1.0 as pycrdt writes ints, int64 bigint.
    assert decode_any(bytes.fromhex("7c3f800000")) == 1.0
    assert decode_any(bytes.fromhex("7a8000000000000000")) == -(2**63)
    assert decode_any(bytes.fromhex("7d40")) == 0  # lib0 negative zero
    with pytest.raises(UpdateRejected):
        decode_any(bytes.fromhex("7d0100"))  # trailing byte


def test_encode_errors() -> None:
    for bad in [2**53, -(2**53), 2**70]:
        with pytest.raises(ValueError):
            encode_any(bad)
    nested: Any = "leaf"
    for _ in range(MAX_DEPTH + 1):
        nested = [nested]
    with pytest.raises(ValueError):
        encode_any(nested)
    encode_any(nested[0])  # exactly MAX_DEPTH levels is fine
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(ValueError):
        encode_any(cyclic)
    for bad in [{1: "x"}, {"a", "b"}, object(), 1j]:
        with pytest.raises(TypeError):
            encode_any(bad)
    with pytest.raises(ValueError):
        encode_rows(5, 0, "memory", [])
    with pytest.raises(ValueError):
        encode_rows(5, 0, "memory", [("6/x", 1)])
    with pytest.raises(ValueError):
        encode_rows(5, 0, "memory", [("5/x", 1), ("5/x", 2)])
    with pytest.raises(ValueError):
        encode_gc(5, 0, 0)


_text = st.text(st.characters(codec="utf-8"), max_size=12)
_scalars = (
    st.none() | st.booleans() | st.integers(-(2**53 - 1), 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | _text
)


def json_values(depth: int = 5) -> st.SearchStrategy[Any]:
    if depth == 0:
        return _scalars
    sub = json_values(depth - 1)
    return _scalars | st.lists(sub, max_size=4) | st.dictionaries(_text, sub, max_size=4)


_rows = st.lists(st.tuples(_text, json_values()), min_size=1, max_size=5, unique_by=lambda t: t[0])
_client = st.integers(1, 2**32)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(client=_client, rows=_rows)
def test_roundtrip_pycrdt_to_decoder(client: int, rows: list[tuple[str, Any]]) -> None:
    items = [(f"{client}/{name}", v) for name, v in rows]
    u = decode_append_update(pycrdt_insert(client, items), root="memory", client=client)
    assert [r.key for r in u.rows] == [k for k, _ in items]
    assert all(same(r.value, v) for r, (_, v) in zip(u.rows, items))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(client=_client, clock=st.integers(0, 1000), rows=_rows)
def test_roundtrip_encoder_to_pycrdt(client: int, clock: int, rows: list[tuple[str, Any]]) -> None:
    items = [(f"{client}/{name}", v) for name, v in rows]
    raw = encode_rows(client, 0, "memory", items)
    u = decode_append_update(raw, root="memory", client=client)
    assert all(same(r.value, v) for r, (_, v) in zip(u.rows, items))
    assert same(pycrdt_map_after([raw]), dict(items))
    # Any starting clock round-trips through the decoder.
    u2 = decode_append_update(encode_rows(client, clock, "memory", items), root="memory", client=client)
    assert (u2.clock, u2.length) == (clock, len(items))


# --- 3. GC filler --------------------------------------------------------------------------


def test_gc_fills_erased_entry() -> None:
    c = 31337
    e1 = encode_rows(c, 0, "memory", [(f"{c}/a", "one"), (f"{c}/b", {"x": 1})])
    e2 = encode_rows(c, 2, "memory", [(f"{c}/secret", "erase me"), (f"{c}/s2", [1, 2])])
    e3 = encode_rows(c, 4, "memory", [(f"{c}/c", 3), (f"{c}/d", None), (f"{c}/e", True)])
    d2 = decode_append_update(e2, root="memory", client=c)
    d3 = decode_append_update(e3, root="memory", client=c)
    doc = Doc()
    m = doc.get("memory", type=Map)
    doc.apply_update(e1)
    doc.apply_update(encode_gc(c, d2.clock, d2.length))
    doc.apply_update(e3)
    assert same(dict(m), {f"{c}/a": "one", f"{c}/b": {"x": 1}, f"{c}/c": 3, f"{c}/d": None, f"{c}/e": True})
    assert state_clock(doc, c) == d3.clock + d3.length == 7
    # Without the filler pycrdt's state for the author stays stuck before the gap.
    doc2 = Doc()
    doc2.get("memory", type=Map)
    doc2.apply_update(e1)
    doc2.apply_update(e3)
    assert state_clock(doc2, c) == 2
    # A GC struct is for trusted local use only: received updates may not carry one.
    assert reason_of(encode_gc(c, 2, 2), client=c) == "yjs.struct_kind"


# --- 4. robustness -------------------------------------------------------------------------

VALID = [
    (DATA / "a_full_state.bin").read_bytes(),
    (DATA / "b_any_object_value.bin").read_bytes(),
    encode_rows(
        2002, 5, "memory", [("2002/v", {"t": "é✓", "n": -70000, "f": 0.1, "b": b"\x01", "l": [2**40]})]
    ),
]


def _decode_or_reject(data: bytes, client: int) -> DecodedUpdate | None:
    try:
        return decode_append_update(data, root="memory", client=client)
    except UpdateRejected as e:
        assert e.reason.startswith("yjs.")
        return None


def _client_of(raw: bytes) -> int:
    return 1001 if raw[3] == 0x07 else 2002


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash(data: bytes) -> None:
    _decode_or_reject(data, 2002)
    _decode_or_reject(b"\x01\x01\xd2\x0f" + data, 2002)  # plausible header, random body


@pytest.mark.parametrize("raw", VALID)
def test_every_truncation_rejected(raw: bytes) -> None:
    client = _client_of(raw)
    assert _decode_or_reject(raw, client) is not None
    for cut in range(len(raw)):
        assert reason_of(raw[:cut], client=client) == "yjs.truncated", cut


def _differential(mutated: bytes, client: int) -> None:
    """If the decoder accepts an update that fits a fresh store, pycrdt must see the same rows."""
    u = _decode_or_reject(mutated, client)
    if u is None:
        return
    try:
        check_append(u, next_clock=0, exists=lambda k: False)
    except UpdateRejected:
        return
    assert same(pycrdt_map_after([mutated]), rows_as_dict(u))


@pytest.mark.parametrize("raw", VALID[:2])
def test_every_single_byte_mutation(raw: bytes) -> None:
    client = _client_of(raw)
    for i in range(len(raw)):
        for b in range(256):
            if b != raw[i]:
                _differential(raw[:i] + bytes([b]) + raw[i + 1:], client)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=_rows, data=st.data())
def test_mutations_of_generated_updates(rows: list[tuple[str, Any]], data: st.DataObject) -> None:
    raw = encode_rows(77, 0, "memory", [(f"77/{k}", v) for k, v in rows])
    i = data.draw(st.integers(0, len(raw) - 1))
    op = data.draw(st.sampled_from(["set", "insert", "delete"]))
    b = data.draw(st.integers(0, 255))
    mutated = {
        "set": raw[:i] + bytes([b]) + raw[i + 1:],
        "insert": raw[:i] + bytes([b]) + raw[i:],
        "delete": raw[:i] + raw[i + 1:],
    }[op]
    _differential(mutated, 77)
    with pytest.raises(UpdateRejected):
        decode_append_update(raw[:i], root="memory", client=77)


# --- 5. specific shapes --------------------------------------------------------------------

C = 5


def test_overwrite_own_key() -> None:
    # As yjs/pycrdt write it: an item with an origin (plus a delete set).
    doc = Doc(client_id=C)
    m = doc.get("memory", type=Map)
    m[f"{C}/a"] = "x"
    state = doc.get_state()
    m[f"{C}/a"] = "y"
    assert reason_of(doc.get_update(state), client=C) == "yjs.origin"
    # Crafted as a fresh-looking item for an existing key: caught against the store.
    u = decode_append_update(encode_rows(C, 1, "memory", [(f"{C}/a", "y")]), root="memory", client=C)
    with pytest.raises(UpdateRejected) as ei:
        check_append(u, next_clock=1, exists={f"{C}/a"}.__contains__)
    assert ei.value.reason == "yjs.overwrite"
    check_append(u, next_clock=1, exists={f"{C}/b"}.__contains__)  # a different key is fine


def test_other_author() -> None:
    raw = pycrdt_insert(C, [(f"{C}/a", 1)])
    assert reason_of(raw, client=6) == "yjs.clients"
    raw6 = encode_rows(6, 0, "memory", [("6/a", 1)])
    assert reason_of(raw6, client=C) == "yjs.clients"
    # The author's own client id with another author's key prefix.
    assert reason_of(pycrdt_insert(C, [("6/a", 1)]), client=C) == "yjs.key_prefix"
    assert reason_of(pycrdt_insert(C, [("50/a", 1)]), client=C) == "yjs.key_prefix"
    assert reason_of(pycrdt_insert(C, [("a", 1)]), client=C) == "yjs.key_prefix"
    # Two client sections.
    two = b"\x02" + update(C, 0, [item(f"{C}/a", b"\x78")])[1:-1] + update(6, 0, [item("6/a", b"\x78")])[1:]
    assert reason_of(two, client=C) == "yjs.clients"


def test_clock_gap_and_reuse() -> None:
    raw = encode_rows(C, 3, "memory", [(f"{C}/a", 1), (f"{C}/b", 2)])
    u = decode_append_update(raw, root="memory", client=C)
    check_append(u, next_clock=3, exists=lambda k: False)
    cases = [(2, "yjs.clock_gap"), (0, "yjs.clock_gap"), (4, "yjs.clock_reuse"), (5, "yjs.clock_reuse")]
    for next_clock, reason in cases:
        with pytest.raises(UpdateRejected) as ei:
            check_append(u, next_clock=next_clock, exists=lambda k: False)
        assert ei.value.reason == reason


def test_delete_set() -> None:
    doc = Doc(client_id=C)
    m = doc.get("memory", type=Map)
    m[f"{C}/a"] = "x"
    state = doc.get_state()
    del m[f"{C}/a"]
    assert reason_of(doc.get_update(state), client=C) == "yjs.delete_set"
    # Valid rows followed by a non-empty delete set (deleting clock 0 of client 9).
    raw = update(C, 0, [item(f"{C}/a", b"\x78")], ds=b"\x01\x09\x01\x00\x01")
    assert reason_of(raw, client=C) == "yjs.delete_set"
    assert reason_of(b"\x00\x00", client=C) == "yjs.empty"


def test_shared_type_values() -> None:
    doc = Doc(client_id=C)
    doc.get("memory", type=Map)[f"{C}/n"] = Map({"z": 1})
    assert reason_of(doc.get_update(), client=C) == "yjs.struct_kind"
    doc = Doc(client_id=C)
    doc.get("memory", type=Map)[f"{C}/t"] = Text("hello")
    assert reason_of(doc.get_update(), client=C) == "yjs.struct_kind"
    doc = Doc(client_id=C)
    doc.get("memory", type=Map)[f"{C}/l"] = Array([1, 2])
    assert reason_of(doc.get_update(), client=C) == "yjs.struct_kind"


def test_wrong_roots() -> None:
    doc = Doc(client_id=C)
    doc.get("memory", type=Array).extend([1, "x"])
    assert reason_of(doc.get_update(), client=C) == "yjs.no_key"
    doc = Doc(client_id=C)
    with doc.transaction():
        doc.get("memory", type=Map)[f"{C}/a"] = 1
        doc.get("other", type=Map)[f"{C}/b"] = 2
    assert reason_of(doc.get_update(), client=C) == "yjs.parent"
    assert reason_of(update(C, 0, [item(f"{C}/a", b"\x78", root="memorx")]), client=C) == "yjs.parent"
    assert reason_of(pycrdt_insert(C, [(f"{C}/a", 1)]), client=C, root="_settings") == "yjs.parent"
    # Parent given as an item ID (parentInfo 0, then client, clock).
    by_id = update(C, 0, [b"\x28\x00\x09\x00" + vs(f"{C}/a") + b"\x01\x78"])
    assert reason_of(by_id, client=C) == "yjs.parent"
    # Origin / right origin, GC and Skip structs.
    assert reason_of(update(C, 0, [b"\x68\x09\x00\x01\x78"]), client=C) == "yjs.origin"
    assert reason_of(update(C, 0, [b"\x00\x02"]), client=C) == "yjs.struct_kind"
    assert reason_of(update(C, 0, [b"\x0a\x02"]), client=C) == "yjs.struct_kind"


def _nested_list(depth: int) -> bytes:
    return b"\x75\x01" * depth + b"\x7e"


def test_depth_limit() -> None:
    assert reason_of(update(C, 0, [item(f"{C}/d", _nested_list(60))]), client=C) == "yjs.depth"
    ok = decode_append_update(update(C, 0, [item(f"{C}/d", _nested_list(MAX_DEPTH))]), root="memory", client=C)
    v = ok.rows[0].value
    for _ in range(MAX_DEPTH):
        v = v[0]
    assert v is None
    assert reason_of(update(C, 0, [item(f"{C}/d", _nested_list(MAX_DEPTH + 1))]), client=C) == "yjs.depth"
    deep_obj = b"\x76\x01\x01k" * (MAX_DEPTH + 1) + b"\x7e"
    assert reason_of(update(C, 0, [item(f"{C}/d", deep_obj)]), client=C) == "yjs.depth"
    assert reason_of(update(C, 0, [item(f"{C}/d", _nested_list(3))]), client=C, max_depth=2) == "yjs.depth"


def test_any_tags_and_counts() -> None:
    assert reason_of(update(C, 0, [item(f"{C}/u", b"\x7f")]), client=C) == "yjs.any_tag"
    assert reason_of(update(C, 0, [item(f"{C}/u", b"\x32")]), client=C) == "yjs.any_tag"
    assert reason_of(update(C, 0, [item(f"{C}/u", b"\x75\x01\x7f")]), client=C) == "yjs.any_tag"
    assert reason_of(update(C, 0, [item(f"{C}/u", b"\x78\x78", count=2)]), client=C) == "yjs.any_count"
    assert reason_of(update(C, 0, [item(f"{C}/u", b"", count=0)]), client=C) == "yjs.any_count"


def test_varints() -> None:
    good = update(1001, 0, [item("1001/a", b"\x78")])
    assert decode_append_update(good, root="memory", client=1001).rows == (Row("1001/a", True, 0),)
    overlong_client = good.replace(b"\xe9\x07", b"\xe9\x87\x00", 1)
    assert reason_of(overlong_client, client=1001) == "yjs.varint"
    assert reason_of(update(C, 2**53, [item(f"{C}/a", b"\x78")]), client=C) == "yjs.varint"
    assert reason_of(b"\x01\x01" + b"\xff" * 9 + b"\x01", client=C) == "yjs.varint"
    assert reason_of(update(C, 0, [item(f"{C}/a", b"\x7d\x81\x00")]), client=C) == "yjs.varint"
    assert reason_of(update(C, 0, [item(f"{C}/a", b"\x7d" + b"\xff" * 8 + b"\x01")]), client=C) == "yjs.varint"
    assert reason_of(update(C, 0, [item(f"{C}/a", b"\x78")], ds=b"\x80\x00"), client=C) == "yjs.varint"
    overlong_count = b"\x28\x01" + vs("memory") + vs(f"{C}/a") + b"\x81\x00\x78"
    assert reason_of(update(C, 0, [overlong_count]), client=C) == "yjs.varint"
    # Largest safe varint value still decodes.
    big = decode_any(b"\x7d" + bytes.fromhex("bfffffffffffff1f"))
    assert big == 2**53 - 1


def test_utf8_and_trailing() -> None:
    assert reason_of(update(C, 0, [item(f"{C}/".encode() + b"\xff", b"\x78")]), client=C) == "yjs.utf8"
    assert reason_of(update(C, 0, [item(f"{C}/a", b"\x77\x02\xc3\x28")]), client=C) == "yjs.utf8"
    assert reason_of(update(C, 0, [item(f"{C}/a", b"\x77\x03\xed\xa0\x80")]), client=C) == "yjs.utf8"  # surrogate
    assert reason_of(update(C, 0, [item(f"{C}/a", b"\x78", root=b"\xff\xfe")]), client=C) == "yjs.utf8"
    good = encode_rows(C, 0, "memory", [(f"{C}/a", "v")])
    assert reason_of(good + b"\x00", client=C) == "yjs.trailing_bytes"
    assert reason_of(b"\x00\x00\x00", client=C) == "yjs.trailing_bytes"


def test_duplicate_key_and_limits() -> None:
    raw = update(C, 0, [item(f"{C}/a", b"\x78"), item(f"{C}/a", b"\x79")])
    u = decode_append_update(raw, root="memory", client=C)
    with pytest.raises(UpdateRejected) as ei:
        check_append(u, next_clock=0, exists=lambda k: False)
    assert ei.value.reason == "yjs.duplicate_key"
    three = encode_rows(C, 0, "memory", [(f"{C}/{i}", i) for i in range(3)])
    assert reason_of(three, client=C, max_rows=2) == "yjs.too_many_rows"
    assert decode_append_update(three, root="memory", client=C, max_rows=3).length == 3
    assert reason_of(b"\x01\x00\x05\x00\x00", client=C) == "yjs.empty"
    assert reason_of(b"", client=C) == "yjs.truncated"
