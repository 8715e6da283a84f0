"""The storage interface: one node's durable state, behind a small synchronous API.

Pure: no I/O here and no sqlite import. ``node.storage.SqliteStorage`` is the real adapter;
``MemoryStorage`` below is the dict-based reference that defines the semantics, and both must
pass the same conformance suite (tests/storage_conformance.py).

What is stored
--------------
* **The signed log, per database.** ``StoredEntry`` values keyed by entry id, in the order they
  were first stored. The header bytes are kept exactly as given (they are signed; never
  re-encoded). Each payload (pycrdt update bytes, one per store the entry touches) can later be
  erased: it becomes ``None`` while the header, and so the entry id and signature, stay.
* **Pending entries**, per database: entries that cannot be applied yet (they wait for some
  parents, or only for payloads), each with a ``PendingRecord``: who wrote it, who delivered
  it, when it was put, its size and the parent ids it waits for. The record is what a caller
  keeps in memory and reasons about; the header and payload bytes stay in storage until
  ``get_pending`` asks for them. Bounded (entry count and bytes per database) as a backstop so
  that a peer cannot fill the disk with orphans.
* **Peer-local records** (never synced): small namespaced key/value byte strings.
* **The damaged area**, per database: entries that `memmesh check --repair` moved aside (their
  bytes fail their own checks, or they descend from one that does), kept as found with a
  ``DamagedRecord`` for inspection. Nothing in it is ever applied, served or counted as
  stored: ``entries``, ``get``, ``has`` and ``count`` do not see it.

Semantics every adapter follows
-------------------------------
* ``append`` is one atomic transaction: either every new entry of the batch (and every
  ``drop_pending`` id) is stored, or nothing changes. It returns only after the transaction
  is committed, so a caller may acknowledge what it returned for.
* An entry whose id is already in the log is skipped, whatever its payloads: re-receiving an
  entry never resurrects an erased payload. Within one batch, the first copy of an id wins.
* ``fill_payload`` is the one way a payload comes back: it gives bytes to a payload that is
  ``None`` (erased, or never received) and leaves a present payload unchanged. The caller has
  checked the bytes against the signed digest; storage does not look at them.
* ``put_pending`` stores or replaces a pending entry; a replaced one keeps its place in the
  order and takes every new field. ``pending`` returns the records only (never bytes), in the
  order first put; ``get_pending`` returns the full stored copy. A pending entry leaves the
  area only through ``drop_pending`` or ``append(..., drop_pending=...)``.
* ``put_local_many`` is one atomic transaction, like ``append``: every record or none. Within
  one call a key given twice takes the last value, as successive ``put_local`` calls would.
* ``move_aside`` is one atomic transaction too: every ``Aside`` of the call or none. An entry
  moved from the log or the pending area leaves it; an ``Aside`` naming ``stores`` keeps the
  entry in the log with just those payloads made ``None`` (not received, so sync fetches them
  again) and keeps a copy as found. An id already aside is replaced by the new copy, in the
  same place. An entry that is not where the ``Aside`` says raises ``StorageError``.
* Operations on a database that was never added raise ``StorageError``; so do
  ``erase_payload`` and ``fill_payload`` on an unknown entry or store, a full pending area, and
  any use after ``close()``. Arguments of the wrong type raise ``TypeError``, malformed values
  (names, labels, times) ``ValueError``; both are checked for the whole batch as it is
  written, and leave the storage unchanged.
* Names (database ids, entry ids, store names, local namespaces and keys) are non-empty
  ``str`` without NUL characters, encodable as UTF-8. Labels (a pending entry's author and
  source) follow the same rules but may be empty. Times are ``int`` milliseconds, from 0 to
  2**63 - 1 (what SQLite's INTEGER holds). Byte values accept ``bytes``, ``bytearray`` or
  ``memoryview`` and are returned as ``bytes``.
* Payload mappings are returned read-only, ordered by store name.
* All methods are synchronous and serialised by a lock: safe to call from an asyncio thread
  and a worker thread at once (one writer at a time).
"""
from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeGuard

from memmesh.crdt.errors import PendingFullError, StorageError

