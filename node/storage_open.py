"""Judging a storage file before it is opened for writing: its header read as bytes, its
write-ahead log, whose file it is and in what state, SQLite's page checks, and a new file
created private. Every refusal is one line naming the file (node/file_check.py)."""
from __future__ import annotations

import os
import sqlite3

from memmesh.crdt.errors import StorageError
from memmesh.node import file_check
from memmesh.node.storage_schema import APPLICATION_ID, OUR_TABLES, SCHEMA_VERSION, SELF_CHECKED, VERSION_HEADROOM
from memmesh.node.wal_check import check_wal as check_wal_bytes
from memmesh.node.wal_check import read_wal_index

Head = tuple[file_check.Header | None, int] | None  # the header as bytes say it, the size; None: no file

# What damaged bytes raise while SQLite opens a file and Python decodes what it returns
# (UnicodeDecodeError is a ValueError: a damaged schema's SQL quoted in an error message).
DAMAGE = (sqlite3.Error, ValueError, OverflowError, TypeError)


def run_quick_check(conn: sqlite3.Connection, path: str, table: str = "") -> None:
    """``PRAGMA quick_check`` of the file, or of one (quoted) table; DamagedError if it fails."""
    try:
        rows = [str(r[0]) for r in conn.execute(f"PRAGMA quick_check({table or 3})")]
    except DAMAGE as exc:
        raise file_check.open_error(path, exc) from exc
    if rows != ["ok"]:
        lines = [line for row in rows for line in row.splitlines() if not line.startswith("*** in database")]
        raise file_check.damaged(path, "SQLite's quick_check: " + file_check.clean("; ".join(lines)))


def read_head(path: str) -> Head:
    """The file's header, read as bytes (node/file_check.py), and its size; None when there
    is no file yet (SQLite creates it) or it is not a regular file (SQLite's to refuse)."""
    if path == ":memory:" or not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            head, size = f.read(file_check.HEADER), os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise StorageError(f"cannot read storage file {path}: {exc.strerror or exc}") from exc
    return file_check.read_header(path, head, size), size


def check_log(path: str, head: Head, check_wal: bool, recovered: bool) -> None:
    """Refuse a WAL whose damage would make SQLite drop committed transactions, and a file
    shorter than its header says (node/wal_check.py). Runs after SQLite's first read
    (``recovered``: it then says how far it read the log, node/wal_check.py) and before
    any write, which would overwrite the frames SQLite dropped."""
    if head is None:
        return
    header, size = head
    wal = path + "-wal"
    wal_pages = False  # whether the WAL may hold pages beyond the file's end
    if os.path.isfile(wal):
        if not check_wal:
            wal_pages = True
        else:
            try:
                with open(wal, "rb") as f:
                    data = f.read()
                index = None
                if recovered and os.path.isfile(path + "-shm"):
                    with open(path + "-shm", "rb") as f:
                        index = read_wal_index(f.read(96))
            except OSError as exc:
                raise StorageError(f"cannot read {wal}: {exc.strerror or exc}") from exc
            report = check_wal_bytes(data, header.page_size if header else None, index)
            if report.problem:
                raise file_check.damaged(wal, report.problem)
            wal_pages = report.committed > 0
    if header is not None and not wal_pages:
        file_check.check_length(path, header, size)


def classify(conn: sqlite3.Connection, path: str, head: Head, check_wal: bool) -> tuple[bool, int]:
    """Whose file this is and in what state: (fresh, schema version), or the one-line error."""
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    except DAMAGE as exc:
        check_log(path, head, check_wal, recovered=False)  # a damaged log or a short file says more
        raise file_check.open_error(path, exc) from exc
    check_log(path, head, check_wal, recovered=True)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except DAMAGE as exc:
        if app_id == APPLICATION_ID:
            raise file_check.open_error(path, exc) from exc
        # Not marked as ours, and its schema cannot be read: nothing tells whose it is.
        raise file_check.not_sqlite(path, f"SQLite cannot read its schema: {file_check.clean(exc)}") from exc
    if app_id == 0 and version == 0 and not tables:
        return True, 0
    if app_id != APPLICATION_ID:
        if tables >= OUR_TABLES:  # the header was hit, not the tables: ours, damaged
            raise file_check.damaged(path, "its header lost memmesh's application id, but it holds memmesh's tables")
        raise file_check.other_program(path)
    if version > SCHEMA_VERSION + VERSION_HEADROOM:
        raise file_check.damaged(path, f"its header gives storage schema version {version:,}, which no memmesh writes")
    if version > SCHEMA_VERSION:
        raise StorageError(
            f"{path} was written by a newer memmesh (storage schema version {version}; "
            f"this version understands up to {SCHEMA_VERSION}); upgrade memmesh to open it"
        )
    if version < 1:
        raise file_check.damaged(path, f"its header gives storage schema version {version}")
    if not tables >= OUR_TABLES:
        raise file_check.damaged(path, "it lacks memmesh's tables " + ", ".join(sorted(OUR_TABLES - tables)))
    # Every table but the log's, page by page: their rows carry no hash of their own, and a
    # damaged b-tree page can hide rows (an agent's record) without any error. Small
    # tables: well under a millisecond at 100k entries. The log checks itself as it loads.
    if sqlite3.sqlite_version_info >= (3, 33):  # quick_check(TABLE)
        for table in sorted(tables - SELF_CHECKED):
            run_quick_check(conn, path, '"' + table.replace('"', '""') + '"')
    return False, version


def create_private(path: str) -> None:
    """Create the storage file empty with mode 0600 before SQLite does: SQLite would create it
    under the umask (0644 as a rule), and it gives the -wal and -shm files the main file's mode,
    so the memories are readable by no other user whatever the umask."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except (OSError, ValueError):  # there already, or cannot be: SQLite's own error says why
        return
    try:
        os.fchmod(fd, 0o600)  # a umask that took the owner's bits too would leave it unwritable
    finally:
        os.close(fd)
