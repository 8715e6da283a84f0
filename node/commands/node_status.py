"""The node itself: init, status (what `memmesh status`, GET /v1/status and the page show).

Every number of the status is computed here, once; the CLI, the HTTP API and the page render
it. Lag is exact: per bank and peer, the peer's feed positions as last seen in an exchange
(node/sync/state.py ``lag``) against ours now. docs/operations.md ("Status") says what each
number means.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from memmesh.crdt.clock import now_ms
from memmesh.node.commands.params import NoParams
from memmesh.node.commands.registry import command
from memmesh.node.commands.result import Result

if TYPE_CHECKING:
    from memmesh.crdt.database import Database
    from memmesh.node.library import Node
    from memmesh.node.memory.view import MemoryView
    from memmesh.node.sync.state import LinkStatus

PEER_SOURCE = "peer:"
NO_GRANT = "sync.no_grant"  # node/sync/readers.py: a link stopped because the peer may not read the bank


# Not routed: the API is served by serve, on a home that exists.
@command("init", NoParams, "create the node: peer key and data directory", creates_home=True, http=None)
def init(node: Node, p: NoParams) -> Result:
    from memmesh.node.home import make_private, private_line
    from memmesh.node.settings import CONFIG_FILE, write_template

    peer = str(node.peer_key.public)
    config_written = write_template(node.home)  # a commented template, never over an existing file
    if node.created:
        text = f"initialised memmesh node in {node.home}\npeer key: {peer}"
    else:
        unchanged = "" if config_written else " (nothing changed)"
        text = f"memmesh node already initialised in {node.home}{unchanged}\npeer key: {peer}"
    if config_written:
        text += f"\nwrote {node.home / CONFIG_FILE} (every key commented out: the defaults)"
    made_private = node.made_private + [c for c in make_private(node.home) if c not in node.made_private]
    if made_private:
        text += "\n" + private_line(node.home, made_private)
    return Result({"home": str(node.home), "peer_key": peer, "created": node.created,
                   "config_written": config_written, "made_private": made_private}, text)


# ---------------------------------------------------------------------------- the numbers
def stale_after_ms(node: Node) -> int:
    from memmesh.node.settings import applied

    return int(applied(node).sync.stale_after_s * 1000)


def peer_refusals(db: Database, peer: str) -> dict[str, int]:
    """reason -> entries of this database refused when ``peer`` sent them."""
    return dict(db.refusal_counts().get(PEER_SOURCE + peer, {}))


def link_view(node: Node, db: Database, link: LinkStatus, t: int) -> dict[str, Any]:
    """One bank and one peer: exact lag, the last exchange, backoff, traffic, refusals, and
    ``not_sent``: why nothing of the bank goes to that peer now (it may not read it), else None."""
    from memmesh.node.sync.readers import refusal
    from memmesh.node.sync.state import lag

    rec = node.sync.peers.get(link.db, link.peer)
    exact = lag(db, link)
    return {"peer": link.peer, "not_sent": refusal(node, db, link.peer), "peer_lacks": exact.peer_lacks,
            "we_lack": exact.we_lack,
            "last_exchange_ms": link.last_success_ms, "last_attempt_ms": link.last_attempt_ms or None,
            "feeds_seen_ms": link.feeds_ms, "last_error": link.last_error,
            "backoff_ms": max(0, rec.next_try_ms - t) if rec else 0,
            "bytes_in": link.bytes_in, "bytes_out": link.bytes_out, "refused": peer_refusals(db, link.peer)}


def bank_sync(node: Node, db: Database, t: int, stale_ms: int,
              links: list[LinkStatus] | None = None) -> dict[str, Any]:
    """Per peer of the bank (every link the daemon recorded, or ``links`` when the caller read
    them already), and the bank's worst of them."""
    links = node.sync.links(db.id) if links is None else links
    peers = [link_view(node, db, link, t) for link in links]
    # A link the daemon stopped because the peer may not read the bank is not stale: nothing
    # is sent to it on purpose (its last_error says why).
    sent = {p["peer"] for p in peers if not (p["last_error"] or "").startswith(NO_GRANT)}
    worst = max((max(p["peer_lacks"], p["we_lack"]) for p in peers), default=0)
    completes = [p["last_exchange_ms"] for p in peers if p["last_exchange_ms"] is not None]
    stale_since = None
    for link in links:
        if link.peer not in sent:
            continue
        since = (link.last_success_ms if link.last_success_ms is not None else link.since_ms) + stale_ms
        if since <= t and (stale_since is None or since < stale_since):
            stale_since = since
    return {"worst_lag": worst,
            "last_complete_exchange_age_s": round((t - max(completes)) / 1000, 3) if completes else None,
            "stale": stale_since is not None, "stale_since_ms": stale_since, "peers": peers}


