"""SQLite adapter behind crdt's storage interface (see crdt/storage.py for the semantics).

One file holds one node's durable state. Layout (schema version 2):

    databases        (seq, db_id)                        creation order = seq
    entries          (seq, db, id, header)               append order = seq (the rowid)
    payloads         (entry, store, data)                data NULL = erased or not received
    pending          (seq, db, id, header, size,         entries waiting for parents or
                      author, source, received)          payloads; received = put time, ms
    pending_payloads (pending, store, data)
    pending_missing  (pending, position, parent)
    pending_totals   (db, count, bytes)                  kept by triggers, for the bounds
    local            (ns, key, value)                    peer-local records, never synced

The file is marked with ``PRAGMA application_id`` (so another program's SQLite file is told
apart from ours) and ``PRAGMA user_version`` (the schema version; a file written by a newer
memmesh is refused instead of being misread). An older file is migrated in place when it is
opened, in one transaction (see ``_MIGRATIONS``): version 1 lacked the pending table's
author, source and received columns.

Durability: WAL journal, ``synchronous=NORMAL``. A transaction is committed when its WAL frames
have been written to the operating system, which survives the process being killed at any
point (``kill -9``): every acknowledged ``append`` is on disk and the file always opens in a
consistent state. The trade-off: on power loss or an operating-system crash the last few
committed transactions may be rolled back (the file stays consistent, never corrupt), because
NORMAL does not fsync the WAL on every commit. Pass ``synchronous="FULL"`` to fsync every
commit and keep acknowledged writes across power loss as well, at a large cost per append.

Erasure: ``secure_delete`` is on, so overwritten and freed content is zeroed, and after
``erase_payload`` the WAL is checkpointed and truncated, so erased bytes do not linger in the
file or its WAL.
"""
from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from crdt.errors import StorageError
from crdt.storage import (
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_PENDING_BYTES,
    PendingRecord,
    Storage,
    StoredEntry,
    check_bytes,
    check_entry,
    check_ids,
    check_limit,
    check_local_items,
    check_name,
    check_pending,
    freeze_payloads,
    pending_full_error,
)

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "SqliteStorage"]

APPLICATION_ID = 0x4D4D5348  # "MMSH" in the SQLite header: this file is a memmesh store
SCHEMA_VERSION = 2
_PAGE = 500  # entries read per query while iterating

_SCHEMA = """
CREATE TABLE databases (
    seq    INTEGER PRIMARY KEY,
    db_id  TEXT NOT NULL UNIQUE
);
CREATE TABLE entries (
    seq    INTEGER PRIMARY KEY,          -- the rowid: append order
    db     INTEGER NOT NULL REFERENCES databases(seq),
    id     TEXT NOT NULL,
    header BLOB NOT NULL,                -- exact signed bytes
    UNIQUE (db, id)
);
CREATE TABLE payloads (
    entry  INTEGER NOT NULL REFERENCES entries(seq),
    store  TEXT NOT NULL,
    data   BLOB,                         -- NULL = erased
    PRIMARY KEY (entry, store)
) WITHOUT ROWID;
CREATE TABLE pending (
    seq    INTEGER PRIMARY KEY,
    db     INTEGER NOT NULL REFERENCES databases(seq),
    id     TEXT NOT NULL,
    header BLOB NOT NULL,
    size   INTEGER NOT NULL,             -- StoredEntry.size, for the byte bound
    -- Added by version 2. Last, with the same defaults as the migration, so that a migrated
    -- file and a new one have the same table.
    author   TEXT NOT NULL DEFAULT '',
    source   TEXT NOT NULL DEFAULT '',
    received INTEGER NOT NULL DEFAULT 0, -- ms, the caller's clock
    UNIQUE (db, id)
);
CREATE TABLE pending_payloads (
    pending INTEGER NOT NULL REFERENCES pending(seq) ON DELETE CASCADE,
    store   TEXT NOT NULL,
    data    BLOB,
    PRIMARY KEY (pending, store)
) WITHOUT ROWID;
CREATE TABLE pending_missing (
    pending  INTEGER NOT NULL REFERENCES pending(seq) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    parent   TEXT NOT NULL,
    PRIMARY KEY (pending, position)
) WITHOUT ROWID;
CREATE INDEX pending_missing_parent ON pending_missing (parent);
CREATE TABLE pending_totals (                -- kept by the triggers below: O(1) bound checks
    db    INTEGER PRIMARY KEY REFERENCES databases(seq),
    count INTEGER NOT NULL,
    bytes INTEGER NOT NULL
);
CREATE TRIGGER pending_added AFTER INSERT ON pending BEGIN
    UPDATE pending_totals SET count = count + 1, bytes = bytes + NEW.size WHERE db = NEW.db;
END;
CREATE TRIGGER pending_removed AFTER DELETE ON pending BEGIN
    UPDATE pending_totals SET count = count - 1, bytes = bytes - OLD.size WHERE db = OLD.db;
END;
CREATE TRIGGER pending_resized AFTER UPDATE OF size ON pending BEGIN
    UPDATE pending_totals SET bytes = bytes - OLD.size + NEW.size WHERE db = NEW.db;
END;
CREATE TABLE local (
    ns    TEXT NOT NULL,
    key   TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (ns, key)
) WITHOUT ROWID;
"""

