"""A database: the signed entry DAG, its validation pipeline and its derived pycrdt state.

The signed log (in a Storage) is the source of truth. Everything here is derived from it and
rebuilt on open: per-entry causal metadata (height, version vector), author feeds, the
authorisation verdicts (crdt.validity); one pycrdt Doc per store is built from the log when
first read. Only headers are kept in memory; payloads are read from storage.

One pipeline serves local writes and entries received from peers (``ingest``):

1. size caps, framing, canonical form, payload hashes, signature  (crdt.entry, stateless)
2. database id, duplicates, missing parents -> bounded pending area
3. author feed: seq follows the author's previous entry in the entry's causal past
4. two entries at one (author, seq): equivocation, both kept as evidence, author flagged
5. every payload through the strict Yjs decoder (crdt.yjs): author's own client id,
   contiguous clocks, only new rows; `_settings` rows parsed as settings operations
6. authorisation at the entry's causal past (crdt.validity); entries that can never become
   valid are refused, entries a later event could overturn are kept as candidates
7. one SQLite transaction for the batch; only then is anything applied or acknowledged.
"""
from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import pycrdt

from auth.keys import SigningKey
from auth.ops import GrantOp, RevokeOp, parse_op
from auth.permissions import Permission, holds
from crdt.entry import Entry, StoreDescriptor, decode_entry, decode_many, sign_entry
from crdt.errors import AuthError, EntryRejected, MemmeshError, RejectedError, StorageError
from crdt.storage import Storage, StoredEntry
from crdt.validity import AuthSettings, Evaluator, Event, Verdict
from crdt.yjs import Row, check_append, decode_append_update, encode_gc, encode_rows

log = logging.getLogger(__name__)

SETTINGS = "_settings"
META = "meta"
_NO_PAYLOADS: Mapping[str, bytes | None] = MappingProxyType({})
STORE_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_:./-")
MAX_REJECTION_MEMORY = 1024


@dataclass(slots=True)
class _Stored:
    """What the database keeps in memory about one stored entry (its payloads stay in storage)."""

    entry: Entry
    author_key: str
    height: int
    vv: dict[str, int]
    ops: tuple[GrantOp | RevokeOp, ...]
    excluded: bool = False  # equivocation evidence: never evaluated or applied


@dataclass(frozen=True, slots=True)
class RowRecord:
    """One row of a store, as an accepted entry inserted it."""

    store: str
    key: str
    value: Any
    entry_id: str
    author: str
    ts: int
    order: tuple[int, str, int]  # (height, entry id, clock): T order, the deterministic "newest"


@dataclass
class IngestResult:
    accepted: list[str] = field(default_factory=list)  # stored and applied
    stored_rejected: list[str] = field(default_factory=list)  # kept as candidates, not applied
    rejected: list[tuple[str | None, str, str]] = field(default_factory=list)  # (id, reason, detail)
    pending: list[str] = field(default_factory=list)
    duplicates: int = 0

    def merge(self, other: "IngestResult") -> None:
        self.accepted += other.accepted
        self.stored_rejected += other.stored_rejected
        self.rejected += other.rejected
        self.pending += other.pending
        self.duplicates += other.duplicates


@dataclass(frozen=True, slots=True)
class RowsAdded:
    store: str
    rows: tuple[RowRecord, ...]


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """Verdicts of already-applied entries changed: derived state was rebuilt from the log."""


