"""memory.reindex: backfill vectors for the active embedder, reporting progress as events."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from memmesh.node.commands.params import Cli, Params, Ref
from memmesh.node.commands.registry import EventSink, command
from memmesh.node.commands.result import Result

if TYPE_CHECKING:
    from memmesh.node.library import Node


class MemoryReindex(Params):
    bank: Annotated[Ref | None, Cli(positional=True), Field(
        description="a bank name, an agent name or a database id; default: every bank and agent")] = None


@command("memory.reindex", MemoryReindex, "backfill vectors for the active embedder")
def memory_reindex(node: Node, p: MemoryReindex, *, events: EventSink) -> Result:
    """Events: ``{"event": "progress", "bank": name, "done": n, "total": m}`` after each batch."""
    if p.bank is None:
        names = [r.name for r in node.registry.banks()] + [r.name for r in node.agents.agents()]
        targets = [node.agents.resolve(name) for name in names]
    else:
        targets = [node.agents.resolve(p.bank)]
    done = []
    for ref in targets:
        def progress(n: int, total: int, bank: str = ref.name) -> None:
            events({"event": "progress", "bank": bank, "done": n, "total": total})

        def key_of(_db: Any, key: Any = ref.admin_key) -> Any:  # every row of the bank is signed with its admin key
            return key

        result = node.memory.reindex(ref.db, key_of, progress=progress)
        done.append({"bank": ref.name, **result})
    total = sum(d["embedded"] for d in done)
    return Result({"reindexed": done, "embedded": total},
                  f"embedded {total} memories" + "".join(f"\n  {d['bank']}: {d['embedded']}" for d in done))
