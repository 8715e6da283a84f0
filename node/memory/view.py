"""The per-database memory view: an incremental recall index over one Database.

A :class:`MemoryView` follows one :class:`crdt.database.Database` (its ``memory`` store and
one ``embeddings:<provider>/<model>`` store, the *active* one) and answers ``recall`` exactly
as DESIGN section 7 specifies. See :mod:`node.memory.rows` for the row shapes.

Candidates
    Per memory key only the newest well-formed row in T order (``RowRecord.order``) is a
    candidate; older rows are *superseded* (they stay in the log and can be searched and listed
    with ``include_superseded=True``). The current set is a function of the set of accepted
    rows only, whatever order rows arrive in: a row is made current only if it is newer than
    the key's current row. Malformed rows (a peer with Write can store any value) are ignored,
    logged at debug, and never supersede anything.

Ranking (DESIGN 7, exactly)
    * Document text ``key + " " + value + " " + " ".join(tags)``, tokens as in
      :mod:`node.memory.tokens`; BM25 (k1=1.5, b=0.75) over the *current* rows only: a
      superseded row is removed from the inverted index, so N, df and avgdl describe current
      rows. Rows matching no query token are not in the lexical list.
    * Tags are an AND filter compared case-insensitively (``str.casefold``): a row passes when
      every requested tag is among its tags.
    * A query with no tokens (empty, or only one-character/punctuation words) returns current
      memories by recency: T order, newest first. The tag filter still applies.
    * Hybrid: when a query vector is given and the active embeddings store holds vectors of the
      query's length, the cosine list (non-positive dropped, :class:`VectorIndex`) and the BM25
      list, each taken to depth ``max(limit, 100)`` after the tag filter, are fused by
      Reciprocal Rank Fusion with k=60 and cut to ``limit``. Rows without a vector appear only
      in the BM25 list; rows with a vector but no matching token only in the cosine list.
      Without a usable query vector (none given, no active store, no vector of that length) the
      ranking is plain BM25; that fallback never errors.
    * Ties (bitwise-equal scores) are broken by T order, newest first
      (:func:`node.memory.rows.order_desc_key`), never by the local doc id, so every replica
      holding the same entries returns the same list.

Vectors
    For each current row and each vector length, the newest embedding row (T order) that
    points at it is indexed; one :class:`VectorIndex` per length, so a peer's vector of the
    wrong length can neither break recall nor displace a good vector. Pass ``dim`` to keep only
    vectors of that length (then :meth:`MemoryView.missing_vectors` also treats a row whose
    only vector has another length as missing). A vector whose memory row has not been seen
    yet is kept aside until the row arrives (an entry's embedding rows are announced before
    its memory rows); a vector of a superseded or malformed row is dropped.

Events
    ``RowsAdded`` for ``memory`` and for the active embeddings store update the view in
    O(tokens) per row; ``Rebuilt`` (verdicts changed, e.g. a revocation voided rows, or a
    payload was erased) marks it stale and the next call rebuilds it from ``db.rows``. An error
    inside the listener is logged and also leads to a rebuild; it never reaches the database.

Rebuild (on construction, e.g. the first recall after opening a node, and after ``Rebuilt``)
    In bulk: the current rows are collected first, then loaded with one
    :meth:`InvertedIndex.add_many` and one :meth:`VectorIndex.add_many` per vector length,
    with the cyclic GC paused. It gives the same recall results, bit for bit, as a view fed
    the same rows one by one (tested).

As known at an entry (``Filters.as_known_at``, node.memory.timeline)
    The rows in the causal past of the entry (it and its ancestors, ``Database.precedes``)
    are taken as the whole store: per key, the current row among them (or, with ``as_of``, the
    row that held then among them; with ``include_superseded``, every one of them) are the
    candidates, ranked over the whole history's index as ``as_of`` is; ``relations`` answer
    within that past too. The past of an entry is cached until the database changes.

``include_superseded=True`` (a rare operator option) scans: it builds a temporary index over
every well-formed row, cached until the next change of the database.

Doc ids are local ints and never leave this module. Not thread-safe: the caller serialises
access to the view and to its database.
"""
from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crdt.database import Database, Rebuilt, RowRecord, RowsAdded

