"""Richer memories: the optional fields, dedup and merge, supersession, world time, conflicts.

Real homes (Node.open on tmp_path) for the tools; real Database replicas fed entries in
different orders for determinism across replicas.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.auth.errors import MemmeshError
from memmesh.crdt.database import Database
from memmesh.crdt.storage import MemoryStorage
from memmesh.node.memory.rows import MEMORY_STORE, memory_value, parse_memory
from memmesh.node.memory.saving import plan_write
from memmesh.node.memory.timeline import Filters
from memmesh.node.memory.view import MemoryView
from tests.dbkit import feed, grant, key, new_db, replica, write
from tests.homes import recall, remember

ADMIN, ALICE, BOB, CAROL = key(1), key(2), key(3), key(4)


def entries(node) -> int:
    return len(node.agents.agent("alpha").db)


# ------------------------------------------------------------------ arguments
GOOD = {
    "category": "decision", "confidence": 7, "importance": 3, "entities": ["Chaz", "chaz", "memmesh"],
    "edges": [{"type": "depends-on", "to": "other.key"}, {"type": "see", "to": "notes:intro"}],
    "valid_from": "2026-01-05", "valid_to": "2026-02-01T12:00:00+01:00", "source": "user",
}


def test_every_field_is_stored_and_recalled(node):
    r = remember(node, key="plan", value="ship in March", **GOOD)
    assert r["ok"] and "deduplicated" not in r
    [m] = recall(node, query="ship", as_of="2026-01-10")["memories"]
    assert m["category"] == "decision" and (m["confidence"], m["importance"]) == (7, 3)
    assert m["entities"] == ["Chaz", "memmesh"]  # duplicates dropped case-insensitively
    assert m["edges"] == GOOD["edges"]
    assert (m["valid_from"], m["valid_to"]) == ("2026-01-05T00:00:00.000Z", "2026-02-01T11:00:00.000Z")
    assert m["source"] == "user"


def test_plain_calls_are_unchanged(node):
    remember(node, key="k", value="v", tags=["t"])
    [row] = node.agents.agent("alpha").db.rows(MEMORY_STORE)
    assert row.value == {"key": "k", "value": "v", "tags": ["t"]}
    [m] = recall(node, query="v")["memories"]
    assert {"key", "value", "tags", "time", "written_by", "entry", "bank"} <= set(m)
    assert not set(m) & (set(GOOD) | {"supersedes", "superseded_by", "conflicts"})


@pytest.mark.parametrize("bad, words", [
    ({"category": "Not A Slug"}, "category must be a lowercase slug"),
    ({"category": 3}, "category"),
    ({"confidence": 0}, "confidence should be greater than or equal to 1"),
    ({"confidence": 11}, "confidence should be less than or equal to 10"),
    ({"importance": "5"}, "importance"),
    ({"confidence": True}, "confidence"),
    ({"entities": "Chaz"}, "entities"),
    ({"entities": [""]}, "entities[0] should have at least 1 character"),
    ({"entities": [f"e{i}" for i in range(33)]}, "entities should have at most 32 items"),
    ({"edges": [{"type": "x"}]}, "edges[0].to"),
    ({"edges": [{"type": "Bad", "to": "k"}]}, "edges[0].type"),
    ({"edges": [{"type": "x", "to": "k", "extra": 1}]}, "extra"),
    ({"edges": [{"type": "supersedes", "to": "k"}]}, "supersedes argument"),
    ({"valid_from": "next monday"}, "valid_from must be an ISO 8601"),
    ({"valid_to": 20260101}, "valid_to"),
    ({"valid_from": "2026-02-01", "valid_to": "2026-01-01"}, "valid_to (2026-01-01T00:00:00.000Z) must be after"),
    ({"supersedes": ["missing.key"]}, "no current memory with key 'missing.key'"),
    ({"source": "oracle"}, "source should be"),
])
def test_bad_arguments_are_refused_and_write_nothing(node, bad, words):
    remember(node, key="base", value="here")
    before = entries(node)
    with pytest.raises(MemmeshError) as err:
        remember(node, key="k", value="v", **bad)
    assert words in str(err.value)
    assert entries(node) == before


def test_remote_rows_drop_only_their_malformed_fields():
    db = new_db(ADMIN)
    grant(db, ADMIN, ALICE, "write", 10)
    write(db, ALICE, {"key": "k", "value": "v", "tags": [], "confidence": 99, "category": "Fact",
                      "valid_from": "soon", "edges": "nope", "source": "user", "importance": 4})
    [rec] = db.rows(MEMORY_STORE)
    m = parse_memory(rec)
    assert (m.key, m.confidence, m.category, m.valid_from, m.edges) == ("k", None, None, None, ())
    assert (m.source, m.importance) == ("user", 4)


# ------------------------------------------------------------------ dedup, merge, supersession
def test_dedup_writes_nothing(node):
    first = remember(node, key="deadline", value="Friday  the 9th", tags=["Project"], confidence=6)
    before = entries(node)
    again = remember(node, key="deadline", value=" friday the 9TH ", tags=["project"], confidence=4)
    assert again["ok"] and again["deduplicated"] is True and again["merged_into"] == "deadline"
    assert again["entry"] == first["entry"]
    assert entries(node) == before


def test_merge_unions_and_never_lowers_confidence(node):
    remember(node, key="stack", value="Python and SQLite", tags=["tech"], entities=["Python"],
             confidence=8, importance=2, source="user")
    r = remember(node, key="stack", value="python and sqlite", tags=["db"], entities=["SQLite"],
                 edges=[{"type": "about", "to": "project"}], confidence=3, importance=5, source="inferred")
    assert r["merged"] is True and r["supersedes"][0]["key"] == "stack"
    [m] = recall(node, query="python")["memories"]
    assert m["value"] == "Python and SQLite" and m["tags"] == ["tech", "db"]
    assert m["entities"] == ["Python", "SQLite"] and m["edges"] == [{"type": "about", "to": "project"}]
    assert (m["confidence"], m["importance"]) == (8, 5)
    assert m["source"] == "inferred"  # a merge keeps the less trusted source
    assert m["supersedes"] == [{"key": "stack", "entry": r["supersedes"][0]["entry"]}]


def test_new_value_records_a_supersedes_edge_and_all_lists_history(node):
    old = remember(node, key="lang", value="Rust")
    new = remember(node, key="lang", value="Python")
    assert new["supersedes"] == [{"key": "lang", "entry": old["entry"]}]
    assert [m["value"] for m in recall(node, query="lang")["memories"]] == ["Python"]
    rows = node.run("recall", {"agent": "alpha", "query": "lang", "include_superseded": True}).data["memories"]
    by_value = {m["value"]: m for m in rows}
    assert by_value["Rust"]["superseded_by"] == {"key": "lang", "entry": new["entry"]}
    assert "superseded_by" not in by_value["Python"]


def test_supersedes_retires_other_keys(node):
    remember(node, key="db.choice", value="use Postgres")
    remember(node, key="db.decision", value="use SQLite for the node", supersedes=["db.choice"])
    assert [m["key"] for m in recall(node, query="use")["memories"]] == ["db.decision"]
    # Writing the retired key again brings it back (a newer row).
    remember(node, key="db.choice", value="use Postgres for the cloud")
    assert {m["key"] for m in recall(node, query="use")["memories"]} == {"db.decision", "db.choice"}


def test_filters_category_and_confidence(node):
    remember(node, key="a", value="tea please", category="preference", confidence=9)
    remember(node, key="b", value="tea is hot", category="fact", confidence=4)
    remember(node, key="c", value="tea time")
    assert [m["key"] for m in recall(node, query="tea", category="preference")["memories"]] == ["a"]
    assert {m["key"] for m in recall(node, query="tea", min_confidence=4)["memories"]} == {"a", "b"}
    assert [m["key"] for m in recall(node, min_confidence=5)["memories"]] == ["a"]
    with pytest.raises(MemmeshError, match="min_confidence"):
        recall(node, min_confidence=0)


# ------------------------------------------------------------------ world time
def test_deadline_moves_then_retires(node):
    """Monday -> Friday -> retired; recall now and as_of each date, exact."""
    e1 = remember(node, key="deadline", value="Monday", valid_from="2020-03-01")
    e2 = remember(node, key="deadline", value="Friday", valid_from="2020-03-04")
    e3 = remember(node, key="deadline", value="friday", valid_to="2020-03-09")  # retire: a merge row
    assert e3.get("merged") and e3["supersedes"][0]["entry"] == e2["entry"]

    def at(when):
        return [(m["value"], m["entry"]) for m in recall(node, query="deadline", as_of=when)["memories"]]

    assert at("2020-02-28") == []
    assert at("2020-03-02") == [("Monday", e1["entry"])]
    assert at("2020-03-05") == [("Friday", e3["entry"])]
    assert at("2020-03-09T00:00:00Z") == []  # valid_to is exclusive
    assert recall(node, query="deadline")["memories"] == []  # retired now
    # Its period still finds it; a retired fact re-remembered is a new row, not a dedup.
    assert [m["entry"] for m in recall(node, **{"from": "2020-03-05", "to": "2020-03-06"})["memories"]] == [
        e3["entry"]]
    again = remember(node, key="deadline", value="Friday")
    assert "deduplicated" not in again and [m["value"] for m in recall(node, query="deadline")["memories"]] == [
        "Friday"]


def test_period_arguments_are_checked(node):
    with pytest.raises(MemmeshError, match="must not be after"):
        recall(node, **{"from": "2026-02-01", "to": "2026-01-01"})
    with pytest.raises(MemmeshError, match="as_of must be an ISO 8601"):
        recall(node, as_of="yesterday")


# ------------------------------------------------------------------ replicas
def _write_on(db, who, k, v, **fields):
    view = MemoryView(db)
    plan = plan_write(view, k, v, [], now=0, **fields)
    view.close()
    return write(db, who, plan.row)


def _concurrent_venues():
    """A shared row of "venue", then rows of it on three replicas that had not seen each other:
    Alice's, Bob's, and two of Carol's (her second supersedes her first)."""
    base = new_db(ADMIN)
    for who in (ALICE, BOB, CAROL):
        grant(base, ADMIN, who, "write", 10)
    first = _write_on(base, ALICE, "venue", "room 1")
    sides = [replica(base) for _ in range(3)]
    rows = {"alice": _write_on(sides[0], ALICE, "venue", "room 2"),
            "bob": _write_on(sides[1], BOB, "venue", "room 3"),
            "carol": _write_on(sides[2], CAROL, "venue", "room 4")}
    rows["carol-again"] = _write_on(sides[2], CAROL, "venue", "room 5")
    entries: dict[str, tuple] = {}
    for side in sides:
        for s in side.storage.entries(side.id):
            entries.setdefault(s.id, (s.header, dict(s.payloads)))
    whole = replica(sides[0])
    for side in sides[1:]:
        feed(whole, side)
    return base.id, first, rows, list(entries.values()), whole


