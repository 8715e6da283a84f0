"""memmesh mcp, driven by the MCP SDK's own clients.

In-process sessions (the SDK's in-memory ``Client``) against the server built on a real home
whose real `memmesh serve` answers every call; real stdio ``ClientSession``s against
`memmesh mcp` processes, as MCP clients spawn them; two of those on one home at once, with no
serve running beforehand: one detached serve is started for both, and stopped here.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS

import memmesh.node as node
from memmesh.node import Node
from memmesh.node.api_token import read_token
from memmesh.node.cli import main, run_command
from memmesh.node.commands import REGISTRY
from memmesh.node.commands.mcp import McpNotInstalled
from memmesh.node.commands.registry import StandaloneCommand
from memmesh.node.commands.tools import TOOLS
from memmesh.node.control import SERVE_JSON, read_info, remote
from memmesh.node.mcp_server import (
    ANNOTATIONS,
    BANKS_URI,
    PROMPT,
    SERVE_LOG,
    SPAWN_LOCK,
    ServeStartError,
    build_server,
    ensure_serve,
    memory_uri,
    prepare,
)
from memmesh.node.refusal import failure
from tests.procs import CLI, Serve, until

CONFIG = """\
sync:
  listen: "127.0.0.1:0"
  discovery: false
api:
  listen: "127.0.0.1:0"
"""


def make_home(path: Path) -> Path:
    """A node with agents alpha and beta, a bank alpha writes, and a config.yaml on loopback."""
    node_, _ = Node.init(path)
    with node_:
        node_.run("embedder.set", {"provider": "none"})
        for name in ("alpha", "beta"):
            node_.run("agent.new", {"name": name})
        node_.run("memory.new", {"name": "notes", "description": "shared notes"})
        node_.run("memory.grant", {"bank": "notes", "agent": "alpha", "perm": "write"})
    (path / "config.yaml").write_text(CONFIG)
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Any:
    """One home and its serve for the in-process tests (each test uses its own keys)."""
    home = make_home(tmp_path_factory.mktemp("mcp") / "node")
    serve = Serve(home).start()
    try:
        yield serve.wait_ready()
    finally:
        serve.stop()


def authorized(address: str, home: Path) -> Any:
    """The Streamable HTTP transport to ``address`` with the node's API token, as clients pass it."""
    token = read_token(home)
    return streamable_http_client(address, http_client=create_mcp_http_client(
        headers={"Authorization": f"Bearer {token}"}))


def fingerprint(serve: Serve) -> list[tuple[str, int, list[str]]]:
    """What the home holds: every database's entry count and heads, as serve sees them."""
    return sorted((d["id"], d["entries"], d["heads"]) for d in serve.run("status", {}).data["databases"])


def cli_line(home: Path, name: str, params: dict[str, Any]) -> str:
    """The one line the CLI prints for a refused command (run as the CLI runs it)."""
    with pytest.raises(Exception) as err:
        run_command(home, name, params)
    found = failure(err.value)
    assert found is not None, err.value
    return found[0]


def text(result: Any) -> str:
    [content] = result.content
    return content.text


# ---------------------------------------------------------------------- what is published
async def test_the_tools_publish_the_registry_schemas_descriptions_and_annotations(tmp_path):
    async with Client(build_server(tmp_path, "alpha")) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        prompts = (await client.list_prompts()).prompts
    assert sorted(tools) == sorted(TOOLS)
    for name, spec in TOOLS.items():
        assert tools[name].input_schema == spec.args.model_json_schema(), name
        assert tools[name].description == spec.description
        assert tools[name].annotations == ANNOTATIONS[name]
    assert tools["recall"].annotations.read_only_hint and tools["list_memory_banks"].annotations.read_only_hint
    assert sorted(tools) == ["forget", "list_memory_banks", "neighbors", "recall", "remember"]
    assert tools["neighbors"].annotations.read_only_hint
    # depth has a default, so null is published as allowed too (node/strict.py): anyOf [integer, null]
    assert tools["neighbors"].input_schema["properties"]["depth"]["anyOf"][0]["maximum"] == 3
    remember = tools["remember"].annotations
    assert (remember.read_only_hint, remember.destructive_hint, remember.idempotent_hint,
            remember.open_world_hint) == (False, False, False, False)
    [prompt] = prompts
    assert prompt.name == PROMPT
    assert [(a.name, a.required) for a in prompt.arguments] == [("messages", True), ("session", False),
                                                                 ("context_window", False), ("now", False)]


