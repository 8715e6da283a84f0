"""Quarantine of a writer: memory.quarantine, memory.release, memory.quarantines.

The rows and the rules that decide which of them count are node/memory/quarantine.py; here,
what an operator asks for, refused before anything is written when the fold would not count
it (so a refused command never leaves an ignored row in the log).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import ConfigDict, Field

from memmesh.auth.errors import AuthError, MemmeshError
from memmesh.auth.keys import SigningKey
from memmesh.auth.ops import check_key
from memmesh.auth.permissions import ADMIN, TARGET_STRONGER, Permission, may_change
from memmesh.node.commands.params import BankRef, Cli, EntryId, OptionalAgent, Params, ParamsError, Who
from memmesh.node.commands.registry import command
from memmesh.node.commands.result import Result
from memmesh.node.commands.tools import WorldTime
from memmesh.node.memory.input_error import MemoryInputError
from memmesh.node.memory.quarantine import (
    QUARANTINE_STORE,
    Quarantine,
    hides,
    quarantine_value,
    quarantines,
    release_value,
)
from memmesh.node.memory.rows import Memory, check_time, iso_utc, parse_memory
from memmesh.node.registry import UnknownName

if TYPE_CHECKING:
    from memmesh.crdt.database import Database
    from memmesh.node.library import Node
    from memmesh.node.memory.agents import BankRef as Bank


class UnknownQuarantine(UnknownName):
    """A quarantine id that names no quarantine that counts in the bank."""


class AlreadyReleased(MemmeshError):
    """A release of a quarantine that a release already ended."""


Signer = Annotated[OptionalAgent, Cli(flag="--as", metavar="AGENT"), Field(
    alias="as", description="sign with this agent's key; default: this node's strongest admin key for the bank")]


class MemoryQuarantine(Params):
    model_config = ConfigDict(populate_by_name=True)

    bank: BankRef
    who: Annotated[Who, Cli(positional=True, metavar="KEY_OR_AGENT"), Field(
        description="the writer: its public key (ed25519:..., as recall shows it in written_by) "
                                  "or the name of an agent of this node")]
    from_: Annotated[WorldTime, Cli(flag="--from"), Field(
        alias="from", description="ISO 8601: hide rows signed at or after this time; default: from the first")] = None
    to: Annotated[WorldTime, Field(
        description="ISO 8601: hide rows signed before this time (exclusive); default: no end")] = None
    preview: Annotated[bool, Field(description="count what would be hidden and write nothing")] = False
    as_: Signer = None


class MemoryRelease(Params):
    model_config = ConfigDict(populate_by_name=True)

    bank: BankRef
    quarantine: Annotated[EntryId, Cli(positional=True, metavar="QUARANTINE_ID"), Field(
        description="the quarantine's id (sha256:..., as memory quarantines lists it)")]
    as_: Signer = None


class MemoryQuarantines(Params):
    bank: BankRef


# ---------------------------------------------------------------------------------- helpers
def _names(node: Node) -> dict[str, str]:
    """Public key -> the name this node knows it by."""
    names = {str(node.load_key(r.key_name).public): r.name for r in node.agents.agents()}
    for bank in node.registry.banks():
        names.setdefault(str(node.load_key(bank.key_name).public), f"bank {bank.name}")
    names.setdefault(str(node.peer_key.public), "this node")
    return names


def _agent_key(node: Node, name: str, role: str) -> SigningKey:
    if node.registry.agent(name) is None:
        known = ", ".join(r.name for r in node.agents.agents()) or "none"
        hint = (" name the writer by its public key (ed25519:..., the written_by of its memories) instead"
                if role == "who" else "")
        raise UnknownName(f"no agent named {name!r} on this node (agents: {known});{hint or ' agent list shows them'}")
    return node.agents.agent(name).key


def _target(node: Node, who: str) -> str:
    if who.startswith("ed25519:"):
        try:
            return check_key(who)
        except AuthError:
            raise ParamsError(f"memory.quarantine: {who!r} is not a public key (ed25519: and 43 base64url "
                              "characters)") from None
    return str(_agent_key(node, who, "who").public)


def _signer(node: Node, bank: Bank, agent: str | None) -> SigningKey:
    # The key grant and revoke change settings with (Agents.resolve: the bank's own key when
    # this node created it, the peer key when it imported it), unless --as names an agent.
    return bank.admin_key if agent is None else _agent_key(node, agent, "as")


def _who(key: str, names: dict[str, str]) -> str:
    return f"{names[key]} ({key})" if key in names else key


def _perm(p: Permission | None) -> str:
    return "no permission" if p is None else str(p)


def _admin(db: Database, key: str, bank: str, names: dict[str, str], doing: str) -> Permission:
    """The Admin permission ``key`` holds on the bank now (what a new entry's past gives it)."""
    held = db.settings().permission(key)
    if held is None or held.level != ADMIN:
        raise AuthError("auth.not_admin",
                        f"{_who(key, names)} holds {_perm(held)} on {bank}, and {doing} needs admin on the bank: "
                        f"sign with an admin's key (--as AGENT), import a ticket shared with --perm admin, or ask "
                        "an admin of the bank")
    return held


def _rows(node: Node, db: Database) -> list[tuple[Memory, bool]]:
    """Every well-formed memory row of the bank, and whether it is its key's current row (as the
    view decides; hidden rows included: the view lists them)."""
    current = {(m.entry_id, m.row_key) for m in node.memory.view(db).memories()}
    out = []
    for rec in db.rows("memory"):
        m = parse_memory(rec)
        if m is not None:
            out.append((m, (m.entry_id, m.row_key) in current))
    return out


def _counts(rows: list[tuple[Memory, bool]], q: Quarantine, qs: list[Quarantine]) -> dict[str, Any]:
    """The memory rows ``q`` covers: current ones and all, and how many of them another active
    quarantine already hides."""
    others = [o for o in qs if o.active and o.id != q.id]
    out: dict[str, Any] = {"current": 0, "rows": 0, "already_hidden": {"current": 0, "rows": 0}}
    for m, is_current in rows:
        if not q.covers(m.author, m.ts):
            continue
        already = hides(others, m.author, m.ts)
        out["rows"] += 1
        out["current"] += is_current
        out["already_hidden"]["rows"] += already
        out["already_hidden"]["current"] += already and is_current
    return out


def _range(q: Quarantine) -> dict[str, str | None]:
    return {"from": None if q.start is None else iso_utc(q.start), "to": None if q.end is None else iso_utc(q.end)}


def _range_text(q: Quarantine) -> str:
    r = _range(q)
    parts = [f"from {r['from']}" if r["from"] else "", f"before {r['to']}" if r["to"] else ""]
    return "rows signed " + " ".join(p for p in parts if p) if any(parts) else "every row"


def _hides_text(c: dict[str, Any]) -> str:
    already = c["already_hidden"]
    more = f" ({already['rows']} of them already hidden by another quarantine)" if already["rows"] else ""
    return f"{c['current']} current memor{'y' if c['current'] == 1 else 'ies'}, {c['rows']} row{'' if c['rows'] == 1 else 's'}{more}"


def _find(db: Database, bank: str, quarantine_id: str) -> tuple[Quarantine, list[Quarantine]]:
    qs = quarantines(db)
    q = next((x for x in qs if x.id == quarantine_id), None)
    if q is None:
        raise UnknownQuarantine(f"no quarantine {quarantine_id} in bank {bank} (memmesh memory quarantines {bank} "
                                "lists them; a row whose signer may not quarantine that key is not one)")
    return q, qs


# ---------------------------------------------------------------------------------- commands
@command("memory.quarantine", MemoryQuarantine,
         "hide a writer's memory rows (a signed entry; --preview counts them and writes nothing)")
def memory_quarantine(node: Node, p: MemoryQuarantine) -> Result:
    bank = node.agents.resolve(p.bank)
    db = bank.db
    key = _target(node, p.who)
    start = None if p.from_ is None else check_time("from", p.from_)
    end = None if p.to is None else check_time("to", p.to)
    if start is not None and end is not None and start >= end:
        # The schema cannot compare two fields: a refusal for what they mean (422, docs/api.md).
        raise MemoryInputError(f"memory.quarantine: from ({p.from_}) must be before to ({p.to}); "
                               "the range would hide nothing")
    signer = _signer(node, bank, p.as_)
    by = str(signer.public)
    names = _names(node)
    actor = _admin(db, by, bank.name, names, "quarantining a writer")
    target = db.settings().permission(key)
    if may_change(actor, target, None) == TARGET_STRONGER:
        raise AuthError(TARGET_STRONGER,
                        f"{_who(key, names)} holds {target} on {bank.name}, stronger than the signer's {actor} "
                        f"({_who(by, names)}): nobody quarantines a key holding a stronger priority (the rule "
                        "revoke follows); sign with an admin key at least as strong (--as AGENT)")
    value = quarantine_value(key, start, end)
    qs = quarantines(db)
    planned = Quarantine("", key, start, end, by, 0)
    counts = _counts(_rows(node, db), planned, qs)
    data: dict[str, Any] = {"bank": bank.name, "id": None, "key": key, "name": names.get(key), "by": by,
                            "by_name": names.get(by), **_range(planned), "preview": p.preview, "hides": counts}
    if p.preview:
        return Result(data, f"preview: quarantining {_who(key, names)} on {bank.name} ({_range_text(planned)}) "
                            f"would hide {_hides_text(counts)}; nothing was written")
    txn = db.transaction(signer)
    txn.append(QUARANTINE_STORE, value)
    entry = txn.commit()
    if not any(q.id == entry for q in quarantines(db)):  # the checks above are the fold's rules
        raise MemmeshError(f"the quarantine entry {entry} was stored but does not count; memmesh explain {entry}")
    data["id"] = entry
    return Result(data, f"quarantined {_who(key, names)} on {bank.name} ({_range_text(planned)}): "
                        f"{_hides_text(counts)} hidden\n  id {entry}")


@command("memory.release", MemoryRelease, "end a quarantine: what it hid is recalled again")
def memory_release(node: Node, p: MemoryRelease) -> Result:
    bank = node.agents.resolve(p.bank)
    db = bank.db
    q, qs = _find(db, bank.name, p.quarantine)
    if not q.active:
        when = iso_utc(q.released_ts) if q.released_ts is not None else "?"
        raise AlreadyReleased(f"quarantine {q.id} was already released (entry {q.released_by}, {when})")
    signer = _signer(node, bank, p.as_)
    by = str(signer.public)
    names = _names(node)
    actor = _admin(db, by, bank.name, names, "releasing a quarantine")
    past = db.settings_at(q.id)
    quarantiner = past.permission(q.by) if past is not None else None
    assert quarantiner is not None and quarantiner.priority is not None  # it counts: an admin signed it
    if (actor.priority or 0) > quarantiner.priority:
        raise AuthError(TARGET_STRONGER,
                        f"the quarantine was signed by {_who(q.by, names)} holding {quarantiner}, stronger than the "
                        f"signer's {actor} ({_who(by, names)}): a release needs an admin at least as strong as "
                        "whoever quarantined (--as AGENT)")
    counts = _counts(_rows(node, db), q, qs)
    txn = db.transaction(signer)
    txn.append(QUARANTINE_STORE, release_value(q.id))
    entry = txn.commit()
    if next((x for x in quarantines(db) if x.id == q.id), q).released_by != entry:
        raise MemmeshError(f"the release entry {entry} was stored but does not count; memmesh explain {entry}")
    return Result({"bank": bank.name, "id": q.id, "key": q.key, "name": names.get(q.key), "released_by": entry,
                   "by": by, "by_name": names.get(by), "restores": counts},
                  f"released quarantine {q.id} of {_who(q.key, names)} on {bank.name}: "
                  f"{_hides_text(counts)} shown again")


@command("memory.quarantines", MemoryQuarantines, "list a bank's quarantines: who, by whom, when, counts, release",
         read_only=True)
def memory_quarantines(node: Node, p: MemoryQuarantines) -> Result:
    bank = node.agents.resolve(p.bank)
    db = bank.db
    names = _names(node)
    qs = quarantines(db)
    memories = _rows(node, db) if qs else []
    rows = []
    lines = []
    for q in qs:
        released = None
        if q.released_by is not None:
            rel = db.entry(q.released_by)
            rel_by = rel.author_key if rel is not None else None
            released = {"entry": q.released_by, "by": rel_by, "by_name": names.get(rel_by or ""),
                        "when": None if q.released_ts is None else iso_utc(q.released_ts)}
        counts = _counts(memories, q, qs)
        rows.append({"id": q.id, "key": q.key, "name": names.get(q.key), "by": q.by, "by_name": names.get(q.by),
                     "when": iso_utc(q.ts), **_range(q), "active": q.active, "hides": counts, "released": released})
        state = ("released by " + _who(released["by"] or "?", names) + f" at {released['when']}" if released
                 else f"hides {_hides_text(counts)}")
        lines.append(f"{q.id}\n  {_who(q.key, names)}, {_range_text(q)}\n  by {_who(q.by, names)} at "
                     f"{iso_utc(q.ts)}; {state}")
    return Result({"bank": bank.name, "quarantines": rows}, "\n".join(lines) or f"no quarantines in {bank.name}")
