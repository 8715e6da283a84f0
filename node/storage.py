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
opened, in one transaction (see ``_MIGRATIONS``): version 1 lacked the pending table's
author, source and received columns, version 2 the damaged tables.

Durability: WAL journal, ``synchronous=NORMAL``. A transaction is committed when its WAL frames
have been written to the operating system, which survives the process being killed at any
point (``kill -9``): every acknowledged ``append`` is on disk and the file always opens in a
consistent state. The trade-off: on power loss or an operating-system crash the last few
committed transactions may be rolled back (the file stays consistent, never corrupt), because
NORMAL does not fsync the WAL on every commit. Pass ``synchronous="FULL"`` to fsync every
commit and keep acknowledged writes across power loss as well, at a large cost per append.

Opening (``__init__``, ``_setup``): every reason a file cannot be opened is one StorageError
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

import json
import os
import resource
import sqlite3
import threading
import urllib.parse
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from memmesh.crdt.errors import DamagedError, DiskFullError, DiskIOError, ReadOnlyError, StorageError, WriteFailedError
from memmesh.crdt.storage import (
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_PENDING_BYTES,
    Aside,
    DamagedRecord,
    PendingRecord,
    Storage,
    StoredEntry,
    check_asides,
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
from memmesh.node import file_check
from memmesh.node.wal_check import check_wal as check_wal_bytes
from memmesh.node.wal_check import read_wal_index

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "SqliteStorage"]

APPLICATION_ID = 0x4D4D5348  # "MMSH" in the SQLite header: this file is a memmesh store
SCHEMA_VERSION = 3
_PAGE = 500  # entries read per query while iterating

# Added by version 3: what `memmesh check --repair` moved aside (node/integrity/). Beside the
# log, never joined with it, so nothing that reads the log or pages entries out can reach them.
_DAMAGED_TABLES = """
CREATE TABLE damaged (
    seq    INTEGER PRIMARY KEY,              -- the order moved aside
    db     INTEGER NOT NULL REFERENCES databases(seq),
    id     TEXT NOT NULL,                    -- the id it was stored under
    header BLOB NOT NULL,                    -- the bytes as found
    size   INTEGER NOT NULL,                 -- StoredEntry.size of the copy
    origin TEXT NOT NULL,                    -- 'log' or 'pending': where it was found
    reason TEXT NOT NULL,                    -- the check's code: entry.id, entry.payload, entry.orphaned ...
    detail TEXT NOT NULL,
    moved  INTEGER NOT NULL,                 -- ms, the caller's clock
    stores TEXT NOT NULL DEFAULT '[]',       -- JSON list: payloads made NULL in the log (the entry stayed)
    UNIQUE (db, id)
);
CREATE TABLE damaged_payloads (
    damaged INTEGER NOT NULL REFERENCES damaged(seq) ON DELETE CASCADE,
    store   TEXT NOT NULL,
    data    BLOB,
    PRIMARY KEY (damaged, store)
) WITHOUT ROWID;
"""

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
""" + _DAMAGED_TABLES

# Statements that bring a file from schema version N to N + 1; run on open, all steps in one
# transaction, so an interrupted migration leaves the old version intact.
_MIGRATIONS = {
    1: """
ALTER TABLE pending ADD COLUMN author TEXT NOT NULL DEFAULT '';
ALTER TABLE pending ADD COLUMN source TEXT NOT NULL DEFAULT '';
ALTER TABLE pending ADD COLUMN received INTEGER NOT NULL DEFAULT 0;
""",
    2: _DAMAGED_TABLES,
}

_SYNCHRONOUS = ("NORMAL", "FULL", "EXTRA")
_COLUMNS: dict[str, list[str]] = {}


def _expected_columns() -> dict[str, list[str]]:
    """Each table's columns, in order, as ``_SCHEMA`` makes them (built once, in memory)."""
    if not _COLUMNS:
        conn = sqlite3.connect(":memory:")
        try:
            for statement in _statements(_SCHEMA):
                conn.execute(statement)
            for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall():
                _COLUMNS[table] = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
        finally:
            conn.close()
    return _COLUMNS
