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

from crdt.errors import StorageError
from crdt.storage import MemoryStorage, PendingRecord, Storage, StoredEntry
from node.storage import APPLICATION_ID, SCHEMA_VERSION, SqliteStorage, _statements

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


@pytest.mark.parametrize("content", [os.urandom(4096), b"SQLite format 3\x00" + b"\xff" * 200, b"hello\n"])
def test_not_a_database_file(tmp_path, content):
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    with pytest.raises(StorageError, match="is not a memmesh storage file.*move it away"):
        SqliteStorage(path)
    assert path.read_bytes() == content  # the file is left untouched


def test_other_programs_sqlite_file(tmp_path):
    path = tmp_path / "other.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE t (x)")
    raw.execute("INSERT INTO t VALUES (1)")
    raw.commit()
    raw.close()
    before = path.read_bytes()
    with pytest.raises(StorageError, match="not a memmesh storage file.*another program"):
        SqliteStorage(path)
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
    for statement in _statements(_SCHEMA_V1):
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
    # the file is now version 2, with the same pending table as a new file
    fresh = SqliteStorage(tmp_path / "fresh.sqlite")
    table = lambda st: st._conn.execute("PRAGMA table_info(pending)").fetchall()  # noqa: E731
    assert table(s) == table(fresh)
    fresh.close()
    assert s._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    # the new fields work, and the old pending entries still count toward the bound
    new = make_entry()
    s.put_pending("d1", new, [], author="key:a", source="peer:b", received_ms=1234)
    with pytest.raises(StorageError, match="pending area full"):
        s.put_pending("d1", make_entry(), [])
    s.put_pending("d1", held["waiting"][1], ["sha256:p3"], author="key:c", source="local", received_ms=5)
    s.fill_payload("d1", held["log"][0].id, "memory", b"refetched")
    s.close()
    s = SqliteStorage(path, max_pending=3)  # a migrated file opens as a plain version-2 file
    assert s.pending("d1") == [
        PendingRecord(held["waiting"][0].id, "", "", 0, held["waiting"][0].size, ("sha256:p1", "sha256:p2")),
        PendingRecord(held["waiting"][1].id, "key:c", "local", 5, held["waiting"][1].size, ("sha256:p3",)),
        PendingRecord(new.id, "key:a", "peer:b", 1234, new.size, ()),
    ]
    assert s.get("d1", held["log"][0].id).payloads["memory"] == b"refetched"
    assert s.append("d1", [s.get_pending("d1", new.id)], drop_pending=[new.id]) == 1
    assert len(s.pending("d1")) == 2
    s.close()


def test_failed_migration_leaves_the_file_at_version_1(tmp_path):
    """The migration is one transaction: when its last step fails, the steps before it are
    rolled back too and the file is still a readable version-1 file."""
    path = tmp_path / "n.sqlite"
    held = _write_v1_file(path)
    raw = sqlite3.connect(path)
    raw.execute("ALTER TABLE pending ADD COLUMN received INTEGER")  # the last step will clash
    raw.commit()
    raw.close()
    with pytest.raises(StorageError, match="cannot migrate .* from storage schema version 1 to 2.*unchanged"):
        SqliteStorage(path)
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == 1
    columns = [r[1] for r in raw.execute("PRAGMA table_info(pending)")]
    assert "author" not in columns and "source" not in columns
    assert raw.execute("SELECT count(*) FROM entries").fetchone()[0] == len(held["log"])
    assert raw.execute("SELECT count(*) FROM pending").fetchone()[0] == len(held["waiting"])
    raw.close()


def test_unknown_old_schema_version_refused(tmp_path):
    path = tmp_path / "n.sqlite"
    _write_v1_file(path)
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version=0")
    raw.close()
    with pytest.raises(StorageError, match="unknown storage schema version 0"):
        SqliteStorage(path)


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
                        [(s.has(d, i), s.get(d, i), s.get_pending(d, i)) for i in IDS],
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
