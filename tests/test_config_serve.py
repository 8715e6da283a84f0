"""config.yaml with real `memmesh serve` processes on 127.0.0.1: default_memory_banks written once
over three restarts; SIGHUP and `memmesh reload` adding agents; a malformed edit named by its line
while serve keeps the last good config (and starts with it); sync.peers making two serves sync
after a reload, when the only address they knew of each other had gone stale."""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from memmesh.node import Node
from memmesh.node.library import run_in_home
from memmesh.node.settings import CONFIG_FILE
from tests.procs import Serve, processes, until
from tests.test_cli import mm

pytestmark = pytest.mark.slow

CONFIG = """\
agents:
  - name: alpha
    allowed_tools: [recall, list_memory_banks]
    default_memory_banks: [notes]
"""
BETA = "  - name: beta\n    default_memory_banks: [notes]\n"
GAMMA = "  - name: gamma\n"
REACH_S = 15.0


def _init(home: Path) -> str:
    node, _ = Node.init(home)
    with node:
        node.run("embedder.set", {"provider": "none"})
        return str(node.peer_key.public)


def _entries(serve: Serve) -> dict[str, int]:
    return {d["id"]: d["entries"] for d in serve.run("status", {}).data["databases"]}


def _agents(serve: Serve) -> list[str]:
    return [a["name"] for a in serve.run("agent.list", {}).data["agents"]]


def test_restarts_sighup_reload_and_a_malformed_edit(tmp_path):
    home = tmp_path / "node"
    _init(home)
    config = home / CONFIG_FILE
    config.write_text(CONFIG)
    with processes() as procs:
        s = procs.serve(home)
        counts = []
        for restart in range(3):
            s.start().wait_ready()
            counts.append(_entries(s))
            assert "config.loaded" in s.log()
            if restart < 2:
                assert s.stop() == 0
        assert counts[0] == counts[1] == counts[2], counts
        assert len(counts[0]) == 2  # alpha's database and the bank: created once, never again
        assert "agent alpha created" in s.log(every=True) and "agent alpha created" not in s.log()

        config.write_text(CONFIG + BETA)
        s.proc.send_signal(signal.SIGHUP)
        until(lambda: "beta" in _agents(s), REACH_S, "beta created after SIGHUP")
        until(lambda: "config.reloaded" in s.log(), REACH_S, "config.reloaded in serve's log")
        assert "beta granted write on bank notes" in s.log()

        config.write_text(CONFIG + BETA + GAMMA)
        out = mm("reload", home=home).stdout  # another process: it goes through serve
        assert "agent gamma created" in out and "beta" not in out
        assert _agents(s) == ["alpha", "beta", "gamma"]

        # A malformed edit: named by its line, and serve goes on with the last good config.
        config.write_text(CONFIG + BETA + GAMMA + "    allowed_tools: [remember, obliterate]\n")
        before = _entries(s)
        proc = mm("reload", home=home, check=False)
        assert proc.returncode == 1
        assert proc.stderr == (f"memmesh: error: {config}:8: agents[2].allowed_tools[1]: should be 'remember', "
                               "'recall', 'list_memory_banks', 'neighbors' or 'forget' (got 'obliterate')\n")
        assert f"config.error file={config} line=8 " in s.log()
        refused = mm("tool", "alpha", "remember", '{"key": "k", "value": "v"}', home=home, check=False)
        assert refused.returncode == 1 and "may not use remember" in refused.stderr  # still in force
        s.proc.send_signal(signal.SIGHUP)
        until(lambda: s.log().count("config.error") == 2, REACH_S, "the SIGHUP's config.error")
        assert s.running() and _entries(s) == before

        # Started with the malformed file, serve logs it and runs with the last good config.
        assert s.stop() == 0
        s.start().wait_ready()
        assert f"config.error file={config} line=8 " in s.log()
        assert _entries(s) == before and _agents(s) == ["alpha", "beta", "gamma"]
        assert s.run("config.show", {}).data["agents"][2]["name"] == "gamma"


def _link_errors(serve: Serve, db: str) -> list[Any]:
    return [link["last_error"] for link in serve.run("status", {}).data["sync"]["links"]
            if link["bank"] in (db, "notes") and link["last_error"]]


def test_sync_peers_make_two_serves_sync_after_a_reload(tmp_path):
    a_home, b_home = tmp_path / "a", tmp_path / "b"
    _init(a_home)
    b_key = _init(b_home)
    with processes() as procs:
        a = procs.serve(a_home).start().wait_ready()
        a.run("agent.new", {"name": "alpha"})
        a.run("memory.new", {"name": "notes"})
        a.run("memory.grant", {"bank": "notes", "agent": "alpha", "perm": "write"})
        shared = a.run("memory.share", {"bank": "notes", "perm": "read", "recipient": b_key}).data
        db = shared["db"]
        run_in_home(b_home, "memory.import", {"ticket": shared["ticket"], "perm": "read"})
        # A comes back on another port: the ticket's address, all B knows of A, is stale now.
        assert a.stop() == 0
        a.start().wait_ready()
        b = procs.serve(b_home).start().wait_ready()
        a.run("remember", {"agent": "alpha", "key": "deploy", "value": "nix build", "bank": "notes"})
        until(lambda: _link_errors(b, db), REACH_S, "B failing to reach A at the stale address")
        assert _entries(b)[db] < _entries(a)[db]

        (b_home / CONFIG_FILE).write_text(f"sync:\n  peers: [{a.address}]\n")
        done = b.run("reload", {})
        assert f'sync.peers: [] -> ["{a.address}"]' in done.data["changes"] and done.warnings == []
        until(lambda: _entries(b)[db] == _entries(a)[db], REACH_S, "B synced from A through sync.peers")
        assert b.status()["sync"]["peers"] == [a.address]
