"""Where one command for a home runs: through the home's serve when it runs, else here.

Every transport that acts for a home from outside serve (the CLI, `memmesh mcp`) calls
:func:`run_command`; it sits below them so that none climbs to another to reach it. The
parameters are validated once per call: by serve when it answers at once (it validates what it
runs), else here, before anything waits for the home, and the parsed model is what runs.

A command whose handler is a transport (serve, mcp) is declared in node/commands without one;
the caller that may import the transport passes its runner in ``runners`` (node/cli.py does).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memmesh.node.command_result import Result
from memmesh.node.commands.registry import EITHER, HERE, Command, EventSink, StandaloneCommand
from memmesh.node.control import ControlClient, refuse_if_serving, remote, route

Runner = Callable[..., Result]


def run_command(home: Path, name: str, params: dict[str, Any], events: EventSink | None = None,
                runners: Mapping[str, Runner] | None = None) -> Result:
    """Run command ``name`` for ``home``: through serve when it runs there, else in this
    process (the command's ``runs`` policy says whether it may go through serve at all)."""
    from memmesh.node.commands import load_command

    cmd = load_command(name).get(name)  # this command's handler module, not every one
    if cmd.runs == EITHER and not cmd.standalone:
        client = remote(home)  # answers now, or None: nothing waits before the parameters are checked
        if client is not None:
            return _send(client, name, params, events)
    parsed = cmd.parse(params)
    handler = (runners or {}).get(name, cmd.handler)
    if handler is None:
        raise StandaloneCommand(f"{name} is a transport: run memmesh {name.replace('.', ' ')}")
    if cmd.standalone:  # a transport of its own on the home's path (mcp, restore): never sent to serve
        return handler(home, parsed)
    client = None
    if cmd.runs == HERE:
        refuse_if_serving(home, log_json=bool(getattr(parsed, "log_json", False)))
    else:
        client = route(home)
    if client is not None:
        return _send(client, name, params, events)
    return _run_here(Path(home), cmd, parsed, handler, events)


def _send(client: ControlClient, name: str, params: dict[str, Any], events: EventSink | None) -> Result:
    with client:
        return client.run(name, params, events=events)


def _run_here(home: Path, cmd: Command, parsed: Any, handler: Runner, events: EventSink | None) -> Result:
    """The command on the home opened in this process for it (library.run_in_home's steps, on
    parameters parsed already)."""
    from memmesh.node.commands.registry import REGISTRY
    from memmesh.node.library import Node

    if cmd.opens_itself:  # a command for a home the normal open may refuse (check)
        return REGISTRY.execute_on_home(home, cmd, parsed, events)
    node = Node.init(home)[0] if cmd.creates_home else Node.open(home, create=False)
    assert isinstance(node, Node)
    with node:
        if handler is not cmd.handler:  # a transport's runner: it takes the open node
            return handler(node, parsed)
        return REGISTRY.execute(node, cmd, parsed, events)
