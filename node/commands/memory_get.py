"""memory.get: the current memory of exactly one key, ``memmesh memory get AGENT KEY [--bank B]``.

Recall searches: a memory whose words rank below a hundred others is not among its answers,
so reading one key by recalling it (the key as the query) misses it in a big bank. This reads
the key through the view's per-key index instead (node/memory/service.py ``MemoryService.get``),
and answers what recall would show for that memory, or refuses:

* the bank is opened for the agent as recall opens it (Read needed; the same AuthError line),
  and the agent's allowed_tools must include ``recall``: this is recall's capability, narrower;
* the answer is recall's element for one memory (value, tags, time, written_by, entry, bank,
  trust, flagged/secret labels, supersedes/conflicts, access counts), not wrapped;
* "no memory KEY in BANK" (UnknownMemory, HTTP 404 ``not_found``) when recall would not return
  it: no row of the key, forgotten, retired by a supersedes edge or by its valid_to, written by a
  quarantined author, a secret the agent's include_secrets withholds, or a tier the agent weighs
  0. One message for all, as recall's silence tells none of them apart;
* not counted as an access: nothing was recalled (no query, no ranking), and readers that
  browse (MCP resources, a LangGraph store's ``get`` before a ``put``) must not make a memory
  look used.

A chat line runs it for the calling agent (``/memory get KEY [--bank BANK]``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from memmesh.node.commands.params import AgentParams, Cli, OptionalBank
from memmesh.node.commands.registry import command
from memmesh.node.commands.result import Result
from memmesh.node.commands.tools import Key, render_memories
from memmesh.node.memory.forgetting import UnknownMemory
from memmesh.node.settings import check_tool

if TYPE_CHECKING:
    from memmesh.node.library import Node


class MemoryGet(AgentParams):
    key: Annotated[Key, Cli(positional=True), Field(description="the memory's key, exactly as written")]
    bank: OptionalBank = None


@command("memory.get", MemoryGet, "read the current memory of exactly one key, as recall shows it (a bank the "
         "agent can read; not counted as a recall)", read_only=True, from_caller=("agent",))
def memory_get(node: Node, p: MemoryGet) -> Result:
    agent = node.agents.agent(p.agent)
    check_tool(node, agent.name, "recall")
    bank, memory = node.memory.get(agent, p.key, p.bank)
    if memory is None:
        raise UnknownMemory(f"no memory {p.key!r} in {bank}: no current memory of that key that recall shows "
                            f"agent {agent.name} (recall lists what it can read)")
    return Result(memory, render_memories({"memories": [memory]}))
