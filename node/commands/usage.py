"""memory.stats: which memories of a bank this node uses most and least (access counts)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from memmesh.node.commands.params import BankRef, Params
from memmesh.node.commands.registry import command
from memmesh.node.commands.result import Result
from memmesh.node.memory.access import NEVER

if TYPE_CHECKING:
    from memmesh.node.library import Node


class MemoryStats(Params):
    bank: BankRef
    limit: Annotated[int, Field(ge=1, le=100, description="how many memories in each list")] = 10


@command("memory.stats", MemoryStats, "the most and least used memories of a bank (access counts on this node)",
         read_only=True)
def memory_stats(node: Node, p: MemoryStats) -> Result:
    ref = node.agents.resolve(p.bank)
    counts = node.memory.access.of_database(ref.db.id)
    # Current memories only: a key's count follows the key, whichever row is current now.
    rows = [{"key": m.key, **counts.get(m.key, NEVER).fields()} for m in node.memory.view(ref.db).memories()]
    used = [r for r in rows if r["access_count"] > 0]
    # ISO times in one format compare as strings; ties end on the key, so the order is total.
    most = sorted(used, key=lambda r: (-r["access_count"], _desc(r["last_access"]), r["key"]))[:p.limit]
    least = sorted(rows, key=lambda r: (r["access_count"], r["last_access"] or "", r["key"]))[:p.limit]
    data = {"bank": ref.name, "id": ref.db.id, "memories": len(rows), "used": len(used),
            "most_used": most, "least_used": least}
    return Result(data, _text(data))


def _desc(text: str | None) -> tuple[int, ...]:
    """A key that sorts ISO times newest first."""
    return tuple(-ord(c) for c in text or "")


def _text(data: dict[str, Any]) -> str:
    lines = [f"{data['bank']}: {data['memories']} memories, {data['used']} used on this node"]
    for title in ("most_used", "least_used"):
        if data[title]:
            lines.append(title.replace("_", " ") + ":")
            lines += [f"  {r['access_count']:>6}  {r['key']}  ({_detail(r)})" for r in data[title]]
    return "\n".join(lines)


def _detail(r: dict[str, Any]) -> str:
    if r["last_access"] is None:
        return "never"
    return f"{r['recalls']} recalls, {r['injections']} auto-recalls, last {r['last_access']}"