from .bm25 import InvertedIndex, _release_freed_memory
from .fusion import RRF_K, rank_candidates, rrf
from .rows import (
    MEMORY_STORE,
    SUPERSEDES,
    Memory,
    MemoryInputError,
    is_embedding_store,
    order_desc_key,
    parse_embedding,
    parse_embeddings,
    parse_memory,
)
from .timeline import Filters, current_in, held_at
from .tokens import document_text, tokenize
from .vectors import VectorIndex

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "MemoryView", "RRF_DEPTH"]

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 10
MAX_LIMIT = 100
RRF_DEPTH = 100  # each list is taken to depth max(limit, RRF_DEPTH) before fusion

Order = tuple[int, str, int]
_EMPTY: frozenset[int] = frozenset()
_NEVER: Order = (-1, "", -1)  # before every row in T order
_NO_FILTERS = Filters()


def _order_of(m: Memory) -> Order:
    return m.order

_PAST_CACHE = 4  # pasts kept: each holds a reference per row of the past, so only a few


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic collections while a rebuild allocates (it makes no cycles): a full
    collection over a large heap, triggered again and again by the allocations, would
    otherwise cost more than the rebuild."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass
class _Past:
    """The memory rows in the causal past of one entry, taken as the whole store."""

    rows: list[Memory]  # every well-formed row of the past (superseded ones too)
    timelines: dict[str, list[Memory]]  # key -> its rows and tombstones in the past, newest first
    current: dict[str, Memory] = field(default_factory=dict)  # key -> its current row in the past

    def held_at(self, t: int) -> list[Memory]:
        out = []
        for key, timeline in self.timelines.items():
            m = held_at(key, timeline, t)
            if m is not None:
                out.append(m)
        return out


