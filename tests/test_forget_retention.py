"""Retention's option to erase the memory rows it retires (docs/memory.md, "Retention and
forgetting"): the preview lists exactly what the run erases, current memories stay, and the
retired rows' text is in no file of the home afterwards. A real home; the run's "now" given."""
from __future__ import annotations

from pathlib import Path

import pytest

from memmesh.node.memory.rows import MEMORY_STORE
from memmesh.node.retention import RETENTION_STORE, policy_in_force, policy_value
from tests.test_forget import checkpoint, files_holding, marker, open_node, recalled, tool

LATER = "2099-01-01"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def _memories(node):
    old, new, fact, plain, retired_by_edge = (marker(w) for w in ("old", "new", "fact", "plain", "edge"))
    tool(node, "alpha", "remember", key="k", value=old)
    tool(node, "alpha", "remember", key="k", value=new)
    tool(node, "alpha", "remember", key="fact", value=fact, valid_to="2030-01-01")
    tool(node, "alpha", "remember", key="plain", value=plain)
    tool(node, "alpha", "remember", key="gone", value=retired_by_edge)
    tool(node, "alpha", "remember", key="successor", value="replaces gone", supersedes=["gone"])
    return old, new, fact, plain, retired_by_edge


def test_retention_erases_retired_memory_rows_with_the_preview_it_showed(home):
    node = open_node(home)
    node.agents.create_agent("alpha")
    db = node.agents.agent("alpha").db
    old, new, fact, plain, by_edge = _memories(node)
    out = node.run("retention.set", {"db": "alpha", "days": 30, "erase_retired_memories": True}).data
    assert out["policy"]["erase_retired_memories"] is True
    shown = node.run("retention.show", {"db": "alpha"})
    assert shown.data["policy"]["erase_retired_memories"] and "memory rows retired for 30 days erased" in shown.text

    # Today nothing has been retired for 30 days: the superseded rows were superseded just now,
    # and the fact holds until 2030.
    today = node.run("retention.preview", {"db": "alpha"}).data
    assert today["memories"] == 0 and today["vectors"] == 0

    heads = db.heads
    preview = node.run("retention.preview", {"db": "alpha", "now": LATER})
    assert db.heads == heads  # a preview writes nothing
    p = preview.data
    assert p["memories"] == 3 and p["vectors"] == 3  # k's old row, the fact, the row retired by an edge
    assert "3 retired memory payloads and 3 vector payloads" in preview.text
    assert {e["reason"] for e in p["erase"]} == {"memory", "vector"}

    done = node.run("retention.run", {"db": "alpha", "now": LATER}).data
    assert done["erase"] == p["erase"] and len(done["entries"]) == 1
    assert all(db.payload_state(e["entry"], e["store"]) == "erased" for e in done["erase"])
    again = node.run("retention.preview", {"db": "alpha", "now": LATER}).data
    assert again["memories"] == again["vectors"] == 0

    listed = {(m["key"], m["value"]) for m in recalled(node, "alpha")}
    assert listed == {("k", new), ("plain", plain), ("successor", "replaces gone")}
    assert [m.key for m in node.memory.view(db).memories(include_superseded=True)
            if m.key in ("fact", "gone")] == []
    node.close()
    checkpoint(home)
    for text in (old, fact, by_edge):
        assert files_holding(home, text) == []
    for text in (new, plain):
        assert files_holding(home, text) == ["node.sqlite"]


def test_without_the_option_memory_rows_are_kept_and_the_policy_row_is_as_before(home):
    node = open_node(home, "none")
    node.agents.create_agent("alpha")
    _memories(node)
    out = node.run("retention.set", {"db": "alpha", "days": 30}).data
    assert set(out["policy"]) == {"op", "days", "compress_after", "success_x", "failure_x",
                                  "keep_promoted_evidence"}  # the row every node already reads
    p = node.run("retention.preview", {"db": "alpha", "now": LATER}).data
    assert p["memories"] == 0 and p["vectors"] == 0
    assert not [e for e in p["erase"] if e["store"] == MEMORY_STORE]
    node.close()


@pytest.mark.parametrize("flag, counts", [(False, True), (True, True), ("yes", False), (None, False)])
def test_a_policy_row_names_the_option_as_a_boolean_or_not_at_all(home, flag, counts):
    with open_node(home, "none") as node:
        ref = node.agents.resolve(node.agents.create_agent("alpha").name)
        row = {**policy_value(30).value(), "erase_retired_memories": flag}
        with ref.db.transaction(ref.admin_key) as txn:
            txn.append(RETENTION_STORE, row)
        policy = policy_in_force(ref.db)
        assert (policy is not None) == counts
        if policy is not None:
            assert policy.erase_retired_memories is flag
