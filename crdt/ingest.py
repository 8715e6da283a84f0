"""Ingestion: the validation pipeline of crdt/database.py (steps 2-8 of its docstring), as a mixin
of ``Database``: copies and fill-ins, the pending area, the structural checks, equivocation,
the bounds on what an author keeps that is not valid, authorisation, one transaction per batch.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Callable, Iterable, Mapping, Sequence


from memmesh.auth.ops import GrantOp, RevokeOp
from memmesh.auth.permissions import ADMIN, WRITE, holds
from memmesh.crdt.entry import Entry, decode_entry, decode_many, id_of
from memmesh.crdt.erasure import UNERASABLE, EraseOp
from memmesh.crdt.errors import AuthError, EntryRejected, MemmeshError, PendingFullError, RejectedError, StorageError
from memmesh.crdt.storage import StoredEntry
from memmesh.crdt.validity import Event
from memmesh.crdt.yjs import Row

from memmesh.crdt.records import (  # noqa: I001
    _NO_PAYLOADS,
    MAX_UNACCEPTED_BYTES, MAX_UNACCEPTED_ENTRIES, IngestResult, Outcome, Rebuilt, Refused, _gc_paused, _Stored,
    _stored,
    _with_payloads, check_payload_shape, valid_store_name,
)

log = logging.getLogger("memmesh.crdt.database")


def _notify(listener: Callable[..., None], what: object) -> None:
    """Tell one observer what a committed ingest did. Its failure is logged, never raised: the
    entries are stored, and an exception here would tell the writer (or the peer that sent
    them) that they were not."""
    try:
        listener(what)
    except Exception:
        log.exception("an observer of database ingests failed (%r); the ingest itself is committed", listener)


class Ingestion:
    """The pipeline's methods; state lives in Database (see Database._reset)."""

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
        self._record_refusals(refused, source)
        if refused:
            self._tell(Outcome(source, (), tuple(Refused(i, None, r, d, source) for i, r, d in refused)))
        result.merge(self._ingest(entries, local=False, source=source))
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

    def _tell(self, outcome: Outcome) -> None:
        for listener in list(self._outcome_listeners):
            _notify(listener, outcome)

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
        authors: dict[str, str] = {}  # entry id -> author, for what observers are told of refusals
        for record in self._pending.expire():
            authors[record.id] = record.author
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
                authors[entry.id] = entry.author_key
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
                    except PendingFullError as exc:
                        # Only the storage's bound is a refusal of the entry; any other
                        # StorageError (a full disk) fails the whole batch below.
                        refuse(entry.id, EntryRejected("entry.pending_full", str(exc)))
                        continue
                    for record in evicted:
                        authors[record.id] = record.author
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
            self._record_refusals(refused, source, authors=authors)
            by_source: dict[str, list[tuple[str, str, str]]] = {}
            for src, entry_id, reason, detail in displaced:
                by_source.setdefault(src, []).append((entry_id, reason, detail))
            for src, items in by_source.items():
                self._record_refusals(items, src, authors=authors)
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
                _notify(listener, ids)
        if self._outcome_listeners and (result.accepted or refused or displaced):
            self._tell(Outcome(
                source, tuple((i, authors[i]) for i in result.accepted),
                tuple(Refused(i, authors.get(i), r, d, source) for i, r, d in refused)
                + tuple(Refused(i, authors.get(i), r, d, src) for src, i, r, d in displaced)))
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
