"""forget: the operator's form of the forget tool, ``memmesh forget AGENT KEY [--bank B] [--preview]``.

The same function as the tool (node/commands/tools.py ``_forget``: allowed_tools, then
node/commands/forgetting.py). A chat line runs it too, for the calling agent
(``/memory forget KEY [--bank BANK] [--preview]``). Not routed: the tool route
``POST /v1/agents/{agent}/tools/forget`` is the API's way, as for remember and recall.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from memmesh.node.commands.forgetting import render_forget
from memmesh.node.commands.params import AgentParams
from memmesh.node.commands.registry import command
from memmesh.node.commands.result import Result
from memmesh.node.commands.tools import ForgetArgs, _forget

if TYPE_CHECKING:
    from memmesh.node.library import Node


class Forget(ForgetArgs, AgentParams):
    pass


@command("forget", Forget, "forget a memory on every replica: erase every version of its key and their vectors "
         "(shortcut for the forget tool)", http=None, chat=True, from_caller=("agent",))
def forget(node: Node, p: Forget) -> Result:
    data = _forget(node, node.agents.agent(p.agent), p)
    return Result(data, render_forget(data), list(data.get("warnings", [])))
