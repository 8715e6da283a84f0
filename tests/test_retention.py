"""Retention and forgetting (issue 12, item 7): a signed policy, a preview equal to the run, and
replicas that end with the same entries. Real databases and keys; entry times from a clock the
test sets (the entries' signed ts), the run's "now" passed explicitly."""
from __future__ import annotations

import hashlib
import zlib

import pytest

from memmesh.crdt.database import Database
from memmesh.crdt.storage import MemoryStorage
from memmesh.node.episodes.methods import method_id, promoted
from memmesh.node.retention import (
    DAY_MS,
    EPISODES_STORE,
    HISTORY_TEXT_STORE,
    PolicyError,
    plan,
    policy_in_force,
    policy_value,
    run,
)
from tests.dbkit import feed, grant, key, replica, write

T0 = 1_700_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def setup():
    clock = Clock()
    admin = key(1)
    db = Database.create(MemoryStorage(), admin, meta={"kind": "agent", "display_name": "alpha"}, clock=clock)
    return db, admin, clock


def set_policy(db, who, **kw):
    return write(db, who, policy_value(**kw).value(), store="retention")


def turn(db, who, session, seq, text, store_text=True):
    h = hashlib.sha256(text.encode()).hexdigest()
    txn = db.transaction(who)
    txn.append("history", {"session": session, "seq": seq, "role": "user", "text": h})
    if store_text:
        txn.append("history_text", {"hash": h, "z": zlib.compress(text.encode())})
    return txn.commit()


def chunk(db, who, session, a, b):
    return write(db, who, {"id": f"c{a}", "session": session, "level": 1, "from_seq": a, "to_seq": b,
                           "children": [], "summary": "s", "by": "extractive"}, store="history_chunks")


def episode(db, who, outcome, checked_by="test", kind="deploy", tools=("build", "push")):
    return write(db, who, {"kind": kind, "steps": [{"tool": t, "status": "ok"} for t in tools],
                           "outcome": outcome, "checked_by": checked_by}, store=EPISODES_STORE)


def test_no_policy_forgets_nothing_and_a_policy_counts_only_when_an_admin_signed_it(setup):
    db, admin, _ = setup
    episode(db, admin, "success")
    assert policy_in_force(db) is None and plan(db, T0 + 1000 * DAY_MS) == []
    writer = key(2)
    grant(db, admin, writer, "write")
    set_policy(db, writer, days=1)  # stored, but a writer's policy does not count
    assert policy_in_force(db) is None
    set_policy(db, admin, days=30)
    assert policy_in_force(db).days == 30
    set_policy(db, writer, days=1)
    assert policy_in_force(db).days == 30  # still the admin's


@pytest.mark.parametrize("bad", [dict(days=0), dict(days=36_501), dict(days=True), dict(days=30, compress_after=0),
                                 dict(days=30, success_x=0), dict(days=30, failure_x=float("nan")),
                                 dict(days=30, keep_promoted_evidence="yes")])
def test_a_bad_policy_is_refused(bad):
    with pytest.raises(PolicyError):
        policy_value(**bad)


def test_episodes_go_by_outcome_and_age_and_people_and_promoted_evidence_stay(setup):
    db, admin, clock = setup
    ok = episode(db, admin, "success")
    failed = episode(db, admin, "failure")
    unknown = episode(db, admin, "unknown")
    person = episode(db, admin, "success", checked_by="person")
    evidence = episode(db, admin, "success", kind="release", tools=("tag", "publish"))
    write(db, admin, {"op": "promote", "method": {
        "id": method_id("release", ("tag", "publish")), "kind": "release", "sequence": ["tag", "publish"],
        "checked": 1, "successes": 1, "with_sequence": 1, "confidence": 1.0, "evidence": [evidence]}},
        store="methods")
    assert [m.kind for m in promoted(db)] == ["release"]  # the promotion counts (an admin signed it)
    set_policy(db, admin, days=30, failure_x=3, keep_promoted_evidence=True)
    at = lambda days: {f.entry for f in plan(db, T0 + days * DAY_MS)}  # noqa: E731
    assert at(29) == set()
    assert at(31) == {ok, unknown}
    assert at(91) == {ok, unknown, failed}  # failures are kept three times as long
    set_policy(db, admin, days=30, failure_x=3)
    assert at(91) == {ok, unknown, failed, evidence}  # without keep_promoted_evidence
    assert person not in at(10_000)


