"""Subsets (:class:`Subset`): a subset of the documents with its own statistics (N, df, avgdl),
scored over the shared postings exactly as an index of those documents alone would score them.
A memory view indexes every row once and ranks current rows through the subset of them.

It reads the index's slots and postings (node/memory/bm25.py) directly: the two are one
data structure, split in two modules by what each holds.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .arrays import MIN_CAP, as_doc_id

if TYPE_CHECKING:
    from .bm25 import InvertedIndex


class Subset:
    """A subset of an :class:`InvertedIndex`'s documents with its own BM25 statistics.

    Why: a memory view keeps one index over every row (its statistics are the whole
    history's, for ``as_of`` and ``as_known_at``) and ranks plain recall over the current
    rows only, with N, df and avgdl of the current rows (docs/memory.md). A second index of the
    current rows would hold their postings twice; a subset shares the postings and keeps
    only its own membership, document frequencies, N and total length. Scores of a subset's
    documents are computed with exactly the operations an index holding only those
    documents would use (the same idf and length-norm formulas on the same integers, terms
    added per slot in sorted token order), so they are bit-identical to such an index's.

    Members must be documents of the index; a member cannot be removed from the index
    (remove it from the subset first). Compaction of the index renumbers the subset too.
    """

    def __init__(self, index: InvertedIndex) -> None:
        self._index = index
        self._in = np.zeros(MIN_CAP, dtype=bool)  # per slot of the index
        self._df: list[int] = []  # per token id of the index; shorter: zero beyond
        self._n = 0
        self._total = 0
        self._norm: np.ndarray | None = None
        index._subsets.append(self)

    def __len__(self) -> int:
        return self._n

    def __contains__(self, doc_id: object) -> bool:
        slot = self._index._doc_slot.get(cast(int, doc_id))  # a dict lookup takes any key: others miss
        return slot is not None and self._has_slot(slot)

    @property
    def avgdl(self) -> float:
        return self._total / self._n if self._n else 0.0

    def df(self, token: str) -> int:
        tid = self._index._vocab.get(token)
        return 0 if tid is None or tid >= len(self._df) else self._df[tid]

    def _check_owner(self, index: InvertedIndex) -> None:
        if index is not self._index:
            raise ValueError("a subset is scored only by the index it belongs to")

    def _has_slot(self, slot: int) -> bool:
        return slot < len(self._in) and bool(self._in[slot])

    def _room(self) -> None:
        ix = self._index
        if len(self._in) < ix._n_slots:
            grown = np.zeros(len(ix._alive), dtype=bool)
            grown[: len(self._in)] = self._in
            self._in = grown
        if len(self._df) < len(ix._tokens):
            self._df.extend([0] * (len(ix._tokens) - len(self._df)))

    def _norms(self) -> np.ndarray:
        if self._norm is None or len(self._norm) != self._index._n_slots:
            ix = self._index
            dl = ix._slot_len[: ix._n_slots]
            avgdl = self._total / self._n
            self._norm = ix.k1 * ((1.0 - ix.b) + ix.b * (dl / avgdl))
        return self._norm

    def add(self, doc_id: int) -> None:
        """Make a document of the index a member (ValueError if it already is one)."""
        ix = self._index
        slot = ix._doc_slot[as_doc_id(doc_id)]
        self._room()
        if self._in[slot]:
            raise ValueError(f"doc_id {doc_id} is already in the subset")
        start, cnt = int(ix._fwd_start[slot]), int(ix._fwd_count[slot])
        df = self._df
        for tid in ix._fwd_tok[start : start + cnt].tolist():
            df[tid] += 1
        self._in[slot] = True
        self._n += 1
        self._total += int(ix._slot_len[slot])
        self._norm = None

    def add_many(self, doc_ids: Iterable[int]) -> None:
        """``add`` of each document, in bulk."""
        ix = self._index
        slots = np.fromiter((ix._doc_slot[as_doc_id(d)] for d in doc_ids), dtype=np.int64)
        if len(slots) == 0:
            return
        self._room()
        if len(np.unique(slots)) != len(slots) or self._in[slots].any():
            raise ValueError("a document is already in the subset (or given twice)")
        counts = ix._fwd_count[slots].astype(np.int64)
        starts = ix._fwd_start[slots]
        # The forward entries of the slots, gathered: start + 0..count-1 for each slot.
        offsets = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        tids = ix._fwd_tok[np.repeat(starts, counts) + offsets]
        add = np.bincount(tids, minlength=len(ix._tokens))
        self._df = (np.asarray(self._df, dtype=np.int64) + add).tolist()
        self._in[slots] = True
        self._n += len(slots)
        self._total += int(ix._slot_len[slots].sum())
        self._norm = None

    def remove(self, doc_id: int) -> None:
        """Drop a member (KeyError if it is not one)."""
        ix = self._index
        slot = ix._doc_slot.get(as_doc_id(doc_id))
        if slot is None or not self._has_slot(slot):
            raise KeyError(doc_id)
        start, cnt = int(ix._fwd_start[slot]), int(ix._fwd_count[slot])
        df = self._df
        for tid in ix._fwd_tok[start : start + cnt].tolist():
            df[tid] -= 1
        self._in[slot] = False
        self._n -= 1
        self._total -= int(ix._slot_len[slot])
        self._norm = None

    def _renumbered(self, live_slots: np.ndarray, keep_tok: np.ndarray, cap: int) -> None:
        """The index compacted: old slot ``live_slots[i]`` is slot i, token ``keep_tok[j]`` is j."""
        old = self._in
        self._in = np.zeros(cap, dtype=bool)
        inside = live_slots[live_slots < len(old)]
        self._in[: len(inside)] = old[inside]
        df = np.zeros(len(keep_tok), dtype=np.int64)
        known = keep_tok < len(self._df)
        df[known] = np.asarray(self._df, dtype=np.int64)[keep_tok[known]]
        self._df = df.tolist()
        self._norm = None

    def search(
        self,
        query_tokens: Sequence[str],
        *,
        limit: int | None,
        allowed: Callable[[int], bool] | None = None,
        tiebreak: Callable[[int], Any] | None = None,
        mask: np.ndarray | None = None,
    ) -> list[tuple[int, float]]:
        """:meth:`InvertedIndex.search` over the members, with the subset's statistics."""
        return self._index.search(query_tokens, limit=limit, allowed=allowed, tiebreak=tiebreak,
                                  mask=mask, subset=self)
