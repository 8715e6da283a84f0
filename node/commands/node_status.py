"""The node itself: init, status."""
from __future__ import annotations

from typing import TYPE_CHECKING

from node.commands.params import NoParams
from node.commands.registry import command
from node.commands.result import Result

if TYPE_CHECKING:
    from node.library import Node


@command("init", NoParams, "create the node: peer key and data directory", creates_home=True)
def init(node: "Node", p: NoParams) -> Result:
    peer = str(node.peer_key.public)
    if node.created:
        text = f"initialised memmesh node in {node.home}\npeer key: {peer}"
    else:
        text = f"memmesh node already initialised in {node.home} (nothing changed)\npeer key: {peer}"
    return Result({"home": str(node.home), "peer_key": peer, "created": node.created}, text)


@command("status", NoParams, "peer key and hosted databases")
def status(node: "Node", p: NoParams) -> Result:
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
