"""World time and recall filters: which memories held when, and which a recall keeps.

Two clocks, kept apart (docs/memory.md, "Time"):

* **Causal time** is T order (height, entry id, clock): which row of a key is newer. It decides
  supersession and is the same on every replica.
* **World time** is ``valid_from`` / ``valid_to`` (when the fact holds in the world, given by
  whoever wrote it) and the entry's signed timestamp (when it was written). Both are data of
  signed entries, so a filter on them gives the same answer on every replica for the same
  question. Nothing here reads a clock: "now" is a parameter the caller passes.

A key's **timeline** is its rows plus the *tombstones* naming it (rows of other keys whose
``supersedes`` edges retire it), newest first in T order. What held at world time ``t``: the
newest entry of the timeline already in force at ``t`` (``valid_from`` absent or <= ``t``)
decides; a row holds if ``t`` is before its ``valid_to``, a tombstone says nothing held. So a
newer row takes over from its ``valid_from`` on, and older rows still answer for earlier times.

**As known at an entry** (``as_known_at``): the rows in the causal past of entry E (E and its
ancestors, a set that is the same on every replica holding E, and that no later entry
changes) are taken as the whole store; what is current among them is decided by the same rule
as for the whole store (:func:`current_in`), so recall as known at E answers what a replica
holding exactly E's causal past would answer.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .columns import NO_FROM, NO_TO, DocColumns
from .rows import _ENTRY_ID, Memory, MemoryInputError

_I64 = (-(1 << 63) + 1, (1 << 63) - 1)


def _i64(t: int) -> int:
    """A time as an int64 for comparing with the columns: every stored time lies well inside,
    so clipping a caller's out-of-range time never changes a comparison."""
    return min(max(t, _I64[0]), _I64[1])

__all__ = ["Filters", "check_entry_id", "current_in", "held_at", "overlaps"]


@dataclass(frozen=True, slots=True)
class Filters:
    """Recall's optional filters; times are ms since the epoch (UTC)."""

    category: str | None = None
    min_confidence: int | None = None
    as_of: int | None = None  # world time: what held then
    start: int | None = None  # a period, inclusive at both ends
    end: int | None = None
    now: int | None = None  # the caller's clock: hides facts whose valid_to has passed
    as_known_at: str | None = None  # causal time: an entry id; the store as its causal past
    entities: tuple[str, ...] = ()  # only memories about every one of them (case-insensitive, like tags)

    @property
    def period(self) -> bool:
        return self.start is not None or self.end is not None

    def keep(self, m: Memory) -> bool:
        if self.category is not None and m.category != self.category:
            return False
        if self.entities and not {e.casefold() for e in self.entities} <= {e.casefold() for e in m.entities}:
            return False
        if self.min_confidence is not None and (m.confidence is None or m.confidence < self.min_confidence):
            return False
        if self.period:
            return overlaps(m, self.start, self.end)
        # retired: its end date has passed
        return not (self.as_of is None and self.now is not None and m.valid_to is not None and m.valid_to <= self.now)

    def mask(self, cols: DocColumns) -> np.ndarray | None:
        """:meth:`keep` of every doc of the columns at once (None: every doc passes)."""
        n = cols.n
        out: np.ndarray | None = None

        def both(m: np.ndarray) -> None:
            nonlocal out
            out = m if out is None else out & m

        if self.category is not None:
            cid = cols.categories.get(self.category)
            both(np.zeros(n, dtype=bool) if cid is None else cols.category[:n] == cid)
        if self.min_confidence is not None:
            conf = cols.confidence[:n]
            both((conf > 0) & (conf >= max(min(self.min_confidence, 127), -128)))
        if self.period:
            lo = _i64(-(1 << 62) if self.start is None else self.start)
            hi = _i64(1 << 62 if self.end is None else self.end)
            ts, vf, vt = cols.ts[:n], cols.valid_from[:n], cols.valid_to[:n]
            written = (lo <= ts) & (ts <= hi)
            valid = ((vf != NO_FROM) | (vt != NO_TO)) & (vf <= hi) & (lo < vt)
            both(written | valid)
        elif self.as_of is None and self.now is not None and cols.with_valid_to:
            # Retired when valid_to <= now; a doc without valid_to holds NO_TO, above any clock
            # once the clock is kept below it, so one comparison decides both.
            both(cols.valid_to[:n] > min(_i64(self.now), NO_TO - 1))
        return out


def overlaps(m: Memory, start: int | None, end: int | None) -> bool:
    """Whether the memory's validity or its writing falls in [start, end] (None: open)."""
    lo = -(1 << 62) if start is None else start
    hi = 1 << 62 if end is None else end
    if lo <= m.ts <= hi:
        return True
    if m.valid_from is None and m.valid_to is None:
        return False  # no validity recorded: only the writing time places it
    vf = -(1 << 62) if m.valid_from is None else m.valid_from
    vt = 1 << 62 if m.valid_to is None else m.valid_to
    return vf <= hi and lo < vt


def held_at(key: str, timeline: Iterable[Memory], t: int) -> Memory | None:
    """The row of ``key`` that held at world time ``t``, or None; ``timeline`` newest first
    (the key's rows and the tombstones naming it)."""
    for m in timeline:
        if m.valid_from is not None and m.valid_from > t:
            continue
        if m.key != key:
            return None  # a tombstone in force: retired by another key
        return m if m.valid_to is None or t < m.valid_to else None
    return None


def current_in(key: str, timeline: Iterable[Memory]) -> Memory | None:
    """The current row of ``key`` given its timeline (newest first): the newest entry decides;
    a tombstone (a row of another key superseding it) means the key has no current row."""
    for m in timeline:
        return m if m.key == key else None
    return None


def check_entry_id(what: str, s: Any) -> str:
    """An entry id as entries are named (``sha256:`` and 64 lowercase hex digits)."""
    if not isinstance(s, str) or not _ENTRY_ID.match(s):
        shown = repr(s) if len(repr(s)) <= 80 else repr(s)[:77] + "..."
        raise MemoryInputError(f"{what} must be an entry id (sha256: and 64 lowercase hex digits), got {shown}")
    return s
