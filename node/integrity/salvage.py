"""Rebuild a damaged storage file from every row that can still be read (`check --repair`).

When SQLite's own integrity check fails (a torn or overwritten page, a damaged index) or the
file does not open, queries that cross a damaged page fail while the rest of the file reads
fine. So every table is read around the damage: a scan in key order up to the first error, a
scan from the other end down to it, and between the two, ranges of row ids halved until each
readable row is read and each unreadable one is isolated. The rows go, with their row ids
(their order: parents before children), into a new file made by ``SqliteStorage`` (the current
schema, so an old file is migrated on the way). Nothing is judged here: the entry checks that
run next on the new file move aside whatever fails its hashes or signature. An entry whose
payload rows cannot be read gets "not received" payloads for the stores its header describes
(fetched again by sync); a row whose database row is unreadable is given back to its database
by the database id its signed header names.

The swap keeps the old file: ``node.sqlite`` is hard-linked as ``node.sqlite.damaged-<UTC>``
and its write-ahead log moved beside it under the same name, then the new file is renamed over
``node.sqlite`` (atomic). Until that rename the home holds the old file; the old log is moved
first because a log left beside the new file would be replayed into it.
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memmesh.crdt.entry import decode_entry, id_of
from memmesh.crdt.errors import StorageError
from memmesh.node.storage import SqliteStorage

__all__ = ["SalvageError", "Salvaged", "salvage"]


class SalvageError(StorageError):
    """Nothing could be read from the damaged file: it is left as it was."""


@dataclass
class Salvaged:
    kept: str  # where the old file is now
    rows: int = 0  # rows copied into the new file
    unreadable: dict[str, int] = field(default_factory=dict)  # table -> rows (or row ids) that could not be read
    payloads_unreadable: int = 0  # entries whose payload rows were lost: their payloads are fetched again

    def as_dict(self) -> dict[str, Any]:
        return {"kept": self.kept, "rows": self.rows, "unreadable": dict(self.unreadable),
                "payloads_unreadable": self.payloads_unreadable}


# (table, columns with the row id first) of the tables keyed by row id, in the order they are copied.
_ROWID_TABLES = {
    "databases": ("seq", "db_id"),
    "entries": ("seq", "db", "id", "header"),
    "pending": ("seq", "db", "id", "header", "size", "author", "source", "received"),
    "damaged": ("seq", "db", "id", "header", "size", "origin", "reason", "detail", "moved", "stores"),
}
# Child tables: (table, the column naming the parent row, the other columns).
_CHILDREN: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {  # (table, parent column, columns)
    "entries": [("payloads", "entry", ("store", "data"))],
    "pending": [("pending_payloads", "pending", ("store", "data")),
                ("pending_missing", "pending", ("position", "parent"))],
    "damaged": [("damaged_payloads", "damaged", ("store", "data"))],
}
_DEFAULTS = {"author": "", "source": "", "received": 0, "stores": "[]"}  # columns an old file lacks
# Text columns: read as bytes and decoded here, so that damaged UTF-8 loses one row, not the scan.
# Names must decode exactly; labels and notes are kept with the damaged bytes replaced.
_NAMES = {"db_id", "id", "store", "ns", "key", "parent"}
_LABELS = {"author", "source", "origin", "reason", "detail", "stores"}


def _ro(path: Path) -> sqlite3.Connection:
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    # Before anything reads the schema: a damaged row of it (one table's definition) would
    # otherwise make SQLite refuse every table; with this it reads the tables it can parse.
    conn.execute("PRAGMA writable_schema=ON")
    conn.execute("PRAGMA query_only=ON")
    conn.text_factory = bytes  # decoded per row (_decoded): damaged UTF-8 must not end a scan
    return conn


def _columns(conn: sqlite3.Connection, table: str) -> list[str] | None:
    """The table's column names as the file defines them (None: no such table, or unreadable).
    Rows are read by position: damage to a name in the schema's text must not lose a column."""
    try:
        cols = [row[1].decode("utf-8", errors="replace") if isinstance(row[1], bytes) else str(row[1])
                for row in conn.execute(f"PRAGMA table_info({table})")]
    except sqlite3.DatabaseError:
        return None
    return cols or None


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _padded(values: list, columns: tuple[str, ...]) -> tuple | None:
    """A row of an older table (fewer columns: later versions added theirs at the end) given the
    defaults those columns were added with; None when it cannot be made one of ours."""
    if len(values) > len(columns):
        return None
    missing = columns[len(values):]
    if any(c not in _DEFAULTS for c in missing):
        return None
    return (*values, *(_DEFAULTS[c] for c in missing))


