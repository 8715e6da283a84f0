"""The command registry: schemas, refused parameters, the CLI derived from it, runs by name."""
from __future__ import annotations

import argparse
import json

import pytest

from memmesh.node import Node
from memmesh.node.cli_args import COMMAND, build_parser, command_of
from memmesh.node.commands import REGISTRY, ParamsError, UnknownCommand
from memmesh.node.commands.tools import TOOLS
from memmesh.node.library import run_in_home
from tests.test_cli import mm_here


@pytest.fixture
def node(node):
    """conftest's node (alpha, no embedder) and a bank, notes."""
    node.run("memory.new", {"name": "notes"})
    return node


def snapshot(node: Node) -> dict:
    """Everything a command could change: each database's entries, and the peer-local records."""
    dbs = {i: sorted(node.database(i).accepted_ids()) for i in node.database_ids()}
    local = {ns: sorted(node.storage.items_local(ns))
             for ns in ("agents", "banks", "archived-banks", "node-config", "credentials")}
    return {"databases": dbs, "local": local}


# Every command the CLI had before the registry, by its registry name.
BEFORE_THE_REGISTRY = {"init", "status", "agent.new", "agent.list", "tool", "remember", "recall", "autorecall",
                       "embedder.set", "embedder.show", "memory.new", "memory.list", "memory.delete",
                       "memory.grant", "memory.revoke", "memory.attach", "memory.detach", "memory.config",
                       "memory.reindex"}


def test_every_command_exposes_a_json_schema():
    assert set(REGISTRY.names()) >= BEFORE_THE_REGISTRY
    for cmd in REGISTRY:
        schema = cmd.schema()
        assert schema["type"] == "object" and schema.get("additionalProperties") is False, cmd.name
        json.dumps(schema)  # JSON itself: what OpenAPI and MCP tool schemas are built from
        for name, prop in schema.get("properties", {}).items():
            assert prop.get("description"), f"{cmd.name}.{name} has no description"


def test_every_agent_tool_exposes_its_argument_schema():
    """What an MCP server will publish per tool: the arguments, without the agent."""
    assert set(TOOLS) == {"remember", "recall", "list_memory_banks", "neighbors", "forget"}
    for name, tool in TOOLS.items():
        schema = tool.args.model_json_schema()
        assert schema["type"] == "object" and "agent" not in schema.get("properties", {}), name
        assert tool.description
    assert TOOLS["remember"].args.model_json_schema()["required"] == ["key", "value"]


def test_unknown_params_are_refused_clearly_and_change_nothing(node):
    before = snapshot(node)
    for cmd in REGISTRY:
        if cmd.creates_home:
            continue
        with pytest.raises(ParamsError) as err:
            node.run(cmd.name, {"colour": "red"})
        assert cmd.name in str(err.value) and "does not take colour" in str(err.value)
        assert "\n" not in str(err.value)
    assert snapshot(node) == before


@pytest.mark.parametrize("name, params, says", [
    ("remember", {"agent": "alpha", "key": "k"}, "remember needs value"),
    ("remember", {"agent": "alpha", "key": "k", "value": 5}, "value should be a valid string"),
    ("recall", {"agent": "alpha", "limit": 0}, "limit should be greater than or equal to 1"),
    ("recall", {"agent": "alpha", "limit": "10"}, "limit should be a valid integer"),
    ("recall", {"agent": "alpha", "limit": True}, "limit should be a valid integer"),
    ("memory.grant", {"bank": "notes", "agent": "alpha", "perm": "admin"}, "perm should be 'read' or 'write'"),
    ("memory.config", {"agent": "alpha", "action": "set", "key": "max_entries"}, "set needs a key and a value"),
    ("tool", {"agent": "alpha", "tool": "nope"}, "tool should be"),
    ("tool", {"agent": "alpha", "tool": "remember", "args": {"key": "k", "value": "v", "colour": 1}},
     "remember does not take colour; it takes bank, category, confidence, edges, entities, importance, key, on_duplicate, source, supersedes, tags, valid_from, valid_to, value"),
    ("tool", {"agent": "alpha", "tool": "recall", "args": []}, "args should be an object"),
    ("embedder.set", {"provider": "openai", "api_key": 12345}, "api_key should be a valid string"),
    ("status", [], "takes a JSON object"),
    ("agent.new", {"name": object()}, "must be JSON data"),
])
def test_bad_params_are_one_clear_line_and_change_nothing(node, name, params, says):
    before = snapshot(node)
    with pytest.raises(ParamsError) as err:
        node.run(name, params)
    assert says in str(err.value) and "\n" not in str(err.value)
    assert snapshot(node) == before


def test_a_secret_is_never_echoed_in_an_error(node):
    with pytest.raises(ParamsError) as err:
        node.run("embedder.set", {"provider": "openai", "api_key": 987654321})
    assert "api_key" in str(err.value) and "987654321" not in str(err.value)


