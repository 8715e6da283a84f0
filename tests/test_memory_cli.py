"""The memory commands through the `memmesh` command line, as an operator types them.

Most run through ``node.cli.main`` in this process (``mm_here``: the console script's code,
output and exit code, without a cold interpreter per command); a refused command and a home
that does not exist also run as separate `memmesh` processes (``mm``), for what only a process
shows: its exit status and its whole stderr.
"""
from __future__ import annotations

import json

import pytest

from memmesh.node.library import Node
from tests.test_cli import mm, mm_here


@pytest.fixture
def home(home):
    """conftest's home (no embedder) with agent alpha. Made with the library (the same registry
    commands the CLI runs): the tests' own steps are the ones that go through the command line."""
    with Node.open(home) as node:
        node.run("agent.new", {"name": "alpha"})
    return home


def test_agents_new_and_list(home):
    mm_here("agent", "new", "beta", home=home)
    data = json.loads(mm_here("agent", "list", "--json", home=home).stdout)
    assert [a["name"] for a in data["agents"]] == ["alpha", "beta"]
    assert all(a["key"].startswith("ed25519:") and a["id"].startswith("sha256:") for a in data["agents"])
    dup = mm_here("agent", "new", "beta", home=home, check=False)
    assert dup.returncode == 1 and "already" in dup.stderr
    bad = mm_here("agent", "new", "no spaces", home=home, check=False)
    assert bad.returncode == 1 and "name should be 1-64 ASCII letters" in bad.stderr


def test_remember_and_recall_shortcuts(home):
    mm_here("remember", "alpha", "deploy process", "Build via nix build", "--tag", "ops", home=home)
    out = mm_here("recall", "alpha", "deploy", home=home).stdout
    assert "deploy process: Build via nix build [ops]" in out
    data = json.loads(mm_here("recall", "alpha", "deploy", "--tag", "OPS", "--json", home=home).stdout)
    assert [m["value"] for m in data["memories"]] == ["Build via nix build"]
    assert "No memories found" in mm_here("recall", "alpha", "zebra", home=home).stdout
    mm_here("remember", "alpha", "deploy process", "Build via nix flakes", home=home)
    current = json.loads(mm_here("recall", "alpha", "deploy", "--json", home=home).stdout)
    assert [m["value"] for m in current["memories"]] == ["Build via nix flakes"]
    everything = json.loads(mm_here("recall", "alpha", "deploy", "--all", "--json", home=home).stdout)
    assert sorted(m["value"] for m in everything["memories"]) == ["Build via nix build", "Build via nix flakes"]


def test_tool_errors_are_one_line_and_exit_1(home):
    cases = (["tool", "alpha", "remember", "{not json"], ["tool", "alpha", "remember", '{"key": "k"}'],
             ["tool", "nobody", "recall", "{}"], ["tool", "alpha", "recall", '{"bank": "missing"}'])
    for i, args in enumerate(cases):
        proc = (mm if i == 0 else mm_here)(*args, home=home, check=False)  # one as its own process
        assert proc.returncode == 1 and proc.stdout == "", args
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
        assert proc.stderr.startswith("memmesh: error: "), proc.stderr


def test_embedder_set_show_and_reindex(home):
    mm_here("remember", "alpha", "a", "first text", home=home)
    data = json.loads(mm_here("embedder", "set", "hashed", "--json", home=home).stdout)
    assert data["provider"] == "hashed" and data["store"].startswith("embeddings:hashed/")
    shown = json.loads(mm_here("embedder", "show", "--json", home=home).stdout)
    assert shown["provider"] == "hashed" and shown["dim"] == data["dim"]
    out = json.loads(mm_here("memory", "reindex", "alpha", "--json", home=home).stdout)
    assert out["embedded"] == 1
    again = json.loads(mm_here("memory", "reindex", "alpha", "--json", home=home).stdout)
    assert again["embedded"] == 0
    bad = mm_here("embedder", "set", "local", "--model", "no-such-model", home=home, check=False)
    assert bad.returncode == 1 and "no-such-model" in bad.stderr
    assert json.loads(mm_here("embedder", "show", "--json", home=home).stdout)["provider"] == "hashed"


def test_bank_lifecycle(home):
    mm_here("memory", "new", "notes", "Team notes", home=home)
    mm_here("memory", "grant", "notes", "alpha", "write", home=home)
    mm_here("remember", "alpha", "k", "in the bank", "--bank", "notes", home=home)
    banks = json.loads(mm_here("memory", "list", "--json", home=home).stdout)
    [b] = banks["banks"]
    assert b["name"] == "notes" and b["memories"] == 1 and b["description"] == "Team notes"
    mm_here("memory", "attach", "notes", "--agent", "alpha", home=home)
    block = mm_here("autorecall", "alpha", "what is in the bank?", home=home).stdout
    assert "## Relevant Memories" in block and "_(from bank: notes)_" in block
    mm_here("memory", "detach", "notes", "--agent", "alpha", home=home)
    assert "from bank" not in mm_here("autorecall", "alpha", "what is in the bank?", home=home).stdout
    mm_here("memory", "delete", "notes", home=home)
    listed = json.loads(mm_here("memory", "list", "--json", home=home).stdout)
    assert listed["banks"] == [] and listed["archived"][0]["name"] == "notes"


def test_config_show_set_reset(home):
    mm_here("memory", "config", "alpha", "set", "max_entries", "5", home=home)
    shown = json.loads(mm_here("memory", "config", "alpha", "show", "--json", home=home).stdout)
    assert shown["config"]["max_entries"] == 5
    bad = mm_here("memory", "config", "alpha", "set", "max_entries", "25", home=home, check=False)
    assert bad.returncode == 1 and "1 to 20" in bad.stderr
    mm_here("memory", "config", "alpha", "reset", home=home)
    shown = json.loads(mm_here("memory", "config", "alpha", "show", "--json", home=home).stdout)
    assert shown["config"]["max_entries"] == 3


def test_commands_on_uninitialised_home_fail_clearly(tmp_path):
    proc = mm("agent", "list", home=tmp_path / "none", check=False)
    assert proc.returncode == 1 and "memmesh" in proc.stderr and "init" in proc.stderr
    assert not (tmp_path / "none").exists()
