"""Agents: agent.new, agent.list."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from node.commands.params import Cli, NoParams, Params
from node.commands.registry import REGISTRY, command
from node.commands.result import Result

if TYPE_CHECKING:
    from node.library import Node

REGISTRY.group("agent", "create and list agents")


class AgentNew(Params):
    name: Annotated[str, Cli(positional=True), Field(description="the new agent's name (1-64 letters, digits, '.', '_' or '-')")]


@command("agent.new", AgentNew, "create an agent with its own key and database")
def agent_new(node: "Node", p: AgentNew) -> Result:
    agent = node.agents.create_agent(p.name)
    data = {"name": agent.name, "id": agent.db.id, "key": str(agent.key.public)}
    return Result(data, f"agent {agent.name} created\n  database {agent.db.id}\n  key {agent.key.public}")


@command("agent.list", NoParams, "list the agents of this node", read_only=True)
def agent_list(node: "Node", p: NoParams) -> Result:
    rows = [{"name": r.name, "id": r.db_id, "key": str(node.load_key(r.key_name).public)}
            for r in node.agents.agents()]
    text = "\n".join(f"{r['name']:<20} {r['id']}" for r in rows) or "no agents yet (memmesh agent new NAME)"
    return Result({"agents": rows}, text)
