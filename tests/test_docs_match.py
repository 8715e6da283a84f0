"""What the README and docs/ say about the node, checked against what the node does (issue 22,
"Docs and packaging that match"): config show under a serve started with other values, a tool
route's body and the path's agent, the status example of docs/api.md, the example harness's
tools."""
from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import pytest

from memmesh.node.catalogue import TOOL_NAMES
from tests.procs import processes
from tests.test_api import api  # noqa: F401 (the fixture: the API of a real node over real aiohttp)
from tests.test_cli import mm_here

ROOT = Path(__file__).resolve().parent.parent


def _config_show(home: Path) -> tuple[str, dict]:
    return mm_here("config", "show", home=home).stdout, json.loads(mm_here("--json", "config", "show", home=home).stdout)


def test_config_show_without_serve_says_where_each_value_comes_from(tmp_path, monkeypatch):
    home = tmp_path / "node"
    mm_here("init", home=home)
    (home / "config.yaml").write_text("sync:\n  fanout: 5\n")
    mm_here("reload", home=home)
    monkeypatch.setenv("MEMMESH_AUTO_RECALL_DEADLINE_MS", "80")
    text, data = _config_show(home)
    assert data["serving"] is False
    assert data["sources"]["sync.fanout"] == "config.yaml" and data["sync"]["fanout"] == 5
    assert data["sources"]["sync.interval_s"] == "default"
    assert "  fanout: 5  # config.yaml" in text.splitlines()
    assert "  listen: 127.0.0.1:7412  # default" in text.splitlines()
    assert text.startswith("# serve is not running")


@pytest.mark.slow
def test_config_show_shows_what_a_running_serve_uses_and_why(tmp_path, monkeypatch):
    """serve started with flags that differ from config.yaml and the defaults: config show
    answers with the values serve runs with (the ports it bound), each with its source."""
    home = tmp_path / "node"
    mm_here("init", home=home)
    (home / "config.yaml").write_text("sync:\n  fanout: 5\n  discovery: true\n")
    # serve's process inherits it: the deadline's default comes from the environment there
    monkeypatch.setenv("MEMMESH_AUTO_RECALL_DEADLINE_MS", "80")
    with processes() as procs:
        serve = procs.serve(home, interval=2.0).start().wait_ready()  # --no-discovery, --api-listen 127.0.0.1:0
        monkeypatch.delenv("MEMMESH_AUTO_RECALL_DEADLINE_MS")  # what counts is serve's, not this process's
        text, data = _config_show(home)
        status = serve.run("status", {}).data
    lines = text.splitlines()
    assert data["serving"] is True and lines[0].startswith("# in force in serve (pid ")
    sync, served_api, sources = data["sync"], data["api"], data["sources"]
    listeners = status["node"]["listeners"]
    assert sync["listen"] == listeners["sync"] and not sync["listen"].endswith(":0")  # the bound port
    assert served_api["listen"] == listeners["api"] and served_api["listen"] != "127.0.0.1:7412"
    assert sync["discovery"] is False and sync["interval_s"] == 2.0 and sync["fanout"] == 5
    assert sources["sync.listen"] == "command line (serve --listen)"
    assert sources["sync.discovery"] == "command line (serve --no-discovery)"
    assert sources["sync.interval_s"] == "command line (serve --interval)"
    assert sources["api.listen"] == "command line (serve --api-listen)"
    assert sources["sync.fanout"] == "config.yaml"
    assert sources["auto_recall.deadline_ms"] == "environment (MEMMESH_AUTO_RECALL_DEADLINE_MS)"
    assert data["auto_recall"]["deadline_ms"] == 80
    assert f"  listen: {listeners['sync']}  # command line (serve --listen)" in lines
    assert "  discovery: false  # command line (serve --no-discovery)" in lines
    assert f"  listen: {listeners['api']}  # command line (serve --api-listen)" in lines


async def test_a_body_naming_the_agent_is_refused_saying_the_path_gives_it(api):  # noqa: F811
    # docs/api.md, "Routes": the path gives agent on every agent route, tool or not
    for path, what, body in (("/v1/agents/alpha/tools/recall", "recall", {"query": "x"}),
                             ("/v1/agents/alpha/autorecall", "autorecall", {"messages": ["hello"]}),
                             ("/v1/agents/alpha/command", "command", {"line": "/memory list"})):
        for agent in ("alpha", "beta"):
            status, answer, _ = await api.call("POST", path, body={**body, "agent": agent}, valid=False)
            assert (status, answer["error"]) == (400, {
                "code": "invalid_params",
                "message": f"{what}: the path gives agent, so leave agent out of the body"}), (path, agent)


def test_the_api_doc_says_what_a_tool_body_may_hold():
    doc = " ".join((ROOT / "docs" / "api.md").read_text().split())
    assert "the body may repeat it with the same value, never another." not in doc
    assert "a body that names it is refused with 400 `invalid_params`" in doc


def _shape(value: object) -> object:
    """The keys of a JSON value, nested (what an example must show), without the values."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    return None


def test_the_status_example_of_the_api_doc_has_every_key_status_answers(tmp_path):
    doc = (ROOT / "docs" / "api.md").read_text()
    block = doc.split("curl -s $API/v1/status -H \"$AUTH\"\n```\n```json\n", 1)[1].split("\n```", 1)[0]
    # the example elides with … ; each elided part becomes a value whose keys are not shown
    example = json.loads(re.sub(r"\[…\]|\{…\}", "null", re.sub(r", …\]", "]", block)).replace("…", ""))
    home = tmp_path / "node"
    mm_here("init", home=home)
    mm_here("agent", "new", "alpha", home=home)
    answered = json.loads(mm_here("--json", "status", home=home).stdout)
    assert set(example["data"]) == set(answered)
    assert set(example["data"]["node"]) == set(answered["node"])
    assert _shape(example["data"]["node"]) == _shape(answered["node"])
    assert set(example["data"]["databases"][0]) == set(answered["databases"][0])
    assert set(example["data"]["sync"]) == set(answered["sync"])


async def test_the_example_harness_offers_every_tool_the_node_has(api):  # noqa: F811
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import agent_loop
    finally:
        sys.path.pop(0)
    harness = agent_loop.Api(api.base, api.token)
    offered = await asyncio.to_thread(harness.tool_schemas)
    assert sorted(offered) == sorted(TOOL_NAMES) and len(offered) == 5
    assert all(schema.get("type") == "object" for schema in offered.values())
    readme = (ROOT / "README.md").read_text()
    assert f"Agents reach it through {len(TOOL_NAMES)} tools" in readme.replace("five", "5")
