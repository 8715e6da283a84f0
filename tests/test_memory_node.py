"""Agents, banks and the memory tools through the library API (real node homes on disk)."""
from __future__ import annotations

import pytest

from memmesh.auth.errors import AuthError, MemmeshError
from memmesh.node import Node, commands
from memmesh.node.memory.agents import ConfigError
from memmesh.node.memory.embedders import EmbedderConfig


@pytest.fixture
def node(node):
    """conftest's node (alpha, no embedder) and a second agent, beta."""
    node.agents.create_agent("beta")
    return node


def remember(node, agent, key, value, tags=None, bank=None):
    args = {"key": key, "value": value}
    if tags is not None:
        args["tags"] = tags
    if bank is not None:
        args["bank"] = bank
    return node.call_tool(agent, "remember", args)


def recall(node, agent, **args):
    return node.call_tool(agent, "recall", args)


def values(result):
    return [m["value"] for m in result["memories"]]


def test_remember_and_recall_self(node):
    r = remember(node, "alpha", "project.chaz.deadline", "2026-06-01", ["project", "chaz"])
    assert r["ok"] and r["bank"] == "alpha"
    out = recall(node, "alpha", query="deadline", tags=["project"], limit=5)
    [m] = out["memories"]
    assert m["key"] == "project.chaz.deadline" and m["value"] == "2026-06-01"
    assert m["tags"] == ["project", "chaz"] and m["bank"] == "alpha"
    assert m["written_by"] == str(node.agents.agent("alpha").key.public)
    assert m["time"].endswith("Z") or "+00:00" in m["time"]


def test_tags_and_filter_case_insensitive(node):
    remember(node, "alpha", "a", "deadline one", ["Project", "x"])
    remember(node, "alpha", "b", "deadline two", ["project"])
    assert set(values(recall(node, "alpha", query="deadline", tags=["PROJECT", "X"]))) == {"deadline one"}
    assert values(recall(node, "alpha", query="deadline", tags=["ops"])) == []


def test_empty_query_is_newest_first(node):
    remember(node, "alpha", "first", "one")
    remember(node, "alpha", "second", "two")
    assert values(recall(node, "alpha", query="", limit=1)) == ["two"]
    assert values(recall(node, "alpha")) == ["two", "one"]


def test_nothing_found_says_so(node):
    remember(node, "alpha", "a", "b")
    out = recall(node, "alpha", query="zebra quantum")
    assert out["memories"] == [] and "No memories found" in out["message"]


def test_newer_row_supersedes(node):
    remember(node, "alpha", "deadline", "2026-06-01")
    remember(node, "alpha", "deadline", "2026-07-15")
    assert values(recall(node, "alpha", query="deadline")) == ["2026-07-15"]
    view = node.memory.view(node.agents.agent("alpha").db)
    assert sorted(m.value for m in view.memories(include_superseded=True)) == ["2026-06-01", "2026-07-15"]


def test_bank_read_write_and_refused_write(node):
    commands.memory_new(node, "project-notes", "Shared notes")
    commands.memory_grant(node, "project-notes", "alpha", "write")
    commands.memory_grant(node, "project-notes", "beta", "read")
    remember(node, "alpha", "architecture.sessions", "Each conversation gets its own DB.", bank="project-notes")
    assert values(recall(node, "beta", query="sessions", bank="project-notes")) == ["Each conversation gets its own DB."]
    bank_db = node.agents.resolve("project-notes").db
    before = len(bank_db)
    with pytest.raises(AuthError):
        remember(node, "beta", "refused.write", "should never be stored", bank="project-notes")
    assert len(bank_db) == before
    names = [b["name"] for b in node.call_tool("alpha", "list_memory_banks", {})["banks"]]
    assert names[0] == "alpha" and "project-notes" in names


def test_revoke_stops_reads(node):
    commands.memory_new(node, "notes")
    commands.memory_grant(node, "notes", "beta", "read")
    commands.memory_revoke(node, "notes", "beta")
    with pytest.raises(AuthError):
        recall(node, "beta", query="x", bank="notes")


def test_agent_db_granted_as_a_bank(node):
    remember(node, "alpha", "deploy process", "Build via nix build")
    with pytest.raises(AuthError):
        recall(node, "beta", query="deploy", bank="alpha")
    commands.memory_grant(node, "alpha", "beta", "read")
    assert values(recall(node, "beta", query="deploy", bank="alpha")) == ["Build via nix build"]
    with pytest.raises(AuthError):
        remember(node, "beta", "x", "y", bank="alpha")


