"""Memory rows and embedding rows: their values, strict input checks, lenient remote parsing.

Decisions (DESIGN sections 3 and 7):

* **A memory is a row of the ``memory`` store** (append-only) whose value is
  ``{"key": str, "value": str, "tags": [str, ...]}``. :func:`memory_value` builds that value
  from user input and refuses bad input with a :class:`MemoryInputError` whose message says
  what to change. Limits: key 1..512 characters, value 1..65536 characters (both must contain
  a non-whitespace character), at most 32 tags of 1..64 characters each. Characters are code
  points (``len``); text must be encodable as UTF-8 (no lone surrogates). Tags are kept as
  written; duplicates are removed case-insensitively (``str.casefold``), keeping the first
  spelling, and the 32-tag limit counts what is left. Missing or ``None`` tags mean no tags.
* **Per memory key, only the newest row is current.** "Newest" is T order:
  ``RowRecord.order = (height, entry id, clock)``, larger is newer; T order extends causal
  order and is the same on every replica, so "changing" a memory is writing a new row with the
  same key and the old row stays in the history. :func:`order_desc_key` turns an order into a
  key that sorts newest first; it is the deterministic tie-break of every ranking (never a
  local doc id, never wall-clock time).
* **The embedding of a memory** (of ``key + " " + value``) for model M of provider P is a row
  of the store ``embeddings:P/M`` (:func:`embedding_store`) whose value is
  ``{"row": <row key of the memory row>, "v": <float32 little-endian bytes>}``
  (:func:`embedding_value`), written in the same entry as the memory row (a later reindex may
  write it in a later entry).
* **Remote rows may be malformed**: a peer holding Write can put any JSON-like value in any
  row. :func:`parse_memory` and :func:`parse_embedding` never raise on a row's value: they
  return None (and log the reason at debug level) for anything that is not well formed. A
  memory row is well formed exactly when :func:`memory_value` would accept its fields, so a
  row this node could not have written is never a candidate, on any replica; unknown extra
  fields are ignored (room for later versions). An embedding row is well formed when
  ``row`` is a non-empty string and ``v`` is a non-empty byte string of finite float32
  values (of ``dim`` values when a dim is given).
"""
from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from crdt.database import RowRecord, valid_store_name
from crdt.errors import MemmeshError

__all__ = [
    "EMBEDDINGS_PREFIX",
    "MAX_KEY_CHARS",
    "MAX_TAGS",
    "MAX_TAG_CHARS",
    "MAX_VALUE_CHARS",
    "MEMORY_STORE",
    "Memory",
    "MemoryInputError",
    "embedding_store",
    "embedding_value",
    "is_embedding_store",
    "memory_value",
    "order_desc_key",
    "parse_embedding",
    "parse_embeddings",
    "parse_memory",
]

log = logging.getLogger(__name__)

MEMORY_STORE = "memory"
EMBEDDINGS_PREFIX = "embeddings:"
MAX_KEY_CHARS = 512
MAX_VALUE_CHARS = 64 * 1024
MAX_TAGS = 32
MAX_TAG_CHARS = 64

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


class MemoryInputError(MemmeshError):
    """Input to a memory operation that is refused; the message says what to change."""


@dataclass(frozen=True, slots=True)
class Memory:
    """One well-formed memory row, as an accepted entry inserted it."""

    key: str
    value: str
    tags: tuple[str, ...]
    ts: int  # the entry's timestamp, ms since the epoch (informational only, never ordering)
    author: str
    entry_id: str
    row_key: str
    order: tuple[int, str, int]  # T order (height, entry id, clock): larger = newer

    def to_dict(self, bank: str | None = None) -> dict[str, Any]:
        """The JSON shape tools and APIs return for a memory."""
        return {
            "key": self.key,
            "value": self.value,
            "tags": list(self.tags),
            "time": _iso_utc(self.ts),
            "written_by": self.author,
            "entry": self.entry_id,
            "bank": bank,
        }


def _iso_utc(ts: int) -> str | None:
    """ISO-8601 UTC with milliseconds (``2024-05-01T12:00:00.123Z``); None if out of range."""
    try:
        when = _EPOCH + _dt.timedelta(milliseconds=ts)
    except (OverflowError, TypeError, ValueError):
        return None
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def order_desc_key(order: tuple[int, str, int]) -> tuple[int, int, int]:
    """A sort key that puts larger (newer) T orders first.

    Entry ids are ``sha256:<64 lowercase hex digits>`` (crdt.entry), so comparing their hex
    digits as integers is the same as comparing the ids as strings.
    """
    height, entry_id, clock = order
    return (-height, -int(entry_id[entry_id.index(":") + 1:], 16), -clock)


