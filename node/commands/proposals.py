"""Auto-capture's proposals: memory.proposals, memory.accept, memory.drop.

The extractor is node/memory/capture.py and the store node/memory/proposals.py; history.add
hands every user turn to it. Here, what the user decides: accept turns an open proposal into a
normal memory of the agent (``source: derived``, through the memory service's remember, so dedup,
supersession and the vector are the same as for any memory), drop records that it is not
wanted. Both are signed rows of the agent's ``proposals`` store; an id that is not an open
proposal is refused with one line and nothing is written.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from memmesh.node.commands.params import AgentParams, Cli
from memmesh.node.commands.registry import command
from memmesh.node.commands.result import Result
from memmesh.node.memory.labels import DERIVED_SOURCE
from memmesh.node.memory.proposals import (
    CAPTURE_TAG,
    CATEGORY,
    PROPOSALS_STORE,
    Pending,
    decision_value,
    open_proposals,
    proposals,
)
from memmesh.node.registry import UnknownName

if TYPE_CHECKING:
    from memmesh.node.library import Node
    from memmesh.node.memory.agents import Agent


class UnknownProposal(UnknownName):
    """An id that names no open proposal of the agent."""


ProposalId = Annotated[str, Cli(positional=True, metavar="ID"), Field(
    pattern=r"^prop:[0-9a-f]{16}$", description="the proposal's id (prop: and 16 hex digits, as memory proposals "
                                                 "lists it)")]


class MemoryProposals(AgentParams):
    all: Annotated[bool, Field(description="also list accepted and dropped proposals")] = False


class MemoryDecide(AgentParams):
    id: ProposalId


def _line(p: Pending) -> str:
    state = "" if p.state == "open" else f"  [{p.state}]"
    return f"{p.id}  {p.key} = {p.value}  ({p.rule}){state}\n    from: {p.sentence}"


def _open(ag: Agent, pid: str) -> Pending:
    p = proposals(ag.db).get(pid)
    if p is None:
        raise UnknownProposal(f"no proposal {pid} for {ag.name} (memmesh memory proposals {ag.name} lists them)")
    if p.state != "open":
        entry = f" (memory entry {p.entry})" if p.entry else ""
        raise UnknownProposal(f"proposal {pid} of {ag.name} was already {p.state}{entry}; only open proposals "
                              "can be accepted or dropped")
    return p


# ---------------------------------------------------------------------------------- commands
@command("memory.proposals", MemoryProposals, "list the memories auto-capture proposed from what the user said",
         read_only=True, from_caller=("agent",))
def memory_proposals(node: Node, p: MemoryProposals) -> Result:
    ag = node.agents.agent(p.agent)
    items = list(proposals(ag.db).values()) if p.all else open_proposals(ag.db)
    data: dict[str, Any] = {"agent": ag.name, "proposals": [i.to_dict() for i in items], "count": len(items)}
    if not items:
        return Result(data, f"no {'' if p.all else 'open '}proposals for {ag.name}")
    head = f"{len(items)} {'' if p.all else 'open '}proposal{'' if len(items) == 1 else 's'} for {ag.name} " \
           f"(memmesh memory accept|drop {ag.name} ID):"
    return Result(data, "\n".join([head, *(_line(i) for i in items)]))


@command("memory.accept", MemoryDecide, "save a proposed memory (source derived)", from_caller=("agent",))
def memory_accept(node: Node, p: MemoryDecide) -> Result:
    ag = node.agents.agent(p.agent)
    prop = _open(ag, p.id)
    saved = node.memory.remember(ag, prop.key, prop.value, [CAPTURE_TAG], source=DERIVED_SOURCE,
                                 category=CATEGORY.get(prop.rule, "fact"))
    txn = ag.db.transaction(ag.key)
    txn.append(PROPOSALS_STORE, decision_value("accept", prop.id, saved["entry"]))
    txn.commit()
    data = {"agent": ag.name, "id": prop.id, "key": prop.key, "value": prop.value, "memory": saved}
    duplicate = saved.get("duplicate")
    if duplicate is not None:  # the same fact under another key: the memory that holds it is the answer
        how = f"already remembered as {duplicate['key']} (nothing new written)"
    elif saved.get("deduplicated"):
        how = "already remembered (nothing new written)"
    else:
        how = f"entry {saved['entry']}"
    return Result(data, f"accepted {prop.id}: {prop.key} = {prop.value} ({how})", list(saved.get("warnings", [])))


@command("memory.drop", MemoryDecide, "drop a proposed memory (the same fact is not proposed again)",
         from_caller=("agent",))
def memory_drop(node: Node, p: MemoryDecide) -> Result:
    ag = node.agents.agent(p.agent)
    prop = _open(ag, p.id)
    txn = ag.db.transaction(ag.key)
    txn.append(PROPOSALS_STORE, decision_value("drop", prop.id))
    entry = txn.commit()
    return Result({"agent": ag.name, "id": prop.id, "key": prop.key, "entry": entry},
                  f"dropped {prop.id}: {prop.key} = {prop.value}")
