"""The damaged area of the storage file: what `memmesh check --repair` moved aside
(node/integrity/), kept beside the log and never applied or served."""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from memmesh.crdt.errors import StorageError
from memmesh.crdt.storage import Aside, DamagedRecord, StoredEntry, check_asides, check_ids, check_name, freeze_payloads
from memmesh.node.storage_connection import SqliteConnection


class DamagedArea(SqliteConnection):
    """The ``damaged`` and ``damaged_payloads`` tables (schema version 3)."""

    def move_aside(self, db_id: str, moves: Sequence[Aside], *, moved_ms: int = 0) -> None:
        with self._lock:
            db = self._db_key(db_id)
            checked, when = check_asides(moves, moved_ms)
            if not checked:
                return
            with self._transaction() as cur:
                for move in checked:
                    self._move_one(cur, db, db_id, move, when)

    @staticmethod
    def _move_one(cur: sqlite3.Cursor, db: int, db_id: str, move: Aside, when: int) -> None:
        if move.origin == "log":
            table, payload_table, column = "entries", "payloads", "entry"
        else:
            table, payload_table, column = "pending", "pending_payloads", "pending"
        row = cur.execute(f"SELECT seq, header FROM {table} WHERE db = ? AND id = ?", (db, move.entry_id)).fetchone()
        if row is None:  # raised inside the transaction: everything moved so far is rolled back
            raise StorageError(f"cannot move aside: no entry {move.entry_id} in the {move.origin} of database {db_id}")
        seq, header = row
        payloads = cur.execute(f"SELECT store, data FROM {payload_table} WHERE {column} = ?", (seq,)).fetchall()
        size = len(header) + sum(len(data) for _store, data in payloads if data is not None)
        fields = (header, size, move.origin, move.reason, move.detail, when, json.dumps(list(move.stores)))
        old = cur.execute("SELECT seq FROM damaged WHERE db = ? AND id = ?", (db, move.entry_id)).fetchone()
        if old is None:
            aside = cur.execute(
                "INSERT INTO damaged (db, id, header, size, origin, reason, detail, moved, stores) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (db, move.entry_id, *fields)).lastrowid
        else:  # replaced in place: it keeps its position
            aside = old[0]
            cur.execute("UPDATE damaged SET header = ?, size = ?, origin = ?, reason = ?, detail = ?, moved = ?, "
                        "stores = ? WHERE seq = ?", (*fields, aside))
            cur.execute("DELETE FROM damaged_payloads WHERE damaged = ?", (aside,))
        cur.executemany("INSERT INTO damaged_payloads (damaged, store, data) VALUES (?, ?, ?)",
                        ((aside, store, data) for store, data in payloads))
        if move.origin == "pending":
            cur.execute("DELETE FROM pending WHERE seq = ?", (seq,))  # its payloads and parents cascade
        elif move.stores:
            # A row is made if the store had none, so that fill_payload can give it bytes again.
            cur.executemany(
                "INSERT INTO payloads (entry, store, data) VALUES (?, ?, NULL) "
                "ON CONFLICT (entry, store) DO UPDATE SET data = NULL", ((seq, store) for store in move.stores))
        else:
            cur.execute("DELETE FROM payloads WHERE entry = ?", (seq,))
            cur.execute("DELETE FROM entries WHERE seq = ?", (seq,))

    def _has_damaged_area(self, conn: sqlite3.Connection) -> bool:
        # A read-only snapshot of a version-2 file (never migrated) has no damaged tables yet.
        return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'damaged'").fetchone() is not None

    def damaged(self, db_id: str) -> list[DamagedRecord]:
        with self._reading() as conn:
            db = self._db_key(db_id)
            if not self._has_damaged_area(conn):
                return []
            return [
                DamagedRecord(entry_id, origin, reason, detail, moved, size, tuple(json.loads(stores)))
                for entry_id, origin, reason, detail, moved, size, stores in conn.execute(
                    "SELECT id, origin, reason, detail, moved, size, stores FROM damaged WHERE db = ? ORDER BY seq",
                    (db,))
            ]

    def get_damaged(self, db_id: str, entry_id: str) -> StoredEntry | None:
        with self._reading() as conn:
            db = self._db_key(db_id)
            check_name(entry_id, "entry id")
            if not self._has_damaged_area(conn):
                return None
            row = conn.execute("SELECT seq, header FROM damaged WHERE db = ? AND id = ?", (db, entry_id)).fetchone()
            if row is None:
                return None
            payloads = self._payloads(conn, "damaged_payloads", "damaged", [row[0]])[row[0]]
            return StoredEntry(entry_id, row[1], freeze_payloads(payloads))

    def drop_damaged(self, db_id: str, entry_ids: Sequence[str]) -> None:
        with self._lock:
            db = self._db_key(db_id)
            ids = check_ids(entry_ids, "damaged entry id")
            if not ids:
                return
            with self._transaction() as cur:
                cur.executemany("DELETE FROM damaged WHERE db = ? AND id = ?", ((db, i) for i in ids))
