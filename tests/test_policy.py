"""Each command declares its transport policy once (node/commands/registry.py), and every
transport derives what it serves from it: the CLI's dispatch, the HTTP routes, the chat
grammar; the tool list is the catalogue's (node/catalogue.py) everywhere."""
from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import Field

from memmesh.node import chat, settings
from memmesh.node.api.routes import build_routes
from memmesh.node.catalogue import TOOL_NAMES
from memmesh.node.commands import REGISTRY
from memmesh.node.commands.params import Cli, NoParams, Params
from memmesh.node.commands.registry import EITHER, HERE, Registry, StandaloneCommand
from memmesh.node.commands.result import Result
from memmesh.node.commands.tools import TOOLS
from memmesh.node.dispatch import run_command
from memmesh.node.http_guard import NO_TOKEN, WRONG_TOKEN, bearer_refusal


def test_the_routes_are_the_routes_the_commands_declare():
    served = {(r.method, r.path): r.command.name for r in build_routes()}
    for cmd in REGISTRY:
        if cmd.http is None:
            assert cmd.name not in served.values(), cmd.name
            continue
        method, path = cmd.http
        paths = [path.replace("{tool}", t) for t in TOOL_NAMES] if "{tool}" in path else [path]
        assert all(served[(method, p)] == cmd.name for p in paths), cmd.name
    unrouted = {c.name for c in REGISTRY if c.http is None}
    assert unrouted == {"serve", "init", "remember", "recall", "forget"} | {c.name for c in REGISTRY if c.standalone}


def test_the_default_route_follows_the_rule():
    reg = Registry()
    reg.command("thing.list", NoParams, "list", read_only=True)(lambda node, p: Result([], ""))
    reg.command("thing.add", NoParams, "add")(lambda node, p: Result([], ""))
    reg.command("thing.hidden", NoParams, "hidden", http=None)(lambda node, p: Result([], ""))
    assert [(c.name, c.http) for c in reg] == [("thing.list", ("GET", "/v1/thing/list")),
                                                ("thing.add", ("POST", "/v1/thing/add")),
                                                ("thing.hidden", None)]


def test_one_tool_list_everywhere():
    assert tuple(TOOLS) == TOOL_NAMES == settings.TOOL_NAMES
    assert REGISTRY.get("tool").params.model_fields["tool"].annotation.__args__ == TOOL_NAMES  # type: ignore[union-attr]
    mcp_server = pytest.importorskip("memmesh.node.mcp_server")
    assert tuple(mcp_server.ANNOTATIONS) == TOOL_NAMES
    assert mcp_server.ANNOTATIONS["recall"].read_only_hint and not mcp_server.ANNOTATIONS["remember"].read_only_hint


def test_chat_serves_the_commands_whose_policy_lets_it():
    assert [g.command for g in chat.grammars()] == [c.name for c in REGISTRY if c.chat]
    assert {c.name: c.from_caller for c in REGISTRY if c.from_caller} == chat.FROM_CALLER

    class Probe(Params):
        agent: Annotated[str, Cli(positional=True), Field(description="who")]

    reg = Registry()
    reg.command("memory.probe", Probe, "probe", from_caller=("agent",))(lambda node, p: Result({}, ""))
    reg.command("memory.quiet", Probe, "not for chat", chat=False)(lambda node, p: Result({}, ""))
    assert [g.command for g in chat.grammars(reg)] == ["memory.probe"]
    assert chat.parse("/memory probe", agent="alpha", registry=reg) == ("memory.probe", {"agent": "alpha"})
    with pytest.raises(ValueError, match="from_caller names"):
        reg.command("memory.bad", NoParams, "bad", from_caller=("agent",))(lambda node, p: Result({}, ""))


def test_where_each_command_runs():
    assert REGISTRY.get("serve").runs == REGISTRY.get("mcp").runs == REGISTRY.get("restore").runs == HERE
    assert REGISTRY.get("status").runs == REGISTRY.get("check").runs == EITHER
    # serve and mcp are transports: declared without a handler, run by the transport that provides it
    assert REGISTRY.get("serve").handler is None and REGISTRY.get("mcp").handler is None


def test_a_transport_command_needs_its_runner(tmp_path):
    with pytest.raises(StandaloneCommand, match="memmesh mcp"):
        run_command(tmp_path, "mcp", {"agent": "alpha"})
    with pytest.raises(StandaloneCommand, match="memmesh serve"):
        REGISTRY.run(None, "serve", {})  # type: ignore[arg-type]
    got = run_command(tmp_path, "mcp", {"agent": "alpha"}, runners={"mcp": lambda home, p: Result(p.agent, "")})
    assert got.data == "alpha"


def test_the_bearer_rule_of_every_listener():
    assert bearer_refusal("Bearer s3cret", "s3cret") is None
    assert bearer_refusal("bearer  s3cret ", "s3cret") is None
    assert bearer_refusal("", "s3cret") == NO_TOKEN
    assert bearer_refusal("Basic s3cret", "s3cret") == NO_TOKEN
    assert bearer_refusal("Bearer other", "s3cret") == WRONG_TOKEN
