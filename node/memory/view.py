"""The per-database memory view: an incremental recall index over one Database.

A :class:`MemoryView` follows one :class:`crdt.database.Database` (its ``memory`` store and
one ``embeddings:<provider>/<model>`` store, the *active* one) and answers ``recall`` exactly
as docs/memory.md ("Ranking") specifies. See :mod:`node.memory.rows` for the row shapes.

Candidates
    Per memory key only the newest well-formed row in T order (``RowRecord.order``) is a
    candidate; older rows are *superseded* (they stay in the log and can be searched and listed
    with ``include_superseded=True``). The current set is a function of the set of accepted
    rows only, whatever order rows arrive in: a row is made current only if it is newer than
    the key's current row. Malformed rows (a peer with Write can store any value) are ignored,
    logged at debug, and never supersede anything.

Ranking (docs/memory.md, exactly)
    * Document text ``key + " " + value + " " + " ".join(tags)``, tokens as in
      :mod:`node.memory.tokens`; BM25 (k1=1.5, b=0.75) over the *current* rows only: N, df and
      avgdl describe current rows. Rows matching no query token are not in the lexical list.
    * Tags are an AND filter compared case-insensitively (``str.casefold``): a row passes when
      every requested tag is among its tags.
    * A query with no tokens (empty, or only one-character/punctuation words) returns current
      memories by recency: T order, newest first. The tag filter still applies.
    * Hybrid: when a query vector is given and the active embeddings store holds vectors of the
      query's length, the cosine list (non-positive dropped, :class:`VectorIndex`) and the BM25
      list, each taken to depth ``max(limit, 100)`` after the filters, are fused by Reciprocal
      Rank Fusion with k=60 and cut to ``limit``. Rows without a vector appear only in the BM25
      list; rows with a vector but no matching token only in the cosine list. Without a usable
      query vector (none given, no active store, no vector of that length) the ranking is plain
      BM25; that fallback never errors.
    * Ties (bitwise-equal scores) are broken by T order, newest first
      (:func:`node.memory.rows.order_desc_key`), never by the local doc id, so every replica
      holding the same entries returns the same list.

One set of docs, several indexes (``_Index``)
    Every well-formed memory row is a *doc* (a local int, never leaving this module), current
    or not, kept until the next rebuild. Over them:

    * one BM25 index of every doc (:class:`InvertedIndex`; its statistics are the whole
      history's, used by ``as_of``, ``as_known_at`` and ``include_superseded``), and a
      :class:`Subset` of it, the current docs, with the current rows' own statistics (plain
      recall): the postings are held once;
    * vectors in two blocks per vector length: the current docs' (``vectors``, what plain recall
      multiplies) and the other docs' (``old_vectors``); a row that stops being current moves its
      vector rows across, bit for bit. Time-aware recall searches both blocks and merges them;
    * per-doc columns (:mod:`node.memory.columns`): filters are boolean masks computed in one
      vectorised pass (:meth:`Filters.mask`) and handed to BM25 and the cosine, not a Python call
      per candidate;
    * the timelines of all keys as flat arrays (:mod:`node.memory.timetable`): ``as_of`` and
      ``as_known_at`` are vectorised group maxima over them;
    * the backlink index (:mod:`node.memory.backlinks`): the current rows by the keys their
      links may name, for ``neighbors``.

    Each is updated by the rows that arrive; nothing is dropped on a write.

Vectors
    For each row and each vector length, the newest embedding row (T order) that points at it
    is indexed, so a peer's vector of the wrong length can neither break recall nor displace a
    good vector. Pass ``dim`` to keep only vectors of that length (then
    :meth:`MemoryView.missing_vectors` also treats a row whose only vector has another length as
    missing). A vector whose memory row has not been seen yet is kept aside until the row
    arrives (an entry's embedding rows are announced before its memory rows); a vector of a
    malformed row is dropped.

Events
    ``RowsAdded`` for ``memory`` and for the active embeddings store update the view in
    O(tokens) per row; ``Rebuilt`` (verdicts changed, e.g. a revocation voided rows, or a
    payload was erased) marks it stale and the next call rebuilds it from ``db.rows``. An error
    inside the listener is logged and also leads to a rebuild; it never reaches the database.

Rebuild (on construction, e.g. the first recall after opening a node, and after ``Rebuilt``)
    In bulk: every row is read once, docs numbered in T order, then one
    :meth:`InvertedIndex.add_many`, one :meth:`Subset.add_many` and one
    :meth:`VectorIndex.add_many` per block and vector length, with the cyclic GC paused. It
    gives the same recall results, bit for bit, as a view fed the same rows one by one (tested).

As known at an entry (``Filters.as_known_at``, node.memory.timeline)
    The rows in the causal past of the entry (it and its ancestors) are taken as the whole
    store. Each doc keeps its entry's author and feed position, so the past is one comparison
    with the entry's version vector (``Database.past_vector``) over all docs; per key, the
    current row among them (or, with ``as_of``, the row that held then among them; with
    ``include_superseded``, every one of them) are the candidates, ranked over the whole
    history's index as ``as_of`` is; ``relations`` answer within that past too. The masks of an
    entry's past are kept for the few entries last asked about, until the next row arrives.

Labels and visibility (node/memory/labels.py)
    Each doc's labels (the hygiene rule that flagged it, a secret, an ingested source) are
    computed once, when it is indexed, and kept as columns. The bank's quarantines
    (node/memory/quarantine.py) are read when a ``quarantine`` row arrives and applied to every
    query as a mask over the writers' columns: a quarantined row is never a candidate, in any
    call (recall, auto-recall, neighbours, listing), and lifting the quarantine restores exactly
    the earlier answers, since nothing else changed. ``recall`` hides flagged rows and secrets
    when asked (auto-recall, and recall without ``include_secrets``).

Threads
    The public methods take the view's lock. Auto-recall searches several views at once from a
    pool of threads while the database thread goes on (node/memory/service.py), so a database
    event may arrive while another thread holds the lock: it is queued and applied, in order,
    by whoever holds the lock next, before that call reads anything. The event handler never
    waits, so a long search never blocks a database write. The caller still serialises access
    to the database itself (the database thread).
"""
from __future__ import annotations

