"""Strict Yjs v1 update codec for memmesh's append-only stores.

Every store is one pycrdt Doc whose single root is a Map named like the store. The only update
such a store accepts inserts NEW rows of its author (docs/security.md, "No untrusted byte
reaches pycrdt"). This module parses untrusted update bytes itself, against exactly that shape,
so that pycrdt only ever sees updates that were already proven harmless:

    update   = varuint 1 (client sections)
               varuint numStructs, varuint client, varuint clock, numStructs x item
               varuint 0 (delete set: no clients)
    item     = 0x28 (parentSub flag | ContentAny), no origin, no right origin,
               varuint 1 + string root (parent is the store's root, by name),
               string key (parentSub, must start with f"{client}/"),
               varuint 1 + one Any value (at most ``max_depth`` nested arrays/objects)

Varuints are lib0's (7 bits per byte, little-endian groups, high bit = more); overlong forms
and values above 2**53-1 (JS Number.MAX_SAFE_INTEGER) are refused. Strings are a varuint byte
length + strict UTF-8. Anything else, whatever its bytes, raises ``UpdateRejected`` with one of
the stable reason codes below; no other exception escapes ``decode_append_update``.

Reason codes: yjs.truncated, yjs.trailing_bytes, yjs.varint, yjs.utf8, yjs.clients,
yjs.struct_kind, yjs.origin, yjs.parent, yjs.no_key, yjs.key_prefix, yjs.any_count,
yjs.any_tag, yjs.depth, yjs.delete_set, yjs.too_many_rows, yjs.empty (decode_append_update);
yjs.clock_gap, yjs.clock_reuse, yjs.overwrite, yjs.duplicate_key (check_append).

Any values, decode (lib0 tag -> Python):
    126 null -> None; 121/120 false/true -> bool; 125 varint -> int; 122 bigint (int64 BE)
    -> int; 124 float32 BE / 123 float64 BE -> float; 119 string -> str; 118 object -> dict
    (str keys; a repeated key keeps its last value, as yjs and pycrdt do); 117 array -> list;
    116 Uint8Array -> bytes. 127 undefined and unknown tags are refused (yjs.any_tag).
Any values, encode (Python -> tag; lib0 writeAny's choices, byte for byte, except that an
integral float stays a float where lib0 would write a varint):
    None -> 126; bool -> 120/121 (checked before int); int with |n| <= 2**31-1 -> 125;
    other int with |n| <= 2**53-1 -> 124 if exact as float32 else 123 (so it decodes as a
    float: numbers are JS Numbers, and pycrdt itself returns every number as float);
    float -> 124 if exact as float32 else 123; str -> 119; dict with str keys -> 118;
    list/tuple -> 117; bytes/bytearray/memoryview -> 116.
    Encode errors (the caller's bug, not untrusted input): ValueError for an int outside the
    JS safe range, nesting deeper than MAX_DEPTH (also catches cycles) and bad row lists;
    TypeError for any other Python type (numpy scalars other than float64 included) or a
    non-str dict key.
"""
from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from memmesh.crdt.errors import UpdateRejected
from memmesh.crdt.frozen import builder

__all__ = [
    "MAX_DEPTH",
    "Row",
    "DecodedUpdate",
    "decode_append_update",
    "check_append",
    "encode_rows",
    "encode_gc",
    "encode_any",
    "decode_any",
]

MAX_DEPTH = 32
# Hard ceiling on the caller-chosen depth: the Any decoder recurses once per nesting level,
# so this keeps it far below Python's recursion limit.
_DEPTH_CEILING = 256
_SAFE = (1 << 53) - 1  # JS Number.MAX_SAFE_INTEGER
_INT31 = (1 << 31) - 1  # lib0 writes integers up to this as a varint (tag 125)
_ITEM_INFO = 0x28  # BIT6 parentSub | content ref 8 (ContentAny); no origin bits

_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")
_I64 = struct.Struct(">q")