_gc_lock = threading.Lock()
_gc_depth = 0
_gc_state: list[bool] = []  # was the collector enabled when the outermost pause began


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a batch is processed.

    A batch allocates many small, long-lived objects (entries, version vectors, rows), and the
    collector would otherwise rescan everything alive each time a generation fills up: about a
    fifth of the cost of accepting an entry. Batches are bounded, so the pause is too; nested
    and concurrent batches share one pause.
    """
    global _gc_depth
    with _gc_lock:
        _gc_depth += 1
        if _gc_depth == 1:
            was_enabled = gc.isenabled()
            gc.disable()
            _gc_state.append(was_enabled)
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_state.pop():
                gc.enable()



def valid_store_name(name: str) -> bool:
    return bool(name) and len(name) <= 128 and set(name) <= STORE_NAME_CHARS


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Database:
    """One signed, append-only database, opened on a Storage."""

    def __init__(self, storage: Storage, db_id: str) -> None:
        self.storage = storage
        self.id = db_id
        self._listeners: list[Callable[[RowsAdded | Rebuilt], None]] = []
        self._rejections: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._reset()

    # ----------------------------------------------------------------- creation and loading
    @classmethod
    def create(
        cls,
        storage: Storage,
        key: SigningKey,
        *,
        meta: Mapping[str, Any],
        extra_grants: Sequence[GrantOp] = (),
    ) -> "Database":
        """A new database whose root grants ``key`` Admin(0) and carries ``meta``."""
        author = str(key.public)
        client = _client(key)
        ops = [{"op": "grant", "key": author, "perm": "admin", "priority": 0}]
        ops += [_op_value(op) for op in extra_grants]
        settings_rows = [(f"{client}/{i}", op) for i, op in enumerate(ops)]
        meta_rows = [(f"{client}/0", dict(meta))]
        payloads = {
            SETTINGS: (encode_rows(client, 0, SETTINGS, settings_rows), 0, len(settings_rows)),
            META: (encode_rows(client, 0, META, meta_rows), 0, 1),
        }
        root = sign_entry(key, db=None, seq=0, prev=None, parents=[], ts=_now_ms(),
                          payloads=payloads, nonce=os.urandom(16))
        storage.add_database(root.id)
        db = cls(storage, root.id)
        result = db.ingest_entries([root])
        if result.accepted != [root.id]:
            raise MemmeshError(f"could not create the database: {result.rejected}")
        return db

    @classmethod
    def open(cls, storage: Storage, db_id: str) -> "Database":
        if db_id not in storage.databases():
            raise MemmeshError(f"no database {db_id} on this node")
        db = cls(storage, db_id)
        db._load()
        return db

    def _reset(self) -> None:
        self._nodes: dict[str, _Stored] = {}
        self._by_seq: dict[tuple[str, int], str] = {}
        self._feed_top: dict[str, tuple[int, str]] = {}  # author -> (highest seq, entry id)
        self._equivocators: dict[str, int] = {}  # author -> first forked seq
        self._next_clock: dict[tuple[str, str], int] = {}
        self._row_keys: dict[str, set[str]] = {}
        self._heads: set[str] = set()
        self._evaluator = Evaluator()
        self._docs: dict[str, pycrdt.Doc] = {}
        self._waiting: dict[str, set[str]] = {}  # missing parent -> pending entry ids
        self._pending: dict[str, tuple[StoredEntry, tuple[str, ...]]] = {}  # id -> (entry, missing)

    def _load(self) -> None:
        """Rebuild every piece of derived state from what storage holds."""
        with _gc_paused():
            self._load_all()

    def _load_all(self) -> None:
        self._reset()
        stored = list(self.storage.entries(self.id))
        # Everything in storage passed the whole pipeline before it was written: the signatures
        # are not checked again (that would be most of the cost of opening a database).
        entries = [decode_entry(s.header, s.payloads, verify_signature=False) for s in stored]
        for entry in entries:
            self._index(entry)
        self._rebuild_verdicts()
        self._rebuild_docs()
        for pending, missing in self.storage.pending(self.id):
            self._pending[pending.id] = (pending, tuple(missing))
            for parent in missing:
                self._waiting.setdefault(parent, set()).add(pending.id)

    # ------------------------------------------------------------------------ observation
    def subscribe(self, listener: Callable[[RowsAdded | Rebuilt], None]) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[RowsAdded | Rebuilt], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _emit(self, event: RowsAdded | Rebuilt) -> None:
        for listener in self._listeners:
            listener(event)

    # ---------------------------------------------------------------------------- reading
    @property
    def heads(self) -> tuple[str, ...]:
        return tuple(sorted(self._heads))

    def __len__(self) -> int:
        return len(self._nodes)

    def entry(self, entry_id: str) -> Entry | None:
        node = self._nodes.get(entry_id)
        return node.entry if node else None

    def verdict(self, entry_id: str) -> Verdict | None:
        node = self._nodes.get(entry_id)
        if node is None:
            return None
        if node.excluded:
            return Verdict(False, "entry.equivocation")
        return self._evaluator.verdict(entry_id)

    def is_accepted(self, entry_id: str) -> bool:
        v = self.verdict(entry_id)
        return bool(v and v.accepted)

    def accepted_ids(self) -> set[str]:
        return {i for i in self._nodes if self.is_accepted(i)}

    def settings(self) -> AuthSettings:
        return self._evaluator.settings()

    def permission(self, key: str) -> Permission | None:
        state = self.settings().get(key)
        if state is None or state.status != "active":
            return None
        return state.permission

    def feeds(self) -> dict[str, tuple[int, str]]:
        """author -> (highest seq, its entry id): what sync compares."""
        return dict(self._feed_top)

    @property
    def equivocators(self) -> dict[str, int]:
        return dict(self._equivocators)

    def doc(self, store: str) -> pycrdt.Doc:
        """The derived pycrdt document of a store (read it; never write to it)."""
        return self._doc(store)

    def stores(self) -> list[str]:
        return sorted(self._row_keys)

    def rows(self, store: str) -> list[RowRecord]:
        """Every row of the store inserted by an accepted entry, in T order."""
        out: list[RowRecord] = []
        # Payloads are read from storage (the database keeps only headers in memory).
        for stored in self.storage.entries(self.id, stores=[store]):
            update = stored.payloads.get(store)
            node = self._nodes.get(stored.id)
            if update is None or node is None or not self._applies(node):
                continue
            client = node.entry.stores[store].client
            out.extend(self._records(store, node, decode_append_update(update, root=store, client=client).rows))
        out.sort(key=lambda r: r.order)
        return out

    def meta(self) -> dict[str, Any]:
        """The database's meta: later rows (T order) override earlier fields."""
        merged: dict[str, Any] = {}
        for row in self.rows(META):
            if isinstance(row.value, dict):
                merged.update(row.value)
        return merged

    def explain(self, entry_id: str) -> str:
        if entry_id in self._rejections:
            reason, detail = self._rejections[entry_id]
            return f"{entry_id} was refused ({reason}): {detail}"
        node = self._nodes.get(entry_id)
        if node is None:
            return f"{entry_id} is not known to this database"
        if node.excluded:
            fork = self._equivocators[node.author_key]
            return (f"{entry_id} is signed by {node.author_key}, which signed two different entries "
                    f"at seq {fork}; its entries from that seq on are kept as evidence, not applied")
        return self._evaluator.explain(entry_id)

    # ---------------------------------------------------------------------------- writing
    def transaction(self, key: SigningKey) -> "Transaction":
        """Start a local write. The key must be allowed to write; checked now and at commit."""
        self._check_can(key, "write")
        return Transaction(self, key)

    def change_settings(self, key: SigningKey, ops: Sequence[GrantOp | RevokeOp]) -> str:
        """Grant, change or revoke keys in one signed entry; returns its id."""
        txn = Transaction(self, key)
        for op in ops:
            txn.append(SETTINGS, _op_value(op))
        return txn.commit()

    def set_meta(self, key: SigningKey, **fields: Any) -> str:
        self._check_can(key, "admin")
        txn = Transaction(self, key)
        txn.append(META, fields)
        return txn.commit()

    def _check_can(self, key: SigningKey, needed: str) -> None:
        perm = self.permission(str(key.public))
        if not holds(perm, needed):
            raise AuthError(
                f"auth.not_{'admin' if needed == 'admin' else 'writer'}",
                f"key {key.public} may not {'administer' if needed == 'admin' else 'write to'} "
                f"database {self.id} (it holds {_perm_text(perm)})",
            )

    def _commit_local(self, key: SigningKey, staged: Mapping[str, list[Any]],
                      base: Mapping[str, int] | None = None) -> str:
        author = str(key.public)
        client = _client(key)
        needed = "admin" if SETTINGS in staged else "write"
        self._check_can(key, needed)
        if author in self._equivocators:
            raise AuthError("entry.equivocation", f"key {author} is flagged for equivocation in {self.id}")
        payloads = {}
        for store, values in staged.items():
            if not valid_store_name(store):
                raise RejectedError("entry.store_name", f"invalid store name {store!r}")
            clock = self._next_clock.get((author, store), 0)
            if base is not None and base.get(store, clock) != clock:
                raise MemmeshError(
                    f"another write by {author} to {store!r} committed while this transaction was "
                    "open, so the row keys it handed out changed; run the transaction again"
                )
            rows = [(f"{client}/{clock + i}", v) for i, v in enumerate(values)]
            try:
                update = encode_rows(client, clock, store, rows)
            except (TypeError, ValueError) as exc:  # a value Yjs cannot hold (or nests too deep)
                raise RejectedError("entry.value", f"a row for store {store!r} cannot be stored: {exc}") from None
            payloads[store] = (update, clock, len(rows))
        last = self._last_of(author)
        entry = sign_entry(
            key, db=self.id, seq=0 if last is None else last[0] + 1,
            prev=None if last is None else last[1], parents=sorted(self._heads),
            ts=_now_ms(), payloads=payloads,
        )
        result = self._ingest([entry], local=True)
        if entry.id not in result.accepted:
            reason, detail = next(((r, d) for i, r, d in result.rejected if i == entry.id),
                                  ("auth.rejected", "the entry was not accepted"))
            raise AuthError(reason, detail)
        return entry.id

    def _last_of(self, author: str) -> tuple[int, str] | None:
        return self._feed_top.get(author)

    # --------------------------------------------------------------------------- ingesting
    def ingest(self, items: Iterable[tuple[bytes, Mapping[str, bytes | None]]]) -> IngestResult:
        """Validate, store and apply entries received from a peer (header, payloads)."""
        batch = list(items)
        if len(batch) < 32:  # a pause is not worth it for a few entries
            return self._ingest_received(batch)
        with _gc_paused():
            return self._ingest_received(batch)

    def _ingest_received(self, batch: list[tuple[bytes, Mapping[str, bytes | None]]]) -> IngestResult:
        entries: list[Entry] = []
        result = IngestResult()
        # Signatures of the whole batch are checked first, on every core (decode_many).
        for item in decode_many(batch, expected_db=self.id):
            if isinstance(item, Entry):
                entries.append(item)
            else:
                result.rejected.append((None, item.reason, str(item)))
        result.merge(self._ingest(entries, local=False))
        return result

    def ingest_entries(self, entries: Sequence[Entry]) -> IngestResult:
        """Like ingest, for entries already decoded by decode_entry (e.g. built locally)."""
        for e in entries:
            if (e.db or e.id) != self.id:
                raise EntryRejected("entry.db", f"entry {e.id} belongs to another database")
        with _gc_paused():
            return self._ingest(list(entries), local=False)

    def _ingest(self, entries: list[Entry], *, local: bool) -> IngestResult:
        result = IngestResult()
        staged: list[Entry] = []
        from_pending: list[str] = []
        queue = list(entries)
        rebuild = False
        new_rows: list[tuple[_Stored, dict[str, tuple[Row, ...]], Mapping[str, bytes | None]]] = []
        gc_fill: list[_Stored] = []
        try:
            while queue:
                entry = queue.pop(0)
                if entry.id in self._nodes:
                    result.duplicates += 1
                    continue
                missing = [p for p in entry.parents if p not in self._nodes]
                if entry.prev is not None and entry.prev not in self._nodes and entry.prev not in missing:
                    missing.append(entry.prev)
                if missing:
                    if local:
                        raise MemmeshError("a local entry names unknown parents")
                    try:
                        self.storage.put_pending(self.id, _stored(entry), missing)
                    except StorageError as exc:  # the bounded area is full: refuse this one
                        result.rejected.append((entry.id, "entry.pending_full", str(exc)))
                        continue
                    self._pending[entry.id] = (_stored(entry), tuple(missing))
                    for parent in missing:
                        self._waiting.setdefault(parent, set()).add(entry.id)
                    result.pending.append(entry.id)
                    continue
                try:
                    node, outcome, rows = self._admit(entry)
                except RejectedError as exc:
                    self._remember_rejection(entry.id, exc.reason, str(exc))
                    result.rejected.append((entry.id, exc.reason, str(exc)))
                    continue
                staged.append(entry)
                if outcome == "rebuild":
                    rebuild = True
                elif outcome == "accepted":
                    result.accepted.append(entry.id)
                    new_rows.append((node, rows, entry.payloads))
                else:
                    result.stored_rejected.append(entry.id)
                    gc_fill.append(node)
                # Entries that waited for this one can now be considered.
                for waiting_id in sorted(self._waiting.pop(entry.id, ())):
                    if any(p not in self._nodes for p in self._pending_missing(waiting_id)):
                        continue
                    pending_entry = self._pending_entry(waiting_id)
                    from_pending.append(waiting_id)  # leaves the pending area either way
                    if pending_entry is not None:
                        queue.append(pending_entry)
            if staged or from_pending:
                self.storage.append(self.id, [_stored(e) for e in staged], drop_pending=from_pending)
        except Exception:
            # Memory may be ahead of what was committed: the log decides.
            self._load()
            raise
        if rebuild:
            accepted_now = {e.id for e in staged if self.is_accepted(e.id)}
            result.accepted = [e.id for e in staged if e.id in accepted_now]
            result.stored_rejected = [e.id for e in staged if e.id not in accepted_now]
            self._rebuild_docs()
            self._emit(Rebuilt())
        else:
            self._apply(new_rows, gc_fill)
        return result

    def _remember_rejection(self, entry_id: str, reason: str, detail: str) -> None:
        self._rejections[entry_id] = (reason, detail)
        while len(self._rejections) > MAX_REJECTION_MEMORY:
            self._rejections.popitem(last=False)

    def _pending_missing(self, entry_id: str) -> tuple[str, ...]:
        item = self._pending.get(entry_id)
        return item[1] if item else ()

    def _pending_entry(self, entry_id: str) -> Entry | None:
        item = self._pending.pop(entry_id, None)
        if item is None:
            return None
        try:
            return decode_entry(item[0].header, item[0].payloads, expected_db=self.id)
        except RejectedError:
            return None

    def _admit(self, entry: Entry) -> tuple[_Stored, str, dict[str, tuple[Row, ...]]]:
        """Steps 3-6 for one entry whose parents are all known; indexes it on success.

        Returns the node and "accepted", "candidate" (stored, not applied) or "rebuild"
        (verdicts of earlier entries changed).
        """
        author = entry.author_key
        vv, height = self._past_of(entry)
        if entry.is_root:
            if self._nodes:
                raise EntryRejected("entry.db", "a database has exactly one root entry")
        else:
            if vv.get(author, -1) != entry.seq - 1:
                raise EntryRejected(
                    "entry.feed",
                    f"seq {entry.seq} does not follow the author's latest entry in its causal past "
                    f"(seq {vv.get(author, -1)})",
                )
            if entry.prev is not None:
                prev = self._nodes[entry.prev]
                if prev.author_key != author or prev.entry.seq != entry.seq - 1:
                    raise EntryRejected("entry.feed", "prev is not the author's entry at seq - 1")
        vv[author] = entry.seq
        other = self._by_seq.get((author, entry.seq))
        if other is not None and other != entry.id:
            # Equivocation: keep both as evidence, stop applying the author's feed from here.
            node = _Stored(entry, author, height, vv, (), excluded=True)
            self._insert_node(node, {})
            self._flag_equivocator(author, entry.seq)
            self._rebuild_verdicts()
            return node, "rebuild", {}
        if entry.seq >= self._equivocators.get(author, entry.seq + 1):
            node = _Stored(entry, author, height, vv, (), excluded=True)
            self._insert_node(node, {})
            return node, "candidate", {}
        ops, rows = self._check_payloads(entry, author)
        event = Event(entry.id, author, entry.seq, height, vv, ops, entry.is_root)
        self._precheck(event)
        node = _Stored(entry, author, height, vv, ops)
        self._insert_node(node, rows)
        changed = self._evaluator.add(event)
        verdict = self._evaluator.verdict(entry.id)
        if any(i != entry.id and i in self._nodes for i in changed):
            return node, "rebuild", rows
        return node, "accepted" if verdict.accepted else "candidate", rows

    def _insert_node(self, node: _Stored, rows: Mapping[str, tuple[Row, ...]]) -> None:
        entry = node.entry
        if entry.payloads:
            # Headers stay in memory; payloads live in storage only (read when rebuilding).
            entry = node.entry = Entry(entry.id, entry.header, entry.author, entry.seq, entry.prev, entry.parents,
                                       entry.ts, entry.db, entry.nonce, entry.stores, _NO_PAYLOADS)
        self._nodes[entry.id] = node
        self._by_seq.setdefault((node.author_key, entry.seq), entry.id)
        top = self._feed_top.get(node.author_key)
        if top is None or entry.seq > top[0]:
            self._feed_top[node.author_key] = (entry.seq, entry.id)
        for p in entry.parents:
            self._heads.discard(p)
        self._heads.add(entry.id)
        if not node.excluded:
            for store, desc in entry.stores.items():
                self._next_clock[(node.author_key, store)] = desc.clock_end
                self._row_keys.setdefault(store, set())
            for store, store_rows in rows.items():
                self._row_keys[store].update(r.key for r in store_rows)

    def _index(self, entry: Entry) -> None:
        """Index a stored entry on load (no authorisation: _rebuild_verdicts does that)."""
        author = entry.author_key
        vv, height = self._past_of(entry)
        vv[author] = entry.seq
        other = self._by_seq.get((author, entry.seq))
        excluded = entry.seq >= self._equivocators.get(author, entry.seq + 1)
        if other is not None and other != entry.id:
            self._flag_equivocator(author, entry.seq)
            excluded = True
        ops: tuple = ()
        rows: dict[str, tuple[Row, ...]] = {}
        if not excluded:
            ops, rows = self._check_payloads(entry, author)
        self._insert_node(_Stored(entry, author, height, vv, ops, excluded=excluded), rows)

    def _past_of(self, entry: Entry) -> tuple[dict[str, int], int]:
        """The version vector of the entry's causal past (its parents' merged) and its height."""
        parents = [self._nodes[p] for p in entry.parents]
        if not parents:
            return {}, 0
        vv = dict(parents[0].vv)
        height = parents[0].height + 1
        for parent in parents[1:]:
            height = max(height, parent.height + 1)
            for a, s in parent.vv.items():
                if vv.get(a, -1) < s:
                    vv[a] = s
        return vv, height

    def _flag_equivocator(self, author: str, seq: int) -> None:
        """Stop applying ``author``'s feed from ``seq`` on: its entries become evidence only."""
        fork = min(self._equivocators.get(author, seq), seq)
        self._equivocators[author] = fork
        for node in self._nodes.values():
            if node.author_key == author and node.entry.seq >= fork:
                node.excluded = True

    def _check_payloads(
        self, entry: Entry, author: str
    ) -> tuple[tuple[GrantOp | RevokeOp, ...], dict[str, tuple[Row, ...]]]:
        """Strict Yjs checks of every payload; returns the settings operations it carries."""
        ops: list[GrantOp | RevokeOp] = []
        decoded_rows: dict[str, tuple[Row, ...]] = {}
        for store, desc in entry.stores.items():
            if not valid_store_name(store):
                raise EntryRejected("entry.store_name", f"invalid store name {store!r}")
            expected = self._next_clock.get((author, store), 0)
            update = entry.payloads.get(store)
            if update is None:
                if store == SETTINGS:
                    raise EntryRejected("entry.payload_missing", "settings payloads are never erased")
                if desc.clock != expected:
                    raise EntryRejected("yjs.clock_gap" if desc.clock > expected else "yjs.clock_reuse",
                                        f"store {store!r} clock {desc.clock}, expected {expected}")
                continue
            decoded = decode_append_update(update, root=store, client=desc.client)
            if decoded.clock != desc.clock or decoded.length != desc.clock_len:
                raise EntryRejected("entry.payload", f"store {store!r} update does not cover the clock range its descriptor claims")
            keys = self._row_keys.get(store, ())
            check_append(decoded, next_clock=expected, exists=keys.__contains__)
            decoded_rows[store] = decoded.rows
            if store == SETTINGS:
                for row in decoded.rows:
                    ops.append(parse_op(row.value))
        # Row keys are indexed when the node is inserted (after every check passed).
        return tuple(ops), decoded_rows

    def _precheck(self, event: Event) -> None:
        """Refuse entries that no later event could make valid (they are never stored)."""
        reason = self._evaluator.never_valid(event) if hasattr(self._evaluator, "never_valid") else None
        if reason is not None:
            raise AuthError(reason[0], reason[1])

    # ------------------------------------------------------------------ derived state
    def _rebuild_verdicts(self) -> None:
        self._evaluator = Evaluator()
        self._evaluator.add_many(
            Event(n.entry.id, n.author_key, n.entry.seq, n.height, n.vv, n.ops, n.entry.is_root)
            for n in self._nodes.values() if not n.excluded
        )

    def _applies(self, node: _Stored) -> bool:
        return not node.excluded and self._evaluator.verdict(node.entry.id).accepted

    def _doc(self, store: str) -> pycrdt.Doc:
        """A store's pycrdt document, built from the log the first time it is asked for and
        kept up to date from then on (documents nobody reads cost no memory)."""
        doc = self._docs.get(store)
        if doc is None:
            doc = pycrdt.Doc()
            doc.get(store, type=pycrdt.Map)
            # Storage order respects causality (parents are stored first), which is the order
            # each author's clocks must be integrated in.
            for stored in self.storage.entries(self.id, stores=[store]):
                node = self._nodes.get(stored.id)
                if node is not None and store in node.entry.stores:
                    _apply_to(doc, store, node.entry.stores[store], stored.payloads.get(store), self._applies(node))
            self._docs[store] = doc
        return doc

    def _rebuild_docs(self) -> None:
        self._docs = {}  # rebuilt from the log when next read

    def _apply_entry(self, node: _Stored, accepted: bool, payloads: Mapping[str, bytes | None]) -> None:
        for store, desc in node.entry.stores.items():
            doc = self._docs.get(store)
            if doc is not None:
                _apply_to(doc, store, desc, payloads.get(store), accepted)

    def _apply(self, applied: list[tuple[_Stored, dict[str, tuple[Row, ...]], Mapping[str, bytes | None]]],
               gc_fill: list[_Stored]) -> None:
        for node in gc_fill:
            self._apply_entry(node, False, {})
        by_store: dict[str, list[RowRecord]] = {}
        for node, rows, payloads in applied:
            self._apply_entry(node, True, payloads)
            for store, store_rows in rows.items():
                by_store.setdefault(store, []).extend(self._records(store, node, store_rows))
        for store, rows in by_store.items():
            self._emit(RowsAdded(store, tuple(rows)))

    def _records(self, store: str, node: _Stored, rows: Sequence[Row]) -> list[RowRecord]:
        e = node.entry
        return [RowRecord(store, r.key, r.value, e.id, node.author_key, e.ts, (node.height, e.id, r.clock)) for r in rows]

    # ------------------------------------------------------------------------- erasure
    def erase(self, key: SigningKey, entry_id: str, store: str) -> None:
        """Erase one payload (admin only). The entry, its id and signature stay valid."""
        self._check_can(key, "admin")
        if store == SETTINGS:
            raise RejectedError("erase.settings", "settings payloads cannot be erased: authorisation depends on them")
        node = self._nodes.get(entry_id)
        if node is None or store not in node.entry.stores:
            raise MemmeshError(f"no payload {store!r} in entry {entry_id}")
        self.storage.erase_payload(self.id, entry_id, store)
        self._load()
        self._emit(Rebuilt())