def test_grant_rolls_back_when_the_ref_cannot_be_written(node, monkeypatch):
    commands.memory_new(node, "notes")
    bank_db = node.agents.resolve("notes").db
    beta_key = str(node.agents.agent("beta").key.public)

    def fail(*a, **k):
        raise MemmeshError("agent database unavailable")

    monkeypatch.setattr(node.agents, "write_ref", fail)
    with pytest.raises(MemmeshError):
        commands.memory_grant(node, "notes", "beta", "write")
    assert bank_db.permission(beta_key) is None  # the grant was undone
    monkeypatch.undo()
    commands.memory_grant(node, "notes", "beta", "write")
    assert bank_db.permission(beta_key).level == "write"


def test_ref_left_without_auth_is_listed_but_writes_are_rejected(node, monkeypatch):
    commands.memory_new(node, "notes")
    commands.memory_grant(node, "notes", "beta", "write")

    def fail(*a, **k):
        raise MemmeshError("agent database unavailable")

    monkeypatch.setattr(node.agents, "write_ref", fail)
    result = commands.memory_revoke(node, "notes", "beta")  # auth first, ref removal fails
    assert result.warnings and "not removed" in result.warnings[0]
    monkeypatch.undo()
    banks = {b["name"]: b for b in node.call_tool("beta", "list_memory_banks", {})["banks"]}
    assert banks["notes"]["permission"] == "none"
    with pytest.raises(AuthError):
        remember(node, "beta", "k", "v", bank="notes")


def test_delete_keeps_the_database_as_archive(node):
    commands.memory_new(node, "old")
    db_id = node.agents.resolve("old").db.id
    commands.memory_delete(node, "old")
    with pytest.raises(MemmeshError):
        node.agents.resolve("old")
    assert db_id in node.database_ids()
    assert [a["id"] for a in commands.memory_list(node).data["archived"]] == [db_id]
    commands.memory_new(node, "old")  # the name is free again


def test_refs_by_name_or_id(node):
    commands.memory_new(node, "notes")
    db_id = node.agents.resolve("notes").db.id
    commands.memory_grant(node, db_id, "alpha", "write")
    remember(node, "alpha", "k", "by id", bank=db_id)
    assert values(recall(node, "alpha", query="id", bank="notes")) == ["by id"]


def test_bad_tool_input_is_a_clear_error_and_writes_nothing(node):
    db = node.agents.agent("alpha").db
    before = len(db)
    for tool, args in [("remember", {"key": "k"}), ("remember", {"key": "", "value": "v"}),
                       ("remember", {"key": "k", "value": 5}), ("remember", {"key": "k", "value": "v", "tags": "x"}),
                       ("remember", {"key": "k", "value": "v", "colour": "red"}), ("recall", {"limit": 0}),
                       ("recall", {"limit": "ten"}), ("nope", {}), ("recall", [])]:
        with pytest.raises(MemmeshError):
            node.call_tool("alpha", tool, args)
    assert len(db) == before


def test_config_validation_and_reset(node):
    commands.memory_config(node, "alpha", "set", "max_entries", "7")
    assert commands.memory_config(node, "alpha", "show").data["config"]["max_entries"] == 7
    for bad in ("25", "0", "three", "2.5"):
        with pytest.raises(ConfigError):
            commands.memory_config(node, "alpha", "set", "max_entries", bad)
    with pytest.raises(ConfigError):
        commands.memory_config(node, "alpha", "set", "colour", "red")
    commands.memory_config(node, "alpha", "reset")
    assert commands.memory_config(node, "alpha", "show").data["config"]["max_entries"] == 3


def test_auto_recall_block_with_bank_attribution(node):
    commands.memory_new(node, "project-notes")
    commands.memory_grant(node, "project-notes", "alpha", "write")
    remember(node, "alpha", "architecture.sessions", "Each conversation gets its own DB.", bank="project-notes")
    remember(node, "alpha", "deploy process", "Build via nix build")
    block = node.auto_recall("alpha", ["how do sessions map to databases?", "and the deploy process?"])
    assert "nix build" in block and "own DB" not in block  # the bank is not attached yet
    commands.memory_attach(node, "project-notes", "alpha", None)
    block = node.auto_recall("alpha", ["how do sessions map to databases?", "and the deploy process?"])
    assert block.startswith("## Relevant Memories")
    assert "_(from bank: project-notes)_" in block and "nix build" in block
    assert node.auto_recall("alpha", ["the of and"]) == ""  # only stopwords
    commands.memory_config(node, "alpha", "set", "auto_recall_enabled", "false")
    assert node.auto_recall("alpha", ["deploy process"]) == ""


