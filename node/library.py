"""The Python library: ``Node.open(home)``, ``node.call_tool(...)``, ``node.auto_recall(...)``.

    from memmesh.node import Node
    with Node.open("/path/to/home") as node:
        node.call_tool("alpha", "remember", {"key": "k", "value": "v"})
        print(node.call_tool("alpha", "recall", {"query": "k"}))
        print(node.run("memory.list", {}).text)

A Node is what command handlers act on (its home, agents, banks and memory service); its
convenience calls go through the command registry like every other transport.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from memmesh.node.commands import EventSink, Result
from memmesh.node.core_node import CoreNode
from memmesh.node.memory.embedders import Embedder, EmbedderConfig, default_provider, make_embedder
from memmesh.node.memory.open_views import budget_bytes
from memmesh.node.memory.service import MemoryService
from memmesh.node.registry import EMBEDDER_CONFIG, EMBEDDER_SECRET
from memmesh.node.settings import applied, memory_defaults
from memmesh.node.worker import Network


class Calls:
    """The library's convenience calls, over ``run``: a ``Node`` runs them here, a client of
    ``connect`` (node/client.py) through serve when one runs; the same signatures and results."""

    def run(self, name: str, params: dict[str, Any], events: EventSink | None = None) -> Result:
        raise NotImplementedError

    def call_tool(self, agent: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        """Run one agent tool (remember, recall, list_memory_banks, neighbors, forget); its JSON result."""
        data: dict[str, Any] = self.run("tool", {"agent": agent, "tool": tool, "args": args}).data
        return data

    def history_add(self, agent: str, session: str, role: str, text: str) -> dict[str, Any]:
        """Append one turn to the agent's conversation history (docs/memory.md, "History")."""
        data: dict[str, Any] = self.run("history.add", {"agent": agent, "session": session, "role": role,
                                                        "text": text}).data
        return data

    def history_window(self, agent: str, session: str, budget: int) -> str:
        """The session as one text of at most ``budget`` characters over the chunk pyramid."""
        text: str = self.run("history.window", {"agent": agent, "session": session, "budget": budget}).data["text"]
        return text

    def auto_recall(self, agent: str, messages: Sequence[str], session: str | None = None,
                    context_window: int | None = None) -> str:
        """``context_window``: the answering model's, in tokens (None: 100,000); sizes the block."""
        block: str = self.run("autorecall", {"agent": agent, "messages": list(messages), "session": session,
                                             "context_window": context_window}).data["block"]
        return block


class Node(Calls, CoreNode):
    """A node with its agents, banks and memory tools."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._memory: MemoryService | None = None
        # Set by serve while it runs: its listeners, discovery, start time (for `status`).
        self.serve_info: dict[str, Any] | None = None

    @classmethod
    def open(cls, home: Path | str, *, create: bool = True, lock_timeout: float = 30.0) -> Node:
        node = super().open(home, create=create, lock_timeout=lock_timeout)
        assert isinstance(node, Node)
        return node

    @contextlib.contextmanager
    def serving(self, network: Network) -> Iterator[None]:
        """serve's run: commands reach its loop, daemon, event bus and live config through
        ``network`` until it stops; the node outlives the run, and is offline again after it."""
        self.network = network
        try:
            yield
        finally:
            self.network = Network()
            self.serve_info = None

    # ------------------------------------------------------------------ embedder
    def embedder_config(self) -> EmbedderConfig:
        raw = self.registry.config(EMBEDDER_CONFIG)
        if raw is None:
            return EmbedderConfig(default_provider())
        return EmbedderConfig(**raw)

    def set_embedder_config(self, cfg: EmbedderConfig, api_key: str | None = None) -> Embedder | None:
        """Check the config builds an embedder, then store it (the key as a peer-local secret)."""
        embedder = make_embedder(cfg, api_key=api_key if api_key is not None else self.registry.secret(EMBEDDER_SECRET))
        if api_key is not None:
            self.registry.set_secret(EMBEDDER_SECRET, api_key)
        self.registry.set_config(EMBEDDER_CONFIG, {
            "provider": cfg.provider, "model": cfg.model, "api_base": cfg.api_base,
            "api_key_ref": EMBEDDER_SECRET if (api_key or cfg.api_key_ref) else None,
            "timeout_s": cfg.timeout_s, "dim": cfg.dim,
        })
        if self._memory is not None:  # views are rebuilt for the new model
            self._memory.close()
        self._memory = None
        return embedder

    @property
    def memory(self) -> MemoryService:
        if self._memory is None:
            cfg = self.embedder_config()
            embedder = make_embedder(cfg, api_key=self.registry.secret(EMBEDDER_SECRET))
            self._memory = MemoryService(self.agents, embedder, settings=ConfigInForce(self),
                                         serving=lambda: self.network.serving)
        return self._memory

    def close(self) -> None:
        if self._memory is not None:
            self._memory.close()
            self._memory = None
        super().close()

    # ------------------------------------------------------------------ commands
    def run(self, name: str, params: dict[str, Any], events: EventSink | None = None) -> Result:
        """Run any command by name with JSON-compatible parameters (see node.commands)."""
        # Here, not at the top: the CLI opens a Node for one command, whose module alone it imports.
        from memmesh.node.commands import REGISTRY

        return REGISTRY.run(self, name, params, events=events)


class ConfigInForce:
    """The memory service's settings (node/memory/defaults.py) from the config in force."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def defaults(self) -> dict[str, Any]:
        return memory_defaults(self.node)

    def default_banks(self, agent: str) -> list[str]:
        spec = applied(self.node).agent(agent)
        return list(spec.default_memory_banks) if spec is not None else []

    def view_budget_bytes(self) -> int:
        return budget_bytes(applied(self.node).memory.view_budget_mib)


def run_in_home(home: Path | str, name: str, params: dict[str, Any], events: EventSink | None = None) -> Result:
    """Open the node in ``home`` for one command, run it, close the node.

    Parameters are checked before the home is opened, so a refused command touches nothing.
    Only a command that creates the node (init) may find the home empty.
    """
    from memmesh.node.commands import REGISTRY

    cmd = REGISTRY.get(name)
    cmd.parse(params)
    if cmd.opens_itself:  # a command for a home the normal open may refuse (check)
        return REGISTRY.run_on_home(Path(home), name, params, events)
    node = Node.init(home)[0] if cmd.creates_home else Node.open(home, create=False)
    assert isinstance(node, Node)
    with node:
        return node.run(name, params, events)