def test_compression_erases_only_texts_every_covering_turn_may_lose(setup):
    db, admin, clock = setup
    entries = [turn(db, admin, "s1", i, f"turn number {i} of the first session") for i in range(1, 11)]
    shared = turn(db, admin, "s1", 11, "a text said again later")
    chunk(db, admin, "s1", 1, 10)
    turn(db, admin, "s2", 1, "a text said again later", store_text=False)  # the same text, stored once
    set_policy(db, admin, days=365, compress_after=7)
    assert plan(db, T0 + 6 * DAY_MS) == []  # too young
    found = plan(db, T0 + 8 * DAY_MS)
    # the ten covered turns lose their text; the shared text stays: s1#11 and s2#1 are not covered
    assert {(f.entry, f.store) for f in found} == {(e, HISTORY_TEXT_STORE) for e in entries}
    assert shared not in {f.entry for f in found}


def test_the_preview_is_the_run_and_replicas_end_with_the_same_entries(setup):
    db, admin, clock = setup
    other = replica(db)
    for i in range(1, 11):
        turn(db, admin, "s1", i, f"words of turn {i}")
    chunk(db, admin, "s1", 1, 10)
    for outcome in ("success", "failure", "success"):
        episode(db, admin, outcome)
    set_policy(db, admin, days=30, compress_after=7)
    feed(other, db)
    now = T0 + 40 * DAY_MS
    preview = plan(db, now)
    assert preview == plan(other, now)  # the same entries give the same set on every replica
    entries_before = len(db)
    done, erase_entries = run(db, admin, now)
    assert done == preview and len(db) == entries_before + len(erase_entries)
    assert all(db.payload_state(f.entry, f.store) == "erased" for f in done)
    assert plan(db, now) == []  # nothing left to do
    feed(other, db)
    assert set(other.accepted_ids()) == set(db.accepted_ids())
    assert all(other.payload_state(f.entry, f.store) == "erased" for f in done)
    assert [r.value for r in other.rows(EPISODES_STORE)] == [r.value for r in db.rows(EPISODES_STORE)]


def test_through_the_cli_set_show_preview_and_run(tmp_path):
    from memmesh.node import Node

    node = Node.open(tmp_path / "home")
    try:
        node.agents.create_agent("alpha")
        db = node.agents.agent("alpha").db
        agent_key = node.agents.resolve("alpha").admin_key
        episode(db, agent_key, "success")
        with pytest.raises(PolicyError):
            node.run("retention.run", {"db": "alpha"})  # no policy yet: refused, nothing written
        before = len(db)
        with pytest.raises(Exception, match="greater than or equal to 1"):
            node.run("retention.set", {"db": "alpha", "days": 0})
        assert len(db) == before
        out = node.run("retention.set", {"db": "alpha", "days": 30})
        assert out.data["policy"]["days"] == 30
        assert node.run("retention.show", {"db": "alpha"}).data["policy"]["days"] == 30
        later = "2099-01-01"
        heads = db.heads
        preview = node.run("retention.preview", {"db": "alpha", "now": later}).data
        assert preview["episodes"] == 1 and db.heads == heads  # a preview writes nothing
        done = node.run("retention.run", {"db": "alpha", "now": later}).data
        assert done["erase"] == preview["erase"] and len(done["entries"]) == 1
        assert node.run("retention.preview", {"db": "alpha", "now": later}).data["episodes"] == 0
    finally:
        node.close()
