"""docs/protocol.md sections 3.3.1-3.3.4 and 3.5 checked against the code.

The document must let an independent implementation write entries a node accepts, so what it
says (the worked example's bytes, the layout's fixed values and reason codes, the Any tags, the
caps and their reason codes) is read out of the Markdown here and compared with what the code
does. A change to either side that makes them disagree fails a test.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memmesh.auth.keys import SigningKey
from memmesh.crdt.entry import (
    MAX_ENTRY_BYTES,
    MAX_HEADER_BYTES,
    MAX_PARENTS,
    MAX_PAYLOAD_BYTES,
    MAX_SAFE_INT,
    MAX_STORE_NAME,
    MAX_STORES,
    client_id_for,
    decode_entry,
    sign_entry,
)
from memmesh.crdt.errors import RejectedError, UpdateRejected
from memmesh.crdt.yjs import (
    MAX_DEPTH,
    Row,
    check_append,
    decode_any,
    decode_append_update,
    encode_any,
    encode_gc,
    encode_rows,
)

ROOT = Path(__file__).parent.parent
DOC_PATH = ROOT / "docs" / "protocol.md"
VECTOR = json.loads((Path(__file__).parent / "data" / "entry_vector.json").read_text())

# The worked example of 3.3.3, as the document states it.
CLIENT = 8365587410766085
STORE = "memory"
ROW_KEY = f"{CLIENT}/0"
VALUE = {"key": "deploy", "value": "nix build", "tags": ["ops"]}

ANNOTATED_MARKER = "<!-- memory-row-example: annotated hex"
FULL_HEX_MARKER = "<!-- memory-row-example: full hex -->"
GC_MARKER = "<!-- gc-example: full hex -->"


# ------------------------------------------------------------------------ reading the doc
@pytest.fixture(scope="module")
def doc() -> str:
    return DOC_PATH.read_text()


def _section(doc: str, heading: str) -> str:
    """The text of the section whose heading line starts with ``heading`` (up to the next
    heading of the same or a higher level)."""
    lines = doc.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(heading)]
    assert len(starts) == 1, f"expected exactly one heading {heading!r} in docs/protocol.md"
    level = len(heading) - len(heading.lstrip("#"))
    out = []
    for line in lines[starts[0] + 1:]:
        m = re.match(r"(#+) ", line)
        if m and len(m.group(1)) <= level:
            break
        out.append(line)
    return "\n".join(out)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _fenced_after(doc: str, marker: str) -> str:
    assert doc.count(marker) == 1, f"marker {marker!r} must appear exactly once"
    rest = doc[doc.index(marker) + len(marker):]
    m = re.search(r"```[^\n]*\n(.*?)\n```", rest, re.S)
    assert m is not None, f"no fenced block after {marker!r}"
    return m.group(1)


def _full_hex(doc: str) -> str:
    text = _fenced_after(doc, FULL_HEX_MARKER).strip()
    assert re.fullmatch(r"[0-9a-f]+", text), "the full hex block holds one lowercase hex string"
    return text


def _table(text: str, first_header: str) -> list[dict[str, str]]:
    """The Markdown table whose first header cell is ``first_header``, as dicts."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        cells = _cells(line)
        if cells and cells[0] == first_header:
            header = cells
            rows = []
            for row_line in lines[i + 2:]:
                if not row_line.startswith("|"):
                    break
                row = _cells(row_line)
                assert len(row) == len(header), f"malformed table row {row_line!r}"
                rows.append(dict(zip(header, row)))
            return rows
    raise AssertionError(f"no table with first column {first_header!r}")


def _cells(line: str) -> list[str]:
    if not line.startswith("|"):
        return []
    parts = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [p.strip().replace("\\|", "|") for p in parts]


def _codes(cell: str) -> set[str]:
    return set(re.findall(r"`((?:yjs|entry)\.[a-z_]+)`", cell))


def _reason(fn: Callable[[], Any]) -> str | None:
    try:
        fn()
    except RejectedError as exc:
        return exc.reason
    return None


# ------------------------------------------------------------ an independent writer (3.3.1)
def _varuint(n: int) -> bytes:
    out = bytearray()
    while True:
        if n > 0x7F:
            out.append(0x80 | (n & 0x7F))
            n >>= 7
        else:
            out.append(n)
            return bytes(out)


def _varint(n: int) -> bytes:
    """lib0 signed varint: continue | sign | 6 bits, then 7-bit groups."""
    m = abs(n)
    out = bytearray([(0x80 if m > 0x3F else 0) | (0x40 if n < 0 else 0) | (m & 0x3F)])
    m >>= 6
    while m:
        out.append((0x80 if m > 0x7F else 0) | (m & 0x7F))
        m >>= 7
    return bytes(out)


