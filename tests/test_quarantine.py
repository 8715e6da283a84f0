"""Quarantine of a writer (node/memory/quarantine.py, node/commands/quarantine.py).

The fold first, on real databases and real keys: which quarantine and release rows count
(admins only, never on a stronger key, releases only by an admin at least as strong and only
after the quarantine), rows crafted by hand the way a hostile writer could sign them, time
ranges and the mask; then the commands through the registry and the command line (refusals
before anything is written, a preview that writes nothing); then, as a property, entries of
several writers, a quarantine and a release delivered to replicas in any order give the same
quarantines and hide the same rows.

The last test reads what recall, auto-recall and neighbours show: the memory view applies the
quarantines (node/memory/view.py).
"""
from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memmesh.node.commands.quarantine  # noqa: F401  (registers the commands until node/commands imports it)
from memmesh.auth.errors import AuthError
from memmesh.auth.ops import GrantOp
from memmesh.crdt.database import Database
from memmesh.crdt.storage import MemoryStorage
from memmesh.node import Node
from memmesh.node.commands import ParamsError
from memmesh.node.commands.quarantine import AlreadyReleased, UnknownQuarantine
from memmesh.node.memory.quarantine import (
    QUARANTINE_STORE,
    Quarantine,
    hidden_mask,
    hides,
    quarantine_value,
    quarantines,
    release_value,
)
from memmesh.node.memory.rows import MemoryInputError
from memmesh.node.registry import UnknownName
from tests.dbkit import craft, feed, key, key_str, next_clock, revoke, rows_update, write
from tests.homes import agent_with_bank
from tests.test_cli import mm_here

ROOT, WEAK, W1, W2, OTHER, WEAKER = (key(n) for n in (1, 2, 3, 4, 5, 6))
K = {k: str(k.public) for k in (ROOT, WEAK, W1, W2, OTHER, WEAKER)}
NO_ID = "sha256:" + "0" * 64


