"""Adversarial tests of the receive path's bounds (crdt/database.py ``Database.ingest``).

Two classes of attack, with real Ed25519 keys and entries signed as an attacker would:

A. Pending flood: a throwaway key (never granted) sends orphans whose parents never arrive.
   The pending area must stay within its bounds per author, per source and in total, at every
   step and across a restart; orphans expire; honest entries that wait for their parents are
   still applied; evictions are counted against whoever sent the flood.
B. Revoked and flagged keys flooding: candidates and equivocation evidence are stored only up
   to MAX_UNACCEPTED_ENTRIES / MAX_UNACCEPTED_BYTES per author; malformed entries are refused
   with a structural reason whatever the author's standing; the result does not depend on the
   arrival order; ``explain`` answers for entries refused before storage.

Every refusal asserts its exact reason code and that stored and derived state did not change.
The tests after "found by review" each reproduce a misbehaviour a review of this file found
(and that was fixed): bounds bypassed by child-first delivery, evictions and expiries blamed on
the wrong source, the wrong author or source evicted for the bound that is exceeded.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import random
import tracemalloc
import types
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.crdt.database import MAX_UNACCEPTED_BYTES, MAX_UNACCEPTED_ENTRIES, Database
from memmesh.crdt.entry import Entry, client_id_for, id_of, sign_entry
from memmesh.crdt.pending import MiB, PendingLimits
from memmesh.crdt.storage import MemoryStorage, PendingRecord, StoredEntry
from memmesh.crdt.yjs import encode_rows
from memmesh.node.storage import SqliteStorage
from tests.dbkit import craft, feed, grant, key, new_db, next_clock, replica, revoke, rows_update, state, write

ADMIN, HONEST, REVOKED, FORKER, FORKER2, FORKER3 = key(1), key(2), key(3), key(4), key(5), key(6)
THROWAWAY = [key(100 + i) for i in range(8)]  # never granted anything
KiB = 1024

Item = tuple[bytes, dict[str, bytes | None]]


# ----------------------------------------------------------------------------- helpers
def _item(e: Entry | StoredEntry) -> Item:
    return (e.header, dict(e.payloads))


def _fake_id(rng: random.Random) -> str:
    return "sha256:" + rng.randbytes(32).hex()


def _orphan(db: Database, who, rng: random.Random, *, pad: int = 0, tag: str = "") -> Entry:
    """An entry by ``who`` whose only parent is a random id that never arrives."""
    value = f"orphan {tag} {rng.random()}" + "x" * pad
    return craft(db, who, {"memory": rows_update(who, "memory", 0, [value])},
                 parents=[_fake_id(rng)], seq=0, prev=None)


def _base() -> Database:
    """The database every replica starts from: an admin, an honest writer with one row."""
    base = new_db(ADMIN)
    grant(base, ADMIN, HONEST, "write")
    write(base, HONEST, {"key": "seed", "value": "before the flood"})
    return base


def _honest_entries(base: Database, n: int) -> tuple[Database, list[StoredEntry]]:
    """``n`` entries the honest writer makes on another replica (a chain: each names the
    previous one as its parent and prev)."""
    src = replica(base)
    ids = [write(src, HONEST, {"key": f"h{i}", "value": f"honest {i}"}) for i in range(n)]
    return src, [src.storage.get(src.id, i) for i in ids]


def _target(base: Database, storage, limits: PendingLimits | None = None,
            clock: Callable[[], int] | None = None) -> Database:
    storage.add_database(base.id)
    db = Database.open(storage, base.id, pending_limits=limits, clock=clock)
    feed(db, base)
    assert db.accepted_ids() == base.accepted_ids()
    return db


def _stored_ids(db: Database) -> set[str]:
    return {s.id for s in db.storage.entries(db.id)}


def _stored_bytes(db: Database) -> int:
    return sum(s.size for s in db.storage.entries(db.id))


def _author_stored(db: Database, who) -> int:
    author = str(who.public)
    return sum(1 for i in _stored_ids(db) if db.entry(i).author_key == author)


def _honest_values(db: Database) -> list[str]:
    return [r.value["value"] for r in db.rows("memory") if r.author == str(HONEST.public)]


def _check_pending_bounds(db: Database, limits: PendingLimits) -> list[PendingRecord]:
    """The pending area, in storage and in memory, within every bound; returns the records."""
    records = db.storage.pending(db.id)
    ids = [r.id for r in records]
    assert len(ids) == len(set(ids))
    assert set(ids) == set(db.pending_ids())
    assert len(records) == len(db._pending) <= limits.total_entries
    total = sum(r.size for r in records)
    assert total == db._pending.nbytes <= limits.total_bytes
    for field, max_entries, max_bytes in (("author", limits.author_entries, limits.author_bytes),
                                          ("source", limits.source_entries, limits.source_bytes)):
        counts: Counter[str] = Counter()
        sizes: Counter[str] = Counter()
        for r in records:
            counts[getattr(r, field)] += 1
            sizes[getattr(r, field)] += r.size
        for name in counts:
            assert counts[name] <= max_entries, (field, name, counts[name])
            assert sizes[name] <= max_bytes, (field, name, sizes[name])
    return records


def _reasons(result) -> list[str]:
    return [reason for _id, reason, _detail in result.rejected]


def _chain(who, n: int, *, seq: int, prev: str | None, parents: Sequence[str], clock: int,
           pad: int = 0, tag: str = "c", db_id: str) -> list[Entry]:
    """``n`` entries on ``who``'s own feed from (seq, prev), each the parent of the next, with
    contiguous clocks in the memory store: what a key that keeps writing would sign."""
    out: list[Entry] = []
    for i in range(n):
        value = {"key": f"{tag}{i}", "value": f"{tag} {i} " + "x" * pad}
        e = sign_entry(who, db=db_id, seq=seq + i, prev=prev, parents=list(parents), ts=1,
                       payloads={"memory": rows_update(who, "memory", clock + i, [value])})
        out.append(e)
        prev, parents = e.id, [e.id]
    return out


def _revoked_writer(storage=None) -> Database:
    """A database in which REVOKED was granted write, wrote, and was revoked by the admin."""
    db = new_db(ADMIN, storage)
    grant(db, ADMIN, HONEST, "write")
    grant(db, ADMIN, REVOKED, "write")
    write(db, REVOKED, {"key": "r", "value": "written while granted"})
    write(db, HONEST, {"key": "h", "value": "honest row"})
    revoke(db, ADMIN, REVOKED)
    assert db.permission(str(REVOKED.public)) is None
    return db


def _revoked_chain(db: Database, n: int, *, pad: int = 0) -> list[Entry]:
    top = db.feeds()[str(REVOKED.public)]
    return _chain(REVOKED, n, seq=top[0] + 1, prev=top[1], parents=list(db.heads),
                  clock=next_clock(db, REVOKED, "memory"), pad=pad, tag="revoked", db_id=db.id)


def _forked_writer(db: Database, who=FORKER) -> tuple[Entry, Entry]:
    """``who`` (granted write) signs two different entries at one seq; both are delivered."""
    grant(db, ADMIN, who, "write")
    write(db, who, {"key": "pre", "value": "before the fork"})
    clock = next_clock(db, who, "memory")
    one = craft(db, who, {"memory": rows_update(who, "memory", clock, [{"key": "f", "value": "fork one"}])})
    two = craft(db, who, {"memory": rows_update(who, "memory", clock, [{"key": "f", "value": "fork two"}])})
    assert one.id != two.id and one.seq == two.seq and one.prev == two.prev
    assert db.ingest([_item(one)], source="peer:forker").accepted == [one.id]
    result = db.ingest([_item(two)], source="peer:forker")
    assert two.id in result.stored_rejected and not result.rejected
    assert str(who.public) in db.equivocators
    return one, two


# =========================================================================== A. pending flood
FLOOD_LIMITS = PendingLimits(author_entries=40, author_bytes=1 * MiB, source_entries=48, source_bytes=4 * MiB,
                             total_entries=512, total_bytes=16 * MiB, ttl_ms=30 * 60 * 1000)


@pytest.mark.parametrize("honest_source", ["peer:honest", "peer:attacker"])
def test_orphan_flood_is_bounded_and_honest_entries_still_apply(honest_source):
    limits = FLOOD_LIMITS
    rng = random.Random(1)
    base = _base()
    src, honest = _honest_entries(base, 20)
    db = _target(base, MemoryStorage(), limits)
    # Two throwaway keys when the honest entries come from their own source (the source bound
    # is then reached by the flood alone); one when the attacker also relays the honest
    # entries (the honest author is then never the largest author within that source).
    keys = THROWAWAY[:2] if honest_source == "peer:honest" else THROWAWAY[:1]
    flood: list[Entry] = [_orphan(db, keys[i % len(keys)], rng, tag=str(i)) for i in range(400)]
    for start in range(0, len(flood), 25):
        result = db.ingest([_item(e) for e in flood[start:start + 25]], source="peer:attacker")
        assert not result.accepted and not result.stored_rejected and not result.rejected
        assert len(result.pending) == 25
        _check_pending_bounds(db, limits)
    flood_ids = {e.id for e in flood}
    pending = set(db.pending_ids())
    assert pending <= flood_ids
    assert len(pending) == (limits.source_entries if len(keys) > 1 else limits.author_entries)
    evicted = flood_ids - pending
    assert db.refusal_counts() == {"peer:attacker": {"entry.pending_evicted": len(evicted)}}
    assert all(db.refusal(i).reason == "entry.pending_evicted" for i in evicted)
    assert set(db.wanted()["parents"]) == {p for e in flood if e.id in pending for p in e.parents}
    assert _stored_ids(db) == _stored_ids(base)  # nothing of the flood was stored

    # The honest writer's 20 entries, in reverse order, one per batch: each waits for its parent.
    for e in reversed(honest[1:]):
        result = db.ingest([_item(e)], source=honest_source)
        assert result.pending == [e.id] and not result.accepted and not result.rejected
        records = _check_pending_bounds(db, limits)
        assert {r.id for r in records if r.author == str(HONEST.public)} >= {e.id}
    result = db.ingest([_item(honest[0])], source=honest_source)
    assert set(result.accepted) == {e.id for e in honest} and not result.rejected
    assert not (set(db.pending_ids()) & {e.id for e in honest})
    _check_pending_bounds(db, limits)
    assert all(db.is_accepted(e.id) for e in honest)
    assert _honest_values(db) == ["before the flood"] + [f"honest {i}" for i in range(20)]
    assert state(db) == state(src)
    # No honest entry was ever refused or evicted; every eviction counts against the attacker.
    assert all(db.refusal(e.id) is None for e in honest)
    counts = db.refusal_counts()
    assert set(counts) == {"peer:attacker"} and set(counts["peer:attacker"]) == {"entry.pending_evicted"}
    assert counts["peer:attacker"]["entry.pending_evicted"] == len(flood_ids - set(db.pending_ids()))


def test_flood_above_the_default_per_author_bound():
    limits = PendingLimits()
    assert limits.author_entries == 512
    rng = random.Random(2)
    base = _base()
    src, honest = _honest_entries(base, 20)
    db = _target(base, MemoryStorage())
    assert db._pending.limits == limits
    flood = [_orphan(db, THROWAWAY[0], rng, tag=str(i)) for i in range(700)]
    for start in range(0, len(flood), 100):
        db.ingest([_item(e) for e in flood[start:start + 100]], source="peer:attacker")
        _check_pending_bounds(db, limits)
    assert len(db.pending_ids()) == 512
    # The author's own oldest entries made room.
    assert set(db.pending_ids()) == {e.id for e in flood[-512:]}
    assert db.refusal_counts() == {"peer:attacker": {"entry.pending_evicted": 700 - 512}}
    for e in reversed(honest):
        db.ingest([_item(e)], source="peer:honest")
        _check_pending_bounds(db, limits)
    assert all(db.is_accepted(e.id) for e in honest)
    assert state(db) == state(src)
    assert db.refusal_counts() == {"peer:attacker": {"entry.pending_evicted": 700 - 512}}


def test_flood_and_restart_in_the_middle_of_honest_delivery(tmp_path):
    limits = FLOOD_LIMITS
    path = tmp_path / "node.sqlite"
    rng = random.Random(3)
    base = _base()
    src, honest = _honest_entries(base, 20)
    storage = SqliteStorage(path)
    db = _target(base, storage, limits)
    flood = [_orphan(db, THROWAWAY[i % 2], rng, tag=str(i)) for i in range(200)]
    for start in range(0, len(flood), 20):
        db.ingest([_item(e) for e in flood[start:start + 20]], source="peer:attacker")
        _check_pending_bounds(db, limits)
    for e in reversed(honest[10:]):
        assert db.ingest([_item(e)], source="peer:honest").pending == [e.id]
        _check_pending_bounds(db, limits)
    pending_before = set(db.pending_ids())
    counts_before = db.refusal_counts()
    stored_before = _stored_ids(db)
    assert {e.id for e in honest[10:]} <= pending_before
    storage.close()

    storage = SqliteStorage(path)
    db = Database.open(storage, base.id, pending_limits=limits)
    assert set(db.pending_ids()) == pending_before
    assert _stored_ids(db) == stored_before
    assert db.refusal_counts() == counts_before
    assert honest[9].id in db.wanted()["parents"]
    _check_pending_bounds(db, limits)
    # The flood goes on after the restart: the bounds still hold, the honest entries stay.
    more = [_orphan(db, THROWAWAY[2 + i % 2], rng, tag=f"after {i}") for i in range(100)]
    for start in range(0, len(more), 20):
        db.ingest([_item(e) for e in more[start:start + 20]], source="peer:attacker")
        _check_pending_bounds(db, limits)
    assert {e.id for e in honest[10:]} <= set(db.pending_ids())
    for e in reversed(honest[1:10]):
        assert db.ingest([_item(e)], source="peer:honest").pending == [e.id]
        _check_pending_bounds(db, limits)
    result = db.ingest([_item(honest[0])], source="peer:honest")
    assert set(result.accepted) == {e.id for e in honest}
    assert state(db) == state(src)
    assert set(db.refusal_counts()) == {"peer:attacker"}
    storage.close()

    storage = SqliteStorage(path)
    db = Database.open(storage, base.id, pending_limits=limits)
    assert state(db) == state(src)
    records = _check_pending_bounds(db, limits)
    assert {r.author for r in records} <= {str(k.public) for k in THROWAWAY}
    storage.close()


def test_orphans_expire_and_a_timely_parent_still_applies_its_child():
    now = [1_000_000]
    limits = PendingLimits(ttl_ms=10_000)
    rng = random.Random(4)
    base = _base()
    src, honest = _honest_entries(base, 4)
    db = _target(base, MemoryStorage(), limits, clock=lambda: now[0])
    early = [_orphan(db, THROWAWAY[0], rng, tag=f"early {i}") for i in range(5)]
    late = [_orphan(db, THROWAWAY[0], rng, tag=f"late {i}") for i in range(5)]
    db.ingest([_item(e) for e in early], source="peer:attacker")

    now[0] = 1_004_200
    db.ingest([_item(e) for e in late], source="peer:attacker")
    assert db.ingest([_item(honest[1])], source="peer:honest").pending == [honest[1].id]

    # The parent arrives 4.8 s later, within the ttl: both apply.
    now[0] = 1_009_000
    result = db.ingest([_item(honest[0])], source="peer:honest")
    assert set(result.accepted) == {honest[0].id, honest[1].id}
    assert set(db.pending_ids()) == {e.id for e in early + late}

    # 14 s after the early orphans arrived: they are dropped on the next ingest, the late stay.
    now[0] = 1_014_000
    db.ingest([], source="peer:other")
    assert set(db.pending_ids()) == {e.id for e in late}
    assert {r.id for r in db.storage.pending(db.id)} == {e.id for e in late}
    assert all(db.refusal(e.id).reason == "entry.pending_expired" for e in early)
    assert all(db.knows(e.id) and "entry.pending_expired" in db.explain(e.id) for e in early)
    assert set(db.wanted()["parents"]) == {e.parents[0] for e in late}

    # Half a second later the late orphans are past their ttl too, but the area is scanned at
    # most once a second: they are dropped on the first ingest a second after the last scan.
    now[0] = 1_014_500
    db.ingest([], source="peer:other")
    assert set(db.pending_ids()) == {e.id for e in late}
    now[0] = 1_015_000
    db.ingest([], source="peer:other")
    assert db.pending_ids() == [] and db.storage.pending(db.id) == []
    assert db.wanted()["parents"] == []
    expired = sum(r.get("entry.pending_expired", 0) for r in db.refusal_counts().values())
    assert expired == 10

    # A child whose parent arrives after the ttl expires first; sent again, it applies.
    assert db.ingest([_item(honest[3])], source="peer:honest").pending == [honest[3].id]
    now[0] = 1_025_001
    result = db.ingest([_item(honest[2])], source="peer:honest")
    assert result.accepted == [honest[2].id]
    assert db.refusal(honest[3].id).reason == "entry.pending_expired"
    assert not db.is_accepted(honest[3].id) and db.pending_ids() == []
    assert db.ingest([_item(honest[3])], source="peer:honest").accepted == [honest[3].id]
    assert state(db) == state(src)


def _bytes_reachable(root: object, stop: object) -> int:
    """Bytes held by the objects reachable from ``root`` (not through ``stop``, classes,
    modules or functions)."""
    seen: set[int] = set()
    total = 0
    stack = [root]
    while stack:
        obj = stack.pop()
        if obj is stop or id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType,
                                                                types.BuiltinFunctionType, types.MethodType)):
            continue
        seen.add(id(obj))
        if isinstance(obj, (bytes, bytearray, memoryview)):
            total += len(obj)
        elif not isinstance(obj, (str, int, float, bool)):
            stack.extend(gc.get_referents(obj))
    return total


def test_pending_area_keeps_no_entry_bytes_in_memory():
    assert {f.name for f in dataclasses.fields(PendingRecord)} == {
        "id", "author", "source", "received_ms", "size", "missing"}
    assert not hasattr(PendingRecord("sha256:" + "0" * 64, "", "", 0, 0, ()), "__dict__")
    limits = PendingLimits(author_entries=64, author_bytes=512 * KiB, source_entries=128,
                           source_bytes=1 * MiB, total_entries=256, total_bytes=2 * MiB)
    rng = random.Random(5)
    base = _base()
    # MemoryStorage: the storage's own copies of pending entries are traced too, so evicted
    # entries that stayed referenced anywhere would show.
    storage = MemoryStorage()
    db = _target(base, storage, limits)
    db_bytes = _bytes_reachable(db, stop=storage)  # the headers of stored entries
    n, pad, batch = 1500, 50 * KiB, 25  # 75 MB: over 35 times the area's byte bound

    def batches() -> Iterable[list[Item]]:
        for start in range(0, n, batch):
            yield [_item(_orphan(db, THROWAWAY[(start + i) % 4], rng, pad=pad, tag=str(start + i)))
                   for i in range(batch)]

    gc.collect()
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        sent = 0
        for i, items in enumerate(batches()):
            sent += sum(len(h) + sum(len(p) for p in ps.values()) for h, ps in items)
            db.ingest(items, source=f"peer:attacker{i % 2}")
            del items
            assert len(db._pending) <= limits.total_entries
            assert db._pending.nbytes <= limits.total_bytes
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sent > n * pad
    records = _check_pending_bounds(db, limits)
    assert len(records) > 0 and sum(r.size for r in records) > limits.total_bytes // 2
    # Nothing of the flood is held by the database object itself (the pending area's records
    # are ids, labels and numbers); the storage holds the pending entries, within the bounds.
    assert _bytes_reachable(db._pending, stop=storage) == 0
    assert _bytes_reachable(db, stop=storage) == db_bytes
    # Generous: the flood is 75 MB; what stays traced is the bounded area (about 3 MB here,
    # whatever the flood's size), the peak a few batches.
    assert peak - baseline < sent * 0.25, (peak - baseline, sent)
    assert current - baseline < sent * 0.05, (current - baseline, sent)


# ====================================================================== B. revoked and flagged
def test_revoked_writer_flood_stores_at_most_the_candidate_bound(tmp_path):
    storage = SqliteStorage(tmp_path / "node.sqlite")
    db = _revoked_writer(storage)
    limits = db._pending.limits
    before_state, before_ids, before_bytes = state(db), _stored_ids(db), _stored_bytes(db)
    flood = _revoked_chain(db, 300, pad=200 * KiB)
    assert all(200 * KiB < len(e.header) + len(e.payloads["memory"]) < 210 * KiB for e in flood)
    reasons: Counter[str] = Counter()
    for start in range(0, len(flood), 10):
        result = db.ingest([_item(e) for e in flood[start:start + 10]], source="peer:revoked")
        assert not result.accepted
        reasons.update(_reasons(result))
        _check_pending_bounds(db, limits)
    new = _stored_ids(db) - before_ids
    assert 0 < len(new) <= MAX_UNACCEPTED_ENTRIES
    assert _stored_bytes(db) - before_bytes <= MAX_UNACCEPTED_BYTES
    assert new == {e.id for e in flood[:len(new)]}  # the head of the chain, as candidates
    assert all(db.verdict(i).reason == "auth.revoked" for i in new)
    # The first entry over the bound is refused; those after it wait for it (bounded) or were
    # evicted from the pending area to make room.
    first_out = flood[len(new)]
    assert db.refusal(first_out.id).reason == "entry.candidate_bound"
    assert reasons["entry.candidate_bound"] == 1
    pending = set(db.pending_ids())
    assert pending <= {e.id for e in flood[len(new) + 1:]}
    for e in flood[len(new) + 1:]:
        assert e.id in pending or db.refusal(e.id).reason == "entry.pending_evicted"
    assert state(db) == before_state
    # Sync sends the whole feed again, in order: still bounded.
    for start in range(0, len(flood), 10):
        result = db.ingest([_item(e) for e in flood[start:start + 10]], source="peer:revoked")
        assert not result.accepted and not result.stored_rejected
        _check_pending_bounds(db, limits)
    assert _stored_ids(db) - before_ids == new
    assert state(db) == before_state
    storage.close()
    reopened = Database.open(SqliteStorage(tmp_path / "node.sqlite"), db.id)
    assert state(reopened) == before_state and _stored_ids(reopened) == before_ids | new
    reopened.storage.close()


def test_equivocation_keeps_two_forks_refuses_a_third_and_bounds_the_tail():
    db = new_db(ADMIN)
    grant(db, ADMIN, HONEST, "write")
    write(db, HONEST, {"key": "h", "value": "honest row"})
    grant(db, ADMIN, FORKER, "write")
    write(db, FORKER, {"key": "pre", "value": "before the fork"})
    author = str(FORKER.public)
    clock = next_clock(db, FORKER, "memory")
    forks = [craft(db, FORKER, {"memory": rows_update(FORKER, "memory", clock, [{"key": "f", "value": f"fork {n}"}])})
             for n in range(3)]
    seq = forks[0].seq
    assert len({e.id for e in forks}) == 3 and {e.seq for e in forks} == {seq}
    r1 = db.ingest([_item(forks[0])], source="peer:forker")
    assert r1.accepted == [forks[0].id]
    assert "fork 0" in [r.value["value"] for r in db.rows("memory")]
    r2 = db.ingest([_item(forks[1])], source="peer:forker")
    assert forks[1].id in r2.stored_rejected and not r2.rejected
    assert db.equivocators == {author: seq}
    assert set(db.entries_at(author, seq)) == {forks[0].id, forks[1].id}
    assert db.storage.has(db.id, forks[0].id) and db.storage.has(db.id, forks[1].id)
    assert db.verdict(forks[0].id).reason == db.verdict(forks[1].id).reason == "entry.equivocation"
    # Neither fork is applied; the honest writer's row stays.
    values = [r.value["value"] for r in db.rows("memory")]
    assert values == ["honest row", "before the fork"]
    before_state, before_ids = state(db), _stored_ids(db)

    r3 = db.ingest([_item(forks[2])], source="peer:forker")
    assert _reasons(r3) == ["entry.evidence_bound"]
    assert _stored_ids(db) == before_ids and state(db) == before_state
    assert set(db.entries_at(author, seq)) == {forks[0].id, forks[1].id}

    # A long tail on fork 0, delivered in order: at most MAX_UNACCEPTED_ENTRIES of the author's
    # entries from the fork on are kept as evidence (the two forks included).
    tail = _chain(FORKER, MAX_UNACCEPTED_ENTRIES + 50, seq=seq + 1, prev=forks[0].id, parents=list(db.heads),
                  clock=forks[0].stores["memory"].clock_end, tag="tail", db_id=db.id)
    reasons: Counter[str] = Counter()
    for start in range(0, len(tail), 20):
        result = db.ingest([_item(e) for e in tail[start:start + 20]], source="peer:forker")
        assert not result.accepted
        reasons.update(_reasons(result))
    kept = _stored_ids(db) - before_ids
    assert len(kept) > 0 and len(kept) + 2 <= MAX_UNACCEPTED_ENTRIES
    assert kept == {e.id for e in tail[:len(kept)]}
    assert db.refusal(tail[len(kept)].id).reason == "entry.candidate_bound"
    assert reasons["entry.candidate_bound"] == 1
    assert all(db.verdict(i).reason == "entry.equivocation" for i in kept)
    assert state(db) == before_state
    assert db.equivocators == {author: seq}
    _check_pending_bounds(db, db._pending.limits)
    reopened = Database.open(db.storage, db.id)
    assert state(reopened) == before_state and reopened.equivocators == {author: seq}


def _standing(kind: str) -> tuple[Database, Any, int, str | None, list[str]]:
    """A database and an author of the given standing; returns (db, key, seq, prev, parents)
    of the author's next entry on its own feed."""
    db = new_db(ADMIN)
    grant(db, ADMIN, HONEST, "write")
    write(db, HONEST, {"key": "h", "value": "honest row"})
    if kind == "unknown":
        who = THROWAWAY[0]
        return db, who, 0, None, list(db.heads)
    if kind == "revoked":
        grant(db, ADMIN, REVOKED, "write")
        write(db, REVOKED, {"key": "r", "value": "while granted"})
        revoke(db, ADMIN, REVOKED)
        top = db.feeds()[str(REVOKED.public)]
        return db, REVOKED, top[0] + 1, top[1], list(db.heads)
    assert kind == "flagged"
    grant(db, ADMIN, FORKER, "write")
    write(db, FORKER, {"key": "pre", "value": "before the fork"})
    clock = next_clock(db, FORKER, "memory")
    one = craft(db, FORKER, {"memory": rows_update(FORKER, "memory", clock, ["fork one"])})
    two = craft(db, FORKER, {"memory": rows_update(FORKER, "memory", clock, ["fork two"])})
    db.ingest([_item(one)])
    db.ingest([_item(two)])
    assert str(FORKER.public) in db.equivocators
    return db, FORKER, one.seq + 1, one.id, list(db.heads)


