"""The pending area: entries that wait for missing parents or for their payloads.

An entry whose parents are unknown cannot be judged yet, and one that arrived without a
payload cannot be applied; both wait here until what they lack arrives. Anyone can send such
entries (a throwaway key's orphans whose parents never come), so the area is bounded at three
levels, each by entries and bytes: per author, per source (the peer that delivered them), and
per database. When a bound would be exceeded the area makes room by evicting, oldest first:
the author's own entries at the author level, the largest author's within the source at the
source level, the largest source's at the database level. So a flood only ever displaces
entries of whoever sends or signs the most, never another source's or author's fair share.
Entries also expire after ``ttl_ms``. An evicted or expired entry is not lost for good: it is
not in the log, so the peer that has it sends it again on the next sync.

Only metadata lives in memory (``PendingRecord``); headers and payloads stay in storage and
are read back when the entry can proceed.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from memmesh.crdt.clock import now_ms
from memmesh.crdt.errors import StorageError
from memmesh.crdt.storage import PendingRecord, Storage, StoredEntry

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class PendingLimits:
    """Bounds of the pending area of one database (see docs/security.md for why these)."""

    author_entries: int = 512
    author_bytes: int = 8 * MiB
    source_entries: int = 2048
    source_bytes: int = 32 * MiB
    total_entries: int = 8192
    total_bytes: int = 64 * MiB
    ttl_ms: int = 30 * 60 * 1000


class _Tally:
    """Entry ids (in arrival order) and their bytes, for one author or one source."""

    __slots__ = ("ids", "bytes")

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.bytes = 0

    def add(self, entry_id: str, size: int) -> None:
        self.ids[entry_id] = size
        self.bytes += size

    def remove(self, entry_id: str) -> None:
        size = self.ids.pop(entry_id, None)
        if size is not None:
            self.bytes -= size


_K = TypeVar("_K", str, tuple[str, str])


def _untally(tallies: dict[_K, _Tally], name: _K, entry_id: str) -> None:
    tally = tallies[name]
    tally.remove(entry_id)
    if not tally.ids:
        del tallies[name]


class _Desc:
    """Orders names in reverse, so that a min-heap of (-value, _Desc(name)) pops the largest
    (value, name) first: the same choice as ``max(..., key=lambda n: (value[n], n))``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __lt__(self, other: _Desc) -> bool:
        return self.name > other.name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.name == other.name


class _Ranking:
    """The name with the largest (value, name) as values change, in O(log n) a change.

    A heap whose entries may be stale (a value changed since): they are skipped when met, and
    the heap is rebuilt when stale entries outnumber live ones. Finding the biggest author or
    source by a scan on every eviction made a flood of orphans quadratic (5,000 took 30 s)."""

    __slots__ = ("values", "heap")

    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.heap: list[tuple[int, _Desc]] = []

    def set(self, name: str, value: int) -> None:
        if value:
            self.values[name] = value
            heapq.heappush(self.heap, (-value, _Desc(name)))
        else:
            self.values.pop(name, None)
        if len(self.heap) > 4 * len(self.values) + 64:
            self.heap = [(-v, _Desc(n)) for n, v in self.values.items()]
            heapq.heapify(self.heap)

    def top(self) -> str | None:
        heap, values = self.heap, self.values
        while heap:
            value, name = heap[0]
            if values.get(name.name) == -value:
                return name.name
            heapq.heappop(heap)
        return None