class Clock:
    """The entries' timestamps (ms), set by the test."""

    def __init__(self, now: int = 1_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def bank(clock: Clock | None = None) -> Database:
    """ROOT Admin(0), WEAK Admin(5), WEAKER Admin(7), W1 and W2 Write(10), OTHER nothing."""
    db = Database.create(MemoryStorage(), ROOT, meta={"kind": "bank", "display_name": "t"}, clock=clock)
    db.change_settings(ROOT, [GrantOp(K[WEAK], "admin", 5), GrantOp(K[WEAKER], "admin", 7),
                              GrantOp(K[W1], "write", 10), GrantOp(K[W2], "write", 10)])
    return db


def copy(db: Database, clock: Clock | None = None) -> Database:
    storage = MemoryStorage()
    storage.add_database(db.id)
    other = Database(storage, db.id, clock=clock)
    feed(other, db)
    return other


def memory(db: Database, who, k: str, value: str = "some text") -> str:
    return write(db, who, {"key": k, "value": value, "tags": []})


def put(db: Database, who, value: Any) -> str:
    """A quarantine-store row signed by ``who`` (any writer may put one there)."""
    return write(db, who, value, QUARANTINE_STORE)


def crafted(db: Database, who, values: list[Any], parents: list[str] | None = None) -> str:
    """An entry of quarantine rows signed by hand, as a peer could send it."""
    update = rows_update(who, QUARANTINE_STORE, next_clock(db, who, QUARANTINE_STORE), values)
    entry = craft(db, who, {QUARANTINE_STORE: update}, parents=parents)
    db.ingest([(entry.header, dict(entry.payloads))])
    assert db.is_accepted(entry.id), db.explain(entry.id)
    return entry.id


def q_row(target: str, start: str | None = None, end: str | None = None) -> dict[str, Any]:
    return {"op": "quarantine", "key": target, "from": start, "to": end}


def ids(db: Database) -> list[str]:
    return [q.id for q in quarantines(db)]


# ---------------------------------------------------------------------------------- settings_at
def test_settings_at_is_the_entrys_past_without_the_entry():
    db = bank()
    g = db.change_settings(ROOT, [GrantOp(K[OTHER], "write", 10)])
    after = memory(db, OTHER, "k")
    assert db.settings_at(g).permission(K[OTHER]) is None  # the grant itself is not in its past
    assert str(db.settings_at(after).permission(K[OTHER])) == "Write(10)"
    assert db.settings_at(db.id).keys() == []  # the root's past is empty
    assert db.settings_at(NO_ID) is None
    refused = craft(db, OTHER, {"_settings": rows_update(OTHER, "_settings", 0, [
        {"op": "grant", "key": K[OTHER], "perm": "write", "priority": 10}])})
    db.ingest([(refused.header, dict(refused.payloads))])
    assert not db.is_accepted(refused.id) and db.settings_at(refused.id) is None


# ---------------------------------------------------------------------------------- the fold
def test_an_admins_quarantine_counts():
    clock = Clock(5_000)
    db = bank(clock)
    e = put(db, ROOT, quarantine_value(K[W1], None, None))
    assert quarantines(db) == [Quarantine(e, K[W1], None, None, K[ROOT], 5_000)]
    [q] = quarantines(db)
    assert q.active and q.covers(K[W1], 0) and q.covers(K[W1], 10**15) and not q.covers(K[W2], 0)


def test_a_writers_quarantine_row_does_not_count():
    db = bank()
    put(db, W1, quarantine_value(K[W2], None, None))  # W1 may write the store: the row is shown ...
    assert [r.author for r in db.rows(QUARANTINE_STORE)] == [K[W1]]
    assert quarantines(db) == []  # ... and ignored


def test_a_weaker_admin_cannot_quarantine_a_stronger_key_even_by_hand():
    db = bank()
    db.change_settings(ROOT, [GrantOp(K[W2], "write", 3)])  # a writer stronger than WEAK's Admin(5)
    for target in (ROOT, W2):
        crafted(db, WEAK, [q_row(K[target])])
    assert quarantines(db) == []
    same = crafted(db, WEAK, [q_row(K[WEAK])])  # the same priority is allowed, as for revoke
    weaker = crafted(db, WEAK, [q_row(K[WEAKER])])
    writer = crafted(db, WEAK, [q_row(K[W1])])
    assert ids(db) == [same, weaker, writer]


def test_a_key_granted_nothing_may_be_quarantined():
    db = bank()
    e = put(db, WEAKER, quarantine_value(K[OTHER], None, None))
    assert ids(db) == [e]


def test_the_target_is_judged_in_the_quarantines_past():
    """W2 promoted above WEAK after WEAK's quarantine: the quarantine still counts (its past
    decided), and one signed after the promotion does not."""
    db = bank()
    before = put(db, WEAK, quarantine_value(K[W2], None, None))
    db.change_settings(ROOT, [GrantOp(K[W2], "admin", 1)])
    put(db, WEAK, quarantine_value(K[W2], 0, 10))
    assert ids(db) == [before]


def test_only_the_first_well_formed_quarantine_row_of_an_entry_counts():
    db = bank()
    e = crafted(db, ROOT, ["not a quarantine", q_row(K[W1]), q_row(K[W2]), {"op": "release", "quarantine": NO_ID}])
    assert [(q.id, q.key) for q in quarantines(db)] == [(e, K[W1])]
    refused_first = crafted(db, WEAK, [q_row(K[ROOT]), q_row(K[W2])])  # the first does not count: nor the entry
    assert refused_first not in ids(db)


@pytest.mark.parametrize("value", [
    "text", 7, [q_row(key_str("x"))], {"op": "quarantine"}, {**q_row(key_str("x")), "extra": 1},
    {"op": "quarantine", "key": key_str("x"), "from": None},  # "to" missing
    q_row("ed25519:short"), q_row(K[W1].upper()), {**q_row(K[W1]), "key": 5},
    q_row(K[W1], "2026-01-02", "2026-01-01"), q_row(K[W1], "2026-01-01", "2026-01-01"),
    q_row(K[W1], "yesterday"), q_row(K[W1], None, 5), q_row(K[W1], True),
    {"op": "release", "quarantine": "sha256:abc"}, {"op": "release"}, {"op": "undo", "key": K[W1]},
    {"op": "release", "quarantine": NO_ID, "also": 1}, {"op": ["quarantine"], "key": key_str("x")},
], ids=repr)
def test_malformed_rows_are_ignored_never_raise(value):
    db = bank()
    crafted(db, ROOT, [value])
    assert quarantines(db) == []


def test_release_rules():
    clock = Clock(1_000)
    db = bank(clock)
    by_weak = put(db, WEAK, quarantine_value(K[W1], None, None))
    by_root = put(db, ROOT, quarantine_value(K[W2], None, None))
    put(db, WEAKER, release_value(by_weak))  # Admin(7) after Admin(5): weaker, ignored
    put(db, WEAK, release_value(by_root))  # Admin(5) releasing Admin(0)'s: ignored
    put(db, W1, release_value(by_weak))  # a writer: ignored
    put(db, ROOT, release_value(NO_ID))  # unknown: ignored
    assert all(q.active for q in quarantines(db))
    clock.now = 2_000
    released = put(db, ROOT, release_value(by_weak))  # stronger than the quarantiner: counts
    clock.now = 3_000
    put(db, WEAK, release_value(by_weak))  # a second release changes nothing: the first in T order
    got = {q.id: q for q in quarantines(db)}
    assert (got[by_weak].released_by, got[by_weak].released_ts) == (released, 2_000)
    assert got[by_root].active
    own = put(db, ROOT, release_value(by_root))  # the quarantiner itself
    assert {q.id: q.released_by for q in quarantines(db)} == {by_weak: released, by_root: own}


def test_a_release_counts_only_after_its_quarantine():
    db = bank()
    base = list(db.heads)  # ROOT's last entry is among them: its next entry may name them alone
    q = put(db, WEAK, quarantine_value(K[W1], None, None))
    crafted(db, ROOT, [release_value(q)], parents=base)  # concurrent with the quarantine: never saw it
    [got] = quarantines(db)
    assert got.active
    same_entry = crafted(db, ROOT, [q_row(K[W2]), release_value("sha256:" + "1" * 64)])
    assert same_entry in ids(db)
    put(db, ROOT, release_value(q))
    assert not next(x for x in quarantines(db) if x.id == q).active


def test_a_release_of_a_quarantine_that_does_not_count_is_ignored():
    db = bank()
    ignored = crafted(db, WEAK, [q_row(K[ROOT])])
    put(db, ROOT, release_value(ignored))
    assert quarantines(db) == []


def test_revoking_the_quarantiner_later_keeps_its_quarantine():
    db = bank()
    q = put(db, WEAK, quarantine_value(K[W1], None, None))
    revoke(db, ROOT, WEAK)
    assert ids(db) == [q]


def test_a_quarantine_signed_concurrently_with_its_signers_revocation_is_void():
    db = bank()
    other = copy(db)
    void = put(other, WEAK, quarantine_value(K[W1], None, None))  # WEAK had not seen the revocation
    revoke(db, ROOT, WEAK)
    feed(db, other)
    feed(other, db)
    assert not db.is_accepted(void)
    assert quarantines(db) == quarantines(other) == []


# ---------------------------------------------------------------------------------- time ranges, mask
def test_time_ranges_are_from_inclusive_to_exclusive_on_the_entry_timestamp():
    clock = Clock()
    db = bank(clock)
    for ts in (1_000, 2_000, 2_999, 3_000):
        clock.now = ts
        memory(db, W1, f"at-{ts}")
    clock.now = 10_000
    value = quarantine_value(K[W1], 2_000, 3_000)
    assert value == q_row(K[W1], "1970-01-01T00:00:02.000Z", "1970-01-01T00:00:03.000Z")
    put(db, ROOT, value)
    qs = quarantines(db)
    hidden = [r.value["key"] for r in db.rows("memory") if hides(qs, r.author, r.ts)]
    assert hidden == ["at-2000", "at-2999"]
    assert (qs[0].start, qs[0].end) == (2_000, 3_000)
    open_start = Quarantine("x", K[W1], None, 2_000, K[ROOT], 0)
    open_end = Quarantine("x", K[W1], 2_000, None, K[ROOT], 0)
    assert [open_start.covers(K[W1], t) for t in (-5, 1_999, 2_000)] == [True, True, False]
    assert [open_end.covers(K[W1], t) for t in (1_999, 2_000, 10**12)] == [False, True, True]


def test_iso_times_in_rows_are_read_as_utc_ms():
    db = bank()
    put(db, ROOT, q_row(K[W1], "2026-06-01", "2026-06-01T09:00:00+02:00"))
    [q] = quarantines(db)
    utc = datetime.UTC
    assert (q.start, q.end) == (int(datetime.datetime(2026, 6, 1, tzinfo=utc).timestamp() * 1000),
                                int(datetime.datetime(2026, 6, 1, 7, tzinfo=utc).timestamp() * 1000))


def test_hidden_mask():
    authors = {K[W1]: 0, K[W2]: 1, K[ROOT]: 2}
    author_col = np.array([0, 1, 0, 2, 1, 0], dtype=np.int32)
    ts_col = np.array([10, 10, 20, 30, 40, 50], dtype=np.int64)
    q1 = Quarantine("a", K[W1], 15, 50, K[ROOT], 0)
    q2 = Quarantine("b", K[W2], None, None, K[ROOT], 0)
    assert hidden_mask([q1], authors, author_col, ts_col).tolist() == [False, False, True, False, False, False]
    assert hidden_mask([q1, q2], authors, author_col, ts_col).tolist() == [False, True, True, False, True, False]
    released = Quarantine("b", K[W2], None, None, K[ROOT], 0, released_by="c", released_ts=1)
    assert hidden_mask([released], authors, author_col, ts_col) is None
    assert hidden_mask([Quarantine("d", K[OTHER], None, None, K[ROOT], 0)], authors, author_col, ts_col) is None
    assert hidden_mask([Quarantine("e", K[W1], 60, None, K[ROOT], 0)], authors, author_col, ts_col) is None
    assert hidden_mask([], authors, author_col, ts_col) is None


def test_row_values_are_strict():
    for bad in (lambda: quarantine_value("ed25519:nope", None, None), lambda: quarantine_value(K[W1], 5, 5),
                lambda: quarantine_value(K[W1], 6, 5), lambda: quarantine_value(K[W1], True, None),
                lambda: quarantine_value(K[W1], None, 10**18), lambda: quarantine_value(K[W1], "2026-01-01", None),
                lambda: release_value("sha256:abc"), lambda: release_value(None)):
        with pytest.raises(MemoryInputError):
            bad()
    assert release_value(NO_ID) == {"op": "release", "quarantine": NO_ID}
    assert quarantine_value(K[W1], None, 0)["to"] == "1970-01-01T00:00:00.000Z"


# ---------------------------------------------------------------------------------- convergence
def _hidden(db: Database) -> set[tuple[str, str]]:
    qs = quarantines(db)
    return {(r.entry_id, r.key) for r in db.rows("memory") if hides(qs, r.author, r.ts)}


def _entries(*dbs: Database) -> list[tuple[bytes, dict[str, bytes | None]]]:
    seen: dict[str, tuple[bytes, dict[str, bytes | None]]] = {}
    for db in dbs:
        for s in db.storage.entries(db.id):
            seen.setdefault(s.id, (s.header, dict(s.payloads)))
    return list(seen.values())


@st.composite
def histories(draw):
    """Writes of W1 and W2 (timestamps), a quarantine of W1 by ROOT with a range, maybe one of
    W2 by WEAK, maybe a release (by ROOT: counts; by WEAK: ignored), and the writes W1 makes
    after it saw the quarantine."""
    ts = st.integers(0, 20).map(lambda t: t * 1_000)
    start, end = draw(st.one_of(st.none(), ts)), draw(st.one_of(st.none(), ts))
    if start is not None and end is not None and start >= end:
        end = None
    return {
        "w1": draw(st.lists(ts, min_size=1, max_size=4)), "w2": draw(st.lists(ts, max_size=3)),
        "range": (start, end), "weak_on_w2": draw(st.booleans()),
        "release": draw(st.sampled_from([None, "root", "weak"])),
        "w1_after": draw(st.lists(ts, max_size=2)),
    }


def _play(h: dict[str, Any]) -> tuple[list[tuple[bytes, dict[str, bytes | None]]], Database]:
    clock = Clock()
    origin = bank(clock)
    rw1, rw2, ra, rb = (copy(origin, clock) for _ in range(4))
    for i, t in enumerate(h["w1"]):
        clock.now = t
        memory(rw1, W1, f"w1-{i}")
    for i, t in enumerate(h["w2"]):
        clock.now = t
        memory(rw2, W2, f"w2-{i}")
    clock.now = 30_000
    q = put(ra, ROOT, quarantine_value(K[W1], *h["range"]))  # concurrent with every write above
    if h["weak_on_w2"]:
        put(rb, WEAK, quarantine_value(K[W2], None, None))
    feed(rw1, ra)  # W1 sees the quarantine, and writes on
    for i, t in enumerate(h["w1_after"]):
        clock.now = t
        memory(rw1, W1, f"w1-after-{i}")
    if h["release"] is not None:
        releaser = ra if h["release"] == "root" else rb
        feed(releaser, ra)
        clock.now = 40_000
        put(releaser, ROOT if h["release"] == "root" else WEAK, release_value(q))
    everything = _entries(origin, rw1, rw2, ra, rb)
    reference = copy(origin)
    reference.ingest(everything)
    return everything, reference


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.lists(st.randoms(use_true_random=False), min_size=2, max_size=3))
def test_any_delivery_order_gives_the_same_quarantines_and_hidden_rows(h, orders):
    everything, reference = _play(h)
    expected_q, expected_hidden = quarantines(reference), _hidden(reference)
    # What the history means, whatever the delivery order:
    [root_q] = [q for q in expected_q if q.by == K[ROOT]]
    assert root_q.active == (h["release"] != "root")
    assert len(expected_q) == 1 + h["weak_on_w2"]
    start, end = h["range"]
    in_range = sum((start is None or t >= start) and (end is None or t < end) for t in h["w1"] + h["w1_after"])
    assert len(expected_hidden) == (0 if h["release"] == "root" else in_range) + h["weak_on_w2"] * len(h["w2"])
    for rnd in orders:
        shuffled = list(everything)
        rnd.shuffle(shuffled)
        storage = MemoryStorage()
        storage.add_database(reference.id)
        db = Database(storage, reference.id)
        for item in shuffled:  # one at a time: children before parents wait in the pending area
            db.ingest([item])
        assert db.heads == reference.heads and db.pending_ids() == []
        assert quarantines(db) == expected_q
        assert _hidden(db) == expected_hidden


