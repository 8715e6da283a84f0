"""What every part of the SQLite storage stands on: the one connection and its lock, write
transactions and reads whose SQLite errors become one line, the databases' row keys, and
reading payload rows."""
from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from memmesh.crdt.errors import StorageError
from memmesh.crdt.storage import check_name
from memmesh.node.storage_errors import read_error, write_error


class SqliteConnection:
    """The connection of a storage file (node/storage.py opens it); the other parts of
    SqliteStorage use it through these methods, each call under ``_lock``."""

    path: str
    max_pending: int
    max_pending_bytes: int
    _lock: threading.RLock
    _conn: sqlite3.Connection | None
    _db_keys: dict[str, int]  # database id -> its row in the databases table

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StorageError("storage is closed")
        return self._conn

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Cursor]:
        """One write transaction; committed on success, rolled back on any exception.
        sqlite errors surface as StorageError (node/storage_errors.py): a failed transaction
        leaves nothing of itself in the file. Caller holds ``self._lock``."""
        conn = self._connection()
        cur = conn.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise write_error(exc, self.path) from exc
        try:
            yield cur
            cur.execute("COMMIT")
        except BaseException as exc:
            # SQLite rolls back by itself after some errors (a full disk, an I/O error); after
            # any other the transaction is still open and is rolled back here.
            if conn.in_transaction:
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise write_error(exc, self.path) from exc
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
                raise read_error(exc, self.path) from exc

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
