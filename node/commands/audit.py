"""explain: why an entry (or a refused entry's digest) was accepted or refused."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from memmesh.auth.errors import MemmeshError
from memmesh.crdt.database import Database
from memmesh.node.commands.params import Cli, Params, Ref
from memmesh.node.commands.registry import command
from memmesh.node.commands.result import Result
from memmesh.node.validation_text import worded

if TYPE_CHECKING:
    from memmesh.node.library import Node


class UnknownEntry(MemmeshError):
    """No database asked knows the entry id."""


class AmbiguousEntry(MemmeshError):
    """A short id that starts more than one entry id."""


MIN_PREFIX = 8  # hex digits of a short id: fewer match too much to be worth resolving
MAX_LISTED = 10  # candidates an ambiguous short id lists
# An entry id, or its start as status and refusals print it (sha256:9c1f... or 9c1f…).
SHORT_ID_PATTERN = worded(f"^(?:sha256:)?[0-9a-f]{{{MIN_PREFIX},64}}(?:\\.\\.\\.|…)?$",
                          f"must be an entry id (sha256: and 64 lowercase hex digits) or a start of one of at least "
                          f"{MIN_PREFIX} hex digits")


class Explain(Params):
    entry_id: Annotated[str, Cli(positional=True), Field(
        pattern=SHORT_ID_PATTERN,
        description=f"the entry's id (sha256:...), or a unique start of it of at least {MIN_PREFIX} hex digits "
                    "(as status and refusals print it)")]
    bank: Annotated[Ref | None, Cli(metavar="NAME"), Field(
        description="ask only this bank (a bank name, an agent name or a database id); default: every database")] = None


def knows(db: Database, entry_id: str) -> bool:
    """Whether ``db`` has anything to say about the entry: stored, pending or recently refused."""
    return db.knows(entry_id)


def _prefix(text: str) -> str:
    """A short id as people copy it: ``sha256:9c1f…`` (status's form), with or without ``sha256:``."""
    text = text.strip().removesuffix("…").removesuffix("...")
    return text if ":" in text else f"sha256:{text}"


def resolve(dbs: list[Database], entry_id: str, where: str, hint: str = "") -> tuple[str, Database]:
    """The entry ``entry_id`` names and the first of ``dbs`` that knows it: the id itself, or
    the one id it starts."""
    db = next((d for d in dbs if knows(d, entry_id)), None)
    if db is not None:
        return entry_id, db
    prefix = _prefix(entry_id)
    digits = prefix.partition(":")[2]
    if len(digits) < MIN_PREFIX:
        raise UnknownEntry(f"{entry_id} is not known to {where}; a short id needs at least {MIN_PREFIX} hex "
                           f"digits after sha256:{hint}")
    matches: dict[str, Database] = {}
    for d in dbs:
        for found in sorted(d.ids_starting(prefix)):
            matches.setdefault(found, d)
    if not matches:
        raise UnknownEntry(f"{entry_id} is not known to {where}{hint}")
    if len(matches) > 1:
        listed = ", ".join(sorted(matches)[:MAX_LISTED])
        more = f" and {len(matches) - MAX_LISTED} more" if len(matches) > MAX_LISTED else ""
        raise AmbiguousEntry(f"{entry_id} starts {len(matches)} entry ids: {listed}{more}; give more of the id")
    (full, db), = matches.items()
    return full, db


@command("explain", Explain, "explain why an entry was accepted or refused")
def explain(node: Node, p: Explain) -> Result:
    if p.bank is not None:
        ref = node.agents.resolve(p.bank)
        entry_id, db = resolve([ref.db], p.entry_id, ref.name, "; without --bank every database of this node is asked")
    else:
        entry_id, db = resolve([node.database(i) for i in node.database_ids()], p.entry_id,
                               "any database of this node")
    text = db.explain(entry_id)
    name = node.agents.name_of(db.id)
    return Result({"entry": entry_id, "database": db.id, "name": name, "explanation": text},
                  f"in {name} ({db.id}):\n{text}")
