"""The Python library: ``Node.open(home)``, ``node.call_tool(...)``, ``node.auto_recall(...)``.

    from node import Node
    with Node.open("/path/to/home") as node:
        node.call_tool("alpha", "remember", {"key": "k", "value": "v"})
        print(node.call_tool("alpha", "recall", {"query": "k"}))
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from node.home import Home
from node.memory.agents import Agents
from node.memory.embedders import Embedder, EmbedderConfig, default_provider, make_embedder
from node.memory.service import MemoryService

EMBEDDER_CONFIG = "embedder"
EMBEDDER_SECRET = "embedder-api-key"


class Node(Home):
    """A node with its agents, banks and memory tools."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agents = Agents(self)
        self._memory: MemoryService | None = None

    @classmethod
    def open(cls, home: Path | str, *, create: bool = True, lock_timeout: float = 30.0) -> "Node":
        node = super().open(home, create=create, lock_timeout=lock_timeout)
        assert isinstance(node, Node)
        return node

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
            self._memory = MemoryService(self.agents, embedder)
        return self._memory

    def close(self) -> None:
        if self._memory is not None:
            self._memory.close()
            self._memory = None
        super().close()

    # ------------------------------------------------------------------ tools
    def call_tool(self, agent: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        """Run one agent tool (remember, recall, list_memory_banks) and return its JSON result."""
        return self.memory.call_tool(self.agents.agent(agent), tool, args)

    def auto_recall(self, agent: str, messages: Sequence[str], session: str | None = None) -> str:
        return self.memory.auto_recall(self.agents.agent(agent), messages, session)