class PendingArea:
    def __init__(self, storage: Storage, db_id: str, limits: PendingLimits | None = None,
                 clock: Callable[[], int] = now_ms) -> None:
        self._storage = storage
        self._db = db_id
        self.limits = limits or PendingLimits()
        self._clock = clock
        self._records: dict[str, PendingRecord] = {}  # arrival order
        self._waiting: dict[str, set[str]] = {}  # missing parent -> pending ids
        self._authors: dict[str, _Tally] = {}
        self._sources: dict[str, _Tally] = {}
        # Kept as entries come and go, so that making room costs O(log n), not a scan:
        self._source_authors: dict[tuple[str, str], _Tally] = {}  # (source, author) -> its entries there
        self._author_rank: dict[str, tuple[_Ranking, _Ranking]] = {}  # source -> its authors by entries, bytes
        self._source_rank = (_Ranking(), _Ranking())  # sources by entries, by bytes
        self._bytes = 0
        self._last_expiry = 0

    # ------------------------------------------------------------------------- state
    def load(self) -> None:
        self._records.clear()
        self._waiting.clear()
        self._authors.clear()
        self._sources.clear()
        self._source_authors.clear()
        self._author_rank.clear()
        self._source_rank = (_Ranking(), _Ranking())
        self._bytes = 0
        for record in self._storage.pending(self._db):
            self._index(record)

    def _index(self, record: PendingRecord) -> None:
        self._records[record.id] = record
        for parent in record.missing:
            self._waiting.setdefault(parent, set()).add(record.id)
        self._authors.setdefault(record.author, _Tally()).add(record.id, record.size)
        self._sources.setdefault(record.source, _Tally()).add(record.id, record.size)
        self._source_authors.setdefault((record.source, record.author), _Tally()).add(record.id, record.size)
        self._rank(record.source, record.author)
        self._bytes += record.size

    def _rank(self, source: str, author: str) -> None:
        """Tell the rankings the new tallies of ``source`` and of ``author`` within it."""
        tally = self._source_authors.get((source, author))
        by_entries, by_bytes = self._author_rank.setdefault(source, (_Ranking(), _Ranking()))
        by_entries.set(author, len(tally.ids) if tally else 0)
        by_bytes.set(author, tally.bytes if tally else 0)
        if not by_entries.values:
            del self._author_rank[source]
        src = self._sources.get(source)
        self._source_rank[0].set(source, len(src.ids) if src else 0)
        self._source_rank[1].set(source, src.bytes if src else 0)

    def _unindex(self, entry_id: str) -> PendingRecord | None:
        record = self._records.pop(entry_id, None)
        if record is None:
            return None
        for parent in record.missing:
            ids = self._waiting.get(parent)
            if ids is not None:
                ids.discard(entry_id)
                if not ids:
                    del self._waiting[parent]
        _untally(self._authors, record.author, entry_id)
        _untally(self._sources, record.source, entry_id)
        _untally(self._source_authors, (record.source, record.author), entry_id)
        self._rank(record.source, record.author)
        self._bytes -= record.size
        return record

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._records

    def __len__(self) -> int:
        return len(self._records)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def record(self, entry_id: str) -> PendingRecord | None:
        return self._records.get(entry_id)

    def records(self) -> list[PendingRecord]:
        return list(self._records.values())

    def waiting_on(self, entry_id: str) -> set[str]:
        """Pending entries that name ``entry_id`` as a missing parent."""
        return set(self._waiting.get(entry_id, ()))

    def missing_parents(self) -> set[str]:
        """Ids some pending entry waits for (what sync should fetch)."""
        return set(self._waiting)

    def stored(self, entry_id: str) -> StoredEntry | None:
        return self._storage.get_pending(self._db, entry_id)

    # ------------------------------------------------------------------------- changes
    def put(self, entry: StoredEntry, author: str, missing: Iterable[str], source: str) -> list[PendingRecord]:
        """Keep ``entry`` until what it misses arrives; returns the records evicted to make room.

        Raises StorageError if the storage's own backstop refuses it.
        """
        missing_t = tuple(missing)
        old = self._records.get(entry.id)
        received = old.received_ms if old is not None else self._clock()
        if old is not None:
            self._unindex(entry.id)
        record = PendingRecord(entry.id, author, source, received, entry.size, missing_t)
        evicted = self._make_room(record)
        if evicted:
            self._storage.drop_pending(self._db, [r.id for r in evicted])
        try:
            self._storage.put_pending(self._db, entry, missing_t, author=author, source=source,
                                      received_ms=received)
        except StorageError:
            if old is not None:
                self._storage.drop_pending(self._db, [entry.id])
            raise
        self._index(record)
        return evicted

    def _make_room(self, new: PendingRecord) -> list[PendingRecord]:
        lim = self.limits
        evicted: list[PendingRecord] = []

        def evict(entry_id: str) -> None:
            record = self._unindex(entry_id)
            if record is not None:
                evicted.append(record)

        author = self._authors.get(new.author)
        while author and (len(author.ids) + 1 > lim.author_entries or author.bytes + new.size > lim.author_bytes):
            evict(next(iter(author.ids)))
            author = self._authors.get(new.author)
        source = self._sources.get(new.source)
        while source:
            over_entries = len(source.ids) + 1 > lim.source_entries
            if not over_entries and source.bytes + new.size <= lim.source_bytes:
                break
            # The author holding most of what is exceeded (entries, or bytes) gives way first.
            biggest = self._author_rank[new.source][0 if over_entries else 1].top()
            assert biggest is not None  # the source holds entries, so its authors are ranked
            evict(next(iter(self._source_authors[(new.source, biggest)].ids)))
            source = self._sources.get(new.source)
        while self._records:
            over_entries = len(self._records) + 1 > lim.total_entries
            if not over_entries and self._bytes + new.size <= lim.total_bytes:
                break
            # The source holding most of what is exceeded gives way first.
            biggest_source = self._source_rank[0 if over_entries else 1].top()
            assert biggest_source is not None  # the area holds entries, so their sources are ranked
            evict(next(iter(self._sources[biggest_source].ids)))
        return evicted

    def forget(self, entry_ids: Iterable[str]) -> None:
        """Drop from memory entries that left storage's pending area (stored or dropped)."""
        for entry_id in entry_ids:
            self._unindex(entry_id)

    def drop(self, entry_ids: Iterable[str]) -> None:
        ids = [i for i in entry_ids if i in self._records]
        if ids:
            self._storage.drop_pending(self._db, ids)
            self.forget(ids)

    def expire(self) -> list[PendingRecord]:
        """Drop entries older than the time to live; returns their records."""
        now = self._clock()
        # A scan of the whole area, so at most once a second.
        if not self._records or now - self._last_expiry < 1000:
            return []
        self._last_expiry = now
        cutoff = now - self.limits.ttl_ms
        old = [r for r in self._records.values() if r.received_ms < cutoff]
        self.drop([r.id for r in old])
        return old

