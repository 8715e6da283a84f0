"""The relevance floor (docs/memory.md, "Relevance floor"): a memory only the cosine list found,
below its embedder's floor, is no result; BM25 keeps its own rule; what is returned ranks
exactly as without a floor; the floors are what the calibration gives; an agent's
``min_similarity`` overrides them, through the CLI's command and config.yaml alike."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.node.commands.params import ParamsError
from memmesh.node.memory.agent_config import ConfigError, parse_config_value
from memmesh.node.memory.embedding_rows import embedding_store
from memmesh.node.memory.relevance import FLOORS, SPEC_FLOOR, floor_for
from memmesh.node.memory.tokens import tokenize
from memmesh.node.memory.view import MemoryView
from tests.dbkit import grant, key, new_db
from tests.test_memory_view import keys, remember

BENCH = Path(__file__).resolve().parent.parent / "bench"
ADMIN, ALICE = key(1), key(2)
STORE = embedding_store("test", "hand-4")
WORDS = ["deploy", "helm", "billing", "oncall", "alert", "latency", "backup", "standup", "deadline", "owner"]


def _unit(v) -> np.ndarray:
    a = np.asarray(v, dtype=np.float64)
    return a / np.linalg.norm(a)


@pytest.fixture
def calibrate(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    sys.modules.pop("calibrate_floor", None)
    return importlib.import_module("calibrate_floor")


def test_the_hashed_floor_is_what_the_calibration_gives(calibrate):
    """The hashed embedder needs no model file and is deterministic: its shipped floor must be
    exactly what bench/calibrate_floor.py derives (so the table cannot drift from the method)."""
    fit = calibrate.fit("hashed", 0.98)
    assert FLOORS[fit["store"]] == fit["floor"]
    assert fit["unrelated_above_floor_frac"] <= 0.02  # what the quantile promises on its own data


def test_the_local_floor_is_what_the_calibration_gives(calibrate):
    pytest.importorskip("onnxruntime")
    fit = calibrate.fit("local", 0.98)
    assert FLOORS[fit["store"]] == fit["floor"]
    assert fit["on_topic_above_floor_frac"] >= 0.95  # the model separates the two sets


def test_an_uncalibrated_store_keeps_the_spec_floor():
    assert floor_for(None) == SPEC_FLOOR == 0.0
    assert floor_for("embeddings:openai/text-embedding-3-small") == 0.0
    assert floor_for("embeddings:hashed/hashed-v1-256") == 0.0  # another dimension: another space


def _view_with(rows, floor_store=STORE):
    db = new_db(ADMIN)
    grant(db, ADMIN, ALICE, "write", 10)
    view = MemoryView(db, embedding_store=floor_store)
    for k, text, vec in rows:
        remember(db, ALICE, k, text, vector=vec, store=floor_store)
    return view


def test_a_vector_only_match_below_the_floor_is_no_result_and_a_shared_word_always_is():
    q = _unit([1, 0, 0, 0])
    view = _view_with([
        ("near", "helm charts", _unit([0.9, 0.1, 0, 0])),         # cosine ~0.99: above any floor
        ("far", "standup notes", _unit([0.2, 1, 0, 0])),          # cosine ~0.2
        ("word", "deploy with latency budget", _unit([0, 0, 1, 0])),  # cosine 0, shares "deploy"
    ])
    everything = keys(view.recall("deploy", query_vector=q, min_similarity=0.0))
    assert set(everything) == {"near", "far", "word"}
    floored = keys(view.recall("deploy", query_vector=q, min_similarity=0.5))
    assert floored == [k for k in everything if k != "far"]
    # An off-topic query (no shared word) gets nothing but what clears the floor.
    assert keys(view.recall("zebra", query_vector=q, min_similarity=0.5)) == ["near"]
    assert keys(view.recall("zebra", query_vector=_unit([0, 0, 0, 1]), min_similarity=0.5)) == []


def test_the_view_takes_its_stores_calibrated_floor_when_none_is_given(monkeypatch):
    monkeypatch.setitem(FLOORS, STORE, 0.5)
    view = _view_with([("near", "helm charts", _unit([1, 0.1, 0, 0])), ("far", "standup notes", _unit([0.2, 1, 0, 0]))])
    q = _unit([1, 0, 0, 0])
    assert keys(view.recall("zebra", query_vector=q)) == ["near"]
    assert set(keys(view.recall("zebra", query_vector=q, min_similarity=0.0))) == {"near", "far"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_floor_only_removes_and_never_reorders(data):
    """For any store, query and floor: the floored ranking is the unfloored one with exactly the
    vector-only matches below the floor taken out (same scores, same order)."""
    n = data.draw(st.integers(1, 12))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    rows = []
    for i in range(n):
        text = " ".join(data.draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=4)))
        rows.append((f"k{i}", text, _unit(rng.normal(size=4))))
    view = _view_with(rows)
    query = " ".join(data.draw(st.lists(st.sampled_from(WORDS + ["zebra", "mango"]), min_size=1, max_size=3)))
    q = _unit(rng.normal(size=4))
    floor = data.draw(st.floats(0.0, 1.0))
    full = view.recall(query, query_vector=q, min_similarity=0.0, limit=100, with_scores=True)
    floored = view.recall(query, query_vector=q, min_similarity=floor, limit=100, with_scores=True)
    qtok = set(tokenize(query))
    cos = {k: float(np.dot(v, q)) for k, _, v in rows}
    text = {k: t for k, t, _ in rows}

    def kept(m) -> bool:
        return bool(qtok & set(tokenize(f"{m.key} {text[m.key]}"))) or cos[m.key] >= floor

    assert [(m.key, s) for m, s in floored] == [(m.key, s) for m, s in full if kept(m)]


def test_min_similarity_is_checked_as_every_memory_config_value():
    assert parse_config_value("min_similarity", "0.35") == 0.35
    assert parse_config_value("min_similarity", "default") is None
    for bad in ("nan", "inf", "1.5", "-0.1", "high", True, "1_0"):
        with pytest.raises(ConfigError, match="min_similarity is a cosine from 0 to 1"):
            parse_config_value("min_similarity", bad)


def test_an_agent_overrides_the_floor_and_config_yaml_sets_the_default(node):
    node.run("embedder.set", {"provider": "hashed"})
    node.call_tool("alpha", "remember", {"key": "deploy-billing", "value": "billing is deployed with helm"})
    # A query sharing no word: only a cosine can find it; with the floor at 1 nothing does.
    node.run("memory.config", {"agent": "alpha", "action": "set", "key": "min_similarity", "value": "1"})
    assert node.call_tool("alpha", "recall", {"query": "zebra crossing"})["memories"] == []
    node.run("memory.config", {"agent": "alpha", "action": "set", "key": "min_similarity", "value": "0"})
    assert [m["key"] for m in node.call_tool("alpha", "recall", {"query": "bill deploys"})["memories"]] == [
        "deploy-billing"]
    with pytest.raises((ConfigError, ParamsError)):
        node.run("memory.config", {"agent": "alpha", "action": "set", "key": "min_similarity", "value": "2"})
    shown = node.run("memory.config", {"agent": "alpha", "action": "show"}).data
    assert shown["config"]["min_similarity"] == 0.0
    node.run("memory.config", {"agent": "alpha", "action": "reset"})
    (node.home / "config.yaml").write_text("auto_recall:\n  min_similarity: 1\n")
    node.run("reload", {})
    assert node.call_tool("alpha", "recall", {"query": "zebra crossing"})["memories"] == []


@pytest.mark.slow
def test_a_cold_command_line_auto_recall_finds_its_own_memory(tmp_path):
    """The README's tour, in fresh processes with the local model: loading the model and building
    the index happen before the deadline starts, so a short deadline still searches every store
    (before, the model's load took the whole deadline and the agent's own memory was "not
    searched this turn"). 300 ms is several times what the searches of a tiny store take."""
    pytest.importorskip("onnxruntime")
    from tests.test_cli import mm

    home = tmp_path / "h"
    mm("init", home=home)
    mm("embedder", "set", "local", home=home)
    mm("agent", "new", "a", home=home)
    mm("remember", "a", "deploy-process", "we deploy with helm from the main branch", home=home)
    out = mm("autorecall", "a", "how do we deploy?", home=home, env={"MEMMESH_AUTO_RECALL_DEADLINE_MS": "300"}).stdout
    assert "deploy-process" in out and "Not searched" not in out
    # An off-topic message injects nothing at all: the floor, through the command line.
    off = mm("autorecall", "a", "what is the capital of France?", home=home,
             env={"MEMMESH_AUTO_RECALL_DEADLINE_MS": "300"}).stdout
    assert off.strip() == ""