def _expected_clock(db: Database, who, store: str, prev: str | None) -> int:
    """The next clock of ``who`` in ``store`` along its feed ending at ``prev``."""
    while prev is not None:
        e = db.entry(prev)
        if store in e.stores:
            return e.stores[store].clock_end
        prev = e.prev
    return 0


def _malformed(kind: str, db: Database, who, seq: int, prev: str | None, parents: list[str]) -> Entry:
    c = client_id_for(who.public.raw)
    clock = _expected_clock(db, who, "memory", prev)
    if kind == "random_update":
        junk = random.Random(7).randbytes(300)
        payloads = {"memory": (junk, clock, 1)}
    elif kind == "bad_settings_op":
        sclock = _expected_clock(db, who, "_settings", prev)
        payloads = {"_settings": (encode_rows(c, sclock, "_settings", [(f"{c}/{sclock}", {"op": "grant", "key": "nobody"})]),
                                  sclock, 1)}
    elif kind == "clock_gap":
        payloads = {"memory": rows_update(who, "memory", clock + 3, ["gap"])}
    elif kind == "other_root":
        payloads = {"memory": (encode_rows(c, clock, "meta", [(f"{c}/{clock}", {"display_name": "pwned"})]), clock, 1)}
    else:
        raise AssertionError(kind)
    return sign_entry(who, db=db.id, seq=seq, prev=prev, parents=parents, ts=1, payloads=payloads)


