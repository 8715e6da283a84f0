"""The command registry: every user-visible operation, by name, with its schema and handler.

    @command("memory.new", MemoryNew, "create a bank")
    def memory_new(node: Node, p: MemoryNew) -> Result: ...

    REGISTRY.run(node, "memory.new", {"name": "notes"})   # -> Result

Every transport reaches a command the same way: the command's name and a JSON-compatible dict
of parameters, validated against the command's model before the handler runs (so bad
parameters change nothing). The CLI builds that dict from argparse; a running ``memmesh serve``
receives ``{name, params}`` over its control socket (and the HTTP API, MCP and chat from their
own requests) and calls the same :meth:`Registry.run`.

Each command also declares its transport policy, and each transport derives what it serves
from it rather than keeping a list of its own: where it runs (``runs``: through the home's
serve when one runs, or always in the caller's process), its HTTP route (``http``: the API's
rule unless declared), whether chat callers may run it (``chat``) and which fields a chat
line's caller supplies (``from_caller``), whether it changes anything (``read_only``). The
agent tools and their MCP hints are node/catalogue.py's.

A handler that reports progress declares a keyword-only ``events`` parameter: a sink of small
JSON-compatible dicts (``{"event": "progress", "done": n, "total": m}``), which the CLI draws
as a progress bar and a server could stream. A callback of the transport's own shape would not
survive being sent as data.

(Not to be confused with node/registry.py, the peer-local records of agents and banks.)
"""
from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from memmesh.auth.errors import MemmeshError
from memmesh.node.commands.params import Params, parse
from memmesh.node.commands.result import Result

if TYPE_CHECKING:
    from memmesh.node.library import Node

# Set (to 1) in the environment: every Result a handler returns is validated against the
# command's answer model (node/commands/answers), and a mismatch raises naming the command and
# the field. The test suite sets it (tests/conftest.py); serve processes it starts inherit it.
CHECK_ANSWERS_ENV = "MEMMESH_CHECK_ANSWERS"

Event = dict[str, Any]
EventSink = Callable[[Event], None]
Handler = TypeVar("Handler", bound=Callable[..., Result])


class UnknownCommand(MemmeshError):
    """A command name the registry does not have."""


class StandaloneCommand(MemmeshError):
    """A standalone command (a transport of its own, such as mcp) asked to run on an open node."""


def _discard(event: Event) -> None:
    """The sink of a caller that does not listen to events."""


# Where a command runs (``Command.runs``).
EITHER = "either"  # in the home's serve when one runs, else in the caller's process
HERE = "here"  # always in the caller's process, never sent to serve (serve itself; restore; mcp)

# A command's HTTP route, (method, path template); None: not routed. A path's ``{name}`` is a
# parameter taken from the path. DEFAULT_ROUTE: the API's rule (docs/api.md), ``/v1/<name with
# . as />``, GET when read-only and without parameters, else POST.
Http = tuple[str, str]
DEFAULT_ROUTE: Any = object()
API_PREFIX = "/v1"


def default_route(name: str, params: type[Params], read_only: bool) -> Http:
    method = "GET" if read_only and not params.model_fields else "POST"
    return method, f"{API_PREFIX}/{name.replace('.', '/')}"