def _decoded(row: tuple, columns: tuple[str, ...]) -> tuple | None:
    """A row read with bytes for text, decoded; None when a name in it is damaged."""
    out = []
    for name, value in zip(columns, row):
        if isinstance(value, bytes) and (name in _NAMES or name in _LABELS):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                if name in _NAMES:
                    return None
                value = value.decode("utf-8", errors="replace")
            if "\x00" in value:
                if name in _NAMES:
                    return None
                value = value.replace("\x00", "?")
        out.append(value)
    return tuple(out)


class _Reader:
    """Reads one table of a damaged file around its damage."""

    def __init__(self, conn: sqlite3.Connection, limit_rowid: int) -> None:
        self.conn = conn
        self.limit = limit_rowid  # an upper bound of row ids when the top of a table cannot be read
        self.undecodable = 0  # rows whose names are damaged UTF-8

    def _keep(self, row: tuple, columns: tuple[str, ...]) -> tuple | None:
        if "header" in columns and "id" in columns:
            i, h = columns.index("id"), columns.index("header")
            if isinstance(row[h], bytes) and isinstance(row[i], bytes):
                try:
                    row[i].decode("utf-8")
                except UnicodeDecodeError:  # the header is what the id is the hash of
                    row = (*row[:i], id_of(row[h]).encode(), *row[i + 1:])
        decoded = _decoded(row, columns)
        if decoded is None:
            self.undecodable += 1
        return decoded

    def rowid_rows(self, table: str, columns: tuple[str, ...]) -> tuple[dict[int, tuple], int]:
        """Every readable row by row id, and how many row ids failed to read."""
        present = _columns(self.conn, table)
        if present is None:
            return {}, 0
        if _padded([None] * len(present), columns) is None:
            return {}, 1  # not a table of ours any more: nothing in it can be placed
        select = "rowid, *"
        rows: dict[int, tuple] = {}

        def keep(raw: tuple) -> None:
            values = list(raw[1:])
            if values[0] is None:  # the row id column's definition is damaged: its value is the rowid
                values[0] = raw[0]
            row = _padded(values, columns)
            decoded = None if row is None else self._keep(row, columns)
            if decoded is not None:
                rows[decoded[0]] = decoded

        low = 0
        try:
            for row in self.conn.execute(f"SELECT {select} FROM {table} ORDER BY rowid"):
                low = row[0]
                keep(row)
            return rows, 0
        except sqlite3.DatabaseError:
            pass
        high = None
        try:
            for row in self.conn.execute(f"SELECT {select} FROM {table} ORDER BY rowid DESC"):
                if row[0] <= low:
                    break
                keep(row)
                high = row[0]
        except sqlite3.DatabaseError:
            pass
        top = high - 1 if high is not None else max(low + 1, self.limit)
        failed = 0
        stack = [(low + 1, top)]
        while stack:  # halve each failing range until every readable row is read
            a, b = stack.pop()
            if a > b:
                continue
            try:
                for row in self.conn.execute(f"SELECT {select} FROM {table} WHERE rowid BETWEEN ? AND ? "
                                             "ORDER BY rowid", (a, b)).fetchall():
                    keep(row)
            except sqlite3.DatabaseError:
                if a == b:
                    failed += 1
                else:
                    m = (a + b) // 2
                    stack += [(m + 1, b), (a, m)]
        return rows, failed

    def children(self, table: str, parent_col: str, columns: tuple[str, ...],
                 parents: list[int]) -> tuple[dict[int, list[tuple]], set[int]]:
        """Child rows per parent row id; and the parents whose children could not be read."""
        present = _columns(self.conn, table)
        if present is None:
            return {}, set()
        if len(present) != 1 + len(columns):
            return {}, set(parents)  # not a table of ours any more: every parent's rows are lost
        out: dict[int, list[tuple]] = {}

        def keep(parent: int, row: tuple) -> None:
            decoded = self._keep(row, columns)
            if decoded is not None:  # a row with a damaged store name is dropped: that store reads as absent
                out.setdefault(parent, []).append(decoded)

        try:
            for row in self.conn.execute(f"SELECT * FROM {table} ORDER BY 1"):
                keep(row[0], row[1:])
            return out, set()
        except sqlite3.DatabaseError:
            out = {}
        lost: set[int] = set()
        for parent in parents:  # one lookup each: only lookups that cross the damage fail
            try:
                found = self.conn.execute(f"SELECT * FROM {table} WHERE {_quoted(present[0])} = ?",
                                          (parent,)).fetchall()
            except sqlite3.DatabaseError:
                lost.add(parent)
                continue
            for row in found:
                keep(parent, row[1:])
        return out, lost

    def local(self) -> tuple[list[tuple], bool]:
        """The peer-local records that can be read, and whether some could not."""
        present = _columns(self.conn, "local")
        if present is None:
            return [], False
        if len(present) != 3:
            return [], True
        rows: dict[tuple[str, str], tuple] = {}
        columns = ("ns", "key", "value")
        try:
            for row in self.conn.execute("SELECT * FROM local ORDER BY 1, 2"):
                decoded = self._keep(row, columns)
                if decoded is not None:
                    rows[(decoded[0], decoded[1])] = decoded
            return list(rows.values()), False
        except sqlite3.DatabaseError:
            pass
        try:
            for row in self.conn.execute("SELECT * FROM local ORDER BY 1 DESC, 2 DESC"):
                decoded = self._keep(row, columns)
                if decoded is None:
                    continue
                if (decoded[0], decoded[1]) in rows:
                    break
                rows[(decoded[0], decoded[1])] = decoded
        except sqlite3.DatabaseError:
            pass
        return list(rows.values()), True


