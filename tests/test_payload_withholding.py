"""A missing payload is never an erasure by itself; only a signed, valid erase erases.

A relay (no key needed) that forwards entries without their payloads can delay rows, never
remove them: the entry waits as "payload pending" and a later copy fills it in. An erase is an
entry of the `_erase` store, judged by the validity rule: by the entry's author (Write) or by an
admin; it replicates, every replica deletes the payload, and the payload is not taken again.
"""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.auth.errors import AuthError
from memmesh.crdt.database import Database
from memmesh.crdt.erasure import ERASE, EraseOp
from memmesh.crdt.storage import MemoryStorage
from memmesh.node.storage import SqliteStorage
from tests.dbkit import craft, feed, grant, key, new_db, replica, rows_update, state, write

ADMIN, ALICE, BOB, MALLORY = key(1), key(2), key(3), key(4)


def _fresh(db_id: str, storage=None) -> Database:
    storage = storage or MemoryStorage()
    storage.add_database(db_id)
    return Database(storage, db_id)


def _stripped(db: Database, store: str = "memory"):
    """Every stored entry as a relay that drops `store` payloads would forward it."""
    return [(s.header, {k: (None if k == store else v) for k, v in s.payloads.items()})
            for s in db.storage.entries(db.id)]


def _full(db: Database):
    return [(s.header, dict(s.payloads)) for s in db.storage.entries(db.id)]


def _values(db: Database) -> list[str]:
    return sorted(r.value["value"] for r in db.rows("memory"))


@pytest.fixture
def origin() -> Database:
    db = new_db(ADMIN)
    grant(db, ADMIN, ALICE, "write")
    grant(db, ADMIN, BOB, "write")
    write(db, ALICE, {"key": "a", "value": "alice 1"})
    write(db, BOB, {"key": "b", "value": "bob 1"})
    write(db, ALICE, {"key": "c", "value": "alice 2"})
    return db


def test_relay_without_payloads_delays_rows_on_a_chain_of_three(origin):
    """origin -> A (stripped) -> B -> C: nothing of a stripped entry is applied or treated as
    erased; when the full copies arrive (at A only), the chain converges on every row."""
    a, b, c = _fresh(origin.id), _fresh(origin.id), _fresh(origin.id)
    ra = a.ingest(_stripped(origin))
    without_memory = [s.id for s in origin.storage.entries(origin.id) if "memory" not in s.payloads]
    assert ra.accepted == without_memory and ra.rejected == []  # root and grants: nothing stripped
    assert _values(a) == [] and a.meta() == {"display_name": "t", "kind": "bank"}
    assert a.wanted()["pending_payloads"], "the entries wait for their payloads"
    stripped_ids = set(a.pending_ids())
    assert all("waits in the pending area for its payloads" in a.explain(i) or "its parents" in a.explain(i)
               for i in stripped_ids)
    feed(b, a)  # A forwards what it stored: nothing of the stripped entries
    feed(c, b)
    assert _values(b) == [] == _values(c)
    # The full copies reach A; A fills them in and the rows flow down the chain.
    a.ingest(_full(origin))
    assert a.pending_ids() == []
    feed(b, a)
    feed(c, b)
    for db in (a, b, c):
        assert _values(db) == ["alice 1", "alice 2", "bob 1"]
        assert state(db) == state(origin)


def test_stripped_copy_after_the_full_one_changes_nothing(origin):
    a = _fresh(origin.id)
    a.ingest(_full(origin))
    before = state(a)
    result = a.ingest(_stripped(origin))
    assert result.duplicates == len(origin) and result.rejected == []
    assert state(a) == before


def test_stripped_meta_is_not_lost(origin):
    """A bank's meta stripped in transit is delayed, not removed."""
    a = _fresh(origin.id)
    a.ingest(_stripped(origin, store="meta"))
    assert len(a) == 0  # even the root waits: nothing applies without its meta
    a.ingest(_full(origin))
    assert a.meta() == origin.meta() and _values(a) == _values(origin)


def test_settings_payload_always_travels_with_its_entry(origin):
    a = _fresh(origin.id)
    a.ingest(_stripped(origin, store="_settings"))
    assert len(a) == 0 and a.accepted_ids() == set()


