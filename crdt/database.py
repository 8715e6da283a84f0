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

The class is split by job: this module holds creation, loading, reading, explaining and local
writes; crdt/ingest.py the pipeline above; crdt/derived.py the derived state (verdicts,
erasure, shown rows, pycrdt documents); crdt/records.py the records they share.
"""
from __future__ import annotations

import hashlib
import logging
import os
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import pycrdt

from memmesh.auth.keys import SigningKey
from memmesh.auth.ops import GrantOp, RevokeOp
from memmesh.auth.permissions import Permission, holds
from memmesh.crdt.clock import now_ms
from memmesh.crdt.entry import Entry, decode_entry, id_of, sign_entry
from memmesh.crdt.erasure import ERASE, UNERASABLE, EraseOp
from memmesh.crdt.errors import AuthError, DamagedError, MemmeshError, RejectedError, StorageError
from memmesh.crdt.pending import PendingArea, PendingLimits
from memmesh.crdt.refusals import Refusal, RefusalLog
from memmesh.crdt.storage import Storage, StoredEntry
from memmesh.crdt.stored_check import Damage, check_stored
from memmesh.crdt.validity import AuthSettings, Evaluator, Verdict
from memmesh.crdt.yjs import Row, decode_append_update, encode_rows

from memmesh.crdt.derived import DerivedState
from memmesh.crdt.ingest import Ingestion
from memmesh.crdt.records import (  # noqa: F401  (re-exported: the database's public records)
    MAX_UNACCEPTED_BYTES, MAX_UNACCEPTED_ENTRIES, META, SETTINGS, STORE_NAME_CHARS, IngestResult, Outcome, Rebuilt,
    Refused,
    RowRecord, RowsAdded, _client, _gc_paused, _op_value, _perm_text, _Stored, _with_payloads, check_payload_shape,
    valid_store_name,
)

log = logging.getLogger(__name__)

_REPAIR = ("run: memmesh check --repair (it fetches damaged entries again from peers), "
           "or restore a backup (memmesh restore)")


# What reading a damaged log can raise: the adapter's errors, and values of the wrong type
# where bytes or text were stored.
_UNREADABLE = (StorageError, TypeError, ValueError)


def _short(entry_id: str) -> str:
    """An id short enough for one line: ``sha256:`` and 12 hex digits."""
    return entry_id if len(entry_id) <= 19 else entry_id[:19] + "..."


def _one_line(text: object) -> str:
    return "".join(c if c.isprintable() else "?" for c in str(text))[:200]


class Database(Ingestion, DerivedState):
    """One signed, append-only database, opened on a Storage."""

    # Called before every local write (``_commit_local``); it raises to refuse the write. The
    # node installs one (node/fence.py) so that crdt/ stays free of the node's policy.
    write_guard: Callable[[], None] | None = None

    def __init__(self, storage: Storage, db_id: str, *, pending_limits: PendingLimits | None = None,
                 clock: Callable[[], int] | None = None) -> None:
        self.storage = storage
        self.id = db_id
        self._listeners: list[Callable[[RowsAdded | Rebuilt], None]] = []
        self._stored_listeners: list[Callable[[tuple[str, ...]], None]] = []
        self._outcome_listeners: list[Callable[[Outcome], None]] = []
        self._clock = clock or now_ms  # the informational ts of local entries, the pending TTL
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
        root = sign_entry(key, db=None, seq=0, prev=None, parents=[], ts=(clock or now_ms)(),
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
        self._meta_cache: dict[str, Any] | None = None
        self._small_rows: dict[str, list[RowRecord]] = {}  # store -> its rows (small_rows)
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
        # Everything in storage passed the whole pipeline before it was written, so signatures
        # are not checked again (that would be most of the cost of opening a database). Hashes
        # are: an entry's id is the sha256 of its header, which holds its payloads' digests, so
        # any change to stored bytes shows, for about one hash per entry (crdt/stored_check.py).
        damaged: list[Damage] = []
        dependent = 0  # intact entries that descend from a damaged one
        seen: set[str] = set()  # intact entries read so far
        lost: set[str] = set()  # entries that cannot be applied: damaged, or descending from one
        try:
            for s in self.storage.entries(self.id):
                try:
                    checked = check_stored(s, self.id)
                except (TypeError, ValueError) as exc:  # a value of the wrong type where bytes were stored
                    checked = Damage(str(s.id), "entry.format", f"its stored values are unreadable ({exc})")
                if isinstance(checked, Damage):
                    damaged.append(checked)
                    lost.add(checked.entry_id)
                    continue
                before = (*checked.parents, *((checked.prev,) if checked.prev is not None else ()))
                absent = [p for p in before if p not in seen]
                if absent:
                    lost.add(checked.id)
                    if any(p in lost for p in absent):
                        dependent += 1
                    else:  # stored without its past: rows lost from the file, or an order changed
                        damaged.append(Damage(checked.id, "entry.order",
                                              f"it names {_short(absent[0])}, which is not stored before it"))
                    continue
                seen.add(checked.id)
                if not damaged:  # nothing is applied from a damaged database: past that, only count
                    order.append(self._index(checked))
        except _UNREADABLE as exc:
            raise self._unreadable(exc) from exc
        if damaged:
            first = damaged[0]
            n = len(damaged)
            more = f", and {dependent} more that depend on them" if dependent else ""
            raise DamagedError(
                f"{self._where()} is damaged: database {_short(self.id)} has {n} damaged stored "
                f"entr{'y' if n == 1 else 'ies'} (the first, {_short(first.entry_id)}: {_one_line(first.detail)}){more}; "
                f"{_REPAIR}"
            )
        self._rebuild_verdicts()
        self._recompute_erasure()
        self._recount()
        self._live = {}
        for node, rows in order:
            self._show(node, rows)
        # Pending entries are checked in full when they leave the area: a damaged one is refused
        # then, never applied. Here only reading them must not fail with anything but one line.
        try:
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
        except _UNREADABLE as exc:
            raise self._unreadable(exc) from exc

    def _where(self) -> str:
        path = getattr(self.storage, "path", None)  # SqliteStorage has one; MemoryStorage may not
        return str(path) if path else f"the storage ({type(self.storage).__name__})"

    def _unreadable(self, exc: BaseException) -> DamagedError:
        if isinstance(exc, DamagedError):
            return exc  # the adapter named the file and what to do
        return DamagedError(f"{self._where()}: database {_short(self.id)} cannot be read ({_one_line(exc)}); {_REPAIR}")

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
        as erased (None).

        Damaged bytes are never handed out. Each entry is hashed again as it is read (cheap next
        to sending it): one whose header no longer hashes to its id is left out, and a payload
        that no longer matches its signed digest travels as not held (None), so the peer fetches
        it from another replica. Either is logged: the disk changed what was verified when it
        was stored, and `memmesh check --repair` moves it aside and fetches it again."""
        out: list[tuple[bytes, dict[str, bytes | None]]] = []
        total = 0
        covered = 0
        for entry_id in ids:
            stored = self.storage.get(self.id, entry_id)
            if stored is None:
                raise StorageError(f"entry {entry_id} is indexed but not stored")
            size = stored.size
            if out and total + size > max_bytes:
                break
            covered += 1
            payloads = self._intact_payloads(entry_id, stored)
            if payloads is None:
                continue
            out.append((stored.header, payloads))
            total += size
        return out, covered

    def _intact_payloads(self, entry_id: str, stored: StoredEntry) -> dict[str, bytes | None] | None:
        """The payloads of ``stored`` that still match the header's digests (the others None),
        or None when the header itself no longer hashes to ``entry_id``."""
        if id_of(stored.header) != entry_id:
            log.error("stored entry %s of database %s no longer hashes to its id (damaged on disk); not sent "
                      "to the peer: run memmesh check --repair", entry_id, self.id)
            return None
        node = self._nodes.get(entry_id)
        payloads = dict(stored.payloads)
        for store, data in payloads.items():
            if data is None:
                continue
            desc = node.entry.stores.get(store) if node is not None else None
            if desc is None or len(data) != desc.length or hashlib.sha256(data).digest() != desc.sha256:
                log.error("the %s payload of stored entry %s of database %s fails its signed digest (damaged on "
                          "disk); sent as not held: run memmesh check --repair", store, entry_id, self.id)
                payloads[store] = None
        return payloads

    def height_of(self, entry_id: str) -> int | None:
        node = self._nodes.get(entry_id)
        return node.height if node else None

    def precedes(self, earlier: str, later: str) -> bool:
        """Whether entry ``earlier`` is in the causal past of entry ``later`` (both stored)."""
        a, b = self._nodes.get(earlier), self._nodes.get(later)
        return (a is not None and b is not None and a.entry.id != b.entry.id
                and b.vv.get(a.author_key, -1) >= a.entry.seq)

    def past_vector(self, entry_id: str) -> dict[str, int] | None:
        """The version vector of a stored entry's causal past, the entry itself included
        (author key -> highest seq); None if not stored. An entry x is ``entry_id`` or one of
        its ancestors exactly when ``vv.get(x's author key, -1) >= x.seq`` (what
        :meth:`precedes` checks), so a reader can test many entries against one past at once."""
        node = self._nodes.get(entry_id)
        return None if node is None else dict(node.vv)

    def settings_at(self, entry_id: str) -> AuthSettings | None:
        """The settings of an accepted entry's causal past, the entry itself excluded: what the
        validity rule judged it by (and what a rule over its rows, such as a quarantine's,
        must judge it by too: a function of signed facts, the same on every replica). None if
        no accepted entry has that id."""
        if not self.is_accepted(entry_id):
            return None
        node = self._nodes[entry_id]
        vv = self.past_vector(entry_id) or {}
        if node.entry.seq == 0:
            vv.pop(node.author_key, None)
        else:
            vv[node.author_key] = node.entry.seq - 1
        return self._evaluator.settings_at(vv)

    def on_stored(self, listener: Callable[[tuple[str, ...]], None]) -> Callable[[], None]:
        """Call ``listener(ids)`` after each commit that stored entries (local or received);
        returns a function that removes it. This is what the sync daemon pushes from. A
        listener that raises is logged and skipped, as for on_outcome."""
        self._stored_listeners.append(listener)
        return lambda: self._stored_listeners.remove(listener) if listener in self._stored_listeners else None

    def on_outcome(self, listener: Callable[[Outcome], None]) -> Callable[[], None]:
        """Call ``listener(outcome)`` after each ingest (local or received) that accepted or refused
        something: which entries it accepted, which it refused and why; returns a function that
        removes it. Called on the thread that ingested, after the commit: keep it quick. A
        listener that raises is logged and skipped: the ingest stays committed and succeeds."""
        self._outcome_listeners.append(listener)
        return lambda: self._outcome_listeners.remove(listener) if listener in self._outcome_listeners else None

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

    def small_rows(self, store: str) -> list[RowRecord]:
        """:meth:`rows` of a store that is small but read often (an agent's config), kept in
        memory until a row of it is shown or hidden: reading it anew scans the whole log, which
        in a database with many entries of other stores (a long history) costs seconds."""
        cached = self._small_rows.get(store)
        if cached is None:
            cached = self._small_rows[store] = self.rows(store)
        return list(cached)

    def meta(self) -> dict[str, Any]:
        """The database's meta: later rows (T order) override earlier fields."""
        # Kept until a meta row is shown or derived state is rebuilt (reading it scans the log).
        if self._meta_cache is None:
            merged: dict[str, Any] = {}
            for row in self.rows(META):
                if isinstance(row.value, dict):
                    merged.update(row.value)
            self._meta_cache = merged
        return dict(self._meta_cache)

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
        if self.write_guard is not None:
            self.write_guard()
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


