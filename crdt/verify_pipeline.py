"""Signature checks beside the ingest: batch n+1's signatures are checked while batch n is
decoded, stored and applied.

``AheadVerifier.ahead(items)`` hands the (author, signed body, signature) bytes of a batch that
will be ingested next to the worker process (crdt/verify_process.py, crdt/verify_worker.py) and
returns at once. ``AheadVerifier.decode(items)`` is ``decode_many`` (the same results, in the
same order, with the same reasons): it decodes every item here, takes the worker's verdict for
an entry only when it was computed for exactly these header bytes and the author the full
decode reads from them, and checks the rest itself. What the worker has not reached yet this
thread takes from the end of the batch (``gather`` in crdt/verify_process.py), so it never
waits on the worker, and the worker, told where this thread took over, goes on to the next
batch: the split between the two follows their speeds with no estimate to tune. Only the signature check
is sent: the decode is needed here anyway, and shipping decoded entries back costs more CPU
than it saves. Nothing here or in the worker touches a database: the caller decides, from these
results, exactly as the serial path does.
"""
from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from memmesh.crdt.entry import Entry, decode_unverified
from memmesh.crdt.errors import EntryRejected
from memmesh.crdt.verify_process import (
    MIN_WORKER_BATCH,
    SignatureWorker,
    Triple,
    gather,
    shared_worker,
    verify_here,
    verify_split,
)

Item = tuple[bytes, Mapping[str, bytes | None] | None]

# Entries announced and not yet ingested, and batches, per database: a caller that announces
# batches it never ingests (a push cut short) must not grow memory without bound; the oldest
# announced batch is dropped first.
MAX_AHEAD = 16384
MAX_BATCHES = 4


def _rejected() -> EntryRejected:
    return EntryRejected("entry.signature", "signature does not verify for the author's key")


_AUTHOR_AT = b"\x88\xa6author\xc4\x20"  # a canonical body starts with its 32-byte author


def _author_of(header: bytes) -> bytes | None:
    """The author a canonical header names, read without decoding it (decode_entry decides)."""
    if len(header) < 110 or header[1:11] != _AUTHOR_AT:
        return None
    return header[11:43]


def _triple(entry: Entry | EntryRejected) -> Triple:
    assert isinstance(entry, Entry)
    return entry.author, entry.header[1:-66], entry.header[-64:]


class _Slot:
    __slots__ = ("author", "index", "ticket")

    def __init__(self, ticket: int, index: int, author: bytes) -> None:
        self.ticket, self.index, self.author = ticket, index, author


class AheadVerifier:
    """The entries of one database's coming batches (see the module docstring)."""

    def __init__(self, worker: SignatureWorker | None = None) -> None:
        self._worker = worker or shared_worker()
        self._lock = threading.Lock()
        self._slots: dict[bytes, _Slot] = {}  # header -> where its result comes from
        self._open: dict[int, int] = {}  # ticket -> slots not yet resolved
        self.from_worker = 0  # entries whose signature the worker checked

    def ahead(self, items: Sequence[Item]) -> None:
        """Start checking the signatures of entries that will be ingested soon; returns at once."""
        with self._lock:
            chosen: list[tuple[bytes, Triple]] = []
            for header, _payloads in items:
                if type(header) is not bytes or header in self._slots:
                    continue
                author = _author_of(header)
                if author is not None:
                    chosen.append((header, (author, header[1:-66], header[-64:])))
            while len(self._open) >= MAX_BATCHES:
                self._drop(next(iter(self._open)))
            take = min(MAX_AHEAD - len(self._slots), len(chosen))
            if take < MIN_WORKER_BATCH:
                return
            ticket = self._worker.submit([t for _h, t in chosen[:take]])
            if ticket is None:
                return
            for i, (header, triple) in enumerate(chosen[:take]):
                self._slots[header] = _Slot(ticket, i, triple[0])
            self._open[ticket] = take

    def decode(self, items: Sequence[Item], *, expected_db: str | None = None) -> list[Entry | EntryRejected]:
        """decode_many, with the verdicts computed ahead (see the module docstring)."""
        out = decode_unverified(items, expected_db=expected_db)
        with self._lock:
            ahead: list[tuple[int, _Slot]] = []
            here: list[int] = []
            for i, e in enumerate(out):
                if not isinstance(e, Entry):
                    continue
                slot = self._slots.pop(e.header, None)
                if slot is not None and slot.author == e.author:
                    ahead.append((i, slot))
                else:
                    here.append(i)
                    if slot is not None:
                        self._release(slot.ticket)
            # What was not announced is checked here while the worker checks what was (this
            # batch, or the next one); only when the worker has nothing of ours is a batch
            # split with it.
            triples = [_triple(out[i]) for i in here]
            oks = verify_here(triples) if ahead or self._open else verify_split(triples, self._worker)
            verdicts = list(zip(here, oks)) + self._take_ahead(out, ahead)
        for i, ok in verdicts:
            if not ok:
                out[i] = _rejected()
        return out

    def forget(self) -> None:
        """Drop everything announced and not ingested."""
        with self._lock:
            for ticket in self._open:
                self._worker.release(ticket)
            self._slots.clear()
            self._open.clear()

    def _take_ahead(self, out: list[Entry | EntryRejected], ahead: list[tuple[int, _Slot]]) -> list[tuple[int, bool]]:
        by_ticket: dict[int, list[tuple[int, _Slot]]] = {}
        for i, slot in ahead:
            by_ticket.setdefault(slot.ticket, []).append((i, slot))
        verdicts: list[tuple[int, bool]] = []
        for ticket, unsorted in by_ticket.items():
            places = sorted(unsorted, key=lambda p: p[1].index)
            oks, from_worker = gather(self._worker, ticket, [_triple(out[i]) for i, _ in places],
                                      [slot.index for _i, slot in places])
            verdicts += zip((i for i, _ in places), oks)
            self.from_worker += from_worker
            self._release(ticket, len(places))
        return verdicts

    def _drop(self, ticket: int) -> None:
        for header in [h for h, slot in self._slots.items() if slot.ticket == ticket]:
            del self._slots[header]
        self._open.pop(ticket, None)
        self._worker.release(ticket)

    def _release(self, ticket: int, count: int = 1) -> None:
        left = self._open.get(ticket, 0) - count
        if left > 0:
            self._open[ticket] = left
            return
        self._open.pop(ticket, None)
        self._worker.release(ticket)