def _string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return _varuint(len(b)) + b


def _nested(levels: int, leaf: Any = 1) -> Any:
    v = leaf
    for _ in range(levels):
        v = [v]
    return v


def _nested_bytes(levels: int) -> bytes:
    """``levels`` arrays around the integer 1, in bytes (the encoder refuses > MAX_DEPTH)."""
    return b"\x75\x01" * levels + b"\x7d\x01"


def _decode(data: bytes, client: int = CLIENT, root: str = STORE):
    return decode_append_update(data, root=root, client=client)


def _key() -> SigningKey:
    return SigningKey.from_seed(bytes.fromhex(VECTOR["seed"]))


# ----------------------------------------------------------------- 3.3.3 the worked example
def test_example_full_hex_is_what_encode_rows_writes(doc):
    full = _full_hex(doc)
    assert encode_rows(CLIENT, 0, STORE, [(ROW_KEY, VALUE)]).hex() == full


def test_example_decodes_back_to_the_row(doc):
    data = bytes.fromhex(_full_hex(doc))
    u = _decode(data)
    assert (u.client, u.clock, u.length) == (CLIENT, 0, 1)
    assert u.rows == (Row(ROW_KEY, VALUE, 0),)
    assert list(u.rows[0].value) == ["key", "value", "tags"]
    check_append(u, next_clock=0, exists=lambda key: False)


def test_example_row_is_stated_in_the_doc(doc):
    text = _flat(_section(doc, "#### 3.3.3 "))
    assert f"`\"{ROW_KEY}\"` = `{json.dumps(VALUE)}`" in text
    assert f"client id `{CLIENT}`" in text
    assert "(clock 0)" in text and f"store `{STORE}`" in text


def test_example_client_is_the_test_vector_key():
    assert VECTOR["client"] == CLIENT
    assert client_id_for(_key().public.raw) == CLIENT


def test_example_is_the_row_remember_writes():
    from memmesh.node.memory.rows import MEMORY_STORE, memory_value

    row = memory_value("deploy", "nix build", ["ops"])
    assert row == VALUE and list(row) == list(VALUE)
    assert MEMORY_STORE == STORE


def _annotated_lines(doc: str) -> list[tuple[bytes, str]]:
    """(bytes, comment) per line of the annotated block; comment-only lines have no bytes."""
    out = []
    for line in _fenced_after(doc, ANNOTATED_MARKER).splitlines():
        if not line.strip():
            continue
        if line[0] == " ":
            out.append((b"", line.strip()))
            continue
        tokens = line.split(" ")
        n = 0
        while n < len(tokens) and re.fullmatch(r"[0-9a-f]{2}", tokens[n]):
            n += 1
        assert n, f"annotated line without bytes: {line!r}"
        out.append((bytes.fromhex("".join(tokens[:n])), " ".join(tokens[n:]).strip()))
    return out


def test_annotated_hex_adds_up_to_the_full_hex(doc):
    lines = _annotated_lines(doc)
    assert b"".join(b for b, _ in lines).hex() == _full_hex(doc)


def test_annotated_strings_match_their_bytes(doc):
    """Every `length N, "text"` annotation describes exactly the bytes on its line."""
    lines = _annotated_lines(doc)
    checked = 0
    for i, (data, comment) in enumerate(lines):
        if not data and i > 0:  # a comment continuing the previous line's bytes
            data = lines[i - 1][0]
        m = re.search(r'length (\d+), "([^"]*)"', comment)
        if not m:
            continue
        n, text = int(m.group(1)), m.group(2)
        assert n == len(text.encode())
        assert data.endswith(_string(text)), comment
        if comment.startswith("Any string"):
            assert data == b"\x77" + _string(text)
        checked += 1
    assert checked >= 8  # root name, row key, 3 object keys, 3 string values


def test_annotated_fixed_fields(doc):
    lines = [(b, c) for b, c in _annotated_lines(doc) if b]
    by_comment = {c.split(":")[0]: b for b, c in lines}
    assert by_comment["client sections"] == b"\x01"
    assert by_comment["number of structs (rows)"] == b"\x01"
    assert by_comment["first clock"] == b"\x00"
    assert by_comment["item info"] == b"\x28"
    assert by_comment["parent info"] == b"\x01"
    assert by_comment["ContentAny count"] == b"\x01"
    assert by_comment["delete set"] == b"\x00"
    client_line = next(b for b, c in lines if c.startswith(f"client {CLIENT}"))
    assert client_line == _varuint(CLIENT)


