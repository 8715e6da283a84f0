"""Storage adapters: the shared conformance suite against both, SQLite specifics, and a
model-based test that MemoryStorage and SqliteStorage stay observably identical."""
from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from memmesh.crdt.errors import DamagedError, StorageError
from memmesh.crdt.storage import Aside, MemoryStorage, PendingRecord, Storage, StoredEntry
from memmesh.node.storage import APPLICATION_ID, SCHEMA_VERSION, SqliteStorage
from memmesh.node.storage_schema import statements

try:
    from storage_conformance import StorageConformance, make_entry
except ImportError:  # tests/ imported as a package
    from tests.storage_conformance import StorageConformance, make_entry


class TestMemoryStorage(StorageConformance):
    def open_storage(self, location, **limits):
        return MemoryStorage(**limits)


class TestSqliteStorage(StorageConformance):
    def open_storage(self, location, **limits):
        return SqliteStorage(location / "node.sqlite", **limits)

    def reopen(self, storage, location, **limits):
        storage.close()
        return SqliteStorage(location / "node.sqlite", **limits)


# --------------------------------------------------------------------------- SQLite specifics


def test_pragmas_and_schema(tmp_path):
    path = tmp_path / "n.sqlite"
    s = SqliteStorage(path)
    conn = s._conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA secure_delete").fetchone()[0] == 1
    s.close()
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"databases", "entries", "payloads", "pending", "pending_payloads", "pending_missing", "local"} <= tables
    columns = {r[1]: (r[2], r[3]) for r in raw.execute("PRAGMA table_info(pending)")}  # name: (type, notnull)
    assert columns["author"] == ("TEXT", 1) and columns["source"] == ("TEXT", 1)
    assert columns["received"] == ("INTEGER", 1)
    raw.close()


def test_synchronous_full_option(tmp_path):
    s = SqliteStorage(tmp_path / "n.sqlite", synchronous="FULL")
    assert s._conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    s.close()
    with pytest.raises(ValueError):
        SqliteStorage(tmp_path / "m.sqlite", synchronous="OFF")


@pytest.mark.parametrize("content", [os.urandom(4096), b"hello\n"])
def test_not_a_database_file(tmp_path, content):
    """No SQLite header: damaged, or another program's file; the line says what to do for each."""
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    with pytest.raises(DamagedError) as caught:
        SqliteStorage(path)
    assert str(caught.value) == (
        f"{path} is not a readable SQLite file (its first bytes are not SQLite's header): if it is this "
        "node's storage, it is damaged: restore a backup (memmesh restore); if it is another program's file, "
        "move it away or choose another path (memmesh creates its storage file itself)")
    assert path.read_bytes() == content  # the file is left untouched


def test_impossible_page_size_is_damage(tmp_path):
    path = tmp_path / "n.sqlite"
    content = b"SQLite format 3\x00" + b"\xff" * 200
    path.write_bytes(content)
    with pytest.raises(DamagedError) as caught:
        SqliteStorage(path)
    assert str(caught.value) == (f"{path} is damaged (its header gives an impossible page size, 65535); "
                                 "run: memmesh check --repair, or restore a backup (memmesh restore)")
    assert path.read_bytes() == content


def test_other_programs_sqlite_file(tmp_path):
    path = tmp_path / "other.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE t (x)")
    raw.execute("INSERT INTO t VALUES (1)")
    raw.commit()
    raw.close()
    before = path.read_bytes()
    with pytest.raises(StorageError) as caught:
        SqliteStorage(path)
    assert not isinstance(caught.value, DamagedError)
    assert str(caught.value) == (f"{path} is an SQLite database of another program, not a memmesh storage file; "
                                 "move it away or choose another path (memmesh creates its storage file itself)")
    assert path.read_bytes() == before
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA application_id=12345")
    raw.close()
    with pytest.raises(StorageError, match="another program"):
        SqliteStorage(path)


def test_newer_schema_version_refused(tmp_path):
    path = tmp_path / "n.sqlite"
    SqliteStorage(path).close()
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(StorageError, match=f"newer memmesh.*version {SCHEMA_VERSION + 1}.*upgrade"):
        SqliteStorage(path)


