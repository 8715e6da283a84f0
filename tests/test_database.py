"""The database: local writes, the validation pipeline, and adversarial input.

Every adversarial case asserts the specific reason and that stored and derived state did not
change.
"""
from __future__ import annotations

import pycrdt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memmesh.auth.errors import AuthError, MemmeshError, RejectedError
from memmesh.crdt.database import Database
from memmesh.crdt.entry import MAX_PAYLOAD_BYTES, client_id_for
from memmesh.crdt.errors import EntryRejected
from memmesh.crdt.storage import MemoryStorage
from memmesh.crdt.yjs import encode_rows
from tests.dbkit import craft, feed, grant, key, new_db, next_clock, replica, revoke, rows_update, state, write

ADMIN, ALICE, BOB, MALLORY, ADMIN5 = key(1), key(2), key(3), key(4), key(5)


@pytest.fixture
def db() -> Database:
    d = new_db(ADMIN)
    grant(d, ADMIN, ALICE, "write", 10)
    grant(d, ADMIN, BOB, "write", 10)
    write(d, ALICE, {"key": "a", "value": "alice's row"})
    return d


def _reject(db: Database, entry, reason: str, *, stored: bool = False) -> None:
    """Offer ``entry``; assert the reason and that nothing observable changed."""
    before_state, before_count = state(db), len(db.storage.entries and list(db.storage.entries(db.id)))
    result = db.ingest([(entry.header, dict(entry.payloads))])
    reasons = [r for _, r, _ in result.rejected]
    if stored:
        assert entry.id in result.stored_rejected, result
        assert db.verdict(entry.id).reason == reason, db.explain(entry.id)
    else:
        assert reasons == [reason], result
        assert len(list(db.storage.entries(db.id))) == before_count
    assert entry.id not in result.accepted
    assert state(db) == before_state
    # A fresh open of the same storage agrees.
    assert state(Database.open(db.storage, db.id)) == before_state


def test_local_write_round_trip_and_reopen(db):
    rows = db.rows("memory")
    assert [r.value["value"] for r in rows] == ["alice's row"]
    assert rows[0].author == str(ALICE.public)
    reopened = Database.open(db.storage, db.id)
    assert state(reopened) == state(db)
    assert reopened.heads == db.heads


def test_one_transaction_is_one_entry_across_stores(db):
    txn = db.transaction(ALICE)
    txn.append("memory", {"key": "k", "value": "v"})
    txn.append("embeddings:hashed/h", {"row": "x", "vector": b"\x00" * 8})
    entry_id = txn.commit()
    assert set(db.entry(entry_id).stores) == {"memory", "embeddings:hashed/h"}


def test_replica_converges(db):
    other = replica(db)
    assert state(other) == state(db)


def test_bad_signature(db):
    e = craft(db, ALICE, {"memory": rows_update(ALICE, "memory", next_clock(db, ALICE, "memory"), ["x"])})
    bad = e.header[:-1] + bytes([e.header[-1] ^ 1])
    before = len(list(db.storage.entries(db.id)))
    result = db.ingest([(bad, dict(e.payloads))])
    assert [r for _, r, _ in result.rejected] == ["entry.signature"]
    assert len(list(db.storage.entries(db.id))) == before


def test_key_not_in_settings(db):
    e = craft(db, MALLORY, {"memory": rows_update(MALLORY, "memory", 0, ["spam"])})
    _reject(db, e, "auth.unknown_key")
    # The node can still say why it refused it (the entry itself was not stored).
    assert "refused (auth.unknown_key)" in db.explain(e.id) and str(MALLORY.public) in db.explain(e.id)


def test_local_write_without_permission_fails_and_stores_nothing(db):
    before = state(db)
    with pytest.raises(AuthError) as err:
        db.transaction(MALLORY)
    assert err.value.reason == "auth.not_writer"
    with pytest.raises(AuthError):
        grant(db, ALICE, MALLORY, "write", 10)
    assert state(db) == before


def test_write_key_changing_settings(db):
    e = craft(db, ALICE, {"_settings": rows_update(ALICE, "_settings", 0,
                                                   [{"op": "grant", "key": str(MALLORY.public), "perm": "write", "priority": 10}])})
    _reject(db, e, "auth.not_admin")


