"""A full disk or a failing write: the write fails with one clear line and leaves nothing behind,
reads and recall go on, writing resumes when space returns, and entries a node cannot store are
never acknowledged to the peer that sent them.

In-process tests fill the "disk" with SQLite's own bound (``PRAGMA max_page_count``: the file
may not grow, so a write that needs a new page fails with SQLITE_FULL, exactly as on a full
disk). The process tests give a real ``memmesh serve`` a file size limit (RLIMIT_FSIZE, set from
outside with prlimit) at the size its WAL has reached: a write that grows a file then fails in
the kernel with EFBIG, which SQLite reports as an I/O error (Python ignores SIGXFSZ); raising the
limit again is "space returns".
"""
from __future__ import annotations

import contextlib
import json
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memmesh.crdt.database import Database
from memmesh.crdt.entry import Entry
from memmesh.crdt.errors import DiskFullError, ReadOnlyError
from memmesh.node import Node
from memmesh.node.commands import REGISTRY
from memmesh.node.storage import SqliteStorage
from tests.dbkit import grant, key, new_db, write
from tests.homes import agent_with_bank
from tests.procs import Serve, processes, until

CLI = [sys.executable, "-m", "memmesh.node.cli"]
BIG = "x" * 200_000  # needs dozens of new pages: no free page of the file can take it


@contextlib.contextmanager
def disk_full(storage: SqliteStorage) -> Iterator[None]:
    """The file may not grow from now on (free pages inside it are vacuumed away first)."""
    conn = storage._connection()
    conn.execute("VACUUM")
    before = conn.execute("PRAGMA max_page_count").fetchone()[0]
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count={pages}")
    try:
        yield
    finally:
        conn.execute(f"PRAGMA max_page_count={before}")


@contextlib.contextmanager
def no_writes(storage: SqliteStorage) -> Iterator[None]:
    """Every write fails, even one that fits in a page the file has (SQLITE_READONLY), as every
    write does on a full disk once the WAL cannot grow: ``disk_full`` alone lets such writes by."""
    conn = storage._connection()
    conn.execute("PRAGMA query_only=ON")
    try:
        yield
    finally:
        conn.execute("PRAGMA query_only=OFF")


def full_message(path: str) -> str:
    return f"the disk holding {path} is full: nothing was written; free space and retry"


# ============================================================================ storage
def test_a_write_on_a_full_disk_fails_with_one_line_and_leaves_nothing(tmp_path):
    path = tmp_path / "node.sqlite"
    s = SqliteStorage(path)
    s.put_local_many("notes", [(f"k{i}", f"value {i}".encode()) for i in range(50)])
    before = s.items_local("notes")
    with disk_full(s):
        with pytest.raises(DiskFullError) as err:
            s.put_local_many("notes", [("big", BIG.encode()), ("k0", b"changed")])
        assert str(err.value) == full_message(str(path))
        assert s.items_local("notes") == before  # neither row of the failed transaction
        assert s.get_local("notes", "k1") == b"value 1"  # reads go on
    s.put_local("notes", "big", BIG.encode())  # space returned: the same write succeeds
    s.close()
    again = SqliteStorage(path)
    assert len(again.items_local("notes")) == 51 and again.get_local("notes", "k0") == b"value 0"
    again.close()


def test_a_file_this_process_may_not_write_fails_with_its_own_line(tmp_path):
    path = tmp_path / "node.sqlite"
    s = SqliteStorage(path)
    s.put_local("notes", "a", b"1")
    with no_writes(s):
        with pytest.raises(ReadOnlyError) as err:
            s.put_local("notes", "b", b"2")
        assert str(err.value).startswith(f"{path} cannot be written by this process (SQLITE_READONLY): nothing "
                                         "was written; make the file, its directory and its file system writable")
        assert s.items_local("notes") == [("a", b"1")]
    s.close()


