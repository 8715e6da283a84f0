"""Signatures checked ahead of their batch (crdt/verify_pipeline.py) change nothing but speed.

A history of real entries (real Ed25519 keys) is ingested into real SQLite twice: once batch by
batch with every signature checked in this process (no worker: the serial path), once through
``Database.ingest_batches`` (batch n+1's signatures checked by the worker process while batch n
is applied). Results, stored state, refusals and observer events must be identical, whatever
the split and wherever a forged entry sits.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.auth.ops import GrantOp
from memmesh.crdt.database import Database
from memmesh.crdt.entry import decode_many
from memmesh.crdt.storage import MemoryStorage
from memmesh.crdt.verify_pipeline import AheadVerifier
from memmesh.crdt.verify_process import SignatureWorker, shared_worker, verify_here, verify_split
from memmesh.node.storage import SqliteStorage
from tests.dbkit import craft, key, new_db, rows_update, write

Item = tuple[bytes, dict[str, bytes | None]]


def _history() -> list[Item]:
    """Root, grants, two writers interleaved, a revocation, and an outsider's entry."""
    admin, w1, w2, outsider = key(1), key(2), key(3), key(4)
    db = new_db(admin)
    db.change_settings(admin, [GrantOp(str(w1.public), "write", 10), GrantOp(str(w2.public), "write", 10)])
    for i in range(30):
        write(db, w1 if i % 3 else w2, {"key": f"k{i}", "value": f"memory {i}"})
    db.change_settings(admin, [GrantOp(str(w2.public), "read")])
    for i in range(30, 60):
        write(db, w1, {"key": f"k{i}", "value": f"memory {i}"})
    items = [(s.header, dict(s.payloads)) for s in db.storage.entries(db.id)]
    # Signed by a key the settings never name: refused for authorisation, never stored.
    stranger = craft(db, outsider, {"memory": rows_update(outsider, "memory", 0, [{"key": "x"}])})
    items.append((stranger.header, dict(stranger.payloads)))
    for i in range(60, 75):
        write(db, w1, {"key": f"k{i}", "value": f"memory {i}"})
    have = {h for h, _ in items}
    items += [(s.header, dict(s.payloads)) for s in db.storage.entries(db.id) if s.header not in have]
    return items


HISTORY = _history()
DB_ID = decode_many(HISTORY[:1])[0].id  # type: ignore[union-attr]


def _forge(item: Item) -> Item:
    header, payloads = item
    return header[:-1] + bytes([header[-1] ^ 1]), payloads


def _split(items: list[Item], cuts: list[int]) -> list[list[Item]]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(items)}), len(items)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:])]


class _Replica:
    """A database on a real SQLite file with every observer it offers recorded."""

    def __init__(self, path: Path, worker: SignatureWorker | None) -> None:
        storage = SqliteStorage(path)
        storage.add_database(DB_ID)
        self.db = Database(storage, DB_ID)
        if worker is not None:
            self.db._ahead._worker = worker
        self.events: list[Any] = []
        self.db.on_outcome(lambda o: self.events.append(("outcome", o.source, o.accepted, tuple(
            (r.id, r.author, r.reason, r.detail, r.source) for r in o.refused))))
        self.db.on_stored(lambda ids: self.events.append(("stored", tuple(ids))))
        self.db.subscribe(lambda ev: self.events.append(("rows", repr(ev))))

    def state(self) -> dict[str, Any]:
        db = self.db
        ids = sorted(s.id for s in db.storage.entries(db.id))
        refused = {}
        for r in db.recent_refusals(limit=1 << 20):
            refused[r.id] = (r.reason, r.detail, r.source)
        return {"stored": ids, "accepted": sorted(db.accepted_ids()), "pending": sorted(db.pending_ids()),
                "heads": db.heads, "rows": [(r.entry_id, r.key, r.value, r.order) for r in db.rows("memory")] if "memory" in db.stores()
                else [], "refused": refused, "refusal_counts": db.refusal_counts(), "len": len(db)}


def _results(results: list[Any]) -> list[Any]:
    return [(r.accepted, r.stored_rejected, r.rejected, r.pending, r.filled, r.duplicates) for r in results]


def _serial(path: Path, batches: list[list[Item]]) -> tuple[list[Any], dict[str, Any], list[Any]]:
    rep = _Replica(path, SignatureWorker(spawn=False))
    results = [rep.db.ingest(b, source="peer:x") for b in batches]
    return _results(results), rep.state(), rep.events