# ---------------------------------------------------------------------------------- commands
@pytest.fixture
def node(node):
    """conftest's node (alpha, no embedder) and a bank, notes, that alpha and beta write."""
    node.run("memory.new", {"name": "notes"})
    node.run("memory.grant", {"bank": "notes", "agent": "alpha", "perm": "write"})
    node.run("agent.new", {"name": "beta"})
    node.run("memory.grant", {"bank": "notes", "agent": "beta", "perm": "write"})
    return node


def _remember(n: Node, agent: str, k: str, value: str) -> None:
    n.call_tool(agent, "remember", {"key": k, "value": value, "bank": "notes"})


def _db(n: Node) -> Database:
    return n.agents.resolve("notes").db


def _fingerprint(n: Node) -> tuple[tuple[str, ...], int]:
    db = _db(n)
    return db.heads, len(db)


def _key(n: Node, agent: str) -> str:
    return str(n.agents.agent(agent).key.public)


def test_preview_counts_and_writes_nothing(node):
    for i in range(3):
        _remember(node, "alpha", f"a{i}", f"alpha's note {i}")
    _remember(node, "alpha", "a0", "alpha's note 0, again")  # supersedes a0: 4 rows, 3 current
    _remember(node, "beta", "b0", "beta's note")
    before = _fingerprint(node)
    data = node.run("memory.quarantine", {"bank": "notes", "who": "alpha", "preview": True}).data
    assert data["preview"] is True and data["id"] is None
    assert data["hides"] == {"current": 3, "rows": 4, "already_hidden": {"current": 0, "rows": 0}}
    assert (data["key"], data["name"], data["by_name"]) == (_key(node, "alpha"), "alpha", "bank notes")
    assert _fingerprint(node) == before and quarantines(_db(node)) == []


