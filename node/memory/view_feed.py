"""A memory view's docs and indexes kept in step with its database's rows.

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

Snapshots (node/memory/snapshot.py)
    Given a :class:`Snapshots`, the first build reads the view's snapshot instead of the log when
    every check passes: the file's own (sizes and checksum, format, code fingerprint), then that each entry
    whose rows it reflects (``_applied``, per store) still shows them now; the rows of entries it
    does not reflect are then applied as events would apply them. Anything else (no file, a
    damaged or stale one) is a rebuild from the log, and a stale or damaged file is removed.
    ``_applied`` is kept exactly: every event and every rebuild adds the entries of the rows it
    applied, so a snapshot written at any moment says which entries its state holds.

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
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, TypeVar

import numpy as np

from memmesh.crdt.database import Database, Rebuilt, RowRecord, RowsAdded

from .heap import release_freed_memory
from .key_table import KeyTable
from .quarantine import QUARANTINE_STORE, Quarantine
from .recall_args import check_dim, check_store
from .recall_index import Order, RecallIndex
from .rows import MEMORY_STORE, SUPERSEDES, Memory, parse_embedding, parse_embeddings, parse_memory
from .snapshot import Meta, SnapshotRejected, Snapshots
from .timetable import TimeTable
from .vectors import VectorIndex

log = logging.getLogger("memmesh.node.memory.view")  # one logger for the whole view: its lines keep their name

_NEVER: Order = (-1, "", -1)  # before every row in T order

P = ParamSpec("P")
R = TypeVar("R")
V = TypeVar("V", bound="ViewFeed")


def locked(fn: Callable[Concatenate[V, P], R]) -> Callable[Concatenate[V, P], R]:
    """A public method of a view: under the view's lock, after the queued events."""
    @functools.wraps(fn)
    def wrapper(self: V, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            self._drain()
            try:
                return fn(self, *args, **kwargs)
            finally:
                self._drain()
    return wrapper


@contextmanager
def gc_paused() -> Iterator[None]:
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
class Past:
    """The causal past of one entry: which docs (and timeline items) it holds."""

    entry_id: str
    vv: dict[str, int]  # author -> highest seq in the past (the entry included)
    version: int  # the view's version it was computed at
    docs: np.ndarray  # boolean over docs
    items: np.ndarray | None = None  # boolean over timeline items, on first need

    def knows(self, m: Memory, seq: int) -> bool:
        return self.vv.get(m.author, -1) >= seq


class ViewFeed:
    """The docs of one database's memory rows, their indexes and timelines, fed by its events
    (or rebuilt from its rows); MemoryView answers queries over them."""

    def __init__(self, db: Database, *, embedding_store: str | None = None, dim: int | None = None,
                 lazy: bool = False, snapshots: Snapshots | None = None,
                 vector_index: Callable[[int], VectorIndex] = VectorIndex) -> None:
        """``lazy``: build the index on first use, not here (a serving node builds it on a
        search thread, not on the database thread). ``snapshots``: where this view's snapshot
        is read from on its first build and written to (None: always built from the log).
        ``vector_index``: makes the vector blocks (:class:`RecallIndex`)."""
        self._vector_index = vector_index
        self._db = db
        self._store = check_store(embedding_store)
        self._dim = check_dim(dim)
        self._snapshots = snapshots
        self._snapshot_tried = snapshots is None
        self._snap_docs: int | None = None  # docs the snapshot on disk holds (None: none that is good)
        self.opened_from: str | None = None  # "snapshot" or "log", once built
        self.snapshot_note: str | None = None  # why the snapshot was not used
        self._stale = True
        self._lock = threading.RLock()
        self._backlog: deque[RowsAdded | Rebuilt] = deque()
        self._reset()
        db.subscribe(self._on_event)
        if not lazy:
            with self._lock:
                self._rebuild()

    def close(self) -> None:
        """Stop following the database (a replaced view must not keep receiving events)."""
        self._db.unsubscribe(self._on_event)

    # ---------------------------------------------------------------------------- state
    def _reset(self) -> None:
        self._ix = RecallIndex(self._vector_index)
        self._times = TimeTable(self._ix.cols, self._ix.mem)
        # key -> its group in the timeline table (its rows and tombstones), its current and newest rows
        self._keys = KeyTable()
        self._retired: dict[str, Order] = {}  # key -> T order of the newest tombstone naming it
        self._malformed: set[str] = set()  # row keys of the memory rows that are not well formed
        self._pending: dict[str, dict[int, tuple[Order, np.ndarray]]] = {}  # row -> length -> vec
        self._pasts: dict[str, Past] = {}
        self._applied: dict[str, set[str]] = {}  # store -> entries whose rows this state holds
        self._version = 0  # counts docs added: a cached past is valid for one version
        self._qs: list[Quarantine] | None = None  # the bank's quarantines, read on need
        self._hidden: tuple[int, np.ndarray | None] | None = None  # (docs, mask) for self._qs

    def _seq(self, entry_id: str) -> int:
        entry = self._db.entry(entry_id)
        return -1 if entry is None else entry.seq

    def _current_index(self) -> RecallIndex:
        if self._stale:
            self._rebuild()
        return self._ix

    def _rebuild(self) -> None:
        # Bulk: read every row once, docs in T order, then one bulk load per index. The result
        # is the state that feeding the rows one by one would give (tested).
        self._stale = True
        if not self._snapshot_tried:
            self._snapshot_tried = True
            if self._restore():
                return
        self._reset()
        self._snap_docs = None
        with gc_paused():
            mems: list[Memory] = []
            malformed = self._malformed
            applied = self._applied.setdefault(MEMORY_STORE, set())
            for rec in self._db.rows(MEMORY_STORE):  # in T order
                applied.add(rec.entry_id)
                m = parse_memory(rec)
                if m is not None:
                    mems.append(m)
                else:
                    malformed.add(rec.key)
            seq_of: dict[str, int] = {}
            seqs = [seq_of[m.entry_id] if m.entry_id in seq_of else seq_of.setdefault(m.entry_id, self._seq(m.entry_id))
                    for m in mems]
            ix = self._ix
            ix.add_many(mems, seqs)
            keys: list[int] = []
            item_docs: list[int] = []
            tombs: list[bool] = []
            newest: dict[str, int] = {}
            key_id = self._keys.id
            for doc, m in enumerate(mems):
                for target in self._note(m):
                    keys.append(key_id(target))
                    item_docs.append(doc)
                    tombs.append(True)
                keys.append(key_id(m.key))
                item_docs.append(doc)
                tombs.append(False)
                newest[m.key] = doc  # rows come in T order: the last one is the newest
            self._times.load(np.array(keys, dtype=np.int64), np.array(item_docs, dtype=np.int64),
                             np.array(tombs, dtype=bool))
            retired = self._retired
            current = sorted(d for d in newest.values() if retired.get(mems[d].key, _NEVER) < mems[d].order)
            ix.make_current_many(current)
            self._keys.load(newest, [(mems[d].key, d) for d in current])
            self._version += 1
            self._load_vectors()
        self._stale = False
        self.opened_from = "log"
        release_freed_memory()

    def _load_vectors(self) -> None:
        ix = self._ix
        ix.vectors = {}
        ix.old_vectors = {}
        ix.vec_order = {}
        self._pending = {}
        self._applied = {s: e for s, e in self._applied.items() if s == MEMORY_STORE}
        if self._store is None:
            return
        with gc_paused():
            records = self._db.rows(self._store)
            self._applied[self._store] = {rec.entry_id for rec in records}
            best: dict[tuple[int, int], tuple[Order, np.ndarray]] = {}
            row_doc, malformed, pending = ix.row_doc.as_dict(), self._malformed, self._pending
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
                elif row not in malformed:  # as _add_vector
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
                        self._feed_memories(event.rows)
                    elif event.store == self._store:
                        self._feed_vectors(event.rows)
                    elif event.store == QUARANTINE_STORE:
                        self._qs = None
            except Exception:  # a bug here must not fail the database's write
                log.exception("memory view of %s failed to apply an update; it will be rebuilt", self._db.id)
                self._stale = True

    def _feed_memories(self, rows: Iterable[RowRecord]) -> None:
        applied = self._applied.setdefault(MEMORY_STORE, set())
        for rec in rows:
            applied.add(rec.entry_id)
            self._add_memory(rec)

    def _feed_vectors(self, rows: Iterable[RowRecord]) -> None:
        assert self._store is not None
        applied = self._applied.setdefault(self._store, set())
        for rec in rows:
            applied.add(rec.entry_id)
            self._add_vector(rec)

    # ------------------------------------------------------------------------- snapshots
    def _stores(self) -> list[str]:
        return [MEMORY_STORE] if self._store is None else [MEMORY_STORE, self._store]

    def _restore(self) -> bool:
        """Load the snapshot if it is good (module docstring), then apply what it lacks."""
        assert self._snapshots is not None
        db = self._db
        try:
            with gc_paused():  # unpickling makes many objects and no cycles to collect
                state = self._snapshots.read(db.id, self._store, self._dim)
            stores = self._stores()
            applied = state["applied"]
            if sorted(applied) != sorted(stores):
                raise SnapshotRejected("of another set of stores")
            shown = {s: db.shown_entries(s) for s in stores}
            for s in stores:
                if not applied[s] <= shown[s]:
                    raise SnapshotRejected("stale: entries whose rows it holds no longer show them "
                                           "(a revocation, an erasure or a fork changed them)")
        except SnapshotRejected as exc:
            self.snapshot_note = str(exc)
            if str(exc) != "no snapshot":
                log.info("view snapshot of %s not used (%s): rebuilding from the log", db.id, exc)
                self._snapshots.drop(db.id, self._store, self._dim)
            return False
        try:
            with gc_paused():
                self._install(state)
                self._snap_docs = self._ix.cols.n
                self._feed_memories(db.rows_of(MEMORY_STORE, shown[MEMORY_STORE] - applied[MEMORY_STORE]))
                if self._store is not None:
                    self._feed_vectors(db.rows_of(self._store, shown[self._store] - applied[self._store]))
        except Exception:  # a state this code cannot take (only a bug of the writer): rebuild
            log.exception("view snapshot of %s could not be installed: rebuilding from the log", db.id)
            self.snapshot_note = "could not be installed"
            self._snapshots.drop(db.id, self._store, self._dim)
            return False
        self._stale = False
        self.opened_from = "snapshot"
        return True

    def _install(self, state: dict) -> None:
        self._reset()
        self._ix, self._times = state["ix"], state["times"]
        self._keys = state["keys"]
        self._retired = state["retired"]
        self._malformed = state["malformed"]
        self._pending = state["pending"]
        self._applied = state["applied"]
        self._version = state["version"] + 1

    def _save_snapshot(self) -> bool:
        """Write this state's snapshot (the caller holds the lock, the queue drained)."""
        if self._snapshots is None or self._stale:
            return False
        ix = self._ix
        state = {
            "ix": ix, "times": self._times, "keys": self._keys, "retired": self._retired,
            "malformed": self._malformed, "pending": self._pending, "applied": self._applied, "version": self._version,
        }
        self._snapshots.write(Meta(self._db.id, self._store, self._dim, ix.cols.n), state)
        self._snap_docs = ix.cols.n
        return True

    def _snapshot_due(self) -> bool:
        """Whether a snapshot is worth writing: a built view large enough, with no good
        snapshot on disk or one that lacks a tenth of its docs (at least 1,000)."""
        if self._snapshots is None or self._stale:
            return False
        n = self._ix.cols.n
        if n < self._snapshots.min_docs:
            return False
        return self._snap_docs is None or n - self._snap_docs >= max(1000, n // 10)

    def _add_memory(self, rec: RowRecord) -> None:
        if rec.key in self._ix.row_doc or rec.key in self._malformed:
            return  # seen before
        pending = self._pending.pop(rec.key, None)
        m = parse_memory(rec)
        if m is None:
            self._malformed.add(rec.key)
            return
        ix = self._ix
        doc = ix.add(m, self._seq(m.entry_id))
        self._version += 1
        keys = self._keys
        for target in self._note(m):
            self._times.add(keys.id(target), doc, True)
            cur = keys.current(target)
            if cur is not None and ix.mem.order(cur) < m.order:
                ix.retire(cur)  # retired by a newer row's supersedes edge
                keys.drop_current(target)
        self._times.add(keys.id(m.key), doc, False)
        newest = keys.newest(m.key)
        if newest is None or ix.mem.order(newest) < m.order:
            keys.set_newest(m.key, doc)
            cur = keys.drop_current(m.key)
            if cur is not None:
                ix.retire(cur)
            if self._retired.get(m.key, _NEVER) < m.order:  # else a newer row of another key retired it
                keys.set_current(m.key, doc)
                ix.make_current(doc)
        # else: an older row arriving late, superseded from the start
        if pending:
            for order, vec in pending.values():
                ix.index_vector(doc, order, vec)

    def _note(self, m: Memory) -> list[str]:
        """The other keys m supersedes (it is a tombstone in their timelines), noting the
        newest tombstone of each."""
        targets = []
        for edge in m.edges:
            if edge.type == SUPERSEDES and edge.to != m.key and edge.to not in targets:
                targets.append(edge.to)
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
        elif row not in self._malformed:
            slot = self._pending.setdefault(row, {})
            prev = slot.get(len(vec))
            if prev is None or prev[0] < rec.order:
                slot[len(vec)] = (rec.order, vec)
        # else: the row is malformed; only a rebuild could make it a memory