def _overlapped(path: Path, batches: list[list[Item]], worker: SignatureWorker | None = None
                ) -> tuple[list[Any], dict[str, Any], list[Any]]:
    rep = _Replica(path, worker)
    results = list(rep.db.ingest_batches(batches, source="peer:x"))
    return _results(results), rep.state(), rep.events


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(1, len(HISTORY) - 1), max_size=6),
       forged=st.one_of(st.none(), st.integers(1, len(HISTORY) - 1)))
def test_any_split_and_any_forgery_give_the_serial_results(tmp_path_factory, cuts, forged):
    items = list(HISTORY)
    if forged is not None:
        items[forged] = _forge(items[forged])
    batches = _split(items, cuts)
    tmp = tmp_path_factory.mktemp("overlap")
    serial = _serial(tmp / "serial.sqlite", batches)
    overlapped = _overlapped(tmp / "overlap.sqlite", batches)
    assert overlapped[0] == serial[0]
    assert overlapped[1] == serial[1]
    assert overlapped[2] == serial[2]
    if forged is not None:
        forged_id = decode_many([items[forged]], expected_db=DB_ID)[0]
        assert getattr(forged_id, "reason", None) == "entry.signature"
        assert any(r[1] == "entry.signature" for res in overlapped[0] for r in res[2])
    else:
        assert not any(r[1] == "entry.signature" for res in overlapped[0] for r in res[2])


def test_a_forgery_in_the_next_batch_leaves_this_batch_alone(tmp_path):
    first, second = HISTORY[:40], list(HISTORY[40:])
    second[5] = _forge(second[5])
    rep = _Replica(tmp_path / "a.sqlite", None)
    results = list(rep.db.ingest_batches([first, second]))
    assert rep.db._ahead.from_worker > 0  # the second batch was decoded and checked by the worker
    assert results[0].rejected == [] and len(results[0].accepted) + len(results[0].stored_rejected) >= 39
    assert [r[1] for r in results[1].rejected if r[1] == "entry.signature"] == ["entry.signature"]
    forged_digest = results[1].rejected[0][0]
    assert forged_digest not in rep.db.accepted_ids() and not rep.db._log.get(forged_digest)
    assert rep.db.refusal(forged_digest).reason == "entry.signature"
    # Its descendants wait for it: nothing after a forged entry is applied on its strength.
    assert rep.db.pending_ids()


def test_a_tampered_body_is_refused_as_by_the_serial_path(tmp_path):
    batches = [list(HISTORY[:30]), list(HISTORY[30:])]
    header, payloads = batches[1][3]
    ts_at = header.index(b"\xa2ts") + 3  # the ts field's value: still canonical msgpack when changed
    tampered = header[:ts_at + 1] + bytes([header[ts_at + 1] ^ 1]) + header[ts_at + 2:]
    batches[1][3] = (tampered, payloads)
    serial = _serial(tmp_path / "s.sqlite", batches)
    overlapped = _overlapped(tmp_path / "o.sqlite", batches)
    assert overlapped == serial
    assert any(r[1] == "entry.signature" for r in overlapped[0][1][2])


def test_replays_are_idempotent(tmp_path):
    batches = _split(list(HISTORY), [20, 45, 70])
    rep = _Replica(tmp_path / "r.sqlite", None)
    first = list(rep.db.ingest_batches(batches))
    state = rep.state()
    again = list(rep.db.ingest_batches(batches))
    after = rep.state()
    # Only the count of refusals grows: the outsider's entry is refused (and counted) again.
    assert after.pop("refusal_counts") != state.pop("refusal_counts")
    assert after == state
    assert sum(r.duplicates for r in again) == sum(len(r.accepted) + len(r.stored_rejected) for r in first)
    assert all(not r.accepted and not r.pending for r in again)
    ref = _Replica(tmp_path / "s.sqlite", SignatureWorker(spawn=False))
    serial = [ref.db.ingest(b) for b in batches + batches]
    assert _results(first + again) == _results(serial) and ref.events == rep.events


def test_a_worker_that_dies_changes_no_verdict(tmp_path):
    worker = SignatureWorker()
    items = list(HISTORY)
    items[50] = _forge(items[50])
    batches = _split(items, [25, 50])
    serial = _serial(tmp_path / "s.sqlite", batches)
    rep = _Replica(tmp_path / "o.sqlite", worker)
    results = [rep.db.ingest(batches[0], source="peer:x")]
    rep.db.verify_ahead(batches[1])
    rep.db.verify_ahead(batches[2])
    assert worker._proc is not None
    worker._proc.kill()  # the worker dies with both batches owed
    worker._proc.wait()
    results += [rep.db.ingest(b, source="peer:x") for b in batches[1:]]
    # What it answered before dying may be used; the rest was checked here.
    assert rep.db._ahead.from_worker < sum(len(b) for b in batches[1:])
    assert (_results(results), rep.state(), rep.events) == serial
    worker.shutdown()


