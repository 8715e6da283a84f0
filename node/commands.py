"""One handler per user-visible operation.

Every transport (CLI, local HTTP API, MCP, chat commands) parses its input, calls one of
these and renders the Result: ``data`` for machines (JSON), ``text`` for people.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from node.library import Node
from node.memory.agents import CONFIG_DEFAULTS, Agent, CONFIG_STORE, ConfigError, agent_state, parse_config_value
from node.memory.embedders import EmbedderConfig
from node.memory.service import perm_name


@dataclass
class Result:
    data: Any
    text: str
    warnings: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------- node
def init(home: Path) -> Result:
    node, created = Node.init(home)
    try:
        peer = str(node.peer_key.public)
    finally:
        node.close()
    if created:
        text = f"initialised memmesh node in {home}\npeer key: {peer}"
    else:
        text = f"memmesh node already initialised in {home} (nothing changed)\npeer key: {peer}"
    return Result({"home": str(home), "peer_key": peer, "created": created}, text)


def status(node: Node) -> Result:
    dbs = []
    for db_id in node.database_ids():
        db = node.database(db_id)
        meta = db.meta()
        dbs.append({
            "id": db_id,
            "kind": meta.get("kind"),
            "name": meta.get("display_name"),
            "entries": len(db),
            "heads": list(db.heads),
        })
    data = {"home": str(node.home), "peer_key": str(node.peer_key.public), "databases": dbs}
    lines = [f"home: {node.home}", f"peer key: {node.peer_key.public}", f"databases: {len(dbs)}"]
    for d in dbs:
        label = f"{d['kind'] or '?'} {d['name'] or ''}".strip()
        lines.append(f"  {d['id']}  {label}  entries={d['entries']}  heads={len(d['heads'])}")
        for head in d["heads"]:
            lines.append(f"    head {head}")
    return Result(data, "\n".join(lines))


# ---------------------------------------------------------------------- agents
def agent_new(node: Node, name: str) -> Result:
    agent = node.agents.create_agent(name)
    data = {"name": agent.name, "id": agent.db.id, "key": str(agent.key.public)}
    return Result(data, f"agent {agent.name} created\n  database {agent.db.id}\n  key {agent.key.public}")


def agent_list(node: Node) -> Result:
    rows = [{"name": r.name, "id": r.db_id, "key": str(node.load_key(r.key_name).public)}
            for r in node.agents.agents()]
    text = "\n".join(f"{r['name']:<20} {r['id']}" for r in rows) or "no agents yet (memmesh agent new NAME)"
    return Result({"agents": rows}, text)


# ---------------------------------------------------------------------- tools
def tool(node: Node, agent: str, name: str, args: Any) -> Result:
    data = node.memory.call_tool(node.agents.agent(agent), name, args)
    return Result(data, json.dumps(data, indent=2, ensure_ascii=False), list(data.get("warnings", [])))


def autorecall(node: Node, agent: str, messages: Sequence[str], session: str | None) -> Result:
    text = node.auto_recall(agent, messages, session)
    return Result({"block": text}, text.rstrip("\n"))


def recall(node: Node, agent: str, query: str, tags: Sequence[str], limit: int, bank: str | None,
           include_superseded: bool = False) -> Result:
    """The recall tool, plus the operator's option to see superseded rows too."""
    data = node.memory.recall(node.agents.agent(agent), query, list(tags), limit, bank,
                              include_superseded=include_superseded)
    return Result(data, render_memories(data), list(data.get("warnings", [])))


def render_memories(data: dict[str, Any]) -> str:
    if not data["memories"]:
        return data["message"]
    lines = []
    for m in data["memories"]:
        tags = f" [{', '.join(m['tags'])}]" if m["tags"] else ""
        lines.append(f"{m['key']}: {m['value']}{tags}  ({m['time']}, {m['bank']})")
    return "\n".join(lines)


# ---------------------------------------------------------------------- embedder
def embedder_set(node: Node, provider: str, model: str | None, api_base: str | None,
                 api_key: str | None, timeout_s: float | None, dim: int | None) -> Result:
    cfg = EmbedderConfig(provider, model=model, api_base=api_base,
                         timeout_s=timeout_s if timeout_s is not None else 10.0, dim=dim)
    embedder = node.set_embedder_config(cfg, api_key=api_key)
    if embedder is None:
        return Result({"provider": "none"}, "embedder: none (recall ranks by BM25 only)")
    data = {"provider": embedder.provider, "model": embedder.model, "dim": embedder.dim, "store": embedder.store_name}
    return Result(data, f"embedder: {embedder.provider}/{embedder.model} ({embedder.dim} dimensions)\n"
                        f"vectors are stored under {embedder.store_name}; "
                        "`memmesh memory reindex` backfills older memories")


