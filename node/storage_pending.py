"""The pending area of the storage file: entries waiting for their parents or payloads, within
the bounds per database (crdt/pending.py decides what goes in and out)."""
from __future__ import annotations

from collections.abc import Sequence

from memmesh.crdt.storage import (
    PendingRecord,
    StoredEntry,
    check_ids,
    check_name,
    check_pending,
    freeze_payloads,
    pending_full_error,
)
from memmesh.node.storage_connection import SqliteConnection


class PendingArea(SqliteConnection):
    """The pending tables: ``pending``, ``pending_payloads``, ``pending_missing`` and the
    trigger-kept ``pending_totals`` that the bounds are checked against."""

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