def test_verdicts_match_the_serial_check_for_good_and_bad_signatures():
    triples = []
    for i, (header, _p) in enumerate(HISTORY):
        entry = decode_many([(header, None)])[0]
        sig = header[-64:] if i % 4 else bytes([header[-64] ^ 0x80]) + header[-63:]
        triples.append((entry.author, header[1:-66], sig))  # type: ignore[union-attr]
    triples.append((bytes(32), b"x", bytes(64)))  # an author that is not a curve point
    worker = SignatureWorker()
    try:
        assert verify_split(triples, worker) == verify_here(triples)
        assert any(verify_here(triples)) and not all(verify_here(triples))
    finally:
        worker.shutdown()


def test_announced_batches_that_never_arrive_stay_bounded():
    # A worker of its own: the shared one may hold other tests' replies, which are theirs to collect.
    ahead = AheadVerifier(SignatureWorker())
    storage = MemoryStorage()
    storage.add_database(DB_ID)
    ahead.ahead(HISTORY)
    ahead.ahead(HISTORY)  # the same headers again: announced once
    assert len(ahead._slots) <= len(HISTORY)
    for start in range(0, len(HISTORY) - 16, 4):  # many batches announced, none ingested
        ahead.ahead(HISTORY[start:start + 17])
    assert len(ahead._open) <= 4
    assert {slot.ticket for slot in ahead._slots.values()} == set(ahead._open)
    ahead.forget()
    try:
        assert not ahead._slots and not ahead._open
        # Released tickets are dropped as their last answers arrive, and nothing else is kept.
        deadline = time.monotonic() + 30
        while ahead._worker._tickets and time.monotonic() < deadline:
            with ahead._worker._lock:
                ahead._worker._pump(0.05)
        assert not ahead._worker._tickets
    finally:
        ahead._worker.shutdown()


def test_no_thread_is_left_and_the_worker_stops_with_the_process(tmp_path):
    before = set(threading.enumerate())
    rep = _Replica(tmp_path / "t.sqlite", None)
    list(rep.db.ingest_batches(_split(list(HISTORY), [30, 60])))
    assert set(threading.enumerate()) == before
    # A process that ingested and exits without closing anything: it exits, and so does its worker.
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        from tests.test_ingest_overlap import HISTORY, DB_ID, _split
        from memmesh.crdt.database import Database
        from memmesh.crdt.storage import MemoryStorage
        from memmesh.crdt.verify_process import shared_worker
        storage = MemoryStorage(); storage.add_database(DB_ID)
        db = Database(storage, DB_ID)
        list(db.ingest_batches(_split(list(HISTORY), [30, 60])))
        db.verify_ahead(HISTORY)  # owed verdicts nobody collects
        print(shared_worker()._proc.pid, flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pid = int(proc.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return True


def test_the_shared_worker_can_be_stopped_and_started_again(tmp_path):
    worker = shared_worker()
    rep = _Replica(tmp_path / "w.sqlite", None)
    list(rep.db.ingest_batches(_split(list(HISTORY), [40])))
    worker.shutdown()
    assert worker._proc is None
    assert verify_split(list(_triples()), worker) == verify_here(_triples())


def _triples() -> list[tuple[bytes, bytes, bytes]]:
    out = []
    for header, _p in HISTORY:
        entry = decode_many([(header, None)])[0]
        out.append((entry.author, header[1:-66], header[-64:]))  # type: ignore[union-attr]
    return out


@pytest.fixture(autouse=True, scope="module")
def _stop_worker():
    yield
    shared_worker().shutdown()


def test_what_is_ingested_is_what_counts_not_what_was_announced(tmp_path):
    batches = _split(list(HISTORY), [30, 60])
    changed = [list(b) for b in batches]
    header, payloads = changed[1][4]
    changed[1][4] = (header, dict.fromkeys(payloads))  # the same header, payloads not carried
    header, payloads = changed[1][6]
    changed[1][6] = (header, {store: b"\x00" * len(p) if p else p for store, p in payloads.items()})  # damaged
    serial = _serial(tmp_path / "s.sqlite", changed)
    rep = _Replica(tmp_path / "o.sqlite", None)
    results = [rep.db.ingest(changed[0], source="peer:x")]
    rep.db.verify_ahead(batches[1])  # announced with the original payloads
    results.append(rep.db.ingest(changed[1], source="peer:x"))
    rep.db.verify_ahead(batches[2])
    results.append(rep.db.ingest(changed[2], source="peer:x"))
    assert rep.db._ahead.from_worker > 0
    assert (_results(results), rep.state(), rep.events) == serial
    assert any(r[1] == "entry.payload" for r in results[1].rejected)
