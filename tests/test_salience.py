"""What is stored is used (docs/memory.md, "Importance and confidence", "Entities"): importance
and confidence weigh in the ranking by a bounded factor that is exactly neutral without them;
recall filters by entities; neighbors starts from an entity; memory entities lists them."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.node.commands.params import ParamsError
from memmesh.node.memory.fusion import salience_factor
from memmesh.node.memory.graph import NoSuchMemory

WORDS = ["deploy", "helm", "billing", "oncall", "alert", "latency", "backup", "standup"]


def _keys(result) -> list[str]:
    return [m["key"] for m in result["memories"]]


def test_the_factor_is_bounded_and_neutral_without_the_fields():
    assert salience_factor(None, None) == 1.0 == salience_factor(5, 5) == salience_factor(5, None)
    assert salience_factor(10, None) == pytest.approx(1.2) and salience_factor(1, None) == pytest.approx(0.84)
    assert salience_factor(None, 10) == pytest.approx(1.1) and salience_factor(None, 1) == pytest.approx(0.92)
    values = [salience_factor(i, c) for i in [None, *range(1, 11)] for c in [None, *range(1, 11)]]
    assert min(values) == pytest.approx(0.84 * 0.92) and max(values) == pytest.approx(1.2 * 1.1)


def test_importance_puts_the_memory_that_matters_first(node):
    tool = node.call_tool
    tool("alpha", "remember", {"key": "minor", "value": "deploy notes", "importance": 1})
    tool("alpha", "remember", {"key": "major", "value": "deploy notes", "importance": 9, "on_duplicate": "create"})
    assert _keys(tool("alpha", "recall", {"query": "deploy notes"})) == ["major", "minor"]
    tool("alpha", "remember", {"key": "sure", "value": "backup plan", "confidence": 10})
    tool("alpha", "remember", {"key": "unsure", "value": "backup plan", "confidence": 2, "on_duplicate": "create"})
    assert _keys(tool("alpha", "recall", {"query": "backup plan"})) == ["sure", "unsure"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.data())
def test_the_factor_changes_nothing_for_rows_without_the_fields(node, data):
    """A store holding rows with importance and confidence is re-ranked; the rows without them
    keep exactly the order the view's own fused ranking gives them."""
    n0 = len(node.memory.view(node.agents.agent("alpha").db))
    plain = data.draw(st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=4), min_size=1, max_size=6))
    for i, words in enumerate(plain):
        node.call_tool("alpha", "remember", {"key": f"p{n0}-{i}", "value": " ".join(words),
                                             "on_duplicate": "create"})
    node.call_tool("alpha", "remember", {"key": f"w{n0}", "value": data.draw(st.sampled_from(WORDS)),
                                         "importance": data.draw(st.integers(1, 10)),
                                         "confidence": data.draw(st.integers(1, 10)), "on_duplicate": "create"})
    query = " ".join(data.draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=3)))
    view = node.memory.view(node.agents.agent("alpha").db)
    assert view.has_scores()
    raw = [m.key for m in view.recall(query, limit=100) if m.key.startswith("p")]
    ranked = [m["key"] for m in node.call_tool("alpha", "recall", {"query": query, "limit": 100})["memories"]
              if m["key"].startswith("p")]
    assert ranked == raw


@pytest.fixture
def about(node):
    tool = node.call_tool
    tool("alpha", "remember", {"key": "deploy", "value": "billing deploys with helm",
                               "entities": ["billing-api", "Helm"], "edges": [{"type": "see", "to": "runbook"}]})
    tool("alpha", "remember", {"key": "oncall", "value": "Priya is on call", "entities": ["Billing-API"]})
    tool("alpha", "remember", {"key": "runbook", "value": "restart the pods", "entities": ["kubernetes"]})
    tool("alpha", "remember", {"key": "lunch", "value": "pizza on friday"})
    return node


def test_recall_filters_by_entities_like_tags(about):
    tool = about.call_tool
    assert sorted(_keys(tool("alpha", "recall", {"entities": ["BILLING-api"]}))) == ["deploy", "oncall"]
    assert _keys(tool("alpha", "recall", {"entities": ["billing-api", "helm"]})) == ["deploy"]
    assert _keys(tool("alpha", "recall", {"query": "pizza", "entities": ["helm"]})) == []
    with pytest.raises(ParamsError):
        tool("alpha", "recall", {"entities": [""]})


def test_neighbors_start_from_an_entity(about):
    out = about.call_tool("alpha", "neighbors", {"entity": "billing-api", "depth": 2})
    by_key = {n["key"]: n for n in out["neighbors"]}
    assert out["entity"] == "billing-api" and set(by_key) == {"deploy", "oncall", "runbook"}
    assert by_key["deploy"]["depth"] == 1 and by_key["runbook"]["depth"] == 2
    assert {"type": "entity", "direction": "about", "key": "billing-api", "bank": "alpha"} in by_key["deploy"]["links"]
    with pytest.raises(NoSuchMemory, match="no current memory about 'nothing'"):
        about.call_tool("alpha", "neighbors", {"entity": "nothing"})
    for bad in ({}, {"key": "deploy", "entity": "helm"}):
        with pytest.raises(ParamsError, match="a memory key or an entity"):
            about.call_tool("alpha", "neighbors", bad)


def test_memory_entities_lists_them_with_counts(about):
    result = about.run("memory.entities", {"bank": "alpha"})
    assert result.data["entities"] == [{"entity": "Billing-API", "count": 2}, {"entity": "Helm", "count": 1},
                                       {"entity": "kubernetes", "count": 1}]
    assert result.text.splitlines()[0] == "2  Billing-API"
    # A superseded row is no longer counted.
    about.call_tool("alpha", "remember", {"key": "oncall", "value": "Marek is on call now", "supersedes": []})
    counts = {e["entity"].casefold(): e["count"] for e in about.run("memory.entities", {"bank": "alpha"}).data["entities"]}
    assert counts["billing-api"] == 1