def test_quarantine_list_and_release(node):
    _remember(node, "alpha", "a0", "alpha's note")
    _remember(node, "beta", "b0", "beta's note")
    data = node.run("memory.quarantine", {"bank": "notes", "who": _key(node, "alpha")}).data
    qid = data["id"]
    assert qid.startswith("sha256:") and data["hides"]["rows"] == 1
    assert ids(_db(node)) == [qid]
    preview = node.run("memory.quarantine", {"bank": "notes", "who": "alpha", "preview": True}).data
    assert preview["hides"]["already_hidden"] == {"current": 1, "rows": 1}
    listed = node.run("memory.quarantines", {"bank": "notes"})
    [row] = listed.data["quarantines"]
    assert (row["id"], row["name"], row["by_name"], row["active"], row["released"]) == (qid, "alpha", "bank notes",
                                                                                       True, None)
    assert row["from"] is None and row["to"] is None and row["hides"]["current"] == 1
    assert qid in listed.text and "alpha" in listed.text
    rel = node.run("memory.release", {"bank": "notes", "quarantine": qid}).data
    [row] = node.run("memory.quarantines", {"bank": "notes"}).data["quarantines"]
    assert row["active"] is False and row["released"]["entry"] == rel["released_by"]
    assert row["released"]["by_name"] == "bank notes" and row["released"]["when"].endswith("Z")
    before = _fingerprint(node)
    with pytest.raises(AlreadyReleased, match="already released"):
        node.run("memory.release", {"bank": "notes", "quarantine": qid})
    with pytest.raises(UnknownQuarantine, match="no quarantine"):
        node.run("memory.release", {"bank": "notes", "quarantine": NO_ID})
    with pytest.raises(ParamsError, match="entry id"):
        node.run("memory.release", {"bank": "notes", "quarantine": "nope"})
    assert _fingerprint(node) == before