@dataclass(frozen=True)
class Command:
    """A command and its transport policy: every transport derives what it serves from this
    record (the CLI's dispatch, the HTTP routes, the chat grammar), none keeps a list of its own."""

    name: str
    params: type[Params]
    # None for a command whose handler is a transport (serve, mcp): the caller that may import
    # the transport provides it (node/dispatch.py's ``runners``), so this package imports none.
    handler: Callable[..., Result] | None
    help: str
    creates_home: bool = False  # runs on a home that may not exist yet (init)
    emits_events: bool = False  # the handler takes the keyword-only ``events`` sink
    # A transport that runs in the caller's process on the home's *path* (mcp, restore): its
    # handler is ``(home, params)``; it never opens the node, is never sent to serve, and has no
    # HTTP route.
    standalone: bool = False
    # Changes nothing (a listing, a status): the HTTP API serves such a command, when it takes no
    # parameters, as a GET (docs/api.md).
    read_only: bool = False
    # Works on a home that the normal open refuses (check): it goes through serve like any
    # command when serve runs (handler ``(node, params)``); otherwise its handler is given the
    # home's path, ``(home, params)``, and opens what it can itself (``Registry.run_on_home``).
    opens_itself: bool = False
    runs: str = EITHER  # EITHER or HERE
    http: Http | None = None  # resolved at registration: the rule's route unless declared
    chat: bool = False  # a chat line (/memory ...) may run it; resolved: every memory.* command
    from_caller: tuple[str, ...] = ()  # fields a chat line's caller supplies instead of its text

    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the parameters (what HTTP/OpenAPI and MCP are generated from)."""
        return self.params.model_json_schema()

    @property
    def answer(self) -> Any:
        """The model of the Result's ``data`` (a pydantic model, or a union of them for the
        commands whose answer is another's: ``tool``, ``command``); None for a command without
        one. Looked up in node/commands/answers on first use, so that a command sent to serve
        does not build every answer model first."""
        from memmesh.node.commands.answers import ANSWERS

        return ANSWERS.get(self.name)

    def parse(self, params: Any) -> Params:
        return parse(self.params, params, self.name)


class Registry:
    def __init__(self, complete: Callable[[], object] | None = None) -> None:
        self._commands: dict[str, Command] = {}
        self._groups: dict[str, str] = {}
        # REGISTRY's: registers every command (imports each handler module). A process that runs
        # one command imports only that command's module (node/commands' ``load_command``); a
        # reader that needs them all (a lookup that misses, a listing) has them completed first.
        self._complete = complete
        self._completing = threading.RLock()  # threads (mcp's) that miss wait for the one completing

    # ------------------------------------------------------------------ declaring
    def command(self, name: str, params: type[Params], help: str, **policy: Any) -> Callable[[Handler], Handler]:
        """Register the decorated handler ``(node, params) -> Result`` as command ``name``
        (``(home, params) -> Result`` when ``standalone``), with its transport policy (the
        keywords of ``_register``)."""
        def register(handler: Handler) -> Handler:
            self._register(name, params, help, handler, **policy)
            return handler
        return register

    def declare(self, name: str, params: type[Params], help: str, **policy: Any) -> None:
        """Register a command whose handler is a transport (serve, mcp): its model and policy
        here; its runner is given by the caller that may import the transport (node/cli.py,
        through node/dispatch.py's ``runners``)."""
        self._register(name, params, help, None, **policy)

    def _register(self, name: str, params: type[Params], help: str, handler: Callable[..., Result] | None, *,
                  creates_home: bool = False, standalone: bool = False, read_only: bool = False,
                  opens_itself: bool = False, runs: str | None = None, http: Http | None = DEFAULT_ROUTE,
                  chat: bool | None = None, from_caller: tuple[str, ...] = ()) -> None:
        if name in self._commands:
            raise ValueError(f"command {name!r} is registered twice")
        events = inspect.signature(handler).parameters.get("events") if handler is not None else None
        if events is not None and events.kind is not inspect.Parameter.KEYWORD_ONLY:
            raise TypeError(f"{name}: events must be a keyword-only parameter")
        where = runs or (HERE if standalone else EITHER)
        if where not in (EITHER, HERE):
            raise ValueError(f"{name}: runs is {EITHER!r} or {HERE!r}, not {where!r}")
        route = None if standalone else (default_route(name, params, read_only) if http is DEFAULT_ROUTE else http)
        missing = set(from_caller) - set(params.model_fields)
        if missing:
            raise ValueError(f"{name}: from_caller names {sorted(missing)}, which are not parameters")
        # chat not given: every memory.* command (the /memory group) may be run from a chat line.
        self._commands[name] = Command(name, params, handler, help, creates_home, events is not None,
                                       standalone, read_only, opens_itself, where, route,
                                       name.startswith("memory.") if chat is None else chat, tuple(from_caller))

    def group(self, name: str, help: str) -> None:
        """Describe a group of commands (``memory`` for ``memory.new``, ``memory.list``, ...).
        ``{actions}`` in ``help`` stands for the group's actions as registered, so the summary
        never lags behind the commands."""
        self._groups[name] = help

    # ------------------------------------------------------------------ reading
    def _every(self) -> dict[str, Command]:
        """The commands, every one registered (the completion runs once)."""
        if self._complete is None:
            return self._commands
        with self._completing:
            complete, self._complete = self._complete, None
            if complete is not None:
                try:
                    complete()
                except BaseException:
                    self._complete = complete
                    raise
        return self._commands

    def get(self, name: str) -> Command:
        cmd = self._commands.get(name) or self._every().get(name)
        if cmd is None:
            raise UnknownCommand(f"unknown command {name!r}; commands: {', '.join(self._commands)}")
        return cmd

    def __iter__(self) -> Iterator[Command]:
        return iter(self._every().values())

    def names(self) -> list[str]:
        return list(self._every())

    def group_help(self, name: str) -> str:
        self._every()
        help = self._groups.get(name, "")
        if "{actions}" in help:
            depth = name.count(".") + 1
            actions = dict.fromkeys(c.split(".")[depth] for c in self._commands if c.startswith(name + "."))
            help = help.replace("{actions}", ", ".join(actions))
        return help

    # ------------------------------------------------------------------ running
    def run(self, node: Node, name: str, params: Any, events: EventSink | None = None) -> Result:
        """Run command ``name`` on an open node with JSON-compatible ``params``."""
        cmd = self.get(name)
        return self.execute(node, cmd, cmd.parse(params), events)

    def execute(self, node: Node, cmd: Command, parsed: Params, events: EventSink | None = None) -> Result:
        """Run ``cmd`` on an open node with parameters its model has validated already (by the
        caller that needed them first), so that each call parses them once."""
        if cmd.standalone or cmd.handler is None:
            raise StandaloneCommand(f"{cmd.name} runs in its own process, not on an open node: "
                                    f"run memmesh {cmd.name.replace('.', ' ')}")
        return _call(cmd.handler, cmd, node, parsed, events)

    def run_on_home(self, home: Path, name: str, params: Any, events: EventSink | None = None) -> Result:
        """Run a command that opens the home itself (``opens_itself``) on the home's path."""
        cmd = self.get(name)
        return self.execute_on_home(home, cmd, cmd.parse(params), events)

    def execute_on_home(self, home: Path, cmd: Command, parsed: Params, events: EventSink | None = None) -> Result:
        """``run_on_home`` with parameters validated already."""
        if not cmd.opens_itself or cmd.handler is None:
            raise UnknownCommand(f"{cmd.name} runs on an open node, not on a home's path")
        return _call(cmd.handler, cmd, home, parsed, events)


def _call(handler: Callable[..., Result], cmd: Command, target: Any, parsed: Params,
          events: EventSink | None) -> Result:
    result = handler(target, parsed, events=events or _discard) if cmd.emits_events else handler(target, parsed)
    # The test suite's: every answer against its published schema (a command registered by a
    # test alone has none; tests/test_answers.py checks that every command of the node has one).
    if os.environ.get(CHECK_ANSWERS_ENV) and cmd.answer is not None:
        from memmesh.node.commands.answers import check_answer

        check_answer(cmd.name, result.data, cmd.answer)
    return result


def progress_sink(callback: Callable[[int, int], None]) -> EventSink:
    """An event sink for a Python caller that wants ``callback(done, total)``."""
    def sink(event: Event) -> None:
        if event.get("event") == "progress":
            callback(event["done"], event["total"])
    return sink


def _register_every_command() -> None:
    from memmesh.node.commands import load

    load()


REGISTRY = Registry(complete=_register_every_command)
command = REGISTRY.command
