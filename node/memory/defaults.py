"""What the memory service asks of the node's configuration, and the built-in answer.

The config in force (config.yaml as last applied) sits above the memory service, so the node
passes its answers in when it builds the service (node/library.py); a service built without
them uses the built-in defaults, as a node without config.yaml does.
"""
from __future__ import annotations

from typing import Any, Protocol

from memmesh.node.memory.agent_config import CONFIG_DEFAULTS
from memmesh.node.memory.open_views import budget_bytes


class MemorySettings(Protocol):
    """Read on every call: a reload changes them while the service runs."""

    def defaults(self) -> dict[str, Any]:
        """An agent's memory config before its own `memory config set` rows."""
        ...

    def default_banks(self, agent: str) -> list[str]:
        """The banks config.yaml names for ``agent`` (auto-recall searches them after its own)."""
        ...

    def view_budget_bytes(self) -> int:
        """The bytes open memory views may take (``memory.view_budget_mib``, node/memory/open_views.py)."""
        ...


class BuiltIn:
    """No config.yaml: the built-in memory config, no default banks, the default view budget."""

    def defaults(self) -> dict[str, Any]:
        return dict(CONFIG_DEFAULTS)

    def default_banks(self, agent: str) -> list[str]:
        return []

    def view_budget_bytes(self) -> int:
        return budget_bytes(None)
