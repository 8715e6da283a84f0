"""SQLite's own view of the storage file, for `memmesh check` (node/integrity/): its page and
foreign key checks, the schema's text against this version's, and the pending totals against
the rows they count. SQLite-specific: not part of the Storage interface."""
from __future__ import annotations

import sqlite3

from memmesh.node.storage_connection import SqliteConnection
from memmesh.node.storage_schema import SCHEMA_VERSION, expected_columns


class FileChecks(SqliteConnection):
    """What a check reads of the file itself, and the one repair of a count (the totals)."""

    def integrity_problems(self, limit: int = 100) -> list[str]:
        """What SQLite's own checks find wrong with the file, [] when it is sound: ``PRAGMA
        integrity_check`` (pages, b-trees, indexes) and ``PRAGMA foreign_key_check`` (a payload,
        pending or damaged row whose entry row is gone), at most ``limit`` lines."""
        with self._reading() as conn:
            try:
                lines = [row[0] for row in conn.execute(f"PRAGMA integrity_check({int(limit)})")]
            except sqlite3.DatabaseError as exc:  # a page so damaged that the check itself stops
                return [f"SQLite's integrity check stops on damage it cannot read past ({exc})"]
            problems = [] if lines == ["ok"] else lines
            try:
                for table, rowid, parent, _fk in conn.execute("PRAGMA foreign_key_check"):
                    if len(problems) >= limit:
                        break
                    problems.append(f"a row of {table} (rowid {rowid}) refers to a {parent} row that is gone")
            except sqlite3.DatabaseError as exc:
                problems.append(f"SQLite's foreign key check stops on damage it cannot read past ({exc})")
            return problems

    def schema_problems(self) -> list[str]:
        """Tables whose columns differ from the schema this version creates ([] when none do):
        SQLite's own checks do not look at the text of the schema, which damage can change."""
        expected = expected_columns()
        with self._reading() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            problems = []
            for table, columns in expected.items():
                try:
                    found = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
                except (sqlite3.DatabaseError, ValueError) as exc:
                    problems.append(f"the definition of table {table} cannot be read ({exc})")
                    continue
                if version < SCHEMA_VERSION and (found == columns[:len(found)]) and (found or table.startswith("damaged")):
                    continue  # an older file read as it is (its migrations add these): migrated when opened to write
                if found != columns:
                    problems.append(f"table {table} has the columns {', '.join(found) or 'none'}; memmesh's "
                                    f"are {', '.join(columns)} (its definition in the file is damaged)")
            return problems

    def pending_totals_problems(self) -> list[str]:
        """Where the pending bound's running totals (kept by triggers) differ from the pending
        rows they count; [] when they agree."""
        with self._reading() as conn:
            rows = conn.execute(
                "SELECT d.db_id, t.count, t.bytes, count(p.seq), coalesce(sum(p.size), 0) FROM databases d "
                "LEFT JOIN pending_totals t ON t.db = d.seq LEFT JOIN pending p ON p.db = d.seq "
                "GROUP BY d.seq ORDER BY d.seq").fetchall()
        return [f"database {db_id}: the pending totals say {count} entries / {total} bytes, the pending rows are "
                f"{real_count} / {real_bytes}" if count is not None else
                f"database {db_id}: the pending totals have no row for it"
                for db_id, count, total, real_count, real_bytes in rows
                if count is None or (count, total) != (real_count, real_bytes)]

    def fix_pending_totals(self) -> None:
        """Recount the pending totals from the pending rows (a repair)."""
        with self._lock:
            self._connection()
            with self._transaction() as cur:
                cur.execute("INSERT INTO pending_totals (db, count, bytes) SELECT seq, 0, 0 FROM databases "
                            "WHERE true ON CONFLICT (db) DO NOTHING")
                cur.execute("UPDATE pending_totals SET count = (SELECT count(*) FROM pending p WHERE p.db = "
                            "pending_totals.db), bytes = (SELECT coalesce(sum(size), 0) FROM pending p "
                            "WHERE p.db = pending_totals.db)")
