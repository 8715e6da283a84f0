"""Memory banks: memory.new, list, delete, grant, revoke, attach, detach."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

from node.commands.params import AgentName, BankRef, Cli, NoParams, Params
from node.commands.registry import REGISTRY, command
from node.commands.result import Result
from node.memory.service import perm_name

if TYPE_CHECKING:
    from node.library import Node

REGISTRY.group("memory", "memory banks: new, list, delete, grant, revoke, attach, detach, config, reindex, stats")


class MemoryNew(Params):
    name: Annotated[str, Cli(positional=True), Field(description="the bank's name (1-64 letters, digits, '.', '_' or '-')")]
    description: Annotated[str, Cli(positional=True), Field(description="what the bank is for")] = ""


@command("memory.new", MemoryNew, "create a bank")
def memory_new(node: "Node", p: MemoryNew) -> Result:
    bank = node.agents.create_bank(p.name, p.description)
    return Result({"name": p.name, "id": bank.db.id, "description": p.description},
                  f"bank {p.name} created\n  database {bank.db.id}")


@command("memory.list", NoParams, "list banks", read_only=True)
def memory_list(node: "Node", p: NoParams) -> Result:
    rows = []
    for rec in node.registry.banks():
        db = node.database(rec.db_id)
        holders = [{"key": k, "permission": perm_name(st.permission)} for k, st in db.settings().items()
                   if st.status == "active"]
        rows.append({"name": rec.name, "id": rec.db_id, "description": rec.description,
                     "memories": len(node.memory.view(db)), "keys": holders})
    archived = [{"name": r.name, "id": r.db_id} for r in node.registry.archived_banks()]
    lines = [f"{r['name']:<20} {r['memories']:>6} memories  {r['id']}" + (f"  {r['description']}" if r["description"] else "")
             for r in rows] or ["no banks yet (memmesh memory new NAME)"]
    if archived:
        lines.append("archived (deleted, data kept):")
        lines += [f"  {a['name']:<18} {a['id']}" for a in archived]
    return Result({"banks": rows, "archived": archived}, "\n".join(lines))


class MemoryDelete(Params):
    ref: Annotated[str, Cli(positional=True), Field(description="the bank's name or database id")]


@command("memory.delete", MemoryDelete, "unregister a bank (its data is kept as an archive)")
def memory_delete(node: "Node", p: MemoryDelete) -> Result:
    rec = node.agents.delete_bank(p.ref)
    return Result({"name": rec.name, "id": rec.db_id, "archived": True},
                  f"bank {rec.name} unregistered; its database {rec.db_id} is kept as an archive")


class MemoryRevoke(Params):
    bank: BankRef
    agent: AgentName


class MemoryGrant(MemoryRevoke):
    perm: Annotated[Literal["read", "write"], Cli(positional=True), Field(description="what the agent may do")]


@command("memory.grant", MemoryGrant, "let an agent read or write a bank (or another agent's database)")
def memory_grant(node: "Node", p: MemoryGrant) -> Result:
    ref, ag = node.agents.grant(p.bank, p.agent, p.perm)
    return Result({"bank": ref.name, "id": ref.db.id, "agent": ag.name, "permission": p.perm},
                  f"granted {p.perm} on {ref.name} to {ag.name}")


@command("memory.revoke", MemoryRevoke, "revoke an agent's access to a bank")
def memory_revoke(node: "Node", p: MemoryRevoke) -> Result:
    ref, ag, warning = node.agents.revoke(p.bank, p.agent)
    return Result({"bank": ref.name, "id": ref.db.id, "agent": ag.name, "revoked": True},
                  f"revoked {ag.name} on {ref.name}", [warning] if warning else [])


class MemoryAttach(Params):
    bank: BankRef
    agent: Annotated[str, Field(description="the agent whose auto-recall searches the bank")]
    session: Annotated[str | None, Field(description="only in this session; default: every session")] = None


def _attach(node: "Node", p: MemoryAttach, attach: bool) -> Result:
    ag = node.agents.agent(p.agent)
    ref = node.agents.resolve(p.bank)
    node.agents.write_config(ag, {"attach" if attach else "detach": ref.db.id, "session": p.session})
    where = f"session {p.session}" if p.session else "every session"
    verb = "attached to" if attach else "detached from"
    return Result({"bank": ref.name, "id": ref.db.id, "agent": ag.name, "session": p.session, "attached": attach},
                  f"{ref.name} {verb} {ag.name} ({where})")


@command("memory.attach", MemoryAttach, "attach a bank for an agent's auto-recall")
def memory_attach(node: "Node", p: MemoryAttach) -> Result:
    return _attach(node, p, attach=True)


@command("memory.detach", MemoryAttach, "detach a bank for an agent's auto-recall")
def memory_detach(node: "Node", p: MemoryAttach) -> Result:
    return _attach(node, p, attach=False)