def test_client_varuint_groups(doc):
    text = _flat(_section(doc, "#### 3.3.3 "))
    m = re.search(r"least significant first, is ([\d, ]+); with the continue bit on all but the "
                  r"last that gives `([0-9a-f ]+)`", text)
    assert m, "the client id's 7-bit groups are spelled out"
    groups = [int(g) for g in m.group(1).replace(",", " ").split()]
    assert sum(g << (7 * i) for i, g in enumerate(groups)) == CLIENT
    assert bytes.fromhex(m.group(2)) == _varuint(CLIENT) == encode_rows(CLIENT, 0, STORE, [(ROW_KEY, 1)])[2:10]


def test_example_descriptor(doc):
    data = bytes.fromhex(_full_hex(doc))
    text = _flat(_section(doc, "#### 3.3.3 "))
    m = re.search(r'`"memory": \[sha256, (\d+), (\d+), (\d+), (\d+)\]` with sha256 `([0-9a-f]{64})`', text)
    assert m, "the example's descriptor is stated"
    assert int(m.group(1)) == len(data)
    assert int(m.group(2)) == CLIENT
    assert (int(m.group(3)), int(m.group(4))) == (0, 1)
    assert m.group(5) == hashlib.sha256(data).hexdigest()
    assert f"The whole update, {len(data)} bytes (hex)" in text
    assert f'`"{CLIENT}/1"`' in text


def test_a_node_accepts_an_entry_carrying_the_example(doc):
    """End to end: an entry whose memory payload is the doc's bytes is accepted and applied;
    one whose descriptor claims another clock range is refused as 3.3.1 says."""
    from memmesh.crdt.database import Database
    from memmesh.crdt.storage import MemoryStorage

    data = bytes.fromhex(_full_hex(doc))
    key = _key()
    db = Database.create(MemoryStorage(), key, meta={"kind": "bank"})
    _, top = db.feeds()[str(key.public)]
    bad = sign_entry(key, db=db.id, seq=1, prev=top, parents=sorted(db.heads), ts=1,
                     payloads={STORE: (data, 0, 2)})
    result = db.ingest([(bad.header, dict(bad.payloads))])
    assert [r for _, r, _ in result.rejected] == ["entry.payload"]
    assert "`entry.payload`" in _section(doc, "#### 3.3.1 ")
    e = sign_entry(key, db=db.id, seq=1, prev=top, parents=sorted(db.heads), ts=1764460800000,
                   payloads={STORE: (data, 0, 1)})
    result = db.ingest([(e.header, dict(e.payloads))])
    assert result.accepted == [e.id], result.rejected
    assert [(r.key, r.value) for r in db.rows(STORE)] == [(ROW_KEY, VALUE)]


# -------------------------------------------------------------------- 3.3.4 the GC struct
def test_gc_example(doc):
    assert doc.count(GC_MARKER) == 1
    m = re.match(r"\s*`([0-9a-f]+)`", doc[doc.index(GC_MARKER) + len(GC_MARKER):])
    assert m, "the GC example's hex follows its marker"
    data = bytes.fromhex(m.group(1))
    assert encode_gc(CLIENT, 0, 1) == data
    assert data == b"\x01\x01" + _varuint(CLIENT) + _varuint(0) + b"\x00" + _varuint(1) + b"\x00"
    assert _reason(lambda: _decode(data)) == "yjs.struct_kind"
    assert "`yjs.struct_kind`" in _section(doc, "#### 3.3.4 ")


# ------------------------------------------------------------------ 3.3.1 the byte layout
def _layout(doc: str) -> dict[str, dict[str, str]]:
    rows = _table(_section(doc, "#### 3.3.1 "), "field")
    return {r["field"]: r for r in rows if not r["field"].startswith("*")}


def _fixed(layout: dict[str, dict[str, str]], field: str) -> int:
    """The fixed value the layout table gives a field (its first backticked number)."""
    m = re.match(r"`(0x[0-9a-f]+|\d+)`", layout[field]["value in a row insert"])
    assert m, f"no fixed value for {field!r}"
    return int(m.group(1), 0)


class _Writer:
    """Writes updates following the layout table of the doc, field values read from it."""

    def __init__(self, layout: dict[str, dict[str, str]]) -> None:
        self.sections = _fixed(layout, "client sections")
        self.info = _fixed(layout, "info")
        self.parent_info = _fixed(layout, "parent info")
        self.count = _fixed(layout, "ContentAny count")
        self.delete_set = _fixed(layout, "delete set")

    def item(self, *, info=None, parent_info=None, root=STORE, key=ROW_KEY, count=None,
             value: bytes | None = None) -> bytes:
        return (bytes([self.info if info is None else info])
                + _varuint(self.parent_info if parent_info is None else parent_info)
                + _string(root) + _string(key)
                + _varuint(self.count if count is None else count)
                + (encode_any(VALUE) if value is None else value))

    def update(self, items: list[bytes] | None = None, *, sections=None, n=None, client=CLIENT,
               clock=0, delete_set=None, tail=b"") -> bytes:
        items = [self.item()] if items is None else items
        return (_varuint(self.sections if sections is None else sections)
                + _varuint(len(items) if n is None else n) + _varuint(client) + _varuint(clock)
                + b"".join(items)
                + _varuint(self.delete_set if delete_set is None else delete_set) + tail)


