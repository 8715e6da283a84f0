"""memory.get (node/commands/memory_get.py): the current memory of exactly one key, read through
the view's per-key index, refused exactly where recall would not show it; and memory.entities
counting only what recall shows (a key retired by its valid_to is not counted).

Real nodes, real SQLite, the real HTTP API on loopback and the real CLI process.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from memmesh.auth.errors import AuthError, MemmeshError
from memmesh.node import Node
from memmesh.node.memory.forgetting import UnknownMemory
from memmesh.node.settings import ToolNotAllowed
from tests.homes import agent_with_bank, api_on
from tests.procs import CLI

PAST = "2001-01-01T00:00:00Z"
CRAMMED = 230  # memories whose words outrank the one read: more than recall's 100 best, twice over


def get(node: Node, key: str, **more: Any) -> dict[str, Any]:
    return node.run("memory.get", {"agent": "alpha", "key": key, **more}).data


def remember(node: Node, key: str, value: str, **more: Any) -> dict[str, Any]:
    return node.run("remember", {"agent": "alpha", "key": key, "value": value, **more}).data


def recalled(node: Node, query: str = "", **more: Any) -> list[dict[str, Any]]:
    return node.run("recall", {"agent": "alpha", "query": query, "limit": 100, "no_count": True, **more}).data["memories"]


def missing(node: Node, key: str, **more: Any) -> str:
    with pytest.raises(UnknownMemory) as err:
        get(node, key, **more)
    line = str(err.value)
    assert line.startswith(f"no memory {key!r} in ") and "\n" not in line
    return line


@pytest.fixture
def node(node: Node) -> Node:
    """conftest's alpha node, plus beta and bank notes that alpha writes and beta cannot read."""
    node.run("agent.new", {"name": "beta"})
    node.run("memory.new", {"name": "notes", "description": "team notes"})
    node.run("memory.grant", {"bank": "notes", "agent": "alpha", "perm": "write"})
    return node


# ---------------------------------------------------------------------------- what it reads
def test_it_reads_exactly_the_key_in_a_bank_where_recall_cannot_find_it(node):
    # Written first (so not among the newest), with a key whose words a crowd of memories repeats
    # more often: recall with the key as the query, or with no query, does not reach it.
    remember(node, "deploy steps", "zebra", bank="notes")
    for i in range(CRAMMED):
        remember(node, f"other {i:03d}", f"deploy steps deploy steps deploy steps, variant {i}", bank="notes")
    assert "deploy steps" not in [m["key"] for m in recalled(node, "deploy steps", bank="notes")]
    assert "deploy steps" not in [m["key"] for m in recalled(node, bank="notes")]
    m = get(node, "deploy steps", bank="notes")
    assert (m["key"], m["value"], m["bank"], m["trust"]) == ("deploy steps", "zebra", "notes", "owner")
    assert get(node, "other 007", bank="notes")["value"] == "deploy steps deploy steps deploy steps, variant 7"


def test_the_answer_is_recalls_element_for_that_memory(node):
    remember(node, "editor", "alpha uses helix", tags=["prefs"], category="preference", confidence=8,
             entities=["Helix"], valid_from="2020-01-01T00:00:00Z")
    remember(node, "editor", "alpha uses helix, and vim on servers", tags=["prefs"], category="preference")
    [shown] = [m for m in recalled(node, "helix") if m["key"] == "editor"]
    assert get(node, "editor") == shown
    assert get(node, "editor", bank="alpha") == shown  # its own database, by name


def test_it_is_not_counted_as_a_recall(node):
    remember(node, "k", "some value")
    get(node, "k")
    get(node, "k")
    assert get(node, "k")["recalls"] == 0
    node.call_tool("alpha", "recall", {"query": "value"})  # the agent's tool counts
    assert get(node, "k")["recalls"] == 1


