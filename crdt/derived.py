"""The derived state of a database: what the stored log means once judged.

Verdicts (crdt.validity) and the settings they give, which payloads accepted erases remove,
which rows are shown, the database's meta, and the pycrdt documents. All of it is a function of
the log index and the payloads in storage: rebuilt on open, and again whenever verdicts of
entries already applied change; otherwise kept up to date entry by entry (``apply``).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pycrdt

from memmesh.auth.permissions import ADMIN, WRITE, Permission
from memmesh.crdt.frozen import builder
from memmesh.crdt.log_index import DECODED_ON_OPEN, IndexedEntry, LogIndex
from memmesh.crdt.open_marks import read_marks, write_marks
from memmesh.crdt.records import META, RowRecord, RowsAdded, doc_update
from memmesh.crdt.row_keys import KeyRange, LiveKeys, ShownKeys
from memmesh.crdt.storage import Storage
from memmesh.crdt.validity import AuthSettings, Evaluator, Event, Verdict
from memmesh.crdt.yjs import Row, decode_append_update

# An entry applied by one ingest: its node, its decoded rows by store, the payloads stored.
Applied = tuple[IndexedEntry, Mapping[str, tuple[Row, ...]], Mapping[str, bytes | None]]


def event_of(node: IndexedEntry) -> Event:
    """The entry as the validity rule sees it."""
    needs = ADMIN if node.erases and any(op.author != node.author_key for op in node.erases) else WRITE
    entry = node.entry
    return _event(entry.id, node.author_key, entry.seq, node.height, node.vv, node.ops, entry.db is None, needs)


# One of each per entry received (crdt/frozen.py).
_event = builder(Event)
_record = builder(RowRecord)
_key_range = builder(KeyRange)

_FEW_ENTRIES = 8  # rows(store) reads a store held by under an eighth of the entries entry by entry


class DerivedState:
    """Derived from the log; rebuilt on open and when verdicts change."""

    def __init__(self, storage: Storage, db_id: str, index: LogIndex,
                 emit: Callable[[RowsAdded], None]) -> None:
        self._storage = storage
        self._db_id = db_id
        self._index = index
        self._emit = emit
        self._evaluator = Evaluator()
        self._settings_cache: AuthSettings | None = None
        self._meta_cache: dict[str, Any] | None = None
        self._small_rows: dict[str, list[RowRecord]] = {}  # store -> its rows (small_rows)
        self._docs: dict[str, pycrdt.Doc[pycrdt.Map[Any]]] = {}
        self._erased: set[tuple[str, str, str]] = set()  # (entry, store, author) of accepted erases
        self._live: dict[str, LiveKeys] | None = {}  # store -> row keys shown; None: recompute
        self._hidden: set[tuple[str, str]] = set()  # (entry, store): rows repeat keys already shown

    def moved_to(self, storage: Storage, emit: Callable[[RowsAdded], None]) -> DerivedState:
        """This state, with its log index, over ``storage``, which now holds exactly the entries
        it was derived from (a database checked over one storage, then stored in another:
        Database.adopt). Verdicts, erasure and the rows shown move; what was read from the old
        storage (documents, small stores, meta) is read again from the new one when asked. This
        object is not used afterwards."""
        moved = DerivedState(storage, self._db_id, self._index, emit)
        moved._evaluator = self._evaluator
        moved._settings_cache = self._settings_cache
        moved._erased = self._erased
        moved._live = self._live
        moved._hidden = self._hidden
        return moved

    @property
    def index(self) -> LogIndex:
        return self._index

    # ----------------------------------------------------------------------- verdicts
    def rebuild_verdicts(self) -> None:
        self._evaluator = Evaluator()
        self._settings_cache = None
        self._evaluator.add_many(event_of(n) for n in self._index.nodes.values() if not n.excluded)

    def add(self, event: Event) -> dict[str, Verdict]:
        """Judge a new entry; returns the verdicts that changed (its own among them)."""
        changed = self._evaluator.add(event)
        if event.ops or event.is_root:
            self._settings_cache = None
        return changed

    def preview(self, event: Event) -> Verdict:
        return self._evaluator.preview(event)

    def never_valid(self, event: Event) -> tuple[str, str] | None:
        return self._evaluator.never_valid(event)

    def verdict(self, entry_id: str) -> Verdict | None:
        node = self._index.get(entry_id)
        if node is None:
            return None
        if node.excluded:
            return Verdict(False, "entry.equivocation")
        return self._evaluator.verdict(entry_id)

    def is_accepted(self, entry_id: str) -> bool:
        v = self.verdict(entry_id)
        return bool(v and v.accepted)

    def applies(self, node: IndexedEntry) -> bool:
        return not node.excluded and self._evaluator.verdict(node.entry.id).accepted

    def explain(self, entry_id: str) -> str:
        return self._evaluator.explain(entry_id)

    def settings(self) -> AuthSettings:
        # Built from every accepted operation, so kept until a settings entry changes it (sync
        # asks for a caller's permission on every request).
        if self._settings_cache is None:
            self._settings_cache = self._evaluator.settings()
        return self._settings_cache

    def settings_at(self, vv: Mapping[str, int]) -> AuthSettings:
        return self._evaluator.settings_at(vv)

    def permission(self, key: str) -> Permission | None:
        state = self.settings().get(key)
        if state is None or state.status != "active":
            return None
        return state.permission

    # ------------------------------------------------------------------------ erasure
    def recompute_erasure(self) -> None:
        """The payloads accepted erases remove; storage is made to match (idempotent, so a crash
        between storing an erase and deleting what it erases is mended on the next open)."""
        erased: set[tuple[str, str, str]] = set()
        for erase_id in self._index.erase_nodes:
            node = self._index[erase_id]
            if self.applies(node):
                erased.update((op.entry, op.store, op.author) for op in node.erases)
        self._erased = erased
        for entry_id, store, author in sorted(erased):
            target = self._index.get(entry_id)
            if target is None or target.author_key != author or store not in target.entry.stores:
                continue
            if store not in self._index.absent(entry_id):
                self._storage.erase_payload(self._db_id, entry_id, store)
                self._index.mark_absent(entry_id, store)

    def is_erased(self, entry_id: str, store: str, author: str) -> bool:
        return (entry_id, store, author) in self._erased

    @property
    def erases_any(self) -> bool:
        return bool(self._erased)

    # --------------------------------------------------------------------- shown rows
    def visible(self, node: IndexedEntry, store: str) -> bool:
        """Are the entry's rows of ``store`` shown? Accepted, payload held (so not erased), and
        no row key repeating one its author already showed: a crafted update that reuses its
        author's key is stored but never overwrites, on every replica alike (whether the earlier
        row is shown depends only on entries and erasures, never on arrival order)."""
        return (self.applies(node) and store not in self._index.absent(node.entry.id)
                and (node.entry.id, store) not in self._hidden)

    def _show_keys(self, node: IndexedEntry, rows: Mapping[str, ShownKeys]) -> list[str]:
        """Record which of a node's stores are shown, from their rows' keys; returns them."""
        assert self._live is not None
        shown: list[str] = []
        if not self.applies(node):
            return shown
        stores = node.entry.stores
        absent = self._index.absent(node.entry.id)
        for store, keys in rows.items():
            if store in absent:
                continue
            live = self._live.get(store)
            if live is None:
                live = self._live[store] = LiveKeys()
            if not live.add_if_new(keys, stores[store].client):
                self._hidden.add((node.entry.id, store))
                continue
            shown.append(store)
        return shown

    def show_loaded(self, order: Sequence[tuple[IndexedEntry, Mapping[str, ShownKeys]]]) -> None:
        """Which rows are shown, from the entries just read from the log (in storage order)."""
        self._live = {}
        for node, rows in order:
            self._show_keys(node, rows)

    def ensure_live(self) -> None:
        """Which rows are shown, derived anew (after verdicts changed): a payload marked as
        checked (crdt/open_marks.py) is known by its key range, the others are decoded."""
        if self._live is not None:
            return
        self._live = {}
        self._hidden = set()
        marks = read_marks(self._storage, self._db_id)
        decoded = sorted({store for node in self._index.nodes.values() if self.applies(node)
                          for store in node.entry.stores
                          if store in DECODED_ON_OPEN or store not in marks.get(node.entry.id, ())})
        for stored in self._storage.entries(self._db_id, stores=decoded):
            node = self._index.get(stored.id)
            if node is None or not self.applies(node):
                continue
            marked = marks.get(stored.id, frozenset())
            rows: dict[str, ShownKeys] = {}
            for store, desc in sorted(node.entry.stores.items()):
                if store in marked and store not in DECODED_ON_OPEN:
                    rows[store] = KeyRange(desc.client, desc.clock, desc.clock_len)
                    continue
                update = stored.payloads.get(store)
                if update is not None:
                    rows[store] = decode_append_update(update, root=store, client=desc.client).rows
            self._show_keys(node, rows)

    def invalidate(self) -> None:
        """Verdicts of applied entries changed: shown rows and documents are derived anew when read."""
        self._live = None
        self._docs = {}
        self._meta_cache = None
        self._small_rows = {}

    def apply(self, applied: Sequence[Applied], gc_fill: Sequence[IndexedEntry]) -> None:
        """Bring documents and shown rows up to date with entries one ingest stored, without a
        rebuild: ``applied`` were accepted, ``gc_fill`` kept as candidates (their clocks only)."""
        updates: dict[str, list[bytes]] = {}  # per document, in the order they are applied
        for node in gc_fill:
            for store, desc in node.entry.stores.items():
                self._small_rows.pop(store, None)
                if store in self._docs:
                    updates.setdefault(store, []).append(doc_update(desc, None, False))
        # Every payload stored by this ingest passed its checks: recorded, open skips them.
        fresh = self._index.take_fresh_marks([n.entry.id for n in gc_fill] + [n.entry.id for n, _r, _p in applied])
        write_marks(self._storage, self._db_id, fresh)
        by_store: dict[str, list[RowRecord]] = {}
        for node, rows, payloads in applied:
            stores = node.entry.stores
            # A payload whose rows are keyed by their own clocks (what a mark records) is shown
            # by its key range, as open shows it: the same keys, compared without a string each.
            marked = fresh.get(node.entry.id)
            keys: Mapping[str, ShownKeys] = rows if not marked else {
                s: (_key_range(stores[s].client, stores[s].clock, stores[s].clock_len) if s in marked else r)
                for s, r in rows.items()}
            shown = self._show_keys(node, keys)
            for store, desc in stores.items():
                if store in self._docs:
                    updates.setdefault(store, []).append(doc_update(desc, payloads.get(store), store in shown))
            for store in shown:
                by_store.setdefault(store, []).extend(self._records(store, node, rows[store]))
        for store, pending in updates.items():
            doc = self._docs[store]
            # One document transaction for the batch: the same updates in the same order, without
            # a transaction each.
            with doc.transaction():
                for update in pending:
                    doc.apply_update(update)
        for store, records in by_store.items():
            self._small_rows.pop(store, None)
            if store == META:
                self._meta_cache = None
            self._emit(RowsAdded(store, tuple(records)))

    def _records(self, store: str, node: IndexedEntry, rows: Sequence[Row]) -> list[RowRecord]:
        e = node.entry
        author, height = node.author_key, node.height
        return [_record(store, r.key, r.value, e.id, author, e.ts, (height, e.id, r.clock)) for r in rows]

    # ------------------------------------------------------------------------ reading
    def rows(self, store: str) -> list[RowRecord]:
        """Every row of the store that is shown (accepted, payload held, not erased), in T order."""
        self.ensure_live()
        shown = self.shown_entries(store)
        if len(shown) * _FEW_ENTRIES <= len(self._index.nodes):
            # A store few entries hold (meta, quarantines, an agent's config in a big bank): read
            # those entries, not every entry's payloads (seconds at a million memories).
            return self.rows_of(store, shown)
        out: list[RowRecord] = []
        # Payloads are read from storage (the database keeps only headers in memory).
        for stored in self._storage.entries(self._db_id, stores=[store]):
            update = stored.payloads.get(store)
            node = self._index.get(stored.id)
            if update is None or node is None or not self.visible(node, store):
                continue
            client = node.entry.stores[store].client
            out.extend(self._records(store, node, decode_append_update(update, root=store, client=client).rows))
        out.sort(key=lambda r: r.order)
        return out

    def shown_entries(self, store: str) -> set[str]:
        """The entries whose rows of ``store`` are shown (what :meth:`rows` reads them from)."""
        self.ensure_live()
        return {node.entry.id for node in self._index.nodes.values()
                if store in node.entry.stores and self.visible(node, store)}

    def rows_of(self, store: str, entry_ids: Iterable[str]) -> list[RowRecord]:
        """The shown rows of ``store`` that these entries hold, in T order (rows of an entry
        not shown, or not held, are left out): :meth:`rows` for a few entries, read one by one."""
        self.ensure_live()
        out: list[RowRecord] = []
        for entry_id in entry_ids:
            node = self._index.get(entry_id)
            if node is None or store not in node.entry.stores or not self.visible(node, store):
                continue
            stored = self._storage.get(self._db_id, entry_id)
            update = None if stored is None else stored.payloads.get(store)
            if update is None:
                continue
            client = node.entry.stores[store].client
            out.extend(self._records(store, node, decode_append_update(update, root=store, client=client).rows))
        out.sort(key=lambda r: r.order)
        return out

    def small_rows(self, store: str) -> list[RowRecord]:
        cached = self._small_rows.get(store)
        if cached is None:
            cached = self._small_rows[store] = self.rows(store)
        return list(cached)

    def meta(self) -> dict[str, Any]:
        # Kept until a meta row is shown or derived state is rebuilt (reading it scans the log).
        if self._meta_cache is None:
            merged: dict[str, Any] = {}
            for row in self.rows(META):
                if isinstance(row.value, dict):
                    merged.update(row.value)
            self._meta_cache = merged
        return dict(self._meta_cache)

    def doc(self, store: str) -> pycrdt.Doc[pycrdt.Map[Any]]:
        """A store's pycrdt document, built from the log the first time it is asked for and
        kept up to date from then on (documents nobody reads cost no memory)."""
        doc = self._docs.get(store)
        if doc is None:
            self.ensure_live()
            doc = pycrdt.Doc()
            doc.get(store, type=pycrdt.Map)
            # Storage order respects causality (parents are stored first), which is the order
            # each author's clocks must be integrated in.
            for stored in self._storage.entries(self._db_id, stores=[store]):
                node = self._index.get(stored.id)
                if node is not None and store in node.entry.stores:
                    doc.apply_update(doc_update(node.entry.stores[store], stored.payloads.get(store),
                                                self.visible(node, store)))
            self._docs[store] = doc
        return doc
