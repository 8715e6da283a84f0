"""What most tests that need a home start from: an agent, a bank it may write, the agent's tools.

``run`` is anything that runs a command by name with its parameters: ``Node.run`` in process, or
``Serve.run`` (tests/procs.py) through a serve's control channel.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp

from memmesh.node import Node
from memmesh.node.memory.embedders import EmbedderConfig

Run = Callable[[str, dict[str, Any]], Any]


def agent_with_bank(run: Run, *, agent: str = "alpha", bank: str = "notes", perm: str = "write",
                    **bank_fields: Any) -> None:
    """Create ``agent`` and ``bank`` and grant the agent ``perm`` on it."""
    run("agent.new", {"name": agent})
    run("memory.new", {"name": bank, **bank_fields})
    run("memory.grant", {"bank": bank, "agent": agent, "perm": perm})



def alpha_node(home: Path) -> Iterator[Node]:
    """A node in ``home`` with one agent, alpha, and no embedder, closed afterwards: a fixture
    body (``yield from alpha_node(tmp_path / "home")``)."""
    n = Node.open(home)
    n.set_embedder_config(EmbedderConfig("none"))
    n.agents.create_agent("alpha")
    yield n
    n.close()


def remember(node: Node, **args: Any) -> Any:
    return node.call_tool("alpha", "remember", args)


def recall(node: Node, **args: Any) -> Any:
    return node.call_tool("alpha", "recall", args)


@contextlib.asynccontextmanager
async def api_on(node: Node) -> AsyncIterator[tuple[Any, str, aiohttp.ClientSession]]:
    """The local HTTP API of ``node`` as serve builds it (its registry, its database thread, the
    home's token) on a real loopback port: (the aiohttp TestServer, the token, a client session).
    Closes the node when done."""
    from aiohttp.test_utils import TestServer

    from memmesh.node.api.app import build_app
    from memmesh.node.api_token import read_token
    from memmesh.node.control_server import CommandRunner
    from memmesh.node.worker import DbThread

    db = DbThread()
    token = read_token(node.home)
    app = build_app(CommandRunner(node, db, {"pid": os.getpid(), "listen": "127.0.0.1:0"}).run, token)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            yield server, token, session
    finally:
        await server.close()
        db.stop()
        node.close()