EXPECTED_REASON = {"bad_settings_op": "auth.bad_op", "clock_gap": "yjs.clock_gap", "other_root": "yjs.parent"}


@pytest.mark.parametrize("malformation", ["random_update", "bad_settings_op", "clock_gap", "other_root"])
@pytest.mark.parametrize("standing", ["flagged", "revoked", "unknown"])
def test_malformed_entries_are_refused_structurally_whatever_the_standing(standing, malformation):
    db, who, seq, prev, parents = _standing(standing)
    e = _malformed(malformation, db, who, seq, prev, parents)
    before_state, before_ids, before_eq = state(db), _stored_ids(db), db.equivocators
    result = db.ingest([_item(e)], source="peer:bad")
    assert [i for i, _r, _d in result.rejected] == [e.id]
    reason = _reasons(result)[0]
    if malformation == "random_update":
        assert reason.startswith("yjs."), reason
    else:
        assert reason == EXPECTED_REASON[malformation]
    assert not result.accepted and not result.stored_rejected and not result.pending
    assert _stored_ids(db) == before_ids and db.pending_ids() == []
    assert state(db) == before_state and db.equivocators == before_eq
    assert db.refusal(e.id).reason == reason and reason in db.explain(e.id)
    assert state(Database.open(db.storage, db.id)) == before_state
    # The same malformed entry naming a parent that has not arrived yet (an honest entry made
    # elsewhere): what can be checked without its past is checked before it may wait; a clock
    # gap needs the feed's past, so it waits (bounded) and is refused once its parent arrives.
    other = replica(db)
    parent = other.storage.get(other.id, write(other, HONEST, {"key": "late", "value": "parent"}))
    early = _malformed(malformation, db, who, seq, prev, [parent.id])
    r = db.ingest([_item(early)], source="peer:bad")
    if malformation == "clock_gap":
        assert r.pending == [early.id] and not r.rejected
        r = db.ingest([_item(parent)], source="peer:honest")
        assert r.accepted == [parent.id]
    else:
        assert not r.pending
    assert [(i, reason_) for i, reason_, _d in r.rejected] == [(early.id, reason)]
    assert db.pending_ids() == [] and not db.storage.has(db.id, early.id)
    assert db.equivocators == before_eq
    if malformation != "clock_gap":
        assert db.ingest([_item(parent)], source="peer:honest").accepted == [parent.id]
    assert _stored_ids(db) == before_ids | {parent.id}