def test_author_erases_its_own_row_on_every_replica(origin):
    target = next(r.entry_id for r in origin.rows("memory") if r.value["value"] == "alice 1")
    a, b = replica(origin), None
    erase_id = a.erase(ALICE, target, "memory")
    assert a.is_accepted(erase_id) and a.payload_state(target, "memory") == "erased"
    assert "alice 1" not in _values(a)
    assert a.storage.get(a.id, target).payloads["memory"] is None
    # What a replica forwards after the erase: the target without payload, and the erase.
    b = _fresh(origin.id)
    b.ingest(_full(a))
    assert b.payload_state(target, "memory") == "erased" and _values(b) == _values(a)
    # The origin still has the payload; it learns the erase and deletes it too.
    feed(origin, a)
    assert origin.payload_state(target, "memory") == "erased"
    assert origin.storage.get(origin.id, target).payloads["memory"] is None
    assert state(origin) == state(a) == state(b)
    assert "erased by a signed erase" in origin.explain(target)


def test_erased_payload_resent_is_refused(origin):
    target = next(r.entry_id for r in origin.rows("memory") if r.value["value"] == "alice 1")
    full = {s.id: (s.header, dict(s.payloads)) for s in origin.storage.entries(origin.id)}
    origin.erase(ADMIN, target, "memory")
    before = state(origin)
    result = origin.ingest([full[target]])
    assert [(i, r) for i, r, _ in result.rejected] == [(target, "entry.erased")]
    assert origin.storage.get(origin.id, target).payloads["memory"] is None
    assert state(origin) == before
    assert origin.refusal_counts()[""]["entry.erased"] == 1
    # A fresh replica that gets the erase first never stores the payload either.
    fresh = _fresh(origin.id)
    fresh.ingest(_full(origin))
    fresh.ingest([full[target]])
    assert fresh.storage.get(fresh.id, target).payloads["memory"] is None
    assert "alice 1" not in _values(fresh)


def test_erase_by_a_non_author_non_admin_is_refused(origin):
    target = next(r.entry_id for r in origin.rows("memory") if r.value["value"] == "alice 1")
    before = state(origin)
    # Locally: the node says what to do.
    with pytest.raises(AuthError, match="may not administer"):
        origin.erase(BOB, target, "memory")
    # Signed by hand, as an attacker holding Bob's write key would: refused by the rule.
    op = EraseOp(target, "memory", str(ALICE.public))
    forged = craft(origin, BOB, {ERASE: rows_update(BOB, ERASE, 0, [op.value()])})
    result = origin.ingest([(forged.header, dict(forged.payloads))])
    assert not origin.is_accepted(forged.id)
    assert origin.payload_state(target, "memory") == "present"
    assert state(origin)["rows"]["memory"] == before["rows"]["memory"]
    assert "needs Admin" in origin.explain(forged.id) or any(r == "auth.not_admin" for _, r, _ in result.rejected)
    # A key that holds nothing at all: refused before storage.
    op2 = EraseOp(target, "memory", str(ALICE.public))
    stranger = craft(origin, MALLORY, {ERASE: rows_update(MALLORY, ERASE, 0, [op2.value()])}, seq=0, prev=None)
    result = origin.ingest([(stranger.header, dict(stranger.payloads))])
    assert [r for _, r, _ in result.rejected] == ["auth.unknown_key"]
    assert origin.payload_state(target, "memory") == "present"


def test_erase_claiming_the_wrong_author_erases_nothing(origin):
    """Bob may erase his own payloads with Write; claiming Alice's entry is his does nothing."""
    target = next(r.entry_id for r in origin.rows("memory") if r.value["value"] == "alice 1")
    op = EraseOp(target, "memory", str(BOB.public))  # a false claim: the author is Alice
    forged = craft(origin, BOB, {ERASE: rows_update(BOB, ERASE, 0, [op.value()])})
    origin.ingest([(forged.header, dict(forged.payloads))])
    assert origin.is_accepted(forged.id)  # a well-formed erase of "Bob's" entry...
    assert origin.payload_state(target, "memory") == "present"  # ...that erases nothing
    assert "alice 1" in _values(origin)


def test_settings_cannot_be_erased(origin):
    settings_entry = next(s.id for s in origin.storage.entries(origin.id) if "_settings" in s.payloads)
    with pytest.raises(Exception, match="cannot be erased"):
        origin.erase(ADMIN, settings_entry, "_settings")
    op = {"op": "erase", "entry": settings_entry, "store": "_settings", "author": str(ADMIN.public)}
    forged = craft(origin, ADMIN, {ERASE: rows_update(ADMIN, ERASE, 0, [op])})
    result = origin.ingest([(forged.header, dict(forged.payloads))])
    assert [r for _, r, _ in result.rejected] == ["erase.bad_op"]