def key_names(node: Node) -> dict[str, str]:
    """Public key -> who it is on this node (an agent, a bank's own key, this node): one key
    file read per agent and bank, so status reads them once, not once per database."""
    names = {str(node.load_key(r.key_name).public): r.name for r in node.agents.agents()}
    for bank in node.registry.banks():
        names.setdefault(str(node.load_key(bank.key_name).public), f"bank {bank.name}")
    names.setdefault(str(node.peer_key.public), "this node")
    return names


def grants(node: Node, db: Database, names: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every key the database's settings name, with what decided its state (``names``:
    ``key_names(node)``, read here when not given)."""
    names = key_names(node) if names is None else names
    out = []
    for key, state in sorted(db.settings().items()):
        entry = state.granted_by[0] if state.granted_by else None
        signer = db.entry(entry) if entry else None
        perm = state.permission
        out.append({"key": key, "name": names.get(key), "level": perm.level if perm else None,
                    "priority": perm.priority if perm else None, "status": state.status,
                    "granted_by": signer.author_key if signer else None, "entry": entry})
    return out


def recall_status(node: Node, db: Database, reader: str | None = None) -> dict[str, Any]:
    """The embedder in use, the share of current memories (those that may have one: secrets are
    never embedded) with a vector for it, and the current memories per trust tier for
    ``reader`` (a public key; None: every plain row is ``peer``), per hygiene rule, holding a
    secret, and the bank's quarantines."""
    return view_recall_status(node, node.memory.view(db), reader)


def open_recall_status(node: Node, db: Database) -> dict[str, Any] | None:
    """``recall_status`` if the bank's recall index is open and built now, else None: status
    never builds an index (a node may host a thousand banks; `memmesh memory status BANK`
    builds one and counts), and does not wait for a search holding one."""
    view = node.memory.open_view(db.id)
    if view is None:
        return None
    with view.held(0.05) as got:
        if not got or not view.loaded:
            return None
        return view_recall_status(node, view)


def view_recall_status(node: Node, view: MemoryView, reader: str | None = None) -> dict[str, Any]:
    counts = view.status(reader)
    qs = view.quarantines()
    embedder = node.memory.embedder
    with_vectors = counts["with_vector"] if embedder is not None else 0
    embeddable = counts["embeddable"]
    return {"embedder": embedder.store_name.split(":", 1)[1] if embedder is not None else None,
            "memories": counts["memories"], "with_vectors": with_vectors, "embeddable": embeddable,
            "share": round(with_vectors / embeddable, 4) if embedder is not None and embeddable else None,
            "tiers": counts["tiers"], "flagged_by_rule": counts["flagged_by_rule"], "secrets": counts["secrets"],
            "quarantines": {"active": sum(q.active for q in qs), "released": sum(not q.active for q in qs)}}


class StatusContext:
    """What every database's status needs, read once per status call (per database it would
    make status quadratic in the banks hosted): the names of databases and keys, the links."""

    def __init__(self, node: Node) -> None:
        self.names = {r.db_id: r.name for r in node.registry.agents()}
        self.names.update({r.db_id: r.name for r in node.registry.banks()})
        self.keys = key_names(node)
        self.links: dict[str, list[LinkStatus]] = {}
        for link in node.sync.links():
            self.links.setdefault(link.db, []).append(link)