def test_a_backup_onto_a_full_disk_fails_clearly_and_leaves_no_partial_copy(tmp_path):
    home, dest = tmp_path / "home", tmp_path / "backup"
    _node_home(home, memories=40)
    limit = (home / "node.sqlite").stat().st_size // 2  # the copy cannot be written whole

    def small_files() -> None:  # in the backup's own process (no serve runs): its files stop there
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    out = subprocess.run([*CLI, "--home", str(home), "backup", str(dest)], capture_output=True, text=True,
                         timeout=60, preexec_fn=small_files)
    assert out.returncode == 1, out
    assert out.stderr.strip().splitlines() == [
        f"memmesh: error: {dest / 'node.sqlite'} reached this process's file size limit ({limit:,} bytes, "
        "ulimit -f): the backup was not written; raise the limit and retry"]
    assert not dest.exists()


# ============================================================================ a database
def _state(db: Database) -> tuple[Any, ...]:
    return len(db), db.heads, db.feeds(), sorted(db.accepted_ids()), db.equivocators, db.pending_ids()


def test_a_local_write_on_a_full_disk_fails_and_the_feed_continues_once_space_returns(tmp_path):
    path = tmp_path / "node.sqlite"
    storage = SqliteStorage(path)
    admin, w = key(1), key(2)
    db = new_db(admin, storage)
    grant(db, admin, w, "write")
    last = [write(db, w, {"n": i}) for i in range(3)][-1]
    before = _state(db)
    rows = [r.value for r in db.rows("memory")]
    with disk_full(storage):
        for _ in range(2):  # and again: a failed write changes nothing a retry depends on
            with pytest.raises(DiskFullError):
                write(db, w, {"n": "big", "text": BIG})
            assert _state(db) == before
        assert [r.value for r in db.rows("memory")] == rows  # reads go on
    after = write(db, w, {"n": 3})
    entry = db.entry(after)
    assert entry is not None and (entry.seq, entry.prev) == (db.entry(last).seq + 1, last)
    assert db.is_accepted(after) and not db.equivocators
    state = _state(db)
    storage.close()
    reopened = Database.open(SqliteStorage(path), db.id)
    assert _state(reopened) == state
    assert [r.value for r in reopened.rows("memory")] == rows + [{"n": 3}]
    reopened.storage.close()


def _wire(db: Database, entry_id: str) -> tuple[bytes, dict[str, bytes | None]]:
    stored = db.storage.get(db.id, entry_id)
    assert stored is not None
    return stored.header, dict(stored.payloads)


def test_received_entries_on_a_full_disk_fail_the_batch_and_are_not_refused(tmp_path):
    """A full disk is this node's failure, never a refusal of the peer's entries: no
    entry.pending_full (the pending area's bound), no refusal record, nothing stored; the same
    batch is taken once space returns."""
    admin, w = key(1), key(2)
    src = new_db(admin)
    grant(src, admin, w, "write")
    parent = write(src, w, {"text": BIG})
    child = write(src, w, {"text": BIG[:150_000]})
    storage = SqliteStorage(tmp_path / "node.sqlite")
    storage.add_database(src.id)
    dst = Database(storage, src.id)
    dst.ingest(_wire(src, i) for i in src.missing_for({}) if i not in (parent, child))
    before = _state(dst)
    tampered = _wire(src, parent)
    tampered = (tampered[0][:-1] + bytes([tampered[0][-1] ^ 1]), tampered[1])  # its signature breaks
    with disk_full(storage):
        with pytest.raises(DiskFullError):
            dst.ingest([_wire(src, child)])  # waits for its parent: the pending area cannot take it
        with pytest.raises(DiskFullError):
            dst.ingest([tampered, _wire(src, parent)])  # a refusal to record and an entry to store
        assert _state(dst) == before
        assert dst.refusal(child) is None and dst.refusal(parent) is None
        assert "entry.pending_full" not in json.dumps(dst.refusal_counts())
    assert dst.ingest([_wire(src, child)]).pending == [child]
    assert dst.ingest([_wire(src, parent)]).accepted == [parent, child]
    assert dst.feeds() == src.feeds()
    storage.close()


# ============================================================================ a node, in-process
def _node_home(home: Path, memories: int = 10) -> None:
    with Node.open(home) as node:
        node.run("embedder.set", {"provider": "none"})
        agent_with_bank(node.run)
        node.run("memory.attach", {"bank": "notes", "agent": "alpha"})  # for auto-recall
        for i in range(memories):
            node.call_tool("alpha", "remember", {"key": f"k{i}", "value": f"deploy note {i}", "bank": "notes"})


