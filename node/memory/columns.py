"""Per-document columns of a memory view: what recall filters on, as numpy arrays.

A memory view numbers every well-formed memory row it holds (its *docs*, 0..n-1) and keeps
here, per doc, the fields a filter reads: whether the row is current, its T-order height (the
recency ranking), category, confidence, world times, the entry's timestamp, and the author and
feed position (seq) of its entry (which decide whether the row is in an entry's causal past),
and its labels (node/memory/labels.py: the hygiene rule that flagged it, whether it holds a
secret, whether its source is ingested text, whether auto-capture derived it).
Filters then cost one vectorised pass over these arrays instead of a Python call per candidate
(:meth:`node.memory.timeline.Filters.mask`).

Missing values use the sentinels of :func:`node.memory.timeline.overlaps`: no ``valid_from`` is
``NO_FROM`` (before every time), no ``valid_to`` is ``NO_TO`` (after every time), no confidence is
0 (a recorded confidence is 1-10), no category is -1. World times come from ISO dates (years
1-9999) and entry timestamps are at most 2**63 - 1, so every value fits an int64.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .labels import NO_FLAG, Labels
from .rows import Memory

__all__ = ["NO_FROM", "NO_TO", "DocColumns"]

NO_FROM = -(1 << 62)
NO_TO = 1 << 62

_ARRAYS = (("height", np.float64, 0), ("current", np.bool_, False), ("category", np.int32, -1),
           ("confidence", np.int8, 0), ("valid_from", np.int64, NO_FROM), ("valid_to", np.int64, NO_TO),
           ("ts", np.int64, 0), ("author", np.int32, -1), ("seq", np.int64, -1),
           ("flag", np.int8, NO_FLAG), ("secret", np.bool_, False), ("ingested", np.bool_, False),
           ("derived", np.bool_, False))


class DocColumns:
    """Growable per-doc arrays (``cols.valid_to[:cols.n]`` are the live values)."""

    height: np.ndarray
    current: np.ndarray
    category: np.ndarray
    confidence: np.ndarray
    valid_from: np.ndarray
    valid_to: np.ndarray
    ts: np.ndarray
    author: np.ndarray
    seq: np.ndarray
    flag: np.ndarray
    secret: np.ndarray
    ingested: np.ndarray
    derived: np.ndarray

    def __init__(self) -> None:
        self.n = 0
        self.with_valid_to = 0  # docs that have a valid_to (none: the caller's clock hides nothing)
        self.categories: dict[str, int] = {}
        self.authors: dict[str, int] = {}
        for name, dtype, fill in _ARRAYS:
            setattr(self, name, np.full(64, fill, dtype=dtype))

    def _reserve(self, need: int) -> None:
        cap = len(self.height)
        if need <= cap:
            return
        while cap < need:
            cap += cap // 2
        for name, dtype, fill in _ARRAYS:
            grown = np.full(cap, fill, dtype=dtype)
            grown[: self.n] = getattr(self, name)[: self.n]
            setattr(self, name, grown)

    def _ids(self, m: Memory) -> tuple[int, int]:
        category = -1
        if m.category is not None:
            category = self.categories.setdefault(m.category, len(self.categories))
        return category, self.authors.setdefault(m.author, len(self.authors))

    def append(self, m: Memory, seq: int, labels: Labels) -> int:
        """The next doc, for memory ``m`` of an entry at feed position ``seq``."""
        doc = self.n
        self._reserve(doc + 1)
        category, author = self._ids(m)
        self.height[doc] = m.order[0]
        self.category[doc] = category
        self.confidence[doc] = m.confidence or 0
        self.valid_from[doc] = NO_FROM if m.valid_from is None else m.valid_from
        self.valid_to[doc] = NO_TO if m.valid_to is None else m.valid_to
        self.with_valid_to += m.valid_to is not None
        self.ts[doc] = m.ts
        self.author[doc] = author
        self.seq[doc] = seq
        self.flag[doc] = labels.flag_id
        self.secret[doc] = labels.secret is not None
        self.ingested[doc] = labels.ingested
        self.derived[doc] = labels.derived
        self.n = doc + 1
        return doc

    def extend(self, mems: Sequence[Memory], seqs: Sequence[int], labels: Sequence[Labels]) -> None:
        """``append`` of each memory in turn, in bulk."""
        first, count = self.n, len(mems)
        self._reserve(first + count)
        ids = [self._ids(m) for m in mems]
        end = first + count
        self.height[first:end] = [m.order[0] for m in mems]
        self.category[first:end] = [c for c, _a in ids]
        self.confidence[first:end] = [m.confidence or 0 for m in mems]
        self.valid_from[first:end] = [NO_FROM if m.valid_from is None else m.valid_from for m in mems]
        self.valid_to[first:end] = [NO_TO if m.valid_to is None else m.valid_to for m in mems]
        self.with_valid_to += sum(m.valid_to is not None for m in mems)
        self.ts[first:end] = [m.ts for m in mems]
        self.author[first:end] = [a for _c, a in ids]
        self.seq[first:end] = seqs
        self.flag[first:end] = [lab.flag_id for lab in labels]
        self.secret[first:end] = [lab.secret is not None for lab in labels]
        self.ingested[first:end] = [lab.ingested for lab in labels]
        self.derived[first:end] = [lab.derived for lab in labels]
        self.n = end

    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name, _dtype, _fill in _ARRAYS)
