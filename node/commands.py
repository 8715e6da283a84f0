"""One handler per user-visible operation.

Every transport (CLI, local HTTP API, MCP, chat commands) parses its input, calls one of
these and renders the Result: ``data`` for machines (JSON), ``text`` for people.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.home import Node


@dataclass
class Result:
    data: Any
    text: str
    warnings: list[str] = field(default_factory=list)


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