__all__ = [
    "DEFAULT_MAX_PENDING",
    "DEFAULT_MAX_PENDING_BYTES",
    "ASIDE_ORIGINS",
    "Aside",
    "DamagedRecord",
    "MemoryStorage",
    "PendingRecord",
    "Storage",
    "StorageError",
    "StoredEntry",
    "check_asides",
    "check_bytes",
    "check_ids",
    "check_label",
    "check_limit",
    "check_local_items",
    "check_millis",
    "check_name",
    "check_entry",
    "plain_entry",
    "check_entry_fields",
    "check_pending",
    "freeze_payloads",
    "pending_full_error",
]

DEFAULT_MAX_PENDING = 10_000
DEFAULT_MAX_PENDING_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class StoredEntry:
    """One entry as stored: id, the exact signed header bytes, and its payloads."""

    id: str  # "sha256:<hex>" of ``header``
    header: bytes  # the exact signed header bytes, never re-encoded
    payloads: Mapping[str, bytes | None]  # store name -> update bytes; None = erased

    @property
    def size(self) -> int:
        """Bytes this entry occupies for the pending bound: header plus payloads."""
        return len(self.header) + sum(len(p) for p in self.payloads.values() if p is not None)


@dataclass(frozen=True, slots=True)
class PendingRecord:
    """What is kept in memory about a pending entry: never its header or payload bytes."""

    id: str
    author: str  # the entry's author, as the caller labelled it (a key string)
    source: str  # who delivered it, as the caller labelled it ("peer:<key>", "local", "" ...)
    received_ms: int  # when it was put, caller's clock in ms (>= 0)
    size: int  # StoredEntry.size of the stored copy
    missing: tuple[str, ...]  # parent ids it waits for (may be empty: it waits for payloads only)


ASIDE_ORIGINS = ("log", "pending")


@dataclass(frozen=True, slots=True)
class Aside:
    """One entry for ``move_aside``: where it is now, and why it goes to the damaged area."""

    entry_id: str
    reason: str  # a stable code: the check's (entry.id, entry.payload, ..., entry.orphaned: docs/architecture.md)
    detail: str = ""  # the sentence for people
    origin: str = "log"  # "log" or "pending": where the entry is now
    # Log only: the entry stays in the log with just these payloads made None (their bytes fail
    # the header's digests, the header is intact); a copy as found is kept aside.
    stores: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DamagedRecord:
    """What the damaged area keeps beside an entry's bytes (as ``pending`` does for pending)."""

    id: str  # the id it was stored under
    origin: str  # "log" or "pending": where it was found
    reason: str
    detail: str
    moved_ms: int  # when it was moved aside, caller's clock in ms
    size: int  # StoredEntry.size of the copy kept
    stores: tuple[str, ...] = ()  # the payloads made None in the log; () when the whole entry moved


# --------------------------------------------------------------------------- validation
# Shared by every adapter so that they accept and refuse exactly the same input.


def check_label(value: object, what: str) -> str:
    """Text that may be empty: a str without NUL characters, encodable as UTF-8."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise ValueError(f"{what} must not contain NUL characters: {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid Unicode text: {value!r}") from None
    return value


def check_name(value: object, what: str) -> str:
    name = check_label(value, what)
    if not name:
        raise ValueError(f"{what} must not be empty")
    return name


def check_bytes(value: object, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes, not {type(value).__name__}")


def check_ids(ids: object, what: str) -> tuple[str, ...]:
    """A sequence of names (a bare str is refused: it would be read as characters)."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"{what} must be a sequence of str, not {type(ids).__name__}")
    return tuple(check_name(i, what) for i in ids)


def check_entry(entry: object) -> StoredEntry:
    """Validate one entry and return a normalised, immutable copy.

    The copy holds ``bytes`` (not bytearray/memoryview) and a read-only payload mapping
    ordered by store name, so that what an adapter returns never aliases caller data.
    """
    if plain_entry(entry):
        # What the pipeline stores: every check below holds, decided without naming each field.
        return StoredEntry(entry.id, entry.header, freeze_payloads(entry.payloads))
    return check_entry_fields(entry)


