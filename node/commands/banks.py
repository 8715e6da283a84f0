"""Memory banks: memory.new, list, delete, grant, grants, revoke, attach, detach."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from memmesh.auth.errors import AuthError
from memmesh.node.commands.params import BankRef, Cli, Name, NoParams, Params, Ref, Session, Who
from memmesh.node.commands.registry import REGISTRY, command
from memmesh.node.commands.result import Result
from memmesh.node.memory.agents import Change, Grantee, NotGranted
from memmesh.node.memory.holders import Directory, grantee
from memmesh.node.memory.service import perm_name

if TYPE_CHECKING:
    from memmesh.node.library import Node
    from memmesh.node.memory.agents import BankRef as Bank

REGISTRY.group("memory", "memory banks: {actions}")


class MemoryNew(Params):
    name: Annotated[Name, Cli(positional=True), Field(description="the bank's name (1-64 ASCII letters, digits, '.', '_' or '-')")]
    description: Annotated[str, Cli(positional=True), Field(description="what the bank is for")] = ""


@command("memory.new", MemoryNew, "create a bank")
def memory_new(node: Node, p: MemoryNew) -> Result:
    bank = node.agents.create_bank(p.name, p.description)
    return Result({"name": p.name, "id": bank.db.id, "description": p.description},
                  f"bank {p.name} created\n  database {bank.db.id}")


@command("memory.list", NoParams, "list banks", read_only=True)
def memory_list(node: Node, p: NoParams) -> Result:
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
    ref: Annotated[Ref, Cli(positional=True), Field(description="the bank's name or database id")]


@command("memory.delete", MemoryDelete, "unregister a bank (its data is kept as an archive)")
def memory_delete(node: Node, p: MemoryDelete) -> Result:
    from memmesh.node.sync.sharing import end_invites  # an invite of a deleted bank must never import it
    # Invites end first: should that fail, the bank is still registered and the command can be
    # run again (the other way round, a retry would find no bank and the invites would live on).
    end_invites(node, node.agents.resolve(p.ref).db.id, "deleted")
    rec = node.agents.delete_bank(p.ref)
    return Result({"name": rec.name, "id": rec.db_id, "archived": True},
                  f"bank {rec.name} unregistered; its database {rec.db_id} is kept as an archive")


# The field keeps its name `agent` (every transport has sent it so); it takes any key now.
Holder = Annotated[Who, Cli(positional=True, metavar="who"), Field(
    description="a local agent's name, a key (ed25519:...) or a label that memory grants shows "
                              "(node:self, bank:root, peer:mm-..., invite:..., agent:NAME, key:...)")]


class MemoryRevoke(Params):
    bank: BankRef
    agent: Holder


class MemoryGrant(MemoryRevoke):
    perm: Annotated[Literal["read", "write"], Cli(positional=True), Field(description="what the key may do")]


def _who_data(ref: Bank, who: Grantee) -> dict[str, Any]:
    return {"bank": ref.name, "id": ref.db.id, "agent": who.agent.name if who.agent else None,
            "key": who.key, "label": who.shown}


@command("memory.grant", MemoryGrant, "let a key (a local agent, a peer, any key) read or write a bank "
                                      "(or another agent's database)")
def memory_grant(node: Node, p: MemoryGrant) -> Result:
    ref = node.agents.resolve(p.bank)
    who = grantee(node, ref, p.agent)
    if node.sync.invite(who.key) is not None:
        raise AuthError("auth.bad_op", f"{who.shown} is an invite key: an invite is redeemed by the importing node's "
                                       "own key, never granted (memmesh memory share makes a new one)")
    change = node.agents.grant_to(ref, who, p.perm)
    data = {**_who_data(ref, who), "permission": p.perm, "changed": change.wrote, "settings_written": change.settings,
            "reference_written": change.ref}
    if not change.wrote:
        held = ref.db.permission(who.key)
        text = (f"{who.shown} already holds {held.level if held else p.perm} on {ref.name}"
                + (" and the bank's reference" if who.agent else "") + "; nothing written")
    elif not change.settings:
        text = f"{who.shown} already holds {p.perm} on {ref.name}; wrote only the bank's reference in its database"
    else:
        text = f"granted {p.perm} on {ref.name} to {who.shown}"
    return Result(data, text)


@command("memory.revoke", MemoryRevoke, "revoke a key's access to a bank (a local agent, a peer, an invite, any key)")
def memory_revoke(node: Node, p: MemoryRevoke) -> Result:
    ref = node.agents.resolve(p.bank)
    who = grantee(node, ref, p.agent)
    invite = node.sync.invite(who.key)
    redeemable = (invite is not None and invite.db == ref.db.id and invite.used_by is None
                  and getattr(invite, "ended", None) is None)
    try:
        change = node.agents.revoke_from(ref, who)
    except NotGranted:
        if not redeemable:
            raise
        change = Change()  # an invite holds nothing in the settings: ending its record revokes it
    if redeemable:
        assert invite is not None
        # The record alone makes an invite redeemable (node/sync/sharing.py): ending it is what
        # stops a stolen, unredeemed ticket.
        invite.ended = "revoked"
        node.sync.put_invite(who.key, invite)
    data = {**_who_data(ref, who), "revoked": True, "changed": change.wrote or redeemable,
            "settings_written": change.settings, "reference_written": change.ref, "invite_ended": redeemable}
    if redeemable:
        text = f"revoked {who.shown} on {ref.name}: the invite can no longer be redeemed"
    elif not change.wrote:
        text = f"{who.shown} is already revoked on {ref.name}; nothing written"
    elif not change.settings:
        text = f"{who.shown} was already revoked on {ref.name}; removed the bank's reference from its database"
    else:
        text = f"revoked {who.shown} on {ref.name}"
    return Result(data, text, [change.warning] if change.warning else [])


class MemoryGrants(Params):
    bank: BankRef


@command("memory.grants", MemoryGrants, "every key a bank's settings hold: permission, status, who granted it, "
                                        "what it is, and the label grant and revoke take", read_only=True)
def memory_grants(node: Node, p: MemoryGrants) -> Result:
    ref = node.agents.resolve(p.bank)
    rows = Directory(node, ref).holders()
    lines = [f"{ref.name} ({ref.db.id}): {len(rows)} key{'s' if len(rows) != 1 else ''}"]
    width = max([len(r["label"]) for r in rows] + [5])
    for r in rows:
        perm = r["permission"] or "-"
        if r["priority"] is not None:
            perm += f"({r['priority']})"
        by = r["revoked_by"] if r["status"] == "revoked" else r["granted_by"]
        verb = {"active": "granted by", "outstanding": "issued by"}.get(r["status"], "revoked by")
        who = ", ".join(b["label"] for b in by) or "?"
        lines.append(f"  {r['label']:<{width}}  {perm:<10} {r['status']:<11} {r['is']['detail']}; {verb} {who}")
        lines.append(f"  {'':<{width}}  {r['key']}")
    lines.append(f"revoke one with: memmesh memory revoke {ref.name} LABEL (or its key)")
    return Result({"bank": ref.name, "id": ref.db.id, "keys": rows}, "\n".join(lines))


class MemoryAttach(Params):
    bank: BankRef
    agent: Annotated[Name, Field(description="the agent whose auto-recall searches the bank")]
    session: Annotated[Session | None, Field(description="only in this session; default: every session")] = None


def _attach(node: Node, p: MemoryAttach, attach: bool) -> Result:
    ag = node.agents.agent(p.agent)
    ref = node.agents.resolve(p.bank)
    node.agents.write_config(ag, {"attach" if attach else "detach": ref.db.id, "session": p.session})
    where = f"session {p.session}" if p.session else "every session"
    verb = "attached to" if attach else "detached from"
    return Result({"bank": ref.name, "id": ref.db.id, "agent": ag.name, "session": p.session, "attached": attach},
                  f"{ref.name} {verb} {ag.name} ({where})")


# A chat line comes from one agent's session: attach and detach act for that agent in that session
# (grant and revoke name the agent they act on in the text: it is rarely the caller).
@command("memory.attach", MemoryAttach, "attach a bank for an agent's auto-recall", from_caller=("agent", "session"))
def memory_attach(node: Node, p: MemoryAttach) -> Result:
    return _attach(node, p, attach=True)


@command("memory.detach", MemoryAttach, "detach a bank for an agent's auto-recall", from_caller=("agent", "session"))
def memory_detach(node: Node, p: MemoryAttach) -> Result:
    return _attach(node, p, attach=False)