def test_admin5_cannot_revoke_or_demote_admin0():
    d = new_db(ADMIN)
    grant(d, ADMIN, ADMIN5, "admin", 5)
    for op in ({"op": "revoke", "key": str(ADMIN.public)},
               {"op": "grant", "key": str(ADMIN.public), "perm": "write", "priority": 5}):
        e = craft(d, ADMIN5, {"_settings": rows_update(ADMIN5, "_settings", next_clock(d, ADMIN5, "_settings"), [op])})
        _reject(d, e, "auth.target_stronger", stored=True)
    with pytest.raises(AuthError):
        revoke(d, ADMIN5, ADMIN)
    assert d.permission(str(ADMIN.public)).level == "admin"


def test_grant_more_than_held_is_refused():
    d = new_db(ADMIN)
    grant(d, ADMIN, ADMIN5, "admin", 5)
    e = craft(d, ADMIN5, {"_settings": rows_update(ADMIN5, "_settings", 0,
                                                   [{"op": "grant", "key": str(MALLORY.public), "perm": "admin", "priority": 1}])})
    _reject(d, e, "auth.grant_exceeds")


def test_revoked_key_backdating_is_voided(db):
    before_revocation = list(db.heads)
    alice_top = db.feeds()[str(ALICE.public)]
    revoke(db, ADMIN, ALICE)
    # Alice signs with parents that predate her revocation: concurrent with it, so void.
    e = craft(db, ALICE, {"memory": rows_update(ALICE, "memory", next_clock(db, ALICE, "memory"), ["late"])},
              parents=before_revocation, seq=alice_top[0] + 1, prev=alice_top[1])
    _reject(db, e, "auth.voided", stored=True)
    assert "revok" in db.explain(e.id)


def test_revoked_key_after_revocation_is_rejected(db):
    revoke(db, ADMIN, ALICE)
    e = craft(db, ALICE, {"memory": rows_update(ALICE, "memory", next_clock(db, ALICE, "memory"), ["after"])})
    _reject(db, e, "auth.revoked", stored=True)
    with pytest.raises(AuthError):
        write(db, ALICE, {"key": "x", "value": "y"})


def test_entry_replayed_into_another_database(db):
    other = new_db(ADMIN)
    grant(other, ADMIN, ALICE, "write", 10)
    e = craft(db, ALICE, {"memory": rows_update(ALICE, "memory", next_clock(db, ALICE, "memory"), ["x"])})
    before = len(list(other.storage.entries(other.id)))
    result = other.ingest([(e.header, dict(e.payloads))])
    assert [r for _, r, _ in result.rejected] == ["entry.db"]
    assert len(list(other.storage.entries(other.id))) == before


def test_update_deleting_another_authors_row(db):
    # Build, with pycrdt, the update a malicious Bob would send: delete Alice's row.
    doc = pycrdt.Doc(client_id=client_id_for(BOB.public.raw))
    m = doc.get("memory", type=pycrdt.Map)
    doc.apply_update(db.doc("memory").get_update())
    sv = doc.get_state()
    alice_row = next(iter(m.keys()))
    del m[alice_row]
    upd = doc.get_update(sv)
    e = craft(db, BOB, {"memory": (upd, 0, 1)})
    _reject(db, e, "yjs.delete_set")


def test_update_overwriting_another_authors_row(db):
    doc = pycrdt.Doc(client_id=client_id_for(BOB.public.raw))
    m = doc.get("memory", type=pycrdt.Map)
    doc.apply_update(db.doc("memory").get_update())
    sv = doc.get_state()
    alice_row = next(iter(m.keys()))
    m[alice_row] = {"key": "a", "value": "rewritten by bob"}
    upd = doc.get_update(sv)
    e = craft(db, BOB, {"memory": (upd, 0, 1)})
    result_reason = "yjs.origin"
    _reject(db, e, result_reason)


def test_update_under_another_authors_client_id(db):
    # The header binds the descriptor to Bob's client id; the update claims Alice's.
    c_alice = client_id_for(ALICE.public.raw)
    upd = encode_rows(c_alice, 5, "memory", [(f"{c_alice}/5", "spoof")])
    c_bob = client_id_for(BOB.public.raw)
    e = craft(db, BOB, {"memory": (upd, 0, 1)})
    assert e.stores["memory"].client == c_bob
    _reject(db, e, "yjs.clients")


def test_clock_gap(db):
    clock = next_clock(db, ALICE, "memory")
    e = craft(db, ALICE, {"memory": rows_update(ALICE, "memory", clock + 3, ["gap"])})
    _reject(db, e, "yjs.clock_gap")


