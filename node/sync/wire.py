"""Strict msgpack bodies: a body walked against the shape its message type can take (no
container built beyond what that type holds), and the checks of each field's type and range.
Every failure is a MessageError with a reason code, never another exception."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from memmesh.auth.keys import public_key_str
from memmesh.crdt.entry import MAX_ENTRY_BYTES, raw_to_id
from memmesh.crdt.errors import RejectedError
from memmesh.node.sync.limits import (
    MAX_AUTHORS,
    MAX_BODY_BYTES,
    MAX_ENTRIES_PER_MESSAGE,
    MAX_TEXT,
    U53,
)


class MessageError(RejectedError):
    """A sync body that is not a well-formed message of its kind."""


def bad(detail: str) -> MessageError:
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


def _unpacker(body: bytes | bytearray) -> msgpack.Unpacker:
    up = msgpack.Unpacker(None, raw=False, strict_map_key=True, use_list=True, max_buffer_size=max(1, len(body)),
                          max_bin_len=MAX_ENTRY_BYTES, max_str_len=MAX_TEXT * 4, max_array_len=MAX_ENTRIES_PER_MESSAGE,
                          max_map_len=MAX_AUTHORS, max_ext_len=0)
    up.feed(body)
    return up


def _walk(up: msgpack.Unpacker, body: bytes | bytearray, shape: Any, what: str) -> Any:
    pos = up.tell()
    if pos >= len(body):
        raise bad("body is not msgpack: it ends inside a value")
    tag = body[pos]
    if tag in _ARRAYS:
        if isinstance(shape, Arr):
            n = up.read_array_header()
            if n > shape.limit:
                raise bad(f"{what} must be a list of at most {shape.limit} items")
            inner = f"{what}[]"
            if shape.item is None:
                return [_scalar(up, body, inner) for _ in range(n)]
            return [_walk(up, body, shape.item, inner) for _ in range(n)]
        if isinstance(shape, Tup):
            n = up.read_array_header()
            if n > len(shape.items):
                raise bad(f"{what} must be a list of {len(shape.items)} items")
            return [_walk(up, body, shape.items[i], f"{what}[{i}]") for i in range(n)]
        raise bad(f"{what} must not be a list")
    if tag in _MAPS:
        if isinstance(shape, MapOf):
            n = up.read_map_header()
            if n > shape.limit:
                raise bad(f"{what} must be a map of at most {shape.limit} entries")
            out: dict = {}
            value, inner = shape.value, f"{what}{{}}"
            for _ in range(n):
                key = _scalar(up, body, "a map key")
                if type(key) not in (str, bytes):
                    raise bad(f"the keys of {what} are strings or bytes")
                out[key] = _scalar(up, body, inner) if value is None else _walk(up, body, value, inner)
            return out
        if isinstance(shape, Fields):
            n = up.read_map_header()
            if n > len(shape.shapes):
                raise bad(f"{what} has at most the fields {sorted(shape.shapes)}")
            out = {}
            for _ in range(n):
                name = _scalar(up, body, "a field name")
                if name not in shape.shapes:
                    raise bad(f"unknown field {str(name)[:40]!r}")
                if name in out:  # one reading per field: the db checked first is the db served
                    raise bad(f"field {name!r} is given twice")
                out[name] = _walk(up, body, shape.shapes[name], name)
            return out
        raise bad(f"{what} must not be a map")
    return up.unpack()  # a scalar: bounded by max_str_len / max_bin_len, ext refused


def _scalar(up: msgpack.Unpacker, body: bytes | bytearray, what: str) -> Any:
    pos = up.tell()
    if pos >= len(body):
        raise bad("body is not msgpack: it ends inside a value")
    if body[pos] in _CONTAINERS:
        raise bad(f"{what} must not be a list or a map")
    return up.unpack()


def unpack(body: bytes | bytearray, shape: Any = FLAT) -> dict[str, Any]:
    """The body's map, built only as far as ``shape`` (what its message type can hold) allows.
    Errors name the field as a path: ``entries[][1]{}`` is a payload of an entry."""
    if not isinstance(body, (bytes, bytearray)):
        raise bad("a body is bytes")
    if len(body) > MAX_BODY_BYTES:
        raise MessageError("sync.too_large", f"body of {len(body)} bytes exceeds {MAX_BODY_BYTES}")
    if not body or body[0] not in _MAPS:
        raise bad("a body is a map")
    try:
        up = _unpacker(body)
        obj = _walk(up, body, shape, "the body")
        extra = up.tell() != len(body)
    except MessageError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise bad(f"body is not msgpack: {exc.__class__.__name__}") from None
    if extra:
        raise bad("body is not msgpack: ExtraData")
    return obj


def peek_db(body: bytes | bytearray) -> str | None:
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
def check_fields(obj: Mapping[str, Any], required: Iterable[str], optional: Sequence[str] = ()) -> None:
    required = list(required)
    keys = set(obj)
    missing = [k for k in required if k not in keys]
    extra = sorted(keys - set(required) - set(optional))
    if missing or extra:
        raise bad(f"fields missing {missing} or unknown {extra}")


def raw32(value: Any, what: str) -> bytes:
    if type(value) is not bytes or len(value) != 32:
        raise bad(f"{what} must be 32 bytes")
    return value


def uint(value: Any, what: str, limit: int = U53) -> int:
    if type(value) is not int or not 0 <= value <= limit:
        raise bad(f"{what} must be an integer in 0..{limit}")
    return value


def seq_or_none(value: Any, what: str) -> int:
    if type(value) is not int or not -1 <= value <= U53:
        raise bad(f"{what} must be an integer in -1..{U53}")
    return value


def bounded_list(value: Any, what: str, limit: int) -> list:
    if type(value) is not list or len(value) > limit:
        raise bad(f"{what} must be a list of at most {limit} items")
    return value


def check_text(value: Any, what: str, limit: int = MAX_TEXT) -> str:
    if type(value) is not str or len(value) > limit:
        raise bad(f"{what} must be a string of at most {limit} characters")
    return value


def key_text(value: Any, what: str) -> str:
    return public_key_str(raw32(value, what))
