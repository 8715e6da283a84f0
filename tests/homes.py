"""What most tests that need a home start from: an agent and a bank it may write.

``run`` is anything that runs a command by name with its parameters: ``Node.run`` in process, or
``Serve.run`` (tests/procs.py) through a serve's control channel.
"""
from __future__ import annotations

from typing import Any, Callable

Run = Callable[[str, dict[str, Any]], Any]


def agent_with_bank(run: Run, *, agent: str = "alpha", bank: str = "notes", perm: str = "write",
                    **bank_fields: Any) -> None:
    """Create ``agent`` and ``bank`` and grant the agent ``perm`` on it."""
    run("agent.new", {"name": agent})
    run("memory.new", {"name": bank, **bank_fields})
    run("memory.grant", {"bank": bank, "agent": agent, "perm": perm})

