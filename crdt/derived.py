"""Derived state of crdt/database.py, as a mixin of ``Database``: verdicts, erasure, which rows
are shown, the pycrdt documents and the row events.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import pycrdt

from memmesh.auth.permissions import ADMIN, WRITE
from memmesh.crdt.validity import Evaluator, Event
from memmesh.crdt.yjs import Row, decode_append_update

from memmesh.crdt.records import META, RowRecord, RowsAdded, _Stored, _apply_to


class DerivedState:
    """Derived from the log; rebuilt on open and when verdicts change."""

    # ------------------------------------------------------------------ derived state
    def _rebuild_verdicts(self) -> None:
        self._evaluator = Evaluator()
        self._settings_cache = None
        self._evaluator.add_many(
            Event(n.entry.id, n.author_key, n.entry.seq, n.height, n.vv, n.ops, n.entry.is_root,
                  ADMIN if any(op.author != n.author_key for op in n.erases) else WRITE)
            for n in self._nodes.values() if not n.excluded
        )

    def _recompute_erasure(self) -> None:
        """The payloads accepted erases remove; storage is made to match (idempotent, so a crash
        between storing an erase and deleting what it erases is mended on the next open)."""
        erased: set[tuple[str, str, str]] = set()
        for erase_id in self._erase_nodes:
            node = self._nodes[erase_id]
            if self._applies(node):
                erased.update((op.entry, op.store, op.author) for op in node.erases)
        self._erased = erased
        for entry_id, store, author in sorted(erased):
            target = self._nodes.get(entry_id)
            if target is None or target.author_key != author or store not in target.entry.stores:
                continue
            if store not in self._absent.get(entry_id, ()):
                self.storage.erase_payload(self.id, entry_id, store)
                self._absent.setdefault(entry_id, set()).add(store)

    def _applies(self, node: _Stored) -> bool:
        return not node.excluded and self._evaluator.verdict(node.entry.id).accepted

    def _visible(self, node: _Stored, store: str) -> bool:
        """Are the entry's rows of ``store`` shown? Accepted, payload held (so not erased), and
        no row key repeating one its author already showed: a crafted update that reuses its
        author's key is stored but never overwrites, on every replica alike (whether the earlier
        row is shown depends only on entries and erasures, never on arrival order)."""
        return (self._applies(node) and store not in self._absent.get(node.entry.id, ())
                and (node.entry.id, store) not in self._hidden)

    def _show(self, node: _Stored, rows: Mapping[str, tuple[Row, ...]]) -> dict[str, tuple[Row, ...]]:
        """Record which of a node's rows are shown (in storage order); returns them by store."""
        assert self._live is not None
        shown: dict[str, tuple[Row, ...]] = {}
        if not self._applies(node):
            return shown
        for store, store_rows in rows.items():
            if store in self._absent.get(node.entry.id, ()):
                continue
            live = self._live.setdefault(store, set())
            if any(r.key in live for r in store_rows):
                self._hidden.add((node.entry.id, store))
                continue
            live.update(r.key for r in store_rows)
            shown[store] = store_rows
        return shown

    def _ensure_live(self) -> None:
        if self._live is not None:
            return
        self._live = {}
        self._hidden = set()
        for stored in self.storage.entries(self.id):
            node = self._nodes.get(stored.id)
            if node is None or not self._applies(node):
                continue
            rows = {store: decode_append_update(update, root=store, client=node.entry.stores[store].client).rows
                    for store, update in stored.payloads.items() if update is not None}
            self._show(node, rows)

    def _doc(self, store: str) -> pycrdt.Doc:
        """A store's pycrdt document, built from the log the first time it is asked for and
        kept up to date from then on (documents nobody reads cost no memory)."""
        doc = self._docs.get(store)
        if doc is None:
            self._ensure_live()
            doc = pycrdt.Doc()
            doc.get(store, type=pycrdt.Map)
            # Storage order respects causality (parents are stored first), which is the order
            # each author's clocks must be integrated in.
            for stored in self.storage.entries(self.id, stores=[store]):
                node = self._nodes.get(stored.id)
                if node is not None and store in node.entry.stores:
                    _apply_to(doc, store, node.entry.stores[store], stored.payloads.get(store),
                              self._visible(node, store))
            self._docs[store] = doc
        return doc

    def _rebuild_docs(self) -> None:
        self._docs = {}  # rebuilt from the log when next read
        self._meta_cache = None
        self._small_rows = {}

    def _apply(self, applied: list[tuple[_Stored, dict[str, tuple[Row, ...]], Mapping[str, bytes | None]]],
               gc_fill: list[_Stored]) -> None:
        for node in gc_fill:
            for store, desc in node.entry.stores.items():
                self._small_rows.pop(store, None)
                doc = self._docs.get(store)
                if doc is not None:
                    _apply_to(doc, store, desc, None, False)
        by_store: dict[str, list[RowRecord]] = {}
        for node, rows, payloads in applied:
            shown = self._show(node, rows)
            for store, desc in node.entry.stores.items():
                doc = self._docs.get(store)
                if doc is not None:
                    _apply_to(doc, store, desc, payloads.get(store), store in shown)
            for store, store_rows in shown.items():
                by_store.setdefault(store, []).extend(self._records(store, node, store_rows))
        for store, rows in by_store.items():
            self._small_rows.pop(store, None)
            if store == META:
                self._meta_cache = None
            self._emit(RowsAdded(store, tuple(rows)))

    def _records(self, store: str, node: _Stored, rows: Sequence[Row]) -> list[RowRecord]:
        e = node.entry
        return [RowRecord(store, r.key, r.value, e.id, node.author_key, e.ts, (node.height, e.id, r.clock)) for r in rows]