_CONTENT_NAMES = {
    0: "GC", 1: "Deleted", 2: "JSON", 3: "Binary", 4: "String", 5: "Embed",
    6: "Format", 7: "Type", 8: "Any", 9: "Doc", 10: "Skip",
}


@dataclass(frozen=True, slots=True)
class Row:
    key: str
    value: Any
    clock: int


@dataclass(frozen=True, slots=True)
class DecodedUpdate:
    client: int
    clock: int  # first clock
    length: int  # clock units covered (one per row)
    rows: tuple[Row, ...]


# Built without their dataclass __init__: one of each per row received (crdt/frozen.py).
_row = builder(Row)
_decoded = builder(DecodedUpdate)


def _reject(reason: str, detail: str) -> NoReturn:
    raise UpdateRejected(reason, detail)


# ---------------------------------------------------------------------------------------------
# Decoding. Hot path: single-byte varuints are read inline; _uint is the multi-byte slow path.
# Running off the end raises IndexError (data[pos]) or is checked explicitly before slicing
# (slices never raise); decode_append_update maps IndexError/UnicodeDecodeError to reasons.


def _uint(data: bytes, pos: int) -> tuple[int, int]:
    """Read a lib0 varuint at pos; return (value, new pos)."""
    value = 0
    shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            if b == 0 and shift:
                _reject("yjs.varint", "overlong varuint (a trailing zero group)")
            if value > _SAFE:
                _reject("yjs.varint", "varuint above 2**53-1")
            return value, pos
        shift += 7
        if shift > 49:  # an 8th byte with the continue bit: more than 56 bits
            _reject("yjs.varint", "varuint longer than 8 bytes")


def _int(data: bytes, pos: int) -> tuple[int, int]:
    """Read a lib0 signed varint (first byte: 0x80 continue, 0x40 sign, 6 data bits)."""
    b = data[pos]
    pos += 1
    value = b & 0x3F
    negative = b & 0x40
    shift = 6
    while b & 0x80:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b == 0:
            _reject("yjs.varint", "overlong varint (a trailing zero group)")
        shift += 7
        if shift >= 55 and b & 0x80:
            _reject("yjs.varint", "varint longer than 8 bytes")
    if value > _SAFE:
        _reject("yjs.varint", "varint outside the JS safe integer range")
    return (-value if negative else value), pos


def _span(data: bytes, pos: int, what: str) -> tuple[int, int]:
    """A varuint length at ``pos`` and the (start, end) of the bytes it counts."""
    b = data[pos]
    if b < 0x80:  # the common short case without a call
        end = pos + 1 + b
        pos += 1
    else:
        ln, pos = _uint(data, pos)
        end = pos + ln
    if end > len(data):
        _reject("yjs.truncated", f"{what} runs past the end of the update")
    return pos, end


def _str(data: bytes, pos: int) -> tuple[str, int]:
    start, end = _span(data, pos, "string")
    return data[start:end].decode(), end