def _recall(node: Node, query: str = "") -> dict[str, Any]:
    return node.call_tool("alpha", "recall", {"query": query, "bank": "notes", "limit": 50})


def test_recall_answers_when_nothing_can_be_written_and_remember_fails_clearly(tmp_path):
    home = tmp_path / "home"
    _node_home(home)
    with Node.open(home, create=False) as node:
        counted = {m["key"]: m["access_count"] for m in _recall(node)["memories"]}
        with no_writes(node.storage):
            found = _recall(node, "deploy")
            assert sorted(m["key"] for m in found["memories"]) == sorted(f"k{i}" for i in range(10))
            # The use could not be counted: the counts are as they were, and the read answered.
            assert {m["key"]: m["access_count"] for m in found["memories"]} == counted
            assert "## Relevant Memories" in node.auto_recall("alpha", ["what about the deploy note"])
            with pytest.raises(ReadOnlyError):
                node.call_tool("alpha", "remember", {"key": "small", "value": "tiny", "bank": "notes"})
        assert {m["key"]: m["access_count"] for m in _recall(node)["memories"]} == {k: n + 1 for k, n in counted.items()}
        with disk_full(node.storage):
            with pytest.raises(DiskFullError) as err:
                node.call_tool("alpha", "remember", {"key": "big", "value": BIG[:60_000], "bank": "notes"})
            assert str(err.value) == full_message(str(home / "node.sqlite"))
            assert "big" not in {m["key"] for m in _recall(node)["memories"]}
        node.call_tool("alpha", "remember", {"key": "big", "value": BIG[:60_000], "bank": "notes"})
        assert len(_recall(node)["memories"]) == 11


# ============================================================================ serve processes
def mm(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "--home", str(home), *args], capture_output=True, text=True, timeout=60)