def _db_of_header(header: bytes, entry_id: str) -> str | None:
    """The database a signed header belongs to (a root entry is its own database)."""
    try:
        entry = decode_entry(header, None, verify_signature=False)
    except Exception:  # damaged beyond reading: its database cannot be told
        return None
    return entry.db or entry.id


def _described_stores(header: bytes) -> list[str]:
    try:
        return sorted(decode_entry(header, None, verify_signature=False).stores)
    except Exception:
        return []


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def salvage(path: Path) -> Salvaged:
    """Rebuild ``path`` from what can be read of it (see the module docstring); raises
    SalvageError, changing nothing, when not one row can be read."""
    path = Path(path)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    kept = path.with_name(f"{path.name}.damaged-{stamp}")
    new = path.with_name(f"{path.name}.salvage")
    for leftover in (new, Path(f"{new}-wal"), Path(f"{new}-shm")):
        leftover.unlink(missing_ok=True)  # an interrupted salvage's half-built file
    try:
        old = _ro(path)
    except sqlite3.Error as exc:
        raise SalvageError(f"nothing can be read from {path} ({exc}); restore a backup (memmesh restore)") from exc
    report = Salvaged(str(kept))
    try:
        try:
            page_count = old.execute("PRAGMA page_count").fetchone()[0]
            page_size = old.execute("PRAGMA page_size").fetchone()[0]
        except sqlite3.DatabaseError:
            page_count, page_size = max(1, path.stat().st_size // 4096), 4096
        reader = _Reader(old, max(1000, page_count * page_size // 64))
        SqliteStorage(new).close()  # the current schema, empty
        out = sqlite3.connect(new, isolation_level=None)
        try:
            out.execute("PRAGMA foreign_keys=ON")
            out.execute("BEGIN")
            _copy(reader, out, report)
            if report.rows == 0:
                raise SalvageError(f"not one row of {path} can be read; it is left as it was: restore a backup "
                                   "(memmesh restore)")
            out.execute("COMMIT")
        except BaseException:
            if out.in_transaction:
                out.execute("ROLLBACK")
            raise
        finally:
            out.close()  # the last connection: its log is checkpointed into the file and removed
    except BaseException:
        old.close()
        for leftover in (new, Path(f"{new}-wal"), Path(f"{new}-shm")):
            leftover.unlink(missing_ok=True)
        raise
    old.close()
    _fsync(new)
    _swap(path, new, kept)
    return report


def _copy(reader: _Reader, out: sqlite3.Connection, report: Salvaged) -> None:
    dbs, failed = reader.rowid_rows("databases", _ROWID_TABLES["databases"])
    if failed:
        report.unreadable["databases"] = failed
    db_key: dict[str, int] = {}
    for seq, db_id in sorted(dbs.values()):
        if db_id not in db_key:
            db_key[db_id] = seq
            out.execute("INSERT INTO databases (seq, db_id) VALUES (?, ?)", (seq, db_id))
            out.execute("INSERT INTO pending_totals (db, count, bytes) VALUES (?, 0, 0)", (seq,))
            report.rows += 1
    by_seq = {seq: db_id for db_id, seq in db_key.items()}

    def database(db: int, header: bytes, entry_id: str) -> int | None:
        if db in by_seq:
            return db
        db_id = _db_of_header(header, entry_id)  # its database row is unreadable: the header says
        if db_id is None:
            return None
        if db_id not in db_key:
            seq = out.execute("INSERT INTO databases (db_id) VALUES (?)", (db_id,)).lastrowid
            assert seq is not None  # an INSERT always sets it
            out.execute("INSERT INTO pending_totals (db, count, bytes) VALUES (?, 0, 0)", (seq,))
            db_key[db_id], by_seq[seq] = seq, db_id
        return db_key[db_id]

    for table in ("entries", "pending", "damaged"):
        columns = _ROWID_TABLES[table]
        rows, failed = reader.rowid_rows(table, columns)
        copied: list[int] = []
        headers: dict[int, bytes] = {}
        for seq in sorted(rows):
            row = list(rows[seq])
            if table == "damaged":
                try:
                    json.loads(row[-1])
                except ValueError:
                    row[-1] = "[]"
            db = database(row[1], row[3], row[2]) if isinstance(row[3], bytes) else None
            if db is None:
                failed += 1
                continue
            row[1] = db
            try:
                out.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})", row)
            except sqlite3.IntegrityError:  # a second copy of an id (damage in the unique index)
                failed += 1
                continue
            copied.append(seq)
            headers[seq] = row[3]
            report.rows += 1
        if failed:
            report.unreadable[table] = failed
        for child, parent_col, child_cols in _CHILDREN[table]:
            found, lost = reader.children(child, parent_col, child_cols, copied)
            taken = set(copied)
            for parent, child_rows in found.items():
                if parent not in taken:
                    continue
                for child_row in child_rows:
                    out.execute(f"INSERT INTO {child} ({parent_col}, {', '.join(child_cols)}) "
                                f"VALUES ({', '.join('?' * (1 + len(child_cols)))})", (parent, *child_row))
                    report.rows += 1
            if child in ("payloads", "pending_payloads", "damaged_payloads"):
                for parent in lost:
                    # The payload rows are gone but the header says which stores there were: each
                    # becomes "not received", so the entry stays and sync fetches its payloads.
                    for store in _described_stores(headers[parent]):
                        out.execute(f"INSERT INTO {child} ({parent_col}, store, data) VALUES (?, ?, NULL)",
                                    (parent, store))
                report.payloads_unreadable += len(lost)
            elif lost:
                report.unreadable[child] = len(lost)
    local, some_lost = reader.local()
    out.executemany("INSERT INTO local (ns, key, value) VALUES (?, ?, ?)",
                    [row for row in local if isinstance(row[2], bytes)])
    report.rows += len(local)
    if some_lost:
        report.unreadable["local"] = -1  # how many is unknown: the records between the two scans
    if reader.undecodable:
        report.unreadable["damaged text"] = reader.undecodable


def _swap(path: Path, new: Path, kept: Path) -> None:
    try:
        os.link(path, kept)
    except OSError:  # a file system without hard links
        shutil.copy2(path, kept)
    wal = Path(f"{path}-wal")
    if wal.exists():
        os.replace(wal, Path(f"{kept}-wal"))  # with the old file, never beside the new one
    Path(f"{path}-shm").unlink(missing_ok=True)
    Path(f"{kept}-shm").unlink(missing_ok=True)
    os.replace(new, path)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
