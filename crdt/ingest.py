"""The ingest pipeline: steps 2-8 of crdt/database.py's docstring, for local writes and for
entries received from peers.

Copies of stored entries and the payloads they fill in, the pending area (entries waiting for
parents or payloads, and the erases among them that cover payloads not held), the structural
checks, equivocation, the bound on what an author keeps that is not valid, authorisation, one
storage transaction per batch; then the derived state is brought up to date and observers are
told. The pipeline owns none of the log's state: it reads and grows the ``LogIndex`` and the
``DerivedState`` it is given.
"""
from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from memmesh.auth.permissions import holds
from memmesh.crdt.candidates import UnacceptedTally
from memmesh.crdt.derived import Applied, DerivedState, event_of
from memmesh.crdt.entry import Entry, decode_entry, id_of
from memmesh.crdt.erasure import ERASE, UNERASABLE, EraseOp
from memmesh.crdt.errors import AuthError, EntryRejected, MemmeshError, PendingFullError, RejectedError, StorageError
from memmesh.crdt.frozen import builder
from memmesh.crdt.log_index import IndexedEntry, LogIndex
from memmesh.crdt.observers import Observers
from memmesh.crdt.pending import PendingArea
from memmesh.crdt.records import (
    IngestResult,
    Outcome,
    Rebuilt,
    Refused,
    _gc_paused,
    _stored,
    _with_payloads,
    check_payload_shape,
)
from memmesh.crdt.refusals import RefusalLog
from memmesh.crdt.storage import Storage, StoredEntry
from memmesh.crdt.verify_pipeline import AheadVerifier
from memmesh.crdt.yjs import Row

log = logging.getLogger("memmesh.crdt.database")

# What admitting one entry did: applied, stored as a candidate, or changed earlier verdicts.
Admission = Literal["accepted", "candidate", "rebuild"]
Received = tuple[bytes, Mapping[str, bytes | None]]


_stored_entry = builder(StoredEntry)  # one per entry stored (crdt/frozen.py)


@dataclass
class _Batch:
    """What one ingest has done so far; committed (or undone by a reload) as a whole."""

    source: str
    queue: deque[Entry]
    result: IngestResult = field(default_factory=IngestResult)
    refused: list[tuple[str, str, str]] = field(default_factory=list)  # (id, reason, detail)
    # Evictions and expiries count against the source that sent the entry, not this caller.
    displaced: list[tuple[str, str, str, str]] = field(default_factory=list)  # (source, id, reason, detail)
    authors: dict[str, str] = field(default_factory=dict)  # entry id -> author, for observers
    staged: list[StoredEntry] = field(default_factory=list)
    fills: list[tuple[str, str, bytes]] = field(default_factory=list)  # (entry id, store, payload)
    from_pending: list[str] = field(default_factory=list)
    rebuild: bool = False
    applied: list[Applied] = field(default_factory=list)
    gc_fill: list[IndexedEntry] = field(default_factory=list)