# ------------------------------------------------------------------------------ memory rows
def _text_ok(s: str) -> bool:
    if s.isascii():  # O(1) in CPython; ASCII text has no surrogates
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_text(what: str, s: Any, limit: int) -> str:
    if not isinstance(s, str):
        detail = f"got {type(s).__name__}"
    elif not s or s.isspace():
        detail = "got an empty or blank string"
    elif len(s) > limit:
        detail = f"got {len(s)} characters"
    elif not _text_ok(s):
        raise MemoryInputError(f"{what} must be valid Unicode text (it contains a lone surrogate)")
    else:
        return s
    raise MemoryInputError(f"{what} must be a non-empty string of at most {limit} characters ({detail})")


def _check_tags(tags: Any) -> tuple[str, ...]:
    """The tags as stored (see :func:`memory_value`); MemoryInputError if they break a rule.

    Fast path for the common case (a list or tuple of distinct valid tags, the shape every
    stored row has); anything else, including every error, goes through
    :func:`_check_tags_strict`, which makes the same checks one tag at a time.
    """
    if tags is None:
        return ()
    if type(tags) is not list and type(tags) is not tuple:
        return _check_tags_strict(tags)
    for tag in tags:
        if (type(tag) is not str or not tag or len(tag) > MAX_TAG_CHARS or tag.isspace()
                or not (tag.isascii() or _text_ok(tag))):
            return _check_tags_strict(tags)
    n = len(tags)
    if n < 2:
        return tuple(tags)
    if n <= MAX_TAGS and len({t.casefold() for t in tags}) == n:
        return tuple(tags)  # no duplicates to drop
    return _check_tags_strict(tags)


def _check_tags_strict(tags: Any) -> tuple[str, ...]:
    if tags is None:
        return ()
    if isinstance(tags, (str, bytes)) or not isinstance(tags, (list, tuple)):
        raise MemoryInputError(
            f"tags must be a list of strings, got {type(tags).__name__}"
            + (" (put a single tag in a list: [\"tag\"])" if isinstance(tags, str) else "")
        )
    out: list[str] = []
    seen: set[str] = set()
    for i, tag in enumerate(tags):
        if not isinstance(tag, str) or not tag or len(tag) > MAX_TAG_CHARS or tag.isspace():
            raise MemoryInputError(
                f"tag {i + 1} must be a non-empty string of at most {MAX_TAG_CHARS} characters"
            )
        if not _text_ok(tag):
            raise MemoryInputError(f"tag {i + 1} must be valid Unicode text (it contains a lone surrogate)")
        folded = tag.casefold()
        if folded not in seen:
            seen.add(folded)
            out.append(tag)
    if len(out) > MAX_TAGS:
        raise MemoryInputError(f"at most {MAX_TAGS} different tags per memory (got {len(out)})")
    return tuple(out)


def _check_memory(key: Any, value: Any, tags: Any) -> tuple[str, str, tuple[str, ...]]:
    return (
        _check_text("key", key, MAX_KEY_CHARS),
        _check_text("value", value, MAX_VALUE_CHARS),
        _check_tags(tags),
    )


def memory_value(key: str, value: str, tags: Iterable[str] | None = ()) -> dict[str, Any]:
    """The value of a new ``memory`` row; MemoryInputError if the input breaks a rule."""
    if tags is not None and not isinstance(tags, (list, tuple, str, bytes, Mapping)):
        try:
            tags = tuple(tags)
        except TypeError:
            raise MemoryInputError(f"tags must be a list of strings, got {type(tags).__name__}") from None
    k, v, t = _check_memory(key, value, tags)
    return {"key": k, "value": v, "tags": list(t)}


def parse_memory(record: RowRecord) -> Memory | None:
    """The memory a ``memory`` row holds, or None (logged at debug) if the row is malformed."""
    value = record.value
    if not isinstance(value, dict):
        log.debug("ignoring memory row %s of entry %s: value is %s, not an object",
                  record.key, record.entry_id, type(value).__name__)
        return None
    if "key" not in value or "value" not in value:
        log.debug("ignoring memory row %s of entry %s: 'key' or 'value' is missing", record.key, record.entry_id)
        return None
    try:
        key, text, tags = _check_memory(value["key"], value["value"], value.get("tags"))
    except MemoryInputError as exc:
        log.debug("ignoring memory row %s of entry %s: %s", record.key, record.entry_id, exc)
        return None
    return Memory(key, text, tags, record.ts, record.author, record.entry_id, record.key, record.order)


