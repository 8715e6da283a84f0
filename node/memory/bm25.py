"""Incremental BM25 inverted index (docs/memory.md, "Ranking": lexical).

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

Data layout (no full scan per query, no per-token Python objects beyond the vocabulary):

* vocabulary ``token -> token id`` and per token id its live df (a Python list);
* postings in two parts. The *main* part is one shared CSR layout: an offsets array over
  token ids and two flat arrays, document slots (int64) and tf (the narrowest unsigned
  integer type that holds the largest tf; converted to float64 exactly when scored). The
  *tail* holds the postings added since the main part was last built: per token one
  :class:`array.array` of int64 (slot, tf, slot, tf, ...). When the tail holds more than
  ``_MERGE_MIN`` entries and more than an eighth of the main part, the main part is
  rebuilt from the forward index in one vectorised pass and the tail emptied (amortised
  O(1) per posting; bulk loads and compaction rebuild it too). So a token costs its
  vocabulary entry, its df and one offset, not a pair of numpy arrays. Measured at 100k
  chit-chat memories (133k distinct words, 1.67M postings): 128 MiB with an array pair
  per word, 51 MiB in this layout after a bulk load, 59 MiB when built one document at a
  time. A query token with a tail costs one more vectorised pass: an index built one
  document at a time searches about 1% slower than with per-word arrays, a bulk-loaded
  one about 4% faster;
* per document slot: doc id, length, alive flag, and its (token id, tf) pairs in a flat
  forward index of int32 (needed to update df on removal, to compact and to rebuild the
  main postings);
* removal marks the slot dead (tombstone) and leaves its postings in place; dead slots
  are filtered out of the candidates (and dropped from the main part when it is rebuilt).
  When dead slots outnumber both live ones and 1024, :meth:`InvertedIndex.compact`
  renumbers slots, rewrites postings and drops tokens that no current document has
  (amortised O(1) per removal);
* :meth:`InvertedIndex.add_many` loads many documents at once (a view built from the
  database): tokens are mapped to ids in one pass, (document, token) pairs counted with
  one sort, and the main postings built with one more; searches then return what they
  would after adding the documents one by one, scores bit for bit (tested);
* per query: a dense float64 score array over slots, one vectorised pass per distinct
  query token over its postings (main part, then tail: a slot is in only one of them, so
  each slot still receives its terms in sorted token order) (gather length norm, compute
  tfc, scatter-add), then top-k selection with numpy
  (:func:`node.memory.fusion.rank_candidates`). The per-slot length norm
  ``k1 * ((1 - b) + b * (dl / avgdl))`` is cached until the next mutation.

Subsets of the documents with their own statistics: node/memory/bm25_subset.py.

Not thread-safe: callers serialise access (one writer or reader at a time).
"""
from __future__ import annotations

import math
from array import array
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from itertools import chain, count, islice
from typing import Any

import numpy as np

from .arrays import EMPTY_I64, MIN_CAP, as_doc_id, group_order, grown, resized, tf_dtype
from .bm25_subset import Subset
from .fusion import _check_limit, rank_candidates
from .heap import release_freed_memory
from .str_ids import StrIds

__all__ = ["B", "K1", "InvertedIndex", "Subset"]

K1 = 1.5
B = 0.75

_COMPACT_MIN_DEAD = 1024
_MERGE_MIN = 4096  # tail postings tolerated before the main postings are rebuilt ...
_MERGE_FRACTION = 8  # ... and more than this fraction (1/8) of the main part
_BULK_DOCS = 4096  # documents tokenised and mapped to ids per step of add_many
_STR = {str}


