"""What a remember writes: a new row, a merge row, or nothing (dedup), decided without a model.

Against the key's current row in the target bank (docs/memory.md, "Dedup and supersession"):

* no current row, or a different value: a new row of exactly what was given; over a current
  row it records a ``supersedes`` edge to the key, with the entry it replaces;
* the same value after :func:`node.memory.rows.normalized_value`: the given fields are merged
  into the current row's (tags, entities and edges unioned, confidence and importance the
  higher, category and validity the given ones else the current ones, source the less trusted).
  If that changes nothing, nothing is written (dedup); otherwise the merge row is written, with
  its ``supersedes`` edge to the key;
* a current row whose ``valid_to`` has passed is retired: remembering its key again is a new
  row, never a dedup into a retired fact;
* ``supersedes: [KEY, ...]`` names other keys of the bank whose current rows the new row
  retires; each must have one. They are ``supersedes`` edges carrying the entry retired.

A key with no current row is also compared with the bank's other current memories
(node/memory/dedup.py: the same text, or a near-duplicate by the embedder's threshold); the
memory service asks that after this plan, and decides with ``on_duplicate``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .rows import (
    MAX_KEY_CHARS,
    SUPERSEDES,
    Memory,
    MemoryInputError,
    _check_text,
    check_user_edges,
    iso_utc,
    memory_value,
    normalized_value,
    source_rank,
)
from .view import MemoryView

__all__ = ["Plan", "plan_write"]


@dataclass
class Plan:
    row: dict[str, Any] | None  # None: nothing to write (dedup)
    current: Memory | None  # the key's current row, if any
    merged: bool = False
    superseded: list[dict[str, str]] = field(default_factory=list)  # {"key", "entry"} retired


def plan_write(view: MemoryView, key: str, value: str, tags: Sequence[str] | None, *,
               supersedes: Sequence[str] = (), now: int, **fields: Any) -> Plan:
    """Decide the write; MemoryInputError (nothing written) if any input breaks a rule."""
    if fields.get("edges") is not None:
        fields["edges"] = [e.to_dict() for e in check_user_edges(fields["edges"])]
    row = memory_value(key, value, tags, **fields)  # every field checked before anything else
    key = row["key"]
    retiring: list[dict[str, str]] = []
    for i, other in enumerate(supersedes or ()):
        other = _check_text(f"supersedes {i + 1}", other, MAX_KEY_CHARS)
        if other == key or any(e["to"] == other for e in retiring):
            continue  # the key itself is superseded anyway
        target = view.current(other)
        if target is None:
            raise MemoryInputError(f"supersedes: there is no current memory with key {other!r} in this bank")
        retiring.append({"type": SUPERSEDES, "to": other, "entry": target.entry_id})
    cur = view.current(key)
    retired = cur is not None and cur.valid_to is not None and cur.valid_to <= now
    cur_live = None if retired else cur  # retired by its end date: a new row, not a merge into it
    if cur_live is not None and normalized_value(cur_live.value) == normalized_value(row["value"]):
        merged = _merge(cur_live, row)
        if not retiring and merged == stored_form(cur_live):
            return Plan(None, cur)
        row, is_merge = merged, True
    else:
        is_merge = False
    edges = list(row.get("edges", []))
    if cur is not None:
        edges.append({"type": SUPERSEDES, "to": key, "entry": cur.entry_id})
    edges += retiring
    if edges:
        row["edges"] = edges
    superseded = [{"key": e["to"], "entry": e["entry"]} for e in edges if e["type"] == SUPERSEDES]
    return Plan(row, cur, is_merge, superseded)


def stored_form(m: Memory) -> dict[str, Any]:
    """The row value a memory would be written as, without its supersedes edges."""
    out: dict[str, Any] = {"key": m.key, "value": m.value, "tags": list(m.tags)}
    for name in ("category", "confidence", "importance"):
        if getattr(m, name) is not None:
            out[name] = getattr(m, name)
    if m.entities:
        out["entities"] = list(m.entities)
    links = [e.to_dict() for e in m.edges if e.type != SUPERSEDES]
    if links:
        out["edges"] = links
    if m.valid_from is not None:
        out["valid_from"] = iso_utc(m.valid_from)
    if m.valid_to is not None:
        out["valid_to"] = iso_utc(m.valid_to)
    if m.source is not None:
        out["source"] = m.source
    return out


def _union(old: Sequence[Any], new: Sequence[Any], ident) -> list[Any]:
    seen = {ident(x) for x in old}
    out = list(old)
    for x in new:
        if ident(x) not in seen:
            seen.add(ident(x))
            out.append(x)
    return out


def _merge(cur: Memory, row: dict[str, Any]) -> dict[str, Any]:
    """The current row with the given fields merged in (the rules of the module docstring)."""
    out = stored_form(cur)
    out["tags"] = _union(out["tags"], row["tags"], str.casefold)
    entities = _union(out.get("entities", []), row.get("entities", []), str.casefold)
    edges = _union(out.get("edges", []), row.get("edges", []), lambda e: (e["type"], e["to"]))
    for name, items in (("entities", entities), ("edges", edges)):
        if items:
            out[name] = items
    for name in ("confidence", "importance"):
        values = [v for v in (out.get(name), row.get(name)) if v is not None]
        if values:
            out[name] = max(values)  # a merge never lowers them
    for name in ("category", "valid_from", "valid_to"):
        if name in row:
            out[name] = row[name]
    if "valid_from" in out and "valid_to" in out and out["valid_from"] >= out["valid_to"]:
        raise MemoryInputError(f"valid_to ({out['valid_to']}) must be after valid_from ({out['valid_from']}), "
                               "which the memory already has")
    if "source" in row:
        given = row["source"]
        out["source"] = given if "source" not in out else min(out["source"], given, key=source_rank)
    return out