def test_unopenable_paths(tmp_path):
    with pytest.raises(StorageError, match="cannot open"):
        SqliteStorage(tmp_path / "missing-dir" / "n.sqlite")
    with pytest.raises(StorageError):
        SqliteStorage(tmp_path)  # a directory


def test_empty_file_is_initialised(tmp_path):
    path = tmp_path / "n.sqlite"
    path.write_bytes(b"")
    s = SqliteStorage(path)
    s.add_database("d")
    s.close()
    assert SqliteStorage(path).databases() == ["d"]


# --------------------------------------------------------------------------- open errors (damage)

REPAIR = "run: memmesh check --repair, or restore a backup (memmesh restore)"


def _filled(path: Path, n: int = 40) -> Path:
    """A storage file with some entries, checkpointed (everything in the file, no WAL)."""
    s = SqliteStorage(path)
    s.add_database("d")
    s.append("d", [make_entry() for _ in range(n)])
    s.close()
    assert not Path(f"{path}-wal").exists()
    return path


def test_newer_schema_version_message(tmp_path):
    path = tmp_path / "n.sqlite"
    SqliteStorage(path).close()
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(StorageError) as caught:
        SqliteStorage(path)
    assert not isinstance(caught.value, DamagedError)
    assert str(caught.value) == (
        f"{path} was written by a newer memmesh (storage schema version {SCHEMA_VERSION + 1}; this version "
        f"understands up to {SCHEMA_VERSION}); upgrade memmesh to open it")


def test_an_impossible_schema_version_is_damage(tmp_path):
    path = _filled(tmp_path / "n.sqlite")
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version=1684234849")  # what four ASCII bytes over the field give
    raw.close()
    with pytest.raises(DamagedError) as caught:
        SqliteStorage(path)
    assert str(caught.value) == (f"{path} is damaged (its header gives storage schema version 1,684,234,849, "
                                 f"which no memmesh writes); {REPAIR}")


@pytest.mark.parametrize("keep, what", [
    (6, "it ends after 6 bytes, inside SQLite's header"),
    (61, "it ends after 61 bytes, inside SQLite's 100-byte header"),
    (3000, "it ends after 3,000 bytes, inside its first page of 4,096 bytes"),
])
def test_truncated_inside_the_first_page(tmp_path, keep, what):
    path = _filled(tmp_path / "n.sqlite")
    with open(path, "r+b") as f:
        f.truncate(keep)
    with pytest.raises(DamagedError) as caught:
        SqliteStorage(path)
    assert str(caught.value) == f"{path} is truncated ({what}); {REPAIR}"


def test_truncated_file_names_what_is_missing(tmp_path):
    path = _filled(tmp_path / "n.sqlite")
    size = path.stat().st_size
    pages = size // 4096
    with open(path, "r+b") as f:
        f.truncate(size - 4096 - 100)
    with pytest.raises(DamagedError) as caught:
        SqliteStorage(path)
    assert str(caught.value) == (f"{path} is truncated (its header says {pages} pages of 4,096 bytes, the file "
                                 f"holds {pages - 2} and a part); {REPAIR}")
    assert path.stat().st_size == size - 4096 - 100  # refused files are left as they are


def test_lost_application_id_with_our_tables_is_damage(tmp_path):
    path = _filled(tmp_path / "n.sqlite")
    data = bytearray(path.read_bytes())
    data[68:72] = b"\xde\xad\xbe\xef"  # the application id field
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedError) as caught:
        SqliteStorage(path)
    assert str(caught.value) == (f"{path} is damaged (its header lost memmesh's application id, but it holds "
                                 f"memmesh's tables); {REPAIR}")


def test_damaged_schema_is_one_line(tmp_path):
    """64 bytes inside the schema page made every command a traceback (issue 13)."""
    path = _filled(tmp_path / "n.sqlite", n=3)
    data = bytearray(path.read_bytes())
    at = data.find(b"CREATE TABLE pending_totals") + 20
    data[at:at + 64] = bytes(range(0x80, 0xC0))  # not UTF-8: SQLite quotes it in its error
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedError) as caught:
        SqliteStorage(path)
    text = str(caught.value)
    assert text.startswith(f"{path} is damaged (SQLite") and text.endswith(f"); {REPAIR}")
    assert text.isprintable()


