"""A bounded, persistent record of what a database refused, and counts per source and reason.

Refused input is never stored in the log, so without this record a node could not say why it
turned an entry away. Each refusal keeps the entry id (for bytes that do not even parse, the
same ``sha256:`` digest of the header bytes, so one id names one byte string), the reason code,
the source that sent it and when. The record is a ring of ``capacity`` slots in the storage's
peer-local records (never synced); the counts are kept for every (source, reason) ever seen,
in one record. Writes happen once per ingested batch, in one transaction.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import msgpack

from memmesh.crdt import clock
from memmesh.crdt.storage import Storage

DEFAULT_CAPACITY = 1024
MAX_DETAIL = 400
MAX_SOURCES = 4096  # distinct sources counted; later ones are counted under "other"


@dataclass(frozen=True, slots=True)
class Refusal:
    id: str  # entry id, or the digest of the refused header bytes
    reason: str  # stable reason code, e.g. "entry.signature"
    detail: str  # the sentence for people
    source: str  # who sent it: "peer:<key>", "local", "" when unknown
    at_ms: int  # wall-clock time it was refused (informational)
    seq: int = -1  # its number in this database's record, increasing: what paging goes by
    author: str | None = None  # the signing key, when the bytes parsed far enough to name one


class RefusalLog:
    def __init__(self, storage: Storage, db_id: str, capacity: int = DEFAULT_CAPACITY) -> None:
        self._storage = storage
        self._ns = f"refusals:{db_id}"
        self._capacity = capacity
        self._loaded = False
        self._by_id: OrderedDict[str, Refusal] = OrderedDict()
        self._next = 0
        self._counts: dict[str, dict[str, int]] = {}

    def _load(self) -> None:
        if self._loaded:
            return
        slots: list[tuple[int, Refusal]] = []
        for key, value in self._storage.items_local(self._ns):
            if key == "next":
                self._next = int(msgpack.unpackb(value))
            elif key == "counts":
                self._counts = {s: dict(r) for s, r in msgpack.unpackb(value).items()}
            elif key.startswith("slot:"):
                n, rid, reason, detail, source, at, *rest = msgpack.unpackb(value)  # rest: author (newer slots)
                slots.append((n, Refusal(rid, reason, detail, source, at, n, rest[0] if rest else None)))
        for _n, refusal in sorted(slots, key=lambda s: s[0]):
            self._by_id.pop(refusal.id, None)
            self._by_id[refusal.id] = refusal
        self._loaded = True

    def record(self, items: list[tuple[str, str, str]], source: str, now_ms: int | None = None,
               authors: Mapping[str, str] | None = None) -> None:
        """Record refusals (id, reason, detail) from one source, durably, in one transaction;
        ``authors`` names the signing key of those whose bytes parsed far enough."""
        if not items:
            return
        self._load()
        at = clock.now_ms() if now_ms is None else now_ms
        writes: dict[str, bytes] = {}  # a flood wraps the ring: write each slot once
        counts_for = self._counts.get(source)
        if counts_for is None:
            source_key = "other" if len(self._counts) >= MAX_SOURCES else source
            counts_for = self._counts.setdefault(source_key, {})
        for rid, reason, detail in items:
            n = self._next
            author = (authors or {}).get(rid)
            refusal = Refusal(rid, reason, detail[:MAX_DETAIL], source, at, n, author)
            self._next += 1
            writes[f"slot:{n % self._capacity:06d}"] = msgpack.packb([n, rid, reason, refusal.detail, source, at,
                                                                      author])
            self._by_id.pop(rid, None)
            self._by_id[rid] = refusal
            counts_for[reason] = counts_for.get(reason, 0) + 1
        while len(self._by_id) > self._capacity:
            self._by_id.popitem(last=False)
        writes["next"] = msgpack.packb(self._next)
        writes["counts"] = msgpack.packb(self._counts)
        self._storage.put_local_many(self._ns, list(writes.items()))

    def get(self, entry_id: str) -> Refusal | None:
        self._load()
        return self._by_id.get(entry_id)

    def recent(self, limit: int = 50, offset: int = 0) -> list[Refusal]:
        """Newest first."""
        self._load()
        items = list(reversed(self._by_id.values()))
        return items[offset:offset + limit]

    def counts(self) -> dict[str, dict[str, int]]:
        """source -> reason -> how many entries from that source were refused for that reason."""
        self._load()
        return {s: dict(r) for s, r in self._counts.items()}