def plain_entry(entry: object) -> TypeGuard[StoredEntry]:
    """Does ``entry`` pass :func:`check_entry` as it is (what the pipeline stores)? An adapter
    that only reads the entry while it writes it may then skip the copy."""
    return (type(entry) is StoredEntry and _plain_name(entry.id) and type(entry.header) is bytes
            and type(entry.payloads) in _PLAIN_MAPPINGS and _plain_payloads(entry.payloads))


def check_entry_fields(entry: object) -> StoredEntry:
    """:func:`check_entry` deciding field by field (what its shortcut must agree with)."""
    if not isinstance(entry, StoredEntry):
        raise TypeError(f"expected a StoredEntry, not {type(entry).__name__}")
    entry_id = check_name(entry.id, "entry id")
    header = check_bytes(entry.header, f"header of {entry_id}")
    if not isinstance(entry.payloads, Mapping):
        raise TypeError(f"payloads of {entry_id} must be a mapping, not {type(entry.payloads).__name__}")
    payloads: dict[str, bytes | None] = {}
    for store, data in entry.payloads.items():
        check_name(store, f"store name in {entry_id}")
        payloads[store] = None if data is None else check_bytes(data, f"payload {store!r} of {entry_id}")
    return StoredEntry(entry_id, header, freeze_payloads(payloads))


_PLAIN_MAPPINGS = (dict, MappingProxyType)


def _plain_name(value: object) -> bool:
    """A name ``check_name`` takes as it is: a non-empty ASCII str without NUL."""
    return type(value) is str and value.isascii() and bool(value) and "\x00" not in value


def _plain_payloads(payloads: Mapping[str, bytes | None]) -> bool:
    for store, data in payloads.items():
        if not _plain_name(store) or (data is not None and type(data) is not bytes):
            return False
    return True


def freeze_payloads(payloads: Mapping[str, bytes | None]) -> Mapping[str, bytes | None]:
    return MappingProxyType(dict(sorted(payloads.items())))


def pending_full_error(db_id: str, count: int, nbytes: int, max_pending: int, max_bytes: int) -> StorageError:
    # Its own type: ingestion reports this bound as a refusal of the entry, any other
    # StorageError (a full disk) as a failure of this node.
    return PendingFullError(
        f"pending area full for database {db_id}: it would hold {count} entries / {nbytes} bytes "
        f"waiting for parents or payloads (limits: {max_pending} entries, {max_bytes} bytes); "
        "drop pending entries or fetch their parents first"
    )