def test_writer_following_the_layout_writes_the_example(doc):
    w = _Writer(_layout(doc))
    assert w.update() == bytes.fromhex(_full_hex(doc)) == encode_rows(CLIENT, 0, STORE, [(ROW_KEY, VALUE)])
    rows = [(f"{CLIENT}/{i}", i) for i in range(3)]
    items = [w.item(key=k, value=encode_any(v)) for k, v in rows]
    assert w.update(items, clock=7) == encode_rows(CLIENT, 7, STORE, rows)


def test_layout_rows_cap_matches_the_decoder(doc):
    cell = _layout(doc)["number of structs"]["value in a row insert"]
    m = re.search(r"1\.\.([\d,]+)", cell)
    assert m and int(m.group(1).replace(",", "")) == _default("max_rows")


def _layout_probes(w: _Writer) -> dict[str, list[Callable[[], Any]]]:
    max_rows = _default("max_rows")
    good = _decode(w.update())

    def other_info(info: int):
        return lambda: _decode(w.update([w.item(info=info)]))

    return {
        "client sections": [
            lambda: _decode(w.update(sections=2)),
            lambda: _decode(b"\x00\x00"),
        ],
        "number of structs": [
            lambda: _decode(w.update([], n=0)),
            lambda: _decode(w.update(n=max_rows + 1)),
        ],
        "client": [
            lambda: _decode(w.update([w.item(key=f"{CLIENT + 1}/0")], client=CLIENT + 1)),
            lambda: _decode(w.update(client=MAX_SAFE_INT + 1)),
        ],
        "first clock": [
            lambda: check_append(_decode(w.update(clock=1)), next_clock=0, exists=lambda k: False),
            lambda: check_append(good, next_clock=1, exists=lambda k: False),
            lambda: _decode(w.update(clock=MAX_SAFE_INT)),
        ],
        "info": [other_info(0x00), other_info(0xA8), other_info(0x68), other_info(0x08)],
        "parent info": [lambda: _decode(w.update([w.item(parent_info=0)]))],
        "root name": [lambda: _decode(w.update([w.item(root="config")]))],
        "row key": [
            lambda: _decode(w.update([w.item(key="1/0")])),
            lambda: check_append(_decode(w.update([w.item(), w.item()])), next_clock=0,
                                 exists=lambda k: False),
            lambda: check_append(good, next_clock=0, exists=lambda k: k == ROW_KEY),
        ],
        "ContentAny count": [
            lambda: _decode(w.update([w.item(count=2)])),
            lambda: _decode(w.update([w.item(count=0)])),
        ],
        "value": [
            lambda: _decode(w.update([w.item(value=b"\x7f")])),
            lambda: _decode(w.update([w.item(value=_nested_bytes(MAX_DEPTH + 1))])),
        ],
        "delete set": [lambda: _decode(w.update(delete_set=1))],
        "end of the update": [lambda: _decode(w.update(tail=b"\x00"))],
    }


def test_layout_reason_codes(doc):
    """Each field's "refused as" codes are exactly those its violations produce."""
    layout = _layout(doc)
    w = _Writer(layout)
    probes = _layout_probes(w)
    assert set(layout) == set(probes), "every layout field has probes, every probe a field"
    for field, fns in probes.items():
        reasons = {_reason(fn) for fn in fns}
        assert None not in reasons, f"a violation of {field!r} was accepted"
        assert reasons == _codes(layout[field]["refused as"]), field


def test_layout_general_reason_codes(doc):
    text = _section(doc, "#### 3.3.1 ")
    w = _Writer(_layout(doc))
    full = w.update()
    assert _reason(lambda: _decode(full[:-1])) == "yjs.truncated" and "`yjs.truncated`" in text
    bad_utf8 = w.update([w.item(key=f"{CLIENT}/".encode() + b"\xed\xa0\x80")])
    assert _reason(lambda: _decode(bad_utf8)) == "yjs.utf8" and "`yjs.utf8`" in text
    # The overlong varuint the doc names, as the first clock.
    m = re.search(r"an overlong one \(a last byte `00` after a continued byte, e\.g\. `([0-9a-f ]+)` for 0\)", _flat(text))
    assert m
    overlong = full[:10] + bytes.fromhex(m.group(1)) + full[11:]
    assert _reason(lambda: _decode(overlong)) == "yjs.varint" and "`yjs.varint`" in text
    nine = full[:10] + b"\x80" * 8 + b"\x01" + full[11:]  # a 9-byte varuint
    assert _reason(lambda: _decode(nine)) == "yjs.varint"
    assert "longer than 8 bytes" in _flat(text)