def test_erase_survives_restart_and_is_mended_after_a_crash(tmp_path, origin):
    """The erase entry is committed before the bytes are deleted; reopening finishes the job."""
    storage = SqliteStorage(tmp_path / "node.sqlite")
    db = _fresh(origin.id, storage)
    db.ingest(_full(origin))
    target = next(r.entry_id for r in db.rows("memory") if r.value["value"] == "bob 1")
    erase_id = db.erase(BOB, target, "memory")
    storage.close()
    storage = SqliteStorage(tmp_path / "node.sqlite")
    reopened = Database.open(storage, origin.id)
    assert reopened.is_accepted(erase_id)
    assert reopened.payload_state(target, "memory") == "erased" and "bob 1" not in _values(reopened)
    # Now the crash case: the bytes are back in storage (as if the delete never ran).
    original = {s.id: s for s in origin.storage.entries(origin.id)}[target].payloads["memory"]
    storage.fill_payload(origin.id, target, "memory", original)
    storage.close()
    storage = SqliteStorage(tmp_path / "node.sqlite")
    mended = Database.open(storage, origin.id)
    assert storage.get(origin.id, target).payloads["memory"] is None
    assert "bob 1" not in _values(mended)
    storage.close()


def test_payload_filled_in_for_a_header_taken_in_under_an_erase_that_is_not_valid(origin):
    """An erase that turns out invalid does not erase: the header it covered is taken in
    (so the DAG proceeds), its payload is pending, and a full copy fills it in."""
    target = next(r.entry_id for r in origin.rows("memory") if r.value["value"] == "alice 1")
    op = EraseOp(target, "memory", str(ALICE.public))
    forged = craft(origin, BOB, {ERASE: rows_update(BOB, ERASE, 0, [op.value()])})  # needs Admin: invalid
    full = _full(origin)
    stripped = [(h, {k: (None if k == "memory" and i == target else v) for k, v in p.items()})
                for (h, p), i in zip(full, [s.id for s in origin.storage.entries(origin.id)])]
    a = _fresh(origin.id)
    a.ingest(stripped + [(forged.header, dict(forged.payloads))])
    assert a.storage.has(a.id, target) and a.payload_state(target, "memory") == "pending"
    assert (target, "memory") in a.wanted()["payloads"]
    assert "alice 1" not in _values(a)
    result = a.ingest(full)
    assert (target, "memory") in result.filled
    assert a.payload_state(target, "memory") == "present" and "alice 1" in _values(a)
    origin.ingest([(forged.header, dict(forged.payloads))])
    assert state(a) == state(origin)


# ------------------------------------------------------------------- convergence, with payloads
# withheld in transit and filled in later, and with signed erases among the entries.

KEYS = [key(n) for n in range(20, 24)]


def _history(rnd: random.Random) -> Database:
    db = new_db(KEYS[0])
    for k in KEYS[1:]:
        grant(db, KEYS[0], k, rnd.choice(["write", "admin"]), rnd.randint(1, 3))
    written = []
    for n in range(rnd.randint(4, 12)):
        who = rnd.choice(KEYS)
        written.append((write(db, who, {"key": f"k{n % 4}", "value": f"v{n}"}), who))
    for entry_id, who in rnd.sample(written, k=rnd.randint(0, min(3, len(written)))):
        eraser = who if rnd.random() < 0.5 else KEYS[0]
        db.erase(eraser, entry_id, "memory")
    return db


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False))
def test_replicas_converge_with_payloads_withheld_and_erased(rnd: random.Random):
    origin = _history(rnd)
    entries = {s.id: (s.header, dict(s.payloads)) for s in origin.storage.entries(origin.id)}
    # Before the erasures the payloads existed: a relay may still hold and forward them.
    states = []
    for _ in range(3):
        target = _fresh(origin.id)
        delivery = []
        for header, payloads in entries.values():
            if rnd.random() < 0.4:  # relayed stripped first, full later (if the origin kept it)
                delivery.append((header, dict.fromkeys(payloads)))
            delivery.append((header, payloads))
        rnd.shuffle(delivery)
        i = 0
        while i < len(delivery):
            size = rnd.randint(1, 5)
            target.ingest(delivery[i:i + size])
            i += size
        # Whatever arrived stripped and was not erased is filled in by a last full pass.
        target.ingest(list(entries.values()))
        assert target.pending_ids() == []
        assert target.wanted()["payloads"] == []
        states.append(state(target))
        assert state(Database.open(target.storage, origin.id)) == states[-1]
    assert states[0] == states[1] == states[2] == state(origin)