import functools
import gc
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from memmesh.crdt.database import Database, Rebuilt, RowRecord, RowsAdded

from .backlinks import Backlinks
from .bm25 import InvertedIndex, Subset, _release_freed_memory
from .columns import DocColumns
from .fusion import RRF_K, rank_candidates, rrf
from .labels import FLAG_NAMES, NO_FLAG, Labels, row_labels
from .quarantine import QUARANTINE_STORE, Quarantine, hidden_mask, quarantines
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
from .timeline import Filters, current_in
from .timetable import TimeTable
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
_PAST_CACHE = 8  # pasts kept: two boolean arrays each (over docs, over timeline items)


F = TypeVar("F", bound=Callable[..., Any])


def _locked(fn: F) -> F:
    """A public method of MemoryView: under the view's lock, after the queued events."""
    @functools.wraps(fn)
    def wrapper(self: "MemoryView", *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self._drain()
            try:
                return fn(self, *args, **kwargs)
            finally:
                self._drain()
    return wrapper  # type: ignore[return-value]


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


def _tokens(m: Memory) -> list[str]:
    return tokenize(document_text(m.key, m.value, m.tags))


class _Index:
    """Every well-formed row of a view (its docs) and the indexes over them (module docstring)."""

    def __init__(self) -> None:
        self.mem: list[Memory] = []  # doc -> its memory
        self.row_doc: dict[str, int] = {}
        self.tiebreak: list[tuple[int, int, int]] = []  # doc -> order_desc_key
        self.tag_docs: dict[str, set[int]] = {}  # casefolded tag -> docs carrying it
        self.cols = DocColumns()
        self.all_bm25 = InvertedIndex()  # every doc: whole-history statistics
        self.bm25 = Subset(self.all_bm25)  # the current docs, with their own statistics
        self.vectors: dict[int, VectorIndex] = {}  # vector length -> the current docs' vectors
        self.old_vectors: dict[int, VectorIndex] = {}  # vector length -> the other docs' vectors
        self.vec_order: dict[tuple[int, int], Order] = {}  # (doc, length) -> order of its row
        self.links = Backlinks()
        self.secret_of: dict[int, str] = {}  # doc -> why it is a secret (few docs)
        self.flagged = 0  # docs with a hygiene flag
        self.ingested = 0  # docs of an ingested source

    def _count(self, doc: int, labels: Labels) -> None:
        if labels.secret is not None:
            self.secret_of[doc] = labels.secret
        self.flagged += labels.flag is not None
        self.ingested += labels.ingested

    # ------------------------------------------------------------------ docs
    def add(self, m: Memory, seq: int) -> int:
        labels = row_labels(m)
        doc = self.cols.append(m, seq, labels)
        self._count(doc, labels)
        self.mem.append(m)
        self.row_doc[m.row_key] = doc
        self.tiebreak.append(order_desc_key(m.order))
        for tag in {t.casefold() for t in m.tags}:
            self.tag_docs.setdefault(tag, set()).add(doc)
        self.all_bm25.add(doc, _tokens(m))
        return doc

    def add_many(self, mems: Sequence[Memory], seqs: Sequence[int]) -> None:
        """``add`` of each memory in turn (docs n, n + 1, ...), in bulk."""
        first = self.cols.n
        docs = range(first, first + len(mems))
        labels = [row_labels(m) for m in mems]
        self.cols.extend(mems, seqs, labels)
        for doc, lab in zip(docs, labels):
            if lab.secret is not None or lab.flag is not None or lab.ingested:
                self._count(doc, lab)
        self.mem.extend(mems)
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
        self.all_bm25.add_many((doc, _tokens(m)) for doc, m in zip(docs, mems))

    def make_current(self, doc: int) -> None:
        """A doc is current from its arrival or never (until a rebuild), so it has no vectors
        yet: they are indexed after this, into the current block."""
        self.cols.current[doc] = True
        self.bm25.add(doc)
        self.links.add(doc, self.mem[doc])

    def make_current_many(self, docs: Sequence[int]) -> None:
        """``make_current`` of docs that have no vectors yet, in bulk."""
        self.cols.current[list(docs)] = True
        self.bm25.add_many(docs)
        for doc in docs:
            self.links.add(doc, self.mem[doc])

    def retire(self, doc: int) -> None:
        """The doc is no longer current: its vectors move to the other block."""
        self.cols.current[doc] = False
        self.bm25.remove(doc)
        self.links.remove(doc, self.mem[doc])
        for dim, index in self.vectors.items():
            if (doc, dim) in self.vec_order:
                self._move(doc, index, self._block(self.old_vectors, dim))

    @staticmethod
    def _move(doc: int, source: VectorIndex, target: VectorIndex) -> None:
        unit = source.vector(doc)
        source.remove(doc)
        target.add_unit(doc, unit)

    @staticmethod
    def _block(blocks: dict[int, VectorIndex], dim: int) -> VectorIndex:
        index = blocks.get(dim)
        if index is None:
            index = blocks[dim] = VectorIndex(dim)
        return index

    # ------------------------------------------------------------------ vectors
    def index_vectors(self, best: dict[tuple[int, int], tuple[Order, np.ndarray]]) -> None:
        """``index_vector`` of each ``(doc, length) -> (order, vec)`` (at most one vector per
        doc and length, none indexed yet), one bulk load per block and length."""
        current = self.cols.current
        by_block: dict[tuple[bool, int], tuple[list[int], list[np.ndarray]]] = {}
        for (doc, dim), (order, vec) in best.items():
            docs, vecs = by_block.setdefault((bool(current[doc]), dim), ([], []))
            docs.append(doc)
            vecs.append(vec)
            self.vec_order[(doc, dim)] = order
        for (is_current, dim), (docs, vecs) in sorted(by_block.items()):
            self._block(self.vectors if is_current else self.old_vectors, dim).add_many(docs, vecs)

    def index_vector(self, doc: int, order: Order, vec: np.ndarray) -> None:
        """Index ``vec`` for ``doc`` unless a newer vector of that length is indexed."""
        dim = len(vec)
        prev = self.vec_order.get((doc, dim))
        if prev is not None and prev >= order:
            return
        index = self._block(self.vectors if self.cols.current[doc] else self.old_vectors, dim)
        if prev is not None:
            index.remove(doc)
        index.add(doc, vec)
        self.vec_order[(doc, dim)] = order

    def has_vector(self, doc: int, dim: int | None) -> bool:
        if dim is not None:
            return (doc, dim) in self.vec_order
        return any(doc in index for index in self.vectors.values())

    # ------------------------------------------------------------------ ranking
    def rank(self, tokens: list[str], need: frozenset[str], limit: int, query_vector: np.ndarray | None,
             history: bool, mask: np.ndarray | None) -> list[tuple[Memory, float]]:
        """``history``: rank among every doc with the whole history's statistics (else among
        the current docs with theirs); ``mask``: only the docs where it is true."""
        n = self.cols.n
        if need:
            # AND filter: the docs carrying every requested tag (smallest set first).
            sets = sorted((self.tag_docs.get(t, _EMPTY) for t in need), key=len)
            permitted = sets[0] if len(sets) == 1 else sets[0].intersection(*sets[1:])
            if not permitted:
                return []
            tagged = np.zeros(n, dtype=bool)
            tagged[np.fromiter(permitted, dtype=np.int64, count=len(permitted))] = True
            mask = tagged if mask is None else mask & tagged
        tiebreak = self.tiebreak.__getitem__
        if not tokens:
            if not history:
                mask = self.cols.current[:n] if mask is None else mask & self.cols.current[:n]
            ids = np.arange(n, dtype=np.int64) if mask is None else np.flatnonzero(mask)
            hits = rank_candidates(ids, self.cols.height[ids], limit=limit, tiebreak=tiebreak)
        else:
            lexical_index: InvertedIndex | Subset = self.all_bm25 if history else self.bm25
            blocks = [] if query_vector is None else [
                b for b in (self.vectors.get(len(query_vector)),
                            self.old_vectors.get(len(query_vector)) if history else None)
                if b is not None and len(b)]
            if not blocks:
                hits = lexical_index.search(tokens, limit=limit, tiebreak=tiebreak, mask=mask)
            else:
                depth = max(limit, RRF_DEPTH)
                lexical = lexical_index.search(tokens, limit=depth, tiebreak=tiebreak, mask=mask)
                semantic = blocks[0].search(query_vector, limit=depth, tiebreak=tiebreak, mask=mask)
                if len(blocks) > 1:
                    # Each block's best, then the best of both: the same list as one block of
                    # all rows (scores are exact float64, whatever block a row is in).
                    more = blocks[1].search(query_vector, limit=depth, tiebreak=tiebreak, mask=mask)
                    both = semantic + more
                    semantic = rank_candidates([d for d, _ in both], [s for _, s in both], limit=depth,
                                               tiebreak=tiebreak)
                if semantic:
                    hits = rrf([[d for d, _ in lexical], [d for d, _ in semantic]], RRF_K,
                               limit=limit, tiebreak=tiebreak)
                else:
                    hits = lexical[:limit]
        mem = self.mem
        return [(mem[d], float(score)) for d, score in hits]

    def nbytes(self) -> dict[str, int]:
        """Bytes of the numpy arrays, by part (Python objects not counted)."""
        return {"bm25": self.all_bm25.nbytes(), "columns": self.cols.nbytes(),
                "vectors": sum(ix.capacity * ix.dim * 4 for ix in self.vectors.values()),
                "old_vectors": sum(ix.capacity * ix.dim * 4 for ix in self.old_vectors.values())}


@dataclass
class _Past:
    """The causal past of one entry: which docs (and timeline items) it holds."""

    entry_id: str
    vv: dict[str, int]  # author -> highest seq in the past (the entry included)
    version: int  # the view's version it was computed at
    docs: np.ndarray  # boolean over docs
    items: np.ndarray | None = None  # boolean over timeline items, on first need

    def knows(self, m: Memory, seq: int) -> bool:
        return self.vv.get(m.author, -1) >= seq


class MemoryView:
    """Incremental recall index over one Database (its `memory` store and one embeddings store)."""

    def __init__(self, db: Database, *, embedding_store: str | None = None, dim: int | None = None,
                 lazy: bool = False) -> None:
        """``lazy``: build the index on first use, not here (a serving node builds it on a
        search thread, not on the database thread)."""
        self._db = db
        self._store = _check_store(embedding_store)
        self._dim = _check_dim(dim)
        self._stale = True
        self._lock = threading.RLock()
        self._backlog: deque[RowsAdded | Rebuilt] = deque()
        self._reset()
        db.subscribe(self._on_event)
        if not lazy:
            with self._lock:
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

    @contextmanager
    def held(self, timeout: float) -> Iterator[bool]:
        """The view's lock for a caller that gives up after ``timeout`` seconds (it yields
        whether it got the lock; the queued events are applied once it has it)."""
        got = self._lock.acquire(timeout=max(0.0, timeout))
        try:
            if got:
                self._drain()
            yield got
        finally:
            if got:
                self._drain()
                self._lock.release()

    @property
    def loaded(self) -> bool:
        """Whether the index is built (a call will not have to rebuild it first)."""
        return not self._stale

    @_locked
    def load(self) -> None:
        """Build the index now if it is not built."""
        self._current_index()

    @_locked
    def set_embedding_store(self, store: str | None, *, dim: int | None = None) -> None:
        """Switch the active model: rebuild the vector index from ``store`` (None: no vectors)."""
        self._store = _check_store(store)
        self._dim = _check_dim(dim)
        if not self._stale:
            self._load_vectors()
            _release_freed_memory()

    @_locked
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
        include_secrets: bool = True,
        hide_flagged: bool = False,
    ) -> list[Memory] | list[tuple[Memory, float]]:
        """Best-first memories for ``query`` (see the module docstring for the exact rules);
        ``with_scores``: (memory, score) pairs, the score that ranked it (BM25, or RRF when fused).
        Quarantined rows are never candidates; ``include_secrets`` False leaves out rows holding
        a secret, ``hide_flagged`` rows the instruction detector flagged.

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
        past = None if filters is None or filters.as_known_at is None else self.past(filters.as_known_at)
        ix = self._current_index()
        mask = None
        history = include_superseded
        if filters is not None and (filters.as_of is not None or past is not None):
            history = True
            if filters.as_of is not None:
                docs = self._times.held(filters.as_of, None if past is None else self._past_items(past))
            elif include_superseded:
                docs = None
                mask = past.docs.copy()  # type: ignore[union-attr]
            else:
                docs = self._times.current(self._past_items(past))  # type: ignore[arg-type]
            if docs is not None:
                mask = np.zeros(ix.cols.n, dtype=bool)
                mask[docs] = True
        if filters is not None and filters != _NO_FILTERS:
            kept = filters.mask(ix.cols)
            if kept is not None:
                mask = kept if mask is None else mask & kept
        shown = self._shown_mask(include_secrets, hide_flagged)
        if shown is not None:
            mask = shown if mask is None else mask & shown
        hits = ix.rank(tokens, need, int(limit), qv, history, mask)
        return hits if with_scores else [m for m, _score in hits]

    @_locked
    def current(self, key: str) -> Memory | None:
        """The current row of a memory key (newest in T order, not retired), or None."""
        ix = self._current_index()
        doc = self._current.get(key)
        return None if doc is None else ix.mem[doc]

    @_locked
    def timeline(self, key: str) -> list[Memory]:
        """The key's rows and the tombstones naming it, newest first in T order."""
        self._current_index()
        rows = self._history.get(key, []) + self._tombs.get(key, [])
        return sorted(rows, key=lambda m: m.order, reverse=True)

    @_locked
    def held_at(self, t: int) -> list[Memory]:
        """Per key, the row that held at world time ``t`` (node.memory.timeline.held_at)."""
        ix = self._current_index()
        return [ix.mem[d] for d in np.sort(self._times.held(t)).tolist()]

    @_locked
    def past(self, entry_id: str) -> _Past:
        """The store as the causal past of ``entry_id`` (an entry of this database) knew it;
        MemoryInputError if the database holds no such entry."""
        vv = self._db.past_vector(entry_id) if isinstance(entry_id, str) else None
        if vv is None:
            raise MemoryInputError(f"as_known_at: this bank holds no entry {entry_id!r} "
                                   "(an entry id of this bank, as recall and remember return it)")
        ix = self._current_index()
        cached = self._pasts.pop(entry_id, None)
        if cached is None or cached.version != self._version:
            cols = ix.cols
            bound = np.full(len(cols.authors), -1, dtype=np.int64)
            for author, i in cols.authors.items():
                bound[i] = vv.get(author, -1)
            n = cols.n
            cached = _Past(entry_id, vv, self._version, cols.seq[:n] <= bound[cols.author[:n]])
        self._pasts[entry_id] = cached  # most recently used last
        while len(self._pasts) > _PAST_CACHE:
            self._pasts.pop(next(iter(self._pasts)))
        return cached

    @_locked
    def relations(self, m: Memory, as_known_at: str | None = None) -> dict[str, Any]:
        """``superseded_by`` (the next row of m's timeline, when m is not current) and
        ``conflicts`` (rows of m's key concurrent with m: neither entry in the other's causal
        past), as result fields; empty when there are none. With ``as_known_at``: within the
        causal past of that entry."""
        out: dict[str, Any] = {}
        hidden = self._hidden_mask()
        timeline = self.timeline(m.key)
        if hidden is not None:  # a quarantined row is named nowhere, not even as a conflict
            row_doc = self._ix.row_doc
            timeline = [r for r in timeline if not hidden[row_doc[r.row_key]]]
        if as_known_at is None:
            current = self.current(m.key)
        else:
            past = self.past(as_known_at)
            timeline = [r for r in timeline if past.knows(r, self._seq(r.entry_id))]
            if not any(r.key == m.key for r in timeline):
                timeline = []  # a key with no row in the past has no timeline there
            current = current_in(m.key, timeline)
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

    @_locked
    def linking_to(self, key: str) -> list[Memory]:
        """Current memories with a link (an edge other than ``supersedes``) that may name
        ``key``: its ``to`` is ``key`` or ends in ``:key``; the caller resolves the bank."""
        ix = self._current_index()
        return [ix.mem[d] for d in sorted(ix.links.docs(key))]

    @_locked
    def memories(self, *, include_superseded: bool = False) -> list[Memory]:
        """Current memories (every well-formed row with include_superseded), newest first."""
        ix = self._current_index()
        mems = ix.mem if include_superseded else [ix.mem[d] for d in self._current.values()]
        return sorted(mems, key=lambda m: m.order, reverse=True)

    @_locked
    def missing_vectors(self) -> list[Memory]:
        """Current memories with no vector in the active embeddings store, newest first; rows
        holding a secret are never embedded, so they are never missing one."""
        ix = self._current_index()
        docs = [d for d in self._current.values() if d not in ix.secret_of]
        out = [ix.mem[d] for d in docs] if self._store is None else [
            ix.mem[d] for d in docs if not ix.has_vector(d, self._dim)]
        out.sort(key=lambda m: m.order, reverse=True)
        return out

    @_locked
    def has_vectors(self) -> bool:
        """Whether some current memory has a vector in the active embeddings store."""
        return any(len(v) for v in self._current_index().vectors.values())

    @_locked
    def quarantines(self) -> list[Quarantine]:
        """The bank's quarantines that count (node/memory/quarantine.py), released ones too."""
        return list(self._quarantine_list())

    @_locked
    def labels(self, m: Memory) -> tuple[Labels, bool]:
        """The labels of a memory this view holds, and whether an active quarantine hides it."""
        ix = self._current_index()
        doc = ix.row_doc.get(m.row_key)
        if doc is None:
            return row_labels(m), False
        cols = ix.cols
        flag = int(cols.flag[doc])
        labels = Labels(None if flag == NO_FLAG else FLAG_NAMES[flag], ix.secret_of.get(doc), bool(cols.ingested[doc]))
        hidden = self._hidden_mask()
        return labels, bool(hidden is not None and hidden[doc])

    @_locked
    def visible(self, m: Memory, *, include_secrets: bool) -> bool:
        """Whether recall could return ``m``: not quarantined, and no secret unless included."""
        labels, quarantined = self.labels(m)
        return not quarantined and (include_secrets or labels.secret is None)

    @_locked
    def weighted_tiers_present(self) -> dict[str, bool]:
        """Which label-derived tiers any doc holds (cheap: counts kept as docs arrive)."""
        ix = self._current_index()
        return {"ingested": ix.ingested > 0, "flagged": ix.flagged > 0}

    @_locked
    def status(self, reader: str | None = None) -> dict[str, Any]:
        """Counts of the current memories: per trust tier for ``reader`` (a public key; None:
        no reader, every plain row is ``peer``), flagged per rule, secrets, quarantined, and
        how many have a vector in the active embeddings store (secrets need none)."""
        ix = self._current_index()
        docs = np.fromiter(sorted(self._current.values()), dtype=np.int64, count=len(self._current))
        cols = ix.cols
        hidden = self._hidden_mask()
        quarantined = np.zeros(len(docs), dtype=bool) if hidden is None else hidden[docs]
        flag = cols.flag[docs]
        flagged = (flag != NO_FLAG) & ~quarantined
        ingested = cols.ingested[docs] & ~flagged & ~quarantined
        plain = ~quarantined & ~flagged & ~ingested
        rid = cols.authors.get(reader) if reader is not None else None
        owner = plain & (cols.author[docs] == rid) if rid is not None else np.zeros(len(docs), dtype=bool)
        secret = np.fromiter((int(d) in ix.secret_of for d in docs), dtype=bool, count=len(docs))
        embeddable = int((~secret).sum())
        with_vector = sum(1 for d in docs.tolist() if d not in ix.secret_of and ix.has_vector(d, self._dim)) \
            if self._store is not None else 0
        return {
            "memories": len(docs),
            "tiers": {"owner": int(owner.sum()), "peer": int((plain & ~owner).sum()), "ingested": int(ingested.sum()),
                      "flagged": int(flagged.sum()), "quarantined": int(quarantined.sum())},
            "flagged_by_rule": {name: int(((flag == i) & ~quarantined).sum()) for i, name in enumerate(FLAG_NAMES)
                                if ((flag == i) & ~quarantined).any()},
            "secrets": int(secret.sum()),
            "embedding_store": self._store,
            "with_vector": with_vector,
            "embeddable": embeddable,
        }

    @_locked
    def sizes(self) -> dict[str, int]:
        """Rows, current memories, timeline items and bytes of the arrays (for benchmarks)."""
        ix = self._current_index()
        return {"rows": ix.cols.n, "current": len(self._current), "timeline_items": len(self._times),
                **{f"{k}_bytes": v for k, v in ix.nbytes().items()}, "timeline_bytes": self._times.nbytes()}

    @_locked
    def __len__(self) -> int:
        self._current_index()
        return len(self._current)

    # ---------------------------------------------------------------------------- state
    def _reset(self) -> None:
        self._ix = _Index()
        self._times = TimeTable(self._ix.cols, self._order_of)
        self._current: dict[str, int] = {}  # memory key -> doc of its current row
        self._history: dict[str, list[Memory]] = {}  # memory key -> every well-formed row of it
        self._tombs: dict[str, list[Memory]] = {}  # key -> rows of other keys superseding it
        self._newest: dict[str, Memory] = {}  # key -> its newest row (current unless retired)
        self._retired: dict[str, Order] = {}  # key -> T order of the newest tombstone naming it
        self._key_ids: dict[str, int] = {}  # key -> its group in the timeline table
        self._seen: set[str] = set()  # row keys of every memory row seen (malformed ones too)
        self._pending: dict[str, dict[int, tuple[Order, np.ndarray]]] = {}  # row -> length -> vec
        self._pasts: dict[str, _Past] = {}
        self._version = 0  # counts docs added: a cached past is valid for one version
        self._qs: list[Quarantine] | None = None  # the bank's quarantines, read on need
        self._hidden: tuple[int, np.ndarray | None] | None = None  # (docs, mask) for self._qs

    def _order_of(self, doc: int) -> Order:
        return self._ix.mem[doc].order

    def _seq(self, entry_id: str) -> int:
        entry = self._db.entry(entry_id)
        return -1 if entry is None else entry.seq

    def _key_id(self, key: str) -> int:
        kid = self._key_ids.get(key)
        if kid is None:
            kid = self._key_ids[key] = len(self._key_ids)
        return kid

    def _past_items(self, past: _Past) -> np.ndarray:
        if past.items is None:
            past.items = self._times.known(past.docs)
        return past.items

    def _quarantine_list(self) -> list[Quarantine]:
        if self._qs is None:
            self._qs = quarantines(self._db)
            self._hidden = None
        return self._qs

    def _hidden_mask(self) -> np.ndarray | None:
        """True for the docs an active quarantine hides (None: none), cached until a doc or a
        quarantine arrives."""
        qs = self._quarantine_list()
        cols = self._ix.cols
        if self._hidden is None or self._hidden[0] != cols.n:
            mask = hidden_mask(qs, cols.authors, cols.author[:cols.n], cols.ts[:cols.n]) if qs else None
            self._hidden = (cols.n, mask)
        return self._hidden[1]

    def _shown_mask(self, include_secrets: bool, hide_flagged: bool) -> np.ndarray | None:
        """The docs a recall may return (None: all): not quarantined, and the labels asked for."""
        ix = self._ix
        n = ix.cols.n
        out = self._hidden_mask()
        out = None if out is None else ~out
        if not include_secrets and ix.secret_of:
            keep = ~ix.cols.secret[:n]
            out = keep if out is None else out & keep
        if hide_flagged and ix.flagged:
            keep = ix.cols.flag[:n] == NO_FLAG
            out = keep if out is None else out & keep
        return out

    def _current_index(self) -> _Index:
        if self._stale:
            self._rebuild()
        return self._ix

    def _rebuild(self) -> None:
        # Bulk: read every row once, docs in T order, then one bulk load per index. The result
        # is the state that feeding the rows one by one would give (tested).
        self._stale = True
        self._reset()
        with _gc_paused():
            mems: list[Memory] = []
            seen = self._seen
            for rec in self._db.rows(MEMORY_STORE):  # in T order
                seen.add(rec.key)
                m = parse_memory(rec)
                if m is not None:
                    mems.append(m)
            seq_of: dict[str, int] = {}
            seqs = [seq_of[m.entry_id] if m.entry_id in seq_of else seq_of.setdefault(m.entry_id, self._seq(m.entry_id))
                    for m in mems]
            ix = self._ix
            ix.add_many(mems, seqs)
            keys: list[int] = []
            item_docs: list[int] = []
            tombs: list[bool] = []
            newest = self._newest
            for doc, m in enumerate(mems):
                for target in self._note(m):
                    keys.append(self._key_id(target))
                    item_docs.append(doc)
                    tombs.append(True)
                keys.append(self._key_id(m.key))
                item_docs.append(doc)
                tombs.append(False)
                newest[m.key] = m  # rows come in T order: the last one is the newest
            self._times.load(np.array(keys, dtype=np.int64), np.array(item_docs, dtype=np.int64),
                             np.array(tombs, dtype=bool))
            retired = self._retired
            current = sorted(ix.row_doc[m.row_key] for m in newest.values()
                             if retired.get(m.key, _NEVER) < m.order)
            ix.make_current_many(current)
            self._current = {mems[d].key: d for d in current}
            self._version += 1
            self._load_vectors()
        self._stale = False
        _release_freed_memory()

    def _load_vectors(self) -> None:
        ix = self._ix
        ix.vectors = {}
        ix.old_vectors = {}
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
        # Runs inside the database's ingest: it must never raise, and never wait (a search
        # thread may hold the lock; the event then waits in the backlog for it).
        self._backlog.append(event)
        if self._lock.acquire(blocking=False):
            try:
                self._drain()
            finally:
                self._lock.release()

    def _drain(self) -> None:
        """Apply the queued events, in order (the caller holds the lock)."""
        backlog = self._backlog
        while backlog:
            event = backlog.popleft()
            if self._stale:
                continue  # the next call rebuilds from the database, which holds the event's rows
            try:
                if isinstance(event, Rebuilt):
                    self._stale = True
                elif isinstance(event, RowsAdded):
                    if event.store == MEMORY_STORE:
                        for rec in event.rows:
                            self._add_memory(rec)
                    elif event.store == self._store:
                        for rec in event.rows:
                            self._add_vector(rec)
                    elif event.store == QUARANTINE_STORE:
                        self._qs = None
            except Exception:  # noqa: BLE001 - a bug here must not fail the database's write
                log.exception("memory view of %s failed to apply an update; it will be rebuilt", self._db.id)
                self._stale = True

    def _add_memory(self, rec: RowRecord) -> None:
        if rec.key in self._seen:
            return
        self._seen.add(rec.key)
        pending = self._pending.pop(rec.key, None)
        m = parse_memory(rec)
        if m is None:
            return
        ix = self._ix
        doc = ix.add(m, self._seq(m.entry_id))
        self._version += 1
        for target in self._note(m):
            self._times.add(self._key_id(target), doc, True)
            cur = self._current.get(target)
            if cur is not None and ix.mem[cur].order < m.order:
                ix.retire(cur)  # retired by a newer row's supersedes edge
                del self._current[target]
        self._times.add(self._key_id(m.key), doc, False)
        newest = self._newest.get(m.key)
        if newest is None or newest.order < m.order:
            self._newest[m.key] = m
            cur = self._current.pop(m.key, None)
            if cur is not None:
                ix.retire(cur)
            if self._retired.get(m.key, _NEVER) < m.order:  # else a newer row of another key retired it
                self._current[m.key] = doc
                ix.make_current(doc)
        # else: an older row arriving late, superseded from the start
        if pending:
            for order, vec in pending.values():
                ix.index_vector(doc, order, vec)

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
        # else: the row is malformed; only a rebuild could make it a memory


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