# ---------------------------------------------------------------------- each tool, in process
@pytest.mark.slow
async def test_remember_writes_through_serve_and_a_bad_argument_writes_nothing(served):
    home = served.home
    async with Client(build_server(home, "alpha")) as client:
        ok = await client.call_tool("remember", {"key": "deploy process", "value": "nix build && scp",
                                                 "tags": ["ops"]})
        assert not ok.is_error, text(ok)
        assert json.loads(text(ok)) == ok.structured_content and ok.structured_content["key"] == "deploy process"
        found = served.run("recall", {"agent": "alpha", "query": "deploy"}).data["memories"]
        assert [(m["key"], m["value"], m["tags"]) for m in found] == [("deploy process", "nix build && scp", ["ops"])]

        before = fingerprint(served)
        for bad in ({"key": "k"}, {"key": "k", "value": 5}, {"key": "k", "value": "v", "agent": "beta"}):
            refused = await client.call_tool("remember", bad)
            assert refused.is_error
            assert text(refused) == cli_line(home, "tool", {"agent": "alpha", "tool": "remember", "args": bad})
        assert "remember needs value" in text(await client.call_tool("remember", {"key": "k"}))
        assert fingerprint(served) == before


@pytest.mark.slow
async def test_recall_finds_memories_and_a_bad_argument_is_the_registry_line(served):
    home = served.home
    served.run("remember", {"agent": "alpha", "key": "sessions", "value": "one database per conversation"})
    served.run("remember", {"agent": "alpha", "key": "bank note", "value": "bank sessions are shared",
                            "bank": "notes"})
    async with Client(build_server(home, "alpha")) as client:
        own = await client.call_tool("recall", {"query": "conversation database"})
        assert not own.is_error
        assert [m["key"] for m in own.structured_content["memories"]] == ["sessions"]
        bank = await client.call_tool("recall", {"query": "sessions", "bank": "notes"})
        assert [m["key"] for m in bank.structured_content["memories"]] == ["bank note"]

        before = fingerprint(served)
        refused = await client.call_tool("recall", {"query": "x", "limit": 0})
        assert refused.is_error
        assert text(refused) == "recall: limit should be greater than or equal to 1 (got 0)"
        assert text(refused) == cli_line(home, "tool", {"agent": "alpha", "tool": "recall",
                                                        "args": {"query": "x", "limit": 0}})
        assert (await client.call_tool("recall", {"bank": "no-such-bank"})).is_error
        assert fingerprint(served) == before


@pytest.mark.slow
async def test_list_memory_banks_lists_the_agent_and_its_banks(served):
    async with Client(build_server(served.home, "alpha")) as client:
        listed = await client.call_tool("list_memory_banks", {})
        assert not listed.is_error
        banks = {b["name"]: b["permission"] for b in listed.structured_content["banks"]}
        assert banks["alpha"] == "admin" and banks["notes"] == "write"
        assert listed.structured_content == served.run("tool", {"agent": "alpha", "tool": "list_memory_banks"}).data

        refused = await client.call_tool("list_memory_banks", {"colour": "red"})
        assert refused.is_error and text(refused) == "list_memory_banks does not take colour; it takes nothing"


@pytest.mark.slow
async def test_the_prompt_is_the_autorecall_block(served):
    home = served.home
    served.run("remember", {"agent": "beta", "key": "deploy target", "value": "prod runs on the arm boxes"})
    async with Client(build_server(home, "beta")) as client:
        got = await client.get_prompt(PROMPT, {"messages": "hello\n\nhow do we deploy to prod?"})
        expected = served.run("autorecall", {"agent": "beta", "messages": ["hello", "how do we deploy to prod?"]})
        [message] = got.messages
        assert message.role == "user" and message.content.text == expected.data["block"]
        assert message.content.text.startswith("## Relevant Memories") and "arm boxes" in message.content.text

        # the answering model's window, as the prompt's string argument: too small, no block
        small = await client.get_prompt(PROMPT, {"messages": "how do we deploy to prod?", "context_window": "4000"})
        assert small.messages == []

        nothing = await client.get_prompt(PROMPT, {"messages": "zyzzyva quux"})
        assert nothing.messages == []

        before = fingerprint(served)
        with pytest.raises(MCPError) as missing:
            await client.get_prompt(PROMPT, {})
        assert str(missing.value) == cli_line(home, "autorecall", {"agent": "beta"})
        with pytest.raises(MCPError) as other_agent:
            await client.get_prompt(PROMPT, {"messages": "deploy", "agent": "alpha"})
        assert "does not take agent" in str(other_agent.value)
        assert fingerprint(served) == before


