"""command: run one `/memory ...` chat command line for an agent's session (node/chat.py parses it)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from memmesh.node.commands.params import Cli, Params
from memmesh.node.commands.registry import REGISTRY, EventSink, command
from memmesh.node.commands.result import Result

if TYPE_CHECKING:
    from memmesh.node.library import Node


# A chat line names a bank, a key, a few words of description: 16 KiB is far above any of
# them, and shlex's cost grows with the square of a word's length (900 KB took 8 s of the
# database thread, on which commands run).
MAX_LINE = 16 << 10


class ChatCommand(Params):
    agent: Annotated[str, Cli(positional=True), Field(
        description="the calling agent: attach, detach and config act for it")]
    line: Annotated[str, Cli(positional=True), Field(
        max_length=MAX_LINE,
        description="the command text: /memory SUBCOMMAND ... or !memmesh memory SUBCOMMAND ... "
                    "(/memory help lists them)")]
    session: Annotated[str | None, Field(
        description="the caller's session: attach and detach apply to it (default: every session)")] = None


@command("command", ChatCommand, "run a /memory chat command line for an agent's session")
def run_line(node: "Node", p: ChatCommand, *, events: EventSink) -> Result:
    # Imported here: node/chat.py derives its grammar from the CLI's helpers, which import
    # this package, still being initialised while its handler modules register.
    from memmesh.node import chat

    name, params = chat.parse(p.line, agent=p.agent, session=p.session)
    node.agents.agent(p.agent)  # a line from an agent this node does not have is refused
    if name is None:
        data, text = chat.help_text(params["topic"])
        return Result(data, text)
    chat.check(name, params)
    return REGISTRY.run(node, name, params, events=events)
