"""Agents: agent.new, agent.list."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from memmesh.node.commands.params import Cli, Name, NoParams, Params
from memmesh.node.commands.registry import REGISTRY, command
from memmesh.node.commands.result import Result

if TYPE_CHECKING:
    from memmesh.node.library import Node

REGISTRY.group("agent", "create and list agents")


class AgentNew(Params):
    name: Annotated[Name, Cli(positional=True), Field(description="the new agent's name (1-64 ASCII letters, digits, '.', '_' or '-')")]


@command("agent.new", AgentNew, "create an agent with its own key and database")
def agent_new(node: Node, p: AgentNew) -> Result:
    agent = node.agents.create_agent(p.name)
    data = {"name": agent.name, "id": agent.db.id, "key": str(agent.key.public)}
    return Result(data, f"agent {agent.name} created\n  database {agent.db.id}\n  key {agent.key.public}")


ALL_SESSIONS = "*"  # the key of banks attached for every session, in ``attached``


@command("agent.list", NoParams, "list the agents of this node, their attached banks and auto-recall config",
         read_only=True)
def agent_list(node: Node, p: NoParams) -> Result:
    from memmesh.node.memory.agents import agent_state
    from memmesh.node.settings import memory_defaults

    rows: list[dict[str, Any]] = []
    defaults = memory_defaults(node)
    for r in node.agents.agents():
        state = agent_state(node.database(r.db_id), defaults)
        # session -> bank names, "*" for banks attached to every session
        attached = {ALL_SESSIONS if session is None else session: [node.agents.name_of(d) for d in ids]
                    for session, ids in state.attached.items() if ids}
        rows.append({"name": r.name, "id": r.db_id, "key": str(node.load_key(r.key_name).public),
                     "attached": attached, "default_banks": node.memory.settings.default_banks(r.name),
                     "config": dict(state.config)})
    lines = []
    for row in rows:
        c = row["config"]
        recall = (f"auto-recall on, {c['max_entries']} per store" if c["auto_recall_enabled"] else "auto-recall off")
        if c.get("auto_recall_banks"):
            recall += f", banks {', '.join(c['auto_recall_banks'])}"
        defaults = row["default_banks"]
        banks = "; ".join(f"{'every session' if s == ALL_SESSIONS else 'session ' + s}: "
                          f"{', '.join(n + ' (default)' if n in defaults else n for n in names)}"
                          for s, names in row["attached"].items()) or "no bank attached"
        detached = [n for n in defaults if n not in row["attached"].get(ALL_SESSIONS, [])]
        if detached:
            banks += f"; default banks not attached: {', '.join(detached)} (memmesh reload attaches them)"
        lines.append(f"{row['name']:<20} {row['id']}\n    {recall}; {banks}")
    return Result({"agents": rows}, "\n".join(lines) or "no agents yet (memmesh agent new NAME)")
