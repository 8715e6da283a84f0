"""Every user-visible operation: one registry entry each (name, parameter model, handler).

Every transport (CLI, local HTTP API, MCP, chat commands, the Python library) reaches a
command through ``REGISTRY.run(node, name, params)`` and renders the Result: ``data`` for
machines (JSON), ``text`` for people. See node/commands/registry.py.

For Python callers each command is also a function of this module, named after the command
with ``_`` for ``.`` and taking the parameters in the model's field order:
``commands.memory_grant(node, "notes", "alpha", "write")`` runs ``memory.grant``. It goes
through the same ``REGISTRY.run``.

The handler modules are imported on first use of ``REGISTRY`` (or of a command function), not
when this package is: they import pydantic, numpy and the node, and a light module of this
package (the CLI's description, node/commands/cli_table.py) must be importable without them,
so that `memmesh --help` and a command sent to a running serve answer at once. A process that
runs one command imports only that command's module (:func:`load_command`); the registry
imports the others when a reader needs them all.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memmesh.node.commands.params import Params, ParamsError
    from memmesh.node.commands.registry import REGISTRY, Command, EventSink, Registry, UnknownCommand, progress_sink
    from memmesh.node.commands.result import Result, json_text
    from memmesh.node.library import Node

# Importing a handler module registers its commands; this order is the CLI's help order.
HANDLER_MODULES = (
    "node_status", "agents", "tools", "embedder", "banks", "config", "settings", "reindex", "usage", "audit",
    "sync", "chat", "backup", "check", "fence", "serving", "mcp", "quarantine", "proposals", "recall_status", "forget", "entities",
    "memory_get",
    "retention",
    "episodes", "history",
)

__all__ = ["HANDLER_MODULES", "REGISTRY", "Command", "EventSink", "Params", "ParamsError", "Result",
           "UnknownCommand", "json_text", "load", "load_command", "progress_sink"]

# Names of this package that live in a submodule, imported when first asked for.
_NAMES = {
    "Params": "params", "ParamsError": "params",
    "Command": "registry", "EventSink": "registry", "UnknownCommand": "registry", "progress_sink": "registry",
    "Result": "result", "json_text": "result",
}


def load() -> Registry:
    """The registry with every command registered: the handler modules imported, in order."""
    for name in HANDLER_MODULES:
        importlib.import_module(f"{__name__}.{name}")
    from memmesh.node.commands.registry import REGISTRY as registry

    return registry


def load_command(name: str) -> Registry:
    """The registry with command ``name`` registered: the handler module the CLI's description
    names for it imported, not every module. The registry imports the rest when a lookup misses
    (a name the description does not know, or a description older than the models)."""
    from memmesh.node.commands.cli_table import TABLE
    from memmesh.node.commands.registry import REGISTRY as registry

    module = next((c.get("module") for c in TABLE["commands"] if c["name"] == name), None)
    if module is not None:
        importlib.import_module(module)
    return registry


def _function(cmd: Command) -> Callable[..., Result]:
    from memmesh.node.commands.params import ParamsError
    from memmesh.node.commands.registry import REGISTRY, progress_sink

    fields = list(cmd.params.model_fields)

    def run(node: Node, *args: Any, events: EventSink | None = None,
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


def _functions() -> dict[str, Command]:
    return {cmd.name.replace(".", "_").replace("-", "_"): cmd for cmd in load()}


def __getattr__(name: str) -> Any:
    if name == "REGISTRY":
        return load()
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    if name.startswith("__"):
        raise AttributeError(name)
    cmd = _functions().get(name)
    if cmd is None and name in globals():  # a handler module, imported by load() just now
        return globals()[name]
    if cmd is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _function(cmd)


def __dir__() -> list[str]:
    return sorted([*globals(), *_NAMES, "REGISTRY", *_functions()])