# ------------------------------------------------------------------ order independence
@functools.cache
def _order_scenario() -> tuple[Database, tuple[Item, ...], frozenset[str]]:
    """Every entry of a history with candidates, two forks and malformed forks, plus the
    malformed ones (ids returned) that no replica may store."""
    src = new_db(ADMIN)
    for who in (HONEST, REVOKED, FORKER, FORKER2, FORKER3):
        grant(src, ADMIN, who, "write")
    write(src, HONEST, {"key": "h0", "value": "honest 0"})
    write(src, REVOKED, {"key": "r0", "value": "before its revocation"})
    revoke(src, ADMIN, REVOKED)
    for i in range(3):  # candidates: signed after the revocation, kept, never applied
        e = craft(src, REVOKED, {"memory": rows_update(REVOKED, "memory", next_clock(src, REVOKED, "memory"),
                                                       [{"key": f"r{i + 1}", "value": "after its revocation"}])})
        assert src.ingest([_item(e)]).stored_rejected == [e.id]
    # FORKER: two well-formed forks; an honest entry sees the first before the second arrives.
    fa = craft(src, FORKER, {"memory": rows_update(FORKER, "memory", 0, [{"key": "f", "value": "fork a"}])})
    fb = craft(src, FORKER, {"memory": rows_update(FORKER, "memory", 0, [{"key": "f", "value": "fork b"}])})
    assert src.ingest([_item(fa)]).accepted == [fa.id]
    write(src, HONEST, {"key": "h1", "value": "honest 1, after fork a"})
    assert fb.id in src.ingest([_item(fb)]).stored_rejected
    # FORKER2 and FORKER3: a well-formed entry, and a second one at the same seq that is
    # malformed (a clock gap, seen only with the feed's past; another root, seen at once).
    g2 = craft(src, FORKER2, {"memory": rows_update(FORKER2, "memory", 0, [{"key": "g", "value": "forker2"}])})
    bad2 = craft(src, FORKER2, {"memory": rows_update(FORKER2, "memory", 7, [{"key": "g", "value": "gap"}])},
                 seq=0, prev=None)
    c3 = client_id_for(FORKER3.public.raw)
    g3 = craft(src, FORKER3, {"memory": rows_update(FORKER3, "memory", 0, [{"key": "g", "value": "forker3"}])})
    bad3 = craft(src, FORKER3, {"memory": (encode_rows(c3, 0, "meta", [(f"{c3}/0", {"display_name": "x"})]), 0, 1)},
                 seq=0, prev=None)
    assert src.ingest([_item(g2)]).accepted == [g2.id]
    assert src.ingest([_item(g3)]).accepted == [g3.id]
    assert _reasons(src.ingest([_item(bad2)])) == ["yjs.clock_gap"]
    assert _reasons(src.ingest([_item(bad3)])) == ["yjs.parent"]
    write(src, HONEST, {"key": "h2", "value": "honest 2, sees everything"})
    src.set_meta(ADMIN, display_name="order")
    assert set(src.equivocators) == {str(FORKER.public)}
    items = tuple(_item(s) for s in src.storage.entries(src.id)) + (_item(bad2), _item(bad3))
    return src, items, frozenset({bad2.id, bad3.id})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_arrival_order_does_not_change_what_is_stored_or_applied(data):
    src, items, malformed = _order_scenario()
    dups = data.draw(st.lists(st.integers(0, len(items) - 1), max_size=8), label="duplicates")
    order = data.draw(st.permutations(list(items) + [items[i] for i in dups]), label="order")
    storage = MemoryStorage()
    storage.add_database(src.id)
    db = Database(storage, src.id)
    pos = 0
    while pos < len(order):
        n = data.draw(st.integers(1, 3), label="batch")
        db.ingest(order[pos:pos + n], source=f"peer:{pos % 3}")
        assert not (_stored_ids(db) & malformed)
        assert set(db.equivocators) <= {str(FORKER.public)}
        pos += n
    assert db.pending_ids() == []
    assert _stored_ids(db) == _stored_ids(src)
    assert db.accepted_ids() == src.accepted_ids()
    assert db.equivocators == src.equivocators
    assert state(db) == state(src)
    assert {db.refusal(i).reason for i in malformed} == {"yjs.clock_gap", "yjs.parent"}


