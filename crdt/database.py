"""A database: the signed entry DAG, its validation pipeline and its derived pycrdt state.

The signed log (in a Storage) is the source of truth. Everything here is derived from it and
rebuilt on open: per-entry causal metadata (height, version vector), author feeds, the
authorisation verdicts (crdt.validity), which payloads are erased (crdt.erasure); one pycrdt
Doc per store is built from the log when first read. Only headers are kept in memory;
payloads are read from storage.

One pipeline serves local writes and entries received from peers (``ingest``):

1. size caps, framing, canonical form, payload hashes, signature  (crdt.entry, stateless)
2. database id, duplicates (a copy of a stored entry may fill in a payload it lacked)
3. missing parents, or a payload that has not arrived and that no stored erase covers:
   the entry waits in the bounded pending area (crdt.pending); its present payloads are
   shape-checked first, so nothing malformed waits either
4. author feed: seq follows the author's previous entry in the entry's causal past
5. every payload through the strict Yjs decoder (crdt.yjs): author's own client id,
   contiguous clocks along the entry's own feed, only new rows; `_settings` rows parsed as
   settings operations, `_erase` rows as erasures. These structural checks run for every
   entry, whatever its author's standing (flagged, revoked or unknown)
6. two entries at one (author, seq): equivocation, both kept as evidence, author flagged
7. authorisation at the entry's causal past (crdt.validity); entries that can never become
   valid are refused, entries a later event could overturn are kept as candidates, a
   bounded number per author
8. one SQLite transaction for the batch; only then is anything applied or acknowledged.

Every refusal is recorded (crdt.refusals) so that ``explain`` can answer for it.
"""
from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import pycrdt

from auth.keys import SigningKey
from auth.ops import GrantOp, RevokeOp, parse_op
from auth.permissions import ADMIN, WRITE, Permission, holds
from crdt.entry import Entry, StoreDescriptor, decode_entry, decode_many, id_of, sign_entry
from crdt.erasure import ERASE, UNERASABLE, EraseOp, parse_erase
from crdt.errors import AuthError, EntryRejected, MemmeshError, RejectedError, StorageError
from crdt.pending import PendingArea, PendingLimits
from crdt.refusals import Refusal, RefusalLog
from crdt.storage import Storage, StoredEntry
from crdt.validity import AuthSettings, Evaluator, Event, Verdict
from crdt.yjs import DecodedUpdate, Row, check_append, decode_append_update, encode_gc, encode_rows

log = logging.getLogger(__name__)

SETTINGS = "_settings"
META = "meta"
_NO_PAYLOADS: Mapping[str, bytes | None] = MappingProxyType({})
STORE_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_:./-")
# What is kept of an author's entries that are not valid (candidates that a later event could
# make valid, and equivocation evidence after a fork): enough to decide and to prove, never an
# unbounded tail. Entries another stored or pending entry names as a parent are always kept,
# so that the bound never cuts an honest writer's entry off from its past.
MAX_UNACCEPTED_ENTRIES = 64
MAX_UNACCEPTED_BYTES = 8 * 1024 * 1024


@dataclass(slots=True)
class _Stored:
    """What the database keeps in memory about one stored entry (its payloads stay in storage)."""

    entry: Entry
    author_key: str
    height: int
    vv: dict[str, int]
    ops: tuple[GrantOp | RevokeOp, ...]
    erases: tuple[EraseOp, ...] = ()
    excluded: bool = False  # equivocation evidence: never evaluated or applied
    size: int = 0  # header and payload bytes it arrived with


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
    pending: list[str] = field(default_factory=list)  # waiting for parents or payloads
    filled: list[tuple[str, str]] = field(default_factory=list)  # (entry id, store) payloads filled in
    duplicates: int = 0

    def merge(self, other: "IngestResult") -> None:
        self.accepted += other.accepted
        self.stored_rejected += other.stored_rejected
        self.rejected += other.rejected
        self.pending += other.pending
        self.filled += other.filled
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


@dataclass(frozen=True, slots=True)
class _Shape:
    """What the stateless checks of one payload found."""

    rows: tuple[Row, ...]
    ops: tuple[GrantOp | RevokeOp, ...]
    erases: tuple[EraseOp, ...]


def check_payload_shape(store: str, desc: StoreDescriptor, update: bytes) -> _Shape:
    """Every check of one payload that needs nothing but the payload and its descriptor.

    Raises RejectedError with the reason code; the same verdict on every replica, whatever
    else it holds (row keys are author-prefixed, so a row can only ever collide with a row of
    its own author; see Database._visible for how such a collision is shown).
    """
    if not valid_store_name(store):
        raise EntryRejected("entry.store_name", f"invalid store name {store!r}")
    decoded = decode_append_update(update, root=store, client=desc.client)
    if decoded.clock != desc.clock or decoded.length != desc.clock_len:
        raise EntryRejected("entry.payload", f"store {store!r} update does not cover the clock range its descriptor claims")
    check_append(decoded, next_clock=desc.clock, exists=_never)
    ops: tuple = ()
    erases: tuple = ()
    if store == SETTINGS:
        ops = tuple(parse_op(row.value) for row in decoded.rows)
    elif store == ERASE:
        erases = tuple(parse_erase(row.value, valid_store=valid_store_name) for row in decoded.rows)
    return _Shape(decoded.rows, ops, erases)


