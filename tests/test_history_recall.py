"""History in recall (scopes) and retention over real history (issue 12, items 3 and 7)."""
from __future__ import annotations

from memmesh.node import Node
from tests.dbkit import feed

PLANTED = "The staging database password rotation happens every second Thursday at noon."


def talk(node, session, n, planted_at=None):
    for i in range(1, n + 1):
        role = "user" if i % 2 else "assistant"
        text = PLANTED if i == planted_at else f"turn {i} of {session}: we talked about lunch options and weather"
        node.history_add("alpha", session, role, text)


def recall(node, query, **args):
    return node.call_tool("alpha", "recall", {"query": query, **args})


def test_recall_with_the_history_scope_finds_a_planted_turn_and_its_chunk(node):
    node.call_tool("alpha", "remember", {"key": "rotation", "value": "password rotation is documented in the wiki"})
    talk(node, "s1", 12, planted_at=4)
    plain = recall(node, "password rotation Thursday")
    assert "history" not in plain and [m["key"] for m in plain["memories"]] == ["rotation"]  # default: memory only
    out = recall(node, "password rotation Thursday", scopes=["history"])
    assert out["memories"] == []
    kinds = {(h["kind"], h.get("seq"), h.get("from_seq")) for h in out["history"]}
    assert ("turn", 4, None) in kinds  # the planted turn itself
    chunk = next(h for h in out["history"] if h["kind"] == "chunk")
    assert (chunk["level"], chunk["from_seq"], chunk["to_seq"]) == (1, 1, 10) and "Thursday" in chunk["text"]
    assert all(h["past_discussion"] for h in out["history"])
    # drill-down from the chunk reaches the planted turn
    children = node.run("history.expand", {"agent": "alpha", "chunk": chunk["id"]}).data["children"]
    assert any(c.get("text") == PLANTED for c in children)
    both = recall(node, "password rotation Thursday", scopes=["memory", "history"])
    assert [m["key"] for m in both["memories"]] == ["rotation"] and both["history"] == out["history"]


def test_retention_compresses_summarised_turns_the_same_on_two_replicas(tmp_path, node):
    talk(node, "s1", 25, planted_at=4)
    other = Node.open(tmp_path / "other")
    try:
        db = node.agents.agent("alpha").db
        other.storage.add_database(db.id)
        copy = other.database(db.id)
        node.run("retention.set", {"db": "alpha", "days": 365, "compress_after": 7})
        feed(copy, db)
        later = "2099-01-01"
        preview = node.run("retention.preview", {"db": "alpha", "now": later}).data
        assert preview["compressed"] > 0
        done = node.run("retention.run", {"db": "alpha", "now": later}).data
        assert done["erase"] == preview["erase"]
        feed(copy, db)
        assert set(copy.accepted_ids()) == set(db.accepted_ids())
        from memmesh.node.history.search import search_history
        from memmesh.node.retention import plan
        assert plan(copy, 4_070_908_800_000) == []  # the erasures arrived: nothing left to do there
        # The chunks' summaries still answer; the 5 turns outside any chunk keep their text.
        a = search_history(db, "password rotation Thursday", 10)
        b = search_history(copy, "password rotation Thursday", 10)
        assert a == b and any(h["kind"] == "chunk" for h in a)
        window = node.history_window("alpha", "s1", 4000)
        assert "turn 25 of s1" in window
    finally:
        other.close()
