"""Memory rows and embedding rows: their values, strict input checks, lenient remote parsing.

Decisions (docs/architecture.md "Every store is append-only" and docs/memory.md):

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
* **Optional fields** (docs/memory.md, "Rows"): ``category``, ``confidence``, ``importance``,
  ``entities``, ``edges``, ``valid_from``, ``valid_to``, ``source``. A row holds only the fields
  it was given, so a ``{key, value, tags}`` row is exactly what it always was. Local input is
  strict (:func:`memory_value` refuses any bad field); remote rows are lenient: a malformed
  optional field of a remote row is dropped (logged at debug), the memory is kept, so a peer
  cannot make a row disappear on one replica and not on another by a field this version does
  not understand. Times are world time (when the fact holds), stored as ISO 8601 UTC and kept
  as milliseconds; they never order rows.
"""
from __future__ import annotations

import datetime as _dt
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from memmesh.crdt.database import RowRecord

from .embedding_rows import (
    EMBEDDINGS_PREFIX,
    embedding_store,
    embedding_value,
    is_embedding_store,
    parse_embedding,
    parse_embeddings,
)
from .input_error import MemoryInputError

__all__ = [
    "EMBEDDINGS_PREFIX",
    "Edge",
    "MAX_EDGES",
    "MAX_ENTITIES",
    "MAX_ENTITY_CHARS",
    "MAX_SCORE",
    "MIN_SCORE",
    "SOURCES",
    "SUPERSEDES",
    "check_slug",
    "check_user_edges",
    "check_time",
    "iso_utc",
    "normalized_value",
    "source_rank",
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
MAX_KEY_CHARS = 512
MAX_VALUE_CHARS = 64 * 1024
MAX_TAGS = 32
MAX_TAG_CHARS = 64

MIN_SCORE, MAX_SCORE = 1, 10  # confidence and importance
MAX_ENTITIES = 32
MAX_ENTITY_CHARS = 128
MAX_EDGES = 64
MAX_SLUG_CHARS = 64
# "BANK:KEY": a bank name (64) or a database id (71 characters), a colon, a memory key.
MAX_EDGE_TO_CHARS = 72 + 1 + MAX_KEY_CHARS
# Least trusted first: a merge keeps the less trusted of two sources, so it never raises trust.
SOURCES = ("inferred", "ingested", "tool", "derived", "user")  # derived: auto-capture (node/memory/capture.py)
DEFAULT_SOURCE = "inferred"
SUPERSEDES = "supersedes"  # the edge type that retires the current row of its target key

_SLUG = re.compile(r"[a-z0-9][a-z0-9_.-]*\Z")
_ENTRY_ID = re.compile(r"sha256:[0-9a-f]{64}\Z")
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


@dataclass(frozen=True, slots=True)
class Edge:
    """A typed link from a memory to a memory key (``KEY`` in the same bank, or ``BANK:KEY``).

    ``entry`` is set on ``supersedes`` edges written by this node: the entry of the row that was
    current for the target key when the edge was written (the version it retires)."""

    type: str
    to: str
    entry: str | None = None

    def to_dict(self) -> dict[str, str]:
        out = {"type": self.type, "to": self.to}
        if self.entry is not None:
            out["entry"] = self.entry
        return out


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
    category: str | None = None
    confidence: int | None = None
    importance: int | None = None
    entities: tuple[str, ...] = ()
    edges: tuple[Edge, ...] = ()
    valid_from: int | None = None  # world time, ms since the epoch; None: unbounded
    valid_to: int | None = None  # exclusive
    source: str | None = None  # None: not recorded (reads as DEFAULT_SOURCE)

    @property
    def supersedes(self) -> tuple[Edge, ...]:
        return tuple(e for e in self.edges if e.type == SUPERSEDES)

    def to_dict(self, bank: str | None = None) -> dict[str, Any]:
        """The JSON shape tools and APIs return for a memory; optional fields only when set."""
        out: dict[str, Any] = {
            "key": self.key,
            "value": self.value,
            "tags": list(self.tags),
            "time": _iso_utc(self.ts),
            "written_by": self.author,
            "entry": self.entry_id,
            "bank": bank,
        }
        for name in ("category", "confidence", "importance", "source"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.entities:
            out["entities"] = list(self.entities)
        links = [e for e in self.edges if e.type != SUPERSEDES]
        if links:
            out["edges"] = [e.to_dict() for e in links]
        if self.valid_from is not None:
            out["valid_from"] = _iso_utc(self.valid_from)
        if self.valid_to is not None:
            out["valid_to"] = _iso_utc(self.valid_to)
        if self.supersedes:
            out["supersedes"] = [{"key": e.to, **({"entry": e.entry} if e.entry else {})}
                                 for e in self.supersedes]
        return out


def iso_utc(ts: int) -> str | None:
    """ISO-8601 UTC with milliseconds (``2024-05-01T12:00:00.123Z``); None if out of range."""
    try:
        when = _EPOCH + _dt.timedelta(milliseconds=ts)
    except (OverflowError, TypeError, ValueError):
        return None
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


_iso_utc = iso_utc


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


check_text = _check_text  # the text rule, for other kinds of rows (history turns)


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


def normalized_value(value: str) -> str:
    """What dedup compares: whitespace runs collapsed, ends stripped, case folded."""
    return " ".join(value.split()).casefold()


def source_rank(source: str | None) -> int:
    """Trust of a source, higher = more trusted (an unrecorded source reads as inferred)."""
    return SOURCES.index(source or DEFAULT_SOURCE)


# ---------------------------------------------------------------------- optional row fields
def check_slug(what: str, s: Any) -> str:
    """An open lowercase slug (``preference``, ``depends-on``): a-z, 0-9, ``_ . -``."""
    if not isinstance(s, str) or not 1 <= len(s) <= MAX_SLUG_CHARS or not _SLUG.match(s):
        raise MemoryInputError(
            f"{what} must be a lowercase slug of 1-{MAX_SLUG_CHARS} characters (a-z, 0-9, _ . -, "
            f"starting with a letter or digit), got {_shown(s)}")
    return s


def check_score(what: str, n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not MIN_SCORE <= n <= MAX_SCORE:
        raise MemoryInputError(f"{what} must be an integer from {MIN_SCORE} to {MAX_SCORE}, got {_shown(n)}")
    return n


def check_time(what: str, s: Any) -> int:
    """An ISO 8601 date or date-time as ms since the epoch (UTC); no offset means UTC."""
    if isinstance(s, str) and 8 <= len(s) <= 40:
        try:
            when = _dt.datetime.fromisoformat(s)
        except ValueError:
            pass
        else:
            if when.tzinfo is None:
                when = when.replace(tzinfo=_dt.UTC)
            delta = when - _EPOCH
            return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
    raise MemoryInputError(
        f"{what} must be an ISO 8601 date or time such as 2026-06-01 or 2026-06-01T09:00:00Z, got {_shown(s)}")


def _check_source(s: Any) -> str:
    if s not in SOURCES or not isinstance(s, str):
        raise MemoryInputError(f"source must be one of {', '.join(sorted(SOURCES))}, got {_shown(s)}")
    return s


def _check_entities(items: Any) -> tuple[str, ...]:
    if not isinstance(items, (list, tuple)):
        raise MemoryInputError(f"entities must be a list of strings, got {type(items).__name__}")
    out: list[str] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item or item.isspace() or len(item) > MAX_ENTITY_CHARS \
                or not _text_ok(item):
            raise MemoryInputError(
                f"entity {i + 1} must be a non-empty string of at most {MAX_ENTITY_CHARS} characters")
        if item.casefold() not in seen:
            seen.add(item.casefold())
            out.append(item)
    if len(out) > MAX_ENTITIES:
        raise MemoryInputError(f"at most {MAX_ENTITIES} different entities per memory (got {len(out)})")
    return tuple(out)


def _check_edges(items: Any, *, local: bool) -> tuple[Edge, ...]:
    if not isinstance(items, (list, tuple)):
        raise MemoryInputError(f"edges must be a list of objects {{\"type\": ..., \"to\": ...}}, "
                               f"got {type(items).__name__}")
    out: list[Edge] = []
    seen: set[tuple[str, str]] = set()
    for i, item in enumerate(items):
        if isinstance(item, Edge):
            item = item.to_dict()
        if not isinstance(item, Mapping) or set(item) - {"type", "to", "entry"} or "type" not in item \
                or "to" not in item or (local and "entry" in item):
            raise MemoryInputError(f"edge {i + 1} must be an object with exactly \"type\" and \"to\"")
        etype = check_slug(f"edge {i + 1} type", item["type"])
        if local and etype == SUPERSEDES:
            raise MemoryInputError("a supersedes edge is written by the supersedes argument: "
                                   "give the keys as supersedes: [KEY, ...]")
        to = _check_text(f"edge {i + 1} target", item["to"], MAX_EDGE_TO_CHARS)
        entry = item.get("entry")
        if entry is not None and not (isinstance(entry, str) and _ENTRY_ID.match(entry)):
            raise MemoryInputError(f"edge {i + 1} entry must be an entry id")
        if (etype, to) not in seen:
            seen.add((etype, to))
            out.append(Edge(etype, to, entry))
    if len(out) > MAX_EDGES:
        raise MemoryInputError(f"at most {MAX_EDGES} edges per memory (got {len(out)})")
    return tuple(out)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# Each optional field: (its checker of local input, which returns the parsed value).
_OPTIONAL: dict[str, Callable[[Any, bool], Any]] = {
    "category": lambda v, local: check_slug("category", v),
    "confidence": lambda v, local: check_score("confidence", v),
    "importance": lambda v, local: check_score("importance", v),
    "entities": lambda v, local: _check_entities(v),
    "edges": lambda v, local: _check_edges(v, local=local),
    "valid_from": lambda v, local: check_time("valid_from", v),
    "valid_to": lambda v, local: check_time("valid_to", v),
    "source": lambda v, local: _check_source(v),
}


def _stored(name: str, parsed: Any) -> Any:
    """The JSON form of a parsed optional field, as a row holds it."""
    if name in ("valid_from", "valid_to"):
        return iso_utc(parsed)
    if name == "edges":
        return [e.to_dict() for e in parsed]
    if name == "entities":
        return list(parsed)
    return parsed


def memory_value(key: str, value: str, tags: Iterable[str] | None = (), **optional: Any) -> dict[str, Any]:
    """The value of a new ``memory`` row; MemoryInputError if the input breaks a rule.

    ``optional``: the fields of :data:`_OPTIONAL` (None or absent: not written). ``edges``
    given here may carry ``entry`` only for ``supersedes`` edges the caller resolved (the
    service does); a user's edges go through :func:`check_user_edges` first."""
    if tags is not None and not isinstance(tags, (list, tuple, str, bytes, Mapping)):
        try:
            tags = tuple(tags)
        except TypeError:
            raise MemoryInputError(f"tags must be a list of strings, got {type(tags).__name__}") from None
    k, v, t = _check_memory(key, value, tags)
    row: dict[str, Any] = {"key": k, "value": v, "tags": list(t)}
    unknown = set(optional) - set(_OPTIONAL)
    if unknown:
        raise MemoryInputError(f"a memory has no field {', '.join(sorted(unknown))}")
    parsed: dict[str, Any] = {}
    for name in _OPTIONAL:
        if optional.get(name) is not None:
            parsed[name] = _OPTIONAL[name](optional[name], False)
            row[name] = _stored(name, parsed[name])
    if "valid_from" in parsed and "valid_to" in parsed and parsed["valid_from"] >= parsed["valid_to"]:
        raise MemoryInputError(f"valid_to ({row['valid_to']}) must be after valid_from ({row['valid_from']})")
    return row


def check_user_edges(edges: Any) -> tuple[Edge, ...]:
    """A caller's ``edges`` argument: ``{"type", "to"}`` objects, no ``supersedes`` type."""
    return _check_edges(edges, local=True)


def parse_memory(record: RowRecord) -> Memory | None:
    """The memory a ``memory`` row holds, or None (logged at debug) if the row is malformed.

    Optional fields are lenient: a malformed one is dropped and the memory kept."""
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
    if len(value) == 3 or not any(name in value for name in _OPTIONAL):  # the common {key, value, tags} row
        return Memory(key, text, tags, record.ts, record.author, record.entry_id, record.key, record.order)
    extra: dict[str, Any] = {}
    for name, check in _OPTIONAL.items():
        if value.get(name) is None:
            continue
        try:
            extra[name] = check(value[name], False)
        except MemoryInputError as exc:
            log.debug("memory row %s of entry %s: dropping %s: %s", record.key, record.entry_id, name, exc)
    if "valid_from" in extra and "valid_to" in extra and extra["valid_from"] >= extra["valid_to"]:
        log.debug("memory row %s of entry %s: dropping valid_to (not after valid_from)", record.key, record.entry_id)
        del extra["valid_to"]
    return Memory(key, text, tags, record.ts, record.author, record.entry_id, record.key, record.order, **extra)