def test_auto_recall_per_session_attach_and_unopenable_bank_skipped(node):
    commands.memory_new(node, "notes")
    commands.memory_grant(node, "notes", "alpha", "write")
    remember(node, "alpha", "standup", "standup is at nine", bank="notes")
    commands.memory_attach(node, "notes", "alpha", "s1")
    assert "standup" in node.auto_recall("alpha", ["when is standup?"], session="s1")
    assert node.auto_recall("alpha", ["when is standup?"], session="s2") == ""
    commands.memory_revoke(node, "notes", "alpha")
    assert node.auto_recall("alpha", ["when is standup?"], session="s1") == ""  # skipped silently


def test_auto_recall_max_entries_per_store(node):
    for i in range(6):
        remember(node, "alpha", f"deploy step {i}", f"deploy detail {i}")
    commands.memory_config(node, "alpha", "set", "max_entries", "2")
    block = node.auto_recall("alpha", ["deploy"])
    assert block.count("\n- ") == 2


def test_hybrid_recall_with_hashed_embedder(node):
    node.set_embedder_config(EmbedderConfig("hashed"))
    r = remember(node, "alpha", "deploy process", "Build via nix build and scp to prod")
    assert r["embedded"] is True
    db = node.agents.agent("alpha").db
    entry = db.entry(r["entry"])
    assert set(entry.stores) == {"memory", node.memory.embedder.store_name}  # same entry
    out = recall(node, "alpha", query="deploy")
    assert values(out) == ["Build via nix build and scp to prod"]


def test_reindex_backfills_vectors(node):
    remember(node, "alpha", "a", "alpha text")
    remember(node, "alpha", "b", "beta text")
    node.set_embedder_config(EmbedderConfig("hashed"))
    view = node.memory.view(node.agents.agent("alpha").db)
    assert len(view.missing_vectors()) == 2
    seen = []
    commands.memory_reindex(node, "alpha", progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (2, 2)
    assert view.missing_vectors() == [] and view.has_vectors()


def test_state_survives_reopen(tmp_path):
    home = tmp_path / "h"
    with Node.open(home) as n:
        n.set_embedder_config(EmbedderConfig("hashed"))
        n.agents.create_agent("alpha")
        remember(n, "alpha", "k", "persisted value")
    with Node.open(home) as n:
        assert n.embedder_config().provider == "hashed"
        assert values(recall(n, "alpha", query="persisted")) == ["persisted value"]


def test_auto_recall_banks_must_name_banks_and_limit_the_search(node):
    commands.memory_new(node, "notes")
    commands.memory_new(node, "other")
    for bank in ("notes", "other"):
        commands.memory_grant(node, bank, "alpha", "write")
        remember(node, "alpha", f"standup {bank}", f"standup notes in {bank}", bank=bank)
        commands.memory_attach(node, bank, "alpha", None)
    with pytest.raises(MemmeshError):
        commands.memory_config(node, "alpha", "set", "auto_recall_banks", "notes,no-such-bank")
    shown = commands.memory_config(node, "alpha", "set", "auto_recall_banks", "notes")
    assert shown.data["config"]["auto_recall_banks"] == ["notes"]
    block = node.auto_recall("alpha", ["standup"])
    assert "_(from bank: notes)_" in block and "from bank: other" not in block


def test_auto_recall_embeds_the_query_once(node, tmp_path):
    calls = []
    node.set_embedder_config(EmbedderConfig("hashed"))
    emb = node.memory.embedder
    real = emb.embed
    emb.embed = lambda texts: calls.append(list(texts)) or real(texts)
    commands.memory_new(node, "notes")
    commands.memory_grant(node, "notes", "alpha", "write")
    remember(node, "alpha", "deploy", "nix build", bank="notes")
    remember(node, "alpha", "deploy steps", "scp to prod")
    commands.memory_attach(node, "notes", "alpha", None)
    calls.clear()
    assert "nix build" in node.auto_recall("alpha", ["deploy"])
    assert calls == [["deploy"]]
