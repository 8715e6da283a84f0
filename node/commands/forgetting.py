"""What the forget tool does (the tool, the ``forget`` command, node/commands/forget.py, and
``/memory forget`` run it).

node/memory/forgetting.py decides what is erased; this is the caller's side: the bank the agent
names, the permission checks in the order that reveals nothing to a caller without Write, the
signed erasures, the memory view rebuilt at once, and the answer (docs/memory.md, "Forget").
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memmesh.node.memory.forgetting import check_authors, check_writer, erase, own_vectors_signed_by, plan_forget
from memmesh.node.memory.rows import iso_utc

if TYPE_CHECKING:
    from memmesh.auth.keys import SigningKey
    from memmesh.crdt.database import Database
    from memmesh.node.library import Node
    from memmesh.node.memory.agents import Agent


def _bank(node: Node, agent: Agent, bank: str | None) -> tuple[str, Database, SigningKey | None]:
    """The bank's name, its database, and its Admin key when this node holds it (a bank of this
    node; None for the agent's own database, where the agent is the Admin)."""
    if bank is None or bank == agent.name or bank == agent.db.id:
        return agent.name, agent.db, None
    ref = node.agents.resolve(bank)  # an unknown or malformed name: one line (UnknownName)
    if ref.db.id == agent.db.id:
        return agent.name, agent.db, None
    return ref.name, ref.db, ref.admin_key


def forget_memory(node: Node, agent: Agent, key: str, bank: str | None, *, preview: bool = False) -> dict[str, Any]:
    """Erase every version of ``key`` (and their vectors) in the bank, signed by ``agent``'s
    key; with ``preview``, only say what would be erased. Refused (nothing written) when the
    agent holds less than Write, when the key has no row, or when some payload is another
    key's and the agent is not an Admin of the bank."""
    name, db, admin_key = _bank(node, agent, bank)
    signer = str(agent.key.public)
    perm = db.permission(signer)
    who = f"agent {agent.name}"
    check_writer(perm, who, name)
    assert perm is not None
    plan = plan_forget(db, key, name)
    # `memory reindex` signs a bank's vectors with its Admin key, which this node holds: the
    # vectors of the agent's own memories it wrote that way are erased with that key, so their
    # author can forget them with Write (docs/memory.md, "Forget"). Anything else of another key
    # still needs the agent to be an Admin.
    by_admin = own_vectors_signed_by(plan, signer, admin_key)
    check_authors(plan, perm, signer, who, name, also=by_admin)
    entries: list[str] = []
    if not preview:
        own = [t for t in plan.targets if t not in by_admin]
        entries = erase(db, agent.key, own, plan.rewrite)
        if by_admin:
            assert admin_key is not None  # by_admin is empty without it
            entries += erase(db, admin_key, by_admin)
        node.memory.view(db).load()  # rebuilt now: the index holds nothing of the key from here on
    versions = [{"entry": r.entry_id, "written_by": r.author, "time": iso_utc(r.ts)} for r in plan.versions]
    erased = [{"entry": t.entry, "store": t.store} for t in plan.targets]
    rewritten = [{"key": k, "store": s} for s, _v, k in plan.rewrite]
    warnings = []
    if plan.erased_with:
        keys = sorted({d["key"] for d in plan.erased_with})
        warnings.append(f"{'would also erase' if preview else 'also erased'} {len(plan.erased_with)} row(s) of "
                        f"other keys written in the same entries: {', '.join(keys)}")
    n = len(plan.versions)
    verb = "would forget" if preview else "forgot"
    message = (f"{verb} {key!r} in {name}: {n} version{'' if n == 1 else 's'}, {len(erased)} payload"
               f"{'' if len(erased) == 1 else 's'} {'to erase' if preview else 'erased'} on every replica")
    if rewritten:
        message += f"; {len(rewritten)} other memor{'y' if len(rewritten) == 1 else 'ies'}' vectors written again first"
    out: dict[str, Any] = {"ok": True, "key": key, "bank": name, "preview": preview, "versions": versions,
                           "erased": erased, "erased_with": plan.erased_with, "vectors_rewritten": rewritten,
                           "message": message, "warnings": warnings}
    if not preview:
        out["entries"] = entries
    return out


def render_forget(data: dict[str, Any]) -> str:
    lines = [data["message"]]
    lines += [f"  erased with it: {d['key']} ({d['entry']})" for d in data["erased_with"]]
    return "\n".join(lines)
