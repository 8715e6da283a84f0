"""unfence: lift a database's write fence by hand (node/fence.py says what a fence is).

A fence lifts by itself once a sync brings back what this node's keys signed; by hand is for a
database no peer holds any more (or never did), when waiting would be for nothing. The operator
then takes on what the fence guarded against, and the answer says so.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from memmesh.node import fence
from memmesh.node.commands.params import Cli, Params, Ref
from memmesh.node.commands.registry import command
from memmesh.node.commands.result import Result

if TYPE_CHECKING:
    from memmesh.node.library import Node


class Unfence(Params):
    db: Annotated[Ref, Cli(positional=True, metavar="DB_OR_NAME"), Field(
        description="a bank name, an agent name (its own database) or a database id")]


@command("unfence", Unfence, "lift a database's write fence (set by restore and check --repair) by hand, before a "
                             "sync brought back what this node's keys wrote")
def unfence(node: Node, p: Unfence) -> Result:
    db_id = p.db if p.db in node.database_ids() else node.agents.resolve(p.db).db.id
    name = fence.registered_name(node, db_id)
    lifted = fence.lift(node.storage, db_id)
    if lifted is None:
        return Result({"db": db_id, "name": name, "was_fenced": False, "fence": None},
                      f"{name} is not fenced; nothing changed")
    return Result({"db": db_id, "name": name, "was_fenced": True, "fence": lifted.as_dict()},
                  f"lifted the write fence on {name} ({fence.why(lifted)}); its agents write again from now on. "
                  "If a peer still holds entries this node's keys signed that this node lacks, their next write "
                  "signs a second entry at a feed position already used, and every peer then flags the key for "
                  f"equivocation: it can never write to {name} again")
