"""What sync reads from a database: what a peer lacks from its feed positions, pages bounded in
bytes, both entries of a fork, and an event after each commit that stored entries."""
from __future__ import annotations

from memmesh.crdt.database import Database
from memmesh.crdt.storage import MemoryStorage
from tests.dbkit import craft, feed, grant, key, new_db, replica, rows_update, state, write

ADMIN, ALICE, BOB = key(1), key(2), key(3)


def _fresh(db_id: str) -> Database:
    storage = MemoryStorage()
    storage.add_database(db_id)
    return Database(storage, db_id)


def _sync_by_pages(dst: Database, src: Database, max_bytes: int) -> list[int]:
    """Pull everything dst lacks from src, page by page as a sync client would; page byte sizes."""
    sizes = []
    while True:
        ids = src.missing_for(dst.feeds(), dst.evidence(), dst.wanted()["parents"])
        if not ids:
            return sizes
        entries, n = src.page(ids, max_bytes)
        assert n >= 1
        sizes.append(sum(len(h) + sum(len(p) for p in ps.values() if p) for h, ps in entries))
        result = dst.ingest(entries)
        assert not result.rejected and not result.pending, (result.rejected, result.pending)


def test_a_new_peer_bootstraps_in_bounded_pages_in_causal_order():
    db = new_db(ADMIN)
    grant(db, ADMIN, ALICE, "write")
    for i in range(60):
        write(db, ALICE, {"key": f"k{i}", "value": "x" * 200})
    peer = _fresh(db.id)
    sizes = _sync_by_pages(peer, db, max_bytes=2000)
    assert len(sizes) > 5 and max(sizes) <= 2000
    assert state(peer) == state(db)
    assert db.missing_for(peer.feeds(), peer.evidence()) == []


def test_only_what_is_missing_is_listed():
    db = new_db(ADMIN)
    grant(db, ADMIN, ALICE, "write")
    for i in range(20):
        write(db, ALICE, {"key": f"k{i}", "value": "v"})
    peer = replica(db)
    new = [write(db, ALICE, {"key": "later", "value": str(i)}) for i in range(3)]
    assert db.missing_for(peer.feeds()) == new
    # ... and the other way round, nothing: the peer has nothing db lacks.
    assert peer.missing_for(db.feeds()) == []


def test_missing_for_is_in_t_order_across_authors():
    db = new_db(ADMIN)
    grant(db, ADMIN, ALICE, "write")
    grant(db, ADMIN, BOB, "write")
    bob_side = replica(db)
    write(db, ALICE, {"key": "a", "value": "1"})
    write(bob_side, BOB, {"key": "b", "value": "2"})
    feed(db, bob_side)
    write(db, ALICE, {"key": "c", "value": "3"})
    ids = db.missing_for({})
    heights = [db.height_of(i) for i in ids]
    assert heights == sorted(heights) and len(ids) == len(db)


def test_both_entries_of_a_fork_travel_once():
    db = new_db(ADMIN)
    grant(db, ADMIN, ALICE, "write")
    write(db, ALICE, {"key": "a", "value": "1"})
    fork_a = craft(db, ALICE, {"memory": rows_update(ALICE, "memory", 1, [{"key": "x", "value": "A"}])})
    fork_b = craft(db, ALICE, {"memory": rows_update(ALICE, "memory", 1, [{"key": "x", "value": "B"}])})
    db.ingest([(fork_a.header, dict(fork_a.payloads)), (fork_b.header, dict(fork_b.payloads))])
    author = str(ALICE.public)
    assert sorted(db.entries_at(author, fork_a.seq)) == sorted([fork_a.id, fork_b.id])
    peer = _fresh(db.id)
    _sync_by_pages(peer, db, max_bytes=10_000)
    assert sorted(peer.entries_at(author, fork_a.seq)) == sorted([fork_a.id, fork_b.id])
    assert author in peer.equivocators
    # The peer reports its evidence: nothing is sent again.
    assert db.missing_for(peer.feeds(), peer.evidence()) == []
    # A peer that holds only one fork is sent the other.
    one = replica_of(db, exclude={fork_b.id})
    assert db.missing_for(one.feeds(), one.evidence()) == [fork_b.id]


def replica_of(db: Database, exclude: set[str]) -> Database:
    peer = _fresh(db.id)
    peer.ingest([(s.header, dict(s.payloads)) for s in db.storage.entries(db.id) if s.id not in exclude])
    return peer


def test_wanted_parents_are_served():
    db = new_db(ADMIN)
    grant(db, ADMIN, ALICE, "write")
    first = write(db, ALICE, {"key": "a", "value": "1"})
    write(db, ALICE, {"key": "b", "value": "2"})
    assert first in db.missing_for({}, want=[first, "sha256:" + "0" * 64])


def test_erased_payloads_travel_as_erased():
    db = new_db(ADMIN)
    grant(db, ADMIN, ALICE, "write")
    target = write(db, ALICE, {"key": "secret", "value": "oops"})
    db.erase(ALICE, target, "memory")
    entries, _ = db.page(db.missing_for({}), 1 << 20)
    carried = dict(entries)
    stored = db.storage.get(db.id, target)
    assert carried[stored.header]["memory"] is None


def test_stored_event_for_local_and_received_entries():
    db = new_db(ADMIN)
    grant(db, ADMIN, ALICE, "write")
    seen: list[tuple[str, ...]] = []
    remove = db.on_stored(seen.append)
    local = write(db, ALICE, {"key": "a", "value": "1"})
    assert seen == [(local,)]
    other = replica(db)
    received = write(other, ALICE, {"key": "b", "value": "2"})
    db.ingest([(s.header, dict(s.payloads)) for s in other.storage.entries(other.id)])
    assert seen[-1] == (received,)
    remove()
    write(db, ALICE, {"key": "c", "value": "3"})
    assert len(seen) == 2