# ---------------------------------------------------------------------------- explain
def test_explain_answers_for_entries_refused_before_storage_after_reopen(tmp_path):
    path = tmp_path / "node.sqlite"
    storage = SqliteStorage(path)
    db = new_db(ADMIN, storage)
    grant(db, ADMIN, HONEST, "write")
    e = craft(db, HONEST, {"memory": rows_update(HONEST, "memory", next_clock(db, HONEST, "memory"), ["signed"])})
    bad_sig = e.header[:-1] + bytes([e.header[-1] ^ 1])
    junk = b"\x00" + random.Random(9).randbytes(199)
    before_state, before_ids = state(db), _stored_ids(db)
    result = db.ingest([(bad_sig, dict(e.payloads)), (junk, {})], source="peer:forger")
    assert [(i, r) for i, r, _d in result.rejected] == [(id_of(bad_sig), "entry.signature"),
                                                         (id_of(junk), "entry.format")]
    assert state(db) == before_state and _stored_ids(db) == before_ids
    unknown = "sha256:" + "ab" * 32

    def check(d: Database) -> None:
        for entry_id, reason in ((id_of(bad_sig), "entry.signature"), (id_of(junk), "entry.format")):
            assert d.knows(entry_id)
            text = d.explain(entry_id)
            assert f"refused ({reason})" in text and "peer:forger" in text, text
        assert not d.knows(unknown) and "not known" in d.explain(unknown)
        assert d.refusal_counts()["peer:forger"] == {"entry.signature": 1, "entry.format": 1}

    check(db)
    # The tampered copy leaves no trace that blocks the signed original.
    assert not db.knows(e.id)
    storage.close()
    storage = SqliteStorage(path)
    db = Database.open(storage, db.id)
    check(db)
    assert db.ingest([_item(e)], source="peer:honest").accepted == [e.id]
    check(db)
    storage.close()


