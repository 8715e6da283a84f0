"""memmesh mcp's resources (the agent's banks, each memory as memory://BANK/KEY) and its answers
to bad requests, driven by the MCP SDK's own clients in both protocol modes: the initialize
handshake ("legacy") and the 2026-07-28 protocol the client negotiates by default ("auto").

In-process sessions against the server built on a real home whose real `memmesh serve` answers
every read with the agent's key; a real stdio `memmesh mcp` process spoken to in raw JSON-RPC
for requests the SDK's typed client cannot send.
"""
from __future__ import annotations

import contextlib
import json
import logging
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS
from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS

from memmesh.node.mcp_server import (
    BANKS_URI,
    MEMORY_TEMPLATE,
    PAGE_SIZE,
    PROMPT,
    NoSuchResource,
    build_server,
    memory_uri,
    not_found,
    parse_memory_uri,
)
from tests.procs import CLI, Serve
from tests.test_mcp import CONFIG, make_home, mcp_params

MODES = ["legacy", "auto"]
# What a resource that does not exist gets: -32002 in the handshake's revisions (MCP 2025-11-25),
# -32602 from 2026-07-28 on (SEP-2164), the revision "auto" negotiates.
NOT_FOUND = {"legacy": -32002, "auto": INVALID_PARAMS}
# Keys with every kind of character a URI reserves or cannot hold as is.
ODD_KEYS = ["a/b/c", "100%", "%2F stays literal", "ünïcødé key", "?q=1&r=2#frag", "..", "/abs/path", " spaced ",
            "emoji 🧠", "tab\there", "plus+and space", "memory://nested/uri", "'quoted' \"both\""]
BIG = 101  # memories in bank "big": one more than a page holds


def seed(serve: Serve) -> Serve:
    """alpha: three memories of its own; notes (alpha writes, beta nothing): the odd keys; big
    (alpha reads): BIG memories, oldest first."""
    for i in range(3):
        serve.run("remember", {"agent": "alpha", "key": f"own {i}", "value": f"alpha's own memory {i}"})
    for i, key in enumerate(ODD_KEYS):
        serve.run("remember", {"agent": "alpha", "key": key, "value": f"odd value {i}", "bank": "notes"})
    serve.run("memory.new", {"name": "big", "description": "more than a page"})
    serve.run("memory.grant", {"bank": "big", "agent": "alpha", "perm": "write"})
    for i in range(BIG):
        serve.run("remember", {"agent": "alpha", "key": f"big {i:03d}", "value": f"big value {i}", "bank": "big"})
    serve.run("memory.grant", {"bank": "big", "agent": "alpha", "perm": "read"})
    return serve


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Any:
    home = make_home(tmp_path_factory.mktemp("mcpres") / "node")
    serve = Serve(home).start()
    try:
        yield seed(serve.wait_ready())
    finally:
        serve.stop()


async def drain(client: Client) -> list[Any]:
    """Every page of resources/list, as the SDK's docs loop over them."""
    pages, cursor = [], None
    while True:
        page = await client.list_resources(cursor=cursor)
        pages.append(page)
        if page.next_cursor is None:
            return pages
        cursor = page.next_cursor


async def refused(coro: Any) -> Any:
    with pytest.raises(MCPError) as err:
        await coro
    return err.value.error


