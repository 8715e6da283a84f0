"""`memmesh sync`: one exchange per shared bank and known peer, now (for scripts).

Under `serve` it runs on the serve loop beside the daemon (and records the same link status);
otherwise in the command's own process.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import aiohttp

from node import fence
from node.sync import messages as m
from node.sync.http import HttpTransport, call, run_exchange
from node.sync.protocol import Client, Exchange, SyncError
from node.worker import Runner

if TYPE_CHECKING:
    from node.library import Node


async def sync_now(node: "Node", dbs: list[str], peer_url: str | None, run: Runner) -> list[dict[str, Any]]:
    client = Client(node.peer_key)
    report: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as session:
        transport = HttpTransport(session)
        targets: dict[str, list[tuple[str, list[str]]]] = {}
        if peer_url is not None:
            try:
                key, _hello = await call(transport, client, peer_url, "*", m.Hello())
            except SyncError as exc:
                return [{"db": db, "peer": "?", "address": peer_url, "ok": False, "error": str(exc),
                         "pulled": 0, "pushed": 0} for db in dbs] or [
                    {"db": "-", "peer": "?", "address": peer_url, "ok": False, "error": str(exc), "pulled": 0, "pushed": 0}]
            targets = {db: [(key, [peer_url])] for db in dbs}
        else:
            for db in dbs:
                records = await run(lambda db=db: node.sync.peers.peers(db))
                targets[db] = [(r.key, list(r.addrs) + [a for a in node.network.lookup(r.key) if a not in r.addrs])
                               for r in records]
        for db_id, peers in targets.items():
            db = await run(lambda db_id=db_id: node.database(db_id))
            for key, addrs in peers:
                report.append(await _one(node, transport, client, db, key, addrs, run))
        await run(node.sync.save_peers)
    return report


async def _one(node: "Node", transport: HttpTransport, client: Client, db, key: str, addrs: list[str],
               run: Runner) -> dict[str, Any]:
    error = "no address known"
    seen = None  # the stats of the last attempt that got past the feeds step
    for address in addrs:
        exchange = Exchange(db, key, known_peers=[m.PeerInfo(str(node.peer_key.public), (node.sync.address() or "http:127.0.0.1:7411",))])
        try:
            await run_exchange(transport, client, address, key, exchange, run)
        except SyncError as exc:
            error = f"{exc.reason}: {exc}"
            seen = exchange.stats if exchange.stats.peer_feeds is not None else seen
            continue

        await run(lambda: node.sync.record_exchange(db.id, key, address, exchange.stats, how="manual"))
        await run(lambda: fence.after_exchange(node, db, key, exchange.stats))  # its own entries may be back
        return {"db": db.id, "peer": key, "address": address, "ok": True, "error": None,
                "pulled": exchange.stats.pulled, "pushed": exchange.stats.pushed}

    await run(lambda: node.sync.record_failure(db.id, key, error, seen))
    return {"db": db.id, "peer": key, "address": addrs[0] if addrs else "-", "ok": False, "error": error,
            "pulled": 0, "pushed": 0}