VENUE_DB, VENUE_FIRST, VENUE_ROWS, VENUE_ENTRIES, VENUE_WHOLE = _concurrent_venues()


def _venue_reference():
    """The winner and its conflicts from the rules alone: the newest row in T order, and
    every other row of the key whose entry neither precedes nor follows the winner's."""
    mems = [parse_memory(r) for r in VENUE_WHOLE.rows(MEMORY_STORE)]
    winner = max(mems, key=lambda m: m.order)
    conflicts = sorted(m.entry_id for m in mems if m.entry_id != winner.entry_id
                       and not VENUE_WHOLE.precedes(m.entry_id, winner.entry_id)
                       and not VENUE_WHOLE.precedes(winner.entry_id, m.entry_id))
    return winner.entry_id, conflicts


def _venue_answer(view):
    [winner] = view.recall("venue", filters=Filters(now=0))
    rel = view.relations(winner)
    return winner.entry_id, sorted(c["entry"] for c in rel.get("conflicts", []))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.permutations(range(len(VENUE_ENTRIES))),
                          st.lists(st.integers(1, 3), min_size=len(VENUE_ENTRIES), max_size=len(VENUE_ENTRIES))),
                min_size=2, max_size=2))
def test_concurrent_supersession_same_winner_and_conflicts_in_every_delivery_order(deliveries):
    expected = _venue_reference()
    # The shared row is superseded by every later row; the three writers' rows conflict.
    assert expected[0] in {VENUE_ROWS["alice"], VENUE_ROWS["bob"], VENUE_ROWS["carol-again"]}
    assert VENUE_FIRST not in expected[1] and len(expected[1]) >= 2
    for order, sizes in deliveries:  # two replicas, each fed in its own order and batches
        storage = MemoryStorage()
        storage.add_database(VENUE_DB)
        db = Database(storage, VENUE_DB)
        fed = MemoryView(db)  # attached before anything arrives: fed incrementally
        i = 0
        for size in sizes:
            if i >= len(order):
                break
            db.ingest([VENUE_ENTRIES[j] for j in order[i:i + size]])  # children wait for their parents
            i += size
        assert storage.pending(VENUE_DB) == [] and len(db) == len(VENUE_WHOLE)
        for view in (fed, MemoryView(db)):  # and built from scratch
            assert _venue_answer(view) == expected
            # Each writer's first row records the row it replaced: the shared one.
            assert {m.entry_id: [e.entry for e in m.supersedes] for m in view.memories(include_superseded=True)} == {
                VENUE_FIRST: [], VENUE_ROWS["alice"]: [VENUE_FIRST], VENUE_ROWS["bob"]: [VENUE_FIRST],
                VENUE_ROWS["carol"]: [VENUE_FIRST], VENUE_ROWS["carol-again"]: [VENUE_ROWS["carol"]]}
            # As known at each writer's own row, there is no conflict: the others were not known.
            for name in ("alice", "bob"):
                [then] = view.recall("venue", filters=Filters(now=0, as_known_at=VENUE_ROWS[name]))
                assert then.entry_id == VENUE_ROWS[name] and "conflicts" not in view.relations(then, VENUE_ROWS[name])