def test_clock_reuse(db):
    clock = next_clock(db, ALICE, "memory")
    assert clock > 0
    e = craft(db, ALICE, {"memory": rows_update(ALICE, "memory", clock - 1, ["reuse"])})
    _reject(db, e, "yjs.clock_reuse")


def test_seq_skip_rejected(db):
    top = db.feeds()[str(ALICE.public)]
    e = craft(db, ALICE, {"memory": rows_update(ALICE, "memory", next_clock(db, ALICE, "memory"), ["x"])},
              seq=top[0] + 2)
    _reject(db, e, "entry.feed")


def test_equivocation_keeps_evidence_and_flags_author(db):
    clock = next_clock(db, BOB, "memory")
    one = craft(db, BOB, {"memory": rows_update(BOB, "memory", clock, ["fork one"])})
    two = craft(db, BOB, {"memory": rows_update(BOB, "memory", clock, ["fork two"])})
    assert one.id != two.id and one.seq == two.seq
    r1 = db.ingest([(one.header, dict(one.payloads))])
    assert r1.accepted == [one.id]
    r2 = db.ingest([(two.header, dict(two.payloads))])
    assert two.id in r2.stored_rejected
    assert str(BOB.public) in db.equivocators
    assert db.storage.has(db.id, one.id) and db.storage.has(db.id, two.id)
    # Neither fork is applied; Alice's row stays.
    values = [r.value for r in db.rows("memory")]
    assert "fork one" not in values and "fork two" not in values
    assert any(isinstance(v, dict) and v.get("value") == "alice's row" for v in values)
    assert db.verdict(one.id).reason == "entry.equivocation"
    assert "two different entries" in db.explain(two.id)
    # A replica that receives the forks in the other order ends the same.
    other = replica(db)
    assert state(other) == state(db)
    with pytest.raises(AuthError):
        write(db, BOB, "after fork")


def test_deeply_nested_value_never_reaches_pycrdt(db):
    depth = 20_000
    any_bytes = b"\x75\x01" * depth + b"\x7e"  # array of array of ... null
    c = client_id_for(ALICE.public.raw)
    key_str = f"{c}/{next_clock(db, ALICE, 'memory')}".encode()
    root = b"memory"
    upd = (b"\x01\x01" + _varuint(c) + _varuint(next_clock(db, ALICE, "memory")) + b"\x28\x01"
           + bytes([len(root)]) + root + bytes([len(key_str)]) + key_str + b"\x01" + any_bytes + b"\x00")
    e = craft(db, ALICE, {"memory": (upd, next_clock(db, ALICE, "memory"), 1)})
    _reject(db, e, "yjs.depth")


def _varuint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def test_oversize_entry(db):
    big = "x" * (MAX_PAYLOAD_BYTES + 10)
    upd = rows_update(ALICE, "memory", next_clock(db, ALICE, "memory"), [big])
    with pytest.raises(EntryRejected) as err:
        craft(db, ALICE, {"memory": upd})  # our own signer refuses to describe it
    assert err.value.reason == "entry.size"
    e = craft(db, ALICE, {"memory": rows_update(ALICE, "memory", next_clock(db, ALICE, "memory"), ["small"])})
    result = db.ingest([(e.header, {"memory": upd[0]})])
    assert [r for _, r, _ in result.rejected] == ["entry.size"]


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=400), st.dictionaries(st.sampled_from(["memory", "meta", "x"]), st.binary(max_size=100), max_size=2))
def test_random_bytes_change_nothing(header, payloads):
    d = new_db(ADMIN)
    before = state(d)
    result = d.ingest([(header, payloads)])
    assert not result.accepted and result.rejected
    assert state(d) == before


def test_truncated_entries_change_nothing(db):
    e = craft(db, ALICE, {"memory": rows_update(ALICE, "memory", next_clock(db, ALICE, "memory"), ["t"])})
    before = state(db)
    for cut in range(0, len(e.header), 7):
        result = db.ingest([(e.header[:cut], dict(e.payloads))])
        assert result.rejected and not result.accepted
    upd = e.payloads["memory"]
    result = db.ingest([(e.header, {"memory": upd[:-1]})])
    assert [r for _, r, _ in result.rejected] == ["entry.payload"]
    assert state(db) == before