def test_varuint_examples(doc):
    text = _flat(_section(doc, "#### 3.3.1 "))
    pairs = re.findall(r"`(\d+)` is `([0-9a-f ]+)`", text)
    assert len(pairs) >= 4
    for n, hx in pairs:
        n = int(n)
        assert _varuint(n) == bytes.fromhex(hx)
        # The encoder writes the client field as such a varuint.
        assert encode_rows(n, 0, "m", [(f"{n}/0", 1)])[2:2 + len(_varuint(n))] == bytes.fromhex(hx)


def test_info_bits_table(doc):
    rows = _table(_section(doc, "#### 3.3.1 "), "bits")
    layout = _layout(doc)
    info = _fixed(layout, "info")
    w = _Writer(layout)
    assert int(re.search(r"`(0x[0-9a-f]+)` = `0b([01_]+)`", _section(doc, "#### 3.3.1 ")).group(2)
               .replace("_", ""), 2) == info
    for r in rows:
        mask = int(r["mask"].strip("`"), 16)
        want = int(re.match(r"(\d+)", r["in a row insert"]).group(1))
        code = _codes(r["in a row insert"])
        assert len(code) == 1
        if mask == 0x1F:  # the content ref: every other ref is refused
            from memmesh.crdt.yjs import _CONTENT_NAMES

            assert info & mask == want
            assert re.search(rf"`{want}` = Content(\w+)", r["meaning"]).group(1) == _CONTENT_NAMES[want]
            names = {int(a): b for a, b in re.findall(r"(\d+) ([A-Z][A-Za-z]*)", r["in a row insert"])}
            assert names == {k: v for k, v in _CONTENT_NAMES.items() if k != want}
            mutations = [(info & ~mask) | ref for ref in names]
        else:  # a flag bit: flipping it is refused
            assert (info & mask == mask) == bool(want)
            mutations = [info ^ mask]
        for mutated in mutations:
            assert {_reason(lambda mutated=mutated: _decode(w.update([w.item(info=mutated)])))} == code, (r["bits"], mutated)


# --------------------------------------------------------------------- 3.3.2 Any values
ANY_VALUES = {
    126: None, 125: -5, 124: 0.5, 123: 0.1, 122: 2**40, 121: False, 120: True,
    119: "hi", 118: {"a": 1}, 117: [1], 116: b"\x01\x02",
}


def _any_table(doc: str) -> dict[int, dict[str, str]]:
    rows = _table(_section(doc, "#### 3.3.2 "), "tag")
    out = {}
    for r in rows:
        m = re.match(r"(\d+) `([0-9a-f]{2})`$", r["tag"])
        assert m and int(m.group(1)) == int(m.group(2), 16), r["tag"]
        out[int(m.group(1))] = r
    return out


def _example(r: dict[str, str]) -> bytes:
    return bytes.fromhex(re.match(r"`([0-9a-f ]+)`", r["example"]).group(1))


def test_any_tags_accepted_and_refused(doc):
    table = _any_table(doc)
    accepted_in_doc = {t for t, r in table.items() if "refused" not in r["decoded as"]}
    accepted = set()
    for tag in range(256):
        reason = _reason(lambda tag=tag: decode_any(bytes([tag]) + b"\x00" * 8))
        if reason != "yjs.any_tag":
            accepted.add(tag)
    assert accepted == accepted_in_doc
    for t, r in table.items():
        if t not in accepted_in_doc:
            assert _codes(r["decoded as"]) == {"yjs.any_tag"}
            assert _reason(lambda r=r: decode_any(_example(r))) == "yjs.any_tag"
    assert "Every other tag byte is refused (`yjs.any_tag`)" in _section(doc, "#### 3.3.2 ")


def test_any_examples(doc):
    table = _any_table(doc)
    assert set(ANY_VALUES) == {t for t, r in table.items() if "refused" not in r["decoded as"]}
    for tag, value in ANY_VALUES.items():
        r = table[tag]
        example = _example(r)
        assert example[0] == tag
        decoded = decode_any(example)
        assert decoded == value and type(decoded) is type(value), tag
        if r["the encoder writes it for"] == "never":
            assert encode_any(value)[0] != tag, tag
        else:
            assert encode_any(value) == example, tag
    assert table[127]["the encoder writes it for"] == "never"