def test_a_damaged_page_fails_the_read_and_quick_check(tmp_path):
    """A b-tree page whose cell pointers were overwritten: reading it fails (cell_size_check)
    instead of yielding fewer rows, and quick_check finds it without reading the rows."""
    path = _filled(tmp_path / "n.sqlite", n=200)
    raw = sqlite3.connect(path)
    root = raw.execute("SELECT rootpage FROM sqlite_master WHERE name = 'entries'").fetchone()[0]
    raw.close()
    data = bytearray(path.read_bytes())
    # The root is an interior page once 200 entries are stored: damage its right-most leaf.
    assert data[(root - 1) * 4096] == 0x05
    leaf = int.from_bytes(data[(root - 1) * 4096 + 8:(root - 1) * 4096 + 12], "big")
    at = (leaf - 1) * 4096 + 8  # the leaf's first cell pointers
    data[at:at + 4] = b"\xff\xf0\xff\xf0"
    path.write_bytes(bytes(data))
    s = SqliteStorage(path)
    with pytest.raises(DamagedError) as caught:
        list(s.entries("d"))
    assert str(path) in str(caught.value) and "check --repair" in str(caught.value)
    with pytest.raises(DamagedError) as caught:
        s.quick_check()
    assert str(caught.value).startswith(f"{path} is damaged (SQLite's quick_check: ")
    assert str(caught.value).endswith(f"); {REPAIR}")
    s.close()


def _wal_copy(tmp_path: Path, n: int = 30) -> Path:
    """A copy of a storage file taken while another connection kept its WAL: every entry is
    in the log. Each append is one transaction."""
    src = tmp_path / "src.sqlite"
    s = SqliteStorage(src)
    keeper = sqlite3.connect(src)
    keeper.execute("SELECT 1 FROM sqlite_master").fetchall()
    s.add_database("d")
    for _ in range(n):
        s.append("d", [make_entry()])
    s.close()
    dest = tmp_path / "copy"
    dest.mkdir()
    for suffix in ("", "-wal"):
        shutil.copy(f"{src}{suffix}", dest / f"n.sqlite{suffix}")
    keeper.close()
    return dest / "n.sqlite"


def test_damaged_wal_is_refused_before_sqlite_drops_it(tmp_path):
    path = _wal_copy(tmp_path)
    wal = Path(f"{path}-wal")
    data = bytearray(wal.read_bytes())
    frames = (len(data) - 32) // (24 + 4096)
    hit = frames - 12  # well after the schema and the database were created
    data[32 + (hit - 1) * (24 + 4096) + 24 + 500] ^= 0xFF  # the page of that frame
    wal.write_bytes(bytes(data))
    before = wal.read_bytes()
    with pytest.raises(DamagedError) as caught:
        SqliteStorage(path)
    text = str(caught.value)
    assert text.startswith(f"{wal} is damaged (frame {hit} of {frames} fails its checksum, and ")
    assert text.endswith(f" committed transactions after it would be silently dropped); {REPAIR}")
    assert wal.read_bytes() == before  # SQLite never read it: nothing was recovered away
    # check --repair's way in: open anyway, with what SQLite keeps (the first transactions)
    s = SqliteStorage(path, check_wal=False)
    assert s.count("d") < 30
    s.close()


def test_damaged_wal_header_is_refused(tmp_path):
    path = _wal_copy(tmp_path)
    wal = Path(f"{path}-wal")
    data = bytearray(wal.read_bytes())
    frames = (len(data) - 32) // (24 + 4096)
    data[17] ^= 0x10  # a salt: the header's checksum fails
    wal.write_bytes(bytes(data))
    with pytest.raises(DamagedError) as caught:
        SqliteStorage(path)
    assert str(caught.value) == (f"{wal} is damaged (its header is damaged while {frames} frames follow it, "
                                 f"which SQLite would ignore); {REPAIR}")


def test_torn_last_frame_opens(tmp_path):
    """What a kill -9 mid-write leaves: the last frame cut short. Everything before it opens."""
    path = _wal_copy(tmp_path)
    wal = Path(f"{path}-wal")
    with open(wal, "r+b") as f:
        f.truncate(wal.stat().st_size - 1000)
    s = SqliteStorage(path)
    assert s.count("d") == 29
    s.close()