# ============================================================= found by review
def test_evictions_made_by_another_source_count_against_the_flooding_source():
    limits = PendingLimits(author_entries=40, source_entries=40, total_entries=48)
    rng = random.Random(10)
    base = _base()
    src, honest = _honest_entries(base, 20)
    db = _target(base, MemoryStorage(), limits)
    flood = [_orphan(db, THROWAWAY[0], rng, tag=str(i)) for i in range(100)]
    for start in range(0, 100, 10):
        db.ingest([_item(e) for e in flood[start:start + 10]], source="peer:attacker")
    for e in reversed(honest):
        db.ingest([_item(e)], source="peer:honest")
    assert state(db) == state(src)  # the honest entries did apply
    evicted = {e.id for e in flood} - set(db.pending_ids())
    assert all(db.refusal(i).source == "peer:attacker" for i in evicted)
    assert db.refusal_counts() == {"peer:attacker": {"entry.pending_evicted": len(evicted)}}


def test_expired_orphans_count_against_the_source_that_sent_them():
    now = [1_000_000]
    base = _base()
    src, honest = _honest_entries(base, 1)
    db = _target(base, MemoryStorage(), PendingLimits(ttl_ms=10_000), clock=lambda: now[0])
    rng = random.Random(11)
    flood = [_orphan(db, THROWAWAY[0], rng, tag=str(i)) for i in range(5)]
    db.ingest([_item(e) for e in flood], source="peer:attacker")
    now[0] += 20_000
    assert db.ingest([_item(honest[0])], source="peer:honest").accepted == [honest[0].id]
    assert db.pending_ids() == []
    assert all(db.refusal(e.id).reason == "entry.pending_expired" for e in flood)
    assert all(db.refusal(e.id).source == "peer:attacker" for e in flood)
    assert db.refusal_counts() == {"peer:attacker": {"entry.pending_expired": 5}}