def _any(data: bytes, pos: int, depth: int) -> tuple[Any, int]:
    """Read one lib0 Any at pos. depth = container levels still allowed below this point."""
    tag = data[pos]
    pos += 1
    if tag == 119:
        b = data[pos]
        if b < 0x80:  # a short string, inline: the most common value by far
            end = pos + 1 + b
            if end > len(data):
                _reject("yjs.truncated", "string runs past the end of the update")
            return data[pos + 1:end].decode(), end
        b2 = data[pos + 1]
        if 0 < b2 < 0x80:  # 128 bytes to 16 KiB (b2 == 0 is overlong: _str refuses it)
            end = pos + 2 + ((b & 0x7F) | (b2 << 7))
            if end > len(data):
                _reject("yjs.truncated", "string runs past the end of the update")
            return data[pos + 2:end].decode(), end
        return _str(data, pos)
    if tag == 125:
        b = data[pos]
        if b < 0x40:  # one byte, positive, no continuation
            return b, pos + 1
        return _int(data, pos)
    if tag == 118 or tag == 117:
        # Checked before descending: the corpus holds a 20,000-deep bomb.
        if depth <= 0:
            _reject("yjs.depth", "value nested deeper than the allowed depth")
        b = data[pos]
        if b < 0x80:
            n = b
            pos += 1
        else:
            n, pos = _uint(data, pos)
        # Every element takes at least one byte: refuse absurd counts up front.
        if n > len(data) - pos:
            _reject("yjs.truncated", "container count runs past the end of the update")
        depth -= 1
        size = len(data)
        # Short strings, the most common elements, are read inline (as _any reads them).
        if tag == 117:
            arr: list[Any] = []
            append = arr.append
            for _ in range(n):
                if data[pos] == 119 and data[pos + 1] < 0x80:
                    end = pos + 2 + data[pos + 1]
                    if end > size:
                        _reject("yjs.truncated", "string runs past the end of the update")
                    append(data[pos + 2:end].decode())
                    pos = end
                    continue
                v, pos = _any(data, pos, depth)
                append(v)
            return arr, pos
        obj = {}
        for _ in range(n):
            b = data[pos]
            if b < 0x80:  # short key, inline
                end = pos + 1 + b
                if end > size:
                    _reject("yjs.truncated", "string runs past the end of the update")
                k = data[pos + 1:end].decode()
                pos = end
            else:
                k, pos = _str(data, pos)
            if data[pos] == 119 and data[pos + 1] < 0x80:
                end = pos + 2 + data[pos + 1]
                if end > size:
                    _reject("yjs.truncated", "string runs past the end of the update")
                obj[k] = data[pos + 2:end].decode()
                pos = end
                continue
            obj[k], pos = _any(data, pos, depth)
        return obj, pos
    if tag == 120:
        return True, pos
    if tag == 121:
        return False, pos
    if tag == 126:
        return None, pos
    if tag == 123:
        if pos + 8 > len(data):
            _reject("yjs.truncated", "float64 runs past the end of the update")
        return _F64.unpack_from(data, pos)[0], pos + 8
    if tag == 124:
        if pos + 4 > len(data):
            _reject("yjs.truncated", "float32 runs past the end of the update")
        return _F32.unpack_from(data, pos)[0], pos + 4
    if tag == 116:
        start, end = _span(data, pos, "Uint8Array")
        return data[start:end], end
    if tag == 122:
        if pos + 8 > len(data):
            _reject("yjs.truncated", "bigint runs past the end of the update")
        return _I64.unpack_from(data, pos)[0], pos + 8
    if tag == 127:
        _reject("yjs.any_tag", "Any value 'undefined' (tag 127) is not storable")
    _reject("yjs.any_tag", f"unknown Any tag {tag}")


def _info_reason(info: int) -> NoReturn:
    ref = info & 0x1F
    if ref != 8:
        name = _CONTENT_NAMES.get(ref, f"unknown ref {ref}")
        _reject("yjs.struct_kind", f"struct of kind {name}; only single Any values are rows")
    if info & 0xC0:
        _reject("yjs.origin", "item has an origin or right origin: not a fresh row insert")
    _reject("yjs.no_key", "item without a map key (parentSub): not a row insert")


@functools.lru_cache(maxsize=256)
def _item_head(root: str) -> bytes:
    """Bytes every accepted item starts with: info 0x28, parentInfo 1, root name string."""
    out = bytearray((_ITEM_INFO, 1))
    _w_str(out, root)
    return bytes(out)


@functools.lru_cache(maxsize=4096)
def _client_text(client: int) -> tuple[bytes, str]:
    """The varuint a well-formed update writes its client id as, and its row keys' prefix."""
    out = bytearray()
    _w_uint(out, client)
    return bytes(out), f"{client}/"