def test_missing_parents_wait_in_pending_then_apply(db):
    src = replica(db)
    a = write(src, ALICE, {"key": "p1", "value": "first"})
    b = write(src, ALICE, {"key": "p2", "value": "second"})
    dst = replica(db)
    eb = src.storage.get(src.id, b)
    ea = src.storage.get(src.id, a)
    r = dst.ingest([(eb.header, dict(eb.payloads))])
    assert r.pending == [b] and not r.accepted
    r = dst.ingest([(ea.header, dict(ea.payloads))])
    assert set(r.accepted) == {a, b}
    assert state(dst) == state(src)
    assert dst.storage.pending(dst.id) == []


def test_erased_payload_keeps_entry_and_later_entries_valid(db):
    e1 = write(db, ALICE, {"key": "secret", "value": "password123"})
    e2 = write(db, ALICE, {"key": "after", "value": "still here"})
    db.erase(ADMIN, e1, "memory")
    values = [r.value["value"] for r in db.rows("memory")]
    assert "password123" not in values and "still here" in values
    assert db.is_accepted(e1) and db.is_accepted(e2)
    assert db.storage.get(db.id, e1).payloads["memory"] is None
    # A replica fed the erased log verifies every entry and holds the same state.
    other = replica(db)
    assert state(other) == state(db)
    txt = db.doc("memory").get("memory", type=pycrdt.Map).to_py()
    assert "password123" not in repr(txt)


def test_revocation_arriving_late_voids_concurrent_writes_and_rebuilds():
    d = new_db(ADMIN)
    grant(d, ADMIN, ALICE, "write", 10)
    alice_side = replica(d)
    revoke(d, ADMIN, ALICE)  # the admin has not seen what Alice writes next
    w = write(alice_side, ALICE, {"key": "k", "value": "written while being revoked"})
    feed(d, alice_side)
    assert d.verdict(w).reason == "auth.voided"
    feed(alice_side, d)
    assert alice_side.verdict(w).reason == "auth.voided"
    assert [r.value for r in alice_side.rows("memory")] == []
    assert state(alice_side) == state(d)


def test_explain_names_signer_and_grant(db):
    entry_id = db.rows("memory")[0].entry_id
    text = db.explain(entry_id)
    assert str(ALICE.public) in text
    assert "grant" in text.lower()


def test_storage_failure_leaves_memory_consistent(db, monkeypatch):
    before = state(db)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(db.storage, "append", boom)
    with pytest.raises(OSError):
        write(db, ALICE, {"key": "lost", "value": "never acknowledged"})
    monkeypatch.undo()
    assert state(db) == before
    write(db, ALICE, {"key": "next", "value": "works again"})


def test_pending_area_is_bounded_and_refuses_clearly(db):
    src = replica(db)
    ids = [write(src, ALICE, {"key": f"p{i}", "value": str(i)}) for i in range(6)]
    storage = MemoryStorage(max_pending=3)
    storage.add_database(db.id)
    dst = Database(storage, db.id)
    first, rest = ids[0], ids[1:]
    base = [s for s in src.storage.entries(src.id) if s.id not in ids]
    dst.ingest((s.header, dict(s.payloads)) for s in base)
    orphans = [src.storage.get(src.id, i) for i in rest]
    result = dst.ingest((s.header, dict(s.payloads)) for s in orphans)
    assert len(result.pending) == 3
    assert [r for _, r, _ in result.rejected] == ["entry.pending_full"] * 2
    assert len(storage.pending(db.id)) == 3
    # The missing parent arrives: the waiting entries apply; the refused ones come again later.
    e0 = src.storage.get(src.id, first)
    result = dst.ingest([(e0.header, dict(e0.payloads))])
    assert set(result.accepted) == {first, *rest[:3]}
    dst.ingest((s.header, dict(s.payloads)) for s in orphans)
    assert state(dst) == state(src) and storage.pending(db.id) == []


def test_interleaved_transactions_of_one_key_cannot_mislabel_rows(db):
    t1 = db.transaction(ALICE)
    key1 = t1.append("memory", {"key": "a", "value": "first"})
    write(db, ALICE, {"key": "b", "value": "committed in between"})
    with pytest.raises(MemmeshError) as err:
        t1.commit()
    assert "run the transaction again" in str(err.value)
    t2 = db.transaction(ALICE)
    key2 = t2.append("memory", {"key": "a", "value": "first"})
    t2.commit()
    assert key2 != key1 and key2 in {r.key for r in db.rows("memory")}


