"""The neighbors tool over a small typed graph spanning the agent's memory and two banks, one
of which the agent cannot read: depths, type filters, backlinks, unreachable links, refused
shapes (nothing written), allowed_tools. Real homes (Node.open on tmp_path), real grants.
"""
from __future__ import annotations

import json

import pytest

from memmesh.auth.errors import AuthError, MemmeshError
from memmesh.node.cli import main
from memmesh.node.commands.params import ParamsError
from memmesh.node.config_apply import reload_config
from memmesh.node.memory.graph import NoSuchMemory, split_target
from memmesh.node.settings import CONFIG_FILE, ToolNotAllowed

# alpha's own memory, bank "team" (alpha reads it), bank "secret" (alpha holds nothing on it);
# "writer" writes the banks.
GRAPH = {
    "alpha": [
        ("plan", [("depends-on", "db.choice"), ("see", "team:style"), ("blocked-by", "secret:budget"),
                  ("see", "ghost"), ("see", "plan")]),
        ("db.choice", [("decided-in", "team:meeting.3")]),
        ("retro", [("about", "plan")]),
        ("lonely", []),
    ],
    "team": [
        ("style", [("refines", "alpha:plan")]),
        ("meeting.3", []),
        ("notes", [("mentions", "alpha:db.choice")]),
    ],
    "secret": [
        ("budget", [("funds", "alpha:plan")]),
        ("spy", [("watches", "alpha:retro")]),
    ],
}


@pytest.fixture
def node(node):
    """conftest's node (alpha, no embedder) holding GRAPH, which writer writes in the banks."""
    node.agents.create_agent("writer")
    for bank in ("team", "secret"):
        node.run("memory.new", {"name": bank})
        node.run("memory.grant", {"bank": bank, "agent": "writer", "perm": "write"})
    node.run("memory.grant", {"bank": "team", "agent": "alpha", "perm": "read"})
    for bank, rows in GRAPH.items():
        agent = "alpha" if bank == "alpha" else "writer"
        for key, edges in rows:
            node.call_tool(agent, "remember", {"key": key, "value": f"about {key}", "bank": bank,
                                               "edges": [{"type": t, "to": to} for t, to in edges]})
    return node


def neighbors(node, **args):
    return node.call_tool("alpha", "neighbors", args)


def found(result) -> list[tuple[int, str, str]]:
    return [(m["depth"], m["bank"], m["key"]) for m in result["neighbors"]]


def links(result, bank: str, key: str) -> list[tuple[str, str, str, str]]:
    [m] = [m for m in result["neighbors"] if (m["bank"], m["key"]) == (bank, key)]
    return [(ln["type"], ln["direction"], ln["bank"], ln["key"]) for ln in m["links"]]


def entries(node) -> dict[str, int]:
    return {db_id: len(node.database(db_id)) for db_id in node.database_ids()}


# ------------------------------------------------------------------ traversal
def test_depth_one_lists_links_and_backlinks_across_readable_banks(node):
    before = entries(node)
    r = neighbors(node, key="plan")
    assert (r["key"], r["bank"], r["depth"], r["count"]) == ("plan", "alpha", 1, 3)
    assert found(r) == [(1, "alpha", "db.choice"), (1, "alpha", "retro"), (1, "team", "style")]
    assert links(r, "alpha", "db.choice") == [("depends-on", "outgoing", "alpha", "plan")]
    assert links(r, "alpha", "retro") == [("about", "backlink", "alpha", "plan")]
    # style is linked both ways: plan -> team:style, and style -> alpha:plan
    assert links(r, "team", "style") == [("refines", "backlink", "alpha", "plan"), ("see", "outgoing", "alpha", "plan")]
    m = r["neighbors"][2]
    assert (m["value"], m["written_by"]) == ("about style", str(node.agents.agent("writer").key.public))
    # the secret bank is never read: its link is listed, its backlinks (budget, spy) are not seen
    assert r["unreachable"] == [{"from": {"key": "plan", "bank": "alpha"}, "type": "blocked-by",
                                 "bank": "secret", "key": "budget", "reason": "no read permission"}]
    assert "budget" not in json.dumps(r["neighbors"]) and "spy" not in json.dumps(r)
    assert r["missing"] == [{"from": {"key": "plan", "bank": "alpha"}, "type": "see", "bank": "alpha", "key": "ghost"}]
    assert entries(node) == before  # a read writes nothing


