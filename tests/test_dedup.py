"""Near-duplicates on save (docs/memory.md, "Near-duplicates"): a new key whose memory the bank
already holds under another key (the same text, or similar above the embedder's calibrated
threshold) writes nothing and names that memory; ``on_duplicate`` merges, supersedes or creates;
the thresholds are what bench/dedup.py fits."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from memmesh.auth.errors import MemmeshError
from memmesh.node import commands
from memmesh.node.memory.dedup import THRESHOLDS, check_choice, threshold_for
from memmesh.node.memory.rows import MemoryInputError

BENCH = Path(__file__).resolve().parent.parent / "bench"


def remember(node, key, value, agent="alpha", **args):
    return node.call_tool(agent, "remember", {"key": key, "value": value, **args})


def current_keys(node, bank=None):
    args = {"limit": 100, **({"bank": bank} if bank else {})}
    return sorted(m["key"] for m in node.call_tool("alpha", "recall", args)["memories"])


def entries(node, name="alpha"):
    return len(node.agents.resolve(name).db)


@pytest.fixture
def dedup_bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    for name in ("dedup", "dedup_data"):
        sys.modules.pop(name, None)
    return importlib.import_module("dedup")


@pytest.fixture
def hashed(node):
    node.run("embedder.set", {"provider": "hashed"})
    return node


# ---------------------------------------------------------------------------- the thresholds
def test_the_hashed_threshold_is_what_the_bench_fit_gives(dedup_bench):
    fit = dedup_bench.fit("hashed")
    assert THRESHOLDS[fit["store"]] == fit["threshold"]
    assert fit["precision"] >= 0.95  # what the fit promises on its own set


@pytest.mark.slow
def test_the_local_threshold_is_what_the_bench_fit_gives(dedup_bench):
    pytest.importorskip("onnxruntime")
    fit = dedup_bench.fit("local")
    assert THRESHOLDS[fit["store"]] == fit["threshold"]
    assert fit["precision"] >= 0.95


def test_an_uncalibrated_store_has_no_threshold():
    assert threshold_for(None) is None
    assert threshold_for("embeddings:openai/text-embedding-3-small") is None
    assert threshold_for("embeddings:hashed/hashed-v1-256") is None


# ---------------------------------------------------------------------------- what is a duplicate
def test_the_same_text_under_another_key_writes_nothing_and_names_the_memory(node):
    first = remember(node, "deploy.day", "We deploy on Tuesdays")
    before = entries(node)
    out = remember(node, "release-day", "  we deploy   on TUESDAYS ")
    assert out["ok"] is False and out["key"] == "release-day" and out["bank"] == "alpha"
    assert out["duplicate"] == {"key": "deploy.day", "value": "We deploy on Tuesdays", "entry": first["entry"],
                                "written_by": out["duplicate"]["written_by"], "similarity": 1.0, "why": "same text"}
    assert out["choices"] == ["merge", "supersede", "create"]
    assert "\n" not in out["message"] and "on_duplicate" in out["message"] and "'deploy.day'" in out["message"]
    assert entries(node) == before and current_keys(node) == ["deploy.day"]


def test_without_an_embedder_only_the_same_text_counts(node):
    remember(node, "deploy.day", "we deploy on Tuesdays")
    out = remember(node, "release-day", "we deploy on Tuesdays, every week")
    assert out["ok"] is True and "duplicate_of" not in out
    assert current_keys(node) == ["deploy.day", "release-day"]


def test_a_near_duplicate_above_the_hashed_threshold_is_flagged_and_another_fact_is_not(hashed):
    remember(hashed, "team.deadline", "the chaz project is due on June 1")
    out = remember(hashed, "chaz.due", "the chaz project is due on June 1st")
    assert out["ok"] is False and out["duplicate"]["why"] == "similar"
    assert out["duplicate"]["similarity"] >= THRESHOLDS["embeddings:hashed/hashed-v1-384"]
    assert "cosine" in out["message"]
    other = remember(hashed, "chaz.owner", "Alice owns the chaz project")
    assert other["ok"] is True and "duplicate_of" not in other


@pytest.mark.slow
def test_a_paraphrase_is_flagged_with_the_local_embedder_and_a_fact_on_the_same_topic_is_not(node):
    pytest.importorskip("onnxruntime")
    node.run("embedder.set", {"provider": "local"})
    remember(node, "allergy", "the user is allergic to peanuts")
    out = remember(node, "health.allergy", "they have an allergy to peanuts")
    assert out["ok"] is False and out["duplicate"]["key"] == "allergy" and out["duplicate"]["why"] == "similar"
    assert out["duplicate"]["similarity"] >= THRESHOLDS["embeddings:local/all-minilm-l6-v2-int8"]
    for key, value in (("health.doctor", "the user's doctor is Dr Lena"),
                       ("health.medication", "the user takes vitamin D in winter")):
        assert remember(node, key, value)["ok"] is True
    assert current_keys(node) == ["allergy", "health.doctor", "health.medication"]


def test_a_memory_of_another_bank_is_not_a_duplicate(node):
    commands.memory_new(node, "notes", "shared")
    commands.memory_grant(node, "notes", "alpha", "write")
    remember(node, "deploy.day", "we deploy on Tuesdays", bank="notes")
    assert remember(node, "release-day", "we deploy on Tuesdays")["ok"] is True  # the agent's own memory
    out = remember(node, "release", "we deploy on Tuesdays", bank="notes")
    assert out["ok"] is False and out["bank"] == "notes" and out["duplicate"]["key"] == "deploy.day"


def test_superseded_and_retired_rows_are_not_duplicates(node):
    remember(node, "deploy.day", "we deploy on Tuesdays")
    remember(node, "deploy.day", "we deploy on Thursdays")  # the key's new version
    assert remember(node, "old-day", "we deploy on Tuesdays")["ok"] is True
    remember(node, "standup", "standup at 9:30")
    remember(node, "standup.new", "standup at 10:00", supersedes=["standup"])  # retires standup
    assert remember(node, "meeting", "standup at 9:30")["ok"] is True
    remember(node, "office", "the office is in Lisbon", valid_to="2020-01-01")  # over: no longer in force
    assert remember(node, "office.city", "the office is in Lisbon")["ok"] is True


def test_a_quarantined_row_is_not_a_duplicate(node):
    node.agents.create_agent("beta")
    commands.memory_new(node, "notes", "shared")
    for agent in ("alpha", "beta"):
        commands.memory_grant(node, "notes", agent, "write")
    remember(node, "deploy.day", "we deploy on Tuesdays", agent="beta", bank="notes")
    assert remember(node, "release", "we deploy on Tuesdays", bank="notes")["ok"] is False
    node.run("memory.quarantine", {"bank": "notes", "who": "beta"})
    assert remember(node, "release", "we deploy on Tuesdays", bank="notes")["ok"] is True


def test_a_key_the_call_supersedes_is_not_its_duplicate(node):
    remember(node, "deploy.day", "we deploy on Tuesdays")
    out = remember(node, "release-day", "we deploy on Tuesdays", supersedes=["deploy.day"])
    assert out["ok"] is True and out["supersedes"][0]["key"] == "deploy.day"


def test_an_existing_key_keeps_its_rules(node):
    remember(node, "a", "same words")
    remember(node, "b", "other words", on_duplicate="create")
    out = remember(node, "b", "same words", on_duplicate="merge")  # b exists: a new version of b, as always
    assert out["ok"] is True and out["key"] == "b" and "duplicate_of" not in out
    assert remember(node, "b", "same words")["deduplicated"] is True


# ---------------------------------------------------------------------------- the choices
def test_merge_writes_into_the_existing_key(node):
    remember(node, "deploy.day", "we deploy on Tuesdays", tags=["ops"])
    out = remember(node, "release-day", "We deploy on Tuesdays", tags=["release"], on_duplicate="merge")
    assert out["ok"] is True and out["key"] == "deploy.day" and out["merged"] is True
    assert out["duplicate_of"]["key"] == "deploy.day" and out["on_duplicate"] == "merge"
    [m] = node.call_tool("alpha", "recall", {})["memories"]
    assert m["key"] == "deploy.day" and m["tags"] == ["ops", "release"] and m["value"] == "we deploy on Tuesdays"
    again = remember(node, "release-day", "we deploy on tuesdays", on_duplicate="merge")  # nothing new
    assert again["deduplicated"] is True and again["merged_into"] == "deploy.day"


def test_merge_of_a_similar_text_is_the_existing_keys_new_version(hashed):
    first = remember(hashed, "team.deadline", "the chaz project is due on June 1")
    out = remember(hashed, "chaz.due", "the chaz project is due on June 1st", on_duplicate="merge")
    assert out["ok"] is True and out["key"] == "team.deadline" and out["embedded"] is True
    assert out["supersedes"] == [{"key": "team.deadline", "entry": first["entry"]}]
    [m] = hashed.call_tool("alpha", "recall", {})["memories"]
    assert (m["key"], m["value"]) == ("team.deadline", "the chaz project is due on June 1st")


def test_supersede_writes_the_new_key_with_an_edge_retiring_the_duplicate(node):
    first = remember(node, "deploy.day", "we deploy on Tuesdays")
    out = remember(node, "release-day", "we deploy on Tuesdays", on_duplicate="supersede")
    assert out["ok"] is True and out["key"] == "release-day"
    assert out["supersedes"] == [{"key": "deploy.day", "entry": first["entry"]}]
    assert current_keys(node) == ["release-day"]
    [old] = [m for m in node.run("recall", {"agent": "alpha", "include_superseded": True}).data["memories"]
             if m["key"] == "deploy.day"]
    assert old["superseded_by"] == {"key": "release-day", "entry": out["entry"]}


def test_create_writes_anyway(node):
    remember(node, "deploy.day", "we deploy on Tuesdays")
    out = remember(node, "release-day", "we deploy on Tuesdays", on_duplicate="create")
    assert out["ok"] is True and "supersedes" not in out
    assert current_keys(node) == ["deploy.day", "release-day"]


def test_a_choice_without_a_duplicate_writes_as_usual(node):
    out = remember(node, "deploy.day", "we deploy on Tuesdays", on_duplicate="supersede")
    assert out["ok"] is True and "duplicate_of" not in out and "supersedes" not in out


def test_the_cli_command_takes_the_choice(node):
    remember(node, "deploy.day", "we deploy on Tuesdays")
    r = node.run("remember", {"agent": "alpha", "key": "x", "value": "we deploy on Tuesdays"})
    assert r.data["ok"] is False and "on_duplicate" in r.text
    r = node.run("remember", {"agent": "alpha", "key": "x", "value": "we deploy on Tuesdays",
                              "on_duplicate": "create"})
    assert r.data["ok"] is True and r.data["key"] == "x"


async def test_the_http_tool_route_answers_the_same(node):
    from tests.homes import api_on

    remember(node, "deploy.day", "we deploy on Tuesdays")
    async with api_on(node) as (server, token, session):
        url = f"http://{server.host}:{server.port}/v1/agents/alpha/tools/remember"
        headers = {"Authorization": f"Bearer {token}"}
        body = {"key": "release-day", "value": "We deploy on Tuesdays"}
        async with session.post(url, json=body, headers=headers) as resp:
            assert resp.status == 200
            answer = (await resp.json())["data"]
        assert answer["ok"] is False and answer["duplicate"]["key"] == "deploy.day"
        async with session.post(url, json={**body, "on_duplicate": "sometimes"}, headers=headers) as resp:
            refused = await resp.json()
            assert resp.status == 400 and "on_duplicate" in refused["error"]["message"]
        async with session.post(url, json={**body, "on_duplicate": "supersede"}, headers=headers) as resp:
            written = (await resp.json())["data"]
        assert written["ok"] is True and written["supersedes"][0]["key"] == "deploy.day"


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("bad", ["replace", "MERGE", 1, True, ["merge"]])
def test_a_bad_choice_is_refused_with_one_line_and_nothing_written(node, bad):
    remember(node, "deploy.day", "we deploy on Tuesdays")
    before = entries(node)
    with pytest.raises(MemmeshError) as err:
        remember(node, "release-day", "we deploy on Tuesdays", on_duplicate=bad)
    assert "on_duplicate" in str(err.value) and "\n" not in str(err.value)
    assert entries(node) == before


def test_the_service_refuses_a_bad_choice_too(node):
    agent = node.agents.agent("alpha")
    before = entries(node)
    with pytest.raises(MemoryInputError, match="on_duplicate should be 'merge', 'supersede' or 'create'"):
        node.memory.remember(agent, "k", "v", on_duplicate="both")
    assert entries(node) == before
    assert check_choice(None) is None and check_choice("create") == "create"