def test_source_byte_bound_evicts_the_author_holding_the_most_bytes():
    limits = PendingLimits(author_entries=64, author_bytes=2 * MiB, source_entries=128, source_bytes=2 * MiB)
    rng = random.Random(12)
    base = _base()
    src, honest = _honest_entries(base, 20)
    db = _target(base, MemoryStorage(), limits)
    probe = _orphan(db, THROWAWAY[0], rng, pad=1000)
    overhead = len(probe.header) + len(probe.payloads["memory"]) - 1000
    pad = (2 * MiB - 1024) // 2 - overhead
    big = [_orphan(db, THROWAWAY[0], rng, pad=pad) for _ in range(2)]
    db.ingest([_item(e) for e in big], source="peer:attacker")
    assert set(db.pending_ids()) == {e.id for e in big} and 2 * MiB - db._pending.nbytes < 2048
    honest_bytes = sum(e.size for e in honest)
    assert honest_bytes < 64 * KiB  # the honest writer never holds more than a few percent
    for e in reversed(honest):
        db.ingest([_item(e)], source="peer:attacker")
        _check_pending_bounds(db, limits)
    assert all(db.is_accepted(e.id) for e in honest)
    assert state(db) == state(src)


def test_total_entry_bound_evicts_the_source_holding_the_most_entries():
    """Sybil sources fill the database-wide bound with tiny orphans: an honest source's entries
    are never evicted while it holds fewer entries than the largest source (by entries, the
    bound that is exceeded, not by bytes), and what is evicted comes back on the next sync."""
    limits = PendingLimits(author_entries=24, source_entries=24, total_entries=100)
    base = new_db(ADMIN)
    grant(base, ADMIN, HONEST, "write")
    src = replica(base)
    ids = [write(src, HONEST, {"key": f"h{i}", "value": "v" * 4000}) for i in range(20)]
    honest = [src.storage.get(src.id, i) for i in ids]
    db = _target(base, MemoryStorage(), limits)
    rng = random.Random(13)
    for s in range(5):
        flood = [_orphan(db, THROWAWAY[s], rng, tag=str(i)) for i in range(24)]
        db.ingest([_item(e) for e in flood], source=f"peer:sybil{s}")
    assert sum(Counter(r.source for r in _check_pending_bounds(db, limits)).values()) == 100
    for e in reversed(honest):
        held = Counter(r.source for r in db.storage.pending(db.id))
        biggest_other = max(n for src_name, n in held.items() if src_name != "peer:honest")
        evicted_before = db.refusal_counts().get("peer:honest", {}).get("entry.pending_evicted", 0)
        db.ingest([_item(e)], source="peer:honest")
        _check_pending_bounds(db, limits)
        evicted = db.refusal_counts().get("peer:honest", {}).get("entry.pending_evicted", 0) - evicted_before
        if held["peer:honest"] + 1 < biggest_other:
            assert evicted == 0, "an honest source below the largest share was evicted"
    # Whatever was evicted is offered again by the next sync and then applies.
    for e in reversed(honest):
        db.ingest([_item(e)], source="peer:honest")
    assert all(db.is_accepted(e.id) for e in honest)
    assert [r.source for r in db.storage.pending(db.id) if r.source == "peer:honest"] == []


