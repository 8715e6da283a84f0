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
    from node.settings import CONFIG_FILE, write_template

    peer = str(node.peer_key.public)
    config_written = write_template(node.home)  # a commented template, never over an existing file
    if node.created:
        text = f"initialised memmesh node in {node.home}\npeer key: {peer}"
    else:
        unchanged = "" if config_written else " (nothing changed)"
        text = f"memmesh node already initialised in {node.home}{unchanged}\npeer key: {peer}"
    if config_written:
        text += f"\nwrote {node.home / CONFIG_FILE} (every key commented out: the defaults)"
    return Result({"home": str(node.home), "peer_key": peer, "created": node.created,
                   "config_written": config_written}, text)


@command("status", NoParams, "peer key and hosted databases", read_only=True)
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
    from node.commands.sync import sync_status

    shared = set(node.sync.shared())
    for d in dbs:
        d["shared"] = d["id"] in shared
        d["pending"] = len(node.database(d["id"]).pending_ids())
        d["refused"] = node.database(d["id"]).refusal_counts()
    links = sync_status(node)
    data = {"home": str(node.home), "peer_key": str(node.peer_key.public), "databases": dbs,
            "sync": {"serving": node.network.serving, "address": node.sync.address(), "links": links}}
    lines = [f"home: {node.home}", f"peer key: {node.peer_key.public}", f"databases: {len(dbs)}"]
    for d in dbs:
        label = f"{d['kind'] or '?'} {d['name'] or ''}".strip()
        extra = "  shared" if d["shared"] else ""
        extra += f"  pending={d['pending']}" if d["pending"] else ""
        lines.append(f"  {d['id']}  {label}  entries={d['entries']}  heads={len(d['heads'])}{extra}")
        for head in d["heads"]:
            lines.append(f"    head {head}")
        for source, reasons in sorted(d["refused"].items()):
            lines.append(f"    refused from {source or 'local'}: " + ", ".join(f"{r} {n}" for r, n in sorted(reasons.items())))
    serving = f"serving at {node.sync.address()}" if node.network.serving else "serve is not running"
    lines.append(f"sync: {serving}")
    for link in links:
        when = "never" if link["last_success_ms"] is None else _ago(link["last_success_ms"])
        state = f"error: {link['last_error']}" if link["last_error"] else "ok"
        backoff = f", backing off {link['backoff_ms'] // 1000 + 1} s" if link["backoff_ms"] else ""
        lines.append(f"  {link['bank']} <-> {link['peer']}: last sync {when}, we lack {link['behind']}, "
                     f"it lacks {link['peer_behind']}, {state}{backoff}")
        if link["refused"]:
            lines.append("    refused: " + ", ".join(f"{r} {n}" for r, n in sorted(link["refused"].items())))
    return Result(data, "\n".join(lines))


def _ago(ms: int) -> str:
    import time

    seconds = max(0, int(time.time() - ms / 1000))
    return f"{seconds} s ago" if seconds < 120 else f"{seconds // 60} min ago"
