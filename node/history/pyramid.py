"""The chunk pyramid of one session, computed from its turns (pure and deterministic).

* A session's turns are ordered by (seq, T order).
* Level 1: span k covers seqs ``10k+1 .. 10k+10``; it is a chunk once every seq of the span
  has a turn. Its children are every turn of the span in that order (two turns at one seq,
  which only two writers racing can make, are both children: nothing is hidden).
* Level 2: span j covers seqs ``100j+1 .. 100j+100``; it is a chunk once its ten level-1
  chunks exist. Its children are their ids.
* A chunk's id is the hash of (session, level, from_seq, to_seq, children)
  (:func:`node.history.record.chunk_id`). Spans are fixed, so same-level chunks are contiguous
  and never overlap; a stored chunk row whose id is not the one computed from the current
  turns (a turn arrived later at a seq of its span) is stale and not part of the pyramid.
* Extractive summaries: level 1 from the turn texts, level 2 from the *extractive* summaries
  of its children only (never the turns, never a model's summary, which may reach replicas
  at different times), both with :func:`node.history.summary.summarise` at its default 30 %.
"""
from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from .record import BATCH, SPAN, Turn, chunk_id
from .summary import summarise

__all__ = ["Pyramid", "SessionIndex", "Span", "build", "summarise_level1", "summarise_level2"]


@dataclass(frozen=True, slots=True)
class Span:
    """A chunk as computed from the turns (its summary lives in the chunk rows)."""

    id: str
    session: str
    level: int
    from_seq: int
    to_seq: int
    children: tuple[str, ...]


@dataclass
class Pyramid:
    """A session's turns and chunks as they stand (read it under the state's lock: it shares
    the session index's structures rather than copying them)."""

    session: str
    turns: list[Turn]  # (seq, T order)
    level1: list[Span]  # by from_seq
    level2: list[Span]
    by_id: dict[str, Span] = field(default_factory=dict)
    turn_by_id: dict[str, Turn] = field(default_factory=dict)

    def chunks(self, level: int) -> list[Span]:
        return self.level1 if level == 1 else self.level2

    def covered(self, level: int) -> set[int]:
        """Seqs covered by a chunk of ``level``."""
        return {s for c in self.chunks(level) for s in range(c.from_seq, c.to_seq + 1)}

    def cover(self) -> list[Span | Turn]:
        """The session at decreasing resolution with age, oldest first: level-2 chunks, the
        level-1 chunks outside them, the turns outside any level-1 chunk."""
        in2 = self.covered(2)
        in1 = self.covered(1)
        items: list[tuple[int, int, Span | Turn]] = [(c.from_seq, 0, c) for c in self.level2]
        items += [(c.from_seq, 1, c) for c in self.level1 if c.from_seq not in in2]
        items += [(t.seq, 2, t) for t in self.turns if t.seq not in in1]
        return [x for _, _, x in sorted(items, key=lambda i: (i[0], i[1]))]


def _turn_key(t: Turn) -> tuple[int, tuple[int, str, int]]:
    return (t.seq, t.order)


class SessionIndex:
    """One session's pyramid, kept current one turn at a time: a turn changes only the
    level-1 span of its seq and the level-2 span above it, so adding is O(1) spans."""

    def __init__(self, session: str) -> None:
        self.session = session
        self.turns: list[Turn] = []
        self.turn_by_id: dict[str, Turn] = {}
        self.by_id: dict[str, Span] = {}
        self.max_seq = 0
        self._by_seq: dict[int, list[Turn]] = {}
        self._l1: dict[int, Span] = {}  # span index k (seqs 10k+1..10k+10) -> its chunk
        self._l2: dict[int, Span] = {}  # span index j (seqs 100j+1..100j+100) -> its chunk
        self._sorted: tuple[list[Span], list[Span]] | None = None

    def add(self, t: Turn) -> list[Span]:
        """Add a turn (once); the chunks of its spans as they now stand."""
        if t.id in self.turn_by_id:
            return []
        self.turn_by_id[t.id] = t
        if not self.turns or _turn_key(t) > _turn_key(self.turns[-1]):
            self.turns.append(t)  # the usual case: the newest turn
        else:
            bisect.insort(self.turns, t, key=_turn_key)
        bisect.insort(self._by_seq.setdefault(t.seq, []), t, key=lambda x: x.order)
        self.max_seq = max(self.max_seq, t.seq)
        k = (t.seq - 1) // BATCH
        self._sorted = None
        return [c for c in (self._level1(k), self._level2(k // BATCH)) if c is not None]

    def _put(self, table: dict[int, Span], i: int, span: Span | None) -> Span | None:
        old = table.pop(i, None)
        if old is not None:
            self.by_id.pop(old.id, None)
        if span is not None:
            table[i] = span
            self.by_id[span.id] = span
        return span

    def _level1(self, k: int) -> Span | None:
        a, b = k * BATCH + 1, (k + 1) * BATCH
        members: list[Turn] = []
        for seq in range(a, b + 1):
            at = self._by_seq.get(seq)
            if not at:
                return self._put(self._l1, k, None)
            members += at
        children = tuple(t.id for t in members)
        return self._put(self._l1, k, Span(chunk_id(self.session, 1, a, b, children), self.session, 1, a, b, children))

    def _level2(self, j: int) -> Span | None:
        subs = [self._l1.get(k) for k in range(j * BATCH, (j + 1) * BATCH)]
        if any(c is None for c in subs):
            return self._put(self._l2, j, None)
        a, b = j * SPAN[2] + 1, (j + 1) * SPAN[2]
        children = tuple(c.id for c in subs if c is not None)
        return self._put(self._l2, j, Span(chunk_id(self.session, 2, a, b, children), self.session, 2, a, b, children))

    def spans_at(self, seq: int) -> list[Span]:
        """The chunks whose spans hold ``seq`` (level 1, then level 2)."""
        k = (seq - 1) // BATCH
        return [c for c in (self._l1.get(k), self._l2.get(k // BATCH)) if c is not None]

    def pyramid(self) -> Pyramid:
        if self._sorted is None:
            self._sorted = ([self._l1[k] for k in sorted(self._l1)], [self._l2[j] for j in sorted(self._l2)])
        return Pyramid(self.session, self.turns, self._sorted[0], self._sorted[1], self.by_id, self.turn_by_id)


def build(session: str, turns: Sequence[Turn]) -> Pyramid:
    """The pyramid of a session's turns (any order)."""
    index = SessionIndex(session)
    for t in turns:
        index.add(t)
    return index.pyramid()


def summarise_level1(texts: Sequence[str]) -> str:
    """The extractive summary of a level-1 chunk from its turns' texts, in order."""
    return summarise(texts)


def summarise_level2(child_summaries: Sequence[str]) -> str:
    """The extractive summary of a level-2 chunk from its children's extractive summaries."""
    return summarise(child_summaries)