@pytest.mark.slow
def test_an_unknown_agent_is_refused_at_start_with_the_registry_line(served):
    with pytest.raises(Exception) as err:
        prepare(served.home, "gamma")
    assert str(err.value) == cli_line(served.home, "autorecall", {"agent": "gamma", "messages": []})
    assert "gamma" in str(err.value)


@pytest.mark.slow
async def test_a_client_sees_only_the_tools_config_allows_and_serve_refuses_the_others(tmp_path):
    home = make_home(tmp_path / "node")
    (home / "config.yaml").write_text(CONFIG + "agents:\n  - name: beta\n    allowed_tools: [recall]\n")
    serve = Serve(home).start()
    try:
        serve.wait_ready()
        async with Client(prepare(home, "beta")) as client:
            assert [t.name for t in (await client.list_tools()).tools] == ["recall"]
        # a client that lists every tool (built before the config narrowed them) is refused by serve
        before = fingerprint(serve)
        async with Client(build_server(home, "beta")) as client:
            result = await client.call_tool("remember", {"key": "k", "value": "v"})
        assert result.is_error and "may not use remember" in text(result), text(result)
        assert fingerprint(serve) == before
    finally:
        serve.stop()


# ---------------------------------------------------------------------- refusals before anything runs
def test_mcp_is_standalone_and_never_runs_on_an_open_node(tmp_path):
    assert REGISTRY.get("mcp").standalone
    node_, _ = Node.init(tmp_path / "node")
    with node_, pytest.raises(StandaloneCommand, match="mcp runs in its own process"):
        node_.run("mcp", {"agent": "alpha"})


