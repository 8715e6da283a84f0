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

Ranking and the indexes over a view's docs: node/memory/recall_index.py. Keeping them in step
with the database (events, rebuilds, threads): node/memory/view_feed.py.

Vectors
    For each row and each vector length, the newest embedding row (T order) that points at it
    is indexed, so a peer's vector of the wrong length can neither break recall nor displace a
    good vector. Pass ``dim`` to keep only vectors of that length (then
    :meth:`MemoryView.missing_vectors` also treats a row whose only vector has another length as
    missing). A vector whose memory row has not been seen yet is kept aside until the row
    arrives (an entry's embedding rows are announced before its memory rows); a vector of a
    malformed row is dropped.

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
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from memmesh.crdt.database import Database

from .heap import release_freed_memory
from .labels import FLAG_NAMES, NO_FLAG, Labels, row_labels
from .quarantine import Quarantine, hidden_mask, quarantines
from .recall_args import check_dim, check_filter_tags, check_query_vector, check_store
from .recall_index import RRF_DEPTH, text_key
from .relevance import floor_for
from .rows import Memory, MemoryInputError, normalized_value
from .timeline import Filters, current_in
from .tokens import tokenize
from .view_feed import Past, ViewFeed, locked

__all__ = ["DEFAULT_LIMIT", "MAX_PAGE_DEPTH", "MAX_LIMIT", "MemoryView", "RRF_DEPTH"]

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 10
MAX_LIMIT = 100  # memories one recall answers at most
# How deep a ranking may be paged (recall's offset + limit): a browser pages through a bank's
# newest, a store pages through its items; the ranking work stays bounded.
MAX_PAGE_DEPTH = 1000

_NO_FILTERS = Filters()
_PAST_CACHE = 8  # pasts kept: two boolean arrays each (over docs, over timeline items)


class MemoryView(ViewFeed):
    """Incremental recall index over one Database (its `memory` store and one embeddings store)."""

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

    @locked
    def load(self) -> None:
        """Build the index now if it is not built."""
        self._current_index()

    @locked
    def save_snapshot(self) -> bool:
        """Write this view's snapshot now (node/memory/snapshot.py); False when the view has no
        snapshot directory or is not built."""
        return self._save_snapshot()

    @property
    def snapshot_due(self) -> bool:
        """Whether a snapshot is worth writing now (large enough, and none on disk that holds
        nearly all of it); never waits for the lock (False when a search holds it)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._drain()
            return self._snapshot_due()
        finally:
            self._lock.release()

    @locked
    def fingerprint(self) -> str:
        """SHA-256 of what this view holds, whatever its doc numbering: per row its memory,
        whether it is current, its columns, labels and vectors (bits, block); per key its
        timeline; the BM25 statistics; the vectors waiting for their rows. Two views of the
        same rows give the same fingerprint however they were built (``memmesh check``
        compares a snapshot's with a rebuild's)."""
        ix = self._current_index()
        cols = ix.cols
        authors = {i: a for a, i in cols.authors.items()}
        categories = {i: c for c, i in cols.categories.items()}
        h = hashlib.sha256()
        per_row = []
        for doc, m in enumerate(ix.mem):
            vecs = []
            for dim, block in sorted(ix.vectors.items()) + sorted((-d, b) for d, b in ix.old_vectors.items()):
                if doc in block:
                    vecs.append((dim, block.vector(doc).tobytes(), ix.vec_order[abs(dim)].get(doc)))
            per_row.append(repr((
                m.row_key, m, bool(cols.current[doc]), float(cols.height[doc]), categories.get(int(cols.category[doc])),
                int(cols.confidence[doc]), int(cols.valid_from[doc]), int(cols.valid_to[doc]), int(cols.ts[doc]),
                authors.get(int(cols.author[doc])), int(cols.seq[doc]), int(cols.flag[doc]), bool(cols.secret[doc]),
                bool(cols.ingested[doc]), bool(cols.derived[doc]), ix.secret_of.get(doc), ix.tiebreak[doc], vecs)))
        for line in sorted(per_row):
            h.update(line.encode("utf-8", "surrogatepass") + b"\n")
        row_key = [m.row_key for m in ix.mem]
        h.update(repr(sorted((k, row_key[d]) for k, d in self._keys.current_items())).encode("utf-8", "surrogatepass"))
        for key in sorted(self._keys.ids):
            h.update(repr((key, [r.row_key for r in self.timeline(key)])).encode("utf-8", "surrogatepass"))
        h.update(repr(sorted(self._retired.items())).encode("utf-8", "surrogatepass"))
        h.update(repr(sorted(self._malformed)).encode("utf-8", "surrogatepass"))
        h.update(repr(sorted((r, sorted((d, o, v.tobytes()) for d, (o, v) in slot.items()))
                             for r, slot in self._pending.items())).encode("utf-8", "surrogatepass"))
        h.update(repr((len(ix.all_bm25), ix.all_bm25.avgdl, len(ix.bm25), ix.bm25.avgdl,
                       ix.flagged, ix.ingested, ix.derived, ix.scored)).encode())
        h.update(repr(sorted((t, ix.all_bm25.df(t), ix.bm25.df(t)) for t in ix.all_bm25.vocabulary()
                             if ix.all_bm25.df(t))).encode("utf-8", "surrogatepass"))
        h.update(repr(sorted((t, sorted(row_key[d] for d in ds)) for t, ds in ix.tag_docs.items())).encode("utf-8", "surrogatepass"))
        h.update(repr(sorted((e, sorted(row_key[d] for d in ds)) for e, ds in ix.entity_docs.items())).encode("utf-8", "surrogatepass"))
        return h.hexdigest()

    @locked
    def set_embedding_store(self, store: str | None, *, dim: int | None = None) -> None:
        """Switch the active model: rebuild the vector index from ``store`` (None: no vectors)."""
        self._store = check_store(store)
        self._dim = check_dim(dim)
        if not self._stale:
            self._load_vectors()
            release_freed_memory()

    @locked
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
        min_similarity: float | None = None,
    ) -> list[Memory] | list[tuple[Memory, float]]:
        """Best-first memories for ``query`` (see the module docstring for the exact rules);
        ``with_scores``: (memory, score) pairs, the score that ranked it (BM25, or RRF when fused).
        Quarantined rows are never candidates; ``include_secrets`` False leaves out rows holding
        a secret, ``hide_flagged`` rows the instruction detector flagged. ``min_similarity``: the
        cosine below which a row only the vectors found is left out (None: the active embeddings
        store's calibrated floor, node/memory/relevance.py).

        ``filters`` (node.memory.timeline): category, min_confidence, entities, a period, the caller's
        now; with ``as_of``, the candidates are the rows that held then (one per key at most),
        ranked over the whole history's index."""
        if query is None:
            query = ""
        if not isinstance(query, str):
            raise MemoryInputError(f"query must be a string, got {type(query).__name__}")
        need = check_filter_tags(tags)
        about = check_filter_tags(filters.entities if filters is not None else (), "entity")
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or not 1 <= limit <= MAX_PAGE_DEPTH:
            raise MemoryInputError(f"limit must be an integer from 1 to {MAX_PAGE_DEPTH}, got {limit!r}")
        qv = check_query_vector(query_vector)
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
            else:
                assert past is not None  # no as_of: the condition above means as_known_at
                if include_superseded:
                    docs = None
                    mask = past.docs.copy()
                else:
                    docs = self._times.current(self._past_items(past))
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
        floor = floor_for(self._store) if min_similarity is None else float(min_similarity)
        hits = ix.rank(tokens, need, int(limit), qv, history, mask, floor, about)
        return hits if with_scores else [m for m, _score in hits]

    @locked
    def current(self, key: str) -> Memory | None:
        """The current row of a memory key (newest in T order, not retired), or None."""
        ix = self._current_index()
        doc = self._keys.current(key)
        return None if doc is None else ix.mem[doc]

    @locked
    def shown(self, key: str, *, now: int | None, include_secrets: bool) -> Memory | None:
        """The current row of ``key`` if recall could return it, else None: not retired by its
        ``valid_to`` at ``now`` (the caller's clock; None: never), not quarantined, not a secret
        unless included. One lookup in the per-key index, whatever the bank's size."""
        ix = self._current_index()
        doc = self._keys.current(key)
        if doc is None:
            return None
        m = ix.mem[doc]
        if _retired(m, now) or not self.visible(m, include_secrets=include_secrets):
            return None
        return m

    @locked
    def timeline(self, key: str) -> list[Memory]:
        """The key's rows and the tombstones naming it, newest first in T order."""
        self._current_index()
        kid = self._keys.ids.get(key)
        if kid is None:
            return []
        mem = self._ix.mem
        return [mem[d] for d in reversed(self._times.group(kid))]

    @locked
    def held_at(self, t: int) -> list[Memory]:
        """Per key, the row that held at world time ``t`` (node.memory.timeline.held_at)."""
        ix = self._current_index()
        return [ix.mem[d] for d in np.sort(self._times.held(t)).tolist()]

    @locked
    def past(self, entry_id: str) -> Past:
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
            cached = Past(entry_id, vv, self._version, cols.seq[:n] <= bound[cols.author[:n]])
        self._pasts[entry_id] = cached  # most recently used last
        while len(self._pasts) > _PAST_CACHE:
            self._pasts.pop(next(iter(self._pasts)))
        return cached

    @locked
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

    @locked
    def linking_to(self, key: str) -> list[Memory]:
        """Current memories with a link (an edge other than ``supersedes``) that may name
        ``key``: its ``to`` is ``key`` or ends in ``:key``; the caller resolves the bank."""
        ix = self._current_index()
        return [ix.mem[d] for d in sorted(ix.links.docs(key))]

    @locked
    def memories(self, *, include_superseded: bool = False) -> list[Memory]:
        """Current memories (every well-formed row with include_superseded), newest first."""
        ix = self._current_index()
        mems = ix.mem if include_superseded else [ix.mem[d] for d in self._keys.current_docs().tolist()]
        return sorted(mems, key=lambda m: m.order, reverse=True)

    @locked
    def missing_vectors(self) -> list[Memory]:
        """Current memories with no vector in the active embeddings store, newest first; rows
        holding a secret are never embedded, so they are never missing one."""
        ix = self._current_index()
        docs = [d for d in self._keys.current_docs().tolist() if d not in ix.secret_of]
        out = [ix.mem[d] for d in docs] if self._store is None else [
            ix.mem[d] for d in docs if not ix.has_vector(d, self._dim)]
        out.sort(key=lambda m: m.order, reverse=True)
        return out

    @locked
    def has_vectors(self) -> bool:
        """Whether some current memory has a vector in the active embeddings store."""
        return any(len(v) for v in self._current_index().vectors.values())

    @locked
    def quarantines(self) -> list[Quarantine]:
        """The bank's quarantines that count (node/memory/quarantine.py), released ones too."""
        return list(self._quarantine_list())

    @locked
    def labels(self, m: Memory) -> tuple[Labels, bool]:
        """The labels of a memory this view holds, and whether an active quarantine hides it."""
        ix = self._current_index()
        doc = ix.row_doc.get(m.row_key)
        if doc is None:
            return row_labels(m), False
        cols = ix.cols
        flag = int(cols.flag[doc])
        labels = Labels(None if flag == NO_FLAG else FLAG_NAMES[flag], ix.secret_of.get(doc), bool(cols.ingested[doc]),
                        bool(cols.derived[doc]))
        hidden = self._hidden_mask()
        return labels, bool(hidden is not None and hidden[doc])

    @locked
    def visible(self, m: Memory, *, include_secrets: bool) -> bool:
        """Whether recall could return ``m``: not quarantined, and no secret unless included."""
        labels, quarantined = self.labels(m)
        return not quarantined and (include_secrets or labels.secret is None)

    @locked
    def weighted_tiers_present(self) -> dict[str, bool]:
        """Which label-derived tiers any doc holds (cheap: counts kept as docs arrive)."""
        ix = self._current_index()
        return {"ingested": ix.ingested > 0, "flagged": ix.flagged > 0, "derived": ix.derived > 0}

    @locked
    def has_scores(self) -> bool:
        """Whether any row carries an importance or a confidence (then recall re-weighs)."""
        return self._current_index().scored > 0

    @locked
    def nearest(self, vector: np.ndarray, limit: int) -> list[tuple[Memory, float]]:
        """The current memories whose vectors (in the active store) are nearest ``vector``, best
        first, with their exact cosines (positive ones only); for remember's near-duplicate
        check (node/memory/dedup.py), which needs cosines, not recall's fused ranks."""
        ix = self._current_index()
        block = ix.vectors.get(len(vector))
        if block is None or not len(block):
            return []
        hits = block.search(np.asarray(vector), limit=limit, tiebreak=ix.tiebreak.__getitem__)
        return [(ix.mem[d], float(s)) for d, s in hits]

    @locked
    def saying(self, value: str) -> list[Memory]:
        """The current rows whose value is ``value`` once normalised (rows.normalized_value),
        newest first: a lookup by the normalised text's hash, then an exact comparison."""
        ix = self._current_index()
        wanted = normalized_value(value)
        docs = [d for d in ix.text_docs.get(text_key(wanted)) if ix.cols.current[d]
                and normalized_value(ix.mem[d].value) == wanted]
        return [ix.mem[d] for d in sorted(docs, key=ix.tiebreak.__getitem__)]

    @locked
    def about(self, entity: str) -> list[Memory]:
        """The current rows about ``entity`` (case-insensitive), newest first."""
        ix = self._current_index()
        docs = [d for d in ix.entity_docs.get(entity.casefold(), ()) if ix.cols.current[d]]
        return [ix.mem[d] for d in sorted(docs, key=ix.tiebreak.__getitem__)]

    @locked
    def entities(self, *, include_secrets: bool = False, now: int | None = None) -> list[tuple[str, int]]:
        """The entities the current memories are about, with how many of them each, most first
        (ties by name); spelled as the newest memory about it spells it. Quarantined rows, and
        secrets unless included, are not counted; with ``now`` (the caller's clock), neither is
        a current row retired by its ``valid_to``, which recall no longer shows either."""
        ix = self._current_index()
        counts: dict[str, tuple[int, str, tuple[int, int, int]]] = {}
        for entity, docs in ix.entity_docs.items():
            for doc in docs:
                m = ix.mem[doc]
                if (not ix.cols.current[doc] or _retired(m, now)
                        or not self.visible(m, include_secrets=include_secrets)):
                    continue
                n, name, newest = counts.get(entity, (0, "", (0, 0, 0)))
                spelled = next(e for e in m.entities if e.casefold() == entity)
                key = ix.tiebreak[doc]
                if n == 0 or key < newest:  # order_desc_key: smaller is newer
                    name, newest = spelled, key
                counts[entity] = (n + 1, name, newest)
        return sorted(((name, n) for n, name, _ in counts.values()), key=lambda p: (-p[1], p[0].casefold()))

    @locked
    def status(self, reader: str | None = None) -> dict[str, Any]:
        """Counts of the current memories: per trust tier for ``reader`` (a public key; None:
        no reader, every plain row is ``peer``), flagged per rule, secrets, quarantined, and
        how many have a vector in the active embeddings store (secrets need none)."""
        ix = self._current_index()
        docs = self._keys.current_docs()
        cols = ix.cols
        hidden = self._hidden_mask()
        quarantined = np.zeros(len(docs), dtype=bool) if hidden is None else hidden[docs]
        flag = cols.flag[docs]
        flagged = (flag != NO_FLAG) & ~quarantined
        ingested = cols.ingested[docs] & ~flagged & ~quarantined
        derived = cols.derived[docs] & ~ingested & ~flagged & ~quarantined
        plain = ~quarantined & ~flagged & ~ingested & ~derived
        rid = cols.authors.get(reader) if reader is not None else None
        owner = plain & (cols.author[docs] == rid) if rid is not None else np.zeros(len(docs), dtype=bool)
        secret = np.fromiter((int(d) in ix.secret_of for d in docs), dtype=bool, count=len(docs))
        embeddable = int((~secret).sum())
        with_vector = sum(1 for d in docs.tolist() if d not in ix.secret_of and ix.has_vector(d, self._dim)) \
            if self._store is not None else 0
        return {
            "memories": len(docs),
            # derived only when some row is: a bank without auto-capture reports what it always did
            "tiers": {"owner": int(owner.sum()), **({"derived": int(derived.sum())} if derived.any() else {}),
                      "peer": int((plain & ~owner).sum()), "ingested": int(ingested.sum()),
                      "flagged": int(flagged.sum()), "quarantined": int(quarantined.sum())},
            "flagged_by_rule": {name: int(((flag == i) & ~quarantined).sum()) for i, name in enumerate(FLAG_NAMES)
                                if ((flag == i) & ~quarantined).any()},
            "secrets": int(secret.sum()),
            "embedding_store": self._store,
            "with_vector": with_vector,
            "embeddable": embeddable,
        }

    @locked
    def footprint(self) -> tuple[int, int]:
        """(rows, bytes of the arrays): what a memory budget counts, cheap enough for every use
        of the view (unlike :meth:`sizes`, it merges no pending timeline items)."""
        ix = self._current_index()
        return ix.cols.n, sum(ix.nbytes().values()) + self._times.nbytes() + self._keys.nbytes()

    @locked
    def sizes(self) -> dict[str, int]:
        """Rows, current memories, timeline items and bytes of the arrays (for benchmarks)."""
        ix = self._current_index()
        return {"rows": ix.cols.n, "current": len(self._keys), "timeline_items": len(self._times),
                **{f"{k}_bytes": v for k, v in ix.nbytes().items()}, "timeline_bytes": self._times.nbytes(), "keys_bytes": self._keys.nbytes()}

    @locked
    def __len__(self) -> int:
        self._current_index()
        return len(self._keys)

    def _past_items(self, past: Past) -> np.ndarray:
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


def _retired(m: Memory, now: int | None) -> bool:
    """Whether the row's end date has passed at ``now`` (recall's rule, timeline.Filters.keep)."""
    return now is not None and m.valid_to is not None and m.valid_to <= now