# --------------------------------------------------------------------------- embedding rows
def embedding_store(provider: str, model: str) -> str:
    """``embeddings:<provider>/<model>``; MemoryInputError if that is not a valid store name."""
    for what, part in (("provider", provider), ("model", model)):
        if not isinstance(part, str) or not part:
            raise MemoryInputError(f"embedding {what} must be a non-empty string")
    if "/" in provider:
        raise MemoryInputError(f"embedding provider {provider!r} may not contain '/'")
    name = f"{EMBEDDINGS_PREFIX}{provider}/{model}"
    if not valid_store_name(name):
        raise MemoryInputError(
            f"cannot store vectors of {provider}/{model}: the store name {name!r} must be at most "
            "128 characters of a-z, 0-9 and _ : . / - (lowercase)"
        )
    return name


def is_embedding_store(name: object) -> bool:
    """True for a valid store name of the form ``embeddings:...``."""
    return isinstance(name, str) and name.startswith(EMBEDDINGS_PREFIX) and valid_store_name(name)


def embedding_value(row_key: str, vector: np.ndarray) -> dict[str, Any]:
    """The value of an embedding row for memory row ``row_key``: float32 little-endian bytes."""
    if not isinstance(row_key, str) or not row_key:
        raise MemoryInputError("an embedding needs the row key of its memory row (a non-empty string)")
    arr = np.asarray(vector)
    if arr.ndim != 1 or arr.size == 0 or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    ):
        raise MemoryInputError(f"an embedding must be a non-empty 1-d array of numbers, got shape {arr.shape}")
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype("<f4")
    if not np.all(np.isfinite(out)):
        raise MemoryInputError("an embedding has NaN or infinite values (or values too large for float32)")
    return {"row": row_key, "v": out.tobytes()}


def _embedding_fields(record: RowRecord, dim: int | None) -> tuple[str, bytes] | None:
    """``(row, raw bytes)`` of an embedding row whose shape is right (finiteness unchecked)."""
    value = record.value
    if not isinstance(value, dict):
        log.debug("ignoring embedding row %s of entry %s: value is %s, not an object",
                  record.key, record.entry_id, type(value).__name__)
        return None
    row, raw = value.get("row"), value.get("v")
    if not isinstance(row, str) or not row:
        log.debug("ignoring embedding row %s of entry %s: 'row' is not a row key", record.key, record.entry_id)
        return None
    if not isinstance(raw, bytes) or not raw or len(raw) % 4:
        log.debug("ignoring embedding row %s of entry %s: 'v' is not float32 bytes", record.key, record.entry_id)
        return None
    n = len(raw) // 4
    if dim is not None and n != dim:
        log.debug("ignoring embedding row %s of entry %s: %d values, expected %d",
                  record.key, record.entry_id, n, dim)
        return None
    return row, raw


def _log_non_finite(record: RowRecord) -> None:
    log.debug("ignoring embedding row %s of entry %s: non-finite values", record.key, record.entry_id)


def parse_embedding(record: RowRecord, dim: int | None) -> tuple[str, np.ndarray] | None:
    """``(memory row key, float32 vector)`` of an embedding row, or None (logged at debug)
    if the row is malformed or, when ``dim`` is given, its vector has another length."""
    fields = _embedding_fields(record, dim)
    if fields is None:
        return None
    row, raw = fields
    vec = np.frombuffer(raw, dtype="<f4")
    if not np.all(np.isfinite(vec)):
        _log_non_finite(record)
        return None
    return row, vec.astype(np.float32, copy=False)


_FINITE_BLOCK = 1024


def parse_embeddings(records: Sequence[RowRecord], dim: int | None) -> list[tuple[str, np.ndarray] | None]:
    """:func:`parse_embedding` of each record, in order (the same verdicts, the same debug
    logs), with the finiteness check done for blocks of same-length vectors at once.

    The vectors are read-only views of the rows' bytes (float32).
    """
    out: list[tuple[str, np.ndarray] | None] = []
    by_len: dict[int, list[int]] = {}
    for i, record in enumerate(records):
        fields = _embedding_fields(record, dim)
        if fields is None:
            out.append(None)
            continue
        vec = np.frombuffer(fields[1], dtype="<f4")
        out.append((fields[0], vec))
        by_len.setdefault(len(vec), []).append(i)
    for idx in by_len.values():
        for a in range(0, len(idx), _FINITE_BLOCK):
            block = idx[a : a + _FINITE_BLOCK]
            finite = np.isfinite(np.stack([out[i][1] for i in block])).all(axis=1)  # type: ignore[index]
            for j in np.flatnonzero(~finite).tolist():
                _log_non_finite(records[block[j]])
                out[block[j]] = None
    if np.dtype("<f4") != np.dtype(np.float32):  # pragma: no cover - big-endian hosts
        out = [None if p is None else (p[0], p[1].astype(np.float32)) for p in out]
    return out
