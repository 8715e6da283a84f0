"""SQLite adapter behind crdt's storage interface (see crdt/storage.py for the semantics).

One file holds one node's durable state. Layout (schema version 3):

    databases        (seq, db_id)                        creation order = seq
    entries          (seq, db, id, header)               append order = seq (the rowid)
    payloads         (entry, store, data)                data NULL = erased or not received
    pending          (seq, db, id, header, size,         entries waiting for parents or
                      author, source, received)          payloads; received = put time, ms
    pending_payloads (pending, store, data)
    pending_missing  (pending, position, parent)
    pending_totals   (db, count, bytes)                  kept by triggers, for the bounds
    local            (ns, key, value)                    peer-local records, never synced
    damaged          (seq, db, id, header, size, origin, entries moved aside by `memmesh check
                      reason, detail, moved, stores)      --repair`: kept, never applied or served
    damaged_payloads (damaged, store, data)

The file is marked with ``PRAGMA application_id`` (so another program's SQLite file is told
apart from ours) and ``PRAGMA user_version`` (the schema version; a file written by a newer
memmesh is refused instead of being misread). An older file is migrated in place when it is
opened, in one transaction (see ``MIGRATIONS`` in node/storage_schema.py): version 1 lacked the pending table's
author, source and received columns, version 2 the damaged tables.

Durability: WAL journal, ``synchronous=NORMAL``. A transaction is committed when its WAL frames
have been written to the operating system, which survives the process being killed at any
point (``kill -9``): every acknowledged ``append`` is on disk and the file always opens in a
consistent state. The trade-off: on power loss or an operating-system crash the last few
committed transactions may be rolled back (the file stays consistent, never corrupt), because
NORMAL does not fsync the WAL on every commit. Pass ``synchronous="FULL"`` to fsync every
commit and keep acknowledged writes across power loss as well, at a large cost per append.

Opening (``__init__``, ``_setup``; the judging is node/storage_open.py): every reason a file cannot be opened is one StorageError
line naming it, what is wrong and what to do (a DamagedError for damage: run memmesh check
--repair, or restore a backup), never a traceback, and a refused file is left as it was. The
header is read as bytes first (node/file_check.py: no SQLite magic, a truncated file); the file
is then judged through a read-only connection (closing it never checkpoints): another program's
file, ours with a damaged header, a newer schema version, SQLite reporting corruption or
returning bytes that do not decode. The write-ahead log is refused when its damage would make
SQLite silently drop committed transactions (node/wal_check.py); ``check_wal=False`` opens it
anyway, keeping what SQLite keeps. ``cell_size_check`` is on, so a damaged page fails the read
rather than yielding fewer rows; ``quick_check()`` checks every page (serve runs it as it
starts). docs/architecture.md, "Opening a damaged home", has the reasons and the costs.

Erasure: ``secure_delete`` is on, so overwritten and freed content is zeroed, and after
``erase_payload`` the WAL is checkpointed and truncated, so erased bytes do not linger in the
file or its WAL.
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import urllib.parse
from collections.abc import Collection, Iterable, Iterator, Sequence

from memmesh.crdt.errors import DamagedError, StorageError
from memmesh.crdt.storage import (
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_PENDING_BYTES,
    Storage,
    StoredEntry,
    check_bytes,
    check_entry,
    check_ids,
    check_limit,
    check_name,
    freeze_payloads,
    plain_entry,
)
from memmesh.node import file_check
from memmesh.node.storage_checks import FileChecks
from memmesh.node.storage_damaged import DamagedArea
from memmesh.node.storage_errors import read_error, write_error
from memmesh.node.storage_local import LocalRecords
from memmesh.node.storage_open import DAMAGE, Head, classify, create_private, read_head, run_quick_check
from memmesh.node.storage_pending import PendingArea
from memmesh.node.storage_schema import APPLICATION_ID, MIGRATIONS, SCHEMA, SCHEMA_VERSION, statements

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "SqliteStorage"]

_PAGE = 500  # entries read per query while iterating
_GET_MANY = 500  # ids per query of get_many (SQLite allows 32,766 bound values)
_SLICE_BYTES = 8 << 20  # payload bytes read per query while iterating, about
_MMAP_BYTES = 1 << 31
_SYNCHRONOUS = ("NORMAL", "FULL", "EXTRA")


class SqliteStorage(PendingArea, DamagedArea, FileChecks, LocalRecords, Storage):
    """Durable storage in one SQLite file (WAL mode): the signed log here; the pending area,
    the damaged area, the file's own checks and the peer-local records in their modules."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        synchronous: str = "NORMAL",
        check_wal: bool = True,
    ) -> None:
        """Open (or create) the storage file at ``path``.

        Every reason it cannot be opened is one StorageError line naming the file, what is wrong
        and what to do (a DamagedError for damage), and a refused file is left as it was.
        ``check_wal=False`` opens a file whose write-ahead log is damaged, letting SQLite drop
        what it drops (``memmesh check --repair`` then fetches it again from peers).
        ``quick_check`` checks every page (serve runs it as it starts).
        """
        self.max_pending = check_limit(max_pending, "max_pending")
        self.max_pending_bytes = check_limit(max_pending_bytes, "max_pending_bytes")
        if synchronous not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {_SYNCHRONOUS}, got {synchronous!r}")
        self.path = os.fspath(path)
        self._lock = threading.RLock()
        self._db_keys: dict[str, int] = {}
        self._conn: sqlite3.Connection | None = None
        head = read_head(self.path)  # before SQLite: its errors do not say whose file it is
        if head is None and self.path != ":memory:":
            create_private(self.path)
        try:
            # isolation_level=None: no implicit transactions; we BEGIN/COMMIT explicitly.
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
        except (sqlite3.Error, ValueError) as exc:  # ValueError: a NUL in the path
            raise StorageError(f"cannot open storage file {self.path}: {file_check.clean(exc)}") from exc
        try:
            self._setup(synchronous, head, check_wal)
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    # ----------------------------------------------------------------- opening

    def _setup(self, synchronous: str, head: Head = None, check_wal: bool = True) -> None:
        conn = self._conn
        assert conn is not None
        path = self.path
        if head is None:  # no file yet: nothing to protect, SQLite creates it
            fresh, version = classify(conn, path, head, check_wal)
        else:
            # Judged through a read-only connection: closing it never checkpoints, so a refused
            # file and its log are left exactly as they were (a read-write connection's close
            # would write what SQLite recovered into the file and delete the log).
            uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
            try:
                probe = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=10.0)
            except sqlite3.Error as exc:
                raise file_check.open_error(path, exc) from exc
            try:
                fresh, version = classify(probe, path, head, check_wal)
            finally:
                probe.close()
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() not in ("wal", "memory"):  # "memory" for path ":memory:"
                raise StorageError(
                    f"cannot use write-ahead logging for {path} (journal mode is {mode!r}); "
                    "put the memmesh home on a local file system"
                )
            # See the module docstring for the power-loss trade-off of NORMAL.
            conn.execute(f"PRAGMA synchronous={synchronous}")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA secure_delete=ON")  # erased payloads are zeroed, not left behind
            conn.execute("PRAGMA trusted_schema=OFF")
            # Check each b-tree page's cells as it is read: a damaged page then fails the read
            # instead of yielding fewer rows (cheap; quick_check covers the whole file).
            conn.execute("PRAGMA cell_size_check=ON")
            if fresh:
                with self._transaction() as cur:
                    # Re-check inside the write lock: another process may have created it.
                    if cur.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
                        for statement in statements(SCHEMA):
                            cur.execute(statement)
                        cur.execute(f"PRAGMA application_id={APPLICATION_ID}")
                        cur.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif version < SCHEMA_VERSION:
                try:
                    with self._transaction() as cur:
                        # Re-read inside the write lock: another process may have migrated it.
                        current = cur.execute("PRAGMA user_version").fetchone()[0]
                        if current < SCHEMA_VERSION:
                            for step in range(current, SCHEMA_VERSION):
                                for statement in statements(MIGRATIONS[step]):
                                    cur.execute(statement)
                            cur.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                except StorageError as exc:  # rolled back: the file is still the old version
                    raise StorageError(
                        f"cannot migrate {path} from storage schema version {version} to "
                        f"{SCHEMA_VERSION} (the file is unchanged): {exc}"
                    ) from exc
            for seq, db_id in conn.execute("SELECT seq, db_id FROM databases ORDER BY seq"):
                if not isinstance(seq, int) or not isinstance(db_id, str) or not db_id or "\x00" in db_id:
                    raise file_check.damaged(path, f"its list of databases holds {file_check.clean(repr(db_id), 60)}, "
                                                   "which is not a database id")
                self._db_keys[db_id] = seq
        except DAMAGE as exc:
            raise file_check.open_error(path, exc) from exc

    def quick_check(self) -> None:
        """SQLite's ``PRAGMA quick_check``: every page and b-tree of the file is well formed (it
        does not compare indexes with their tables, nor read what rows hold: the entries' own
        hashes check that). Raises DamagedError naming the first problem. It reads the whole
        file (about 110 ms at 100k entries, 74 MB), so serve runs it as it starts; every open
        checks the tables other than the log's (see ``classify`` in node/storage_open.py)."""
        with self._lock:
            self._unmap()
            run_quick_check(self._connection(), self.path)

    # ----------------------------------------------------------------- the signed log

    def add_database(self, db_id: str) -> None:
        with self._lock:
            self._connection()
            check_name(db_id, "database id")
            if db_id in self._db_keys:
                return
            with self._transaction() as cur:
                cur.execute("INSERT INTO databases (db_id) VALUES (?) ON CONFLICT (db_id) DO NOTHING", (db_id,))
                seq = cur.execute("SELECT seq FROM databases WHERE db_id = ?", (db_id,)).fetchone()[0]
                cur.execute(
                    "INSERT INTO pending_totals (db, count, bytes) VALUES (?, 0, 0) ON CONFLICT (db) DO NOTHING",
                    (seq,),
                )
            self._db_keys[db_id] = seq

    def databases(self) -> list[str]:
        with self._reading() as conn:
            return [row[0] for row in conn.execute("SELECT db_id FROM databases ORDER BY seq")]

    def has_database(self, db_id: str) -> bool:
        with self._reading() as conn:
            return conn.execute("SELECT 1 FROM databases WHERE db_id = ?", (db_id,)).fetchone() is not None

    def append(
        self, db_id: str, entries: Iterable[StoredEntry], *, drop_pending: Sequence[str] = ()
    ) -> int:
        with self._lock:
            db = self._db_key(db_id)
            drop = check_ids(drop_pending, "drop_pending")
            with self._transaction() as cur:
                before = cur.execute("SELECT coalesce(max(seq), 0) FROM entries").fetchone()[0]
                batch: list[StoredEntry] = []
                seen: set[str] = set()

                def rows() -> Iterator[tuple[int, str, bytes]]:
                    # Validated as it streams into executemany: a bad entry late in the batch
                    # aborts the transaction after earlier rows were written (rolled back).
                    # Nothing of an entry is kept past this call, so one that passes check_entry
                    # as it is needs no copy.
                    for raw in entries:
                        entry = raw if plain_entry(raw) else check_entry(raw)
                        if entry.id in seen:
                            continue
                        seen.add(entry.id)
                        batch.append(entry)
                        yield (db, entry.id, entry.header)

                cur.executemany(
                    "INSERT INTO entries (db, id, header) VALUES (?, ?, ?) ON CONFLICT (db, id) DO NOTHING",
                    rows(),
                )
                # Only rows inserted by this transaction have seq > before (one range read, not a
                # lookup per payload); entries that were already stored keep their payloads (an
                # erased payload is never resurrected).
                inserted = dict(cur.execute("SELECT id, seq FROM entries WHERE seq > ?", (before,)).fetchall())
                cur.executemany(
                    "INSERT INTO payloads (entry, store, data) VALUES (?, ?, ?)",
                    (
                        (inserted[entry.id], store, data)
                        for entry in batch if entry.id in inserted
                        for store, data in (sorted(entry.payloads.items()) if len(entry.payloads) > 1
                                            else entry.payloads.items())
                    ),
                )
                new = len(inserted)
                if drop:
                    cur.executemany(
                        "DELETE FROM pending WHERE db = ? AND id = ?", ((db, entry_id) for entry_id in drop)
                    )
            return new

    def entries(self, db_id: str, *, stores: Collection[str] | None = None) -> Iterator[StoredEntry]:
        with self._lock:
            db = self._db_key(db_id)
            wanted = None if stores is None else tuple(sorted(set(check_ids(stores, "stores"))))
        return self._iter_entries(db, wanted)

    def _iter_entries(self, db: int, stores: tuple[str, ...] | None = None) -> Iterator[StoredEntry]:
        last = 0
        while True:
            with self._reading() as conn:
                rows = conn.execute(
                    "SELECT seq, id, header FROM entries WHERE db = ? AND seq > ? ORDER BY seq LIMIT ?",
                    (db, last, _PAGE),
                ).fetchall()
            if not rows:
                return
            last = rows[-1][0]
            # Payloads in slices of about _SLICE_BYTES, so that a reader hashing one slice
            # while the next is read (crdt/prefetch.py) overlaps the two, and a page of large
            # entries is not held in memory at once. They are read through a memory map (SQLite
            # caps it at 2 GB): opening a database hashes every stored payload, and reading them
            # page by page through read() calls costs more than hashing them. Only while a page
            # of the log is read: SQLite reports some damaged pages differently when mapped
            # (quick_check raises instead of listing them), and quick_check turns it off.
            try:
                start, step = 0, 8
                while start < len(rows):
                    part = rows[start:start + step]
                    with self._reading() as conn:
                        conn.execute(f"PRAGMA mmap_size={_MMAP_BYTES}").fetchall()  # no-op when on
                        payloads = self._payloads(conn, "payloads", "entry", [r[0] for r in part], stores)
                    size = sum(len(d) for p in payloads.values() for d in p.values() if d is not None)
                    for seq, entry_id, header in part:
                        yield StoredEntry(entry_id, header, freeze_payloads(payloads[seq]))
                    start += len(part)
                    step = max(1, min(_PAGE, step * _SLICE_BYTES // max(size, 1)))
            finally:
                self._unmap()

    def _unmap(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("PRAGMA mmap_size=0").fetchall()

    def get(self, db_id: str, entry_id: str) -> StoredEntry | None:
        with self._reading() as conn:
            db = self._db_key(db_id)
            check_name(entry_id, "entry id")
            row = conn.execute("SELECT seq, header FROM entries WHERE db = ? AND id = ?", (db, entry_id)).fetchone()
            if row is None:
                return None
            payloads = self._payloads(conn, "payloads", "entry", [row[0]])[row[0]]
            return StoredEntry(entry_id, row[1], freeze_payloads(payloads))

    def get_many(self, db_id: str, entry_ids: Sequence[str]) -> list[StoredEntry | None]:
        """Two queries per slice of ids (headers, then their payloads), not two per entry."""
        ids = check_ids(entry_ids, "entry_ids")
        out: list[StoredEntry | None] = []
        with self._reading() as conn:
            db = self._db_key(db_id)
            for start in range(0, len(ids), _GET_MANY):
                part = ids[start:start + _GET_MANY]
                marks = ",".join("?" * len(part))
                found = {row[1]: (row[0], row[2]) for row in conn.execute(
                    f"SELECT seq, id, header FROM entries WHERE db = ? AND id IN ({marks})", [db, *part])}
                payloads = self._payloads(conn, "payloads", "entry", [seq for seq, _h in found.values()])
                for entry_id in part:
                    hit = found.get(entry_id)
                    out.append(None if hit is None else
                               StoredEntry(entry_id, hit[1], freeze_payloads(payloads[hit[0]])))
        return out

    def has(self, db_id: str, entry_id: str) -> bool:
        with self._reading() as conn:
            db = self._db_key(db_id)
            check_name(entry_id, "entry id")
            return conn.execute("SELECT 1 FROM entries WHERE db = ? AND id = ?", (db, entry_id)).fetchone() is not None

    def count(self, db_id: str) -> int:
        with self._reading() as conn:
            db = self._db_key(db_id)
            return conn.execute("SELECT count(*) FROM entries WHERE db = ?", (db,)).fetchone()[0]

    def erase_payload(self, db_id: str, entry_id: str, store: str) -> None:
        with self._lock:
            db = self._db_key(db_id)
            check_name(entry_id, "entry id")
            check_name(store, "store name")
            with self._transaction() as cur:
                row = cur.execute("SELECT seq FROM entries WHERE db = ? AND id = ?", (db, entry_id)).fetchone()
                if row is None:
                    raise StorageError(f"cannot erase: unknown entry {entry_id} in database {db_id}")
                cur.execute("UPDATE payloads SET data = NULL WHERE entry = ? AND store = ?", (row[0], store))
                if cur.rowcount == 0:
                    raise StorageError(f"cannot erase: entry {entry_id} has no payload for store {store!r}")
            # Push the zeroed pages into the main file and empty the WAL, so the erased bytes
            # are not left in an old WAL frame. Best effort: a concurrent reader in another
            # process can keep the WAL alive until its next checkpoint.
            with contextlib.suppress(sqlite3.Error):
                self._connection().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def fill_payload(self, db_id: str, entry_id: str, store: str, data: bytes) -> None:
        with self._lock:
            db = self._db_key(db_id)
            check_name(entry_id, "entry id")
            check_name(store, "store name")
            value = check_bytes(data, "payload")
            with self._transaction() as cur:
                row = cur.execute("SELECT seq FROM entries WHERE db = ? AND id = ?", (db, entry_id)).fetchone()
                if row is None:
                    raise StorageError(f"cannot fill: unknown entry {entry_id} in database {db_id}")
                seq = row[0]
                # "AND data IS NULL": a present payload is never overwritten.
                cur.execute(
                    "UPDATE payloads SET data = ? WHERE entry = ? AND store = ? AND data IS NULL", (value, seq, store)
                )
                if cur.rowcount == 0 and cur.execute(
                    "SELECT 1 FROM payloads WHERE entry = ? AND store = ?", (seq, store)
                ).fetchone() is None:
                    raise StorageError(f"cannot fill: entry {entry_id} has no payload for store {store!r}")

    # ----------------------------------------------------------------- a snapshot, for `memmesh check`

    @classmethod
    def open_snapshot(cls, path: str | os.PathLike[str]) -> SqliteStorage:
        """A read-only view of the file as it is now, held until ``close``: one read transaction
        on a connection of its own, so a check sees one consistent state while serve goes on
        writing through its own connection (WAL readers never block the writer). Nothing is
        created or migrated; every write raises StorageError."""
        self = cls.__new__(cls)
        self.max_pending, self.max_pending_bytes = DEFAULT_MAX_PENDING, DEFAULT_MAX_PENDING_BYTES
        self.path = os.fspath(path)
        self._lock = threading.RLock()
        self._db_keys = {}
        uri = "file:" + urllib.parse.quote(os.path.abspath(self.path)) + "?mode=ro"
        try:
            self._conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=10.0)
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open storage file {self.path} to read it: {exc}") from exc
        try:
            self._conn.execute("PRAGMA query_only=ON")
            self._conn.execute("BEGIN")  # deferred: the snapshot is taken by the first read below
            for seq, db_id in self._conn.execute("SELECT seq, db_id FROM databases ORDER BY seq"):
                self._db_keys[db_id] = seq
        except sqlite3.Error as exc:
            self._conn.close()
            self._conn = None
            raise read_error(exc, self.path) from exc
        except ValueError as exc:  # text that is not UTF-8 any more: damaged bytes
            self._conn.close()
            self._conn = None
            raise DamagedError(f"{self.path} is damaged: its list of databases cannot be read ({exc}); run "
                               "memmesh check --repair, or restore a backup") from exc
        return self

    # ----------------------------------------------------------------- the whole file

    def backup_to(self, path: str | os.PathLike[str]) -> None:
        """A consistent copy of the whole file at ``path`` (SQLite's online backup: other
        writers wait on the lock for its few milliseconds per page batch, nothing is torn)."""
        with self._lock:
            if self._conn is None:
                raise StorageError(f"{self.path} is closed")
            try:
                dest = sqlite3.connect(os.fspath(path))
                try:
                    self._conn.backup(dest)
                finally:
                    dest.close()
            except sqlite3.Error as exc:
                name = getattr(exc, "sqlite_errorname", None) or ""
                if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_IOERR_READ", "SQLITE_IOERR_SHORT_READ")):
                    raise read_error(exc, self.path) from exc  # reading this file failed
                # Else the destination's fault (a full disk): the home itself is only read.
                raise write_error(exc, os.fspath(path), "the backup was not written") from exc

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                try:
                    conn.close()
                except sqlite3.Error as exc:
                    raise StorageError(f"closing {self.path} failed: {exc}") from exc

    def __repr__(self) -> str:
        return f"SqliteStorage({self.path!r})"
