"""`memmesh sync`: one exchange per shared bank and known peer, now (for scripts).

Under `serve` it runs on the serve loop beside the daemon (and records the same link status);
otherwise in the command's own process. Like the daemon, it syncs a bank only with keys that
hold Read on it now (node/sync/readers.py): a known peer that lost Read is skipped, and a peer
named with ``--peer`` that holds none is reported and sent nothing.
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import aiohttp

from memmesh.node import fence
from memmesh.node.sync import messages as m
from memmesh.node.sync import readers
from memmesh.node.sync.http import HttpTransport, call, run_exchange
from memmesh.node.sync.protocol import EXCHANGE_S, Client, Exchange, ExchangeStats, SyncError
from memmesh.node.worker import Runner

if TYPE_CHECKING:
    from memmesh.node.sync.host import SyncHost
    from memmesh.node.sync.peerbook import PeerRecord


async def sync_now(node: SyncHost, dbs: list[str], peer_url: str | None, run: Runner, *,
                   repairing: bool = False) -> list[dict[str, Any]]:
    """One exchange per bank and peer. ``repairing`` (``memmesh check --repair``) asks every
    peer the book knows for the bank, readers or not in this node's copy of the settings: that
    copy may be damaged and have lost the very grants that name them. Nothing of the bank
    goes to a key that may not read it even then: the exchange asks before every request, and
    a peer refused at that moment is pulled from blind (told no feeds, evidence or wanted
    ids) and never pushed to nor told of peers, unless the pulls bring its grant back."""
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
            def peers_of(db: str) -> list[PeerRecord]:
                return node.sync.peers.peers(db) if repairing else _readers_of(node, db)

            for db in dbs:
                records = await run(partial(peers_of, db))
                targets[db] = [(r.key, list(r.addrs) + [a for a in node.network.lookup(r.key) if a not in r.addrs])
                               for r in records]
        for db_id, peers in targets.items():
            db = await run(partial(node.database, db_id))
            for key, addrs in peers:
                why = None if repairing else await run(partial(readers.refusal, node, db, key))
                if why is not None:  # only a named --peer gets here: the book's were filtered
                    report.append({"db": db_id, "peer": key, "address": addrs[0] if addrs else "-", "ok": False,
                                   "error": f"{readers.NO_GRANT}: {why}: nothing of it was sent", "pulled": 0,
                                   "pushed": 0})
                    continue
                report.append(await _one(node, transport, client, db, key, addrs, run, repairing))
        await run(node.sync.save_peers)
    return report


def _learnt(node: SyncHost, db: Any, key: str, address: str, stats: ExchangeStats) -> None:
    """What an exchange taught: only peers that may read the bank get into the book."""
    stats.peers = readers.readers(node, db, stats.peers)
    node.sync.record_exchange(db.id, key, address, stats, how="manual")


def _readers_of(node: SyncHost, db_id: str) -> list[PeerRecord]:
    """The known peers of ``db_id`` that may read it now (database thread)."""
    db = node.database(db_id)
    return [r for r in node.sync.peers.peers(db_id) if readers.may_read(node, db, r.key)]


async def _one(node: SyncHost, transport: HttpTransport, client: Client, db, key: str, addrs: list[str],
               run: Runner, repairing: bool = False) -> dict[str, Any]:
    error = "no address known"
    seen = None  # the stats of the last attempt that got past the feeds step
    for address in addrs:
        exchange = Exchange(db, key, known_peers=[m.PeerInfo(str(node.peer_key.public), (node.sync.address() or "http:127.0.0.1:7411",))],
                            refusal=lambda: readers.refusal(node, db, key), blind=repairing, deadline_s=EXCHANGE_S)
        try:
            await run_exchange(transport, client, address, key, exchange, run)
        except SyncError as exc:
            error = f"{exc.reason}: {exc}"
            seen = exchange.stats if exchange.stats.peer_feeds is not None else seen
            continue

        await run(partial(_learnt, node, db, key, address, exchange.stats))
        await run(partial(fence.after_exchange, node, db, key, exchange.stats))  # its own entries may be back
        # ok, but maybe not whole: the exchange's deadline cut it (the next one goes on), or a
        # blind repair sent the peer nothing of ours; both say so rather than pass as complete.
        return {"db": db.id, "peer": key, "address": address, "ok": True, "error": None,
                "pulled": exchange.stats.pulled, "pushed": exchange.stats.pushed,
                "cut": exchange.stats.cut, "withheld": exchange.stats.withheld}

    await run(lambda: node.sync.record_failure(db.id, key, error, seen))
    return {"db": db.id, "peer": key, "address": addrs[0] if addrs else "-", "ok": False, "error": error,
            "pulled": 0, "pushed": 0}