def test_depth_two_and_three_reach_further_each_at_its_shortest_distance(node):
    r2 = neighbors(node, key="plan", depth=2)
    assert found(r2) == [(1, "alpha", "db.choice"), (1, "alpha", "retro"), (1, "team", "style"),
                         (2, "team", "meeting.3"), (2, "team", "notes")]
    assert links(r2, "team", "meeting.3") == [("decided-in", "outgoing", "alpha", "db.choice")]
    assert links(r2, "team", "notes") == [("mentions", "backlink", "alpha", "db.choice")]
    # no deeper links exist: depth 3 finds the same set; the start never lists itself
    r3 = neighbors(node, key="plan", depth=3)
    assert found(r3) == found(r2)
    assert r3["unreachable"] == r2["unreachable"]  # secret:spy hangs off retro, but spy -> retro is a backlink
    # from the far end, the graph is walked back: meeting.3 -> db.choice -> plan -> ...
    back = neighbors(node, key="meeting.3", bank="team", depth=3)
    assert found(back) == [(1, "alpha", "db.choice"), (2, "alpha", "plan"), (2, "team", "notes"),
                           (3, "alpha", "retro"), (3, "team", "style")]
    assert links(back, "alpha", "plan") == [("depends-on", "backlink", "alpha", "db.choice")]


def test_type_filters_apply_at_every_depth(node):
    assert found(neighbors(node, key="plan", types=["see"])) == [(1, "team", "style")]
    r = neighbors(node, key="plan", types=["depends-on", "decided-in"], depth=3)
    assert found(r) == [(1, "alpha", "db.choice"), (2, "team", "meeting.3")]
    assert r["unreachable"] == [] and r["missing"] == []
    blocked = neighbors(node, key="plan", types=["blocked-by"])
    assert blocked["count"] == 0 and blocked["message"] == "No linked memories found."
    assert [u["key"] for u in blocked["unreachable"]] == ["budget"]
    assert neighbors(node, key="plan", types=["no-such-type"])["neighbors"] == []


def test_a_memory_without_links_and_backlinks_has_no_neighbors(node):
    r = neighbors(node, key="lonely", depth=3)
    assert (r["neighbors"], r["unreachable"], r["missing"], r["count"]) == ([], [], [], 0)


def test_only_current_rows_link(node):
    # retro changes and drops its edge: the old row's backlink to plan is history, not a link
    node.call_tool("alpha", "remember", {"key": "retro", "value": "rewritten without links"})
    assert ("alpha", "retro") not in {(b, k) for _d, b, k in found(neighbors(node, key="plan"))}
    # a memory retired by its end date is no longer a neighbour
    node.call_tool("alpha", "remember", {"key": "db.choice", "value": "about db.choice",
                                         "valid_to": "2000-01-01T00:00:00Z", "valid_from": "1999-01-01"})
    assert found(neighbors(node, key="plan")) == [(1, "team", "style")]
    assert [m["key"] for m in neighbors(node, key="plan")["missing"]] == ["db.choice", "ghost"]


def test_a_bank_granted_later_is_followed_and_a_revoked_one_is_not(node):
    node.run("memory.grant", {"bank": "secret", "agent": "alpha", "perm": "read"})
    r = neighbors(node, key="plan")
    assert (1, "secret", "budget") in found(r) and r["unreachable"] == []
    assert links(r, "secret", "budget") == [("funds", "backlink", "alpha", "plan"),
                                            ("blocked-by", "outgoing", "alpha", "plan")]
    node.run("memory.revoke", {"bank": "team", "agent": "alpha"})
    r = neighbors(node, key="plan")
    assert [u["key"] for u in r["unreachable"]] == ["style"]
    assert all(m["bank"] != "team" for m in r["neighbors"])


