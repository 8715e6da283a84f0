"""explain: why an entry (or a refused entry's digest) was accepted or refused."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from memmesh.auth.errors import MemmeshError
from memmesh.crdt.database import Database
from memmesh.node.commands.params import Cli, Params
from memmesh.node.commands.registry import command
from memmesh.node.commands.result import Result

if TYPE_CHECKING:
    from memmesh.node.library import Node


class UnknownEntry(MemmeshError):
    """No database asked knows the entry id."""


class Explain(Params):
    entry_id: Annotated[str, Cli(positional=True), Field(description="the entry's id (sha256:...)")]
    bank: Annotated[str | None, Cli(metavar="NAME"), Field(
        description="ask only this bank (a bank name, an agent name or a database id); default: every database")] = None


def knows(db: Database, entry_id: str) -> bool:
    """Whether ``db`` has anything to say about the entry: stored, pending or recently refused."""
    return db.knows(entry_id)


@command("explain", Explain, "explain why an entry was accepted or refused")
def explain(node: Node, p: Explain) -> Result:
    if p.bank is not None:
        ref = node.agents.resolve(p.bank)
        if not knows(ref.db, p.entry_id):
            raise UnknownEntry(f"{p.entry_id} is not known to {ref.name}; "
                               "without --bank every database of this node is asked")
        db = ref.db
    else:
        found = next((d for d in map(node.database, node.database_ids()) if knows(d, p.entry_id)), None)
        if found is None:
            raise UnknownEntry(f"{p.entry_id} is not known to any database of this node")
        db = found
    text = db.explain(p.entry_id)
    name = node.agents.name_of(db.id)
    return Result({"entry": p.entry_id, "database": db.id, "name": name, "explanation": text},
                  f"in {name} ({db.id}):\n{text}")