def test_a_time_range_quarantine(node):
    _remember(node, "alpha", "a0", "alpha's note")
    data = node.run("memory.quarantine", {"bank": "notes", "who": "alpha", "from": "2000-01-01",
                                          "to": "2001-01-01"}).data
    assert (data["from"], data["to"]) == ("2000-01-01T00:00:00.000Z", "2001-01-01T00:00:00.000Z")
    assert data["hides"]["rows"] == 0  # written now, not in 2000
    [q] = quarantines(_db(node))
    assert (q.start, q.end) == (946_684_800_000, 978_307_200_000)


def _boss(n: Node) -> str:
    """An agent holding Admin(5) on the bank: weaker than the bank's own key, Admin(0)."""
    n.run("agent.new", {"name": "boss"})
    bank = n.agents.resolve("notes")
    bank.db.change_settings(bank.admin_key, [GrantOp(_key(n, "boss"), "admin", 5)])
    return str(bank.admin_key.public)


@pytest.mark.parametrize("params, error, says", [
    ({"who": "alpha", "as": "beta"}, AuthError, "beta (ed25519:"),  # a writer
    ({"who": "BANK_KEY", "as": "boss"}, AuthError, "stronger than the signer's Admin(5)"),
    ({"who": "alpha", "from": "2026-02-01", "to": "2026-01-01"}, MemoryInputError, "must be before to"),
    ({"who": "alpha", "from": "2026-01-01", "to": "2026-01-01"}, MemoryInputError, "must be before to"),
    ({"who": "alpha", "from": "soon"}, ParamsError, "ISO 8601"),
    ({"who": "nobody"}, UnknownName, "no agent named 'nobody'"),
    ({"who": "alpha", "as": "nobody"}, UnknownName, "no agent named 'nobody'"),
    ({"who": "ed25519:short"}, ParamsError, "who must be a key (ed25519: and 43 base64url characters)"),
    ({"who": ""}, ParamsError, "who"),
])
def test_refusals_write_nothing(node, params, error, says):
    bank_key = _boss(node)
    params = {k: bank_key if v == "BANK_KEY" else v for k, v in params.items()}
    before = _fingerprint(node)
    with pytest.raises(error, match=None) as err:
        node.run("memory.quarantine", {"bank": "notes", **params})
    assert says in str(err.value) and "\n" not in str(err.value)
    if error is AuthError:
        assert err.value.reason == ("auth.not_admin" if params.get("as") == "beta" else "auth.target_stronger")
    assert _fingerprint(node) == before