# ---------------------------------------------------------------------------- what it refuses
def test_a_bank_the_agent_cannot_read_is_refused_as_recall_refuses_it(node):
    remember(node, "k", "in notes", bank="notes")
    with pytest.raises(AuthError) as by_recall:
        node.run("recall", {"agent": "beta", "query": "k", "bank": "notes"})
    with pytest.raises(AuthError) as by_get:
        node.run("memory.get", {"agent": "beta", "key": "k", "bank": "notes"})
    assert str(by_get.value) == str(by_recall.value)
    assert "may not read from bank notes" in str(by_get.value)
    node.run("memory.grant", {"bank": "notes", "agent": "beta", "perm": "read"})
    assert node.run("memory.get", {"agent": "beta", "key": "k", "bank": "notes"}).data["value"] == "in notes"


def test_a_key_never_written_is_not_found_and_an_unknown_bank_named(node):
    assert "in alpha" in missing(node, "nothing here")
    with pytest.raises(MemmeshError) as err:
        get(node, "k", bank="no-such-bank")
    assert "no-such-bank" in str(err.value)


def test_not_found_after_forget(node):
    remember(node, "k", "forget me")
    remember(node, "k", "forget me, second version")
    node.call_tool("alpha", "forget", {"key": "k"})
    missing(node, "k")


def test_not_found_after_retire_by_valid_to_or_supersedes(node):
    remember(node, "old", "was true")
    remember(node, "old", "was true", valid_to=PAST, on_duplicate="create")
    assert recalled(node, "true") == []
    missing(node, "old")
    remember(node, "older", "replaced soon")
    remember(node, "newer", "replaces it", supersedes=["older"])
    missing(node, "older")
    assert get(node, "newer")["supersedes"][0]["key"] == "older"
    # a valid_to still ahead retires nothing yet
    remember(node, "until", "holds a while", valid_to="2999-01-01T00:00:00Z")
    assert get(node, "until")["valid_to"] == "2999-01-01T00:00:00.000Z"


def test_a_secret_is_withheld_unless_the_agents_config_includes_secrets(node):
    remember(node, "aws", 'aws_secret_access_key = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY12"')
    assert recalled(node, "aws") == []
    missing(node, "aws")
    node.run("memory.config", {"agent": "alpha", "action": "set", "key": "include_secrets", "value": True})
    m = get(node, "aws")
    assert m["secret"] and m == [r for r in recalled(node, "aws") if r["key"] == "aws"][0]


def test_a_quarantined_authors_memory_is_not_found_until_released(node):
    remember(node, "k", "written by alpha", bank="notes")
    q = node.run("memory.quarantine", {"bank": "notes", "who": "alpha"}).data
    missing(node, "k", bank="notes")
    node.run("memory.release", {"bank": "notes", "quarantine": q["id"]})
    assert get(node, "k", bank="notes")["value"] == "written by alpha"


def test_an_agent_whose_allowed_tools_exclude_recall_reads_nothing(node):
    remember(node, "k", "v")
    (node.home / "config.yaml").write_text("agents:\n  - name: alpha\n    allowed_tools: [remember]\n")
    node.run("reload", {})
    with pytest.raises(ToolNotAllowed):
        get(node, "k")


@pytest.mark.parametrize("bad", [{"key": ""}, {"key": "x" * 513}, {"key": 7}, {}, {"key": "k", "bank": ""},
                                 {"key": "k", "extra": 1}])
def test_bad_parameters_get_one_line(node, bad):
    with pytest.raises(MemmeshError) as err:
        node.run("memory.get", {"agent": "alpha", **bad})
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------- transports
async def test_through_the_http_api(node):
    remember(node, "deploy", "nix build")
    async with api_on(node) as (server, token, session):
        url = f"http://{server.host}:{server.port}/v1/memory/get"
        headers = {"Authorization": f"Bearer {token}"}
        async with session.post(url, json={"agent": "alpha", "key": "deploy"}, headers=headers) as resp:
            assert resp.status == 200
            assert (await resp.json())["data"]["value"] == "nix build"
        async with session.post(url, json={"agent": "alpha", "key": "nope"}, headers=headers) as resp:
            assert resp.status == 404
            error = (await resp.json())["error"]
            assert error["code"] == "not_found" and error["message"].startswith("no memory 'nope' in alpha")
        async with session.post(url, json={"agent": "beta", "key": "deploy", "bank": "notes"},
                                headers=headers) as resp:
            assert resp.status == 403 and (await resp.json())["error"]["code"] == "forbidden"
        async with session.post(url, json={"agent": "alpha", "key": ""}, headers=headers) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_params"


