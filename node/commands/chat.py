"""command: run one `/memory ...` chat command line for an agent's session (chat_grammar.py parses it)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from memmesh.node.commands import chat_grammar
from memmesh.node.commands.params import Cli, Name, Params, Session
from memmesh.node.commands.registry import REGISTRY, EventSink, command
from memmesh.node.commands.result import Result

if TYPE_CHECKING:
    from memmesh.node.library import Node


# A chat line names a bank, a key, a few words of description: 16 KiB is far above any of
# them, and shlex's cost grows with the square of a word's length (900 KB took 8 s of the
# database thread, on which commands run).
MAX_LINE = 16 << 10


class ChatCommand(Params):
    agent: Annotated[Name, Cli(positional=True), Field(
        description="the calling agent: attach, detach and config act for it")]
    line: Annotated[str, Cli(positional=True), Field(
        max_length=MAX_LINE,
        description="the command text: /memory SUBCOMMAND ... or !memmesh memory SUBCOMMAND ... "
                    "(/memory help lists them)")]
    session: Annotated[Session | None, Field(
        description="the caller's session: attach and detach apply to it (default: every session)")] = None


@command("command", ChatCommand, "run a /memory chat command line for an agent's session",
         http=("POST", "/v1/agents/{agent}/command"))
def run_line(node: Node, p: ChatCommand, *, events: EventSink) -> Result:
    name, params = chat_grammar.parse(p.line, agent=p.agent, session=p.session)
    node.agents.agent(p.agent)  # a line from an agent this node does not have is refused
    if name is None:
        data, text = chat_grammar.help_text(params["topic"])
        return Result(data, text)
    parsed = chat_grammar.check(name, params)  # the one validation: the chat wording, the usage line
    return REGISTRY.execute(node, REGISTRY.get(name), parsed, events)