def test_a_weaker_admin_may_quarantine_a_writer_but_not_release_a_stronger_ones_quarantine(node):
    _boss(node)
    by_boss = node.run("memory.quarantine", {"bank": "notes", "who": "beta", "as": "boss"}).data
    assert by_boss["by_name"] == "boss"
    by_bank = node.run("memory.quarantine", {"bank": "notes", "who": "alpha"}).data["id"]
    before = _fingerprint(node)
    with pytest.raises(AuthError, match="at least as strong") as err:
        node.run("memory.release", {"bank": "notes", "quarantine": by_bank, "as": "boss"})
    assert err.value.reason == "auth.target_stronger" and _fingerprint(node) == before
    with pytest.raises(AuthError, match="holds Write"):
        node.run("memory.release", {"bank": "notes", "quarantine": by_boss["id"], "as": "alpha"})
    node.run("memory.release", {"bank": "notes", "quarantine": by_boss["id"]})  # the bank's key is stronger
    assert [q.active for q in quarantines(_db(node))] == [False, True]


@pytest.fixture
def home(home):
    """conftest's home (no embedder) with alpha writing notes, and one note there."""
    with Node.open(home) as n:
        agent_with_bank(n.run)
        n.call_tool("alpha", "remember", {"key": "a0", "value": "alpha's note", "bank": "notes"})
    return home


