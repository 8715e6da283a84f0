"""The agent tools, once: their names, what each does, and what each does to the world.

Every list of tools derives from this one: config.yaml's ``allowed_tools`` (node/settings.py),
the ``tool`` command and its argument models (node/commands/tools.py), the HTTP API's tool
routes (node/api/routes.py) and the MCP server's tools and annotations (node/mcp_server.py).
It sits below all of them and imports nothing, so the lowest (settings) can read it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str  # what an agent reads to choose the tool (MCP, OpenAPI)
    # Hints for MCP clients (never security): what the tool does to the world.
    read_only: bool
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = False


CATALOGUE: tuple[ToolSpec, ...] = (
    ToolSpec("remember", "Store a memory in the agent's own memory or in a bank.", read_only=False),
    ToolSpec("recall", "Search memories by words and meaning, optionally filtered by tags.", read_only=True),
    ToolSpec("list_memory_banks", "List the banks this agent can use (itself first), with its permission on each.",
             read_only=True),
    ToolSpec("neighbors", "List the memories linked to one memory by typed edges, both ways (its links and "
                          "backlinks), across the banks this agent can read.", read_only=True),
    ToolSpec("forget", "Forget a memory for good: erase every version of its key (and their vectors) on every "
                       "replica, by signed erasures. Its author (with Write) or an Admin of the bank; preview: "
                       "say what would be erased, erase nothing.", read_only=False, destructive=True,
             idempotent=False),
)
TOOL_NAMES: tuple[str, ...] = tuple(t.name for t in CATALOGUE)
BY_NAME: dict[str, ToolSpec] = {t.name: t for t in CATALOGUE}