class IngestPipeline:
    """Validates, stores and applies entries of one database."""

    def __init__(self, *, storage: Storage, db_id: str, index: LogIndex, derived: DerivedState,
                 pending: PendingArea, refusals: RefusalLog, observers: Observers,
                 reload: Callable[[], None], ahead: AheadVerifier | None = None) -> None:
        """``reload`` rebuilds everything in memory from the log: what a failed commit leaves.
        ``ahead`` holds the signatures checked ahead of their batch (it outlives a reload:
        a verdict is a function of the header's bytes alone)."""
        self._storage = storage
        self._db_id = db_id
        self._index = index
        self._derived = derived
        self._pending = pending
        self._refusals = refusals
        self._observers = observers
        self._reload = reload
        self._ahead = ahead or AheadVerifier()
        self._unaccepted = UnacceptedTally()
        # Erases still waiting in the pending area cover too: an erase is usually a descendant
        # of what it erases, so the header-only target must not wait for it (nor it for them).
        self._pending_covers: dict[tuple[str, str], list[tuple[str, str]]] = {}  # -> [(author, erase id)]

    # ------------------------------------------------------------------------ entry points
    def ingest(self, items: Iterable[Received], *, source: str = "") -> IngestResult:
        """Entries received from a peer, as (header, payloads); see Database.ingest."""
        batch = list(items)
        if len(batch) < 32:  # a pause is not worth it for a few entries
            return self._ingest_received(batch, source)
        with _gc_paused():
            return self._ingest_received(batch, source)

    def verify_ahead(self, items: Sequence[Received]) -> None:
        """Start checking the signatures of entries that a later ``ingest`` will take; see
        crdt/verify_pipeline.py. Only bytes are looked at: nothing is decided, stored or applied."""
        self._ahead.ahead(items)

    def ingest_entries(self, entries: Sequence[Entry], *, source: str = "") -> IngestResult:
        """Entries already decoded by decode_entry (e.g. built locally)."""
        for e in entries:
            if (e.db or e.id) != self._db_id:
                raise EntryRejected("entry.db", f"entry {e.id} belongs to another database")
        with _gc_paused():
            return self.run(list(entries), local=False, source=source)

    def load_pending(self) -> None:
        """Read the pending area back from storage, with the payloads its erases cover."""
        # Pending entries are checked in full when they leave the area: a damaged one is refused
        # then, never applied. Here only reading them must not fail with anything but one line.
        self._pending.load()
        for record in self._pending.records():
            stored = self._pending.stored(record.id)
            update = stored.payloads.get(ERASE) if stored is not None else None
            if stored is not None and update is not None:
                try:
                    entry = decode_entry(stored.header, stored.payloads, verify_signature=False)
                    self._note_pending_erases(entry, check_payload_shape(ERASE, entry.stores[ERASE], update).erases)
                except RejectedError:
                    continue

    def recount(self) -> None:
        """Tally again what each author keeps that is not valid (verdicts changed)."""
        self._unaccepted.clear()
        for node in self._index.nodes.values():
            if not self._derived.applies(node):
                self._unaccepted.count(node.author_key, node.size)

    def _ingest_received(self, batch: list[Received], source: str) -> IngestResult:
        entries: list[Entry] = []
        result = IngestResult()
        refused: list[tuple[str, str, str]] = []
        # Every signature of the batch is known before anything of it is decided: those checked
        # ahead (verify_ahead) are taken, the others checked now (decode_many's results).
        for (header, _payloads), item in zip(batch, self._ahead.decode(batch, expected_db=self._db_id)):
            if isinstance(item, Entry):
                entries.append(item)
            else:
                # The digest of the bytes names them, as an id would: explain can answer for it.
                digest = id_of(bytes(header)) if isinstance(header, (bytes, bytearray, memoryview)) else None
                result.rejected.append((digest, item.reason, str(item)))
                refused.append((digest or "sha256:-", item.reason, str(item)))
        self._record_refusals(refused, source)
        if refused:
            self._observers.tell(Outcome(source, (), tuple(Refused(i, None, r, d, source) for i, r, d in refused)))
        result.merge(self.run(entries, local=False, source=source))
        return result

    def _record_refusals(self, items: list[tuple[str, str, str]], source: str,
                         authors: Mapping[str, str] | None = None) -> None:
        """Write refusal records, best effort. They are what ``explain`` answers from, never data:
        when the disk cannot take them the refused entries are still not stored (the peer sends
        them again and they are refused again), and the error that matters is the ingest's own:
        a failure here must neither hide it nor fail an ingest that committed."""
        try:
            self._refusals.record(items, source, authors=authors)
        except StorageError as exc:
            log.warning("could not record %d refusal(s) from %s: %s", len(items), source or "an unnamed source", exc)

    # ---------------------------------------------------------------------------- a batch
    def run(self, entries: list[Entry], *, local: bool, source: str) -> IngestResult:
        """Steps 2-8 for a batch of decoded entries; ``local``: written here, never parked."""
        batch = _Batch(source, deque(entries))
        self._derived.ensure_live()
        for record in self._pending.expire():
            batch.authors[record.id] = record.author
            batch.displaced.append((record.source, record.id, "entry.pending_expired",
                                    "waited longer than the pending area keeps entries; it is fetched again when needed"))
        try:
            while batch.queue:
                self._take(batch, batch.queue.popleft(), local)
            if batch.staged or batch.from_pending:
                self._storage.append(self._db_id, batch.staged, drop_pending=batch.from_pending)
            for entry_id, store, update in batch.fills:
                self._storage.fill_payload(self._db_id, entry_id, store, update)
        except Exception:
            # Memory may be ahead of what was committed: the log decides.
            self._reload()
            raise
        finally:
            self._record_refusals(batch.refused, source, authors=batch.authors)
            by_source: dict[str, list[tuple[str, str, str]]] = {}
            for src, entry_id, reason, detail in batch.displaced:
                by_source.setdefault(src, []).append((entry_id, reason, detail))
            for src, items in by_source.items():
                self._record_refusals(items, src, authors=batch.authors)
        self._apply(batch)
        self._tell(batch)
        return batch.result

    def _take(self, batch: _Batch, entry: Entry, local: bool) -> None:
        """One entry of the batch: a copy, parked in the pending area, refused, or staged."""
        batch.authors[entry.id] = entry.author_key
        nodes = self._index.nodes
        node = nodes.get(entry.id)
        if node is not None:
            filled = self._fill_in(batch, node, entry)
            if filled:
                batch.result.filled += [(entry.id, s) for s in filled]
                batch.rebuild = True
            else:
                batch.result.duplicates += 1
            return
        if self._pending:
            entry = self._with_pending_copy(entry)
        missing = [p for p in entry.parents if p not in nodes]
        if entry.prev is not None and entry.prev not in nodes and entry.prev not in missing:
            missing.append(entry.prev)
        lacking = None
        if None in entry.payloads.values():
            lacking = [s for s, p in entry.payloads.items() if p is None and not self._covered(entry, s)]
        if missing or lacking:
            if local:
                raise MemmeshError("a local entry names unknown parents")
            self._park(batch, entry, missing)
            return
        try:
            node, outcome, rows = self._admit(entry)
        except RejectedError as exc:
            self._refuse(batch, entry.id, exc)
            return
        self._stage(batch, entry, node, outcome, rows)

    def _refuse(self, batch: _Batch, entry_id: str, exc: RejectedError) -> None:
        batch.result.rejected.append((entry_id, exc.reason, str(exc)))
        batch.refused.append((entry_id, exc.reason, str(exc)))
        if entry_id in self._pending:  # nothing malformed keeps waiting
            batch.from_pending.append(entry_id)
            self._pending.forget([entry_id])

    def _park(self, batch: _Batch, entry: Entry, missing: list[str]) -> None:
        """An entry that lacks parents or payloads waits in the pending area."""
        erases: list[EraseOp] = []
        try:
            # What can be checked without the entry's past is checked now.
            for store, update in entry.payloads.items():
                if update is not None:
                    erases += check_payload_shape(store, entry.stores[store], update).erases
        except RejectedError as exc:
            self._refuse(batch, entry.id, exc)
            return
        try:
            evicted = self._pending.put(_stored(entry), entry.author_key, missing, batch.source)
        except PendingFullError as exc:
            # Only the storage's bound is a refusal of the entry; any other
            # StorageError (a full disk) fails the whole batch.
            self._refuse(batch, entry.id, EntryRejected("entry.pending_full", str(exc)))
            return
        for record in evicted:
            batch.authors[record.id] = record.author
            batch.displaced.append((record.source, record.id, "entry.pending_evicted",
                                    "evicted from the full pending area to make room; it is fetched again when needed"))
        batch.result.pending.append(entry.id)
        if erases:
            self._note_pending_erases(entry, erases)
            batch.queue.extend(self._ready_targets(erases))

    def _stage(self, batch: _Batch, entry: Entry, node: IndexedEntry, outcome: Admission,
               rows: dict[str, tuple[Row, ...]]) -> None:
        """An admitted entry joins the batch's commit; entries that waited for it may follow."""
        if self._pending and entry.id in self._pending:
            batch.from_pending.append(entry.id)
            self._pending.forget([entry.id])
        payloads = entry.payloads
        if self._derived.erases_any:  # a payload an accepted erase already covers is never stored again
            payloads = {s: (None if p is None or self._derived.is_erased(entry.id, s, node.author_key) else p)
                        for s, p in payloads.items()}
        if self._pending_covers:
            for store in entry.stores:
                self._pending_covers.pop((entry.id, store), None)
        if None in payloads.values():
            self._index.set_absent(entry.id, {s for s, p in payloads.items() if p is None})
        batch.staged.append(_stored_entry(entry.id, entry.header, payloads))
        if outcome == "rebuild" or node.erases:
            batch.rebuild = True
        elif outcome == "accepted":
            batch.result.accepted.append(entry.id)
            batch.applied.append((node, rows, payloads))
        else:
            batch.result.stored_rejected.append(entry.id)
            batch.gc_fill.append(node)
        if self._pending:
            # Entries that waited for this one can now be considered...
            for waiting_id in sorted(self._pending.waiting_on(entry.id)):
                record = self._pending.record(waiting_id)
                if record is None or any(p not in self._index for p in record.missing):
                    continue
                batch.queue.append(self._pending_entry(waiting_id))
            # ... and so can entries that waited for a payload this entry erases.
            if node.erases:
                batch.queue.extend(self._ready_targets(node.erases))

    def _apply(self, batch: _Batch) -> None:
        """Bring the derived state up to date with what the batch committed."""
        if not batch.rebuild:
            self._derived.apply(batch.applied, batch.gc_fill)
            return
        result = batch.result
        accepted_now = {e.id for e in batch.staged if self._derived.is_accepted(e.id)}
        result.accepted = [e.id for e in batch.staged if e.id in accepted_now]
        result.stored_rejected = [e.id for e in batch.staged if e.id not in accepted_now]
        self._derived.recompute_erasure()
        self.recount()
        self._derived.invalidate()
        self._observers.emit(Rebuilt())

    def _tell(self, batch: _Batch) -> None:
        if batch.staged and self._observers.wants_stored:
            self._observers.stored(tuple(e.id for e in batch.staged))
        result, authors, source = batch.result, batch.authors, batch.source
        if self._observers.wants_outcomes and (result.accepted or batch.refused or batch.displaced):
            self._observers.tell(Outcome(
                source, tuple((i, authors[i]) for i in result.accepted),
                tuple(Refused(i, authors.get(i), r, d, source) for i, r, d in batch.refused)
                + tuple(Refused(i, authors.get(i), r, d, src) for src, i, r, d in batch.displaced)))

    # ---------------------------------------------------------------- the pending area
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
        return decode_entry(stored.header, stored.payloads, expected_db=self._db_id, verify_signature=False)

    def _note_pending_erases(self, entry: Entry, erases: Sequence[EraseOp]) -> None:
        for op in erases:
            self._pending_covers.setdefault((op.entry, op.store), []).append((op.author, entry.id))

    def _ready_targets(self, erases: Sequence[EraseOp]) -> list[Entry]:
        """Pending entries these erases name whose parents are all stored (they may proceed)."""
        out = []
        for entry_id in sorted({op.entry for op in erases}):
            record = self._pending.record(entry_id)
            if record is not None and not any(p not in self._index for p in record.missing):
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
        if self._index.covered_by_stored_erase(entry.id, store, entry.author_key):
            return True
        claims = self._pending_covers.get((entry.id, store))
        if not claims:
            return False
        live = [(a, i) for a, i in claims if i in self._pending]
        self._pending_covers[(entry.id, store)] = live
        return any(a == entry.author_key for a, _i in live)

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
            if holds(self._derived.permission(record.author), "write"):
                return True
        return False

    # ----------------------------------------------------------------- copies and admission
    def _fill_in(self, batch: _Batch, node: IndexedEntry, copy: Entry) -> list[str]:
        """A copy of a stored entry: fill in the payloads storage lacks (checked against the
        signed digest already, and shape-checked here); an erased payload is refused."""
        filled = []
        entry_id = node.entry.id
        for store in sorted(self._index.absent(entry_id)):
            update = copy.payloads.get(store)
            if update is None:
                continue
            if self._derived.is_erased(entry_id, store, node.author_key):
                self._refuse(batch, entry_id, EntryRejected(
                    "entry.erased", f"the {store} payload of this entry was erased by a signed erase; it is not accepted again"))
                continue
            try:
                check_payload_shape(store, node.entry.stores[store], update)
            except RejectedError as exc:
                self._refuse(batch, entry_id, exc)
                continue
            batch.fills.append((entry_id, store, update))
            self._index.mark_held(entry_id, store)
            filled.append(store)
        return filled

    def _admit(self, entry: Entry) -> tuple[IndexedEntry, Admission, dict[str, tuple[Row, ...]]]:
        """Steps 4-7 for one entry whose parents are all known; indexes it on success.

        Returns the node and "accepted", "candidate" (stored, not applied) or "rebuild"
        (verdicts of earlier entries changed).
        """
        author = entry.author_key
        vv, height = self._index.past_of(entry)
        if entry.is_root:
            if len(self._index):
                raise EntryRejected("entry.db", "a database has exactly one root entry")
        else:
            if vv.get(author, -1) != entry.seq - 1:
                raise EntryRejected(
                    "entry.feed",
                    f"seq {entry.seq} does not follow the author's latest entry in its causal past "
                    f"(seq {vv.get(author, -1)})",
                )
            if entry.prev is not None:
                prev = self._index[entry.prev]
                if prev.author_key != author or prev.entry.seq != entry.seq - 1:
                    raise EntryRejected("entry.feed", "prev is not the author's entry at seq - 1")
        vv[author] = entry.seq
        # Structural checks, whatever the author's standing: nothing malformed is stored.
        ops, rows, erases = self._index.check_payloads(entry, author)
        size = len(entry.header)
        for store, desc in entry.stores.items():
            if entry.payloads.get(store) is not None:
                size += desc.length
        wanted = bool(self._pending) and self._needed_by_a_writer(entry)
        forks = self._index.entries_at(author, entry.seq)
        if forks:
            # Equivocation: the two entries prove it; a third at the same seq adds nothing.
            if len(forks) >= 2 and not wanted:
                raise EntryRejected("entry.evidence_bound",
                                    f"{author} already has two entries at seq {entry.seq}: the equivocation "
                                    "is proven, further entries at that seq are not kept")
            node = IndexedEntry(entry, author, height, vv, ops, erases, excluded=True, size=size)
            self._index.insert(node)
            self._index.flag_equivocator(author, entry.seq)
            self._derived.rebuild_verdicts()
            return node, "rebuild", {}
        if entry.seq >= self._index.equivocators.get(author, entry.seq + 1):
            if not wanted:
                self._unaccepted.check(author, size, "entries after its equivocation, kept as evidence")
            node = IndexedEntry(entry, author, height, vv, ops, erases, excluded=True, size=size)
            self._index.insert(node)
            self._unaccepted.count(author, size)
            return node, "candidate", {}
        node = IndexedEntry(entry, author, height, vv, ops, erases, False, size)
        event = event_of(node)
        # Entries that no later event could make valid are refused (never stored).
        never = self._derived.never_valid(event)
        if never is not None:
            raise AuthError(never[0], never[1])
        # Past the bound only an entry that is valid now (or needed) is taken; previewing the
        # verdict costs an evaluation, so it is asked only then.
        if (self._unaccepted.would_exceed(author, size) and not wanted
                and not self._derived.preview(event).accepted):
            self._unaccepted.check(author, size, "entries that are not valid now (candidates)")
        self._index.insert(node)
        changed = self._derived.add(event)
        accepted = self._derived.applies(node)
        # Usually only its own verdict is new: others changed only when a settings entry moved them.
        if (len(changed) != 1 or entry.id not in changed) and any(i != entry.id and i in self._index for i in changed):
            return node, "rebuild", rows
        if not accepted:
            self._unaccepted.count(author, size)
        return node, "accepted" if accepted else "candidate", rows
