"""View snapshots (node/memory/snapshot.py): a view opened from its snapshot shows exactly what a
view rebuilt from the log shows, and a snapshot that does not match the log is never used.

Real SQLite files and real keys; "shows exactly" is checked with the view's fingerprint (every
row, column, label, vector bit, timeline and BM25 statistic, whatever the doc numbering) and
with recall answers, scores included.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.crdt.database import Database
from memmesh.node.memory.rows import MEMORY_STORE, embedding_store, embedding_value, memory_value
from memmesh.node.memory.snapshot import Snapshots
from memmesh.node.memory.view import MemoryView
from memmesh.node.storage import SqliteStorage
from tests.dbkit import feed, grant, key, new_db, revoke

ADMIN, ALICE, BOB = key(1), key(2), key(3)
STORE = embedding_store("test", "hand-4")
DIM = 4
WORDS = ["cats", "dogs", "plans", "deploy", "garden", "lunch", "rain", "paris", "budget", "tea"]
QUERIES = ["cats plans", "deploy garden rain", "budget", "lunch tea paris", ""]


def vec(i: int) -> np.ndarray:
    rnd = np.random.default_rng(i)
    return rnd.standard_normal(DIM).astype(np.float32)


def write(db: Database, who, start: int, n: int, *, keys: int = 40, with_vectors: bool = True,
          supersede_every: int = 0) -> str:
    """One entry of ``n`` memories (keys repeat, so rows supersede each other) with vectors."""
    txn = db.transaction(who)
    for i in range(start, start + n):
        fields = {}
        if supersede_every and i % supersede_every == 0:
            fields["edges"] = [{"type": "supersedes", "to": f"k{(i + 1) % keys}"}]
        words = " ".join(WORDS[(i * j) % len(WORDS)] for j in range(1, 4))
        row = txn.append(MEMORY_STORE, memory_value(f"k{i % keys}", f"note {i}: {words}", ["t"], **fields))
        if with_vectors and i % 3:
            txn.append(STORE, embedding_value(row, vec(i)))
    return txn.commit()


def open_db(path: Path) -> tuple[SqliteStorage, Database]:
    storage = SqliteStorage(path)
    return storage, Database.open(storage, storage.databases()[0])


def view(db: Database, snaps: Snapshots | None) -> MemoryView:
    return MemoryView(db, embedding_store=STORE, dim=DIM, snapshots=snaps)


def answers(v: MemoryView) -> list:
    out = []
    for q in QUERIES:
        for qv in (None, vec(len(q))):
            out.append([(m.key, m.value, m.entry_id, s) for m, s in
                        v.recall(q, query_vector=qv, with_scores=True, include_superseded=bool(len(q) % 2), limit=20)])
    return out


def assert_same_as_rebuild(v: MemoryView, db: Database) -> None:
    rebuilt = view(db, None)
    assert rebuilt.opened_from == "log"
    assert v.fingerprint() == rebuilt.fingerprint()
    assert answers(v) == answers(rebuilt)
    rebuilt.close()


@pytest.fixture
def bank(tmp_path):
    storage = SqliteStorage(tmp_path / "bank.sqlite")
    db = new_db(ADMIN, storage)
    grant(db, ADMIN, ALICE, "write", 10)
    grant(db, ADMIN, BOB, "write", 10)
    for j in range(6):
        write(db, ALICE if j % 2 else BOB, j * 50, 50, supersede_every=7)
    storage.close()
    return tmp_path / "bank.sqlite", Snapshots(tmp_path / "views", min_docs=1)


def test_a_view_opened_from_its_snapshot_shows_what_a_rebuild_shows(bank):
    path, snaps = bank
    storage, db = open_db(path)
    v = view(db, snaps)
    assert v.opened_from == "log" and v.snapshot_note == "no snapshot"
    assert v.save_snapshot()
    write(db, ALICE, 1000, 30, supersede_every=5)  # after the snapshot: applied on opening
    before = v.fingerprint()
    v.close()
    storage.close()

    storage, db = open_db(path)
    v = view(db, snaps)
    assert v.opened_from == "snapshot"
    assert v.fingerprint() == before
    assert_same_as_rebuild(v, db)
    write(db, BOB, 2000, 20)  # it goes on following the database
    assert_same_as_rebuild(v, db)
    storage.close()


def test_a_view_mapped_from_its_snapshot_is_unchanged_when_the_file_is_replaced_or_removed(bank):
    # An opened view's arrays are the snapshot file's pages (copy-on-write): writes to the view
    # must not reach the file, and a new snapshot renamed over it, or its removal, must not
    # change what the open view shows.
    path, snaps = bank
    storage, db = open_db(path)
    first = view(db, snaps)
    first.save_snapshot()
    first.close()
    (file,) = snaps.files()
    on_disk = file.read_bytes()
    v = view(db, snaps)
    assert v.opened_from == "snapshot"
    write(db, ALICE, 3000, 40, supersede_every=3)  # rows change the mapped arrays: private pages
    assert file.read_bytes() == on_disk
    assert_same_as_rebuild(v, db)
    other = view(db, snaps)  # another view of the same file, opened from it, writes its own snapshot
    assert other.opened_from == "snapshot"
    write(db, BOB, 4000, 30)
    other.save_snapshot()  # renamed over the file v was mapped from
    assert file.read_bytes() != on_disk
    assert_same_as_rebuild(v, db)
    file.unlink()
    write(db, ALICE, 5000, 20)
    assert_same_as_rebuild(v, db)
    assert_same_as_rebuild(other, db)
    storage.close()


def test_a_snapshot_of_a_small_view_is_not_written(tmp_path):
    storage = SqliteStorage(tmp_path / "b.sqlite")
    db = new_db(ADMIN, storage)
    write(db, ADMIN, 0, 10)
    v = view(db, Snapshots(tmp_path / "views", min_docs=50))
    assert not v.snapshot_due
    write(db, ADMIN, 10, 45)
    assert v.snapshot_due
    assert v.save_snapshot() and not v.snapshot_due


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at % len(data)] ^= 0x5A  # another byte, whatever it held
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["magic", "stream", "body", "header", "length", "checksum", "cut", "empty", "garbage"])
def test_a_damaged_snapshot_is_discarded_and_the_view_rebuilt(bank, where):
    path, snaps = bank
    storage, db = open_db(path)
    v = view(db, snaps)
    v.save_snapshot()
    v.close()
    (file,) = snaps.files()
    size = file.stat().st_size
    if where == "cut":
        file.write_bytes(file.read_bytes()[: size // 2])
    elif where == "empty":
        file.write_bytes(b"")
    elif where == "garbage":
        file.write_bytes(os.urandom(4096))
    else:
        _flip(file, {"magic": 2, "stream": 20, "body": size // 2, "header": size - 40, "length": size - 6,
                     "checksum": size - 1}[where])
    v = view(db, snaps)
    assert v.opened_from == "log"
    assert "damaged" in v.snapshot_note or "not a view snapshot" in v.snapshot_note
    assert not file.exists()  # removed: the next good state writes a new one
    assert_same_as_rebuild(v, db)
    storage.close()


def _rewrite_header(file: Path, change) -> None:
    """A well-formed file (sizes and checksum made right again) whose header says something else."""
    data = file.read_bytes()
    hlen = int.from_bytes(data[-8:-4], "little")
    header = json.loads(data[-8 - hlen:-8])
    change(header)
    new = json.dumps(header).encode()
    out = data[:-8 - hlen] + new + len(new).to_bytes(4, "little")
    file.write_bytes(out + zlib.crc32(out).to_bytes(4, "little"))


@pytest.mark.parametrize("change, note", [
    (lambda h: h.update(code="0" * 64), "another version"),
    (lambda h: h.update(format=99), "another version"),
    (lambda h: h.update(db="sha256:" + "0" * 64), "another database"),
    (lambda h: h.update(dim=8), "another database"),
])
def test_a_snapshot_of_another_version_or_database_is_not_used(bank, change, note):
    path, snaps = bank
    storage, db = open_db(path)
    v = view(db, snaps)
    v.save_snapshot()
    v.close()
    (file,) = snaps.files()
    _rewrite_header(file, change)
    v = view(db, snaps)
    assert v.opened_from == "log" and note in v.snapshot_note
    assert_same_as_rebuild(v, db)
    storage.close()


def test_a_snapshot_made_stale_by_a_revocation_is_not_used(tmp_path):
    # Alice's side holds rows she wrote while the admin was revoking her; its snapshot holds
    # them. The revocation arrives while no view is open: the snapshot must not bring them back.
    admin_storage = SqliteStorage(tmp_path / "admin.sqlite")
    admin_db = new_db(ADMIN, admin_storage)
    grant(admin_db, ADMIN, ALICE, "write", 10)
    write(admin_db, ALICE, 0, 30)
    alice_storage = SqliteStorage(tmp_path / "alice.sqlite")
    alice_storage.add_database(admin_db.id)
    alice_db = Database(alice_storage, admin_db.id)
    feed(alice_db, admin_db)
    revoke(admin_db, ADMIN, ALICE)  # not yet seen by Alice's side
    write(alice_db, ALICE, 100, 30)
    snaps = Snapshots(tmp_path / "views", min_docs=1)
    v = view(alice_db, snaps)
    assert any(m.value.startswith("note 100:") for m in v.memories(include_superseded=True))
    v.save_snapshot()
    v.close()
    alice_storage.close()

    alice_storage, alice_db = open_db(tmp_path / "alice.sqlite")
    feed(alice_db, admin_db)  # no view open: nothing but the snapshot remembers the voided rows
    v = view(alice_db, snaps)
    assert v.opened_from == "log" and "stale" in v.snapshot_note
    assert not any(m.value.startswith("note 100:") for m in v.memories(include_superseded=True))
    assert_same_as_rebuild(v, alice_db)
    alice_storage.close()


def test_a_snapshot_made_stale_by_an_erasure_is_not_used(bank):
    path, snaps = bank
    storage, db = open_db(path)
    v = view(db, snaps)
    entry = write(db, ALICE, 500, 10)
    assert any(m.entry_id == entry for m in v.memories(include_superseded=True))
    v.save_snapshot()
    v.close()
    db.erase(ADMIN, entry, MEMORY_STORE)
    v = view(db, snaps)
    assert v.opened_from == "log" and "stale" in v.snapshot_note
    assert not any(m.entry_id == entry for m in v.memories(include_superseded=True))
    assert_same_as_rebuild(v, db)
    storage.close()


def test_writes_during_a_snapshot_are_neither_lost_nor_counted_twice(bank):
    path, snaps = bank
    storage, db = open_db(path)
    v = view(db, snaps)
    done = threading.Event()
    saved = []

    def saver() -> None:
        while not done.is_set():
            saved.append(v.save_snapshot())

    t = threading.Thread(target=saver)
    t.start()
    deadline = time.monotonic() + 120
    j = 0
    try:
        # The database's thread writes while snapshots are taken, until several were written
        # during the writes (however slowly the saving thread runs).
        while (j < 40 or len(saved) < 3) and time.monotonic() < deadline:
            write(db, ALICE if j % 2 else BOB, 5000 + j * 5, 5, supersede_every=3)
            j += 1
            time.sleep(0.002)
    finally:
        done.set()
        t.join()
    assert len(saved) >= 3 and all(saved)
    v.close()
    v = view(db, snaps)
    assert v.opened_from == "snapshot"
    assert_same_as_rebuild(v, db)
    storage.close()


rows = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 12), st.booleans(), st.booleans()), min_size=1, max_size=8)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=rows, after=rows, vectors_first=st.booleans())
def test_property_snapshot_then_more_rows_equals_a_rebuild(tmp_path_factory, before, after, vectors_first):
    tmp = tmp_path_factory.mktemp("prop")
    storage = SqliteStorage(tmp / "b.sqlite")
    db = new_db(ADMIN, storage)
    grant(db, ADMIN, ALICE, "write", 10)
    grant(db, ADMIN, BOB, "write", 10)
    who = [ADMIN, ALICE, BOB]
    snaps = Snapshots(tmp / "views", min_docs=1)
    start = 0
    for author, n, sup, vecs in before:
        write(db, who[author], start, n, keys=9, with_vectors=vecs, supersede_every=4 if sup else 0)
        start += n
    v = view(db, snaps)
    v.save_snapshot()
    v.close()
    for author, n, sup, vecs in after:
        write(db, who[author], start, n, keys=9, with_vectors=vecs, supersede_every=3 if sup else 0)
        start += n
    if vectors_first:  # a late reindex: vectors written after their rows, in entries of their own
        txn = db.transaction(ADMIN)
        for m in MemoryView(db).memories()[:3]:
            txn.append(STORE, embedding_value(m.row_key, vec(7)))
        txn.commit()
    v = view(db, snaps)
    assert v.opened_from == "snapshot"
    assert_same_as_rebuild(v, db)
    storage.close()


WRITER = Path(__file__).with_name("snapshot_writer.py")


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.2, 0.6, 1.3])
def test_a_kill_9_while_a_snapshot_is_written_leaves_a_view_that_shows_what_a_rebuild_shows(tmp_path, delay):
    db_path, views = tmp_path / "bank.sqlite", tmp_path / "views"
    proc = subprocess.Popen([sys.executable, str(WRITER), str(db_path), str(views)], stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).parents[1])
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the writer says when it has written its first snapshot
        assert line.strip() == "saved", line
        time.sleep(delay)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    storage, db = open_db(db_path)
    snaps = Snapshots(views, min_docs=1)
    v = view(db, snaps)
    assert v.opened_from in ("snapshot", "log")
    assert_same_as_rebuild(v, db)
    v.save_snapshot()
    assert not [p for p in views.iterdir() if ".tmp." in p.name]  # the dead writer's file is gone
    storage.close()


# ------------------------------------------------------------------------------ the node
def _fill(node, bank: str, n: int, start: int = 0) -> None:
    """``n`` memories of ``bank`` written by alpha, 200 to an entry, with the embedder's vectors."""
    agent = node.agents.agent("alpha")
    target = node.agents.open_for(agent, bank, "write")
    embedder = node.memory.embedder
    for a in range(start, start + n, 200):
        txn = target.db.transaction(agent.key)
        for i in range(a, min(start + n, a + 200)):
            row = memory_value(f"note-{i}", f"note {i} about {WORDS[i % len(WORDS)]} and {WORDS[i % 7]}", ["t"])
            row_key = txn.append(MEMORY_STORE, row)
            txn.append(embedder.store_name, embedding_value(row_key, embedder.embed([row["value"]])[0]))
        txn.commit()