def test_rolled_back_frames_in_the_wal_open(tmp_path):
    """A write transaction that spilled pages into the log and rolled back leaves frames with
    the log's salts behind the next commit: normal, not damage."""
    path = tmp_path / "n.sqlite"
    s = SqliteStorage(path)
    keeper = sqlite3.connect(path)
    keeper.execute("SELECT 1 FROM sqlite_master").fetchall()
    s.add_database("d")
    s.append("d", [make_entry()])
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("PRAGMA cache_size=2")  # spill to the log mid-transaction
    raw.execute("BEGIN IMMEDIATE")
    raw.execute("CREATE TABLE scratch (x)")
    for _ in range(50):
        raw.execute("INSERT INTO scratch VALUES (?)", (os.urandom(3000),))
    raw.execute("ROLLBACK")
    raw.close()
    s.append("d", [make_entry()])
    s.close()
    dest = tmp_path / "copy"
    dest.mkdir()
    for suffix in ("", "-wal"):
        shutil.copy(f"{path}{suffix}", dest / f"n.sqlite{suffix}")
    keeper.close()
    copy = SqliteStorage(dest / "n.sqlite")
    assert copy.count("d") == 2
    copy.close()


def test_sql_failure_mid_batch_rolls_back(tmp_path):
    """A failure inside SQLite after the entry rows were written (here: while writing the
    payloads of the last entry) leaves nothing of the batch, and the storage keeps working."""
    s = SqliteStorage(tmp_path / "n.sqlite")
    s.add_database("d")
    first = make_entry()
    s.append("d", [first])
    s._conn.execute(
        "CREATE TEMP TRIGGER boom BEFORE INSERT ON payloads WHEN NEW.store = 'boom' "
        "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
    )
    batch = [make_entry() for _ in range(5)] + [make_entry(stores=("memory", "boom"))]
    with pytest.raises(StorageError, match="injected failure"):
        s.append("d", batch)
    assert [e.id for e in s.entries("d")] == [first.id]
    assert s._conn.execute("SELECT count(*) FROM payloads").fetchone()[0] == 1
    assert not s._conn.in_transaction
    assert s.append("d", batch[:5]) == 5
    s.close()


def test_erased_bytes_leave_the_file(tmp_path):
    path = tmp_path / "n.sqlite"
    s = SqliteStorage(path)
    s.add_database("d")
    secret = b"SECRET-" + os.urandom(16).hex().encode() + b"-TERCES" * 50
    e = StoredEntry("sha256:s", b"header", {"memory": secret, "meta": b"keep"})
    s.append("d", [make_entry() for _ in range(50)] + [e] + [make_entry() for _ in range(50)])

    def on_disk() -> bytes:
        return b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())

    assert secret[:30] in on_disk()
    s.erase_payload("d", e.id, "memory")
    assert s.get("d", e.id).payloads == {"memory": None, "meta": b"keep"}
    assert secret[:30] not in on_disk()
    s.close()
    assert secret[:30] not in on_disk()


def test_drop_pending_removes_child_rows(tmp_path):
    s = SqliteStorage(tmp_path / "n.sqlite")
    s.add_database("d")
    a, b = make_entry(stores=("memory", "meta")), make_entry()
    s.put_pending("d", a, ["sha256:p1", "sha256:p2"])
    s.put_pending("d", b, ["sha256:p1"])
    s.put_pending("d", a, ["sha256:p3"])  # replacement rewrites the child rows
    count = lambda t: s._conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # noqa: E731
    totals = lambda: s._conn.execute("SELECT count, bytes FROM pending_totals").fetchall()  # noqa: E731
    assert (count("pending"), count("pending_payloads"), count("pending_missing")) == (2, 3, 2)
    assert totals() == [(2, a.size + b.size)]
    s.append("d", [a], drop_pending=[a.id])
    assert totals() == [(1, b.size)]
    s.drop_pending("d", [b.id])
    assert (count("pending"), count("pending_payloads"), count("pending_missing")) == (0, 0, 0)
    assert totals() == [(0, 0)]
    s.close()