def test_through_the_cli(home: Path):
    with Node.open(home) as node:
        agent_with_bank(node.run)
        node.run("remember", {"agent": "alpha", "key": "a/b c", "value": "odd key", "bank": "notes"})

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, "--home", str(home), *args], capture_output=True, text=True, timeout=120)

    out = cli("memory", "get", "alpha", "a/b c", "--bank", "notes", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["value"] == "odd key"
    out = cli("memory", "get", "alpha", "a/b c", "--bank", "notes")
    assert out.returncode == 0 and out.stdout.startswith("a/b c: odd key"), out.stderr
    out = cli("memory", "get", "alpha", "gone")
    assert out.returncode != 0 and out.stdout == ""
    assert out.stderr.strip().startswith("memmesh: error: no memory 'gone' in alpha")
    assert len(out.stderr.strip().splitlines()) == 1


def test_through_a_chat_line_for_the_calling_agent(node):
    remember(node, "k", "from chat")
    out = node.run("command", {"agent": "alpha", "line": "/memory get k"})
    assert "k: from chat" in out.text


# ---------------------------------------------------------------------------- memory.entities
def entities(node: Node, bank: str = "alpha") -> dict[str, int]:
    return {e["entity"]: e["count"] for e in node.run("memory.entities", {"bank": bank}).data["entities"]}


def test_entities_count_only_what_recall_shows_after_a_retire(node):
    remember(node, "k", "about two people", entities=["Alice", "Bob"])
    remember(node, "j", "about one", entities=["Alice"])
    assert entities(node) == {"Alice": 2, "Bob": 1}
    # A newer row of the key whose valid_to has passed retires it (merging the old row's entities).
    remember(node, "k", "about two people", entities=["Alice"], valid_to=PAST, on_duplicate="create")
    assert [m["key"] for m in recalled(node)] == ["j"]
    assert entities(node) == {"Alice": 1}
    remember(node, "j", "about one", valid_to=PAST, on_duplicate="create")
    assert entities(node) == {}
    # Written again without an end: counted again.
    remember(node, "k", "back again", entities=["Bob"])
    assert entities(node) == {"Bob": 1}


# ---------------------------------------------------------------------------- its users
@pytest.mark.slow
async def test_mcp_resources_and_the_langgraph_store_read_a_buried_key_through_serve(tmp_path: Path):
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    from memmesh.integrations.langgraph import MemmeshStore
    from memmesh.node.mcp_server import build_server, memory_uri
    from tests.procs import Serve
    from tests.test_mcp import make_home

    home = make_home(tmp_path / "node")
    with MemmeshStore(home, agent="alpha", bank="notes") as store:  # the home opened in this process
        store.put(("docs",), "deploy steps", {"text": "zebra"})
    with Node.open(home) as node:
        remember(node, "deploy steps", "zebra", bank="notes")
        remember(node, "docs/plain", '{"text": "not an item"}', bank="notes")  # no langgraph tag
        remember(node, "gone", "retired at once", bank="notes", valid_to=PAST)
        for i in range(CRAMMED):
            remember(node, f"other {i:03d}", f"deploy steps docs deploy steps docs, variant {i}", bank="notes")
    serve = Serve(home).start()
    try:
        serve.wait_ready()
        async with Client(build_server(home, "alpha"), mode="auto") as client:
            read = await client.read_resource(memory_uri("notes", "deploy steps"))
            assert json.loads(read.contents[0].text)["value"] == "zebra"
            with pytest.raises(MCPError) as err:
                await client.read_resource(memory_uri("notes", "gone"))
            assert "no current memory 'gone' in bank notes" in err.value.error.message
        with MemmeshStore(home, agent="alpha", bank="notes") as store:
            assert store.client.through_serve
            item = store.get(("docs",), "deploy steps")
            assert item is not None and item.value == {"text": "zebra"}
            assert store.get(("docs",), "plain") is None  # a memory of the bank, not an item of the store
            assert store.list_namespaces() == [("docs",)]
            store.delete(("docs",), "deploy steps")
            assert store.get(("docs",), "deploy steps") is None and store.list_namespaces() == []
    finally:
        serve.stop()
