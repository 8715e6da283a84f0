"""Age decay per kind of memory: off by default; on, old rows of short-lived kinds sink."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memmesh.node import commands
from memmesh.node.memory.agents import ConfigError
from memmesh.node.memory.fusion import DAY_MS, decay_factor, decayed
from memmesh.node.memory.timeline import Filters

ROWS = [  # best match first without decay (BM25: the query's word, more often, in fewer words)
    {"key": "deploy fact", "value": "deploy deploy deploy", "category": "fact"},
    {"key": "deploy pinned fact", "value": "deploy deploy and the prod boxes", "category": "fact",
     "tags": ["pinned"]},
    {"key": "deploy decision", "value": "we deploy on tuesdays after the review, by team vote",
     "category": "decision"},
]


@pytest.fixture
def node(node):
    """conftest's node (alpha, no embedder) with ROWS in alpha's memory."""
    for row in ROWS:
        node.call_tool("alpha", "remember", row)
    return node


def ranking(node, now):
    agent = node.agents.agent("alpha")
    found = node.memory.recall(agent, "deploy", count=False, filters=Filters(now=now))
    return [m["key"] for m in found["memories"]]


def written_at(node):
    view = node.memory.view(node.agents.agent("alpha").db)
    return max(view.current(r["key"]).ts for r in ROWS)


def test_off_by_default_the_ranking_is_unchanged(node):
    now = written_at(node)
    before = ranking(node, now)
    assert before == [r["key"] for r in ROWS]
    assert ranking(node, now + 400 * DAY_MS) == before  # no half-lives: age does not matter
    assert commands.memory_config(node, "alpha", "show").data["config"]["half_lives"] == {}


def test_with_decay_old_facts_sink_below_decisions_and_pinned_rows_stay(node):
    commands.memory_config(node, "alpha", "set", "half_lives", '{"fact": 30, "decision": 365}')
    now = written_at(node)
    assert ranking(node, now) == [r["key"] for r in ROWS]  # fresh rows: nothing has decayed yet
    later = now + 90 * DAY_MS  # facts at 1/8 of their score, decisions at 84 %
    assert ranking(node, later) == ["deploy pinned fact", "deploy decision", "deploy fact"]
    assert ranking(node, later) == ranking(node, later)  # deterministic for a given now
    commands.memory_config(node, "alpha", "set", "half_lives", "off")
    assert ranking(node, later) == [r["key"] for r in ROWS]


def test_the_star_half_life_covers_other_kinds(node):
    commands.memory_config(node, "alpha", "set", "half_lives", "fact=3650,*=1")
    later = written_at(node) + 30 * DAY_MS
    assert ranking(node, later)[-1] == "deploy decision"


def test_bad_half_lives_are_refused_and_change_nothing(node):
    for bad in ("fact=0", "fact=-3", '{"fact": "soon"}', "fact", "[30]", "{bad json", '{"not a slug!": 3}',
                "fact=40000"):
        with pytest.raises(ConfigError):
            commands.memory_config(node, "alpha", "set", "half_lives", bad)
    assert commands.memory_config(node, "alpha", "show").data["config"]["half_lives"] == {}


@given(st.integers(0, 10**13), st.floats(0.01, 36_500))
def test_the_factor_halves_per_half_life(age, half_life):
    f = decay_factor(age, half_life)
    assert 0.0 <= f <= 1.0
    assert decay_factor(age + round(half_life * DAY_MS), half_life) == pytest.approx(f / 2, rel=1e-6, abs=1e-300)
    assert decay_factor(age, None) == 1.0 and decay_factor(-age, half_life) == 1.0


def test_decayed_reorders_by_age_and_keeps_ties_in_rank_order():
    hits = [("old", 1.0), ("new", 0.9), ("same a", 0.5), ("same b", 0.5)]
    ages = {"old": 60, "new": 0, "same a": 0, "same b": 0}
    out = decayed(hits, lambda k: decay_factor(ages[k] * DAY_MS, 30))
    assert [k for k, _ in out] == ["new", "same a", "same b", "old"]