def test_two_handles_on_one_file(tmp_path):
    path = tmp_path / "n.sqlite"
    one, two = SqliteStorage(path), SqliteStorage(path)
    one.add_database("d")
    e = make_entry()
    assert two.append("d", [e]) == 1  # a database added through another handle is found
    assert one.get("d", e.id) == e
    assert one.append("d", [e]) == 0
    one.close()
    two.close()


def test_header_bytes_kept_exactly(tmp_path):
    s = SqliteStorage(tmp_path / "n.sqlite")
    s.add_database("d")
    header = bytes(range(256)) * 3 + b"\x00\x00"
    s.append("d", [StoredEntry("sha256:h", header, {"m": b"\x00" * 10})])
    s.close()
    s = SqliteStorage(tmp_path / "n.sqlite")
    got = s.get("d", "sha256:h")
    assert got.header == header and got.payloads == {"m": b"\x00" * 10}
    s.close()


# --------------------------------------------------------------------------- migration

# The schema of storage version 1, exactly as memmesh wrote it (node/storage.py before the
# pending table gained author, source and received): a fixture, never to be edited.
_SCHEMA_V1 = """
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


def _write_v1_file(path: Path) -> dict:
    """A real version-1 file with entries (one payload erased), pending entries and local
    records, written with plain SQL as memmesh 1 wrote it. Returns what it holds."""
    log = [make_entry(stores=("memory", "meta")), make_entry(), make_entry()]
    waiting = [make_entry(stores=("memory", "meta")), make_entry()]
    missing = [("sha256:p1", "sha256:p2"), ()]
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("PRAGMA journal_mode=WAL")
    raw.execute("BEGIN")
    for statement in statements(_SCHEMA_V1):
        raw.execute(statement)
    raw.execute(f"PRAGMA application_id={APPLICATION_ID}")
    raw.execute("PRAGMA user_version=1")
    for db_id in ("d1", "d2"):
        seq = raw.execute("INSERT INTO databases (db_id) VALUES (?)", (db_id,)).lastrowid
        raw.execute("INSERT INTO pending_totals (db, count, bytes) VALUES (?, 0, 0)", (seq,))
    for e in log:
        seq = raw.execute("INSERT INTO entries (db, id, header) VALUES (1, ?, ?)", (e.id, e.header)).lastrowid
        for store, data in e.payloads.items():
            raw.execute("INSERT INTO payloads (entry, store, data) VALUES (?, ?, ?)", (seq, store, data))
    raw.execute("UPDATE payloads SET data = NULL WHERE entry = 1 AND store = 'memory'")  # erased
    for e, parents in zip(waiting, missing):
        seq = raw.execute(
            "INSERT INTO pending (db, id, header, size) VALUES (1, ?, ?, ?)", (e.id, e.header, e.size)
        ).lastrowid
        for store, data in e.payloads.items():
            raw.execute("INSERT INTO pending_payloads (pending, store, data) VALUES (?, ?, ?)", (seq, store, data))
        for i, parent in enumerate(parents):
            raw.execute("INSERT INTO pending_missing (pending, position, parent) VALUES (?, ?, ?)", (seq, i, parent))
    raw.execute("INSERT INTO local (ns, key, value) VALUES ('creds', 'k', x'00ff'), ('sync', 'é', x'')")
    raw.execute("COMMIT")
    raw.close()
    erased = StoredEntry(log[0].id, log[0].header, {"memory": None, "meta": log[0].payloads["meta"]})
    return {"log": [erased, *log[1:]], "waiting": waiting, "missing": missing}


def test_version_1_file_is_migrated_in_place(tmp_path):
    path = tmp_path / "n.sqlite"
    held = _write_v1_file(path)
    s = SqliteStorage(path, max_pending=3)
    # everything the version-1 file held is found
    assert s.databases() == ["d1", "d2"]
    assert list(s.entries("d1")) == held["log"] and s.count("d2") == 0
    assert s.pending("d1") == [
        PendingRecord(e.id, "", "", 0, e.size, parents) for e, parents in zip(held["waiting"], held["missing"])
    ]
    assert [s.get_pending("d1", e.id) for e in held["waiting"]] == held["waiting"]
    assert s.items_local("creds") == [("k", b"\x00\xff")] and s.items_local("sync") == [("é", b"")]
    # the file is now version 3, with the same pending table as a new file
    fresh = SqliteStorage(tmp_path / "fresh.sqlite")
    table = lambda st: st._conn.execute("PRAGMA table_info(pending)").fetchall()  # noqa: E731
    assert table(s) == table(fresh)
    fresh.close()
    assert s._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    # the new fields work, and the old pending entries still count toward the bound
    new = make_entry()
    s.put_pending("d1", new, [], author="key:a", source="peer:b", received_ms=1234)
    with pytest.raises(StorageError, match="pending area full"):
        s.put_pending("d1", make_entry(), [])
    s.put_pending("d1", held["waiting"][1], ["sha256:p3"], author="key:c", source="local", received_ms=5)
    s.fill_payload("d1", held["log"][0].id, "memory", b"refetched")
    s.close()
    s = SqliteStorage(path, max_pending=3)  # a migrated file opens as a plain version-3 file
    assert s.pending("d1") == [
        PendingRecord(held["waiting"][0].id, "", "", 0, held["waiting"][0].size, ("sha256:p1", "sha256:p2")),
        PendingRecord(held["waiting"][1].id, "key:c", "local", 5, held["waiting"][1].size, ("sha256:p3",)),
        PendingRecord(new.id, "key:a", "peer:b", 1234, new.size, ()),
    ]
    assert s.get("d1", held["log"][0].id).payloads["memory"] == b"refetched"
    assert s.append("d1", [s.get_pending("d1", new.id)], drop_pending=[new.id]) == 1
    assert len(s.pending("d1")) == 2
    s.close()


def test_schema_problems_of_old_new_and_damaged_files(tmp_path):
    _write_v1_file(tmp_path / "v1.sqlite")
    old = SqliteStorage.open_snapshot(tmp_path / "v1.sqlite")
    assert old.schema_problems() == []  # what its migrations add is not missing
    old.close()
    s = SqliteStorage(tmp_path / "v1.sqlite")  # migrated
    assert s.schema_problems() == []
    s._conn.execute("PRAGMA writable_schema=ON")
    s._conn.execute("UPDATE sqlite_master SET sql = replace(sql, 'header BLOB', 'hxader BLOB') WHERE name = 'entries'")
    s.close()
    damaged = SqliteStorage.open_snapshot(tmp_path / "v1.sqlite")
    [problem] = damaged.schema_problems()
    assert "table entries has the columns seq, db, id, hxader" in problem
    damaged.close()


def test_failed_migration_leaves_the_file_at_version_1(tmp_path):
    """The migration is one transaction: when its last step fails, the steps before it are
    rolled back too and the file is still a readable version-1 file."""
    path = tmp_path / "n.sqlite"
    held = _write_v1_file(path)
    raw = sqlite3.connect(path)
    raw.execute("ALTER TABLE pending ADD COLUMN received INTEGER")  # the last step will clash
    raw.commit()
    raw.close()
    with pytest.raises(StorageError, match="cannot migrate .* from storage schema version 1 to 3.*unchanged"):
        SqliteStorage(path)
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == 1
    columns = [r[1] for r in raw.execute("PRAGMA table_info(pending)")]
    assert "author" not in columns and "source" not in columns
    assert raw.execute("SELECT count(*) FROM entries").fetchone()[0] == len(held["log"])
    assert raw.execute("SELECT count(*) FROM pending").fetchone()[0] == len(held["waiting"])
    raw.close()


def test_version_2_file_gains_the_damaged_area(tmp_path):
    """Version 3 added the damaged tables (memmesh check --repair): a version-2 file keeps
    everything and gets the same tables a new file has."""
    path = tmp_path / "n.sqlite"
    s = SqliteStorage(path)
    s.add_database("d")
    e = make_entry()
    s.append("d", [e])
    s.close()
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("DROP TABLE damaged_payloads")
    raw.execute("DROP TABLE damaged")
    raw.execute("PRAGMA user_version=2")
    raw.close()
    snapshot = SqliteStorage.open_snapshot(path)  # reads a version-2 file as it is, migrates nothing
    assert snapshot.damaged("d") == [] and snapshot.get_damaged("d", e.id) is None
    assert snapshot.schema_problems() == []
    snapshot.close()
    s = SqliteStorage(path)
    assert list(s.entries("d")) == [e]
    fresh = SqliteStorage(tmp_path / "fresh.sqlite")
    schema = lambda st: sorted(st._conn.execute(  # noqa: E731
        "SELECT name, sql FROM sqlite_master WHERE name LIKE 'damaged%'").fetchall())
    assert schema(s) == schema(fresh) and len(schema(s)) >= 2
    fresh.close()
    s.move_aside("d", [Aside(e.id, "entry.id")])
    assert [r.id for r in s.damaged("d")] == [e.id]
    s.close()


def test_snapshot_is_read_only_and_consistent(tmp_path):
    path = tmp_path / "n.sqlite"
    s = SqliteStorage(path)
    s.add_database("d")
    first = make_entry()
    s.append("d", [first])
    snap = SqliteStorage.open_snapshot(path)
    s.append("d", [make_entry()])  # after the snapshot began: not seen by it
    assert [e.id for e in snap.entries("d")] == [first.id] and s.count("d") == 2
    with pytest.raises(StorageError):
        snap.append("d", [make_entry()])
    assert snap.integrity_problems() == [] and snap.pending_totals_problems() == []
    snap.close()
    s.close()


def test_pending_totals_problems_are_found_and_fixed(tmp_path):
    s = SqliteStorage(tmp_path / "n.sqlite")
    s.add_database("d")
    s.put_pending("d", make_entry(), [])
    assert s.pending_totals_problems() == []
    s._conn.execute("UPDATE pending_totals SET count = 7")
    [problem] = s.pending_totals_problems()
    assert "database d" in problem and "7 entries" in problem
    s.fix_pending_totals()
    assert s.pending_totals_problems() == []
    s.close()


def test_unknown_old_schema_version_refused(tmp_path):
    path = tmp_path / "n.sqlite"
    _write_v1_file(path)
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version=0")
    raw.close()
    with pytest.raises(DamagedError) as caught:  # memmesh never writes version 0 with its application id
        SqliteStorage(path)
    assert str(caught.value) == (f"{path} is damaged (its header gives storage schema version 0); "
                                 "run: memmesh check --repair, or restore a backup (memmesh restore)")


# --------------------------------------------------------------------------- model-based

DBS = ["d1", "d2", "d3"]
IDS = [f"sha256:{i:02x}" for i in range(10)]
STORES = ["memory", "meta", "embeddings:p/m"]
NSS = ["creds", "sync"]
KEYS = ["a", "B", "é", "\U0001f600", "k0", "k1"]
LIMITS = {"max_pending": 4, "max_pending_bytes": 400}
LABELS = ["", "key:a", "peer:key:b", "local", "é\U0001f600"]

entry_strategy = st.builds(
    StoredEntry,
    id=st.sampled_from(IDS),
    header=st.binary(max_size=60),
    payloads=st.dictionaries(st.sampled_from(STORES), st.none() | st.binary(max_size=120), max_size=3),
)


def _outcome(call):
    try:
        return ("ok", call())
    except (StorageError, TypeError, ValueError) as exc:
        return (type(exc).__name__, str(exc))


class SameBehaviour(RuleBasedStateMachine):
    """Every operation is applied to the reference and to SQLite; results, errors and the
    whole observable state must match after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="memmesh-storage-")
        self.path = Path(self.dir) / "n.sqlite"
        self.ref: Storage = MemoryStorage(**LIMITS)
        self.sql: Storage = SqliteStorage(self.path, **LIMITS)
        for s in (self.ref, self.sql):
            s.add_database("d1")  # most steps should hit a database that exists

    def teardown(self) -> None:
        self.sql.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def both(self, op):
        expected, actual = _outcome(lambda: op(self.ref)), _outcome(lambda: op(self.sql))
        assert actual == expected

    @rule(db=st.sampled_from(DBS))
    def add_database(self, db):
        self.both(lambda s: s.add_database(db))

    @rule(
        db=st.sampled_from(DBS),
        batch=st.lists(entry_strategy, max_size=6),
        bad_at=st.none() | st.integers(0, 6),
        drop=st.lists(st.sampled_from(IDS), max_size=3),
    )
    def append(self, db, batch, bad_at, drop):
        if bad_at is not None:
            batch.insert(min(bad_at, len(batch)), StoredEntry(IDS[0], b"", {5: b"x"}))  # type: ignore[dict-item]
        self.both(lambda s: s.append(db, batch, drop_pending=drop))

    @rule(db=st.sampled_from(DBS), entry_id=st.sampled_from(IDS), store=st.sampled_from(STORES))
    def erase(self, db, entry_id, store):
        self.both(lambda s: s.erase_payload(db, entry_id, store))

    @rule(
        db=st.sampled_from(DBS),
        entry=entry_strategy,
        missing=st.lists(st.sampled_from(IDS), max_size=3),
        author=st.sampled_from(LABELS),
        source=st.sampled_from(LABELS),
        received_ms=st.integers(0, 2**63 - 1) | st.sampled_from([-1, 2**63]),  # and out of range
    )
    def put_pending(self, db, entry, missing, author, source, received_ms):
        self.both(lambda s: s.put_pending(db, entry, missing, author=author, source=source, received_ms=received_ms))

    @rule(
        db=st.sampled_from(DBS),
        entry_id=st.sampled_from(IDS),
        store=st.sampled_from(STORES),
        data=st.binary(max_size=30),
    )
    def fill(self, db, entry_id, store, data):
        self.both(lambda s: s.fill_payload(db, entry_id, store, data))

    @rule(db=st.sampled_from(DBS), ids=st.lists(st.sampled_from(IDS), max_size=4))
    def drop_pending(self, db, ids):
        self.both(lambda s: s.drop_pending(db, ids))

    @rule(
        db=st.sampled_from(DBS),
        moves=st.lists(st.builds(Aside, entry_id=st.sampled_from(IDS), reason=st.sampled_from(["entry.id", ""]),
                                 origin=st.sampled_from(["log", "pending"]),
                                 stores=st.sampled_from([(), ("memory",), ("meta", "embeddings:p/m")])), max_size=3),
        moved_ms=st.integers(0, 10),
    )
    def move_aside(self, db, moves, moved_ms):
        self.both(lambda s: s.move_aside(db, moves, moved_ms=moved_ms))

    @rule(db=st.sampled_from(DBS), ids=st.lists(st.sampled_from(IDS), max_size=3))
    def drop_damaged(self, db, ids):
        self.both(lambda s: s.drop_damaged(db, ids))

    @rule(ns=st.sampled_from(NSS), key=st.sampled_from(KEYS), value=st.binary(max_size=20))
    def put_local(self, ns, key, value):
        self.both(lambda s: s.put_local(ns, key, value))

    @rule(
        ns=st.sampled_from(NSS),
        items=st.lists(st.tuples(st.sampled_from(KEYS), st.binary(max_size=20)), max_size=4),
        bad_at=st.none() | st.integers(0, 4),
    )
    def put_local_many(self, ns, items, bad_at):
        if bad_at is not None:
            items.insert(min(bad_at, len(items)), ("k0", "not bytes"))
        self.both(lambda s: s.put_local_many(ns, items))

    @rule(ns=st.sampled_from(NSS), key=st.sampled_from(KEYS))
    def delete_local(self, ns, key):
        self.both(lambda s: s.delete_local(ns, key))

    @rule()
    def reopen(self):
        self.sql.close()
        self.sql = SqliteStorage(self.path, **LIMITS)

    @invariant()
    def same_state(self):
        def snapshot(s: Storage):
            dbs = s.databases()
            return (
                dbs,
                {
                    d: (
                        list(s.entries(d)),
                        s.count(d),
                        s.pending(d),
                        [(s.has(d, i), s.get(d, i), s.get_pending(d, i), s.get_damaged(d, i)) for i in IDS],
                        s.damaged(d),
                    )
                    for d in dbs
                },
                {ns: (s.items_local(ns), [s.get_local(ns, k) for k in KEYS]) for ns in NSS},
            )

        assert snapshot(self.sql) == snapshot(self.ref)


TestSameBehaviour = SameBehaviour.TestCase
TestSameBehaviour.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