def test_any_encoder_number_boundaries(doc):
    row = _any_table(doc)[125]["the encoder writes it for"]
    assert "2^31 - 1" in row
    assert encode_any(2**31 - 1)[0] == 125 and encode_any(-(2**31 - 1))[0] == 125
    assert encode_any(2**31)[0] == 124 and encode_any(2**31 + 1)[0] == 123
    assert encode_any(MAX_SAFE_INT)[0] == 123
    with pytest.raises(ValueError):
        encode_any(MAX_SAFE_INT + 1)
    text = _flat(_section(doc, "#### 3.3.2 "))
    m = re.search(r"\(1\.0\) stays a float \(`([0-9a-f ]+)`\) where lib0, seeing the JS number 1, "
                  r"writes `([0-9a-f ]+)`", text)
    assert m
    assert encode_any(1.0) == bytes.fromhex(m.group(1))
    assert decode_any(bytes.fromhex(m.group(2))) == 1


def test_varint_examples(doc):
    text = _flat(_section(doc, "#### 3.3.2 "))
    bullet = text[text.index("**varint**"):text.index("**Numbers.**")]
    pairs = re.findall(r"`(-?\d+)` is `([0-9a-f ]+)`", bullet)
    assert len(pairs) >= 4
    for n, hx in pairs:
        assert encode_any(int(n)) == b"\x7d" + bytes.fromhex(hx)
        assert decode_any(b"\x7d" + bytes.fromhex(hx)) == int(n)
    assert _reason(lambda: decode_any(b"\x7d\x80\x00")) == "yjs.varint"  # overlong
    assert "a last byte `00` after a continued byte" in bullet
    assert _reason(lambda: decode_any(b"\x7d" + b"\x80" * 8 + b"\x01")) == "yjs.varint"  # 9 bytes
    assert "more than 8 bytes" in bullet
    assert decode_any(b"\x7d" + _varint(-MAX_SAFE_INT)) == -MAX_SAFE_INT
    assert _reason(lambda: decode_any(b"\x7d" + _varint(MAX_SAFE_INT + 1))) == "yjs.varint"
    assert "above 2^53 - 1" in bullet


def test_repeated_object_key_keeps_last(doc):
    assert "keeps its last value" in _section(doc, "#### 3.3.2 ")
    assert decode_any(b"\x76\x02" + _string("a") + b"\x7d\x01" + _string("a") + b"\x7d\x02") == {"a": 2}


def test_depth_rule(doc):
    text = _flat(_section(doc, "#### 3.3.2 "))
    m = re.search(r"A row value may nest at most \*\*(\d+)\*\* levels: `\[\[\.\.\.\[1\]\.\.\.\]\]` with "
                  r"(\d+) arrays is accepted, with (\d+) it is refused \(`yjs\.depth`\)", text)
    assert m
    limit, ok, refused = (int(g) for g in m.groups())
    assert limit == ok == refused - 1 == MAX_DEPTH
    assert _default("max_depth") == MAX_DEPTH
    assert re.search(rf"nested at most {MAX_DEPTH} levels deep", _flat(_section(doc, "### 3.3 ")))
    w = _Writer(_layout(doc))
    assert _decode(w.update([w.item(value=_nested_bytes(ok))])).rows[0].value == _nested(ok)
    assert _reason(lambda: _decode(w.update([w.item(value=_nested_bytes(refused))]))) == "yjs.depth"
    # An empty container at the refused level is refused too; scalars are not levels.
    empty = b"\x75\x01" * (refused - 1) + b"\x75\x00"
    assert _reason(lambda: decode_any(empty)) == "yjs.depth"
    assert decode_any(b"\x75\x01" * (ok - 1) + b"\x75\x00") == _nested(ok - 1, [])
    encode_any(_nested(ok))
    with pytest.raises(ValueError):
        encode_any(_nested(refused))
    # A container count larger than the bytes left.
    assert _reason(lambda: decode_any(b"\x75\x05\x7e")) == "yjs.truncated"


# ----------------------------------------------------------------------------- 3.5 caps
def _default(name: str) -> int:
    return inspect.signature(decode_append_update).parameters[name].default


def _parse_cap(cell: str) -> int:
    cell = cell.replace("`", "").strip()
    if m := re.fullmatch(r"2\^(\d+) - 1", cell):
        return 2 ** int(m.group(1)) - 1
    if m := re.fullmatch(r"([\d,]+) (KiB|MiB) \(([\d,]+) bytes\)", cell):
        value = int(m.group(1).replace(",", "")) * {"KiB": 1024, "MiB": 1024 * 1024}[m.group(2)]
        assert value == int(m.group(3).replace(",", "")), f"inconsistent cap {cell!r}"
        return value
    if m := re.fullmatch(r"([\d,]+)(?: characters| levels)?", cell):
        return int(m.group(1).replace(",", ""))
    raise AssertionError(f"cannot read the cap {cell!r}")