def embedder_show(node: Node) -> Result:
    cfg = node.embedder_config()
    embedder = node.memory.embedder
    data = {"provider": cfg.provider, "model": embedder.model if embedder else cfg.model,
            "api_base": cfg.api_base, "dim": embedder.dim if embedder else cfg.dim,
            "store": embedder.store_name if embedder else None,
            "api_key_set": node.registry.secret("embedder-api-key") is not None}
    if embedder is None:
        return Result(data, "embedder: none (recall ranks by BM25 only)")
    text = f"embedder: {embedder.provider}/{embedder.model} ({embedder.dim} dimensions)"
    if cfg.api_base:
        text += f"\napi base: {cfg.api_base}"
    return Result(data, text)


# ---------------------------------------------------------------------- banks
def memory_new(node: Node, name: str, description: str = "") -> Result:
    bank = node.agents.create_bank(name, description)
    return Result({"name": name, "id": bank.db.id, "description": description},
                  f"bank {name} created\n  database {bank.db.id}")


def memory_list(node: Node) -> Result:
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


def memory_delete(node: Node, ref: str) -> Result:
    rec = node.agents.delete_bank(ref)
    return Result({"name": rec.name, "id": rec.db_id, "archived": True},
                  f"bank {rec.name} unregistered; its database {rec.db_id} is kept as an archive")


def memory_grant(node: Node, bank: str, agent: str, perm: str) -> Result:
    ref, ag = node.agents.grant(bank, agent, perm)
    return Result({"bank": ref.name, "id": ref.db.id, "agent": ag.name, "permission": perm},
                  f"granted {perm} on {ref.name} to {ag.name}")


def memory_revoke(node: Node, bank: str, agent: str) -> Result:
    ref, ag, warning = node.agents.revoke(bank, agent)
    return Result({"bank": ref.name, "id": ref.db.id, "agent": ag.name, "revoked": True},
                  f"revoked {ag.name} on {ref.name}", [warning] if warning else [])


def _config_write(ag: Agent, value: dict[str, Any]) -> None:
    with ag.db.transaction(ag.key) as txn:
        txn.append(CONFIG_STORE, value)


def memory_attach(node: Node, bank: str, agent: str, session: str | None, attach: bool = True) -> Result:
    ag = node.agents.agent(agent)
    ref = node.agents.resolve(bank)
    _config_write(ag, {"attach" if attach else "detach": ref.db.id, "session": session})
    where = f"session {session}" if session else "every session"
    verb = "attached to" if attach else "detached from"
    return Result({"bank": ref.name, "id": ref.db.id, "agent": ag.name, "session": session, "attached": attach},
                  f"{ref.name} {verb} {ag.name} ({where})")


def memory_config(node: Node, agent: str, action: str, key: str | None = None, value: str | None = None) -> Result:
    ag = node.agents.agent(agent)
    if action == "set":
        if key is None or value is None:
            raise ConfigError("usage: memmesh memory config AGENT set KEY VALUE")
        parsed = parse_config_value(key, value)
        if key == "auto_recall_banks":  # every reference must name a bank; stored as ids
            parsed = [node.agents.resolve(ref).db.id for ref in parsed]
        _config_write(ag, {"set": key, "value": parsed})
    elif action == "reset":
        _config_write(ag, {"reset": True})
    elif action != "show":
        raise ConfigError(f"config action is show, set or reset, got {action!r}")
    state = agent_state(ag.db)
    config = dict(state.config)
    config["auto_recall_banks"] = [node.agents.name_of(i) for i in config["auto_recall_banks"]]
    attached = {("*" if s is None else s): [node.agents.name_of(i) for i in ids] for s, ids in state.attached.items() if ids}
    text = "\n".join(f"{k} = {json.dumps(config[k])}" for k in CONFIG_DEFAULTS)
    if attached:
        text += "\nattached banks: " + "; ".join(f"{s}: {', '.join(n)}" for s, n in attached.items())
    return Result({"agent": ag.name, "config": config, "attached": attached}, text)


def memory_reindex(node: Node, bank: str | None, progress: Callable[[int, int], None] | None = None) -> Result:
    targets = []
    if bank is None:
        targets += [node.agents.resolve(r.name) for r in node.registry.banks()]
        targets += [node.agents.resolve(a.name) for a in node.agents.agents()]
    else:
        targets.append(node.agents.resolve(bank))
    done = []
    for ref in targets:
        result = node.memory.reindex(ref.db, lambda _db, k=ref.admin_key: k, progress=progress)
        done.append({"bank": ref.name, **result})
    total = sum(d["embedded"] for d in done)
    return Result({"reindexed": done, "embedded": total},
                  f"embedded {total} memories" + "".join(f"\n  {d['bank']}: {d['embedded']}" for d in done))