_OUR_TABLES = frozenset({"databases", "entries", "payloads", "local"})  # in every schema version
_SELF_CHECKED = frozenset({"entries", "payloads"})  # the log: each entry hashed as it loads
_VERSION_HEADROOM = 1000  # schema versions grow by one per format change: further ahead is damage
# What damaged bytes raise while SQLite opens a file and Python decodes what it returns
# (UnicodeDecodeError is a ValueError: a damaged schema's SQL quoted in an error message).
_DAMAGE = (sqlite3.Error, ValueError, OverflowError, TypeError)


def _quick_check(conn: sqlite3.Connection, path: str, table: str = "") -> None:
    """``PRAGMA quick_check`` of the file, or of one (quoted) table; DamagedError if it fails."""
    try:
        rows = [str(r[0]) for r in conn.execute(f"PRAGMA quick_check({table or 3})")]
    except _DAMAGE as exc:
        raise file_check.open_error(path, exc) from exc
    if rows != ["ok"]:
        lines = [line for row in rows for line in row.splitlines() if not line.startswith("*** in database")]
        raise file_check.damaged(path, "SQLite's quick_check: " + file_check.clean("; ".join(lines)))


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


def _file_size_limit_reached(path: str) -> int | None:
    """This process's file size limit (RLIMIT_FSIZE) when ``path`` or its WAL has reached it."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft == resource.RLIM_INFINITY:
        return None
    for name in (path, path + "-wal", path + "-journal"):
        try:
            size = os.path.getsize(name)
        except OSError:
            continue
        if size + _LARGEST_WRITE > soft:
            return soft
    return None


def _disk_nearly_full(path: str) -> bool:
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < _NEARLY_FULL


_LARGEST_WRITE = 65536 + 24  # one WAL frame of the largest page size
_NEARLY_FULL = 1 << 20  # free bytes below which an I/O error is taken for a full disk


def _create_private(path: str) -> None:
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


class SqliteStorage(Storage):
    """Durable storage in one SQLite file (WAL mode)."""

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
        head = self._read_head()  # before SQLite: its errors do not say whose file it is
        if head is None and self.path != ":memory:":
            _create_private(self.path)
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

    def _read_head(self) -> tuple[file_check.Header | None, int] | None:
        """The file's header, read as bytes (node/file_check.py), and its size; None when there
        is no file yet (SQLite creates it) or it is not a regular file (SQLite's to refuse)."""
        path = self.path
        if path == ":memory:" or not os.path.isfile(path):
            return None
        try:
            with open(path, "rb") as f:
                head, size = f.read(file_check.HEADER), os.fstat(f.fileno()).st_size
        except OSError as exc:
            raise StorageError(f"cannot read storage file {path}: {exc.strerror or exc}") from exc
        return file_check.read_header(path, head, size), size

    def _check_log(self, head: tuple[file_check.Header | None, int] | None, check_wal: bool,
                   recovered: bool) -> None:
        """Refuse a WAL whose damage would make SQLite drop committed transactions, and a file
        shorter than its header says (node/wal_check.py). Runs after SQLite's first read
        (``recovered``: it then says how far it read the log, node/wal_check.py) and before
        any write, which would overwrite the frames SQLite dropped."""
        if head is None:
            return
        header, size = head
        wal = self.path + "-wal"
        wal_pages = False  # whether the WAL may hold pages beyond the file's end
        if os.path.isfile(wal):
            if not check_wal:
                wal_pages = True
            else:
                try:
                    with open(wal, "rb") as f:
                        data = f.read()
                    index = None
                    if recovered and os.path.isfile(self.path + "-shm"):
                        with open(self.path + "-shm", "rb") as f:
                            index = read_wal_index(f.read(96))
                except OSError as exc:
                    raise StorageError(f"cannot read {wal}: {exc.strerror or exc}") from exc
                report = check_wal_bytes(data, header.page_size if header else None, index)
                if report.problem:
                    raise file_check.damaged(wal, report.problem)
                wal_pages = report.committed > 0
        if header is not None and not wal_pages:
            file_check.check_length(self.path, header, size)

    def _classify(self, conn: sqlite3.Connection, head: tuple[file_check.Header | None, int] | None,
                  check_wal: bool) -> tuple[bool, int]:
        """Whose file this is and in what state: (fresh, schema version), or the one-line error."""
        path = self.path
        try:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except _DAMAGE as exc:
            self._check_log(head, check_wal, recovered=False)  # a damaged log or a short file says more
            raise file_check.open_error(path, exc) from exc
        self._check_log(head, check_wal, recovered=True)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except _DAMAGE as exc:
            if app_id == APPLICATION_ID:
                raise file_check.open_error(path, exc) from exc
            # Not marked as ours, and its schema cannot be read: nothing tells whose it is.
            raise file_check.not_sqlite(path, f"SQLite cannot read its schema: {file_check.clean(exc)}") from exc
        if app_id == 0 and version == 0 and not tables:
            return True, 0
        if app_id != APPLICATION_ID:
            if _OUR_TABLES <= tables:  # the header was hit, not the tables: ours, damaged
                raise file_check.damaged(path, "its header lost memmesh's application id, but it holds memmesh's tables")
            raise file_check.other_program(path)
        if version > SCHEMA_VERSION + _VERSION_HEADROOM:
            raise file_check.damaged(path, f"its header gives storage schema version {version:,}, which no memmesh writes")
        if version > SCHEMA_VERSION:
            raise StorageError(
                f"{path} was written by a newer memmesh (storage schema version {version}; "
                f"this version understands up to {SCHEMA_VERSION}); upgrade memmesh to open it"
            )
        if version < 1:
            raise file_check.damaged(path, f"its header gives storage schema version {version}")
        if not _OUR_TABLES <= tables:
            raise file_check.damaged(path, "it lacks memmesh's tables " + ", ".join(sorted(_OUR_TABLES - tables)))
        # Every table but the log's, page by page: their rows carry no hash of their own, and a
        # damaged b-tree page can hide rows (an agent's record) without any error. Small
        # tables: well under a millisecond at 100k entries. The log checks itself as it loads.
        if sqlite3.sqlite_version_info >= (3, 33):  # quick_check(TABLE)
            for table in sorted(tables - _SELF_CHECKED):
                _quick_check(conn, path, '"' + table.replace('"', '""') + '"')
        return False, version

    def _setup(self, synchronous: str, head: tuple[file_check.Header | None, int] | None = None,
               check_wal: bool = True) -> None:
        conn = self._conn
        assert conn is not None
        path = self.path
        if head is None:  # no file yet: nothing to protect, SQLite creates it
            fresh, version = self._classify(conn, head, check_wal)
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
                fresh, version = self._classify(probe, head, check_wal)
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
                        f"cannot migrate {path} from storage schema version {version} to "
                        f"{SCHEMA_VERSION} (the file is unchanged): {exc}"
                    ) from exc
            for seq, db_id in conn.execute("SELECT seq, db_id FROM databases ORDER BY seq"):
                if not isinstance(seq, int) or not isinstance(db_id, str) or not db_id or "\x00" in db_id:
                    raise file_check.damaged(path, f"its list of databases holds {file_check.clean(repr(db_id), 60)}, "
                                                   "which is not a database id")
                self._db_keys[db_id] = seq
        except _DAMAGE as exc:
            raise file_check.open_error(path, exc) from exc

    def quick_check(self) -> None:
        """SQLite's ``PRAGMA quick_check``: every page and b-tree of the file is well formed (it
        does not compare indexes with their tables, nor read what rows hold: the entries' own
        hashes check that). Raises DamagedError naming the first problem. It reads the whole
        file (about 110 ms at 100k entries, 74 MB), so serve runs it as it starts; every open
        checks the tables other than the log's (see ``_classify``)."""
        with self._lock:
            _quick_check(self._connection(), self.path)

    # ----------------------------------------------------------------- helpers

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StorageError("storage is closed")
        return self._conn

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Cursor]:
        """One write transaction; committed on success, rolled back on any exception.
        sqlite errors surface as StorageError (see ``_write_error``): a failed transaction
        leaves nothing of itself in the file. Caller holds ``self._lock``."""
        conn = self._connection()
        cur = conn.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise self._write_error(exc) from exc
        try:
            yield cur
            cur.execute("COMMIT")
        except BaseException as exc:
            # SQLite rolls back by itself after some errors (a full disk, an I/O error); after
            # any other the transaction is still open and is rolled back here.
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            if isinstance(exc, sqlite3.Error):
                raise self._write_error(exc) from exc
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
                raise self._read_error(exc) from exc

    def _write_error(self, exc: sqlite3.Error, path: str | None = None,
                     nothing: str = "nothing was written") -> StorageError:
        """One line for a write that did not commit, from SQLite's error code: which file, what
        happened, that nothing of it is stored (``nothing``), what to do."""
        path = path or self.path
        name = getattr(exc, "sqlite_errorname", None) or ""
        if name == "SQLITE_FULL":
            return DiskFullError(f"the disk holding {path} is full: {nothing}; free space and retry")
        if name.startswith("SQLITE_IOERR"):
            # A full disk reaches SQLite as ENOSPC (SQLITE_FULL) on most writes, but a file size
            # limit gives EFBIG and some file systems report no space as EIO: look for both.
            limit = _file_size_limit_reached(path)
            if limit is not None:
                return DiskFullError(f"{path} reached this process's file size limit ({limit:,} bytes, "
                                     f"ulimit -f): {nothing}; raise the limit and retry")
            if _disk_nearly_full(path):
                return DiskFullError(f"the disk holding {path} is full: {nothing}; free space and retry")
            return DiskIOError(f"writing {path} failed with an I/O error ({name}): {nothing}; check the disk "
                               "and the system log, then retry")
        if name == "SQLITE_READONLY_DBMOVED":
            return ReadOnlyError(f"{path} was moved or deleted while memmesh had it open: {nothing}; "
                                 "put it back, or restart memmesh")
        if name.startswith("SQLITE_READONLY"):
            return ReadOnlyError(f"{path} cannot be written by this process ({name}): {nothing}; make the file, "
                                 "its directory and its file system writable for this user, then retry")
        if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
            return DamagedError(f"{path} is damaged ({exc}): {nothing}; run memmesh check --repair, "
                                "or restore a backup")
        if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            return WriteFailedError(f"{path} is locked by another process ({name}): {nothing}; retry once it "
                                    "is done")
        if name.startswith("SQLITE_CANTOPEN"):
            return WriteFailedError(f"cannot open a file beside {path} (its write-ahead log; {exc}): {nothing}; "
                                    "check the permissions of its directory and the free space, then retry")
        if name == "SQLITE_NOMEM":
            return WriteFailedError(f"out of memory while writing {path}: {nothing}; retry")
        return StorageError(f"writing {path} failed ({name or type(exc).__name__}: {exc}): {nothing}")

    def _read_error(self, exc: sqlite3.Error) -> StorageError:
        name = getattr(exc, "sqlite_errorname", None) or ""
        if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
            return DamagedError(f"{self.path} is damaged: reading it failed ({exc}); run memmesh check --repair, "
                                "or restore a backup")
        if name.startswith("SQLITE_IOERR"):
            return StorageError(f"reading {self.path} failed with an I/O error ({name}); check the disk and "
                                "the system log")
        return StorageError(f"reading {self.path} failed ({name or type(exc).__name__}: {exc})")

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

    # ----------------------------------------------------------------- the damaged area

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

    # ----------------------------------------------------------------- checking the file itself
    # SQLite-specific, for `memmesh check` (node/integrity/): not part of the Storage interface.

    @classmethod
    def open_snapshot(cls, path: str | os.PathLike[str]) -> "SqliteStorage":
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
            raise self._read_error(exc) from exc
        except ValueError as exc:  # text that is not UTF-8 any more: damaged bytes
            self._conn.close()
            self._conn = None
            raise DamagedError(f"{self.path} is damaged: its list of databases cannot be read ({exc}); run "
                               "memmesh check --repair, or restore a backup") from exc
        return self

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
        expected = _expected_columns()
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
                name = getattr(exc, "sqlite_errorname", None) or ""
                if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_IOERR_READ", "SQLITE_IOERR_SHORT_READ")):
                    raise self._read_error(exc) from exc  # reading this file failed
                # Else the destination's fault (a full disk): the home itself is only read.
                raise self._write_error(exc, os.fspath(path), "the backup was not written") from exc

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