@pytest.mark.parametrize("argv, says", [
    (["--http", "--listen", "0.0.0.0:7413"], "listen should be a loopback address"),
    (["--http", "--listen", "192.0.2.1:0"], "listen should be a loopback address"),
    (["--http", "--listen", "localhost"], "listen should be HOST:PORT"),
    (["--listen", "127.0.0.1:0"], "listen is for the HTTP transport: add --http"),
])
def test_bad_listen_addresses_are_one_line_and_start_nothing(tmp_path, capsys, argv, says):
    home = make_home(tmp_path / "node")
    before = sorted(p.name for p in home.iterdir())
    assert main(["--home", str(home), "mcp", "--agent", "alpha", *argv]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("memmesh: error: mcp: ") and says in err and err.count("\n") == 1
    assert sorted(p.name for p in home.iterdir()) == before  # no serve.log, no spawn lock, no serve


def test_a_home_without_a_node_is_refused_and_left_empty(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--home", str(empty), "mcp", "--agent", "alpha"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "no memmesh node in" in err and "init" in err
    assert list(empty.iterdir()) == []


def test_without_the_mcp_extra_the_error_says_what_to_install(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "mcp" or m.startswith("mcp.")]:
        monkeypatch.setitem(sys.modules, name, None)  # what an environment without the SDK gives
    monkeypatch.delitem(sys.modules, "memmesh.node.mcp_server", raising=False)
    monkeypatch.delattr(node, "mcp_server", raising=False)
    with pytest.raises(McpNotInstalled) as err:
        run_command(tmp_path, "mcp", {"agent": "alpha"})  # (an empty home: nothing could start)
    assert str(err.value) == "memmesh mcp needs the mcp extra: pip install 'memmesh[mcp]'"


# ---------------------------------------------------------------------- real processes
def mcp_params(home: Path, agent: str = "alpha") -> StdioServerParameters:
    return StdioServerParameters(command=CLI[0], args=[*CLI[1:], "--home", str(home), "mcp", "--agent", agent])


@contextlib.asynccontextmanager
async def stdio_session(home: Path, errlog: Path, agent: str = "alpha") -> AsyncIterator[ClientSession]:
    with open(errlog, "w") as err:
        async with stdio_client(mcp_params(home, agent), errlog=err) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


def serve_pids(home: Path) -> list[int]:
    """Every running `memmesh --home HOME serve` process on this machine."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and os.fsencode(str(home)) in args and b"serve" in args:
            pids.append(int(entry.name))
    return pids


def stop_detached(home: Path) -> None:
    """Stop every serve left for ``home`` (one this test did not start as a child) and wait."""
    for pid in serve_pids(home):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    until(lambda: not serve_pids(home), 20, f"the detached serve of {home} to stop")


@pytest.mark.slow
async def test_a_stdio_session_lists_calls_every_tool_and_gets_the_prompt(served, tmp_path):
    home = served.home
    async with stdio_session(home, tmp_path / "mcp.err") as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert sorted(tools) == sorted(TOOLS)
        for name, spec in TOOLS.items():
            assert tools[name].input_schema == spec.args.model_json_schema()
            assert tools[name].annotations == ANNOTATIONS[name]

        wrote = await session.call_tool("remember", {"key": "stdio key", "value": "written over stdio pipes"})
        assert not wrote.is_error and wrote.structured_content["key"] == "stdio key"
        found = await session.call_tool("recall", {"query": "stdio pipes"})
        assert [m["key"] for m in found.structured_content["memories"]] == ["stdio key"]
        banks = await session.call_tool("list_memory_banks", {})
        assert "notes" in {b["name"] for b in banks.structured_content["banks"]}
        refused = await session.call_tool("recall", {"limit": "10"})
        assert refused.is_error and text(refused) == "recall: limit should be a valid integer (got '10')"

        prompt = await session.get_prompt(PROMPT, {"messages": "what goes over stdio pipes?"})
        block = served.run("autorecall", {"agent": "alpha", "messages": ["what goes over stdio pipes?"]}).data["block"]
        assert prompt.messages[0].content.text == block and "written over stdio pipes" in block

        # the handshake protocol: a resource reads back, an unknown prompt is -32602 (it was code 0)
        [content] = (await session.read_resource(memory_uri("alpha", "stdio key"))).contents
        assert json.loads(content.text)["value"] == "written over stdio pipes"
        with pytest.raises(MCPError) as unknown:
            await session.get_prompt("nope", {})
        assert (unknown.value.error.code, str(unknown.value)) == (INVALID_PARAMS, f"unknown prompt 'nope'; this "
                                                                                  f"server has {PROMPT}")
    # It went through the running serve: the memory is there, and no other serve was started.
    assert served.run("recall", {"agent": "alpha", "query": "stdio"}).data["memories"][0]["key"] == "stdio key"
    assert serve_pids(home) == [served.proc.pid]
    assert (tmp_path / "mcp.err").read_text() == ""  # nothing started, no traceback


@pytest.mark.slow
async def test_two_stdio_servers_on_one_home_start_one_detached_serve_and_both_write(tmp_path):
    home = make_home(tmp_path / "node")
    assert read_info(home) is None and serve_pids(home) == []
    both = asyncio.Barrier(2)

    async def client(agent: str, bank: str | None, errlog: str) -> tuple[list[str], list[int]]:
        async with stdio_session(home, tmp_path / errlog, agent) as session:
            wrote = await asyncio.gather(*(session.call_tool("remember", {"key": f"{agent} {i}", "value": f"note {i}",
                                                                          "bank": bank}) for i in range(3)))
            assert not any(w.is_error for w in wrote), [text(w) for w in wrote]
            await both.wait()  # both have written; both sessions are still open
            found = await session.call_tool("recall", {"query": "note", "bank": bank, "limit": 10})
            pids = serve_pids(home)
            await both.wait()
            return sorted(m["key"] for m in found.structured_content["memories"]), pids

    try:
        # Both clients spawn their server at the same moment, as two editors opening at once.
        (alpha, alpha_saw), (beta, beta_saw) = await asyncio.gather(client("alpha", "notes", "one.err"),
                                                                    client("beta", None, "two.err"))
        assert alpha == ["alpha 0", "alpha 1", "alpha 2"] and beta == ["beta 0", "beta 1", "beta 2"]
        assert alpha_saw == beta_saw and len(alpha_saw) == 1  # one serve for both
        [pid] = alpha_saw
        said = [line for name in ("one.err", "two.err") for line in (tmp_path / name).read_text().splitlines()
                if "started one" in line]
        assert len(said) == 1 and f"pid {pid}" in said[0] and str(home / SERVE_LOG) in said[0]
        # Detached: its own session, still serving after both MCP servers have gone.
        assert os.getsid(pid) == pid and serve_pids(home) == [pid]
        assert read_info(home)["pid"] == pid
        with remote(home) as still_serving:
            assert len(still_serving.run("recall", {"agent": "beta", "query": "note"}).data["memories"]) == 3
        assert (home / SPAWN_LOCK).exists() and "ready" in (home / SERVE_LOG).read_text()
    finally:
        stop_detached(home)
    assert serve_pids(home) == [] and not (home / SERVE_JSON).exists()


@pytest.mark.slow
def test_a_serve_that_cannot_start_is_reported_with_its_log(tmp_path, capsys):
    home = make_home(tmp_path / "node")
    home.chmod(0o770)  # serve refuses a home its group may write
    try:
        with pytest.raises(ServeStartError) as err:
            ensure_serve(home, timeout=30)
    finally:
        home.chmod(0o700)
        stop_detached(home)
    message = str(err.value)
    assert "exited with code 1 before answering" in message and "writable by its group" in message
    assert message.endswith(f"its log: {home / SERVE_LOG}")
    assert "started one" in capsys.readouterr().err
    assert serve_pids(home) == [] and read_info(home) is None


@pytest.mark.slow
async def test_the_streamable_http_transport_serves_the_same_tools_on_loopback(served, tmp_path):
    log = open(tmp_path / "http.err", "w")  # noqa: SIM115 (the MCP process writes it; closed at the end)
    proc = subprocess.Popen([*CLI, "--home", str(served.home), "mcp", "--agent", "alpha", "--http",
                             "--listen", "127.0.0.1:0"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=log)
    try:
        def url() -> str | None:
            assert proc.poll() is None, (tmp_path / "http.err").read_text()
            lines = [x for x in (tmp_path / "http.err").read_text().splitlines() if "Streamable HTTP" in x]
            return lines[0].split(" at ", 1)[1].split()[0] if lines else None
        address = until(url, 30, "memmesh mcp --http to listen")
        assert address.startswith("http://127.0.0.1:") and address.endswith("/mcp")
        async with Client(authorized(address, served.home)) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["recall"].input_schema == TOOLS["recall"].args.model_json_schema()
            done = await client.call_tool("remember", {"key": "http key", "value": "over streamable http"})
            assert not done.is_error
            refused = await client.call_tool("remember", {"key": "k"})
            assert refused.is_error and text(refused) == "remember needs value"
            [content] = (await client.read_resource(memory_uri("alpha", "http key"))).contents
            assert json.loads(content.text)["value"] == "over streamable http"
            for bad in (client.get_prompt("nope", {}), client.call_tool("nope", {}),
                        client.read_resource(memory_uri("alpha", "no such key"))):
                with pytest.raises(MCPError) as err:
                    await bad
                assert err.value.error.code == INVALID_PARAMS and "\n" not in str(err.value)
        async with Client(authorized(address, served.home), mode="legacy") as legacy:  # the handshake protocol
            with pytest.raises(MCPError) as err:
                await legacy.get_prompt("nope", {})
            assert err.value.error.code == INVALID_PARAMS
            assert json.loads((await legacy.read_resource(BANKS_URI)).contents[0].text)["banks"][0]["name"] == "alpha"
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
    assert proc.stdout.read() == b""  # stdout stays the protocol's, even over HTTP
    assert "Traceback" not in (tmp_path / "http.err").read_text()
    assert served.run("recall", {"agent": "alpha", "query": "streamable"}).data["memories"][0]["key"] == "http key"