def test_the_command_line(home: Path):
    preview = json.loads(mm_here("memory", "quarantine", "notes", "alpha", "--preview", "--json", home=home).stdout)
    assert preview["hides"]["rows"] == 1 and preview["id"] is None
    text = mm_here("memory", "quarantine", "notes", "alpha", "--from", "2020-01-01", home=home).stdout
    assert text.startswith("quarantined alpha (ed25519:") and "rows signed from 2020-01-01T00:00:00.000Z" in text
    qid = text.rsplit("id ", 1)[1].strip()
    listed = mm_here("memory", "quarantines", "notes", home=home).stdout
    assert qid in listed and "hides 1 current memory, 1 row" in listed
    bad = mm_here("memory", "quarantine", "notes", "alpha", "--as", "nobody", home=home, check=False)
    assert bad.returncode == 1 and bad.stderr.startswith("memmesh: error: no agent named 'nobody'")
    released = json.loads(mm_here("memory", "release", "notes", qid, "--json", home=home).stdout)
    assert released["id"] == qid and released["restores"]["rows"] == 1
    again = mm_here("memory", "release", "notes", qid, home=home, check=False)
    assert again.returncode == 1 and "already released" in again.stderr


# ---------------------------------------------------------------------------------- recall (the view)
def _recall(n: Node, agent: str, query: str = "") -> str:
    return json.dumps(n.run("recall", {"agent": agent, "query": query, "bank": "notes", "limit": 100,
                                       "no_count": True}).data, sort_keys=True)


def test_recall_autorecall_and_neighbours_hide_the_rows_and_release_restores_them(node):
    _remember(node, "alpha", "deploy.alpha", "deploy with nix build")
    node.call_tool("alpha", "remember", {"key": "deploy.link", "value": "deploy notes index", "bank": "notes",
                                         "edges": [{"type": "see", "to": "deploy.beta"}]})
    _remember(node, "beta", "deploy.beta", "deploy by copying the closure")
    node.run("memory.attach", {"bank": "notes", "agent": "beta"})
    block = lambda: node.run("autorecall", {"agent": "beta", "messages": ["how do we deploy"],  # noqa: E731
                                            "no_count": True}).data["block"]
    links = lambda: json.dumps(node.call_tool("beta", "neighbors", {"key": "deploy.beta", "bank": "notes"}),  # noqa: E731
                               sort_keys=True)
    before = (_recall(node, "beta", "deploy"), _recall(node, "beta"), block(), links())
    assert "nix build" in before[0] and "nix build" in before[2] and "deploy.link" in before[3]
    qid = node.run("memory.quarantine", {"bank": "notes", "who": "alpha"}).data["id"]
    hidden = (_recall(node, "beta", "deploy"), _recall(node, "beta"), block(), links())
    assert all("nix build" not in h and "deploy notes index" not in h for h in hidden)
    assert "closure" in hidden[0] and "closure" in hidden[1]
    node.run("memory.release", {"bank": "notes", "quarantine": qid})
    assert (_recall(node, "beta", "deploy"), _recall(node, "beta"), block(), links()) == before
