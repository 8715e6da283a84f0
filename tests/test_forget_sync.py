"""forget between two real `memmesh serve` processes sharing a bank, on 127.0.0.1 only.

Node A's agent writes a secret (two versions) into a shared bank; once node B recalls both, the
agent forgets the key with `memmesh forget` (a CLI process, sent to A's serve). When B no longer
lists any row of the key, both serves stop and the secret is in no file of either home (every
SQLite file and its WAL read as bytes, after a checkpoint), while another memory of the bank
stays on both. Every wait has a generous deadline; nothing asserts elapsed time.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memmesh.node import Node
from tests.procs import Serve, processes, until
from tests.test_cli import mm
from tests.test_forget import checkpoint, files_holding, marker

pytestmark = pytest.mark.slow

BANK = "shared-notes"
REACH_S = 90.0  # a hang guard, not a latency expectation


def _init(home: Path) -> None:
    node, _ = Node.init(home)
    with node:
        node.run("embedder.set", {"provider": "none"})


def _rows(serve: Serve, agent: str) -> list[dict[str, Any]]:
    """Every row of the bank that recall --all lists for ``agent`` on that serve."""
    return serve.run("recall", {"agent": agent, "bank": BANK, "include_superseded": True, "limit": 100,
                                "no_count": True}).data["memories"]


def test_a_forget_on_one_serve_erases_the_text_on_both(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for h in (a, b):
        _init(h)
    with Node.open(a) as node:
        node.run("agent.new", {"name": "alpha"})
        node.run("memory.new", {"name": BANK})
        node.run("memory.grant", {"bank": BANK, "agent": "alpha", "perm": "write"})
    old, new, keep = marker("old"), marker("new"), marker("keep")
    with processes() as procs:
        sa = procs.serve(a, interval=1).start()
        sb = procs.serve(b, interval=1).start()
        sa.wait_ready(), sb.wait_ready()
        share = sa.run("memory.share", {"bank": BANK, "perm": "admin"}).data
        sb.run("memory.import", {"ticket": share["ticket"], "perm": "admin"})
        sb.run("agent.new", {"name": "gamma"})
        sb.run("memory.grant", {"bank": BANK, "agent": "gamma", "perm": "read"})

        for value in (old, new):
            sa.run("remember", {"agent": "alpha", "key": "project.codename", "value": value, "bank": BANK})
        sa.run("remember", {"agent": "alpha", "key": "db.host", "value": keep, "bank": BANK})
        until(lambda: {r["value"] for r in _rows(sb, "gamma")} == {old, new, keep}, REACH_S,
              lambda: f"both versions and the other memory to reach B (B lists {_rows(sb, 'gamma')})")

        # gamma only reads the bank on B: refused there, nothing written.
        refused = mm("forget", "gamma", "project.codename", "--bank", BANK, home=b, check=False)
        assert refused.returncode == 1 and refused.stderr.strip().startswith(
            "memmesh: error: agent gamma may not forget in bank shared-notes: its key holds read permission")
        assert len(refused.stderr.strip().splitlines()) == 1

        out = mm("--json", "forget", "alpha", "project.codename", "--bank", BANK, home=a)
        assert '"versions"' in out.stdout and "project.codename" in out.stdout
        assert [r["value"] for r in _rows(sa, "alpha")] == [keep]
        until(lambda: [r["value"] for r in _rows(sb, "gamma")] == [keep], REACH_S,
              lambda: f"the forget to reach B (B lists {_rows(sb, 'gamma')})")
        block = sb.run("autorecall", {"agent": "gamma", "messages": ["what is the project codename?"],
                                      "no_count": True}).data["block"]
        assert old not in block and new not in block
        assert sa.stop() == 0 and sb.stop() == 0

    for home in (a, b):
        checkpoint(home)
        assert files_holding(home, old) == [] and files_holding(home, new) == [], home
        assert files_holding(home, keep) == ["node.sqlite"], home


async def test_mcp_http_and_cli_run_the_one_forget(tmp_path):
    """The MCP tool, the HTTP tool route and the CLI command reach the same handler on a serve:
    the same answer's shape, the same refusal line, the text gone from the home."""
    import json
    import urllib.error
    import urllib.request

    from mcp import Client

    from memmesh.node.api_token import read_token
    from memmesh.node.mcp_server import build_server

    def http(url: str, token: str, body: dict[str, Any]) -> tuple[int, Any]:
        req = urllib.request.Request(url, method="POST", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    home = tmp_path / "node"
    _init(home)
    with Node.open(home) as node:
        node.run("agent.new", {"name": "alpha"})
    texts = {k: marker(k) for k in ("by-mcp", "by-http", "by-cli", "kept")}
    with processes() as procs:
        serve = procs.serve(home).start().wait_ready()
        for key, value in texts.items():
            serve.run("remember", {"agent": "alpha", "key": key, "value": value})

        async with Client(build_server(home, "alpha")) as client:
            unknown = await client.call_tool("forget", {"key": "nope"})
            assert unknown.is_error and unknown.content[0].text == (
                "no memory 'nope' in alpha (no row of that key, current or superseded); nothing was erased")
            done = await client.call_tool("forget", {"key": "by-mcp"})
            assert not done.is_error and done.structured_content["key"] == "by-mcp"
            assert [v["entry"] for v in done.structured_content["versions"]]

        token = read_token(home)
        base = f"http://{serve.info['api']}/v1/agents/alpha/tools/forget"
        status, answer = http(base, token, {"key": "by-http", "preview": True})
        assert status == 200 and answer["data"]["preview"] is True
        status, answer = http(base, token, {"key": "by-http"})
        assert status == 200 and answer["data"]["erased"] and answer["data"]["entries"]
        status, answer = http(base, token, {"key": "by-http"})
        assert status == 404 and answer["error"]["code"] == "not_found" and "no memory 'by-http'" in \
            answer["error"]["message"]
        status, answer = http(base, token, {"key": 5})
        assert status == 400 and answer["error"]["code"] == "invalid_params"

        said = mm("forget", "alpha", "by-cli", home=home)
        assert said.stdout.startswith("forgot 'by-cli' in alpha: 1 version")
        listed = serve.run("recall", {"agent": "alpha", "include_superseded": True, "no_count": True}).data
        assert [m["key"] for m in listed["memories"]] == ["kept"]
        assert serve.stop() == 0

    checkpoint(home)
    for key, value in texts.items():
        assert files_holding(home, value) == (["node.sqlite"] if key == "kept" else []), key