def _head_reason(data: bytes, pos: int, root: str) -> NoReturn:
    """Explain why the item at pos does not start with the expected head (always raises)."""
    info = data[pos]
    if info != _ITEM_INFO:
        _info_reason(info)
    parent_info, pos = _uint(data, pos + 1)  # an overlong 1 is a varint error
    if parent_info != 1:
        _reject("yjs.parent", "item parent is an item ID, not the store root")
    name, pos = _str(data, pos)
    if name != root:
        _reject("yjs.parent", f"item belongs to root {name!r}, not the store's {root!r}")
    raise AssertionError("unreachable: head matched")  # pragma: no cover


def _decode(data: bytes, root: str, client: int, max_depth: int, max_rows: int) -> DecodedUpdate:
    n = len(data)
    if data[:2] == b"\x01\x01":  # one client section, one row: the common update
        num_structs, pos = 1, 2
    else:
        num_clients, pos = _uint(data, 0)
        if num_clients != 1:
            if num_clients == 0:
                ds, pos = _uint(data, pos)
                if ds:
                    _reject("yjs.delete_set", "update deletes items; append-only stores never delete")
                if pos != n:
                    _reject("yjs.trailing_bytes", "bytes after the end of the update")
                _reject("yjs.empty", "update inserts no rows")
            _reject("yjs.clients", f"update has {num_clients} client sections, expected 1")
        num_structs, pos = _uint(data, pos)
    if num_structs == 0:
        _reject("yjs.empty", "update inserts no rows")
    if num_structs > max_rows:
        _reject("yjs.too_many_rows", f"{num_structs} rows in one update (limit {max_rows})")
    own, prefix = _client_text(client) if 0 <= client <= _SAFE else (None, f"{client}/")
    if own is not None and data[pos:pos + len(own)] == own:  # the author's id, as its one varuint spelling
        pos += len(own)
    else:
        author, pos = _uint(data, pos)
        if author != client:
            _reject("yjs.clients", f"update written as client {author}, author is client {client}")
    b = data[pos]
    if b < 0x80:
        clock = b
        pos += 1
    elif 0 < data[pos + 1] < 0x80:  # two bytes (b2 == 0 is overlong: _uint refuses it)
        clock = (b & 0x7F) | (data[pos + 1] << 7)
        pos += 2
    else:
        clock, pos = _uint(data, pos)
    if clock + num_structs > _SAFE:
        _reject("yjs.varint", "clock range above 2**53-1")
    head = _item_head(root)
    hlen = len(head)
    rows = []
    for i in range(num_structs):
        # One slice compare covers info byte, parentInfo and root name of a well-formed row.
        end = pos + hlen
        if data[pos:end] != head:
            _head_reason(data, pos, root)
        b = data[end]
        if b < 0x80:  # a short key, inline
            pos = end + 1 + b
            if pos > n:
                _reject("yjs.truncated", "string runs past the end of the update")
            key = data[end + 1:pos].decode()
        else:
            key, pos = _str(data, end)
        if not key.startswith(prefix):
            _reject("yjs.key_prefix", f"row key {key!r} does not start with {prefix!r}")
        if data[pos] != 1:
            cnt, _ = _uint(data, pos)
            _reject("yjs.any_count", f"ContentAny holds {cnt} values, expected exactly 1")
        value, pos = _any(data, pos + 1, max_depth)
        rows.append(_row(key, value, clock + i))
    if data[pos] != 0:
        _uint(data, pos)  # an overlong 0 is a varint error
        _reject("yjs.delete_set", "update deletes items; append-only stores never delete")
    if pos + 1 != n:
        _reject("yjs.trailing_bytes", "bytes after the end of the update")
    return _decoded(client, clock, num_structs, tuple(rows))