class Transaction:
    """Rows staged for one signed entry; commit() signs, validates, stores and applies it."""

    def __init__(self, db: Database, key: SigningKey) -> None:
        self._db = db
        self._key = key
        self._staged: dict[str, list[Any]] = {}
        self._base: dict[str, int] = {}  # per store, the author's next clock at the first append
        self.entry_id: str | None = None

    def append(self, store: str, value: Any) -> str:
        """Stage a new row; returns the row key it will have once committed."""
        rows = self._staged.setdefault(store, [])
        rows.append(value)
        base = self._base.setdefault(store, self._db._next_clock.get((str(self._key.public), store), 0))
        return f"{_client(self._key)}/{base + len(rows) - 1}"

    def commit(self) -> str:
        if self.entry_id is not None:
            raise MemmeshError("transaction already committed")
        if not self._staged:
            raise MemmeshError("nothing to commit")
        self.entry_id = self._db._commit_local(self._key, self._staged, self._base)
        return self.entry_id

    def __enter__(self) -> "Transaction":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and self._staged and self.entry_id is None:
            self.commit()


def _client(key: SigningKey) -> int:
    from crdt.entry import client_id_for

    return client_id_for(key.public.raw)


def _apply_to(doc: pycrdt.Doc, store: str, desc: StoreDescriptor, update: bytes | None, accepted: bool) -> None:
    if accepted and update is not None:
        doc.apply_update(update)
    else:
        # Keep the author's clocks contiguous so its later entries still integrate.
        doc.apply_update(encode_gc(desc.client, desc.clock, desc.clock_len))


def _stored(entry: Entry) -> StoredEntry:
    return StoredEntry(entry.id, entry.header, dict(entry.payloads))


def _op_value(op: GrantOp | RevokeOp | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(op, Mapping):
        return dict(op)
    if isinstance(op, RevokeOp):
        return {"op": "revoke", "key": op.key}
    value: dict[str, Any] = {"op": "grant", "key": op.key, "perm": op.perm}
    if op.priority is not None:
        value["priority"] = op.priority
    return value


def _perm_text(perm: Permission | None) -> str:
    if perm is None:
        return "no permission"
    return perm.level if perm.priority is None else f"{perm.level}({perm.priority})"