def _never(_key: str) -> bool:
    return False


class Database:
    """One signed, append-only database, opened on a Storage."""

    def __init__(self, storage: Storage, db_id: str, *, pending_limits: PendingLimits | None = None,
                 clock: Callable[[], int] | None = None) -> None:
        self.storage = storage
        self.id = db_id
        self._listeners: list[Callable[[RowsAdded | Rebuilt], None]] = []
        self._stored_listeners: list[Callable[[tuple[str, ...]], None]] = []
        self._clock = clock or _now_ms  # the informational ts of local entries, the pending TTL
        self._refusals = RefusalLog(storage, db_id)
        self._pending = PendingArea(storage, db_id, pending_limits, self._clock)
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
        nonce: bytes | None = None,
        clock: Callable[[], int] | None = None,
    ) -> "Database":
        """A new database whose root grants ``key`` Admin(0) and carries ``meta``.

        ``nonce`` (16 bytes, random by default) and ``clock`` (ms, for entries' informational
        ``ts``) let a simulation make the same database from the same seed.
        """
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
        root = sign_entry(key, db=None, seq=0, prev=None, parents=[], ts=(clock or _now_ms)(),
                          payloads=payloads, nonce=nonce if nonce is not None else os.urandom(16))
        storage.add_database(root.id)
        db = cls(storage, root.id, clock=clock)
        result = db.ingest_entries([root], source="local")
        if result.accepted != [root.id]:
            raise MemmeshError(f"could not create the database: {result.rejected}")
        return db

    @classmethod
    def open(cls, storage: Storage, db_id: str, *, pending_limits: PendingLimits | None = None,
             clock: Callable[[], int] | None = None) -> "Database":
        if db_id not in storage.databases():
            raise MemmeshError(f"no database {db_id} on this node")
        db = cls(storage, db_id, pending_limits=pending_limits, clock=clock)
        db._load()
        return db

    def _reset(self) -> None:
        self._nodes: dict[str, _Stored] = {}
        self._by_seq: dict[tuple[str, int], list[str]] = {}  # both entries of a fork stay findable
        self._feed_top: dict[str, tuple[int, str]] = {}  # author -> (highest seq, entry id)
        self._equivocators: dict[str, int] = {}  # author -> first forked seq
        self._next_clock: dict[tuple[str, str], int] = {}  # along each unflagged author's feed
        self._clock_memo: dict[tuple[str, str], int] = {}  # (entry id, store) -> next clock after it
        self._stores: set[str] = set()
        self._heads: set[str] = set()
        self._evaluator = Evaluator()
        self._settings_cache: AuthSettings | None = None
        self._docs: dict[str, pycrdt.Doc] = {}
        self._absent: dict[str, set[str]] = {}  # entry id -> stores whose payload storage lacks
        self._covers: dict[tuple[str, str], set[str]] = {}  # (entry, store) -> authors stored erases name
        self._erase_nodes: set[str] = set()
        # Erases still waiting in the pending area cover too: an erase is usually a descendant
        # of what it erases, so the header-only target must not wait for it (nor it for them).
        self._pending_covers: dict[tuple[str, str], list[tuple[str, str]]] = {}  # -> [(author, erase id)]
        self._erased: set[tuple[str, str, str]] = set()  # (entry, store, author) of accepted erases
        self._live: dict[str, set[str]] | None = {}  # store -> row keys shown; None: recompute
        self._hidden: set[tuple[str, str]] = set()  # (entry, store): rows repeat keys already shown
        self._unaccepted: dict[str, list[int]] = {}  # author -> [entries, bytes] stored but not valid

    def _load(self) -> None:
        """Rebuild every piece of derived state from what storage holds."""
        with _gc_paused():
            self._load_all()

    def _load_all(self) -> None:
        self._reset()
        order: list[tuple[_Stored, dict[str, tuple[Row, ...]]]] = []
        # Everything in storage passed the whole pipeline before it was written: the signatures
        # are not checked again (that would be most of the cost of opening a database).
        for s in self.storage.entries(self.id):
            entry = decode_entry(s.header, s.payloads, verify_signature=False)
            order.append(self._index(entry))
        self._rebuild_verdicts()
        self._recompute_erasure()
        self._recount()
        self._live = {}
        for node, rows in order:
            self._show(node, rows)
        self._pending.load()
        for record in self._pending.records():
            stored = self._pending.stored(record.id)
            update = stored.payloads.get(ERASE) if stored is not None else None
            if update is not None:
                try:
                    entry = decode_entry(stored.header, stored.payloads, verify_signature=False)
                    self._note_pending_erases(entry, check_payload_shape(ERASE, entry.stores[ERASE], update).erases)
                except RejectedError:
                    continue

    def _note_pending_erases(self, entry: Entry, erases: Sequence[EraseOp]) -> None:
        for op in erases:
            self._pending_covers.setdefault((op.entry, op.store), []).append((op.author, entry.id))

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

    def entries_at(self, author: str, seq: int) -> list[str]:
        """Every stored entry of ``author`` at ``seq``: two for a fork (equivocation evidence)."""
        return list(self._by_seq.get((author, seq), ()))

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
        # Built from every accepted operation, so kept until a settings entry changes it (sync
        # asks for a caller's permission on every request).
        if self._settings_cache is None:
            self._settings_cache = self._evaluator.settings()
        return self._settings_cache

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

    # ------------------------------------------------------------------ what sync reads
    def evidence(self) -> dict[str, list[str]]:
        """Per flagged author, the ids of its entries kept as evidence (bounded per author)."""
        out: dict[str, list[str]] = {}
        for author, fork in self._equivocators.items():
            top = self._feed_top[author][0]
            out[author] = sorted(i for seq in range(fork, top + 1) for i in self._by_seq.get((author, seq), ()))
        return out

    def missing_for(self, feeds: Mapping[str, tuple[int, str | None]],
                    evidence: Mapping[str, Sequence[str]] | None = None,
                    want: Iterable[str] = ()) -> list[str]:
        """The stored entries a peer lacks, in T order (parents before children).

        ``feeds`` is the peer's author -> (highest seq, its entry id); since every author's
        entries form a hash-linked feed, the peer holds everything of an author up to that seq
        when its head is one we hold there. Otherwise (a fork the peer holds) the peer's wanted
        parents bring the rest. ``evidence``: the peer's evidence ids per flagged author, so that
        both entries of a fork travel once. ``want``: ids the peer asks for (missing parents).
        Cost grows with what is missing, not with the length of the history.
        """
        evidence = evidence or {}
        missing: set[str] = {i for i in want if i in self._nodes}
        for author, (top, _head) in self._feed_top.items():
            peer_seq = feeds.get(author, (-1, None))[0]
            for seq in range(peer_seq + 1, top + 1):
                missing.update(self._by_seq.get((author, seq), ()))
            if author in self._equivocators:
                held = set(evidence.get(author, ())) | {feeds.get(author, (-1, None))[1]}
                for seq in range(self._equivocators[author], min(peer_seq, top) + 1):
                    missing.update(i for i in self._by_seq.get((author, seq), ()) if i not in held)
        nodes = self._nodes
        return sorted(missing, key=lambda i: (nodes[i].height, i))

    def page(self, ids: Sequence[str], max_bytes: int) -> tuple[list[tuple[bytes, dict[str, bytes | None]]], int]:
        """Entries to send, as (header, payloads), from the start of ``ids`` until ``max_bytes``
        (at least one entry); returns them and how many ids they cover. Erased payloads travel
        as erased (None)."""
        out: list[tuple[bytes, dict[str, bytes | None]]] = []
        total = 0
        for entry_id in ids:
            stored = self.storage.get(self.id, entry_id)
            if stored is None:
                raise StorageError(f"entry {entry_id} is indexed but not stored")
            size = stored.size
            if out and total + size > max_bytes:
                break
            out.append((stored.header, dict(stored.payloads)))
            total += size
        return out, len(out)

    def height_of(self, entry_id: str) -> int | None:
        node = self._nodes.get(entry_id)
        return node.height if node else None

    def on_stored(self, listener: Callable[[tuple[str, ...]], None]) -> Callable[[], None]:
        """Call ``listener(ids)`` after each commit that stored entries (local or received);
        returns a function that removes it. This is what the sync daemon pushes from."""
        self._stored_listeners.append(listener)
        return lambda: self._stored_listeners.remove(listener) if listener in self._stored_listeners else None

    def doc(self, store: str) -> pycrdt.Doc:
        """The derived pycrdt document of a store (read it; never write to it)."""
        return self._doc(store)

    def stores(self) -> list[str]:
        return sorted(self._stores)

    def rows(self, store: str) -> list[RowRecord]:
        """Every row of the store that is shown (accepted, payload held, not erased), in T order."""
        self._ensure_live()
        out: list[RowRecord] = []
        # Payloads are read from storage (the database keeps only headers in memory).
        for stored in self.storage.entries(self.id, stores=[store]):
            update = stored.payloads.get(store)
            node = self._nodes.get(stored.id)
            if update is None or node is None or not self._visible(node, store):
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

    # --------------------------------------------------------------- payloads and refusals
    def payload_state(self, entry_id: str, store: str) -> str | None:
        """"present", "erased" (by an accepted signed erase) or "pending" (not held yet, and
        fetched again); None if the entry or store is unknown."""
        node = self._nodes.get(entry_id)
        if node is None or store not in node.entry.stores:
            return None
        if self._is_erased(entry_id, store, node.author_key):
            return "erased"
        return "pending" if store in self._absent.get(entry_id, ()) else "present"

    def wanted(self) -> dict[str, Any]:
        """What this database lacks and sync should fetch: parents pending entries wait for,
        entries waiting in the pending area for payloads, and payloads of stored entries."""
        payloads = sorted(
            (entry_id, store) for entry_id, stores in self._absent.items() for store in stores
            if not self._is_erased(entry_id, store, self._nodes[entry_id].author_key)
        )
        waiting = sorted(r.id for r in self._pending.records() if not r.missing)
        return {"parents": sorted(self._pending.missing_parents() - set(self._nodes)),
                "pending_payloads": waiting, "payloads": payloads}

    def pending_ids(self) -> list[str]:
        return [r.id for r in self._pending.records()]

    def refusal(self, entry_id: str) -> Refusal | None:
        return self._refusals.get(entry_id)

    def recent_refusals(self, limit: int = 50, offset: int = 0) -> list[Refusal]:
        return self._refusals.recent(limit, offset)

    def refusal_counts(self) -> dict[str, dict[str, int]]:
        """source -> reason -> count, for every refusal this database ever recorded."""
        return self._refusals.counts()

    def knows(self, entry_id: str) -> bool:
        """Stored, waiting in the pending area, or recently refused."""
        return entry_id in self._nodes or entry_id in self._pending or self._refusals.get(entry_id) is not None

    def explain(self, entry_id: str) -> str:
        node = self._nodes.get(entry_id)
        if node is not None:
            if node.excluded:
                fork = self._equivocators[node.author_key]
                text = (f"{entry_id} is signed by {node.author_key}, which signed two different entries "
                        f"at seq {fork}; its entries from that seq on are kept as evidence, not applied")
            else:
                text = self._evaluator.explain(entry_id)
            for store in sorted(node.entry.stores):
                state = self.payload_state(entry_id, store)
                if state == "erased":
                    text += f"\nIts {store} payload was erased by a signed erase."
                elif state == "pending":
                    text += f"\nIts {store} payload has not arrived yet; it is fetched again and shown once it does."
            return text
        record = self._pending.record(entry_id)
        if record is not None:
            waits = (f"its parents {', '.join(record.missing)}" if record.missing
                     else "its payloads (no signed erase covers them)")
            return (f"{entry_id} (signed by {record.author}, from {record.source or 'an unnamed source'}) "
                    f"waits in the pending area for {waits}; nothing of it is applied yet")
        refusal = self._refusals.get(entry_id)
        if refusal is not None:
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(refusal.at_ms / 1000))
            return (f"{entry_id} was refused ({refusal.reason}) from {refusal.source or 'an unnamed source'} "
                    f"at {when}: {refusal.detail}")
        return f"{entry_id} is not known to this database"

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

    def erase(self, key: SigningKey, entry_id: str, store: str) -> str:
        """Erase one payload by a signed erase entry (the entry's author, or an admin).

        The erase replicates like any entry; every replica deletes the payload once the erase
        is valid there, and never accepts it again. The entry, its id and signature stay.
        """
        if store in UNERASABLE:
            raise RejectedError("erase.settings", f"{store} payloads cannot be erased: authorisation depends on them")
        node = self._nodes.get(entry_id)
        if node is None or store not in node.entry.stores:
            raise MemmeshError(f"no payload {store!r} in entry {entry_id}")
        self._check_can(key, "write" if node.author_key == str(key.public) else "admin")
        txn = Transaction(self, key)
        txn.append(ERASE, EraseOp(entry_id, store, node.author_key).value())
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
        last = self._feed_top.get(author)
        entry = sign_entry(
            key, db=self.id, seq=0 if last is None else last[0] + 1,
            prev=None if last is None else last[1], parents=sorted(self._heads),
            ts=self._clock(), payloads=payloads,
        )
        result = self._ingest([entry], local=True, source="local")
        if entry.id not in result.accepted:
            reason, detail = next(((r, d) for i, r, d in result.rejected if i == entry.id),
                                  ("auth.rejected", "the entry was not accepted"))
            raise AuthError(reason, detail)
        return entry.id

    # --------------------------------------------------------------------------- ingesting
    def ingest(self, items: Iterable[tuple[bytes, Mapping[str, bytes | None]]], *,
               source: str = "") -> IngestResult:
        """Validate, store and apply entries received from a peer (header, payloads).

        ``source`` names who delivered them ("peer:<key>"): the pending area is bounded per
        source and refusals are counted per source.
        """
        batch = list(items)
        if len(batch) < 32:  # a pause is not worth it for a few entries
            return self._ingest_received(batch, source)
        with _gc_paused():
            return self._ingest_received(batch, source)

    def _ingest_received(self, batch: list[tuple[bytes, Mapping[str, bytes | None]]], source: str) -> IngestResult:
        entries: list[Entry] = []
        result = IngestResult()
        refused: list[tuple[str, str, str]] = []
        # Signatures of the whole batch are checked first, on every core (decode_many).
        for (header, _payloads), item in zip(batch, decode_many(batch, expected_db=self.id)):
            if isinstance(item, Entry):
                entries.append(item)
            else:
                # The digest of the bytes names them, as an id would: explain can answer for it.
                digest = id_of(bytes(header)) if isinstance(header, (bytes, bytearray, memoryview)) else None
                result.rejected.append((digest, item.reason, str(item)))
                refused.append((digest or "sha256:-", item.reason, str(item)))
        self._refusals.record(refused, source)
        result.merge(self._ingest(entries, local=False, source=source))
        return result

    def ingest_entries(self, entries: Sequence[Entry], *, source: str = "") -> IngestResult:
        """Like ingest, for entries already decoded by decode_entry (e.g. built locally)."""
        for e in entries:
            if (e.db or e.id) != self.id:
                raise EntryRejected("entry.db", f"entry {e.id} belongs to another database")
        with _gc_paused():
            return self._ingest(list(entries), local=False, source=source)

    def _ingest(self, entries: list[Entry], *, local: bool, source: str) -> IngestResult:
        result = IngestResult()
        refused: list[tuple[str, str, str]] = []
        self._ensure_live()
        # Evictions and expiries count against the source that sent the entry, not this caller.
        displaced: list[tuple[str, str, str, str]] = []  # (source, id, reason, detail)
        for record in self._pending.expire():
            displaced.append((record.source, record.id, "entry.pending_expired",
                              "waited longer than the pending area keeps entries; it is fetched again when needed"))
        staged: list[StoredEntry] = []
        fills: list[tuple[str, str, bytes]] = []
        from_pending: list[str] = []
        queue = deque(entries)
        rebuild = False
        new_rows: list[tuple[_Stored, dict[str, tuple[Row, ...]], Mapping[str, bytes | None]]] = []
        gc_fill: list[_Stored] = []

        def refuse(entry_id: str, exc: RejectedError) -> None:
            result.rejected.append((entry_id, exc.reason, str(exc)))
            refused.append((entry_id, exc.reason, str(exc)))
            if entry_id in self._pending:  # nothing malformed keeps waiting
                from_pending.append(entry_id)
                self._pending.forget([entry_id])

        try:
            while queue:
                entry = queue.popleft()
                node = self._nodes.get(entry.id)
                if node is not None:
                    filled = self._fill_in(node, entry, fills, refuse)
                    if filled:
                        result.filled += [(entry.id, s) for s in filled]
                        rebuild = True
                    else:
                        result.duplicates += 1
                    continue
                if self._pending:
                    entry = self._with_pending_copy(entry)
                missing = [p for p in entry.parents if p not in self._nodes]
                if entry.prev is not None and entry.prev not in self._nodes and entry.prev not in missing:
                    missing.append(entry.prev)
                lacking = [s for s, p in entry.payloads.items() if p is None and not self._covered(entry, s)]
                if missing or lacking:
                    if local:
                        raise MemmeshError("a local entry names unknown parents")
                    erases: list[EraseOp] = []
                    try:
                        # What can be checked without the entry's past is checked now.
                        for store, update in entry.payloads.items():
                            if update is not None:
                                erases += check_payload_shape(store, entry.stores[store], update).erases
                    except RejectedError as exc:
                        refuse(entry.id, exc)
                        continue
                    try:
                        evicted = self._pending.put(_stored(entry), entry.author_key, missing, source)
                    except StorageError as exc:
                        refuse(entry.id, EntryRejected("entry.pending_full", str(exc)))
                        continue
                    for record in evicted:
                        displaced.append((record.source, record.id, "entry.pending_evicted",
                                          "evicted from the full pending area to make room; it is fetched again when needed"))
                    result.pending.append(entry.id)
                    if erases:
                        self._note_pending_erases(entry, erases)
                        queue.extend(self._ready_targets(erases))
                    continue
                try:
                    node, outcome, rows = self._admit(entry)
                except RejectedError as exc:
                    refuse(entry.id, exc)
                    continue
                if self._pending and entry.id in self._pending:
                    from_pending.append(entry.id)
                    self._pending.forget([entry.id])
                payloads = entry.payloads
                if self._erased:  # a payload an accepted erase already covers is never stored again
                    payloads = {s: (None if p is None or self._is_erased(entry.id, s, node.author_key) else p)
                                for s, p in payloads.items()}
                if self._pending_covers:
                    for store in entry.stores:
                        self._pending_covers.pop((entry.id, store), None)
                if None in payloads.values():
                    self._absent[entry.id] = {s for s, p in payloads.items() if p is None}
                staged.append(StoredEntry(entry.id, entry.header, payloads))
                if outcome == "rebuild" or node.erases:
                    rebuild = True
                elif outcome == "accepted":
                    result.accepted.append(entry.id)
                    new_rows.append((node, rows, payloads))
                else:
                    result.stored_rejected.append(entry.id)
                    gc_fill.append(node)
                if self._pending:
                    # Entries that waited for this one can now be considered...
                    for waiting_id in sorted(self._pending.waiting_on(entry.id)):
                        record = self._pending.record(waiting_id)
                        if record is None or any(p not in self._nodes for p in record.missing):
                            continue
                        queue.append(self._pending_entry(waiting_id))
                    # ... and so can entries that waited for a payload this entry erases.
                    if node.erases:
                        queue.extend(self._ready_targets(node.erases))
            if staged or from_pending:
                self.storage.append(self.id, staged, drop_pending=from_pending)
            for entry_id, store, update in fills:
                self.storage.fill_payload(self.id, entry_id, store, update)
        except Exception:
            # Memory may be ahead of what was committed: the log decides.
            self._load()
            raise
        finally:
            self._refusals.record(refused, source)
            by_source: dict[str, list[tuple[str, str, str]]] = {}
            for src, entry_id, reason, detail in displaced:
                by_source.setdefault(src, []).append((entry_id, reason, detail))
            for src, items in by_source.items():
                self._refusals.record(items, src)
        if rebuild:
            accepted_now = {e.id for e in staged if self.is_accepted(e.id)}
            result.accepted = [e.id for e in staged if e.id in accepted_now]
            result.stored_rejected = [e.id for e in staged if e.id not in accepted_now]
            self._recompute_erasure()
            self._recount()
            self._live = None
            self._rebuild_docs()
            self._emit(Rebuilt())
        else:
            self._apply(new_rows, gc_fill)
        if staged and self._stored_listeners:
            ids = tuple(e.id for e in staged)
            for listener in list(self._stored_listeners):
                listener(ids)
        return result

    def _with_pending_copy(self, entry: Entry) -> Entry:
        """Merge a new copy with the one waiting in the pending area: any payload either holds."""
        if entry.id not in self._pending or all(p is not None for p in entry.payloads.values()):
            return entry
        stored = self._pending.stored(entry.id)
        if stored is None:
            return entry
        merged = {s: (p if p is not None else stored.payloads.get(s)) for s, p in entry.payloads.items()}
        return _with_payloads(entry, merged)

    def _pending_entry(self, entry_id: str) -> Entry:
        stored = self._pending.stored(entry_id)
        if stored is None:
            raise StorageError(f"pending entry {entry_id} is indexed but not stored")
        # It passed decoding and its signature when it arrived; storage holds it as it was.
        return decode_entry(stored.header, stored.payloads, expected_db=self.id, verify_signature=False)

    def _fill_in(self, node: _Stored, copy: Entry, fills: list[tuple[str, str, bytes]],
                 refuse: Callable[[str, RejectedError], None]) -> list[str]:
        """A copy of a stored entry: fill in the payloads storage lacks (checked against the
        signed digest already, and shape-checked here); an erased payload is refused."""
        filled = []
        for store in sorted(self._absent.get(node.entry.id, ())):
            update = copy.payloads.get(store)
            if update is None:
                continue
            if self._is_erased(node.entry.id, store, node.author_key):
                refuse(node.entry.id, EntryRejected(
                    "entry.erased", f"the {store} payload of this entry was erased by a signed erase; it is not accepted again"))
                continue
            try:
                check_payload_shape(store, node.entry.stores[store], update)
            except RejectedError as exc:
                refuse(node.entry.id, exc)
                continue
            fills.append((node.entry.id, store, update))
            self._absent[node.entry.id].discard(store)
            filled.append(store)
        if node.entry.id in self._absent and not self._absent[node.entry.id]:
            del self._absent[node.entry.id]
        return filled

    def _ready_targets(self, erases: Sequence[EraseOp]) -> list[Entry]:
        """Pending entries these erases name whose parents are all stored (they may proceed)."""
        out = []
        for entry_id in sorted({op.entry for op in erases}):
            record = self._pending.record(entry_id)
            if record is not None and not any(p not in self._nodes for p in record.missing):
                out.append(self._pending_entry(entry_id))
        return out

    def _covered(self, entry: Entry, store: str) -> bool:
        """Is a missing payload accounted for by an erase naming this entry and its author?

        A stored erase, or one waiting in the pending area (shape-checked). Covered is not
        erased: the header is taken in so that the DAG can proceed, nothing of the payload is
        shown, and it counts as erased only once an erase is valid; until then it is fetched.
        """
        if store in UNERASABLE:
            return False
        if entry.author_key in self._covers.get((entry.id, store), ()):
            return True
        claims = self._pending_covers.get((entry.id, store))
        if not claims:
            return False
        live = [(a, i) for a, i in claims if i in self._pending]
        self._pending_covers[(entry.id, store)] = live
        return any(a == entry.author_key for a, _i in live)

    def _is_erased(self, entry_id: str, store: str, author: str) -> bool:
        return (entry_id, store, author) in self._erased

    def _admit(self, entry: Entry) -> tuple[_Stored, str, dict[str, tuple[Row, ...]]]:
        """Steps 4-7 for one entry whose parents are all known; indexes it on success.

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
        # Structural checks, whatever the author's standing: nothing malformed is stored.
        ops, rows, erases = self._check_payloads(entry, author)
        size = len(entry.header) + sum(d.length for s, d in entry.stores.items() if entry.payloads.get(s) is not None)
        wanted = bool(self._pending) and self._needed_by_a_writer(entry)
        forks = self._by_seq.get((author, entry.seq), ())
        if forks:
            # Equivocation: the two entries prove it; a third at the same seq adds nothing.
            if len(forks) >= 2 and not wanted:
                raise EntryRejected("entry.evidence_bound",
                                    f"{author} already has two entries at seq {entry.seq}: the equivocation "
                                    "is proven, further entries at that seq are not kept")
            node = _Stored(entry, author, height, vv, ops, erases, excluded=True, size=size)
            self._insert_node(node, {})
            self._flag_equivocator(author, entry.seq)
            self._rebuild_verdicts()
            return node, "rebuild", {}
        if entry.seq >= self._equivocators.get(author, entry.seq + 1):
            if not wanted:
                self._check_bound(author, size, "entries after its equivocation, kept as evidence")
            node = _Stored(entry, author, height, vv, ops, erases, excluded=True, size=size)
            self._insert_node(node, {})
            self._count_unaccepted(author, size)
            return node, "candidate", {}
        needs = ADMIN if erases and any(op.author != author for op in erases) else WRITE
        event = Event(entry.id, author, entry.seq, height, vv, ops, entry.is_root, needs)
        self._precheck(event)
        count, nbytes = self._unaccepted.get(author, (0, 0))
        if (count + 1 > MAX_UNACCEPTED_ENTRIES or nbytes + size > MAX_UNACCEPTED_BYTES) and not wanted:
            if not self._evaluator.preview(event).accepted:
                self._check_bound(author, size, "entries that are not valid now (candidates)")
        node = _Stored(entry, author, height, vv, ops, erases, size=size)
        self._insert_node(node, rows)
        changed = self._evaluator.add(event)
        if event.ops or event.is_root:
            self._settings_cache = None
        verdict = self._evaluator.verdict(entry.id)
        if any(i != entry.id and i in self._nodes for i in changed):
            return node, "rebuild", rows
        if not verdict.accepted:
            self._count_unaccepted(author, size)
        return node, "accepted" if verdict.accepted else "candidate", rows

    def _needed_by_a_writer(self, entry: Entry) -> bool:
        """Does a pending entry of another key that may write now wait for this one?

        Such an entry is stored whatever the bounds, so that they never cut an honest writer off
        from its past; the waiting entry's author must be another key that holds Write, so that
        an author (or a throwaway key) cannot lift its own bound by sending children first.
        """
        for waiting_id in self._pending.waiting_on(entry.id):
            record = self._pending.record(waiting_id)
            if record is None or record.author == entry.author_key:
                continue
            if holds(self.permission(record.author), "write"):
                return True
        return False

    def _check_bound(self, author: str, size: int, what: str) -> None:
        count, nbytes = self._unaccepted.get(author, (0, 0))
        if count + 1 > MAX_UNACCEPTED_ENTRIES or nbytes + size > MAX_UNACCEPTED_BYTES:
            raise EntryRejected(
                "entry.candidate_bound",
                f"{author} already has {count} stored {what} ({nbytes} bytes; the bound is "
                f"{MAX_UNACCEPTED_ENTRIES} entries / {MAX_UNACCEPTED_BYTES} bytes); it is taken in "
                "again if it becomes needed or valid",
            )

    def _count_unaccepted(self, author: str, size: int) -> None:
        tally = self._unaccepted.setdefault(author, [0, 0])
        tally[0] += 1
        tally[1] += size

    def _recount(self) -> None:
        self._unaccepted = {}
        for node in self._nodes.values():
            if node.excluded or not self._evaluator.verdict(node.entry.id).accepted:
                self._count_unaccepted(node.author_key, node.size)

    def _insert_node(self, node: _Stored, rows: Mapping[str, tuple[Row, ...]]) -> None:
        entry = node.entry
        if entry.payloads:
            # Headers stay in memory; payloads live in storage only (read when rebuilding).
            entry = node.entry = _with_payloads(entry, _NO_PAYLOADS)
        self._nodes[entry.id] = node
        self._by_seq.setdefault((node.author_key, entry.seq), []).append(entry.id)
        top = self._feed_top.get(node.author_key)
        if top is None or entry.seq > top[0]:
            self._feed_top[node.author_key] = (entry.seq, entry.id)
        for p in entry.parents:
            self._heads.discard(p)
        self._heads.add(entry.id)
        for op in node.erases:
            self._covers.setdefault((op.entry, op.store), set()).add(op.author)
        if node.erases:
            self._erase_nodes.add(entry.id)
        if not node.excluded:
            for store, desc in entry.stores.items():
                self._next_clock[(node.author_key, store)] = desc.clock_end
                self._stores.add(store)

    def _index(self, entry: Entry) -> tuple[_Stored, dict[str, tuple[Row, ...]]]:
        """Index a stored entry on load (no authorisation: _rebuild_verdicts does that)."""
        author = entry.author_key
        vv, height = self._past_of(entry)
        vv[author] = entry.seq
        excluded = entry.seq >= self._equivocators.get(author, entry.seq + 1)
        if self._by_seq.get((author, entry.seq)):
            self._flag_equivocator(author, entry.seq)
            excluded = True
        try:
            ops, rows, erases = self._check_payloads(entry, author)
        except RejectedError as exc:
            # Stored by an older release that kept evidence unchecked: keep it as evidence only.
            log.warning("stored entry %s fails today's checks (%s); kept, never applied", entry.id, exc.reason)
            ops, rows, erases, excluded = (), {}, (), True
        absent = {s for s, p in entry.payloads.items() if p is None}
        if absent:
            self._absent[entry.id] = absent
        size = len(entry.header) + sum(d.length for s, d in entry.stores.items() if s not in absent)
        node = _Stored(entry, author, height, vv, ops, erases, excluded=excluded, size=size)
        self._insert_node(node, rows)
        return node, rows

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

    def _expected_clock(self, entry: Entry, author: str, store: str) -> int:
        """The author's next clock in ``store`` along the entry's own feed (its prev chain)."""
        if entry.prev is None:
            return 0
        if author not in self._equivocators and self._feed_top.get(author) == (entry.seq - 1, entry.prev):
            return self._next_clock.get((author, store), 0)
        # A fork, or a flagged author's entry: follow its own feed back (rare; memoised).
        chain: list[str] = []
        pid: str | None = entry.prev
        clock = 0
        while pid is not None:
            memo = self._clock_memo.get((pid, store))
            if memo is not None:
                clock = memo
                break
            chain.append(pid)
            prior = self._nodes[pid].entry
            desc = prior.stores.get(store)
            if desc is not None:
                clock = desc.clock_end
                break
            pid = prior.prev
        for visited in chain:
            self._clock_memo[(visited, store)] = clock
        return clock

    def _check_payloads(
        self, entry: Entry, author: str
    ) -> tuple[tuple[GrantOp | RevokeOp, ...], dict[str, tuple[Row, ...]], tuple[EraseOp, ...]]:
        """Strict checks of every payload: shape, clocks along the author's feed; returns the
        settings operations and erasures it carries."""
        ops: list[GrantOp | RevokeOp] = []
        erases: list[EraseOp] = []
        decoded_rows: dict[str, tuple[Row, ...]] = {}
        for store, desc in entry.stores.items():
            if not valid_store_name(store):
                raise EntryRejected("entry.store_name", f"invalid store name {store!r}")
            expected = self._expected_clock(entry, author, store)
            if desc.clock != expected:
                raise EntryRejected("yjs.clock_gap" if desc.clock > expected else "yjs.clock_reuse",
                                    f"store {store!r} clock {desc.clock}, expected {expected}")
            update = entry.payloads.get(store)
            if update is None:
                if store in UNERASABLE:
                    raise EntryRejected("entry.payload_missing", f"{store} payloads always travel with their entry")
                continue
            shape = check_payload_shape(store, desc, update)
            decoded_rows[store] = shape.rows
            ops.extend(shape.ops)
            erases.extend(shape.erases)
        return tuple(ops), decoded_rows, tuple(erases)

    def _precheck(self, event: Event) -> None:
        """Refuse entries that no later event could make valid (they are never stored)."""
        reason = self._evaluator.never_valid(event)
        if reason is not None:
            raise AuthError(reason[0], reason[1])

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

    def _apply(self, applied: list[tuple[_Stored, dict[str, tuple[Row, ...]], Mapping[str, bytes | None]]],
               gc_fill: list[_Stored]) -> None:
        for node in gc_fill:
            for store, desc in node.entry.stores.items():
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
            self._emit(RowsAdded(store, tuple(rows)))

    def _records(self, store: str, node: _Stored, rows: Sequence[Row]) -> list[RowRecord]:
        e = node.entry
        return [RowRecord(store, r.key, r.value, e.id, node.author_key, e.ts, (node.height, e.id, r.clock)) for r in rows]


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


def _with_payloads(entry: Entry, payloads: Mapping[str, bytes | None]) -> Entry:
    return Entry(entry.id, entry.header, entry.author, entry.seq, entry.prev, entry.parents,
                 entry.ts, entry.db, entry.nonce, entry.stores, payloads)


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
