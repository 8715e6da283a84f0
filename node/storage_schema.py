"""The storage file's schema: its tables, the version it carries, and the steps that bring an
older file up to it (node/storage.py has the layout and what each table holds)."""
from __future__ import annotations

import sqlite3

APPLICATION_ID = 0x4D4D5348  # "MMSH" in the SQLite header: this file is a memmesh store
SCHEMA_VERSION = 3

# Added by version 3: what `memmesh check --repair` moved aside (node/integrity/). Beside the
# log, never joined with it, so nothing that reads the log or pages entries out can reach them.
DAMAGED_TABLES = """
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

SCHEMA = """
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
""" + DAMAGED_TABLES

# Statements that bring a file from schema version N to N + 1; run on open, all steps in one
# transaction, so an interrupted migration leaves the old version intact.
MIGRATIONS = {
    1: """
ALTER TABLE pending ADD COLUMN author TEXT NOT NULL DEFAULT '';
ALTER TABLE pending ADD COLUMN source TEXT NOT NULL DEFAULT '';
ALTER TABLE pending ADD COLUMN received INTEGER NOT NULL DEFAULT 0;
""",
    2: DAMAGED_TABLES,
}

OUR_TABLES = frozenset({"databases", "entries", "payloads", "local"})  # in every schema version
SELF_CHECKED = frozenset({"entries", "payloads"})  # the log: each entry hashed as it loads
VERSION_HEADROOM = 1000  # schema versions grow by one per format change: further ahead is damage

_COLUMNS: dict[str, list[str]] = {}


def expected_columns() -> dict[str, list[str]]:
    """Each table's columns, in order, as ``SCHEMA`` makes them (built once, in memory)."""
    if not _COLUMNS:
        conn = sqlite3.connect(":memory:")
        try:
            for statement in statements(SCHEMA):
                conn.execute(statement)
            for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall():
                _COLUMNS[table] = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
        finally:
            conn.close()
    return _COLUMNS


def statements(script: str) -> list[str]:
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
