"""memory.entities: what the memories of one bank are about, with how many of them each."""
from __future__ import annotations

from typing import TYPE_CHECKING

from memmesh.crdt.clock import now_ms
from memmesh.node.commands.params import BankRef, Params
from memmesh.node.commands.registry import command
from memmesh.node.commands.result import Result

if TYPE_CHECKING:
    from memmesh.node.library import Node


class MemoryEntities(Params):
    bank: BankRef


@command("memory.entities", MemoryEntities, "the entities a bank's current memories are about, with how many "
         "memories each (recall --entity filters by them; the neighbors tool can start from one)", read_only=True)
def memory_entities(node: Node, p: MemoryEntities) -> Result:
    ref = node.agents.resolve(p.bank)
    # Secrets, quarantined rows and rows whose valid_to has passed are not counted: a listing
    # must not tell what recall hides.
    counted = node.memory.view(ref.db).entities(include_secrets=False, now=now_ms())
    data = {"bank": ref.name, "id": ref.db.id, "entities": [{"entity": e, "count": n} for e, n in counted]}
    if not counted:
        return Result(data, f"no memory of {ref.name} names an entity")
    width = len(str(counted[0][1]))
    return Result(data, "\n".join(f"{n:>{width}}  {e}" for e, n in counted))