def test_values_yjs_cannot_hold_are_refused_before_signing(db):
    before = state(db)
    txn = db.transaction(ALICE)
    txn.append("memory", {"key": "x", "value": {1, 2}})
    with pytest.raises(RejectedError) as err:
        txn.commit()
    assert err.value.reason == "entry.value"
    assert state(db) == before


def test_collector_is_restored_after_batches_even_when_they_fail(db, monkeypatch):
    import gc

    src = replica(db)
    for i in range(40):
        write(src, ALICE, {"key": f"g{i}", "value": "x"})
    batch = [(s.header, dict(s.payloads)) for s in src.storage.entries(src.id)]
    assert gc.isenabled()
    fresh = replica(db)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(fresh.storage, "append", boom)
    with pytest.raises(OSError):
        fresh.ingest(batch)
    assert gc.isenabled()
    monkeypatch.undo()
    fresh.ingest(batch)
    assert gc.isenabled() and state(fresh) == state(src)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_entries_are_refused_and_change_nothing(data):
    d = new_db(ADMIN)
    grant(d, ADMIN, ALICE, "write", 10)
    e = craft(d, ALICE, {"memory": rows_update(ALICE, "memory", 0, [{"key": "k", "value": "v" * 40}])})
    before = state(d)
    count = len(list(d.storage.entries(d.id)))
    header, payload = bytearray(e.header), bytearray(e.payloads["memory"])
    target = data.draw(st.sampled_from(["header", "payload"]))
    buf = header if target == "header" else payload
    i = data.draw(st.integers(0, len(buf) - 1))
    buf[i] ^= data.draw(st.integers(1, 255))
    result = d.ingest([(bytes(header), {"memory": bytes(payload)})])
    assert not result.accepted and not result.stored_rejected and result.rejected
    assert len(list(d.storage.entries(d.id))) == count
    assert state(d) == before
    # The original still goes in afterwards: a refused copy leaves no trace that blocks it.
    assert d.ingest([(e.header, dict(e.payloads))]).accepted == [e.id]


def test_a_failing_observer_never_makes_a_committed_ingest_look_failed(caplog):
    """Observers (the event stream, the sync daemon's push) run after the commit: if one raises,
    the write and the received entries are still stored and reported as such."""
    admin, alice, bob = key(1), key(2), key(3)
    db = new_db(admin)
    grant(db, admin, alice, "write")
    grant(db, admin, bob, "write")
    src = replica(db)

    def broken(_what: object) -> None:
        raise RuntimeError("observer bug")

    db.on_stored(broken)
    db.on_outcome(broken)
    entry_id = write(db, alice, {"k": "local"})  # a local write: no exception, and it is stored
    assert db.is_accepted(entry_id)
    received = write(src, bob, {"k": "remote"})  # another writer: one key writes from one place
    other = replica(db)  # has the local write, not src's entry
    other.on_stored(broken)
    other.on_outcome(broken)
    feed(other, src)
    assert other.is_accepted(received)
    assert sum("observer of database ingests failed" in r.getMessage() for r in caplog.records) >= 2
    reopened = Database.open(db.storage, db.id)
    assert reopened.is_accepted(entry_id)


def test_small_rows_follow_every_change_of_their_store():
    admin, writer = key(1), key(2)
    db = new_db(admin)
    grant(db, admin, writer, "write")
    first = write(db, writer, {"set": "a"}, store="config")
    assert [r.value for r in db.small_rows("config")] == [{"set": "a"}]
    write(db, writer, {"other": 1}, store="history")  # another store: the cached rows stay
    write(db, writer, {"set": "b"}, store="config")
    assert [r.value for r in db.small_rows("config")] == [{"set": "a"}, {"set": "b"}]
    db.erase(writer, first, "config")  # an erased payload is hidden at once
    assert [r.value for r in db.small_rows("config")] == [{"set": "b"}]
    late = write(db, writer, {"set": "c"}, store="config")
    revoke(db, admin, writer)  # a revocation rebuilds; what the writer wrote before it stays
    assert [r.value for r in db.small_rows("config")] == [r.value for r in db.rows("config")]
    assert late in {r.entry_id for r in db.small_rows("config")}
    other = replica(db)
    assert [r.value for r in other.small_rows("config")] == [r.value for r in db.small_rows("config")]