@pytest.mark.parametrize("standing", ["revoked", "flagged"])
def test_child_first_delivery_does_not_bypass_the_candidate_bound(standing):
    limits = PendingLimits(author_entries=32)
    storage = MemoryStorage()
    if standing == "revoked":
        base = _revoked_writer()
        who = REVOKED
        top = base.feeds()[str(REVOKED.public)]
        seq, prev, clock = top[0] + 1, top[1], next_clock(base, REVOKED, "memory")
    else:
        base = new_db(ADMIN)
        grant(base, ADMIN, HONEST, "write")
        write(base, HONEST, {"key": "h", "value": "honest row"})
        one, _two = _forked_writer(base, FORKER)
        who = FORKER
        seq, prev, clock = one.seq + 1, one.id, one.stores["memory"].clock_end
    db = _target(base, storage, limits)
    before_state, before_count = state(db), _author_stored(db, who)
    feed_entries = _chain(who, 8 * 30, seq=seq, prev=prev, parents=list(db.heads), clock=clock,
                          tag="tail", db_id=db.id)
    for r in range(8):
        chunk = feed_entries[r * 30:(r + 1) * 30]
        # Child first: every entry waits for its parent, then the parent of the round arrives
        # (for later rounds, the tip of the previous round, refused then, sent again).
        again = [feed_entries[r * 30 - 1]] if r else []
        for e in list(reversed(chunk)) + again:
            db.ingest([_item(e)], source="peer:bad")
        _check_pending_bounds(db, limits)
        assert state(db) == before_state
        stored = _author_stored(db, who) - before_count
        # However the bound is read (the candidate bound, plus at most one pending area's worth
        # of entries taken in because a pending entry named them), it is a bound.
        assert stored <= MAX_UNACCEPTED_ENTRIES + limits.author_entries, (r, stored)


def test_child_first_delivery_does_not_bypass_the_evidence_bound():
    db = new_db(ADMIN)
    grant(db, ADMIN, FORKER, "write")
    heads = list(db.heads)
    author = str(FORKER.public)
    for i in range(40):
        fork = craft(db, FORKER, {"memory": rows_update(FORKER, "memory", 0, [f"fork {i}"])},
                     parents=heads, seq=0, prev=None)
        child = craft(db, FORKER, {"memory": rows_update(FORKER, "memory", 1, [f"child {i}"])},
                      parents=[fork.id], seq=1, prev=fork.id)
        db.ingest([_item(child)], source="peer:forker")
        db.ingest([_item(fork)], source="peer:forker")
    assert db.equivocators == {author: 0}
    assert len(db.entries_at(author, 0)) == 2
    assert _author_stored(db, FORKER) <= MAX_UNACCEPTED_ENTRIES
