"""The command registry: every user-visible operation, by name, with its schema and handler.

    @command("memory.new", MemoryNew, "create a bank")
    def memory_new(node: Node, p: MemoryNew) -> Result: ...

    REGISTRY.run(node, "memory.new", {"name": "notes"})   # -> Result

Every transport reaches a command the same way: the command's name and a JSON-compatible dict
of parameters, validated against the command's model before the handler runs (so bad
parameters change nothing). The CLI builds that dict from argparse; a running ``memmesh serve``
receives ``{name, params}`` over its control socket (and the HTTP API, MCP and chat from their
own requests) and calls the same :meth:`Registry.run`.

A handler that reports progress declares a keyword-only ``events`` parameter: a sink of small
JSON-compatible dicts (``{"event": "progress", "done": n, "total": m}``), which the CLI draws
as a progress bar and a server could stream. A callback of the transport's own shape would not
survive being sent as data.

(Not to be confused with node/registry.py, the peer-local records of agents and banks.)
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from memmesh.auth.errors import MemmeshError
from memmesh.node.commands.params import Params, parse
from memmesh.node.commands.result import Result

if TYPE_CHECKING:
    from memmesh.node.library import Node

Event = dict[str, Any]
EventSink = Callable[[Event], None]


class UnknownCommand(MemmeshError):
    """A command name the registry does not have."""


class StandaloneCommand(MemmeshError):
    """A standalone command (a transport of its own, such as mcp) asked to run on an open node."""


def _discard(event: Event) -> None:
    """The sink of a caller that does not listen to events."""


@dataclass(frozen=True)
class Command:
    name: str
    params: type[Params]
    handler: Callable[..., Result]
    help: str
    creates_home: bool = False  # runs on a home that may not exist yet (init)
    emits_events: bool = False  # the handler takes the keyword-only ``events`` sink
    # A transport that runs in the caller's process on the home's *path* (mcp): its handler is
    # ``(home, params)``; it never opens the node, is never sent to serve, and has no HTTP route.
    standalone: bool = False
    # Changes nothing (a listing, a status): the HTTP API serves such a command, when it takes no
    # parameters, as a GET (docs/api.md).
    read_only: bool = False
    # Works on a home that the normal open refuses (check): it goes through serve like any
    # command when serve runs (handler ``(node, params)``); otherwise its handler is given the
    # home's path, ``(home, params)``, and opens what it can itself (``Registry.run_on_home``).
    opens_itself: bool = False

    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the parameters (what HTTP/OpenAPI and MCP are generated from)."""
        return self.params.model_json_schema()

    def parse(self, params: Any) -> Params:
        return parse(self.params, params, self.name)


class Registry:
    def __init__(self) -> None:
        self._commands: dict[str, Command] = {}
        self._groups: dict[str, str] = {}

    # ------------------------------------------------------------------ declaring
    def command(self, name: str, params: type[Params], help: str, *, creates_home: bool = False,
                standalone: bool = False, read_only: bool = False,
                opens_itself: bool = False) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
        """Register the decorated handler ``(node, params) -> Result`` as command ``name``
        (``(home, params) -> Result`` when ``standalone``)."""
        def register(handler: Callable[..., Result]) -> Callable[..., Result]:
            if name in self._commands:
                raise ValueError(f"command {name!r} is registered twice")
            events = inspect.signature(handler).parameters.get("events")
            if events is not None and events.kind is not inspect.Parameter.KEYWORD_ONLY:
                raise TypeError(f"{handler.__qualname__}: events must be a keyword-only parameter")
            self._commands[name] = Command(name, params, handler, help, creates_home, events is not None,
                                           standalone, read_only, opens_itself)
            return handler
        return register

    def group(self, name: str, help: str) -> None:
        """Describe a group of commands (``memory`` for ``memory.new``, ``memory.list``, ...)."""
        self._groups[name] = help

    # ------------------------------------------------------------------ reading
    def get(self, name: str) -> Command:
        cmd = self._commands.get(name)
        if cmd is None:
            raise UnknownCommand(f"unknown command {name!r}; commands: {', '.join(self._commands)}")
        return cmd

    def __iter__(self) -> Iterator[Command]:
        return iter(self._commands.values())

    def names(self) -> list[str]:
        return list(self._commands)

    def group_help(self, name: str) -> str:
        return self._groups.get(name, "")

    # ------------------------------------------------------------------ running
    def run(self, node: "Node", name: str, params: Any, events: EventSink | None = None) -> Result:
        """Run command ``name`` on an open node with JSON-compatible ``params``."""
        cmd = self.get(name)
        parsed = cmd.parse(params)
        if cmd.standalone:
            raise StandaloneCommand(f"{name} runs in its own process on a home, not on an open node: "
                                    f"run memmesh {name.replace('.', ' ')}")
        if cmd.emits_events:
            return cmd.handler(node, parsed, events=events or _discard)
        return cmd.handler(node, parsed)


    def run_on_home(self, home: Path, name: str, params: Any, events: EventSink | None = None) -> Result:
        """Run a command that opens the home itself (``opens_itself``) on the home's path."""
        cmd = self.get(name)
        parsed = cmd.parse(params)
        if not cmd.opens_itself:
            raise UnknownCommand(f"{name} runs on an open node, not on a home's path")
        if cmd.emits_events:
            return cmd.handler(home, parsed, events=events or _discard)
        return cmd.handler(home, parsed)


def progress_sink(callback: Callable[[int, int], None]) -> EventSink:
    """An event sink for a Python caller that wants ``callback(done, total)``."""
    def sink(event: Event) -> None:
        if event.get("event") == "progress":
            callback(event["done"], event["total"])
    return sink


REGISTRY = Registry()
command = REGISTRY.command