def database_status(node: Node, db_id: str, shared: set[str], t: int, stale_ms: int,
                    ctx: StatusContext | None = None) -> dict[str, Any]:
    """One database's status; ``recall`` is None while its recall index is not open."""
    ctx = StatusContext(node) if ctx is None else ctx
    db = node.database(db_id)
    meta = db.meta()
    refused = db.refusal_counts()
    by_reason: dict[str, int] = {}
    for reasons in refused.values():
        for reason, n in reasons.items():
            by_reason[reason] = by_reason.get(reason, 0) + n
    wanted = db.wanted()
    # entries whose payload has not arrived: stored ones (a relay stripped it) and pending ones
    # that wait for nothing else
    payloads = {entry for entry, _store in wanted["payloads"]} | set(wanted["pending_payloads"])
    bank = ctx.names.get(db_id) or node.agents.name_of(db_id)
    return {"id": db_id, "kind": meta.get("kind"), "name": meta.get("display_name"), "bank": bank,
            "entries": len(db), "heads": list(db.heads), "shared": db_id in shared,
            "pending": len(db.pending_ids()), "refused": refused, "authors": len(db.feeds()),
            "payload_pending": len(payloads), "refused_by_reason": by_reason, "grants": grants(node, db, ctx.keys),
            "recall": open_recall_status(node, db),
            "sync": bank_sync(node, db, t, stale_ms, ctx.links.get(db_id, []))}


def node_view(node: Node, dbs: list[dict[str, Any]]) -> dict[str, Any]:
    from memmesh.crdt.verifystats import VERIFIED

    info = node.serve_info
    verify = VERIFIED.snapshot()
    book = node.sync.peers
    peers = {rec.key for db_id in book.databases() for rec in book.peers(db_id)}
    views = node.memory.view_stats()
    return {"key": str(node.peer_key.public), "serving": node.network.serving,
            "listeners": {"sync": info["sync"] if info else None, "api": info["api"] if info else None,
                          "address": info["address"] if info else None},
            "discovery": info["discovery"] if info else None,
            "uptime_s": round(time.monotonic() - info["started_mono"], 3) if info else None,
            "verify": {"entries": verify.entries, "per_s": round(verify.per_s, 1) if verify.per_s else None},
            "counts": {"banks": len(node.registry.banks()), "databases": len(dbs), "peers": len(peers),
                       "errors": sum(1 for link in node.sync.links() if link.last_error)},
            "memory": {"views_open": views.built, "view_bytes": views.bytes, "budget_bytes": views.budget,
                       "closed": views.closed}}


@command("status", NoParams, "the node, each database (entries, lag per peer, grants, refusals) and sync",
         read_only=True)
def status(node: Node, p: NoParams) -> Result:
    from memmesh.node.fence import status as fenced

    t = now_ms()
    stale_ms = stale_after_ms(node)
    shared = set(node.sync.shared())
    ctx = StatusContext(node)
    dbs = [database_status(node, db_id, shared, t, stale_ms, ctx) for db_id in node.database_ids()]
    data = {"home": str(node.home), "peer_key": str(node.peer_key.public), "node": node_view(node, dbs),
            "databases": dbs, "fenced": fenced(node),
            "sync": {"serving": node.network.serving, "address": node.sync.address(), "links": sync_status(node, ctx.names)}}
    return Result(data, render_status(data, t))


def sync_status(node: Node, names: dict[str, str] | None = None) -> list[dict]:
    """Per shared bank and peer: the last exchange's outcome (for `memmesh status`); ``names``:
    database id -> registered name, when the caller read them already."""
    names = names or {}
    out = []
    t = now_ms()
    for link in node.sync.links():
        rec = node.sync.peers.get(link.db, link.peer)
        out.append({"db": link.db, "bank": names.get(link.db) or node.agents.name_of(link.db), "peer": link.peer,
                    "last_success_ms": link.last_success_ms, "last_error": link.last_error,
                    "behind": link.lacking, "peer_behind": link.peer_lacking, "pulled": link.pulled,
                    "pushed": link.pushed, "refused": dict(link.refused),
                    "backoff_ms": max(0, rec.next_try_ms - t) if rec else 0})
    return out


# ---------------------------------------------------------------------------- the text
def short(key: str | None) -> str:
    """A key or id short enough for a terminal line (the JSON has them whole)."""
    if not key:
        return "-"
    prefix, _, rest = key.partition(":")
    return f"{prefix}:{rest[:10]}…" if rest and len(rest) > 12 else key


def ago(ms: int | None, t: int | None = None) -> str:
    if ms is None:
        return "never"
    seconds = max(0, int(((t if t is not None else now_ms()) - ms) / 1000))
    if seconds < 120:
        return f"{seconds} s ago"
    return f"{seconds // 60} min ago" if seconds < 7200 else f"{seconds // 3600} h ago"


def utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def sync_line(d: dict[str, Any], t: int) -> str:
    """One line per bank: in sync, N behind which peer, or stale since when."""
    s = d["sync"]
    if not s["peers"]:
        return "no peer yet" if d["shared"] else "not shared"
    parts = []
    for p in s["peers"]:
        if p["peer_lacks"] or p["we_lack"]:
            lags = []
            if p["we_lack"]:
                lags.append(f"we lack {p['we_lack']}")
            if p["peer_lacks"]:
                lags.append(f"it lacks {p['peer_lacks']}")
            parts.append(f"{max(p['peer_lacks'], p['we_lack'])} behind {short(p['peer'])} ({', '.join(lags)})")
    text = "; ".join(parts) if parts else f"in sync with {len(s['peers'])} peer{'s' if len(s['peers']) != 1 else ''}"
    if s["stale"]:
        text += f"; STALE since {utc(s['stale_since_ms'])}"
    return text


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.1f} GiB"


def render_status(data: dict[str, Any], t: int) -> str:
    n = data["node"]
    if n["serving"]:
        listen = f"sync {n['listeners']['sync']}, api {n['listeners']['api'] or 'off'}"
        up = f", up {int(n['uptime_s'])} s" if n["uptime_s"] is not None else ""
        serving = f"serving ({listen}, discovery {'on' if n['discovery'] else 'off'}{up})"
    else:
        serving = "serve is not running"
    c, m = n["counts"], n["memory"]
    rate = f", {n['verify']['per_s']:g}/s" if n["verify"]["per_s"] else ""
    lines = [f"home: {data['home']}", f"peer key: {data['peer_key']}", f"node: {serving}",
             f"counts: {c['banks']} banks, {c['databases']} databases, {c['peers']} peers, {c['errors']} errors; "
             f"verified {n['verify']['entries']} signatures{rate}",
             f"recall indexes: {m['views_open']} open, {_mib(m['view_bytes'])} of a {_mib(m['budget_bytes'])} "
             f"budget; a bank's recall counts show while its index is open (memmesh memory status BANK counts any)",
             f"databases: {len(data['databases'])}"]
    if data.get("fenced"):  # one line: what the write fence (node/fence.py) holds back, and why
        lines.insert(-1, "FENCED (local writes refused until a sync brings this node's own entries back; memmesh "
                         "unfence NAME lifts it): " + "; ".join(f"{f['name']}, {f['why']}" for f in data["fenced"]))
    for d in data["databases"]:
        label = f"{d['kind'] or '?'} {d['bank'] or d['name'] or ''}".strip()
        extra = "  shared" if d["shared"] else ""
        extra += f"  pending={d['pending']}" if d["pending"] else ""
        extra += f"  payload-pending={d['payload_pending']}" if d["payload_pending"] else ""
        lines.append(f"  {d['id']}  {label}  entries={d['entries']}  authors={d['authors']}  "
                     f"heads={len(d['heads'])}{extra}")
        if d["shared"] or d["sync"]["peers"]:
            lines.append(f"    sync: {sync_line(d, t)}")
        for p in d["sync"]["peers"]:
            state = f"error: {p['last_error']}" if p["last_error"] else "ok"
            if p.get("not_sent") and not (p["last_error"] or "").startswith(NO_GRANT):
                state += f"; nothing is sent to it now: {p['not_sent']}"
            backoff = f", backing off {p['backoff_ms'] // 1000 + 1} s" if p["backoff_ms"] else ""
            lines.append(f"      {short(p['peer'])}: last exchange {ago(p['last_exchange_ms'], t)}, "
                         f"we lack {p['we_lack']}, it lacks {p['peer_lacks']}, {state}{backoff}")
        r = d["recall"]
        if r is not None and r["memories"]:
            vec = (f", {r['with_vectors']}/{r['memories']} with vectors ({r['embedder']})" if r["embedder"]
                   else ", no embedder")
            lines.append(f"    recall: {r['memories']} memories{vec}")
        if d["grants"]:
            lines.append("    grants: " + ", ".join(
                f"{g['name'] or short(g['key'])} " + (g["level"] if g["status"] == "active" else "revoked")
                + (f"({g['priority']})" if g["priority"] is not None else "") for g in d["grants"]))
        for source, reasons in sorted(d["refused"].items()):
            lines.append(f"    refused from {short(source) if source else 'local'}: "
                         + ", ".join(f"{r} {k}" for r, k in sorted(reasons.items())))
    return "\n".join(lines)