def test_null_means_the_default_for_tool_arguments(node):
    node.call_tool("alpha", "remember", {"key": "deploy", "value": "nix build", "tags": None, "bank": None})
    out = node.call_tool("alpha", "recall", {"query": None, "tags": None, "limit": None, "bank": None})
    assert [m["value"] for m in out["memories"]] == ["nix build"]


def test_unknown_command():
    with pytest.raises(UnknownCommand, match="no.such"):
        REGISTRY.get("no.such")


def _leaves(parser: argparse.ArgumentParser):
    """(command name, {dest, ...}) for every runnable leaf of the parser."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        dests = {a.dest for a in parser._actions if a.dest not in ("help", "json", "home")}
        yield parser.get_default(COMMAND), dests
        return
    for sub in subs:
        for child in sub.choices.values():
            yield from _leaves(child)


def test_the_cli_and_the_registry_have_the_same_commands_and_parameters():
    leaves = dict(_leaves(build_parser()))
    leaves.pop(None, None)
    assert sorted(leaves) == sorted(REGISTRY.names())
    for cmd in REGISTRY:
        assert leaves[cmd.name] == set(cmd.params.model_fields), cmd.name
        if "." in cmd.name:
            assert REGISTRY.group_help(cmd.name.rsplit(".", 1)[0]), f"{cmd.name}: its group has no help"


@pytest.mark.parametrize("argv, name, params", [
    (["recall", "alpha", "deploy", "--tag", "ops", "--all"], "recall",
     {"agent": "alpha", "query": "deploy", "tags": ["ops"], "include_superseded": True}),
    (["recall", "alpha"], "recall", {"agent": "alpha"}),
    (["tool", "alpha", "recall", '{"query": "x"}'], "tool", {"agent": "alpha", "tool": "recall", "args": {"query": "x"}}),
    (["memory", "attach", "notes", "--agent", "alpha"], "memory.attach", {"bank": "notes", "agent": "alpha"}),
    (["memory", "config", "alpha", "set", "max_entries", "5"], "memory.config",
     {"agent": "alpha", "action": "set", "key": "max_entries", "value": "5"}),
    (["embedder", "set", "hashed", "--timeout", "2.5"], "embedder.set", {"provider": "hashed", "timeout_s": 2.5}),
    (["autorecall", "alpha", "one", "two", "--session", "s"], "autorecall",
     {"agent": "alpha", "messages": ["one", "two"], "session": "s"}),
    (["explain", "sha256:ab", "--bank", "notes"], "explain", {"entry_id": "sha256:ab", "bank": "notes"}),
])
def test_the_cli_builds_the_json_params_of_the_command(argv, name, params):
    assert command_of(build_parser().parse_args(argv)) == (name, params)


def test_the_api_key_is_read_from_the_named_environment_variable(monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-test")
    args = build_parser().parse_args(["embedder", "set", "openai", "--api-key-env", "MY_KEY"])
    assert command_of(args) == ("embedder.set", {"provider": "openai", "api_key": "sk-test"})


def test_run_by_name_with_json_params_gives_what_the_cli_prints(tmp_path):
    # The CLI's main() in this process: what the `memmesh` console script runs.
    home = tmp_path / "node"
    mm_here("init", home=home)
    mm_here("embedder", "set", "none", home=home)
    mm_here("agent", "new", "alpha", home=home)
    mm_here("remember", "alpha", "deploy process", "nix build", "--tag", "ops", home=home)
    for argv, name, params in [
        # --no-count: a counted recall would change the access counts between the two calls
        (["recall", "alpha", "deploy", "--no-count"], "recall",
         '{"agent": "alpha", "query": "deploy", "no_count": true}'),
        (["memory", "config", "alpha", "show"], "memory.config", '{"agent": "alpha", "action": "show"}'),
        (["tool", "alpha", "list_memory_banks"], "tool", '{"agent": "alpha", "tool": "list_memory_banks"}'),
    ]:
        printed = json.loads(mm_here(*argv, "--json", home=home).stdout)
        assert run_in_home(home, name, json.loads(params)).data == printed, argv


def test_progress_is_reported_as_json_events(node):
    for i in range(3):
        node.call_tool("alpha", "remember", {"key": f"k{i}", "value": f"value {i}"})
    node.run("embedder.set", {"provider": "hashed"})
    events = []
    result = node.run("memory.reindex", {"bank": "alpha"}, events=events.append)
    assert result.data["embedded"] == 3
    assert events and all(json.loads(json.dumps(e)) == e for e in events)
    assert events[-1] == {"event": "progress", "bank": "alpha", "done": 3, "total": 3}
    assert node.run("memory.reindex", {"bank": "alpha"}).data["embedded"] == 0  # no listener is fine