def decode_append_update(
    data: bytes,
    *,
    root: str,
    client: int,
    max_depth: int = MAX_DEPTH,
    max_rows: int = 10_000,
) -> DecodedUpdate:
    """Strictly parse a Yjs v1 update that must only insert new rows of ``client``.

    Raises UpdateRejected (``.reason`` a stable code, see the module docstring) for any byte
    string that is not such an update; never any other exception for any ``data``. Row order
    and clocks are those of the update. Clock continuity and key freshness against the store
    are check_append's job. ValueError only for a bad ``max_depth`` argument.
    """
    if not 0 <= max_depth <= _DEPTH_CEILING:
        raise ValueError(f"max_depth must be within 0..{_DEPTH_CEILING}")
    if type(data) is not bytes:
        data = bytes(data)
    try:
        return _decode(data, root, client, max_depth, max_rows)
    except IndexError:
        raise UpdateRejected("yjs.truncated", "update ends in the middle of a field") from None
    except UnicodeDecodeError:
        raise UpdateRejected("yjs.utf8", "string is not valid UTF-8") from None


def decode_any(data: bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """Decode exactly one lib0 Any value filling ``data``; UpdateRejected on anything else."""
    if not 0 <= max_depth <= _DEPTH_CEILING:
        raise ValueError(f"max_depth must be within 0..{_DEPTH_CEILING}")
    data = bytes(data)
    try:
        value, pos = _any(data, 0, max_depth)
    except IndexError:
        raise UpdateRejected("yjs.truncated", "value ends in the middle of a field") from None
    except UnicodeDecodeError:
        raise UpdateRejected("yjs.utf8", "string is not valid UTF-8") from None
    if pos != len(data):
        _reject("yjs.trailing_bytes", "bytes after the end of the value")
    return value


def check_append(update: DecodedUpdate, *, next_clock: int, exists: Callable[[str], bool]) -> None:
    """Check a decoded update against the store: clocks continue the author's, keys are new."""
    if not update.rows:
        _reject("yjs.empty", "update inserts no rows")
    if update.clock > next_clock:
        _reject("yjs.clock_gap", f"update starts at clock {update.clock}, expected {next_clock}")
    if update.clock < next_clock:
        _reject("yjs.clock_reuse", f"update starts at clock {update.clock}, expected {next_clock}")
    seen: set[str] = set()
    for row in update.rows:
        if row.key in seen:
            _reject("yjs.duplicate_key", f"row key {row.key!r} inserted twice in one update")
        seen.add(row.key)
        if exists(row.key):
            _reject("yjs.overwrite", f"row key {row.key!r} already exists; rows are append-only")


# ---------------------------------------------------------------------------------------------
# Encoding (our own, trusted values).


def _w_uint(out: bytearray, v: int) -> None:
    while v > 0x7F:
        out.append(0x80 | (v & 0x7F))
        v >>= 7
    out.append(v)


def _w_str(out: bytearray, s: str) -> None:
    b = s.encode()  # UnicodeEncodeError (a ValueError) for lone surrogates
    _w_uint(out, len(b))
    out += b


def _w_float(out: bytearray, x: float) -> None:
    # lib0 writes float32 when the value survives the round trip (never for NaN).
    try:
        f32 = _F32.pack(x)
    except OverflowError:
        f32 = b""
    if f32 and _F32.unpack(f32)[0] == x:
        out.append(124)
        out += f32
    else:
        out.append(123)
        out += _F64.pack(x)


def _w_any(out: bytearray, v: Any, depth: int) -> None:
    if v is None:
        out.append(126)
    elif v is True:
        out.append(120)
    elif v is False:
        out.append(121)
    elif isinstance(v, int):
        if -_INT31 <= v <= _INT31:
            # lib0 writeVarInt: first byte 0x80 continue | 0x40 sign | 6 bits.
            out.append(125)
            neg = v < 0
            if neg:
                v = -v
            out.append((0x80 if v > 0x3F else 0) | (0x40 if neg else 0) | (v & 0x3F))
            v >>= 6
            while v:
                out.append((0x80 if v > 0x7F else 0) | (v & 0x7F))
                v >>= 7
        elif -_SAFE <= v <= _SAFE:
            _w_float(out, float(v))
        else:
            raise ValueError(f"integer {v} is outside the JS safe range (|n| <= 2**53-1)")
    elif isinstance(v, float):
        _w_float(out, v)
    elif isinstance(v, str):
        out.append(119)
        _w_str(out, v)
    elif isinstance(v, (dict, list, tuple)):
        if depth <= 0:
            raise ValueError("value nested deeper than the allowed depth (or cyclic)")
        if isinstance(v, dict):
            out.append(118)
            _w_uint(out, len(v))
            for k, item in v.items():
                if not isinstance(k, str):
                    raise TypeError(f"object keys must be str, not {type(k).__name__}")
                _w_str(out, k)
                _w_any(out, item, depth - 1)
        else:
            out.append(117)
            _w_uint(out, len(v))
            for item in v:
                _w_any(out, item, depth - 1)
    elif isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        out.append(116)
        _w_uint(out, len(b))
        out += b
    else:
        raise TypeError(f"cannot store a {type(v).__name__} as a Yjs Any value")


def encode_any(value: Any, *, max_depth: int = MAX_DEPTH) -> bytes:
    """lib0 writeAny encoding of one value (see the module docstring for the mapping)."""
    out = bytearray()
    _w_any(out, value, max_depth)
    return bytes(out)


def _check_uint(name: str, v: int) -> None:
    if type(v) is not int or not 0 <= v <= _SAFE:
        raise ValueError(f"{name} must be an int within 0..2**53-1, got {v!r}")


def encode_rows(client: int, clock: int, root: str, rows: Sequence[tuple[str, Any]]) -> bytes:
    """The Yjs v1 update inserting ``rows`` (new keys) into root map ``root`` as ``client``.

    Same bytes as yjs/yrs produce for ``map.set`` of new keys in one transaction, starting at
    ``clock``: one ContentAny item per row, clocks clock..clock+len(rows)-1, empty delete set.
    Raises ValueError for no rows, a key without the f"{client}/" prefix, a repeated key, or
    a bad value (TypeError for an unsupported type).
    """
    _check_uint("client", client)
    _check_uint("clock", clock)
    if not rows:
        raise ValueError("encode_rows needs at least one row")
    if clock + len(rows) > _SAFE:
        raise ValueError("clock range above 2**53-1")
    prefix = f"{client}/"
    out = bytearray(b"\x01")
    _w_uint(out, len(rows))
    _w_uint(out, client)
    _w_uint(out, clock)
    head = bytearray((_ITEM_INFO, 1))
    _w_str(head, root)
    seen: set[str] = set()
    for key, value in rows:
        if not isinstance(key, str) or not key.startswith(prefix):
            raise ValueError(f"row key {key!r} must be a str starting with {prefix!r}")
        if key in seen:
            raise ValueError(f"row key {key!r} given twice")
        seen.add(key)
        out += head
        _w_str(out, key)
        out.append(1)
        _w_any(out, value, MAX_DEPTH)
    out.append(0)  # empty delete set
    return bytes(out)


def encode_gc(client: int, clock: int, length: int) -> bytes:
    """A Yjs v1 update holding one GC struct covering [clock, clock+length) of ``client``.

    Fills the clock range of an erased or voided entry, so the author's later entries still
    integrate in pycrdt (which waits for missing clocks otherwise). Trusted use only: the
    decoder refuses GC structs in received updates.
    """
    _check_uint("client", client)
    _check_uint("clock", clock)
    _check_uint("length", length)
    if length == 0 or clock + length > _SAFE:
        raise ValueError("GC length must be >= 1 and end within 2**53-1")
    out = bytearray(b"\x01\x01")
    _w_uint(out, client)
    _w_uint(out, clock)
    out.append(0)  # info: GC
    _w_uint(out, length)
    out.append(0)  # empty delete set
    return bytes(out)