def no_noise(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing the server logged at warning or above, and no traceback at any level."""
    assert [(r.name, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info] == []


# ---------------------------------------------------------------------- URIs
def test_memory_uris_percent_encode_every_reserved_character_and_round_trip():
    for key in [*ODD_KEYS, "k", "x" * 512, "\x00nul", "%", "%%25"]:
        uri = memory_uri("notes", key)
        assert uri.startswith("memory://notes/") and "/" not in uri.removeprefix("memory://notes/")
        assert all(c.isascii() and c.isprintable() and c not in " ?#" for c in uri), uri
        assert parse_memory_uri(uri) == ("notes", key)
    assert memory_uri("notes", "a/b c%") == "memory://notes/a%2Fb%20c%25"
    # A client that sends a part unencoded is understood where that is unambiguous.
    assert parse_memory_uri("memory://notes/a b/c") == ("notes", "a b/c")


@pytest.mark.parametrize("uri", ["memory://notes", "memory://notes/", "memory:///key", "file:///etc/passwd",
                                 "MEMORY://notes/k", "memory://notes/%ff%fe", ""])
def test_what_is_not_a_memory_uri_is_no_resource_with_the_code_of_each_protocol(uri):
    with pytest.raises(NoSuchResource) as err:
        parse_memory_uri(uri)
    for version, code in [("2025-11-25", -32002), ("2025-06-18", -32002), ("2026-07-28", INVALID_PARAMS)]:
        error = not_found(err.value, uri, version).error
        assert (error.code, error.data) == (code, {"uri": uri})
        assert error.message == str(err.value) and "\n" not in error.message


# ---------------------------------------------------------------------- listing and reading
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
async def test_resources_list_pages_by_bank_newest_first_and_every_uri_reads_back(served, mode, caplog):
    async with Client(build_server(served.home, "alpha"), mode=mode) as client:
        pages = await drain(client)
        first = pages[0].resources
        assert first[0].uri == BANKS_URI and first[0].mime_type == "application/json"
        # page 1: the banks and alpha's own memories, newest first; then each bank's pages in turn
        assert [r.name for r in first[1:]] == ["own 2", "own 1", "own 0"]
        by_page = [{parse_memory_uri(r.uri)[0] for r in p.resources if r.uri != BANKS_URI} for p in pages]
        banks = [b["name"] for b in json.loads((await client.read_resource(BANKS_URI)).contents[0].text)["banks"]]
        assert [b for b in by_page if b] == [{name} for name in banks for _ in range(2 if name == "big" else 1)]
        assert banks[0] == "alpha" and {"notes", "big"} <= set(banks)
        assert all(len(p.resources) <= PAGE_SIZE + 1 for p in pages)

        big_pages = [p.resources for p in pages if p.resources and p.resources[0].uri.startswith("memory://big/")]
        assert [len(p) for p in big_pages] == [PAGE_SIZE, BIG - PAGE_SIZE] and PAGE_SIZE == 100
        big = [r for p in big_pages for r in p]
        assert [r.name for r in big] == [f"big {i:03d}" for i in range(BIG - 1, -1, -1)]  # each once, newest first
        times = [r.annotations.last_modified for r in big]
        assert times == sorted(times, reverse=True)
        oldest = json.loads((await client.read_resource(memory_uri("big", "big 000"))).contents[0].text)
        assert (oldest["key"], oldest["value"], oldest["bank"]) == ("big 000", "big value 0", "big")

        notes = {r.name: r for p in pages for r in p.resources if r.uri.startswith("memory://notes/")}
        assert sorted(notes) == sorted(ODD_KEYS)
        for key, resource in notes.items():
            assert resource.uri == memory_uri("notes", key)
            [content] = (await client.read_resource(resource.uri)).contents
            memory = json.loads(content.text)
            assert content.uri == resource.uri and content.mime_type == "application/json"
            assert memory["key"] == key and memory["bank"] == "notes" and memory["value"].startswith("odd value")
            assert memory["written_by"].startswith("ed25519:") and memory["entry"].startswith("sha256:")
            assert resource.description == memory["value"]

        [template] = (await client.list_resource_templates()).resource_templates
        assert template.uri_template == MEMORY_TEMPLATE == "memory://{bank}/{key}"
    no_noise(caplog)


@pytest.mark.slow
async def test_the_banks_resource_is_the_list_memory_banks_answer(served):
    async with Client(build_server(served.home, "alpha")) as client:
        [content] = (await client.read_resource(BANKS_URI)).contents
        tool = await client.call_tool("list_memory_banks", {})
    assert json.loads(content.text) == tool.structured_content
    assert content.uri == BANKS_URI and content.mime_type == "application/json"


@pytest.mark.slow
async def test_listing_and_reading_are_not_counted_as_recalls(served):
    before = served.run("recall", {"agent": "alpha", "query": "", "no_count": True}).data["memories"]
    async with Client(build_server(served.home, "alpha")) as client:
        await drain(client)
        for m in before:
            await client.read_resource(memory_uri("alpha", m["key"]))
    after = served.run("recall", {"agent": "alpha", "query": "", "no_count": True}).data["memories"]
    assert [(m["key"], m["access_count"]) for m in after] == [(m["key"], m["access_count"]) for m in before]


# ---------------------------------------------------------------------- who may read what
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
async def test_a_bank_the_agent_cannot_read_is_refused_and_nothing_of_it_leaks(served, mode, caplog):
    async with Client(build_server(served.home, "beta"), mode=mode) as client:
        pages = await drain(client)
        listed = [r.uri for p in pages for r in p.resources]
        assert listed == [BANKS_URI]  # beta reads only its own database, which is empty
        for uri in (memory_uri("notes", "a/b/c"), memory_uri("alpha", "own 1"), memory_uri("big", "big 000")):
            error = await refused(client.read_resource(uri))
            assert error.code == INVALID_PARAMS and error.data == {"uri": uri}
            assert error.message.startswith("agent beta may not read from bank ") and "\n" not in error.message
            assert "value" not in error.message and "odd" not in error.message  # nothing of the memory
    no_noise(caplog)


@pytest.mark.slow
async def test_the_resources_follow_the_tools_config_allows(tmp_path):
    home = make_home(tmp_path / "node")
    (home / "config.yaml").write_text(CONFIG + "agents:\n  - name: alpha\n    allowed_tools: [remember]\n")
    serve = Serve(home).start()
    try:
        serve.wait_ready()
        serve.run("remember", {"agent": "alpha", "key": "k", "value": "v"})
        # a client built as `memmesh mcp` builds it (prepare): the resources of the tools it may use
        async with Client(build_server(home, "alpha", ["remember"])) as client:
            assert (await client.list_resources()).resources == []
            assert (await client.list_resource_templates()).resource_templates == []
            # serve checks every read again, with the registry's line
            error = await refused(client.read_resource(memory_uri("alpha", "k")))
            assert error.code == INVALID_PARAMS and "may not use recall" in error.message
            error = await refused(client.read_resource(BANKS_URI))
            assert "may not use list_memory_banks" in error.message
    finally:
        serve.stop()


# ---------------------------------------------------------------------- bad requests
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
async def test_unknown_names_and_uris_are_32602_with_one_line(served, mode, caplog):
    async with Client(build_server(served.home, "alpha"), mode=mode) as client:
        error = await refused(client.get_prompt("nope", {}))
        assert (error.code, error.message) == (INVALID_PARAMS, "unknown prompt 'nope'; this server has relevant_memories")
        error = await refused(client.call_tool("nope", {}))
        assert error.code == INVALID_PARAMS and error.message.startswith("unknown tool 'nope'; this server has remember")
        error = await refused(client.get_prompt("x" * 10_000, {}))
        assert error.code == INVALID_PARAMS and len(error.message) < 200
        error = await refused(client.get_prompt(PROMPT, {"messages": "hi", "colour": "red"}))
        assert error.code == INVALID_PARAMS and error.message.startswith(f"{PROMPT} does not take colour")

        for uri, says in [(memory_uri("notes", "no such key"), "no current memory 'no such key' in bank notes"),
                          (memory_uri("no-such-bank", "k"), "no bank 'no-such-bank'"),
                          ("file:///etc/passwd", "no resource 'file:///etc/passwd'"),
                          ("memory://notes/%ff", "percent-encoded bytes are not UTF-8")]:
            error = await refused(client.read_resource(uri))
            assert error.code == (INVALID_PARAMS if uri.startswith("memory://no-such-bank") else NOT_FOUND[mode])
            assert error.data == {"uri": uri} and says in error.message and "\n" not in error.message
    no_noise(caplog)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
async def test_a_cursor_this_server_did_not_give_is_32602(served, mode, caplog):
    async with Client(build_server(served.home, "alpha"), mode=mode) as client:
        good = (await client.list_resources()).next_cursor
        assert good is not None
        async with Client(build_server(served.home, "alpha"), mode=mode) as other:
            from_another = (await other.list_resources()).next_cursor
        forged = good[:5] + ("B" if good[5] == "A" else "A") + good[6:]  # a bit of its signature changed
        for cursor in ["garbage!", "", "x" * 5000, "é", forged, from_another, "AAAA" * 8]:
            error = await refused(client.list_resources(cursor=cursor))
            assert error.code == INVALID_PARAMS, cursor
            assert error.message.startswith("resources/list: the cursor is not one this server gave")
        for lister in (client.list_resource_templates, client.list_tools, client.list_prompts):
            error = await refused(lister(cursor=good))
            assert error.code == INVALID_PARAMS and error.message.endswith("the list has one page and takes no cursor")
        assert (await client.list_resources(cursor=good)).resources  # the real one still works
    no_noise(caplog)


@contextlib.asynccontextmanager
async def raw_stdio(home: Path, errlog: Path) -> AsyncIterator[Any]:
    """A `memmesh mcp` process spoken to in raw JSON-RPC lines, after the initialize handshake."""
    with open(errlog, "w") as err:
        proc = subprocess.Popen([*CLI, "--home", str(home), "mcp", "--agent", "alpha"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, text=True)
        ids = iter(range(1, 1_000_000))

        def rpc(method: str, params: Any) -> dict[str, Any]:
            message = {"jsonrpc": "2.0", "id": next(ids), "method": method, "params": params}
            proc.stdin.write(json.dumps(message) + "\n")
            proc.stdin.flush()
            return json.loads(proc.stdout.readline())

        try:
            rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                               "clientInfo": {"name": "raw", "version": "0"}})
            proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
            yield rpc
        finally:
            proc.stdin.close()
            proc.wait(20)


@pytest.mark.slow
async def test_malformed_params_are_32602_naming_the_field_and_nothing_reaches_stderr(served, tmp_path):
    async with raw_stdio(served.home, tmp_path / "mcp.err") as rpc:
        for method, params, message in [
            ("prompts/get", {"name": "nope"}, "unknown prompt 'nope'; this server has relevant_memories"),
            ("prompts/get", {"name": PROMPT, "arguments": {"messages": 5}},
             "prompts/get: arguments.messages: Input should be a valid string"),
            ("prompts/get", {"name": PROMPT, "arguments": "x"}, "prompts/get: arguments: Input should be a valid dictionary"),
            ("prompts/get", {}, "prompts/get: name: Field required"),
            ("tools/call", {"name": "nope"}, "unknown tool 'nope'; this server has remember, recall, "
                                             "list_memory_banks, neighbors, forget"),
            ("tools/call", {"name": "recall", "arguments": [1]}, "tools/call: arguments: Input should be a valid dictionary"),
            ("resources/read", {}, "resources/read: uri: Field required"),
            ("resources/read", {"uri": 5}, "resources/read: uri: Input should be a valid string"),
            ("resources/list", {"cursor": 5}, "resources/list: cursor: Input should be a valid string"),
        ]:
            answer = rpc(method, params)
            assert answer["error"]["code"] == INVALID_PARAMS, answer
            assert answer["error"]["message"] == message
        answer = rpc("resources/read", {"uri": memory_uri("notes", "a/b/c")})
        assert json.loads(answer["result"]["contents"][0]["text"])["key"] == "a/b/c"
    assert (tmp_path / "mcp.err").read_text() == ""


@pytest.mark.slow
async def test_a_stdio_client_of_the_current_protocol_reads_resources_and_gets_32602(served, tmp_path):
    with open(tmp_path / "mcp.err", "w") as err:
        async with Client(stdio_client(mcp_params(served.home), errlog=err)) as client:
            assert client.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS  # 2026-07-28 or later
            [content] = (await client.read_resource(memory_uri("notes", "ünïcødé key"))).contents
            assert json.loads(content.text)["key"] == "ünïcødé key"
            pages = await drain(client)
            assert len(pages) >= 3 and pages[0].resources[0].uri == BANKS_URI
            for coro in (client.get_prompt("nope", {}), client.call_tool("nope", {}),
                         client.read_resource(memory_uri("notes", "no such key")),
                         client.list_resources(cursor="garbage")):
                assert (await refused(coro)).code == INVALID_PARAMS
    assert (tmp_path / "mcp.err").read_text() == ""