def _chars(cell: str) -> set[str]:
    out: set[str] = set()
    for token in cell.strip("`").split():
        if re.fullmatch(r"(.)-(.)", token):
            out |= {chr(c) for c in range(ord(token[0]), ord(token[2]) + 1)}
        else:
            assert len(token) == 1, token
            out.add(token)
    return out


def _ids(n: int) -> list[str]:
    return ["sha256:" + hashlib.sha256(i.to_bytes(4, "big")).hexdigest() for i in range(n)]


def _entry(*, parents: int = 1, stores: list[str] | None = None, seq: int = 1, ts: int = 1,
           clock: int = 0, clock_len: int = 1):
    """sign_entry with one varied field (sign_entry decodes what it built: same checks)."""
    key = _key()
    ids = _ids(parents + 2)  # parents, then prev, then db
    return sign_entry(key, db=ids[-1], seq=seq, prev=ids[-2], parents=ids[:parents], ts=ts,
                      payloads=dict.fromkeys(stores or [STORE], (b"x", clock, clock_len)))


def _at_and_over(build: Callable[[int], Any], cap: int) -> str | None:
    """build(cap) must be accepted; the reason build(cap + 1) is refused with."""
    build(cap)
    return _reason(lambda: build(cap + 1))


def _header_probe(cap: int) -> str | None:
    assert _reason(lambda: decode_entry(b"\x00" * cap)) != "entry.size"
    return _reason(lambda: decode_entry(b"\x00" * (cap + 1)))


def _payload_probe(cap: int) -> str | None:
    e = _entry()
    assert _reason(lambda: decode_entry(e.header, {STORE: b"\x00" * cap})) == "entry.payload"
    return _reason(lambda: decode_entry(e.header, {STORE: b"\x00" * (cap + 1)}))


def _entry_probe(cap: int) -> str | None:
    e = _entry(stores=["a", "b"])
    first = MAX_PAYLOAD_BYTES
    second = cap - len(e.header) - first
    assert 0 < second <= MAX_PAYLOAD_BYTES
    at = {"a": b"\x00" * first, "b": b"\x00" * second}
    assert _reason(lambda: decode_entry(e.header, at)) == "entry.payload"
    over = {"a": b"\x00" * first, "b": b"\x00" * (second + 1)}
    return _reason(lambda: decode_entry(e.header, over))


def _store_chars_probe(chars: set[str]) -> str | None:
    from memmesh.crdt.database import STORE_NAME_CHARS, Database, valid_store_name
    from memmesh.crdt.storage import MemoryStorage

    assert chars == STORE_NAME_CHARS
    assert all(valid_store_name(c) for c in chars)
    assert not any(valid_store_name("m" + c) for c in "AZ !@#$%&*+=?[]{}|~\\\"'é\x00")
    key = _key()
    db = Database.create(MemoryStorage(), key, meta={"kind": "bank"})
    _, top = db.feeds()[str(key.public)]
    c = client_id_for(key.public.raw)
    store = "Memory"
    e = sign_entry(key, db=db.id, seq=1, prev=top, parents=sorted(db.heads), ts=1,
                   payloads={store: (encode_rows(c, 0, store, [(f"{c}/0", 1)]), 0, 1)})
    result = db.ingest([(e.header, dict(e.payloads))])
    assert not result.accepted
    (reason,) = {r for _, r, _ in result.rejected}
    return reason


def _rows_probe(cap: int) -> str | None:
    assert _default("max_rows") == cap
    return _at_and_over(
        lambda n: _decode(encode_rows(CLIENT, 0, STORE, [(f"{CLIENT}/{i}", i) for i in range(n)])), cap)


def _depth_probe(cap: int) -> str | None:
    assert MAX_DEPTH == cap == _default("max_depth")
    w = _default_writer()
    return _at_and_over(lambda n: _decode(w.update([w.item(value=_nested_bytes(n))])), cap)


@functools.cache
def _default_writer() -> _Writer:
    return _Writer(_layout(DOC_PATH.read_text()))


def _varuint_probe(cap: int) -> str | None:
    assert cap == MAX_SAFE_INT
    w = _default_writer()
    # first clock + rows at the cap is fine, one more is not
    reason = _at_and_over(lambda end: _decode(w.update(clock=end - 1)), cap)
    # the client id field itself
    assert _decode(w.update([w.item(key=f"{cap}/0")], client=cap), client=cap).client == cap
    assert _reason(lambda: _decode(w.update(client=cap + 1))) == reason
    # the magnitude of a tag-125 varint
    assert decode_any(b"\x7d" + _varint(cap)) == cap
    assert _reason(lambda: decode_any(b"\x7d" + _varint(cap + 1))) == reason
    return reason


