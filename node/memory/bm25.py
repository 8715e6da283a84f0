"""Incremental BM25 inverted index (DESIGN section 7: lexical ranking).

Scoring, exactly (the "lucene" variant of Kamphuis et al. 2020, as in bm25s with
``method="lucene"``)::

    N      = number of current documents (rows added and not removed, empty ones too)
    avgdl  = (sum of the token counts of current documents) / N
    df(t)  = number of current documents containing token t
    idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))              (always > 0)
    tfc    = tf / (tf + k1 * ((1 - b) + b * (dl / avgdl)))         k1 = 1.5, b = 0.75
    score(d, q) = sum over query tokens t (with multiplicity) of idf(t) * tfc(t, d)

``tf`` is the number of occurrences of t in d and ``dl`` the token count of d.

Decisions:

* **No ``(k1 + 1)`` factor.** Like Lucene >= 8 and bm25s "lucene", the numerator is
  ``tf`` and not ``tf * (k1 + 1)``. The factor is a constant, so rankings are the same
  either way; leaving it out keeps scores numerically comparable with bm25s.
* **Repeated query tokens count once per occurrence**, as in bm25s (it adds a token's
  column once per occurrence in the query). A token occurring ``c`` times contributes
  ``(c * idf) * tfc``; query tokens unknown to the index are ignored.
* **Only documents matching at least one query token are returned**; since idf > 0 and
  tf >= 1 for every posting, that is exactly the documents with a positive score.
* **Determinism.** Scores are float64. idf is computed with :func:`math.log` on exact
  integer inputs; the length norm and tfc with single numpy elementwise operations
  (IEEE-754, correctly rounded); query tokens are deduplicated and visited in sorted
  order, so "cat dog" and "dog cat" give bit-identical scores; nothing depends on the
  order in which documents were added or removed. Equal rows therefore tie exactly and
  the caller's ``tiebreak`` key decides (see :mod:`node.memory.fusion`).
* **Current rows only.** When a memory key gets a newer row, the caller removes the old
  row's id and adds the new one; N, avgdl and df always describe the current rows, and
  the result is identical to rebuilding the index from the current rows (tested).

Data layout (no full scan per query):

* vocabulary ``token -> token id``; per token id a postings list held as two growable
  numpy arrays (document slot as int64, tf as float64) plus its live df;
* per document slot: doc id, length, alive flag, and its (token id, tf) pairs in a flat
  forward index (needed to update df on removal and to compact);
* removal marks the slot dead (tombstone) and leaves its postings in place; dead slots
  are filtered out of the candidates. When dead slots outnumber both live ones and
  1024, :meth:`InvertedIndex.compact` renumbers slots, rewrites postings and drops
  tokens that no current document has (amortised O(1) per removal);
* per query: a dense float64 score array over slots, one vectorised pass per distinct
  query token over its postings (gather length norm, compute tfc, scatter-add), then
  top-k selection with numpy (:func:`node.memory.fusion.rank_candidates`). The per-slot
  length norm ``k1 * ((1 - b) + b * (dl / avgdl))`` is cached until the next mutation.

Not thread-safe: callers serialise access (one writer or reader at a time).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .fusion import _check_limit, rank_candidates

__all__ = ["B", "K1", "InvertedIndex"]

K1 = 1.5
B = 0.75

_MIN_CAP = 4
_COMPACT_MIN_DEAD = 1024


def _grown(arr: np.ndarray, need: int) -> np.ndarray:
    cap = max(_MIN_CAP, len(arr))
    while cap < need:
        cap *= 2
    new = np.empty(cap, dtype=arr.dtype)
    new[: len(arr)] = arr
    return new


def _as_doc_id(doc_id: Any) -> int:
    if isinstance(doc_id, bool) or not isinstance(doc_id, (int, np.integer)):
        raise TypeError(f"doc_id must be an int, got {type(doc_id).__name__}")
    return int(doc_id)


class InvertedIndex:
    """Incremental BM25 index over integer doc ids (see module docstring)."""

    def __init__(self, k1: float = K1, b: float = B) -> None:
        self.k1 = float(k1)
        self.b = float(b)
        self._vocab: dict[str, int] = {}
        self._tokens: list[str] = []  # token id -> token
        self._p_slot: list[np.ndarray] = []  # token id -> slots (int64), first _p_n valid
        self._p_tf: list[np.ndarray] = []  # token id -> tf (float64)
        self._p_n: list[int] = []
        self._df: list[int] = []  # live document frequency
        self._doc_slot: dict[int, int] = {}
        self._n_slots = 0
        self._slot_doc = np.empty(_MIN_CAP, dtype=np.int64)
        self._slot_len = np.empty(_MIN_CAP, dtype=np.float64)
        self._alive = np.zeros(_MIN_CAP, dtype=bool)
        self._fwd_start = np.empty(_MIN_CAP, dtype=np.int64)
        self._fwd_count = np.empty(_MIN_CAP, dtype=np.int64)
        self._fwd_tok = np.empty(_MIN_CAP, dtype=np.int64)
        self._fwd_tf = np.empty(_MIN_CAP, dtype=np.int64)
        self._fwd_n = 0
        self._n_live = 0
        self._n_dead = 0
        self._total_len = 0
        self._norm: np.ndarray | None = None

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return self._n_live

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._doc_slot

    @property
    def avgdl(self) -> float:
        """Average token count of the current documents (0.0 when empty)."""
        return self._total_len / self._n_live if self._n_live else 0.0

    def df(self, token: str) -> int:
        """Number of current documents containing ``token``."""
        tid = self._vocab.get(token)
        return 0 if tid is None else self._df[tid]

    def idf(self, token: str) -> float:
        """``ln(1 + (N - df + 0.5) / (df + 0.5))`` for a token with df > 0, else 0.0."""
        df = self.df(token)
        return self._idf(df) if df else 0.0

    def _idf(self, df: int) -> float:
        return math.log(1.0 + (self._n_live - df + 0.5) / (df + 0.5))

    # ---------------------------------------------------------------- mutation
    def add(self, doc_id: int, tokens: Sequence[str]) -> None:
        """Index a document. ``doc_id`` must not be present (remove it first)."""
        doc_id = _as_doc_id(doc_id)
        if doc_id in self._doc_slot:
            raise ValueError(f"doc_id {doc_id} is already indexed")
        if isinstance(tokens, str):
            raise TypeError("tokens must be a sequence of tokens, not a string")
        counts = Counter(tokens)
        if not all(isinstance(t, str) for t in counts):
            raise TypeError("tokens must be strings")
        slot = self._n_slots
        if slot >= len(self._slot_doc):
            need = slot + 1
            self._slot_doc = _grown(self._slot_doc, need)
            self._slot_len = _grown(self._slot_len, need)
            alive = np.zeros(len(self._slot_doc), dtype=bool)
            alive[: len(self._alive)] = self._alive
            self._alive = alive
            self._fwd_start = _grown(self._fwd_start, need)
            self._fwd_count = _grown(self._fwd_count, need)
        ntok = len(counts)
        start = self._fwd_n
        if start + ntok > len(self._fwd_tok):
            self._fwd_tok = _grown(self._fwd_tok, start + ntok)
            self._fwd_tf = _grown(self._fwd_tf, start + ntok)
        vocab, p_slot, p_tf, p_n, df = self._vocab, self._p_slot, self._p_tf, self._p_n, self._df
        tids = []
        for token in counts:
            tid = vocab.get(token)
            if tid is None:
                tid = len(self._tokens)
                vocab[token] = tid
                self._tokens.append(token)
                p_slot.append(np.empty(_MIN_CAP, dtype=np.int64))
                p_tf.append(np.empty(_MIN_CAP, dtype=np.float64))
                p_n.append(0)
                df.append(0)
            tids.append(tid)
        for tid, tf in zip(tids, counts.values()):
            n = p_n[tid]
            if n == len(p_slot[tid]):
                p_slot[tid] = _grown(p_slot[tid], n + 1)
                p_tf[tid] = _grown(p_tf[tid], n + 1)
            p_slot[tid][n] = slot
            p_tf[tid][n] = tf
            p_n[tid] = n + 1
            df[tid] += 1
        if ntok:
            self._fwd_tok[start : start + ntok] = tids
            self._fwd_tf[start : start + ntok] = list(counts.values())
        self._fwd_start[slot] = start
        self._fwd_count[slot] = ntok
        self._fwd_n = start + ntok
        dl = sum(counts.values())
        self._slot_doc[slot] = doc_id
        self._slot_len[slot] = dl
        self._alive[slot] = True
        self._doc_slot[doc_id] = slot
        self._n_slots = slot + 1
        self._n_live += 1
        self._total_len += dl
        self._norm = None

    def remove(self, doc_id: int) -> None:
        """Remove a document (KeyError if absent). Its postings become tombstones."""
        doc_id = _as_doc_id(doc_id)
        slot = self._doc_slot.pop(doc_id)
        start, cnt = int(self._fwd_start[slot]), int(self._fwd_count[slot])
        df = self._df
        for tid in self._fwd_tok[start : start + cnt].tolist():
            df[tid] -= 1
        self._alive[slot] = False
        self._total_len -= int(self._slot_len[slot])
        self._n_live -= 1
        self._n_dead += 1
        self._norm = None
        if self._n_dead >= _COMPACT_MIN_DEAD and self._n_dead > self._n_live:
            self.compact()

    def compact(self) -> None:
        """Drop tombstones: renumber slots, rewrite postings, forget unused tokens."""
        n_slots = self._n_slots
        alive = self._alive[:n_slots]
        live_slots = np.flatnonzero(alive)
        n_live = len(live_slots)

        # Vocabulary: keep tokens some current document has, in old id order.
        old_df = np.asarray(self._df, dtype=np.int64)
        keep_tok = np.flatnonzero(old_df > 0)
        tok_map = np.full(len(old_df), -1, dtype=np.int64)
        tok_map[keep_tok] = np.arange(len(keep_tok), dtype=np.int64)

        tokens = [self._tokens[i] for i in keep_tok.tolist()]
        n_tok = len(tokens)

        # Forward index of live slots (entries are in slot order), token ids remapped.
        counts = self._fwd_count[:n_slots]
        entry_alive = np.repeat(alive, counts)
        fwd_tok = tok_map[self._fwd_tok[: self._fwd_n][entry_alive]]
        fwd_tf = self._fwd_tf[: self._fwd_n][entry_alive]
        live_counts = counts[live_slots]
        starts = np.zeros(n_live, dtype=np.int64)
        if n_live:
            np.cumsum(live_counts[:-1], out=starts[1:])

        # Postings rebuilt from the forward index in one vectorised pass: a stable sort
        # by token id keeps slots ascending within each token. Each token's arrays are
        # exact-size views of two shared buffers; the next append to a token copies it
        # into its own, larger array (see add), so the views are never written past.
        entry_slot = np.repeat(np.arange(n_live, dtype=np.int64), live_counts)
        order = np.argsort(fwd_tok, kind="stable")
        all_slots = entry_slot[order]
        all_tf = fwd_tf[order].astype(np.float64)
        offs = np.zeros(n_tok + 1, dtype=np.int64)
        np.cumsum(np.bincount(fwd_tok, minlength=n_tok), out=offs[1:])
        bounds = offs.tolist()
        new_p_slot = [all_slots[bounds[i] : bounds[i + 1]] for i in range(n_tok)]
        new_p_tf = [all_tf[bounds[i] : bounds[i + 1]] for i in range(n_tok)]
        new_p_n = np.diff(offs).tolist()

        cap = max(_MIN_CAP, n_live)
        self._slot_doc = _grown(self._slot_doc[live_slots], cap)
        self._slot_len = _grown(self._slot_len[live_slots], cap)
        self._alive = np.zeros(len(self._slot_doc), dtype=bool)
        self._alive[:n_live] = True
        self._fwd_start = _grown(starts, cap)
        self._fwd_count = _grown(live_counts.astype(np.int64), cap)
        fcap = max(_MIN_CAP, len(fwd_tok))
        self._fwd_tok = _grown(fwd_tok, fcap)
        self._fwd_tf = _grown(fwd_tf, fcap)
        self._fwd_n = len(fwd_tok)
        self._tokens = tokens
        self._vocab = {t: i for i, t in enumerate(tokens)}
        self._p_slot, self._p_tf, self._p_n = new_p_slot, new_p_tf, new_p_n
        self._df = old_df[keep_tok].tolist()
        self._doc_slot = dict(zip(self._slot_doc[:n_live].tolist(), range(n_live)))
        self._n_slots = n_live
        self._n_dead = 0
        self._norm = None

    # ------------------------------------------------------------------ search
    def _norms(self) -> np.ndarray:
        if self._norm is None:
            dl = self._slot_len[: self._n_slots]
            avgdl = self._total_len / self._n_live
            self._norm = self.k1 * ((1.0 - self.b) + self.b * (dl / avgdl))
        return self._norm

    def scores(self, query_tokens: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """All matching current documents: ``(doc_ids int64, scores float64)``, unordered."""
        if isinstance(query_tokens, str):
            raise TypeError("query_tokens must be a sequence of tokens, not a string")
        empty = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64))
        if self._total_len == 0:
            return empty
        vocab, df = self._vocab, self._df
        counts = Counter(t for t in query_tokens if (tid := vocab.get(t)) is not None and df[tid] > 0)
        if not counts:
            return empty
        norm = self._norms()
        acc = np.zeros(self._n_slots, dtype=np.float64)
        for token in sorted(counts):
            tid = vocab[token]
            w = counts[token] * self._idf(df[tid])
            n = self._p_n[tid]
            slots = self._p_slot[tid][:n]
            tf = self._p_tf[tid][:n]
            contrib = tf / (tf + norm[slots])
            contrib *= w
            acc[slots] += contrib  # slots are distinct within one postings list
        cand = np.flatnonzero(acc)
        if self._n_dead:
            cand = cand[self._alive[cand]]
        return self._slot_doc[cand], acc[cand]

    def search(
        self,
        query_tokens: Sequence[str],
        *,
        limit: int | None,
        allowed: Callable[[int], bool] | None = None,
        tiebreak: Callable[[int], Any] | None = None,
    ) -> list[tuple[int, float]]:
        """Best-first ``(doc_id, score)`` for documents matching any query token.

        Sorted by ``(-score, tiebreak(doc_id))`` (default tiebreak: the doc id); only
        ids with ``allowed(doc_id)`` true (all if None); at most ``limit`` (all if None).
        """
        _check_limit(limit)
        ids, scores = self.scores(query_tokens)
        return rank_candidates(ids, scores, limit=limit, allowed=allowed, tiebreak=tiebreak)