def test_a_row_written_after_concurrent_rows_ends_the_conflict():
    one = replica(VENUE_WHOLE)
    _write_on(one, ALICE, "venue", "room 6")
    view = MemoryView(one)
    [winner] = view.recall("venue")
    assert winner.value == "room 6" and "conflicts" not in view.relations(winner)


def test_as_of_and_tombstones_independent_of_delivery_order():
    src = new_db(ADMIN)
    grant(src, ADMIN, ALICE, "write", 10)
    _write_on(src, ALICE, "x", "one", valid_from="2020-01-01")
    _write_on(src, ALICE, "y", "replaces x", valid_from="2020-06-01", supersedes=None)
    write(src, ALICE, memory_value("z", "retire x", [], edges=[
        {"type": "supersedes", "to": "x", "entry": src.rows(MEMORY_STORE)[0].entry_id}], valid_from="2020-06-01"))
    entries_ = list(src.storage.entries(src.id))

    def answers(db):
        view = MemoryView(db)
        return ([m.key for m in view.recall("")],
                sorted(m.key for m in view.held_at(1_580_000_000_000)),  # 2020-01-26
                sorted(m.key for m in view.held_at(1_600_000_000_000)))  # 2020-09-13

    expected = (["z", "y"], ["x"], ["y", "z"])
    for order in (entries_, list(reversed(entries_))):
        storage = MemoryStorage()
        storage.add_database(src.id)
        db = Database(storage, src.id)
        for s in order:  # one at a time, reversed: later entries wait for their parents
            db.ingest([(s.header, dict(s.payloads))])
        assert answers(db) == expected


def test_auto_recall_skips_retired_facts(node):
    remember(node, key="office wifi", value="password tulip", valid_to="2020-01-01")
    remember(node, key="office printer", value="second floor printer")
    block = node.auto_recall("alpha", ["where is the office printer and wifi?"])
    assert "printer" in block and "tulip" not in block