def _ts_probe(cap: int) -> str | None:
    return _at_and_over(lambda ts: _entry(ts=ts), cap)


def _seq_probe(cap: int) -> str | None:
    assert cap == MAX_SAFE_INT
    return _at_and_over(lambda seq: _entry(seq=seq), cap)


def _clock_probe(cap: int) -> str | None:
    assert cap == MAX_SAFE_INT
    _entry(clock=0, clock_len=cap)
    return _at_and_over(lambda end: _entry(clock=end - 1, clock_len=1), cap)


CAPS: dict[str, tuple[Any, Callable[[Any], str | None]]] = {
    # what (first column) -> (the constant in the code, probe(cap) -> reason beyond the cap)
    "signed header": (MAX_HEADER_BYTES, _header_probe),
    "one payload": (MAX_PAYLOAD_BYTES, _payload_probe),
    "a whole entry (header + payloads)": (MAX_ENTRY_BYTES, _entry_probe),
    "parents": (MAX_PARENTS, lambda cap: _at_and_over(lambda n: _entry(parents=n), cap)),
    "stores per entry": (MAX_STORES, lambda cap: _at_and_over(
        lambda n: _entry(stores=[f"s{i:02d}" for i in range(n)]), cap)),
    "store name length": (MAX_STORE_NAME, lambda cap: _at_and_over(lambda n: _entry(stores=["a" * n]), cap)),
    "store name characters": (None, _store_chars_probe),
    "rows (structs) per update": (_default("max_rows"), _rows_probe),
    "nesting depth of a row value": (MAX_DEPTH, _depth_probe),
    "`ts`": (2**63 - 1, _ts_probe),
    "`seq`": (MAX_SAFE_INT, _seq_probe),
    "descriptor `clock + clock_len`": (MAX_SAFE_INT, _clock_probe),
    "varuints in an update, and first clock + rows": (MAX_SAFE_INT, _varuint_probe),
}


def _caps_table(doc: str) -> dict[str, dict[str, str]]:
    return {r["what"]: r for r in _table(_section(doc, "### 3.5 "), "what")}


def test_caps_table_lists_exactly_the_checked_caps(doc):
    assert set(_caps_table(doc)) == set(CAPS)


@pytest.mark.parametrize("what", list(CAPS))
def test_cap(doc, what):
    row = _caps_table(doc)[what]
    constant, probe = CAPS[what]
    codes = _codes(row["refused as"])
    assert len(codes) == 1, f"one reason code per cap, got {row['refused as']!r}"
    if constant is None:
        value = _chars(row["cap"])
    else:
        value = _parse_cap(row["cap"])
        assert value == constant, f"{what}: doc says {value}, code has {constant}"
    assert probe(value) == codes.pop(), what


def test_caps_lower_bounds(doc):
    text = _flat(_section(doc, "### 3.5 "))
    assert "at least 1 store per entry, a store name of at least 1 character, and `clock_len` of at least 1 (all `entry.format`)" in text
    assert _reason(lambda: _entry(stores=[""])) == "entry.format"
    assert _reason(lambda: _entry(clock_len=0)) == "entry.format"
    key = _key()
    ids = _ids(2)
    assert _reason(lambda: sign_entry(key, db=ids[1], seq=1, prev=ids[0], parents=ids[:1], ts=1,
                                      payloads={})) == "entry.format"
    assert "every update inserts at least 1 row (`yjs.empty`)" in text
    with pytest.raises(UpdateRejected) as err:
        _decode(b"\x01\x00" + _varuint(CLIENT) + b"\x00\x00")
    assert err.value.reason == "yjs.empty"


def test_integer_fields_need_an_integer_tag(doc):
    """3.3.2 "Numbers": 125 and 122 decode as integers, 124 and 123 as floats, and a settings
    grant's priority must be an integer."""
    from memmesh.auth.ops import parse_op

    text = _flat(_section(doc, "#### 3.3.2 "))
    assert "tags 125 and 122 decode as integers and 124 and 123 as floats" in text
    assert "a settings grant's `priority`" in text
    ints = [decode_any(b"\x7d\x00"), decode_any(b"\x7a" + bytes(8))]
    floats = [decode_any(b"\x7c" + bytes(4)), decode_any(b"\x7b" + bytes(8))]
    assert all(type(v) is int and v == 0 for v in ints)
    assert all(type(v) is float and v == 0 for v in floats)
    grant = {"op": "grant", "key": VECTOR["public_key"], "perm": "admin"}
    assert parse_op({**grant, "priority": ints[0]}).priority == 0
    assert _reason(lambda: parse_op({**grant, "priority": floats[0]})) == "auth.bad_op"