class _Index:
    """Lexical and vector indexes over a set of memories keyed by local doc ids."""

    def __init__(self) -> None:
        self.bm25 = InvertedIndex()
        self.mem: dict[int, Memory] = {}
        self.row_doc: dict[str, int] = {}
        self.tiebreak: list[tuple[int, int, int] | None] = []  # doc -> order_desc_key
        self.tag_docs: dict[str, set[int]] = {}  # casefolded tag -> docs carrying it
        self.alive = np.zeros(64, dtype=bool)
        self.height = np.zeros(64, dtype=np.float64)
        self.n = 0
        self.vectors: dict[int, VectorIndex] = {}  # vector length -> index
        self.vec_order: dict[tuple[int, int], Order] = {}  # (doc, length) -> order of its row

    def _reserve(self, need: int) -> None:
        if need > len(self.alive):
            alive = np.zeros(need, dtype=bool)
            alive[: self.n] = self.alive[: self.n]
            height = np.zeros(need, dtype=np.float64)
            height[: self.n] = self.height[: self.n]
            self.alive, self.height = alive, height

    def insert(self, m: Memory) -> int:
        doc = self.n
        if doc == len(self.alive):
            self._reserve(doc + 1 + doc // 2)
        self.n = doc + 1
        self.mem[doc] = m
        self.row_doc[m.row_key] = doc
        self.tiebreak.append(order_desc_key(m.order))
        for tag in {t.casefold() for t in m.tags}:
            self.tag_docs.setdefault(tag, set()).add(doc)
        self.alive[doc] = True
        self.height[doc] = m.order[0]
        self.bm25.add(doc, tokenize(document_text(m.key, m.value, m.tags)))
        return doc

    def insert_many(self, mems: Sequence[Memory]) -> None:
        """``insert`` of each memory in turn (docs n, n + 1, ...), in bulk."""
        first, count = self.n, len(mems)
        docs = range(first, first + count)
        self._reserve(first + count)
        self.n = first + count
        self.mem.update(zip(docs, mems))
        self.row_doc.update(zip((m.row_key for m in mems), docs))
        self.tiebreak.extend(order_desc_key(m.order) for m in mems)
        tag_docs = self.tag_docs
        for doc, m in zip(docs, mems):
            for tag in {t.casefold() for t in m.tags}:
                docs_of = tag_docs.get(tag)
                if docs_of is None:
                    tag_docs[tag] = {doc}
                else:
                    docs_of.add(doc)
        self.alive[first : first + count] = True
        self.height[first : first + count] = [m.order[0] for m in mems]
        self.bm25.add_many((doc, tokenize(document_text(m.key, m.value, m.tags))) for doc, m in zip(docs, mems))

    def index_vectors(self, best: dict[tuple[int, int], tuple[Order, np.ndarray]]) -> None:
        """``index_vector`` of each ``(doc, length) -> (order, vec)`` (at most one vector per
        doc and length, none indexed yet), one bulk load per length."""
        by_dim: dict[int, tuple[list[int], list[np.ndarray]]] = {}
        for (doc, dim), (order, vec) in best.items():
            docs, vecs = by_dim.setdefault(dim, ([], []))
            docs.append(doc)
            vecs.append(vec)
            self.vec_order[(doc, dim)] = order
        for dim, (docs, vecs) in by_dim.items():
            index = self.vectors.get(dim)
            if index is None:
                index = self.vectors[dim] = VectorIndex(dim)
            index.add_many(docs, vecs)

    def retire(self, doc: int) -> None:
        m = self.mem.pop(doc)
        del self.row_doc[m.row_key]
        self.bm25.remove(doc)
        self.alive[doc] = False
        self.tiebreak[doc] = None
        for tag in {t.casefold() for t in m.tags}:
            docs = self.tag_docs[tag]
            docs.discard(doc)
            if not docs:
                del self.tag_docs[tag]
        for dim, index in self.vectors.items():
            if self.vec_order.pop((doc, dim), None) is not None:
                index.remove(doc)

    def index_vector(self, doc: int, order: Order, vec: np.ndarray) -> None:
        """Index ``vec`` for ``doc`` unless a newer vector of that length is indexed."""
        dim = len(vec)
        prev = self.vec_order.get((doc, dim))
        if prev is not None and prev >= order:
            return
        index = self.vectors.get(dim)
        if index is None:
            index = self.vectors[dim] = VectorIndex(dim)
        if prev is not None:
            index.remove(doc)
        index.add(doc, vec)
        self.vec_order[(doc, dim)] = order

    def has_vector(self, doc: int, dim: int | None) -> bool:
        if dim is not None:
            return (doc, dim) in self.vec_order
        return any(doc in index for index in self.vectors.values())

    def rank(self, tokens: list[str], need: frozenset[str], limit: int,
             query_vector: np.ndarray | None,
             keep: Callable[[Memory], bool] | None = None) -> list[tuple[Memory, float]]:
        """``keep``: a further filter on the memory (category, time), applied like the tags."""
        tiebreak = self.tiebreak.__getitem__
        allowed = None
        if need:
            # AND filter: the docs carrying every requested tag (smallest set first).
            sets = sorted((self.tag_docs.get(t, _EMPTY) for t in need), key=len)
            permitted = sets[0] if len(sets) == 1 else sets[0].intersection(*sets[1:])
            if not permitted:
                return []
            allowed = permitted.__contains__
        selective = allowed is not None and 4 * len(permitted) < len(self.mem)
        if keep is not None:
            mem_of, tag_ok = self.mem.get, allowed

            def allowed(doc: int) -> bool:
                m = mem_of(doc)
                return m is not None and (tag_ok is None or tag_ok(doc)) and keep(m)
        if not tokens:
            if selective:
                # A selective filter: rank just the permitted docs (all of them current).
                ids = np.fromiter(permitted, dtype=np.int64, count=len(permitted))
                allowed = None if keep is None else allowed
            else:
                ids = np.flatnonzero(self.alive[: self.n])
            hits = rank_candidates(ids, self.height[ids], limit=limit, allowed=allowed, tiebreak=tiebreak)
        else:
            vindex = None if query_vector is None else self.vectors.get(len(query_vector))
            if vindex is None or len(vindex) == 0:
                hits = self.bm25.search(tokens, limit=limit, allowed=allowed, tiebreak=tiebreak)
            else:
                depth = max(limit, RRF_DEPTH)
                lexical = self.bm25.search(tokens, limit=depth, allowed=allowed, tiebreak=tiebreak)
                semantic = vindex.search(query_vector, limit=depth, allowed=allowed, tiebreak=tiebreak)
                if semantic:
                    hits = rrf([[d for d, _ in lexical], [d for d, _ in semantic]], RRF_K,
                               limit=limit, tiebreak=tiebreak)
                else:
                    hits = lexical[:limit]
        mem = self.mem
        return [(mem[d], float(score)) for d, score in hits]


class MemoryView:
    """Incremental recall index over one Database (its `memory` store and one embeddings store)."""

    def __init__(self, db: Database, *, embedding_store: str | None = None, dim: int | None = None) -> None:
        self._db = db
        self._store = _check_store(embedding_store)
        self._dim = _check_dim(dim)
        self._stale = True
        self._all: _Index | None = None  # include_superseded scan, cached until the next change
        self._reset()
        db.subscribe(self._on_event)
        self._rebuild()

    # --------------------------------------------------------------------------- public
    def close(self) -> None:
        """Stop following the database (a replaced view must not keep receiving events)."""
        self._db.unsubscribe(self._on_event)

    @property
    def db(self) -> Database:
        return self._db

    @property
    def embedding_store(self) -> str | None:
        return self._store

    def set_embedding_store(self, store: str | None, *, dim: int | None = None) -> None:
        """Switch the active model: rebuild the vector index from ``store`` (None: no vectors)."""
        self._store = _check_store(store)
        self._dim = _check_dim(dim)
        self._all = None
        if not self._stale:
            self._load_vectors()
            _release_freed_memory()

    def recall(
        self,
        query: str = "",
        *,
        tags: Sequence[str] = (),
        limit: int = DEFAULT_LIMIT,
        query_vector: np.ndarray | None = None,
        include_superseded: bool = False,
        with_scores: bool = False,
        filters: Filters | None = None,
    ) -> list[Memory] | list[tuple[Memory, float]]:
        """Best-first memories for ``query`` (see the module docstring for the exact rules);
        ``with_scores``: (memory, score) pairs, the score that ranked it (BM25, or RRF when fused).

        ``filters`` (node.memory.timeline): category, min_confidence, a period, the caller's
        now; with ``as_of``, the candidates are the rows that held then (one per key at most),
        ranked over the whole history's index."""
        if query is None:
            query = ""
        if not isinstance(query, str):
            raise MemoryInputError(f"query must be a string, got {type(query).__name__}")
        need = _check_filter_tags(tags)
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or not 1 <= limit <= MAX_LIMIT:
            raise MemoryInputError(f"limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}")
        qv = _check_query_vector(query_vector)
        if qv is not None and self._dim is not None and len(qv) != self._dim:
            log.warning("query vector has %d values, the active embeddings store %s holds %d: lexical recall only",
                        len(qv), self._store, self._dim)
            qv = None
        tokens = tokenize(query)
        keep = None
        past = None if filters is None or filters.as_known_at is None else self.past(filters.as_known_at)
        if filters is not None and (filters.as_of is not None or past is not None):
            if filters.as_of is not None:
                chosen = self.held_at(filters.as_of) if past is None else past.held_at(filters.as_of)
            else:
                chosen = past.rows if include_superseded else past.current.values()
            index = self._scan()
            held = {m.row_key for m in chosen}
            keep = lambda m: m.row_key in held and filters.keep(m)  # noqa: E731
        else:
            index = self._scan() if include_superseded else self._current_index()
            if filters is not None and filters != _NO_FILTERS:
                keep = filters.keep
        hits = index.rank(tokens, need, int(limit), qv, keep)
        return hits if with_scores else [m for m, _score in hits]

    def current(self, key: str) -> Memory | None:
        """The current row of a memory key (newest in T order, not retired), or None."""
        ix = self._current_index()
        doc = self._current.get(key)
        return None if doc is None else ix.mem[doc]

    def timeline(self, key: str) -> list[Memory]:
        """The key's rows and the tombstones naming it, newest first in T order."""
        self._current_index()
        rows = self._history.get(key, []) + self._tombs.get(key, [])
        return sorted(rows, key=lambda m: m.order, reverse=True)

    def held_at(self, t: int) -> list[Memory]:
        """Per key, the row that held at world time ``t`` (node.memory.timeline.held_at)."""
        self._current_index()
        out = []
        for key in self._history:
            m = held_at(key, self.timeline(key), t)
            if m is not None:
                out.append(m)
        return out

    def past(self, entry_id: str) -> _Past:
        """The store as the causal past of ``entry_id`` (an entry of this database) knew it;
        MemoryInputError if the database holds no such entry."""
        if not isinstance(entry_id, str) or self._db.entry(entry_id) is None:
            raise MemoryInputError(f"as_known_at: this bank holds no entry {entry_id!r} "
                                   "(an entry id of this bank, as recall and remember return it)")
        index = self._scan()  # the past is cached with the scan: both last until the next change
        if self._pasts[0] is not index:
            self._pasts = (index, {})
        cached = self._pasts[1].get(entry_id)
        if cached is not None:
            return cached
        db = self._db
        # One causal check per entry, not per row (an entry often carries many rows).
        known = {i: i == entry_id or db.precedes(i, entry_id)
                 for rows_ in self._history.values() for i in {m.entry_id for m in rows_}}
        rows: list[Memory] = []
        timelines: dict[str, list[Memory]] = {}
        current: dict[str, Memory] = {}
        tombs = self._tombs
        order = _order_of
        with _gc_paused():
            # A key with tombstones only never held anything in this past: only keys with rows.
            for key, history in self._history.items():
                mine = [m for m in history if known[m.entry_id]]
                if not mine:
                    continue
                rows += mine
                timeline = mine + [m for m in tombs[key] if known.get(m.entry_id, False)] if key in tombs else mine
                if len(timeline) > 1:
                    timeline.sort(key=order, reverse=True)
                timelines[key] = timeline
                cur = current_in(key, timeline)
                if cur is not None:
                    current[key] = cur
        past = _Past(rows, timelines, current)
        if len(self._pasts[1]) >= _PAST_CACHE:
            self._pasts[1].pop(next(iter(self._pasts[1])))
        self._pasts[1][entry_id] = past
        return past

    def relations(self, m: Memory, as_known_at: str | None = None) -> dict[str, Any]:
        """``superseded_by`` (the next row of m's timeline, when m is not current) and
        ``conflicts`` (rows of m's key concurrent with m: neither entry in the other's causal
        past), as result fields; empty when there are none. With ``as_known_at``: within the
        causal past of that entry."""
        out: dict[str, Any] = {}
        if as_known_at is None:
            timeline, current = self.timeline(m.key), self.current(m.key)
        else:
            past = self.past(as_known_at)
            timeline, current = past.timelines.get(m.key, []), past.current.get(m.key)
        if current != m:
            newer = [r for r in timeline if r.order > m.order]
            if newer:
                out["superseded_by"] = {"key": newer[-1].key, "entry": newer[-1].entry_id}
        db = self._db
        conflicts = [
            {"value": r.value, "entry": r.entry_id, "written_by": r.author}
            for r in timeline
            if r.key == m.key and r.entry_id != m.entry_id
            and not db.precedes(r.entry_id, m.entry_id) and not db.precedes(m.entry_id, r.entry_id)
        ]
        if conflicts:
            out["conflicts"] = conflicts
        return out

    def memories(self, *, include_superseded: bool = False) -> list[Memory]:
        """Current memories (every well-formed row with include_superseded), newest first."""
        index = self._scan() if include_superseded else self._current_index()
        return sorted(index.mem.values(), key=lambda m: m.order, reverse=True)

    def missing_vectors(self) -> list[Memory]:
        """Current memories with no vector in the active embeddings store, newest first."""
        index = self._current_index()
        if self._store is None:
            return sorted(index.mem.values(), key=lambda m: m.order, reverse=True)
        out = [m for doc, m in index.mem.items() if not index.has_vector(doc, self._dim)]
        out.sort(key=lambda m: m.order, reverse=True)
        return out

    def has_vectors(self) -> bool:
        """Whether some current memory has a vector in the active embeddings store."""
        return any(len(v) for v in self._current_index().vectors.values())

    def __len__(self) -> int:
        return len(self._current_index().mem)

    # ---------------------------------------------------------------------------- state
    def _reset(self) -> None:
        self._ix = _Index()
        self._current: dict[str, int] = {}  # memory key -> doc of its current row
        self._history: dict[str, list[Memory]] = {}  # memory key -> every well-formed row of it
        self._tombs: dict[str, list[Memory]] = {}  # key -> rows of other keys superseding it
        self._newest: dict[str, Memory] = {}  # key -> its newest row (current unless retired)
        self._retired: dict[str, Order] = {}  # key -> T order of the newest tombstone naming it
        self._seen: set[str] = set()  # row keys of every memory row seen (malformed ones too)
        self._pending: dict[str, dict[int, tuple[Order, np.ndarray]]] = {}  # row -> length -> vec
        self._pasts: tuple[_Index | None, dict[str, _Past]] = (None, {})  # the scan they belong to

    def _current_index(self) -> _Index:
        if self._stale:
            self._rebuild()
        return self._ix

    def _rebuild(self) -> None:
        # Bulk: collect the current rows first, then one bulk load per index. The result is
        # the state that feeding the rows one by one would give (tested).
        self._stale = True
        self._all = None
        self._reset()
        with _gc_paused():
            newest = self._newest
            seen = self._seen
            for rec in self._db.rows(MEMORY_STORE):
                seen.add(rec.key)
                m = parse_memory(rec)
                if m is not None:
                    self._note(m)
                    cur = newest.get(m.key)
                    if cur is None or m.order > cur.order:
                        newest[m.key] = m
            retired = self._retired
            current = sorted((m for m in newest.values() if retired.get(m.key, _NEVER) < m.order),
                             key=lambda m: m.order)
            first = self._ix.n
            self._ix.insert_many(current)
            self._current = {m.key: doc for doc, m in enumerate(current, first)}
            self._load_vectors()
        self._stale = False
        _release_freed_memory()

    def _load_vectors(self) -> None:
        ix = self._ix
        ix.vectors = {}
        ix.vec_order = {}
        self._pending = {}
        if self._store is None:
            return
        with _gc_paused():
            records = self._db.rows(self._store)
            best: dict[tuple[int, int], tuple[Order, np.ndarray]] = {}
            row_doc, seen, pending = ix.row_doc, self._seen, self._pending
            for rec, parsed in zip(records, parse_embeddings(records, self._dim)):
                if parsed is None:
                    continue
                row, vec = parsed
                doc = row_doc.get(row)
                if doc is not None:  # the newest vector of each length (as index_vector)
                    key = (doc, len(vec))
                    prev = best.get(key)
                    if prev is None or prev[0] < rec.order:
                        best[key] = (rec.order, vec)
                elif row not in seen:  # as _add_vector
                    slot = pending.setdefault(row, {})
                    prev = slot.get(len(vec))
                    if prev is None or prev[0] < rec.order:
                        slot[len(vec)] = (rec.order, vec)
            del records
            ix.index_vectors(best)

    def _on_event(self, event: RowsAdded | Rebuilt) -> None:
        # Runs inside the database's ingest: it must never raise.
        if self._stale:
            return
        try:
            if isinstance(event, Rebuilt):
                self._stale = True
                self._all = None
            elif isinstance(event, RowsAdded):
                if event.store == MEMORY_STORE:
                    self._all = None
                    for rec in event.rows:
                        self._add_memory(rec)
                elif event.store == self._store:
                    self._all = None
                    for rec in event.rows:
                        self._add_vector(rec)
        except Exception:  # noqa: BLE001 - a bug here must not fail the database's write
            log.exception("memory view of %s failed to apply an update; it will be rebuilt", self._db.id)
            self._stale = True
            self._all = None

    def _add_memory(self, rec: RowRecord) -> None:
        if rec.key in self._seen:
            return
        self._seen.add(rec.key)
        pending = self._pending.pop(rec.key, None)
        m = parse_memory(rec)
        if m is None:
            return
        for target in self._note(m):
            cur = self._current.get(target)
            if cur is not None and self._ix.mem[cur].order < m.order:
                self._ix.retire(cur)  # retired by a newer row's supersedes edge
                del self._current[target]
        newest = self._newest.get(m.key)
        if newest is not None and newest.order >= m.order:
            return  # an older row arriving late: superseded from the start
        self._newest[m.key] = m
        cur = self._current.pop(m.key, None)
        if cur is not None:
            self._ix.retire(cur)
        if self._retired.get(m.key, _NEVER) > m.order:
            return  # a newer row of another key retired this key
        doc = self._current[m.key] = self._ix.insert(m)
        if pending:
            for order, vec in pending.values():
                self._ix.index_vector(doc, order, vec)

    def _note(self, m: Memory) -> list[str]:
        """Record m in its key's history and as a tombstone of the other keys it supersedes;
        returns those keys."""
        self._history.setdefault(m.key, []).append(m)
        targets = []
        for edge in m.edges:
            if edge.type == SUPERSEDES and edge.to != m.key and edge.to not in targets:
                targets.append(edge.to)
                self._tombs.setdefault(edge.to, []).append(m)
                if self._retired.get(edge.to, _NEVER) < m.order:
                    self._retired[edge.to] = m.order
        return targets

    def _add_vector(self, rec: RowRecord) -> None:
        parsed = parse_embedding(rec, self._dim)
        if parsed is None:
            return
        row, vec = parsed
        doc = self._ix.row_doc.get(row)
        if doc is not None:
            self._ix.index_vector(doc, rec.order, vec)
        elif row not in self._seen:
            slot = self._pending.setdefault(row, {})
            prev = slot.get(len(vec))
            if prev is None or prev[0] < rec.order:
                slot[len(vec)] = (rec.order, vec)
        # else: the row is superseded or malformed; only a rebuild could make it current again

    def _scan(self) -> _Index:
        """An index over every well-formed memory row (superseded ones too)."""
        if self._stale:
            self._rebuild()
        if self._all is None:
            ix = _Index()
            with _gc_paused():
                ix.insert_many([m for rec in self._db.rows(MEMORY_STORE) if (m := parse_memory(rec)) is not None])
                if self._store is not None:
                    records = self._db.rows(self._store)
                    best: dict[tuple[int, int], tuple[Order, np.ndarray]] = {}
                    for rec, parsed in zip(records, parse_embeddings(records, self._dim)):
                        if parsed is not None and (doc := ix.row_doc.get(parsed[0])) is not None:
                            key = (doc, len(parsed[1]))
                            prev = best.get(key)
                            if prev is None or prev[0] < rec.order:
                                best[key] = (rec.order, parsed[1])
                    ix.index_vectors(best)
            self._all = ix
            _release_freed_memory()
        return self._all


def _check_store(store: Any) -> str | None:
    if store is None:
        return None
    if not is_embedding_store(store):
        raise MemoryInputError(f"{store!r} is not an embeddings store name (embeddings:<provider>/<model>)")
    return store


def _check_dim(dim: Any) -> int | None:
    if dim is None:
        return None
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise MemoryInputError(f"dim must be a positive integer, got {dim!r}")
    return int(dim)


def _check_filter_tags(tags: Any) -> frozenset[str]:
    if tags is None:
        return frozenset()
    if isinstance(tags, (str, bytes)) or not isinstance(tags, Sequence):
        raise MemoryInputError(f"tags must be a list of strings, got {type(tags).__name__}")
    for tag in tags:
        if not isinstance(tag, str) or not tag:
            raise MemoryInputError("every tag to filter by must be a non-empty string")
    return frozenset(t.casefold() for t in tags)


def _check_query_vector(vector: Any) -> np.ndarray | None:
    if vector is None:
        return None
    arr = np.asarray(vector)
    if arr.ndim != 1 or arr.size == 0 or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    ):
        raise MemoryInputError(f"query_vector must be a non-empty 1-d array of numbers, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise MemoryInputError("query_vector has NaN or infinite values")
    return arr
