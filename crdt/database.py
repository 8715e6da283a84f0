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

The database is composed of objects with one job each, which it holds and delegates to:
``LogIndex`` (crdt/log_index.py: what is stored, by id and by author feed; heads; payloads not
held), ``DerivedState`` (crdt/derived.py: verdicts, erasure, shown rows, meta, pycrdt
documents), ``IngestPipeline`` (crdt/ingest.py: the steps above), ``Observers``
(crdt/observers.py). crdt/loading.py reads the log back on open, crdt/transaction.py stages
and signs local writes, crdt/candidates.py bounds what an author keeps that is not valid, and
crdt/records.py holds the records they share. Everything but the observers, the pending area
and the refusal log is derived from the log, and made anew when the log is read again.
"""
from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pycrdt

from memmesh.auth.keys import SigningKey
from memmesh.auth.ops import GrantOp, RevokeOp
from memmesh.auth.permissions import Permission, holds
from memmesh.crdt.clock import now_ms
from memmesh.crdt.derived import DerivedState
from memmesh.crdt.entry import Entry, id_of, sign_entry
from memmesh.crdt.erasure import ERASE, UNERASABLE, EraseOp
from memmesh.crdt.errors import AuthError, MemmeshError, RejectedError, StorageError
from memmesh.crdt.ingest import IngestPipeline, Received
from memmesh.crdt.loading import UNREADABLE, read_log, unreadable
from memmesh.crdt.log_index import IndexedEntry, LogIndex
from memmesh.crdt.observers import Observers, OutcomeListener, RowListener, StoredListener
from memmesh.crdt.open_marks import read_marks, write_marks
from memmesh.crdt.pending import PendingArea, PendingLimits
from memmesh.crdt.records import (  # noqa: F401  (re-exported: the database's public records)
    MAX_UNACCEPTED_BYTES,
    MAX_UNACCEPTED_ENTRIES,
    META,
    SETTINGS,
    STORE_NAME_CHARS,
    IngestResult,
    Outcome,
    Rebuilt,
    Refused,
    RowRecord,
    RowsAdded,
    _client,
    _gc_paused,
    _op_value,
    _perm_text,
    check_payload_shape,
    valid_store_name,
)
from memmesh.crdt.refusals import Refusal, RefusalLog
from memmesh.crdt.storage import Storage, StoredEntry
from memmesh.crdt.transaction import Transaction, sign_local
from memmesh.crdt.validity import AuthSettings, Verdict
from memmesh.crdt.verify_pipeline import AheadVerifier
from memmesh.crdt.yjs import encode_rows

log = logging.getLogger(__name__)

# Entries read from storage at a time for a page sent to a peer: the first read, and the most.
_PAGE_READ = 16
_PAGE_READ_MAX = 512


class Database:
    """One signed, append-only database, opened on a Storage."""

    # Called before every local write (``_commit_local``); it raises to refuse the write. The
    # node installs one (node/fence.py) so that crdt/ stays free of the node's policy.
    write_guard: Callable[[], None] | None = None

    def __init__(self, storage: Storage, db_id: str, *, pending_limits: PendingLimits | None = None,
                 clock: Callable[[], int] | None = None, derived: DerivedState | None = None) -> None:
        """An empty database over ``storage``, or (``derived``) one whose derived state and log
        index were built over another storage holding the same entries (``adopt``). ``open``
        and ``create`` are the usual ways in."""
        self.storage = storage
        self.id = db_id
        self._observers = Observers()
        self._clock = clock or now_ms  # the informational ts of local entries, the pending TTL
        self._refusals = RefusalLog(storage, db_id)
        self._pending = PendingArea(storage, db_id, pending_limits, self._clock)
        self._ahead = AheadVerifier()
        self._reset(derived)

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
    ) -> Database:
        """A new database whose root grants ``key`` Admin(0) and carries ``meta``.

        ``nonce`` (16 bytes, random by default) and ``clock`` (ms, for entries' informational
        ``ts``) let a simulation make the same database from the same seed.
        """
        author = str(key.public)
        client = _client(key)
        ops: list[dict[str, Any]] = [{"op": "grant", "key": author, "perm": "admin", "priority": 0}]
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
             clock: Callable[[], int] | None = None) -> Database:
        if not storage.has_database(db_id):
            raise MemmeshError(f"no database {db_id} on this node")
        db = cls(storage, db_id, pending_limits=pending_limits, clock=clock)
        db._load()
        return db

    @classmethod
    def adopt(cls, storage: Storage, staged: Database, *, pending_limits: PendingLimits | None = None,
              clock: Callable[[], int] | None = None) -> Database:
        """The database ``staged`` checked, over ``storage``, which now holds exactly the entries
        of ``staged.storage`` in the same order (a bank copied into memory, then appended here
        in one transaction): what ``open`` would give, without reading and hashing the log back.

        ``staged``'s log index and derived state (verdicts, erasure, the rows shown) are handed
        over (the caller drops ``staged``): built entry by entry from what now is stored, they
        are what ``open`` would derive again (validity is a function of the set of entries;
        rows are shown in storage order, which is the order staged took them in); what staged
        kept read from its storage (documents, small stores, meta) is read again from
        ``storage`` when asked. Its checked marks (crdt/open_marks.py) are recorded in
        ``storage``, as an open records those it made. Refusals and the pending area are
        ``storage``'s own, as on open.
        """
        if not storage.has_database(staged.id):
            raise MemmeshError(f"no database {staged.id} on this node")
        if storage.count(staged.id) != len(staged):
            raise MemmeshError(f"database {staged.id} holds {storage.count(staged.id)} entries here, "
                               f"not the {len(staged)} it was checked with: open it instead")
        with _gc_paused():
            # The payloads staged checked, as checked: the same bytes (the same ids pin them),
            # so a later open of ``storage`` does not decode them again either.
            write_marks(storage, staged.id, read_marks(staged.storage, staged.id))
            db = cls(storage, staged.id, pending_limits=pending_limits, clock=clock, derived=staged._derived)
            db._pipeline.recount()
            try:
                db._pipeline.load_pending()
            except UNREADABLE as exc:
                raise unreadable(storage, db.id, exc) from exc
        return db

    def _reset(self, derived: DerivedState | None = None) -> None:
        """Fresh, empty derived objects: what the log is read into; or ``derived``'s state and
        index moved over to this storage (``adopt``)."""
        if derived is not None:
            self._derived = derived.moved_to(self.storage, self._observers.emit)
            self._log = self._derived.index
        else:
            self._log = LogIndex()
            self._derived = DerivedState(self.storage, self.id, self._log, self._observers.emit)
        self._pipeline = IngestPipeline(
            storage=self.storage, db_id=self.id, index=self._log, derived=self._derived, pending=self._pending,
            refusals=self._refusals, observers=self._observers, reload=self._load, ahead=self._ahead,
        )

    def _load(self) -> None:
        """Rebuild every piece of derived state from what storage holds."""
        with _gc_paused():
            self._reset()
            read = read_log(self.storage, self.id, self._log)
            self._derived.rebuild_verdicts()
            self._derived.recompute_erasure()
            self._pipeline.recount()
            self._derived.show_loaded(read.order)
            write_marks(self.storage, self.id, read.new_marks)
            try:
                self._pipeline.load_pending()
            except UNREADABLE as exc:
                raise unreadable(self.storage, self.id, exc) from exc

    # What tests and older callers read; the index owns them.
    @property
    def _nodes(self) -> Mapping[str, IndexedEntry]:
        return self._log.nodes

    @property
    def _next_clock(self) -> Mapping[tuple[str, str], int]:
        return self._log.next_clocks

    # ------------------------------------------------------------------------ ingesting
    def ingest(self, items: Iterable[Received], *, source: str = "") -> IngestResult:
        """Validate, store and apply entries received from a peer (header, payloads).

        ``source`` names who delivered them ("peer:<key>"): the pending area is bounded per
        source and refusals are counted per source.
        """
        return self._pipeline.ingest(items, source=source)

    def verify_ahead(self, items: Sequence[Received]) -> None:
        """Start checking the signatures of entries a later ``ingest`` will be given (the next
        batch, while this one is ingested); returns at once. Only a hint: ``ingest`` decides
        exactly as without it, and verifies whatever was not checked ahead."""
        self._pipeline.verify_ahead(items)

    def ingest_batches(self, batches: Iterable[Sequence[Received]], *, source: str = "") -> Iterator[IngestResult]:
        """``ingest`` of each batch in turn, yielding each result; the signatures of batch n+1
        are checked (``verify_ahead``) while batch n is decoded, stored and applied."""
        it = iter(batches)
        current = next(it, None)
        if current is not None:
            # The first batch to the worker too: it checks from its start while this thread
            # takes it from its end (crdt/verify_process.py gather): both cores from the start.
            self.verify_ahead(current)
        while current is not None:
            following = next(it, None)
            if following is not None:
                self.verify_ahead(following)
            yield self.ingest(current, source=source)
            current = following

    def ingest_entries(self, entries: Sequence[Entry], *, source: str = "") -> IngestResult:
        """Like ingest, for entries already decoded by decode_entry (e.g. built locally)."""
        return self._pipeline.ingest_entries(entries, source=source)

    # ------------------------------------------------------------------------ observation
    def subscribe(self, listener: RowListener) -> None:
        self._observers.subscribe(listener)

    def unsubscribe(self, listener: RowListener) -> None:
        self._observers.unsubscribe(listener)

    def on_stored(self, listener: StoredListener) -> Callable[[], None]:
        """Call ``listener(ids)`` after each commit that stored entries (local or received);
        returns a function that removes it. This is what the sync daemon pushes from. A
        listener that raises is logged and skipped, as for on_outcome."""
        return self._observers.on_stored(listener)

    def on_outcome(self, listener: OutcomeListener) -> Callable[[], None]:
        """Call ``listener(outcome)`` after each ingest (local or received) that accepted or refused
        something: which entries it accepted, which it refused and why; returns a function that
        removes it. Called on the thread that ingested, after the commit: keep it quick. A
        listener that raises is logged and skipped: the ingest stays committed and succeeds."""
        return self._observers.on_outcome(listener)

    # ---------------------------------------------------------------------------- reading
    @property
    def heads(self) -> tuple[str, ...]:
        return tuple(sorted(self._log.heads))

    def __len__(self) -> int:
        return len(self._log)

    def entry(self, entry_id: str) -> Entry | None:
        node = self._log.get(entry_id)
        return node.entry if node else None

    def entries_at(self, author: str, seq: int) -> list[str]:
        """Every stored entry of ``author`` at ``seq``: two for a fork (equivocation evidence)."""
        return list(self._log.entries_at(author, seq))

    def verdict(self, entry_id: str) -> Verdict | None:
        return self._derived.verdict(entry_id)

    def is_accepted(self, entry_id: str) -> bool:
        return self._derived.is_accepted(entry_id)

    def accepted_ids(self) -> set[str]:
        return {i for i in self._log.nodes if self.is_accepted(i)}

    def settings(self) -> AuthSettings:
        return self._derived.settings()

    def permission(self, key: str) -> Permission | None:
        return self._derived.permission(key)

    def feeds(self) -> dict[str, tuple[int, str]]:
        """author -> (highest seq, its entry id): what sync compares."""
        return self._log.feeds()

    @property
    def equivocators(self) -> dict[str, int]:
        return dict(self._log.equivocators)

    # ------------------------------------------------------------------ what sync reads
    def evidence(self) -> dict[str, list[str]]:
        """Per flagged author, the ids of its entries kept as evidence (bounded per author)."""
        return self._log.evidence()

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
        return self._log.missing_for(feeds, evidence or {}, want)

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
        step = _PAGE_READ
        while covered < len(ids):
            # Read in slices (one storage round trip each), the first small: a page of a few
            # large entries does not read hundreds it will not send.
            part = ids[covered:covered + step]
            step = min(4 * step, _PAGE_READ_MAX)
            for entry_id, stored in zip(part, self.storage.get_many(self.id, part)):
                if stored is None:
                    raise StorageError(f"entry {entry_id} is indexed but not stored")
                size = stored.size
                if out and total + size > max_bytes:
                    return out, covered
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
        node = self._log.get(entry_id)
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
        node = self._log.get(entry_id)
        return node.height if node else None

    def precedes(self, earlier: str, later: str) -> bool:
        """Whether entry ``earlier`` is in the causal past of entry ``later`` (both stored)."""
        return self._log.precedes(earlier, later)

    def past_vector(self, entry_id: str) -> dict[str, int] | None:
        """The version vector of a stored entry's causal past, the entry itself included
        (author key -> highest seq); None if not stored. An entry x is ``entry_id`` or one of
        its ancestors exactly when ``vv.get(x's author key, -1) >= x.seq`` (what
        :meth:`precedes` checks), so a reader can test many entries against one past at once."""
        node = self._log.get(entry_id)
        return None if node is None else dict(node.vv)

    def settings_at(self, entry_id: str) -> AuthSettings | None:
        """The settings of an accepted entry's causal past, the entry itself excluded: what the
        validity rule judged it by (and what a rule over its rows, such as a quarantine's,
        must judge it by too: a function of signed facts, the same on every replica). None if
        no accepted entry has that id."""
        if not self.is_accepted(entry_id):
            return None
        node = self._log[entry_id]
        vv = self.past_vector(entry_id) or {}
        if node.entry.seq == 0:
            vv.pop(node.author_key, None)
        else:
            vv[node.author_key] = node.entry.seq - 1
        return self._derived.settings_at(vv)

    def doc(self, store: str) -> pycrdt.Doc[Any]:
        """The derived pycrdt document of a store (read it; never write to it)."""
        return self._derived.doc(store)

    def stores(self) -> list[str]:
        return sorted(self._log.stores)

    def rows(self, store: str) -> list[RowRecord]:
        """Every row of the store that is shown (accepted, payload held, not erased), in T order."""
        return self._derived.rows(store)

    def shown_entries(self, store: str) -> set[str]:
        """The entries whose rows of ``store`` are shown now (accepted, payload held, not
        erased): a reader that kept rows can tell which it may keep and which are new."""
        return self._derived.shown_entries(store)

    def rows_of(self, store: str, entry_ids: Iterable[str]) -> list[RowRecord]:
        """:meth:`rows` of these entries only (the shown ones), in T order."""
        return self._derived.rows_of(store, entry_ids)

    def small_rows(self, store: str) -> list[RowRecord]:
        """:meth:`rows` of a store that is small but read often (an agent's config), kept in
        memory until a row of it is shown or hidden: reading it anew scans the whole log, which
        in a database with many entries of other stores (a long history) costs seconds."""
        return self._derived.small_rows(store)

    def meta(self) -> dict[str, Any]:
        """The database's meta: later rows (T order) override earlier fields."""
        return self._derived.meta()

    # --------------------------------------------------------------- payloads and refusals
    def payload_state(self, entry_id: str, store: str) -> str | None:
        """"present", "erased" (by an accepted signed erase) or "pending" (not held yet, and
        fetched again); None if the entry or store is unknown."""
        node = self._log.get(entry_id)
        if node is None or store not in node.entry.stores:
            return None
        if self._derived.is_erased(entry_id, store, node.author_key):
            return "erased"
        return "pending" if store in self._log.absent(entry_id) else "present"

    def wanted(self) -> dict[str, Any]:
        """What this database lacks and sync should fetch: parents pending entries wait for,
        entries waiting in the pending area for payloads, and payloads of stored entries."""
        payloads = sorted(
            (entry_id, store) for entry_id, store in self._log.absent_payloads()
            if not self._derived.is_erased(entry_id, store, self._log[entry_id].author_key)
        )
        waiting = sorted(r.id for r in self._pending.records() if not r.missing)
        return {"parents": sorted(self._pending.missing_parents() - set(self._log.nodes)),
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
        return entry_id in self._log or entry_id in self._pending or self._refusals.get(entry_id) is not None

    def ids_starting(self, prefix: str) -> set[str]:
        """The ids ``knows`` would answer for that start with ``prefix`` (a short id a person
        copied): one scan of what is stored, pending and recorded as refused."""
        found = {i for i in self._log.nodes if i.startswith(prefix)}
        found.update(i for i in self.pending_ids() if i.startswith(prefix))
        found.update(r.id for r in self._refusals.recent(limit=1 << 30) if r.id.startswith(prefix))
        return found

    def explain(self, entry_id: str) -> str:
        node = self._log.get(entry_id)
        if node is not None:
            if node.excluded:
                fork = self._log.equivocators[node.author_key]
                text = (f"{entry_id} is signed by {node.author_key}, which signed two different entries "
                        f"at seq {fork}; its entries from that seq on are kept as evidence, not applied")
            else:
                text = self._derived.explain(entry_id)
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
    def transaction(self, key: SigningKey) -> Transaction:
        """Start a local write. The key must be allowed to write; checked now and at commit."""
        self._check_can(key, "write")
        return self._transaction(key)

    def change_settings(self, key: SigningKey, ops: Sequence[GrantOp | RevokeOp]) -> str:
        """Grant, change or revoke keys in one signed entry; returns its id."""
        txn = self._transaction(key)
        for op in ops:
            txn.append(SETTINGS, _op_value(op))
        return txn.commit()

    def set_meta(self, key: SigningKey, **fields: Any) -> str:
        self._check_can(key, "admin")
        txn = self._transaction(key)
        txn.append(META, fields)
        return txn.commit()

    def erase(self, key: SigningKey, entry_id: str, store: str) -> str:
        """Erase one payload by a signed erase entry (the entry's author, or an admin).

        The erase replicates like any entry; every replica deletes the payload once the erase
        is valid there, and never accepts it again. The entry, its id and signature stay.
        """
        if store in UNERASABLE:
            raise RejectedError("erase.settings", f"{store} payloads cannot be erased: authorisation depends on them")
        node = self._log.get(entry_id)
        if node is None or store not in node.entry.stores:
            raise MemmeshError(f"no payload {store!r} in entry {entry_id}")
        self._check_can(key, "write" if node.author_key == str(key.public) else "admin")
        txn = self._transaction(key)
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
        needed = "admin" if SETTINGS in staged else "write"
        self._check_can(key, needed)
        if author in self._log.equivocators:
            raise AuthError("entry.equivocation", f"key {author} is flagged for equivocation in {self.id}")
        entry = sign_local(key, staged, base, self._log, self.id, self._clock)
        result = self._pipeline.run([entry], local=True, source="local")
        if entry.id not in result.accepted:
            reason, detail = next(((r, d) for i, r, d in result.rejected if i == entry.id),
                                  ("auth.rejected", "the entry was not accepted"))
            raise AuthError(reason, detail)
        return entry.id

    def _transaction(self, key: SigningKey) -> Transaction:
        # The index is looked up at each call: a reload replaces it while a transaction is open.
        return Transaction(key, next_clock=lambda author, store: self._log.next_clock(author, store),
                           commit=self._commit_local)