# Statements that bring a file from schema version N to N + 1; run on open, all steps in one
# transaction, so an interrupted migration leaves the old version intact.
_MIGRATIONS = {
    1: """
ALTER TABLE pending ADD COLUMN author TEXT NOT NULL DEFAULT '';
ALTER TABLE pending ADD COLUMN source TEXT NOT NULL DEFAULT '';
ALTER TABLE pending ADD COLUMN received INTEGER NOT NULL DEFAULT 0;
""",
}

_SYNCHRONOUS = ("NORMAL", "FULL", "EXTRA")


def _statements(script: str) -> list[str]:
    """Split a schema script into statements (triggers contain ';' inside BEGIN ... END)."""
    out: list[str] = []
    current = ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            out.append(current.strip())
            current = ""
    assert not current.strip(), "incomplete statement in schema"
    return out


class SqliteStorage(Storage):
    """Durable storage in one SQLite file (WAL mode)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        synchronous: str = "NORMAL",
    ) -> None:
        self.max_pending = check_limit(max_pending, "max_pending")
        self.max_pending_bytes = check_limit(max_pending_bytes, "max_pending_bytes")
        if synchronous not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {_SYNCHRONOUS}, got {synchronous!r}")
        self.path = os.fspath(path)
        self._lock = threading.RLock()
        self._db_keys: dict[str, int] = {}
        try:
            # isolation_level=None: no implicit transactions; we BEGIN/COMMIT explicitly.
            self._conn: sqlite3.Connection | None = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=10.0
            )
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open storage file {self.path}: {exc}") from exc
        try:
            self._setup(synchronous)
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    # ----------------------------------------------------------------- opening

    def _setup(self, synchronous: str) -> None:
        conn = self._conn
        assert conn is not None
        not_ours = (
            f"{self.path} is not a memmesh storage file; "
            "move it away or choose another path (memmesh creates the file itself)"
        )
        try:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        except sqlite3.DatabaseError as exc:  # "file is not a database", unreadable file
            raise StorageError(f"{not_ours} ({exc})") from exc
        if app_id == 0 and version == 0 and tables == 0:
            fresh = True
        elif app_id != APPLICATION_ID:
            raise StorageError(f"{not_ours} (it is an SQLite database of another program)")
        elif version > SCHEMA_VERSION:
            raise StorageError(
                f"{self.path} was written by a newer memmesh (storage schema version {version}; "
                f"this version understands up to {SCHEMA_VERSION}); upgrade memmesh to open it"
            )
        elif version < 1:
            raise StorageError(f"{self.path} has an unknown storage schema version {version}")
        else:
            fresh = False
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() not in ("wal", "memory"):  # "memory" for path ":memory:"
                raise StorageError(
                    f"cannot use write-ahead logging for {self.path} (journal mode is {mode!r}); "
                    "put the memmesh home on a local file system"
                )
            # See the module docstring for the power-loss trade-off of NORMAL.
            conn.execute(f"PRAGMA synchronous={synchronous}")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA secure_delete=ON")  # erased payloads are zeroed, not left behind
            conn.execute("PRAGMA trusted_schema=OFF")
            if fresh:
                with self._transaction() as cur:
                    # Re-check inside the write lock: another process may have created it.
                    if cur.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
                        for statement in _statements(_SCHEMA):
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
                                for statement in _statements(_MIGRATIONS[step]):
                                    cur.execute(statement)
                            cur.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                except StorageError as exc:  # rolled back: the file is still the old version
                    raise StorageError(
                        f"cannot migrate {self.path} from storage schema version {version} to "
                        f"{SCHEMA_VERSION} (the file is unchanged): {exc}"
                    ) from exc
            for seq, db_id in conn.execute("SELECT seq, db_id FROM databases ORDER BY seq"):
                self._db_keys[db_id] = seq
        except sqlite3.DatabaseError as exc:
            raise StorageError(f"cannot open storage file {self.path}: {exc}") from exc

    # ----------------------------------------------------------------- helpers

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StorageError("storage is closed")
        return self._conn

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Cursor]:
        """One write transaction; committed on success, rolled back on any exception.
        sqlite errors surface as StorageError. Caller holds ``self._lock``."""
        conn = self._connection()
        cur = conn.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StorageError(f"storage write failed: {exc}") from exc
        try:
            yield cur
            cur.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            if isinstance(exc, sqlite3.Error):
                raise StorageError(f"storage write failed: {exc}") from exc
            raise
        finally:
            cur.close()

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connection()
            try:
                yield conn
            except sqlite3.Error as exc:
                raise StorageError(f"storage read failed: {exc}") from exc

    def _db_key(self, db_id: str) -> int:
        conn = self._connection()
        check_name(db_id, "database id")
        key = self._db_keys.get(db_id)
        if key is None:  # maybe added through another handle on the same file
            try:
                row = conn.execute("SELECT seq FROM databases WHERE db_id = ?", (db_id,)).fetchone()
            except sqlite3.Error as exc:
                raise StorageError(f"storage read failed: {exc}") from exc
            if row is None:
                raise StorageError(f"unknown database {db_id}")
            key = self._db_keys[db_id] = row[0]
        return key

    @staticmethod
    def _payloads(conn: sqlite3.Connection, table: str, column: str, keys: list[int],
                  stores: tuple[str, ...] | None = None) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {k: {} for k in keys}
        if not keys or stores == ():
            return out
        marks = ",".join("?" * len(keys))
        only = "" if stores is None else f" AND store IN ({','.join('?' * len(stores))})"
        rows = conn.execute(
            f"SELECT {column}, store, data FROM {table} WHERE {column} IN ({marks}){only} ORDER BY {column}, store",
            keys + list(stores or ()),
        )
        for key, store, data in rows:
            out[key][store] = data
        return out

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
                    for raw in entries:
                        entry = check_entry(raw)
                        if entry.id in seen:
                            continue
                        seen.add(entry.id)
                        batch.append(entry)
                        yield (db, entry.id, entry.header)

                cur.executemany(
                    "INSERT INTO entries (db, id, header) VALUES (?, ?, ?) ON CONFLICT (db, id) DO NOTHING",
                    rows(),
                )
                # Only rows inserted by this transaction have seq > before; entries that were
                # already stored keep their payloads (an erased payload is never resurrected).
                cur.executemany(
                    "INSERT INTO payloads (entry, store, data) "
                    "SELECT seq, ?, ? FROM entries WHERE db = ? AND id = ? AND seq > ?",
                    (
                        (store, data, db, entry.id, before)
                        for entry in batch
                        for store, data in entry.payloads.items()
                    ),
                )
                new = cur.execute("SELECT count(*) FROM entries WHERE seq > ?", (before,)).fetchone()[0]
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
                payloads = self._payloads(conn, "payloads", "entry", [r[0] for r in rows], stores)
            if not rows:
                return
            last = rows[-1][0]
            for seq, entry_id, header in rows:
                yield StoredEntry(entry_id, header, freeze_payloads(payloads[seq]))

    def get(self, db_id: str, entry_id: str) -> StoredEntry | None:
        with self._reading() as conn:
            db = self._db_key(db_id)
            check_name(entry_id, "entry id")
            row = conn.execute("SELECT seq, header FROM entries WHERE db = ? AND id = ?", (db, entry_id)).fetchone()
            if row is None:
                return None
            payloads = self._payloads(conn, "payloads", "entry", [row[0]])[row[0]]
            return StoredEntry(entry_id, row[1], freeze_payloads(payloads))

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
            try:
                self._connection().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except sqlite3.Error:
                pass

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

    # ----------------------------------------------------------------- pending

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
            db = self._db_key(db_id)
            entry, record = check_pending(entry, missing, author, source, received_ms)
            size = record.size
            fields = (record.author, record.source, record.received_ms)
            with self._transaction() as cur:
                count, total = cur.execute(
                    "SELECT count, bytes FROM pending_totals WHERE db = ?", (db,)
                ).fetchone()
                old = cur.execute("SELECT seq, size FROM pending WHERE db = ? AND id = ?", (db, entry.id)).fetchone()
                count += old is None
                total += size - (old[1] if old else 0)
                if count > self.max_pending or total > self.max_pending_bytes:
                    raise pending_full_error(db_id, count, total, self.max_pending, self.max_pending_bytes)
                if old is None:
                    cur.execute(
                        "INSERT INTO pending (db, id, header, size, author, source, received) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (db, entry.id, entry.header, size, *fields),
                    )
                    seq = cur.lastrowid
                else:  # replace in place: it keeps its position
                    seq = old[0]
                    cur.execute(
                        "UPDATE pending SET header = ?, size = ?, author = ?, source = ?, received = ? WHERE seq = ?",
                        (entry.header, size, *fields, seq),
                    )
                    cur.execute("DELETE FROM pending_payloads WHERE pending = ?", (seq,))
                    cur.execute("DELETE FROM pending_missing WHERE pending = ?", (seq,))
                cur.executemany(
                    "INSERT INTO pending_payloads (pending, store, data) VALUES (?, ?, ?)",
                    ((seq, store, data) for store, data in entry.payloads.items()),
                )
                cur.executemany(
                    "INSERT INTO pending_missing (pending, position, parent) VALUES (?, ?, ?)",
                    ((seq, i, parent) for i, parent in enumerate(record.missing)),
                )

    def pending(self, db_id: str) -> list[PendingRecord]:
        with self._reading() as conn:
            db = self._db_key(db_id)
            # Metadata only: the header and payload columns are not read.
            rows = conn.execute(
                "SELECT seq, id, author, source, received, size FROM pending WHERE db = ? ORDER BY seq", (db,)
            ).fetchall()
            missing: dict[int, list[str]] = {r[0]: [] for r in rows}
            for seq, parent in conn.execute(
                "SELECT m.pending, m.parent FROM pending_missing m JOIN pending p ON p.seq = m.pending "
                "WHERE p.db = ? ORDER BY m.pending, m.position",
                (db,),
            ):
                missing[seq].append(parent)
            return [
                PendingRecord(entry_id, author, source, received, size, tuple(missing[seq]))
                for seq, entry_id, author, source, received, size in rows
            ]

    def get_pending(self, db_id: str, entry_id: str) -> StoredEntry | None:
        with self._reading() as conn:
            db = self._db_key(db_id)
            check_name(entry_id, "entry id")
            row = conn.execute("SELECT seq, header FROM pending WHERE db = ? AND id = ?", (db, entry_id)).fetchone()
            if row is None:
                return None
            payloads = self._payloads(conn, "pending_payloads", "pending", [row[0]])[row[0]]
            return StoredEntry(entry_id, row[1], freeze_payloads(payloads))

    def drop_pending(self, db_id: str, entry_ids: Sequence[str]) -> None:
        with self._lock:
            db = self._db_key(db_id)
            ids = check_ids(entry_ids, "pending entry id")
            if not ids:
                return
            with self._transaction() as cur:
                cur.executemany("DELETE FROM pending WHERE db = ? AND id = ?", ((db, i) for i in ids))

    # ----------------------------------------------------------------- peer-local records

    def get_local(self, ns: str, key: str) -> bytes | None:
        with self._reading() as conn:
            check_name(ns, "namespace")
            check_name(key, "key")
            row = conn.execute("SELECT value FROM local WHERE ns = ? AND key = ?", (ns, key)).fetchone()
            return None if row is None else row[0]

    def put_local(self, ns: str, key: str, value: bytes) -> None:
        with self._lock:
            self._connection()
            check_name(ns, "namespace")
            check_name(key, "key")
            data = check_bytes(value, "value")
            with self._transaction() as cur:
                cur.execute(
                    "INSERT INTO local (ns, key, value) VALUES (?, ?, ?) "
                    "ON CONFLICT (ns, key) DO UPDATE SET value = excluded.value",
                    (ns, key, data),
                )

    def put_local_many(self, ns: str, items: Iterable[tuple[str, bytes]]) -> None:
        with self._lock:
            self._connection()
            check_name(ns, "namespace")
            batch = check_local_items(items)  # all validated before the transaction begins
            if not batch:
                return
            with self._transaction() as cur:
                cur.executemany(
                    "INSERT INTO local (ns, key, value) VALUES (?, ?, ?) "
                    "ON CONFLICT (ns, key) DO UPDATE SET value = excluded.value",
                    ((ns, key, value) for key, value in batch),
                )

    def delete_local(self, ns: str, key: str) -> bool:
        with self._lock:
            self._connection()
            check_name(ns, "namespace")
            check_name(key, "key")
            with self._transaction() as cur:
                cur.execute("DELETE FROM local WHERE ns = ? AND key = ?", (ns, key))
                return cur.rowcount > 0

    def items_local(self, ns: str) -> list[tuple[str, bytes]]:
        with self._reading() as conn:
            check_name(ns, "namespace")
            # BINARY collation compares UTF-8 bytes, which orders like Python's str comparison.
            return [tuple(r) for r in conn.execute("SELECT key, value FROM local WHERE ns = ? ORDER BY key", (ns,))]

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
                raise StorageError(f"backing up {self.path} to {os.fspath(path)} failed: {exc}") from exc

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