class InvertedIndex:
    """Incremental BM25 index over integer doc ids (see module docstring)."""

    def __init__(self, k1: float = K1, b: float = B) -> None:
        self.k1 = float(k1)
        self.b = float(b)
        self._vocab = StrIds()  # token <-> token id
        self._df: list[int] = []  # live document frequency
        # Main postings (CSR): token id t < len(_offs) - 1 owns [_offs[t], _offs[t + 1]).
        self._offs = np.zeros(1, dtype=np.int64)
        self._c_slot = EMPTY_I64
        self._c_tf: np.ndarray = np.empty(0, dtype=np.uint8)
        # Tail postings (added since the main part was built): token id -> (slots, tf).
        self._tail: dict[int, array] = {}  # interleaved slot, tf, slot, tf, ... (int64)
        self._n_tail = 0
        self._doc_slot_of: dict[int, int] | None = {}  # None: to be made from the slots (unpickled)
        self._n_slots = 0
        self._slot_doc = np.empty(MIN_CAP, dtype=np.int64)
        self._slot_len = np.empty(MIN_CAP, dtype=np.float64)
        self._alive = np.zeros(MIN_CAP, dtype=bool)
        self._fwd_start = np.empty(MIN_CAP, dtype=np.int64)
        self._fwd_count = np.empty(MIN_CAP, dtype=np.int32)
        self._fwd_tok = np.empty(MIN_CAP, dtype=np.int32)
        self._fwd_tf = np.empty(MIN_CAP, dtype=np.int32)
        self._fwd_n = 0
        self._n_live = 0
        self._n_dead = 0
        self._total_len = 0
        self._norm: np.ndarray | None = None
        self._subsets: list[Subset] = []  # subsets with their own statistics (see Subset)

    @property
    def _tokens(self) -> list[str]:
        """token id -> token (read only)."""
        return self._vocab.strings

    @property
    def _doc_slot(self) -> dict[int, int]:
        """doc id -> its live slot: the inverse of the live slots' doc ids, kept as a dict for
        writes; a snapshot (node/memory/snapshot.py) does not hold it, an opened view makes it on
        its first change."""
        if self._doc_slot_of is None:
            live = np.flatnonzero(self._alive[: self._n_slots])
            self._doc_slot_of = dict(zip(self._slot_doc[live].tolist(), live.tolist()))
        return self._doc_slot_of

    @_doc_slot.setter
    def _doc_slot(self, value: dict[int, int]) -> None:
        self._doc_slot_of = value

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_doc_slot_of": None}

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return self._n_live

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._doc_slot

    @property
    def avgdl(self) -> float:
        """Average token count of the current documents (0.0 when empty)."""
        return self._total_len / self._n_live if self._n_live else 0.0

    def vocabulary(self) -> list[str]:
        """Every token ever indexed (some may have no live document now)."""
        return list(self._vocab.strings)

    def df(self, token: str) -> int:
        """Number of current documents containing ``token``."""
        tid = self._vocab.get(token)
        return 0 if tid is None else self._df[tid]

    def idf(self, token: str) -> float:
        """``ln(1 + (N - df + 0.5) / (df + 0.5))`` for a token with df > 0, else 0.0."""
        df = self.df(token)
        return self._idf(df) if df else 0.0

    def _idf(self, df: int, n: int | None = None) -> float:
        n = self._n_live if n is None else n
        return math.log(1.0 + (n - df + 0.5) / (df + 0.5))

    def nbytes(self) -> int:
        """Bytes held by the index's numpy arrays and tail arrays (not the vocabulary)."""
        arrays = (self._offs, self._c_slot, self._c_tf, self._slot_doc, self._slot_len, self._alive,
                  self._fwd_start, self._fwd_count, self._fwd_tok, self._fwd_tf)
        tail = sum(t.itemsize * t.buffer_info()[1] for t in self._tail.values())
        return sum(a.nbytes for a in arrays) + tail

    # ---------------------------------------------------------------- mutation
    def _reserve_slots(self, need: int, exact: bool = False) -> None:
        if need <= len(self._slot_doc):
            return
        grow = (lambda a: resized(a, need)) if exact else (lambda a: grown(a, need))
        self._slot_doc = grow(self._slot_doc)
        self._slot_len = grow(self._slot_len)
        alive = np.zeros(len(self._slot_doc), dtype=bool)
        alive[: self._n_slots] = self._alive[: self._n_slots]
        self._alive = alive
        self._fwd_start = grow(self._fwd_start)
        self._fwd_count = grow(self._fwd_count)

    def _reserve_fwd(self, need: int, exact: bool = False) -> None:
        if need <= len(self._fwd_tok):
            return
        grow = (lambda a: resized(a, need)) if exact else (lambda a: grown(a, need))
        self._fwd_tok = grow(self._fwd_tok)
        self._fwd_tf = grow(self._fwd_tf)

    def add(self, doc_id: int, tokens: Sequence[str]) -> None:
        """Index a document. ``doc_id`` must not be present (remove it first)."""
        doc_id = as_doc_id(doc_id)
        if doc_id in self._doc_slot:
            raise ValueError(f"doc_id {doc_id} is already indexed")
        if isinstance(tokens, str):
            raise TypeError("tokens must be a sequence of tokens, not a string")
        counts = Counter(tokens)
        if {*map(type, counts)} - _STR and not all(isinstance(t, str) for t in counts):
            raise TypeError("tokens must be strings")
        slot = self._n_slots
        self._reserve_slots(slot + 1)
        ntok = len(counts)
        start = self._fwd_n
        self._reserve_fwd(start + ntok)
        vocab, df, tail = self._vocab.as_dict(), self._df, self._tail
        tids = []
        for token, tf in counts.items():
            tid = vocab.get(token)
            if tid is None:
                tid = self._vocab.add(token)
                df.append(0)
            df[tid] += 1
            t = tail.get(tid)
            if t is None:
                tail[tid] = array("q", (slot, tf))
            else:
                t.append(slot)
                t.append(tf)
            tids.append(tid)
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
        self._n_tail += ntok
        if self._n_tail > _MERGE_MIN and self._n_tail * _MERGE_FRACTION > len(self._c_slot):
            self._rebuild_postings()
            release_freed_memory()

    def add_many(self, docs: Iterable[tuple[int, Sequence[str]]]) -> None:
        """Index many documents at once: searches then answer as after ``add`` of each in turn.

        Each doc id must be new (to the index and within ``docs``); nothing is added if any
        document is refused. The main postings are rebuilt (O(all postings)), so this is for
        loads of many documents, not for one or two.
        """
        first_tid = len(self._tokens)
        # Token ids are given by a copy of the vocabulary that numbers new tokens as they
        # first occur (the order add gives them ids in); the index is left untouched until
        # every document has been accepted.
        tid_of: defaultdict[str, int] = defaultdict(count(first_tid).__next__, self._vocab.as_dict())
        ids: list[int] = []
        lens_parts: list[np.ndarray] = []
        tid_parts: list[np.ndarray] = []
        it = iter(docs)
        # Chunks of documents: their token lists are freed before the next are made (the
        # tokens of every document at once would double the heap, which then stays).
        while chunk := list(islice(it, _BULK_DOCS)):
            lists: list[Sequence[str]] = []
            for doc_id, tokens in chunk:
                ids.append(as_doc_id(doc_id))
                if isinstance(tokens, str):
                    raise TypeError("tokens must be a sequence of tokens, not a string")
                lists.append(tokens if isinstance(tokens, (list, tuple)) else list(tokens))
            del chunk
            lens_parts.append(np.fromiter(map(len, lists), dtype=np.int64, count=len(lists)))
            flat = list(chain.from_iterable(lists))
            del lists
            known = len(tid_of)
            tid_parts.append(np.fromiter(map(tid_of.__getitem__, flat), dtype=np.int64, count=len(flat)))
            del flat
            if len(tid_of) > known:
                new = list(islice(tid_of, known, None))
                if {*map(type, new)} - _STR and not all(isinstance(t, str) for t in new):
                    raise TypeError("tokens must be strings")
        n = len(ids)
        if len(set(ids)) != n or not self._doc_slot.keys().isdisjoint(ids):
            seen: set[int] = set()
            for d in ids:
                if d in self._doc_slot or d in seen:
                    raise ValueError(f"doc_id {d} is already indexed")
                seen.add(d)
        if n == 0:
            return
        new = list(islice(tid_of, first_tid, None))
        del tid_of
        self._vocab.extend(new)
        del new
        lens = np.concatenate(lens_parts)
        tids = np.concatenate(tid_parts)
        del lens_parts, tid_parts
        n_tok = len(self._tokens)

        # (document, token) pairs with their counts: one sort of the packed pairs.
        doc_of = np.repeat(np.arange(n, dtype=np.int64), lens)
        if n * n_tok < 2**62:
            pairs = doc_of * n_tok + tids
            pairs.sort()
            del doc_of, tids
            if len(pairs):
                first = np.flatnonzero(np.concatenate(([True], pairs[1:] != pairs[:-1])))
                e_doc, e_tok = np.divmod(pairs[first], n_tok)
                e_tf = np.diff(np.append(first, len(pairs)))
            else:
                e_doc = e_tok = e_tf = EMPTY_I64
        else:  # pragma: no cover - needs ~2**31 documents x tokens
            order = np.lexsort((tids, doc_of))
            docs, toks = doc_of[order], tids[order]
            first = np.flatnonzero(np.concatenate(([True], (docs[1:] != docs[:-1]) | (toks[1:] != toks[:-1]))))
            e_doc, e_tok = docs[first], toks[first]
            e_tf = np.diff(np.append(first, len(docs)))
        per_doc = np.bincount(e_doc, minlength=n)
        df = np.bincount(e_tok, minlength=n_tok)
        df[:first_tid] += np.asarray(self._df, dtype=np.int64)
        self._df = df.tolist()

        # Slots first .. first + n - 1 in the given order; forward entries in slot order.
        s0, f0, n_e = self._n_slots, self._fwd_n, len(e_tok)
        self._reserve_slots(s0 + n, exact=True)
        self._reserve_fwd(f0 + n_e, exact=True)
        self._slot_doc[s0 : s0 + n] = ids
        self._slot_len[s0 : s0 + n] = lens
        self._alive[s0 : s0 + n] = True
        starts = np.empty(n, dtype=np.int64)
        starts[0] = f0
        np.cumsum(per_doc[:-1], out=starts[1:])
        starts[1:] += f0
        self._fwd_start[s0 : s0 + n] = starts
        self._fwd_count[s0 : s0 + n] = per_doc
        self._fwd_tok[f0 : f0 + n_e] = e_tok
        self._fwd_tf[f0 : f0 + n_e] = e_tf
        self._fwd_n = f0 + n_e
        self._doc_slot.update(zip(ids, range(s0, s0 + n)))
        self._n_slots = s0 + n
        self._n_live += n
        self._total_len += int(lens.sum())
        self._norm = None
        self._rebuild_postings()

    def remove(self, doc_id: int) -> None:
        """Remove a document (KeyError if absent). Its postings become tombstones."""
        doc_id = as_doc_id(doc_id)
        slot = self._doc_slot[doc_id]
        if any(sub._has_slot(slot) for sub in self._subsets):
            raise ValueError(f"doc_id {doc_id} is in a subset: remove it from the subset first")
        del self._doc_slot[doc_id]
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

    def _rebuild_postings(self) -> None:
        """Main postings from the forward index (dead slots left out); empty tail."""
        n_slots, fwd_n = self._n_slots, self._fwd_n
        counts = self._fwd_count[:n_slots]
        tok = self._fwd_tok[:fwd_n]
        tf = self._fwd_tf[:fwd_n]
        entry_slot = np.repeat(np.arange(n_slots, dtype=np.int64), counts)
        if self._n_dead:
            keep = np.repeat(self._alive[:n_slots], counts)
            tok, tf, entry_slot = tok[keep], tf[keep], entry_slot[keep]
        self._set_postings(tok, tf, entry_slot)

    def _set_postings(self, tok: np.ndarray, tf: np.ndarray, entry_slot: np.ndarray) -> None:
        """Main postings from entries (token id, tf, slot) listed in slot order."""
        n_tok = len(self._tokens)
        tok = tok.astype(np.int64)
        order = group_order(tok)  # stable: slots stay ascending within each token
        self._c_slot = entry_slot[order]
        self._c_tf = tf[order].astype(tf_dtype(int(tf.max()) if len(tf) else 0))
        offs = np.zeros(n_tok + 1, dtype=np.int64)
        np.cumsum(np.bincount(tok, minlength=n_tok), out=offs[1:])
        self._offs = offs
        self._tail = {}
        self._n_tail = 0

    def compact(self) -> None:
        """Drop tombstones: renumber slots, rewrite postings, forget unused tokens."""
        n_slots = self._n_slots
        alive = self._alive[:n_slots]
        live_slots = np.flatnonzero(alive)
        n_live = len(live_slots)

        # Vocabulary: keep tokens some current document has, in old id order.
        old_df = np.asarray(self._df, dtype=np.int64)
        keep_tok = np.flatnonzero(old_df > 0)
        tok_map = np.full(len(old_df), -1, dtype=np.int32)
        tok_map[keep_tok] = np.arange(len(keep_tok), dtype=np.int32)
        tokens = [self._tokens[i] for i in keep_tok.tolist()]

        # Forward index of live slots (entries are in slot order), token ids remapped.
        counts = self._fwd_count[:n_slots]
        entry_alive = np.repeat(alive, counts)
        fwd_tok = tok_map[self._fwd_tok[: self._fwd_n][entry_alive]]
        fwd_tf = self._fwd_tf[: self._fwd_n][entry_alive]
        live_counts = counts[live_slots]
        starts = np.zeros(n_live, dtype=np.int64)
        if n_live:
            np.cumsum(live_counts[:-1], out=starts[1:])

        cap = max(MIN_CAP, n_live)
        self._slot_doc = resized(self._slot_doc[live_slots], cap)
        self._slot_len = resized(self._slot_len[live_slots], cap)
        self._alive = np.zeros(cap, dtype=bool)
        self._alive[:n_live] = True
        self._fwd_start = resized(starts, cap)
        self._fwd_count = resized(live_counts, cap)
        fcap = max(MIN_CAP, len(fwd_tok))
        self._fwd_tok = resized(fwd_tok, fcap)
        self._fwd_tf = resized(fwd_tf, fcap)
        self._fwd_n = len(fwd_tok)
        self._vocab = StrIds(tokens)
        self._df = old_df[keep_tok].tolist()
        self._doc_slot = dict(zip(self._slot_doc[:n_live].tolist(), range(n_live)))
        self._n_slots = n_live
        self._n_dead = 0
        self._norm = None
        self._set_postings(fwd_tok, fwd_tf, np.repeat(np.arange(n_live, dtype=np.int64), live_counts))
        for sub in self._subsets:
            sub._renumbered(live_slots, keep_tok, cap)
        release_freed_memory()

    # ------------------------------------------------------------------ search
    def _norms(self) -> np.ndarray:
        if self._norm is None:
            dl = self._slot_len[: self._n_slots]
            avgdl = self._total_len / self._n_live
            self._norm = self.k1 * ((1.0 - self.b) + self.b * (dl / avgdl))
        return self._norm

    def scores(self, query_tokens: Sequence[str], subset: Subset | None = None) -> tuple[np.ndarray, np.ndarray]:
        """All matching current documents: ``(doc_ids int64, scores float64)``, unordered.

        ``subset``: only its documents, scored with its own statistics (N, df, avgdl)."""
        if isinstance(query_tokens, str):
            raise TypeError("query_tokens must be a sequence of tokens, not a string")
        empty = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64))
        if subset is None:
            n_live, total, df = self._n_live, self._total_len, self._df
        else:
            subset._check_owner(self)
            subset._room()  # the index may have grown since the subset last changed
            n_live, total, df = subset._n, subset._total, subset._df
        if total == 0:
            return empty
        vocab = self._vocab
        n_df = len(df)
        counts = Counter(t for t in query_tokens
                         if (tid := vocab.get(t)) is not None and tid < n_df and df[tid] > 0)
        if not counts:
            return empty
        norm = self._norms() if subset is None else subset._norms()
        acc = np.zeros(self._n_slots, dtype=np.float64)
        offs, c_slot, c_tf, tail = self._offs, self._c_slot, self._c_tf, self._tail
        n_main = len(offs) - 1
        for token in sorted(counts):
            tid = vocab[token]
            w = counts[token] * self._idf(df[tid], n_live)
            parts = []
            if tid < n_main:
                a, b = offs[tid : tid + 2].tolist()
                if a < b:
                    parts.append((c_slot[a:b], c_tf[a:b]))
            t = tail.get(tid)
            if t is not None:
                pairs = np.array(t, dtype=np.int64)
                parts.append((pairs[0::2], pairs[1::2]))
            # A slot is in one part only, so it still gets its terms in sorted token order.
            for slots, tf in parts:
                contrib = tf / (tf + norm[slots])  # tf converted to float64 exactly
                contrib *= w
                acc[slots] += contrib  # slots are distinct within one postings list
        # nonzero() of a boolean array is several times faster than of a float one.
        hit = acc != 0.0
        if subset is not None:
            hit &= subset._in[: self._n_slots]  # members of a subset are live documents
        elif self._n_dead:
            hit &= self._alive[: self._n_slots]
        cand = np.flatnonzero(hit)
        return self._slot_doc[cand], acc[cand]

    def search(
        self,
        query_tokens: Sequence[str],
        *,
        limit: int | None,
        allowed: Callable[[int], bool] | None = None,
        tiebreak: Callable[[int], Any] | None = None,
        mask: np.ndarray | None = None,
        subset: Subset | None = None,
    ) -> list[tuple[int, float]]:
        """Best-first ``(doc_id, score)`` for documents matching any query token.

        Sorted by ``(-score, tiebreak(doc_id))`` (default tiebreak: the doc id); only
        ids with ``allowed(doc_id)`` true (all if None) and, with ``mask`` (a boolean array
        indexed by doc id, covering every doc id), only ids where it is true; at most
        ``limit`` (all if None). ``subset``: only its documents, with its statistics.
        """
        _check_limit(limit)
        ids, scores = self.scores(query_tokens, subset)
        if mask is not None and len(ids):
            keep = mask[ids]
            ids, scores = ids[keep], scores[keep]
        return rank_candidates(ids, scores, limit=limit, allowed=allowed, tiebreak=tiebreak)
