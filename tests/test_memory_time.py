"""Causal-time recall (`as_known_at`) next to world time (`as_of`): a knowledge-update sequence,
exact on every replica whatever order the entries arrived in.

Real homes (Node.open on tmp_path) for the tool; real Database replicas fed real signed entries
for the replica properties. The reference for "as the store stood with the causal past of E" is
a real replica that was given exactly E and its ancestors, asked the same question.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.auth.errors import MemmeshError
from memmesh.crdt.database import Database
from memmesh.crdt.storage import MemoryStorage
from memmesh.node.cli_args import build_parser, command_of
from memmesh.node.commands.tools import RecallArgs
from memmesh.node.memory.rows import MEMORY_STORE, check_time, memory_value, parse_memory
from memmesh.node.memory.saving import plan_write
from memmesh.node.memory.timeline import Filters, current_in, held_at
from memmesh.node.memory.view import MemoryView
from tests.dbkit import feed, grant, key, new_db, replica, write
from tests.homes import recall, remember

ADMIN, ALICE, BOB = key(1), key(2), key(3)
NOW = 1_780_000_000_000  # 2026-05-28: every date of the sequence is in the past
MISSING = "sha256:" + "0" * 64


# ------------------------------------------------------------------ through the tool
def _seq(node):
    """Monday -> Friday -> retired; returns the three entries."""
    e1 = remember(node, key="deadline", value="Monday", valid_from="2020-03-01", category="fact")["entry"]
    e2 = remember(node, key="deadline", value="Friday", valid_from="2020-03-04", category="fact")["entry"]
    e3 = remember(node, key="deadline", value="friday", valid_to="2020-03-09")["entry"]  # a merge row
    return e1, e2, e3


def test_deadline_now_as_of_and_as_known_at_each_entry(node):
    before = node.agents.agent("alpha").db.heads[0]  # the agent database's own creation entry
    e1, e2, e3 = _seq(node)

    def got(**args):
        return [(m["value"], m["entry"]) for m in recall(node, query="deadline", **args)["memories"]]

    # now: retired
    assert got() == []
    # world time, over everything the store knows
    assert got(as_of="2020-02-28") == []
    assert got(as_of="2020-03-02") == [("Monday", e1)]
    assert got(as_of="2020-03-05") == [("Friday", e3)]
    assert got(as_of="2020-03-09") == []
    # causal time: as the store stood with each entry's causal past
    assert got(as_known_at=before) == []
    assert got(as_known_at=e1) == [("Monday", e1)]
    assert got(as_known_at=e2) == [("Friday", e2)]
    assert got(as_known_at=e3) == []
    # both at once: world time within a causal past
    assert got(as_known_at=e1, as_of="2020-03-05") == [("Monday", e1)]  # Friday was not known yet
    assert got(as_known_at=e2, as_of="2020-03-02") == [("Monday", e1)]
    assert got(as_known_at=e2, as_of="2020-03-09") == [("Friday", e2)]  # the end date came with e3
    assert got(as_known_at=e3, as_of="2020-03-05") == [("Friday", e3)]


def test_relations_are_those_of_the_past(node):
    e1, e2, e3 = _seq(node)
    # Over the whole store Monday was superseded by e2; known at e1 it is current, superseded by nothing.
    [whole] = recall(node, query="deadline", as_of="2020-03-02")["memories"]
    assert whole["superseded_by"] == {"key": "deadline", "entry": e2}
    [then] = recall(node, query="deadline", as_known_at=e1)["memories"]
    assert "superseded_by" not in then and then["entry"] == e1
    [mid] = recall(node, query="deadline", as_known_at=e2, as_of="2020-03-02")["memories"]
    assert mid["superseded_by"] == {"key": "deadline", "entry": e2}


def test_combines_with_the_other_filters(node):
    e1, e2, e3 = _seq(node)
    other = remember(node, key="lunch", value="noon on Friday", tags=["food"], confidence=3)["entry"]
    assert [m["key"] for m in recall(node, query="friday", as_known_at=other)["memories"]] == ["lunch"]
    assert [m["key"] for m in recall(node, as_known_at=other, as_of="2020-03-05")["memories"]] == [
        "lunch", "deadline"]  # no query: newest first
    assert [m["key"] for m in recall(node, as_known_at=other, as_of="2020-03-05", tags=["FOOD"])["memories"]] == [
        "lunch"]
    assert [m["key"] for m in recall(node, as_known_at=other, as_of="2020-03-05", category="fact")["memories"]] == [
        "deadline"]
    assert recall(node, as_known_at=other, as_of="2020-03-05", min_confidence=4)["memories"] == []
    assert [m["key"] for m in recall(node, as_known_at=e2, **{"from": "2020-03-05", "to": "2020-03-06"})[
        "memories"]] == ["deadline"]
    # --all within the past: every row known then
    rows = node.run("recall", {"agent": "alpha", "as_known_at": e2, "include_superseded": True, "no_count": True})
    assert sorted(m["entry"] for m in rows.data["memories"]) == sorted([e1, e2])


def test_refused_ids_are_clear_errors_and_change_nothing(node, tmp_path):
    e1, _e2, _e3 = _seq(node)
    db = node.agents.agent("alpha").db
    node.agents.create_agent("beta")
    foreign = node.agents.agent("beta").db.heads[0]
    n_entries = len(db)
    counts = node.memory.access.get(db.id, "deadline").fields()
    for bad, msg in ((MISSING, "holds no entry"), (foreign, "holds no entry"),
                     ("abc", "as_known_at must be an entry id"),
                     ("SHA256:" + "A" * 64, "as_known_at must be an entry id"), (5, "as_known_at")):
        with pytest.raises(MemmeshError, match=msg):
            recall(node, query="deadline", as_known_at=bad)
    assert len(db) == n_entries and node.memory.access.get(db.id, "deadline").fields() == counts
    assert recall(node, as_known_at=e1)["count"] == 1  # still works afterwards


def test_every_transport_gets_the_argument(node):
    e1, _e2, _e3 = _seq(node)
    assert "as_known_at" in RecallArgs.model_json_schema()["properties"]  # the MCP tool's input schema
    name, params = command_of(build_parser().parse_args(["recall", "alpha", "deadline", "--as-known-at", e1]))
    assert (name, params["as_known_at"]) == ("recall", e1)
    out = node.run(name, {k: v for k, v in params.items() if v is not None})
    assert [m["entry"] for m in out.data["memories"]] == [e1]
    tool = node.run("tool", {"agent": "alpha", "tool": "recall", "args": {"as_known_at": e1}})
    assert [m["value"] for m in tool.data["memories"]] == ["Monday"]


# ------------------------------------------------------------------ replicas
def _write_on(db: Database, who, k: str, v: str, **fields) -> str:
    view = MemoryView(db)
    plan = plan_write(view, k, v, [], now=NOW, **fields)
    view.close()
    return write(db, who, plan.row)


def _history():
    """Two writers: the deadline sequence, and a concurrent pair of rows for one key."""
    src = new_db(ADMIN)
    grant(src, ADMIN, ALICE, "write", 10)
    grant(src, ADMIN, BOB, "write", 10)
    a, b = replica(src), replica(src)
    ids = {}
    ids["monday"] = _write_on(a, ALICE, "deadline", "Monday", valid_from="2020-03-01")
    ids["bob"] = _write_on(b, BOB, "owner", "Bob")  # concurrent with monday
    feed(b, a)
    ids["friday"] = _write_on(b, BOB, "deadline", "Friday", valid_from="2020-03-04")
    ids["alice"] = _write_on(a, ALICE, "owner", "Alice")  # concurrent with bob: a conflict
    feed(a, b)
    ids["retired"] = _write_on(a, ALICE, "deadline", "friday", valid_to="2020-03-09")
    feed(a, b)
    return a, ids


SRC, IDS = _history()
STORED = list(SRC.storage.entries(SRC.id))
DELIVERY = [(s.header, dict(s.payloads)) for s in STORED]
DATES = [None, "2020-03-02", "2020-03-05", "2020-03-10"]


def _fresh() -> Database:
    storage = MemoryStorage()
    storage.add_database(SRC.id)
    return Database(storage, SRC.id)


def _ms(date: str | None) -> int | None:
    return None if date is None else check_time("date", date)


def _answer(view: MemoryView, query: str, entry: str | None, date: str | None) -> list:
    hits = view.recall(query, filters=Filters(now=NOW, as_of=_ms(date), as_known_at=entry))
    return [(m.key, m.value, m.entry_id, view.relations(m, entry)) for m in hits]


def _answers(view: MemoryView) -> list:
    return [_answer(view, q, e, d) for e in [None, *sorted(SRC.accepted_ids())] for d in DATES for q in ("", "deadline")]


def test_the_sequence_known_at_each_entry_is_exact():
    view = MemoryView(SRC)

    def values(entry, date=None, query=""):
        return {(k, v) for k, v, _e, _r in _answer(view, query, entry, date)}

    assert values(IDS["monday"]) == {("deadline", "Monday")}
    assert values(IDS["bob"]) == {("owner", "Bob")}
    assert values(IDS["friday"]) == {("deadline", "Friday"), ("owner", "Bob")}
    assert values(IDS["alice"]) == {("deadline", "Monday"), ("owner", "Alice")}
    assert values(IDS["monday"], "2020-03-05") == {("deadline", "Monday")}
    assert values(IDS["friday"], "2020-03-02") == {("deadline", "Monday"), ("owner", "Bob")}
    # Known at the retiring entry: the deadline is gone, and owner has one winner (T order) and a conflict.
    owners = [parse_memory(r) for r in SRC.rows(MEMORY_STORE) if parse_memory(r).key == "owner"]
    winner, loser = sorted(owners, key=lambda m: m.order, reverse=True)
    [(k, v, e, rel)] = _answer(view, "", IDS["retired"], None)
    assert (k, v, e) == ("owner", winner.value, winner.entry_id)
    assert [c["entry"] for c in rel["conflicts"]] == [loser.entry_id]
    # Known at either owner row alone, there is no conflict: the other was not known.
    for side in ("bob", "alice"):
        [(_k, _v, _e, rel)] = _answer(view, "owner", IDS[side], None)
        assert "conflicts" not in rel


def test_as_known_at_equals_a_replica_holding_only_that_past():
    """The reference: a real replica fed exactly E and its ancestors, asked without as_known_at."""
    view = MemoryView(SRC)
    for entry in sorted(SRC.accepted_ids()):
        part = _fresh()
        part.ingest([d for d, s in zip(DELIVERY, STORED) if s.id == entry or SRC.precedes(s.id, entry)])
        assert part.storage.pending(SRC.id) == []
        ref = MemoryView(part)
        for date in DATES:
            for q in ("", "deadline", "owner"):
                got = _answer(view, q, entry, date)
                want = _answer(ref, q, None, date)
                assert [g[:3] for g in got] == [w[:3] for w in want], (entry, date, q)
                assert [g[3] for g in got] == [w[3] for w in want]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.permutations(range(len(DELIVERY))), st.lists(st.integers(1, 3), min_size=len(DELIVERY),
                                                      max_size=len(DELIVERY)))
def test_every_delivery_order_gives_the_same_answers(order, sizes):
    expected = _answers(MemoryView(SRC))
    db = _fresh()
    view = MemoryView(db)  # attached before anything arrives: fed incrementally
    i = 0
    for size in sizes:
        if i >= len(order):
            break
        db.ingest([DELIVERY[j] for j in order[i:i + size]])  # children first wait for their parents
        i += size
    assert db.storage.pending(SRC.id) == [] and len(db) == len(SRC)
    assert _answers(view) == expected
    assert _answers(MemoryView(db)) == expected  # and built from scratch


# ------------------------------------------------------------------ the arrays = the rules
# The view answers as_of / as_known_at / filters with numpy arrays (node.memory.timetable,
# node.memory.columns); the reference is the rules of node.memory.timeline applied key by key.
TKEYS = ["a", "b", "c", "d"]
TIMES = [None, "2020-01-01", "2020-02-01", "2020-03-01", "2020-04-01"]
_row_op = st.tuples(
    st.integers(0, 1),  # writer: ALICE or BOB, each on its own replica
    st.sampled_from(TKEYS), st.sampled_from(["x", "y", "z"]),
    st.sampled_from(TIMES), st.sampled_from(TIMES),  # valid_from, valid_to
    st.lists(st.sampled_from(TKEYS), max_size=2),  # other keys this row supersedes (tombstones)
    st.sampled_from([None, "fact", "plan"]), st.sampled_from([None, 2, 7]),
    st.booleans(),  # then sync the two replicas
)


def _timeline_history(ops):
    src = new_db(ADMIN)
    grant(src, ADMIN, ALICE, "write", 10)
    grant(src, ADMIN, BOB, "write", 10)
    sides = [replica(src), replica(src)]
    for who, k, v, vf, vt, retires, category, confidence, sync in ops:
        db = sides[who]
        vf_ms, vt_ms = _ms(vf), _ms(vt)
        if vf_ms is not None and vt_ms is not None and vf_ms >= vt_ms:
            vt = None
        current = {m.key: m for m in MemoryView(db).memories()}
        edges = [{"type": "supersedes", "to": t, "entry": current[t].entry_id}
                 for t in dict.fromkeys(retires) if t != k and t in current]
        fields = {"valid_from": vf, "valid_to": vt, "category": category, "confidence": confidence}
        write(db, (ALICE, BOB)[who], memory_value(k, v, [], edges=edges or None,
                                                  **{f: x for f, x in fields.items() if x is not None}))
        if sync:
            feed(sides[0], sides[1])
            feed(sides[1], sides[0])
    feed(sides[0], sides[1])
    return sides[0]


def _reference(view: MemoryView, db: Database, entry: str | None, t: int | None) -> list:
    out = []
    for k in sorted({m.key for m in view.memories(include_superseded=True)}):
        timeline = view.timeline(k)
        if entry is not None:
            timeline = [m for m in timeline if m.entry_id == entry or db.precedes(m.entry_id, entry)]
            if not any(m.key == k for m in timeline):
                continue
        m = held_at(k, timeline, t) if t is not None else current_in(k, timeline)
        if m is not None and (t is not None or m.valid_to is None or m.valid_to > NOW):
            out.append(m)
    return sorted(out, key=lambda m: m.order, reverse=True)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_row_op, min_size=1, max_size=14), st.booleans())
def test_the_timeline_arrays_answer_as_the_timeline_rules(ops, resort):
    db = _timeline_history(ops)
    fed_db = _fresh_of(db)
    fed = MemoryView(fed_db)  # fed entry by entry: the arrays are merged as rows arrive
    if resort:  # or merged by sorting everything again, as after a large receive
        fed._times._should_resort = lambda queued: True
    for s in db.storage.entries(db.id):
        fed_db.ingest([(s.header, dict(s.payloads))])
        fed.held_at(0)  # a question after each entry: the queue is merged each time
    assert not fed._stale  # really fed, never rebuilt
    views = [fed, MemoryView(db)]
    entries = [None, *sorted(db.accepted_ids())]
    for view in views:
        for entry in entries:
            for date in TIMES[1:] + [None]:
                t = _ms(date)
                got = view.recall("", limit=100, filters=Filters(now=NOW, as_of=t, as_known_at=entry))
                assert got == _reference(view, db, entry, t), (entry, date)
        for date in TIMES[1:]:
            assert sorted(m.row_key for m in view.held_at(_ms(date))) == sorted(
                m.row_key for m in _reference(view, db, None, _ms(date)))


def _fresh_of(db: Database) -> Database:
    storage = MemoryStorage()
    storage.add_database(db.id)
    return Database(storage, db.id)


_filters = st.builds(
    Filters, category=st.sampled_from([None, "fact", "plan", "other"]),
    min_confidence=st.sampled_from([None, 0, 1, 5, 7, 8, 200]),
    as_of=st.sampled_from([None, 0, 1_580_000_000_000]),
    start=st.sampled_from([None, 1_577_836_800_000, 1_585_699_200_000, -(1 << 70)]),
    end=st.sampled_from([None, 1_580_515_200_000, 1_585_699_200_000, 1 << 70]),
    now=st.sampled_from([None, 0, 1_580_515_200_000, NOW, 1 << 70, -(1 << 70)]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_row_op, min_size=1, max_size=8), st.lists(_filters, min_size=1, max_size=6))
def test_filter_masks_keep_exactly_what_keep_keeps(ops, filters):
    view = MemoryView(_timeline_history(ops))
    ix = view._ix
    for f in filters:
        mask = f.mask(ix.cols)
        want = [f.keep(m) for m in ix.mem]
        assert (want == [True] * len(want)) if mask is None else mask.tolist() == want, f
