"""``memmesh.node.connect``: the library through a running serve, or the home opened here."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from memmesh.node import Client, Node, connect
from memmesh.node.control import lock_holder
from memmesh.node.home import HomeBusy, NotInitialised
from tests.procs import processes, until


def _values(client: Client, query: str) -> set[str]:
    return {m["value"] for m in client.call_tool("alpha", "recall", {"query": query})["memories"]}


def test_without_serve_the_home_is_opened_here_and_held_until_close(home: Path):
    with connect(home) as client:
        assert not client.through_serve
        assert lock_holder(home) is not None  # this process holds the home while connected
        client.run("agent.new", {"name": "alpha"})
        client.call_tool("alpha", "remember", {"key": "deploy", "value": "nix build then scp to prod"})
        assert _values(client, "deploy") == {"nix build then scp to prod"}
        client.history_add("alpha", "s1", "user", "hello there")
        assert "hello there" in client.history_window("alpha", "s1", 1000)
        assert "nix build" in client.auto_recall("alpha", ["how do we deploy?"])
    assert lock_holder(home) is None
    with pytest.raises(ValueError, match="closed"):
        client.run("status", {})
    with Node.open(home, lock_timeout=1) as node:  # the same data, opened the old way
        assert {m["value"] for m in node.call_tool("alpha", "recall", {"query": "deploy"})["memories"]} == {
            "nix build then scp to prod"}


def test_a_home_without_a_node_is_refused_in_one_line(tmp_path: Path):
    with pytest.raises(NotInitialised, match="memmesh --home .* init"):
        connect(tmp_path / "nothing-here")


def test_with_serve_running_calls_go_through_it(home: Path):
    with processes() as procs:
        serve = procs.serve(home).start().wait_ready()
        serve.run("agent.new", {"name": "alpha"})
        serve.run("remember", {"agent": "alpha", "key": "deploy", "value": "serve wrote this"})
        with pytest.raises(HomeBusy):  # what the old example met: serve holds the home
            Node.open(home, lock_timeout=0.2)
        # A short timeout: connect never waits for the lock serve holds, it goes through serve.
        with connect(home, timeout=0.5) as client:
            assert client.through_serve
            assert _values(client, "deploy") == {"serve wrote this"}
            client.call_tool("alpha", "remember", {"key": "ci", "value": "the library wrote this through serve"})
            seen = serve.run("recall", {"agent": "alpha", "query": "library"}).data["memories"]
            assert [m["value"] for m in seen] == ["the library wrote this through serve"]
            assert client.run("status", {}).data["node"]["key"] == serve.node_key

            # Shared by threads: every call is answered, none is lost.
            errors: list[BaseException] = []

            def write(i: int) -> None:
                try:
                    client.call_tool("alpha", "remember", {"key": f"t{i}", "value": f"thread number {i} wrote"})
                except BaseException as exc:  # reported by the assert below
                    errors.append(exc)

            threads = [threading.Thread(target=write, args=(i,)) for i in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            found = client.run("recall", {"agent": "alpha", "query": "", "limit": 20}).data["memories"]
            assert {m["key"] for m in found} >= {f"t{i}" for i in range(6)}

            # serve stops: the next call opens the home here, with everything serve wrote.
            assert serve.stop() == 0
            assert _values(client, "library") == {"the library wrote this through serve"}
            assert not client.through_serve
        until(lambda: lock_holder(home) is None, 10, "the home to be free after close")
        serve.start().wait_ready()  # and serve starts again once the client let the home go
        assert serve.run("recall", {"agent": "alpha", "query": "deploy"}).data["memories"]