def fill_disk(serve: Serve) -> int:
    """From now on no file of ``serve`` may grow past the size its WAL has reached: the next
    write fails. Returns the limit. (No checkpoint restarts the WAL below 1,000 pages, which
    these small homes never reach, so the limit holds.)"""
    assert serve.proc is not None
    wal = serve.home / "node.sqlite-wal"
    limit = max(wal.stat().st_size, 4096)
    resource.prlimit(serve.proc.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    return limit


def free_space(serve: Serve) -> None:
    assert serve.proc is not None
    resource.prlimit(serve.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def _recalled(serve: Serve) -> list[str]:
    """Recall through serve's control channel (what `memmesh recall` does, without a new process)."""
    data = serve.run("recall", {"agent": "alpha", "query": "", "bank": "notes", "limit": 50}).data
    return sorted(m["key"] for m in data["memories"])


def _keys(out: subprocess.CompletedProcess) -> list[str]:
    assert out.returncode == 0, out
    return sorted(m["key"] for m in json.loads(out.stdout)["memories"])


def _feed_is_whole(home: Path, bank: str, agent: str) -> list[Entry]:
    """Every entry ``agent`` signed in ``bank``, checked: one per seq from 0, each naming the one
    before it, all accepted, nobody flagged for equivocation."""
    with Node.open(home, create=False) as node:
        db = node.agents.resolve(bank).db
        author = str(node.load_key(next(a for a in node.agents.agents() if a.name == agent).key_name).public)
        mine = sorted((e for e in (db.entry(i) for i in db.accepted_ids()) if e and e.author_key == author),
                      key=lambda e: e.seq)
        assert not db.equivocators and len(db.accepted_ids()) == len(db)
        assert [e.seq for e in mine] == list(range(len(mine)))
        assert all(e.prev == (mine[i - 1].id if i else None) for i, e in enumerate(mine))
        return mine


@pytest.mark.slow
def test_serve_on_a_full_disk_refuses_writes_clearly_keeps_reading_and_resumes(tmp_path):
    home = tmp_path / "home"
    _node_home(home, memories=0)
    with processes() as procs:
        serve = procs.serve(home).start().wait_ready()
        for i in range(12):
            serve.run("remember", {"agent": "alpha", "key": f"k{i}", "value": f"deploy note {i}", "bank": "notes"})
        earlier = sorted(f"k{i}" for i in range(12))
        fill_disk(serve)

        out = mm(home, "remember", "alpha", "k-full", "written while the disk is full", "--bank", "notes")
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 1 and len(lines) == 1, out
        assert lines[0].startswith(f"memmesh: error: {home / 'node.sqlite'} reached this process's file size "
                                   "limit"), lines
        assert "nothing was written; raise the limit and retry" in lines[0]
        # Reads go on: recall (whose access counts cannot be written) and status.
        assert _keys(mm(home, "--json", "recall", "alpha", "deploy", "--bank", "notes", "--limit", "50")) == earlier
        assert _recalled(serve) == earlier
        assert serve.run("status", {}).data["databases"]

        free_space(serve)
        serve.run("remember", {"agent": "alpha", "key": "k-after", "value": "written once space returned",
                               "bank": "notes"})
        assert serve.stop() == 0
        serve.start().wait_ready()  # what was acknowledged is what a new process finds
        assert _recalled(serve) == sorted(earlier + ["k-after"])
        assert serve.stop() == 0
    assert len(_feed_is_whole(home, "notes", "alpha")) == 13
    if "check" in REGISTRY.names():  # `memmesh check` (issue 13, part 2) verifies the whole home
        out = mm(home, "check")
        assert out.returncode == 0, out


def _bank_status(serve: Serve, bank: str) -> dict[str, Any]:
    data = serve.run("status", {}).data
    return next(d for d in data["databases"] if d["bank"] == bank)


@pytest.mark.slow
def test_entries_a_full_node_cannot_store_are_not_acknowledged_and_come_later(tmp_path):
    """A writes while B's disk is full: B answers A's pushes with an error (503 sync.storage),
    never a success listing them; B's own pulls fail the same way; B refuses nothing and A counts
    no refusal; once B has space again, everything arrives."""
    homes = [tmp_path / "a", tmp_path / "b"]
    for h in homes:
        with Node.open(h) as node:
            node.run("embedder.set", {"provider": "none"})
    with processes() as procs:
        a, b = (procs.serve(h, interval=0.5).start() for h in homes)
        a.wait_ready(), b.wait_ready()
        agent_with_bank(a.run)
        a.run("remember", {"agent": "alpha", "key": "first", "value": "before the disk filled", "bank": "notes"})
        ticket = a.run("memory.share", {"bank": "notes", "perm": "read"}).data["ticket"]
        b_bank = b.run("memory.import", {"ticket": ticket, "perm": "read"}).data["name"]
        until(lambda: _bank_status(b, b_bank)["entries"] == _bank_status(a, "notes")["entries"], 20,
              "B to hold the bank")
        # A pushes to the peers it knows: wait until it knows B (peer exchange) before B fills up.
        until(lambda: any(p["peer"] == b.node_key and p["last_exchange_ms"]
                          for p in _bank_status(a, "notes")["sync"]["peers"]), 20, "A to sync with B")
        fill_disk(b)

        for i in range(5):
            a.run("remember", {"agent": "alpha", "key": f"late{i}", "value": f"written while B is full {i}",
                               "bank": "notes"})
        want = _bank_status(a, "notes")["entries"]

        def refused_by_b() -> dict[str, Any] | None:
            peers = _bank_status(a, "notes")["sync"]["peers"]
            link = next((p for p in peers if p["peer"] == b.node_key), None)
            return link if link and link["last_error"] and "sync.storage" in link["last_error"] else None
        link = until(refused_by_b, 20, "A's link to B to report B's storage failure")
        assert link["peer_lacks"] > 0 and "could not write" in link["last_error"], link
        assert link["refused"] == {}  # nothing of A's was refused
        assert _bank_status(b, b_bank)["entries"] < want
        assert "entry.pending_full" not in json.dumps(_bank_status(b, b_bank)["refused"])

        free_space(b)
        until(lambda: _bank_status(b, b_bank)["entries"] == want, 30, "B to catch up once space returned")
        assert _bank_status(b, b_bank)["heads"] == _bank_status(a, "notes")["heads"]
        assert _bank_status(b, b_bank)["refused"] == {}