def _bank_view(node, bank: str) -> MemoryView:
    db = node.agents.open_for(node.agents.agent("alpha"), bank, "read").db
    return node.memory.view(db)


def _recall(node, query: str) -> list:
    out = node.call_tool("alpha", "recall", {"query": query, "bank": "big", "limit": 20})
    return [(r["key"], r["entry"]) for r in out["memories"]]


def _big_home(home: Path, extra: int):
    """A new home whose agent alpha writes a bank "big" of MIN_DOCS + ``extra`` memories (with the
    hashed embedder's vectors): large enough for a snapshot. The node, still open."""
    from memmesh.node import Node
    from memmesh.node.memory.snapshot import MIN_DOCS
    from tests.homes import agent_with_bank

    node, _ = Node.init(home)
    node.run("embedder.set", {"provider": "hashed"})
    agent_with_bank(node.run, bank="big")
    _fill(node, "big", MIN_DOCS + extra)
    return node


def test_a_node_keeps_its_views_on_disk_and_check_compares_them_with_a_rebuild(tmp_path):
    from memmesh.node import Node

    home = tmp_path / "home"
    with _big_home(home, 100) as node:
        first = _recall(node, "cats garden")
        assert _bank_view(node, "big").opened_from == "log"
    assert len(list((home / "views").glob("*.view"))) == 1  # written on closing: the bank's view only

    with Node.open(home) as node:
        assert _recall(node, "cats garden") == first
        assert _bank_view(node, "big").opened_from == "snapshot"
        _fill(node, "big", 50, start=10_000)  # not enough for a new snapshot: applied on opening
        after = _recall(node, "cats garden 10001")
    with Node.open(home) as node:
        assert _recall(node, "cats garden 10001") == after
        assert _bank_view(node, "big").opened_from == "snapshot"
        report = node.run("check", {}).data
    (big,) = [d for d in report["databases"] if d["name"] == "big"]
    assert [v["verdict"] for v in big["views"]] == ["matches a rebuild"] and report["healthy"]

    (file,) = (home / "views").glob("*.view")
    _flip(file, file.stat().st_size // 3)
    with Node.open(home) as node:
        report = node.run("check", {}).data
        (big,) = [d for d in report["databases"] if d["name"] == "big"]
        assert big["views"][0]["verdict"].startswith("not used: damaged") and report["healthy"]
        assert file.exists()  # a check only reads
        assert _recall(node, "cats garden 10001") == after
        assert _bank_view(node, "big").opened_from == "log"


def test_a_view_closed_over_the_memory_budget_keeps_its_snapshot_first(bank, tmp_path):
    from memmesh.node.memory.open_views import OpenViews

    path, snaps = bank
    storage, db = open_db(path)
    other = new_db(ADMIN, SqliteStorage(tmp_path / "other.sqlite"))
    write(other, ADMIN, 0, 5)
    views = OpenViews(lambda: 0, keep_recent=0)  # every idle built view is over the budget
    big = view(db, snaps)
    views.add(db.id, big)
    expected = big.fingerprint()
    views.add(other.id, view(other, None))  # the big one goes
    assert db.id not in views
    deadline = time.monotonic() + 60
    while not snaps.files() and time.monotonic() < deadline:  # renamed into place once whole
        time.sleep(0.05)
    again = view(db, snaps)
    assert again.opened_from == "snapshot" and again.fingerprint() == expected
    storage.close()


def test_check_reports_a_snapshot_that_differs_from_a_rebuild_as_damage_and_repair_removes_it(tmp_path):
    # A snapshot that passes every check of its own but holds another value than the log (what a
    # bug of the writer would leave): check must find it by comparing with a rebuild.
    from memmesh.node import Node
    from memmesh.node.integrity import check_home
    from memmesh.node.memory.snapshot import Meta

    home = tmp_path / "home"
    with _big_home(home, 10) as node:
        db_id = _bank_view(node, "big").db.id
        store, dim = node.memory.embedder.store_name, node.memory.embedder.dim
    snaps = Snapshots(home / "views")
    state = snaps.read(db_id, store, dim)
    rows = state["ix"].mem  # doc 0's record rewritten in place: another value of the same size
    a, b = int(rows._offsets[0]), int(rows._offsets[1])
    record = list(msgpack.unpackb(rows._blob[a:b].tobytes()))
    record[1] = "#" * len(record[1].encode())
    rows._blob[a:b] = np.frombuffer(msgpack.packb(record), dtype=np.uint8)
    assert rows[0].value == record[1]
    snaps.write(Meta(db_id, store, dim, len(rows)), state)

    with Node.open(home) as node:
        report = node.run("check", {}).data
    (big,) = [d for d in report["databases"] if d["name"] == "big"]
    assert big["views"][0]["verdict"] == "DIFFERS from a rebuild" and not report["healthy"]
    assert [p["code"] for p in big["problems"]] == ["view.snapshot"] and snaps.files()
    repaired = check_home(home, repair=True)
    assert not snaps.files() and repaired.healthy
    (big,) = [d for d in repaired.databases if d.name == "big"]
    assert big.views[0]["verdict"] == "DIFFERS from a rebuild; removed"
