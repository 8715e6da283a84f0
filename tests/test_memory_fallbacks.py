"""Every fallback of docs/memory.md ("Fallbacks"), through the node, against a real local embeddings server."""
from __future__ import annotations

import pytest

from memmesh.node import Node
from memmesh.node.memory.embedders import EmbedderConfig
from tests.embed_server import EmbedServer
from tests.procs import until


@pytest.fixture
def server():
    with EmbedServer(dim=8) as srv:
        yield srv


@pytest.fixture
def node(tmp_path):
    n = Node.open(tmp_path / "home")
    n.agents.create_agent("alpha")
    yield n
    n.close()


def use(node: Node, server: EmbedServer, mode: str, timeout_s: float = 5.0) -> None:
    node.set_embedder_config(EmbedderConfig("openai", model="test-embed", api_base=server.url(mode),
                                            timeout_s=timeout_s, dim=8))


def remember(node, key, value):
    return node.call_tool("alpha", "remember", {"key": key, "value": value})


def recall(node, query):
    return node.call_tool("alpha", "recall", {"query": query})


def test_no_embedder_configured_ranks_by_bm25(node):
    node.set_embedder_config(EmbedderConfig("none"))
    r = remember(node, "deploy", "nix build")
    assert r["embedded"] is False and r["warnings"] == []
    out = recall(node, "deploy")
    assert [m["value"] for m in out["memories"]] == ["nix build"] and out["warnings"] == []


def test_embedder_configured_but_no_vectors_yet(node, server):
    node.set_embedder_config(EmbedderConfig("none"))
    remember(node, "deploy", "nix build")
    use(node, server, "ok")
    before = len(server.requests)
    out = recall(node, "deploy")
    assert [m["value"] for m in out["memories"]] == ["nix build"] and out["warnings"] == []
    assert len(server.requests) == before  # no vectors: the query is not even embedded


def test_vectors_written_in_the_same_entry_when_the_server_works(node, server):
    use(node, server, "ok")
    r = remember(node, "deploy", "nix build")
    assert r["embedded"] is True
    entry = node.agents.agent("alpha").db.entry(r["entry"])
    assert set(entry.stores) == {"memory", "embeddings:openai/test-embed"}
    assert server.requests[-1].body["input"] == ["deploy nix build"]


def test_embedder_failing_on_write_stores_without_vector_and_warns(node, server):
    use(node, server, "status500")
    r = remember(node, "deploy", "nix build")
    assert r["ok"] and r["embedded"] is False
    assert r["warnings"] and "stored without a vector" in r["warnings"][0]
    entry = node.agents.agent("alpha").db.entry(r["entry"])
    assert set(entry.stores) == {"memory"}
    node.set_embedder_config(EmbedderConfig("none"))
    assert [m["value"] for m in recall(node, "deploy")["memories"]] == ["nix build"]


def test_embedder_failing_on_read_falls_back_to_bm25_and_warns(node, server):
    use(node, server, "ok")
    remember(node, "deploy", "nix build")
    remember(node, "lunch", "noodles")
    use(node, server, "malformed")
    out = recall(node, "deploy")
    assert [m["value"] for m in out["memories"]] == ["nix build"]
    assert out["warnings"] and "BM25 only" in out["warnings"][0]


def test_hanging_embedder_is_bounded(node, server):
    # The server takes each request and never answers (it gives up with a 503 after 120 s): the
    # node's own 1 s deadline is what ends the wait, on read and on write, and each falls back.
    use(node, server, "ok")
    remember(node, "deploy", "nix build")
    use(node, server, "hang", timeout_s=1.0)
    out = recall(node, "deploy")
    assert [m["value"] for m in out["memories"]] == ["nix build"]
    [warning] = out["warnings"]
    assert "no complete reply from" in warning and "within 1 s" in warning and "BM25 only" in warning, warning
    r = remember(node, "more", "text")
    assert r["ok"] and r["embedded"] is False
    [warning] = r["warnings"]
    assert "no complete reply from" in warning and "within 1 s" in warning and "stored without a vector" in warning
    # Each asked once, nothing retried (the server records a request as it reads it, on its own
    # thread: a loaded machine may get there after the client gave up).
    until(lambda: [q.mode for q in server.requests] == ["ok", "hang", "hang"], 60,
          lambda: f"ok, hang, hang; got {[q.mode for q in server.requests]}")


def test_empty_query_and_nothing_matched(node, server):
    use(node, server, "ok")
    remember(node, "first", "one")
    remember(node, "second", "two")
    assert [m["value"] for m in recall(node, "")["memories"]] == ["two", "one"]
    # With vectors any positive cosine is a (semantic) match, so "nothing matched" is the
    # lexical case: no token of the query in any memory, and no embedder.
    node.set_embedder_config(EmbedderConfig("none"))
    out = recall(node, "zebra quantum")
    assert out["memories"] == [] and out["message"].startswith("No memories found")
