"""Every user-visible operation: one registry entry each (name, parameter model, handler).

Every transport (CLI, local HTTP API, MCP, chat commands, the Python library) reaches a
command through ``REGISTRY.run(node, name, params)`` and renders the Result: ``data`` for
machines (JSON), ``text`` for people. See node/commands/registry.py.

For Python callers each command is also a function of this module, named after the command
with ``_`` for ``.`` and taking the parameters in the model's field order:
``commands.memory_grant(node, "notes", "alpha", "write")`` runs ``memory.grant``. It goes
through the same ``REGISTRY.run``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

# Importing a handler module registers its commands; this order is the CLI's help order.
# One module a line, so that adding one is a one-line change.
from memmesh.node.commands import node_status  # noqa: F401
from memmesh.node.commands import agents  # noqa: F401
from memmesh.node.commands import tools  # noqa: F401
from memmesh.node.commands import embedder  # noqa: F401
from memmesh.node.commands import banks  # noqa: F401
from memmesh.node.commands import config  # noqa: F401
from memmesh.node.commands import settings  # noqa: F401
from memmesh.node.commands import reindex  # noqa: F401
from memmesh.node.commands import usage  # noqa: F401
from memmesh.node.commands import audit  # noqa: F401
from memmesh.node.commands import sync  # noqa: F401
from memmesh.node.commands import chat  # noqa: F401
from memmesh.node.commands import backup  # noqa: F401
from memmesh.node.commands import check  # noqa: F401
from memmesh.node.commands import fence  # noqa: F401
from memmesh.node.commands import serving  # noqa: F401  (memmesh serve; its handler imports node/serve.py lazily)
from memmesh.node.commands import mcp  # noqa: F401
from memmesh.node.commands import quarantine  # noqa: F401
from memmesh.node.commands import recall_status  # noqa: F401
from memmesh.node.commands import retention  # noqa: F401
from memmesh.node.commands import episodes  # noqa: F401
from memmesh.node.commands import history  # noqa: F401
from memmesh.node.commands.params import Params, ParamsError
from memmesh.node.commands.registry import REGISTRY, Command, EventSink, UnknownCommand, progress_sink
from memmesh.node.commands.result import Result, json_text

if TYPE_CHECKING:
    from memmesh.node.library import Node

__all__ = ["REGISTRY", "Command", "EventSink", "Params", "ParamsError", "Result", "UnknownCommand",
           "json_text", "progress_sink"]

_FUNCTIONS = {cmd.name.replace(".", "_").replace("-", "_"): cmd for cmd in REGISTRY}


def _function(cmd: Command) -> Callable[..., Result]:
    fields = list(cmd.params.model_fields)

    def run(node: "Node", *args: Any, events: EventSink | None = None,
            progress: Callable[[int, int], None] | None = None, **params: Any) -> Result:
        if len(args) > len(fields):
            raise ParamsError(f"{cmd.name} takes at most {len(fields)} parameters ({', '.join(fields)})")
        params.update(zip(fields, args))
        if progress is not None:
            events = progress_sink(progress)
        return REGISTRY.run(node, cmd.name, params, events=events)

    run.__name__ = run.__qualname__ = cmd.name.replace(".", "_")
    run.__doc__ = f"{cmd.help}. Parameters: {', '.join(fields) or 'none'} (see {cmd.params.__name__})."
    return run


def __getattr__(name: str) -> Callable[..., Result]:
    cmd = _FUNCTIONS.get(name)
    if cmd is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _function(cmd)


def __dir__() -> list[str]:
    return sorted([*globals(), *_FUNCTIONS])