def check_limit(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{what} must be >= 0, got {value}")
    return value


_MAX_MILLIS = 2**63 - 1  # SQLite's INTEGER: a larger time would be stored by one adapter only


def check_millis(value: object, what: str) -> int:
    millis = check_limit(value, what)
    if millis > _MAX_MILLIS:
        raise ValueError(f"{what} must be <= {_MAX_MILLIS}, got {millis}")
    return millis


def check_pending(
    entry: object, missing: object, author: object, source: object, received_ms: object
) -> tuple[StoredEntry, PendingRecord]:
    """Validate a put_pending call: the normalised entry and the record to keep beside it."""
    stored = check_entry(entry)
    missing_t = check_ids(missing, "missing parent id")
    author_s = check_label(author, "author")
    source_s = check_label(source, "source")
    received = check_millis(received_ms, "received_ms")
    return stored, PendingRecord(stored.id, author_s, source_s, received, stored.size, missing_t)


def check_asides(moves: object, moved_ms: object) -> tuple[list[Aside], int]:
    """Validate a move_aside call before anything is moved."""
    if isinstance(moves, (str, bytes, Mapping)) or not isinstance(moves, Iterable):
        raise TypeError(f"moves must be a sequence of Aside, not {type(moves).__name__}")
    out: list[Aside] = []
    seen: set[str] = set()
    for move in moves:
        if not isinstance(move, Aside):
            raise TypeError(f"expected an Aside, not {type(move).__name__}")
        entry_id = check_name(move.entry_id, "entry id")
        if entry_id in seen:
            raise ValueError(f"entry {entry_id} is named twice in one move_aside")
        seen.add(entry_id)
        if move.origin not in ASIDE_ORIGINS:
            raise ValueError(f"origin must be one of {ASIDE_ORIGINS}, got {move.origin!r}")
        stores = check_ids(move.stores, "store name")
        if stores and move.origin != "log":
            raise ValueError(f"only an entry of the log keeps its place with some payloads made None ({entry_id})")
        out.append(Aside(entry_id, check_name(move.reason, "reason"), check_label(move.detail, "detail"),
                         move.origin, tuple(sorted(set(stores)))))
    return out, check_millis(moved_ms, "moved_ms")


def check_local_items(items: object) -> list[tuple[str, bytes]]:
    """Validate every (key, value) pair of a put_local_many batch before anything is written."""
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise TypeError(f"items must be an iterable of (key, value) pairs, not {type(items).__name__}")
    out: list[tuple[str, bytes]] = []
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError(f"each item must be a (key, value) tuple, not {item!r:.60}")
        out.append((check_name(item[0], "key"), check_bytes(item[1], "value")))
    return out


# --------------------------------------------------------------------------- interface


class Storage(ABC):
    """One node's durable state. All methods are synchronous and thread-safe enough for one
    writer (calls are serialised). See the module docstring for the exact semantics."""

    max_pending: int
    max_pending_bytes: int

    # --- the signed log, per database ---
    @abstractmethod
    def add_database(self, db_id: str) -> None:
        """Register a database; idempotent."""

    @abstractmethod
    def databases(self) -> list[str]:
        """Database ids in creation order."""

    def has_database(self, db_id: str) -> bool:
        """Whether ``db_id`` is registered (an adapter may answer without listing them all:
        a node opens each of its thousand banks by id)."""
        return db_id in self.databases()

    @abstractmethod
    def append(
        self, db_id: str, entries: Iterable[StoredEntry], *, drop_pending: Sequence[str] = ()
    ) -> int:
        """Store ``entries`` and remove the pending entries ``drop_pending`` in ONE atomic
        transaction. Entries already present (same id) are skipped. Returns how many entries
        were new. Durable when it returns."""

    @abstractmethod
    def entries(self, db_id: str, *, stores: Collection[str] | None = None) -> Iterator[StoredEntry]:
        """Entries in append order (the order they were first stored).

        ``stores``: read only these payloads (every entry is still yielded, its payload
        mapping holding just the named stores it has), so a caller rebuilding one store does
        not read every other store's bytes.
        """

    @abstractmethod
    def get(self, db_id: str, entry_id: str) -> StoredEntry | None: ...

    def get_many(self, db_id: str, entry_ids: Sequence[str]) -> list[StoredEntry | None]:
        """``get`` of each id, in order (None where not stored); an adapter reads them at
        once where it can (a page of entries served to a peer is read this way)."""
        return [self.get(db_id, entry_id) for entry_id in check_ids(entry_ids, "entry_ids")]

    @abstractmethod
    def has(self, db_id: str, entry_id: str) -> bool: ...

    @abstractmethod
    def count(self, db_id: str) -> int: ...

    @abstractmethod
    def erase_payload(self, db_id: str, entry_id: str, store: str) -> None:
        """Erase one payload: it becomes None, the header stays. Idempotent; raises
        StorageError if the entry or the store is unknown."""

    @abstractmethod
    def fill_payload(self, db_id: str, entry_id: str, store: str, data: bytes) -> None:
        """Give ``data`` to a payload that is None (erased or never received); a present
        payload is left unchanged. Raises StorageError if the entry or the store is unknown.
        The caller has checked ``data`` against the signed digest. Durable when it returns."""

    # --- entries waiting (for parents or payloads), bounded ---
    @abstractmethod
    def put_pending(
        self,
        db_id: str,
        entry: StoredEntry,
        missing: Sequence[str],
        *,
        author: str = "",
        source: str = "",
        received_ms: int = 0,
    ) -> None:
        """Store (or replace, keeping its place) a pending entry with its record: the parent
        ids it waits for (may be empty), its author and source labels and when it was put.
        Raises StorageError("pending area full ...") if the database would then hold more
        than ``max_pending`` entries or ``max_pending_bytes`` bytes (StoredEntry.size)."""

    @abstractmethod
    def pending(self, db_id: str) -> list[PendingRecord]:
        """The records of the pending entries (no header or payload bytes), in the order
        first put."""

    @abstractmethod
    def get_pending(self, db_id: str, entry_id: str) -> StoredEntry | None:
        """The full stored copy of a pending entry (header and payloads), or None."""

    @abstractmethod
    def drop_pending(self, db_id: str, entry_ids: Sequence[str]) -> None:
        """Remove pending entries; unknown ids are ignored."""

    # --- the damaged area: kept for inspection, never applied or served ---
    @abstractmethod
    def move_aside(self, db_id: str, moves: Sequence[Aside], *, moved_ms: int = 0) -> None:
        """Move entries to the damaged area in ONE atomic transaction (see the module
        docstring): each leaves the log or the pending area, or with ``Aside.stores`` stays in
        the log with those payloads made None, a copy kept aside. Raises StorageError, changing
        nothing, if an entry is not where its Aside says."""

    @abstractmethod
    def damaged(self, db_id: str) -> list[DamagedRecord]:
        """The records of the damaged area (no bytes), in the order first moved aside."""

    @abstractmethod
    def get_damaged(self, db_id: str, entry_id: str) -> StoredEntry | None:
        """The copy kept aside, exactly as it was found, or None."""

    @abstractmethod
    def drop_damaged(self, db_id: str, entry_ids: Sequence[str]) -> None:
        """Remove entries from the damaged area; unknown ids are ignored."""

    # --- peer-local data (never synced) ---
    @abstractmethod
    def get_local(self, ns: str, key: str) -> bytes | None: ...

    @abstractmethod
    def put_local(self, ns: str, key: str, value: bytes) -> None: ...

    @abstractmethod
    def put_local_many(self, ns: str, items: Iterable[tuple[str, bytes]]) -> None:
        """Put several records in ONE atomic transaction: all of them or, if any item is
        invalid, none. A key given twice takes its last value."""

    @abstractmethod
    def delete_local(self, ns: str, key: str) -> bool:
        """Delete a record; True if it existed."""

    @abstractmethod
    def items_local(self, ns: str) -> list[tuple[str, bytes]]:
        """All records of a namespace, sorted by key."""

    @abstractmethod
    def close(self) -> None:
        """Release resources; idempotent. Any later call raises StorageError."""

    def __enter__(self) -> Storage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- reference


class _Db:
    __slots__ = ("log", "order", "pending", "pending_bytes", "aside")

    def __init__(self) -> None:
        self.log: dict[str, StoredEntry] = {}
        # Append order. Only move_aside removes from it (a repair, with no reader iterating).
        self.order: list[str] = []
        self.pending: dict[str, tuple[StoredEntry, PendingRecord]] = {}  # insertion = order
        self.pending_bytes = 0  # sum of PendingRecord.size over ``pending``
        self.aside: dict[str, tuple[StoredEntry, DamagedRecord]] = {}  # insertion = order

    def unpend(self, entry_id: str) -> None:
        item = self.pending.pop(entry_id, None)
        if item is not None:
            self.pending_bytes -= item[1].size


class MemoryStorage(Storage):
    """The reference adapter: plain dicts, nothing survives the process."""

    def __init__(
        self, *, max_pending: int = DEFAULT_MAX_PENDING, max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES
    ) -> None:
        self.max_pending = check_limit(max_pending, "max_pending")
        self.max_pending_bytes = check_limit(max_pending_bytes, "max_pending_bytes")
        self._dbs: dict[str, _Db] = {}
        self._local: dict[str, dict[str, bytes]] = {}
        self._lock = threading.RLock()
        self._closed = False

    def _open(self) -> None:
        if self._closed:
            raise StorageError("storage is closed")

    def _db(self, db_id: str) -> _Db:
        self._open()
        check_name(db_id, "database id")
        try:
            return self._dbs[db_id]
        except KeyError:
            raise StorageError(f"unknown database {db_id}") from None

    # --- log
    def add_database(self, db_id: str) -> None:
        with self._lock:
            self._open()
            check_name(db_id, "database id")
            self._dbs.setdefault(db_id, _Db())

    def databases(self) -> list[str]:
        with self._lock:
            self._open()
            return list(self._dbs)

    def append(
        self, db_id: str, entries: Iterable[StoredEntry], *, drop_pending: Sequence[str] = ()
    ) -> int:
        with self._lock:
            db = self._db(db_id)
            # Validate everything first; applying below cannot fail, so the batch is atomic.
            drop = check_ids(drop_pending, "drop_pending")
            new: dict[str, StoredEntry] = {}
            for raw in entries:
                entry = check_entry(raw)
                if entry.id not in db.log and entry.id not in new:
                    new[entry.id] = entry
            db.log.update(new)
            db.order.extend(new)
            for entry_id in drop:
                db.unpend(entry_id)
            return len(new)

    def entries(self, db_id: str, *, stores: Collection[str] | None = None) -> Iterator[StoredEntry]:
        with self._lock:
            db = self._db(db_id)
            wanted = None if stores is None else frozenset(check_ids(stores, "stores"))
        return self._iter_entries(db, wanted)

    def _iter_entries(self, db: _Db, wanted: frozenset[str] | None = None) -> Iterator[StoredEntry]:
        position = 0
        while True:
            with self._lock:
                self._open()
                page = [db.log[i] for i in db.order[position : position + 512]]
            if not page:
                return
            position += len(page)
            if wanted is None:
                yield from page
            else:
                for e in page:
                    yield StoredEntry(e.id, e.header, freeze_payloads(
                        {k: v for k, v in e.payloads.items() if k in wanted}))

    def get(self, db_id: str, entry_id: str) -> StoredEntry | None:
        with self._lock:
            db = self._db(db_id)
            return db.log.get(check_name(entry_id, "entry id"))

    def has(self, db_id: str, entry_id: str) -> bool:
        with self._lock:
            db = self._db(db_id)
            return check_name(entry_id, "entry id") in db.log

    def count(self, db_id: str) -> int:
        with self._lock:
            return len(self._db(db_id).log)

    def erase_payload(self, db_id: str, entry_id: str, store: str) -> None:
        with self._lock:
            db = self._db(db_id)
            check_name(entry_id, "entry id")
            check_name(store, "store name")
            entry = db.log.get(entry_id)
            if entry is None:
                raise StorageError(f"cannot erase: unknown entry {entry_id} in database {db_id}")
            if store not in entry.payloads:
                raise StorageError(f"cannot erase: entry {entry_id} has no payload for store {store!r}")
            payloads = dict(entry.payloads)
            payloads[store] = None
            db.log[entry_id] = StoredEntry(entry.id, entry.header, freeze_payloads(payloads))

    def fill_payload(self, db_id: str, entry_id: str, store: str, data: bytes) -> None:
        with self._lock:
            db = self._db(db_id)
            check_name(entry_id, "entry id")
            check_name(store, "store name")
            value = check_bytes(data, "payload")
            entry = db.log.get(entry_id)
            if entry is None:
                raise StorageError(f"cannot fill: unknown entry {entry_id} in database {db_id}")
            if store not in entry.payloads:
                raise StorageError(f"cannot fill: entry {entry_id} has no payload for store {store!r}")
            if entry.payloads[store] is None:  # a present payload is never overwritten
                payloads = dict(entry.payloads)
                payloads[store] = value
                db.log[entry_id] = StoredEntry(entry.id, entry.header, freeze_payloads(payloads))

    # --- pending
    def put_pending(
        self,
        db_id: str,
        entry: StoredEntry,
        missing: Sequence[str],
        *,
        author: str = "",
        source: str = "",
        received_ms: int = 0,
    ) -> None:
        with self._lock:
            db = self._db(db_id)
            stored, record = check_pending(entry, missing, author, source, received_ms)
            old = db.pending.get(stored.id)
            count = len(db.pending) + (old is None)
            nbytes = db.pending_bytes + record.size - (old[1].size if old else 0)
            if count > self.max_pending or nbytes > self.max_pending_bytes:
                raise pending_full_error(db_id, count, nbytes, self.max_pending, self.max_pending_bytes)
            db.pending[stored.id] = (stored, record)  # an existing key keeps its position
            db.pending_bytes = nbytes

    def pending(self, db_id: str) -> list[PendingRecord]:
        with self._lock:
            return [record for _, record in self._db(db_id).pending.values()]

    def get_pending(self, db_id: str, entry_id: str) -> StoredEntry | None:
        with self._lock:
            db = self._db(db_id)
            item = db.pending.get(check_name(entry_id, "entry id"))
            return None if item is None else item[0]

    def drop_pending(self, db_id: str, entry_ids: Sequence[str]) -> None:
        with self._lock:
            db = self._db(db_id)
            for entry_id in check_ids(entry_ids, "pending entry id"):
                db.unpend(entry_id)

    # --- damaged area
    def move_aside(self, db_id: str, moves: Sequence[Aside], *, moved_ms: int = 0) -> None:
        with self._lock:
            db = self._db(db_id)
            checked, when = check_asides(moves, moved_ms)
            # Find every entry first: a missing one fails the call before anything moves.
            found: list[tuple[Aside, StoredEntry]] = []
            for move in checked:
                if move.origin == "log":
                    entry = db.log.get(move.entry_id)
                else:
                    item = db.pending.get(move.entry_id)
                    entry = None if item is None else item[0]
                if entry is None:
                    raise StorageError(f"cannot move aside: no entry {move.entry_id} in the {move.origin} "
                                       f"of database {db_id}")
                found.append((move, entry))
            removed: set[str] = set()
            for move, entry in found:
                if move.origin == "pending":
                    db.unpend(entry.id)
                elif move.stores:
                    payloads = dict(entry.payloads)
                    payloads.update(dict.fromkeys(move.stores))
                    db.log[entry.id] = StoredEntry(entry.id, entry.header, freeze_payloads(payloads))
                else:
                    del db.log[entry.id]
                    removed.add(entry.id)
                record = DamagedRecord(entry.id, move.origin, move.reason, move.detail, when, entry.size, move.stores)
                db.aside[entry.id] = (entry, record)  # an id already aside keeps its place
            if removed:
                db.order = [i for i in db.order if i not in removed]

    def damaged(self, db_id: str) -> list[DamagedRecord]:
        with self._lock:
            return [record for _, record in self._db(db_id).aside.values()]

    def get_damaged(self, db_id: str, entry_id: str) -> StoredEntry | None:
        with self._lock:
            db = self._db(db_id)
            item = db.aside.get(check_name(entry_id, "entry id"))
            return None if item is None else item[0]

    def drop_damaged(self, db_id: str, entry_ids: Sequence[str]) -> None:
        with self._lock:
            db = self._db(db_id)
            for entry_id in check_ids(entry_ids, "damaged entry id"):
                db.aside.pop(entry_id, None)

    # --- local
    def get_local(self, ns: str, key: str) -> bytes | None:
        with self._lock:
            self._open()
            check_name(ns, "namespace")
            check_name(key, "key")
            return self._local.get(ns, {}).get(key)

    def put_local(self, ns: str, key: str, value: bytes) -> None:
        with self._lock:
            self._open()
            check_name(ns, "namespace")
            check_name(key, "key")
            self._local.setdefault(ns, {})[key] = check_bytes(value, "value")

    def put_local_many(self, ns: str, items: Iterable[tuple[str, bytes]]) -> None:
        with self._lock:
            self._open()
            check_name(ns, "namespace")
            batch = check_local_items(items)  # all validated before the first write
            if batch:  # no empty namespace left behind (delete_local removes them too)
                self._local.setdefault(ns, {}).update(batch)

    def delete_local(self, ns: str, key: str) -> bool:
        with self._lock:
            self._open()
            check_name(ns, "namespace")
            check_name(key, "key")
            records = self._local.get(ns)
            if records is None or key not in records:
                return False
            del records[key]
            if not records:
                del self._local[ns]
            return True

    def items_local(self, ns: str) -> list[tuple[str, bytes]]:
        with self._lock:
            self._open()
            check_name(ns, "namespace")
            return sorted(self._local.get(ns, {}).items())

    def close(self) -> None:
        with self._lock:
            self._closed = True