def test_backlinks_follow_bank_names_and_new_rows(node):
    """The backlink index files an edge under every key its target may name; which one it
    names is decided when asked, by the bank names of that moment."""
    node.call_tool("alpha", "remember", {"key": "todo", "value": "read the later notes",
                                         "edges": [{"type": "see", "to": "later:intro"}]})
    node.call_tool("alpha", "remember", {"key": "later:intro", "value": "a key with a colon"})
    # No bank "later" yet: the edge names alpha's own key "later:intro".
    assert found(neighbors(node, key="later:intro")) == [(1, "alpha", "todo")]
    node.run("memory.new", {"name": "later"})
    node.run("memory.grant", {"bank": "later", "agent": "writer", "perm": "write"})
    node.run("memory.grant", {"bank": "later", "agent": "alpha", "perm": "read"})
    node.call_tool("writer", "remember", {"key": "intro", "value": "the later bank's intro", "bank": "later"})
    # Now it names the bank's key: a backlink there, none on alpha's own "later:intro".
    assert found(neighbors(node, key="intro", bank="later")) == [(1, "alpha", "todo")]
    assert neighbors(node, key="later:intro")["neighbors"] == []
    # A row written after the index was built links at once; its older row's links are gone.
    node.call_tool("writer", "remember", {"key": "more", "value": "see intro", "bank": "later",
                                          "edges": [{"type": "see", "to": "intro"}]})
    assert found(neighbors(node, key="intro", bank="later")) == [(1, "alpha", "todo"), (1, "later", "more")]
    node.call_tool("writer", "remember", {"key": "more", "value": "no longer about intro", "bank": "later"})
    assert found(neighbors(node, key="intro", bank="later")) == [(1, "alpha", "todo")]


def test_the_same_entries_give_the_same_answer(node):
    assert neighbors(node, key="plan", depth=3) == neighbors(node, key="plan", depth=3)


def test_edge_targets_name_a_bank_or_stay_keys_of_the_same_bank():
    banks = {"team": "sha256:" + "a" * 64}.get
    assert split_target("team:style", banks) == ("sha256:" + "a" * 64, "style")
    assert split_target("project:x", banks) == (None, "project:x")  # no bank "project": a key
    assert split_target("plain", banks) == (None, "plain")
    assert split_target("team:", banks) == (None, "team:")
    assert split_target("sha256:" + "b" * 64 + ":k:1", banks) == ("sha256:" + "b" * 64, "k:1")


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("args, error, words", [
    ({}, ParamsError, "give a memory key or an entity"),
    ({"key": ""}, ParamsError, "key"),
    ({"key": 3}, ParamsError, "key"),
    ({"key": "plan", "depth": 0}, ParamsError, "depth should be greater than or equal to 1"),
    ({"key": "plan", "depth": 4}, ParamsError, "depth should be less than or equal to 3"),
    ({"key": "plan", "depth": True}, ParamsError, "depth"),
    ({"key": "plan", "types": "see"}, ParamsError, "types should be a valid array"),
    ({"key": "plan", "types": ["Not A Slug"]}, ParamsError, "types[0] must be a lowercase slug"),
    ({"key": "plan", "types": ["supersedes"]}, ParamsError, "may not include supersedes"),
    ({"key": "plan", "colour": "red"}, ParamsError, "colour"),
    ({"key": "nothing-here"}, NoSuchMemory, "no current memory 'nothing-here' in bank alpha"),
    ({"key": "budget", "bank": "secret"}, AuthError, "may not read from bank secret"),
    ({"key": "plan", "bank": "nowhere"}, MemmeshError, "no bank 'nowhere'"),
])
def test_refused_shapes_change_nothing(node, args, error, words):
    before = entries(node)
    with pytest.raises(error) as exc:
        neighbors(node, **args)
    assert words in str(exc.value)
    assert entries(node) == before


def test_allowed_tools_can_refuse_neighbors(node):
    (node.home / CONFIG_FILE).write_text("agents:\n  - name: alpha\n    allowed_tools: [recall]\n")
    reload_config(node)
    before = entries(node)
    with pytest.raises(ToolNotAllowed, match="agent alpha may not use neighbors: its allowed_tools in config.yaml are recall"):
        neighbors(node, key="plan")
    assert entries(node) == before
    (node.home / CONFIG_FILE).write_text("agents:\n  - name: alpha\n    allowed_tools: [neighbors]\n")
    reload_config(node)
    assert neighbors(node, key="plan")["count"] == 3


def test_the_cli_runs_the_tool(node, capsys):
    home = node.home
    node.close()
    assert main(["--home", str(home), "tool", "alpha", "neighbors", '{"key": "plan", "types": ["see"]}']) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(m["bank"], m["key"]) for m in out["neighbors"]] == [("team", "style")]
    assert main(["--home", str(home), "tool", "alpha", "neighbors", '{"key": "plan", "depth": 9}']) == 1
    assert "neighbors: depth should be less than or equal to 3 (got 9)" in capsys.readouterr().err
