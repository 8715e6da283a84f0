"""recall's offset: pages of a ranking, deep enough to browse a bank (docs/memory.md, "Recall").

Pages concatenated are the ranking asked for at once, with or without a query and when the
agent's trust weights re-rank; a bank deeper than one answer is reached page by page; an offset
past the bound is refused as the schema says."""
from __future__ import annotations

import pytest

from memmesh.node.commands.params import ParamsError
from memmesh.node.library import Node

N = 260


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    home = tmp_path_factory.mktemp("paging") / "h"
    n, _ = Node.init(home)
    with n:
        n.run("embedder.set", {"provider": "hashed"})
        for agent in ("a", "b"):
            n.run("agent.new", {"name": agent})
        for i in range(N):
            # alike on purpose (the ranking has ties to break); kept apart, not merged as near-duplicates
            n.run("remember", {"agent": "a", "key": f"k{i:03d}", "on_duplicate": "create",
                               "value": f"note {i} about {'tea' if i % 3 else 'coffee'} and the {i % 7} kettle"})
        for i in range(150):  # importance re-weighs b's ranking after the view's (docs/memory.md)
            n.run("remember", {"agent": "b", "key": f"k{i:03d}", "on_duplicate": "create", "importance": 1 + i % 10,
                               "value": f"note {i} about {'tea' if i % 3 else 'coffee'} and the {i % 7} kettle"})
        yield n


def keys(node: Node, agent: str = "a", **args) -> list[str]:
    return [m["key"] for m in node.call_tool(agent, "recall", args)["memories"]]


@pytest.mark.parametrize("query", ["", "tea kettle", "coffee"])
def test_pages_concatenated_are_the_ranking_asked_for_at_once(node, query):
    whole = keys(node, query=query, limit=100)
    paged = [k for off in range(0, 100, 10) for k in keys(node, query=query, limit=10, offset=off)]
    assert paged == whole and len(whole) == len(set(whole))


@pytest.mark.parametrize("query", ["", "tea kettle"])
def test_pages_agree_when_importance_re_ranks(node, query):
    whole = keys(node, "b", query=query, limit=100)
    paged = [k for off in range(0, 150, 25) for k in keys(node, "b", query=query, limit=25, offset=off)]
    assert paged[:100] == whole and len(paged) == len(set(paged))


def test_importance_does_re_rank_b_so_the_pages_above_test_that_path(node):
    # without a query the view's order is newest first; b's importance must move rows off it,
    # else the tests above would only walk the view's own ranking again
    newest_first = [f"k{i:03d}" for i in reversed(range(150))]
    assert keys(node, "b", limit=100) != newest_first[:100]


def test_a_bank_deeper_than_one_answer_is_reached_page_by_page_newest_first(node):
    seen = [k for off in range(0, 300, 100) for k in keys(node, limit=100, offset=off)]
    assert seen == [f"k{i:03d}" for i in reversed(range(N))]
    assert keys(node, limit=10, offset=N) == []


@pytest.mark.parametrize("offset", [-1, 901, 1.5, "10"])
def test_an_offset_out_of_bounds_is_refused_and_names_it(node, offset):
    with pytest.raises(ParamsError, match="offset"):
        node.call_tool("a", "recall", {"offset": offset})
