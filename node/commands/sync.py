"""Sharing and syncing: memory.share, memory.unshare, memory.import, peers, sync."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from memmesh.auth.errors import MemmeshError
from memmesh.crdt.clock import now_ms
from memmesh.node.commands.params import BankRef, Cli, Name, NoParams, Params, PublicKeyText, Ref, not_blank
from memmesh.node.commands.registry import command
from memmesh.node.commands.result import Result
from memmesh.node.sync import sharing
from memmesh.node.validation_text import worded
from memmesh.tickets import MAX_TICKET_CHARS

if TYPE_CHECKING:
    from memmesh.node.library import Node

DURATION_PATTERN = worded("^([0-9]{1,9})([smhd]?)$", "must be a duration such as 30m, 12h or 7d (or seconds)")
_DURATION = re.compile(DURATION_PATTERN)
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    match = _DURATION.match(text.strip())
    if not match:
        raise sharing.ShareError(f"a duration looks like 30m, 12h or 7d (or seconds), got {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


class MemoryShare(Params):
    bank: BankRef
    perm: Annotated[Literal["admin", "write", "read"], Cli(metavar="PERM"), Field(
        description="what the importing peer may do (admin lets it grant its own agents)")] = "write"
    recipient: Annotated[PublicKeyText | None, Cli(flag="--for", metavar="PEERKEY"), Field(
        description="the importing peer's key (ed25519:...); without it the ticket "
                    "carries a single-use invite secret")] = None
    expires: Annotated[str, Cli(metavar="DURATION"), Field(pattern=DURATION_PATTERN, description="how long the ticket is valid: 30m, 12h, 7d")] = "7d"


@command("memory.share", MemoryShare, "print a signed ticket that lets another peer import a bank")
def memory_share(node: Node, p: MemoryShare) -> Result:
    address = node.sync.address() or sharing.DEFAULT_ADDRESS
    shared = sharing.share(node, p.bank, perm=p.perm, recipient=p.recipient, expires_s=parse_duration(p.expires),
                           address=address)
    node.network.poke(shared.db)
    node.network.publish("bank.shared", {"db": shared.db, "bank": shared.bank})
    t = shared.ticket
    warnings = [] if node.network.serving else [
        "memmesh serve is not running for this home: the importing peer can reach this node only "
        f"once it runs (the ticket points at {address})"]
    kind = f"for {t.recipient}" if t.recipient else "with a single-use invite (keep the whole ticket secret)"
    return Result({"ticket": shared.text, "bank": shared.bank, "db": shared.db, "perm": t.perm,
                   "priority": t.priority, "expires": t.expires, "recipient": t.recipient,
                   "addresses": list(t.addresses)},
                  f"{shared.text}\n\nticket for {shared.bank} ({t.perm}), {kind}, valid until "
                  f"{_when(t.expires)}; import it with: memmesh memory import TICKET {t.perm}", warnings)


class MemoryUnshare(Params):
    bank: BankRef


@command("memory.unshare", MemoryUnshare, "stop serving a bank to peers and end its unredeemed invites "
                                           "(keys they hold stay granted)")
def memory_unshare(node: Node, p: MemoryUnshare) -> Result:
    done = sharing.unshare(node, p.bank)
    if done.was_shared:
        node.network.publish("bank.unshared", {"db": done.db, "bank": done.bank})
    ended = (f"; {done.invites_ended} unredeemed invite{'s' if done.invites_ended != 1 else ''} ended"
             if done.invites_ended else "")
    text = (f"{done.bank} is no longer served to peers{ended}; keys already granted stay in its settings "
            f"(revoke them with memmesh memory revoke)") if done.was_shared else (
        f"{done.bank} was not shared{ended or '; nothing changed'}")
    return Result({"bank": done.bank, "was_shared": done.was_shared, "invites_ended": done.invites_ended}, text)


class MemoryImport(Params):
    ticket: Annotated[str, Cli(positional=True), not_blank(MAX_TICKET_CHARS), Field(description="the ticket (memmesh:?db=...)")]
    perm: Annotated[Literal["admin", "write", "read"], Cli(positional=True), Field(
        description="what this peer asks for: at most what the ticket gives")] = "write"
    name: Annotated[Name | None, Cli(metavar="NAME"), Field(description="the local name of the bank "
                                                                       "(default: its display name)")] = None


@command("memory.import", MemoryImport, "import a bank from a ticket: verify, reach the issuer, copy it, sync it")
def memory_import(node: Node, p: MemoryImport) -> Result:
    def make(run):
        return sharing.import_ticket(node, p.ticket, p.perm, p.name, run, lookup=node.network.lookup)

    imported = node.network.run(make)
    node.network.poke(imported.db)
    node.network.publish("bank.imported", {"db": imported.db, "bank": imported.name})
    hint = "" if imported.perm == "admin" else (
        f"\n(this node holds {imported.perm}: granting its agents needs admin on the bank)")
    return Result({"name": imported.name, "db": imported.db, "perm": imported.perm, "entries": imported.entries,
                   "peer": imported.peer, "address": imported.address},
                  f"imported {imported.name} ({imported.db}) with {imported.perm}: {imported.entries} entries "
                  f"from {imported.address}{hint}")


@command("peers", NoParams, "peers this node knows: how it found them, traffic, banks shared, refusals",
         read_only=True)
def peers(node: Node, p: NoParams) -> Result:
    from memmesh.node.commands.node_status import ago, peer_refusals, short, stale_after_ms

    t = now_ms()
    stale_ms = stale_after_ms(node)
    by_key: dict[str, dict] = {}
    for db_id in node.sync.peers.databases():
        name = node.agents.name_of(db_id)
        db = node.database(db_id) if db_id in node.database_ids() else None
        for rec in node.sync.peers.peers(db_id):
            link = node.sync.link_if_any(db_id, rec.key)
            row = by_key.get(rec.key)
            if row is None:
                # the first bank's record gives the keys peers rows always had (db, bank, how...)
                row = by_key[rec.key] = {
                    "key": rec.key, "addresses": [], "how": rec.how, "connected": False, "last_seen_ms": None,
                    "bytes_in": 0, "bytes_out": 0, "banks": [], "refused": {}, "db": db_id, "bank": name,
                    "ways": sorted(rec.ways), "last_success_ms": rec.last_success, "last_error": rec.last_error,
                    "failures": rec.failures, "next_try_ms": rec.next_try_ms, "per_bank": []}
            row["addresses"] += [a for a in rec.addrs if a not in row["addresses"]]
            row["banks"].append(name)
            if rec.last_success is not None and (row["last_seen_ms"] or 0) < rec.last_success:
                row["last_seen_ms"] = rec.last_success
            if link is not None:
                row["bytes_in"] += link.bytes_in
                row["bytes_out"] += link.bytes_out
                # connected: its latest exchange of some bank completed, within stale_after_s
                if (link.last_error is None and link.last_success_ms is not None
                        and t - link.last_success_ms <= stale_ms):
                    row["connected"] = True
            if db is not None:
                for reason, n in peer_refusals(db, rec.key).items():
                    row["refused"][reason] = row["refused"].get(reason, 0) + n
            row["per_bank"].append({"db": db_id, "bank": name, "how": rec.how, "addresses": list(rec.addrs),
                                    "last_success_ms": rec.last_success, "last_error": rec.last_error,
                                    "failures": rec.failures, "next_try_ms": rec.next_try_ms})
    lan = node.network.discovered()
    for d in lan:
        if d["key"] not in by_key:
            by_key[d["key"]] = {"key": d["key"], "addresses": list(d["addresses"]), "how": "lan", "connected": False,
                                "last_seen_ms": None, "bytes_in": 0, "bytes_out": 0, "banks": [], "refused": {},
                                "db": None, "bank": None, "ways": ["lan"], "last_success_ms": None,
                                "last_error": None, "failures": 0, "next_try_ms": 0, "per_bank": []}
    rows = list(by_key.values())
    lines = []
    for r in rows:
        state = "connected" if r["connected"] else "not connected"
        lines.append(f"{short(r['key'])}  {r['how']:<8} {state}, last seen {ago(r['last_seen_ms'], t)}, "
                     f"in {r['bytes_in']} B, out {r['bytes_out']} B  {', '.join(r['addresses'])}")
        if r["banks"]:
            lines.append(f"    banks: {', '.join(r['banks'])}")
        if r["refused"]:
            lines.append("    refused from it: " + ", ".join(f"{k} {n}" for k, n in sorted(r["refused"].items())))
        if r["last_error"]:
            lines.append(f"    last error: {r['last_error']}")
    return Result({"peers": rows, "lan": lan}, "\n".join(lines) or "no peers yet (import a ticket, or share a bank)")


class Refusals(Params):
    limit: Annotated[int, Field(ge=1, le=500, description="how many refusals at most, newest first")] = 50
    before: Annotated[int | None, Field(ge=0, description="only refusals older than this cursor: the `next` "
                                                          "of the previous page")] = None


CURSOR_SEQ = 4096  # a cursor is at_ms * CURSOR_SEQ + (the refusal's number mod CURSOR_SEQ)


@command("refusals", Refusals, "entries this node refused, newest first, with who sent them and why", read_only=True)
def refusals(node: Node, p: Refusals) -> Result:
    from memmesh.node.commands.node_status import short, utc

    found = []
    for db_id in node.database_ids():
        db = node.database(db_id)
        for r in db.recent_refusals(limit=1 << 20):
            cursor = r.at_ms * CURSOR_SEQ + (max(r.seq, 0) % CURSOR_SEQ)
            if p.before is None or cursor < p.before:
                found.append((cursor, db_id, r))
    found.sort(key=lambda f: (f[0], f[1]), reverse=True)
    page = found[:p.limit]
    rows: list[dict[str, Any]] = []
    for cursor, db_id, r in page:
        db = node.database(db_id)
        source = r.source[len("peer:"):] if r.source.startswith("peer:") else (r.source or "local")
        rows.append({"cursor": cursor, "entry": r.id, "author": r.author, "db": db_id, "bank": node.agents.name_of(db_id),
                     "source": source, "reason": r.reason, "first_seen_ms": r.at_ms, "explain": db.explain(r.id)})
    more = len(found) > len(page)
    data = {"refusals": rows, "next": page[-1][0] if more and page else None}
    lines = [f"{utc(row['first_seen_ms'])}  {row['bank']}  {row['reason']}  from {short(row['source'])}  "
             f"{row['entry']}\n    {row['explain']}" for row in rows]
    if data["next"] is not None:
        lines.append(f"more: memmesh refusals --before {data['next']}")
    return Result(data, "\n".join(lines) or "no refusals")


class Sync(Params):
    bank: Annotated[Ref | None, Cli(positional=True), Field(description="only this bank (default: every shared bank)")] = None
    peer: Annotated[str | None, Cli(metavar="URL"), Field(description="sync with this address (http:HOST:PORT) "
                                                                     "instead of the known peers")] = None


class SyncFailed(MemmeshError):
    """A one-shot sync that could not reach a peer."""


@command("sync", Sync, "sync shared banks with their peers now (exit 1 if a peer could not be reached)")
def sync(node: Node, p: Sync) -> Result:
    from memmesh.node.sync.oneshot import sync_now
    from memmesh.tickets.ticket import TicketRejected, parse_address

    if p.peer is not None:
        # A malformed address is the caller's mistake, said as such before any connection.
        try:
            parse_address(p.peer)
        except TicketRejected as exc:
            raise SyncFailed("--peer is not a peer address (http:HOST:PORT, e.g. http:127.0.0.1:7411): "
                             f"{exc.detail}") from None
    if p.bank is not None:
        dbs = [node.agents.resolve(p.bank).db.id]
    else:
        dbs = [d for d in node.sync.shared() if d in node.database_ids()]
    report = node.network.run(lambda run: sync_now(node, dbs, p.peer, run))
    def line(r: dict[str, Any]) -> str:
        # "-" and "?": the peer did not answer its hello, so there is no bank or key to name.
        bank = "" if r["db"] == "-" else f"{node.agents.name_of(r['db'])}: "
        peer = r["address"] if r["peer"] == "?" else f"{r['peer'][:28]}... at {r['address']}"
        return f"{bank}{peer}: " + (f"pulled {r['pulled']}, pushed {r['pushed']}" if r["ok"] else
                                    f"FAILED: {r['error']}")

    lines = [line(r) for r in report]
    failed = [r for r in report if not r["ok"]]
    if failed:
        raise SyncFailed("\n".join(lines) if lines else "no peer could be reached")
    return Result({"exchanges": report}, "\n".join(lines) or "nothing to sync: no shared bank has a known peer")


def _when(epoch_s: int) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(epoch_s))


