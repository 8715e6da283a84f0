"""memory.status: the recall engine of one bank (embedder, vectors, trust tiers, hidden rows)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from memmesh.node.commands.node_status import recall_status
from memmesh.node.commands.params import BankRef, OptionalAgent, Params
from memmesh.node.commands.registry import command
from memmesh.node.commands.result import Result

if TYPE_CHECKING:
    from memmesh.node.library import Node


class MemoryStatus(Params):
    bank: BankRef
    agent: Annotated[OptionalAgent, Field(
        description="count trust tiers as this agent reads them (its own rows are owner); "
                    "default: no reader, every plain row is peer")] = None


@command("memory.status", MemoryStatus, "the recall engine of a bank: embedder, vectors, trust tiers, "
         "flagged, secret and quarantined memories", read_only=True)
def memory_status(node: Node, p: MemoryStatus) -> Result:
    ref = node.agents.resolve(p.bank)
    reader = str(node.agents.agent(p.agent).key.public) if p.agent is not None else None
    data = {"bank": ref.name, "id": ref.db.id, "agent": p.agent, **recall_status(node, ref.db, reader)}
    return Result(data, _text(data))


def _text(d: dict[str, Any]) -> str:
    share = "-" if d["share"] is None else f"{d['share'] * 100:.1f} %"
    tiers = d["tiers"]
    lines = [f"bank {d['bank']}  {d['id']}",
             f"  embedder       {d['embedder'] or 'none (BM25 only)'}",
             f"  memories       {d['memories']}",
             f"  with a vector  {d['with_vectors']} of {d['embeddable']} embeddable ({share})",
             "  trust tiers    " + ", ".join(f"{t} {n}" for t, n in tiers.items())
             + ("" if d["agent"] else "  (no reader: --agent NAME counts its own rows as owner)"),
             f"  flagged        {tiers['flagged']}"
             + (" (" + ", ".join(f"{r} {n}" for r, n in d["flagged_by_rule"].items()) + ")" if d["flagged_by_rule"] else ""),
             f"  secrets        {d['secrets']} (never embedded or auto-recalled)",
             f"  quarantines    {d['quarantines']['active']} active, {d['quarantines']['released']} released"]
    return "\n".join(lines)
