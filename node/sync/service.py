"""The sync side of a serving node: the peer API, the sync daemon, LAN discovery, status.

* **Peer API**: ``SyncServer`` (node/sync/protocol.py) behind aiohttp routes; a database is
  served only while it is shared (``memmesh memory share`` / ``import``) and only to keys that
  hold at least Read on it; anything else answers exactly like a database that does not exist.
* **Readers only** (node/sync/readers.py): every push, every page served and every peer named
  or learnt in peer exchange is for a key that holds Read on the bank in its settings as this
  node has them at that moment, asked per request and per round, never cached.
* **Daemon**: a round syncs each database in it with a bounded fan-out of its known peers,
  chosen at random among those not backing off. A commit (local, or received from a peer that
  pushed it) triggers a round for its database at once (pushes go out well under a second after
  commit); a database with no change since its last round is not in that round. Every
  ``interval_s`` a sweep adds the ``sweep_banks`` (32) shared databases synced longest ago, so
  with S shared databases each is exchanged at least every ceil(S / 32) * ``interval_s``
  (every ``interval_s`` up to 32, as before; 1,000 banks at 5 s: every 160 s), which pulls what
  a peer that cannot reach this node holds, and retries failed links. A round's work is the
  databases that changed plus at most ``sweep_banks``, never every database hosted. Failures
  back off exponentially with jitter (node/sync/peerbook.py).
  Exchanges tell each peer whom else we sync the database with (peer exchange), so a bank
  shared along a chain reaches every holder. Peers, backoff and link status are persisted.
* **Discovery** (optional): announce this node on the LAN and look peers up by key when an
  address hint fails.

Every database call runs through the runner the service is built with (serve's database
thread); its events go to the publisher it is built with. It is the node's PeerDiscovery and
SyncTrigger under serve (node/worker.py): both answer nothing until the daemon starts.
"""
from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from memmesh.crdt.clock import now_ms
from memmesh.crdt.database import Database
from memmesh.node import fence
from memmesh.node.sync import messages as m
from memmesh.node.sync import readers, sharing
from memmesh.node.sync.http import HttpTransport, call, run_exchange, sync_app_routes
from memmesh.node.sync.protocol import EXCHANGE_S, Client, Exchange, SyncError, SyncServer
from memmesh.node.sync.state import Lag, lag
from memmesh.node.worker import OFFLINE, EventPublisher, Runner, run_here

if TYPE_CHECKING:
    from memmesh.node.library import Node

log = logging.getLogger("memmesh.sync")
PUSH_DEBOUNCE_S = 0.02
SWEEP_BANKS = 32  # unchanged shared databases a sweep (every interval_s) adds to a round
HELLO_TIMEOUT_S = 5.0  # asking a configured address for its key
HELLO_BACKOFF_CAP_S = 300.0


class ServedNode:
    """What the sync server asks of the node (runs on the database thread)."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def readable(self, db_id: str, caller: str) -> Database | None:
        # Asked on every request: the caller's permission as the settings stand now.
        if not self.node.sync.is_shared(db_id) or db_id not in self.node.database_ids():
            return None
        db = self.node.database(db_id)
        return db if readers.may_read(self.node, db, caller) else None

    def peers_of(self, db_id: str, caller: str) -> list[m.PeerInfo]:
        # Only keys that may read the bank now: naming another key would invite the caller
        # to send it the bank.
        db = self.node.database(db_id)
        return self.node.sync.peers.infos(db_id, exclude=caller, k=m.MAX_PEERS,
                                          keep=lambda key: readers.may_read(self.node, db, key))

    def learn_peers(self, db_id: str, caller: str, peers: list[m.PeerInfo]) -> None:
        # A reader may name anyone: only keys that may read the bank get into the book, or a
        # reader could make this node send the bank to a key nobody granted.
        book = self.node.sync.peers
        db = self.node.database(db_id)
        t = now_ms()
        for p in readers.readers(self.node, db, peers[:m.MAX_PEERS]):
            if p.addrs:
                book.add(db_id, p.key, p.addrs, "exchange", t)
        self.node.sync.save_peers()

    def redeem(self, db_id: str, caller: str, ticket: str, perm: str, proof: bytes) -> str | None:
        # Nothing about db_id is looked up here: sharing.redeem checks the ticket and the proof
        # first, the same work for every id, so timing tells no shared id from another.
        return sharing.redeem(self.node, db_id, caller, ticket, perm, proof)


class SyncService:
    def __init__(self, node: Node, *, address: str, discovery: bool = True, interval_s: float = 5.0,
                 fanout: int = 3, seed: int | None = None, peers: Sequence[str] = (), run: Runner = run_here,
                 events: EventPublisher = OFFLINE, sweep_banks: int = SWEEP_BANKS) -> None:
        """``run``: how database calls run (serve: its database thread; by default in place);
        ``events``: where peer and lag events go (serve: its event bus; by default nowhere);
        ``sweep_banks``: how many unchanged databases each sweep adds (module docstring)."""
        self.node = node
        self._run = run
        self._events = events
        self.address = address  # the address hint peers reach this node at: "http:host:port"
        self.discovery = discovery
        self.interval_s = interval_s
        self.fanout = fanout
        # config.yaml's sync.peers: addresses synced with every shared database each round, on
        # top of the fan-out; the key behind each is asked once (hello) and remembered.
        self.peers = tuple(peers)
        self._peer_keys: dict[str, str] = {}
        self._hello_backoff: dict[str, tuple[int, float]] = {}  # address -> (failures, not before)
        self._full_now = False
        self.server = SyncServer(node.peer_key, ServedNode(node))
        self.client = Client(node.peer_key)
        self._rnd = random.Random(seed)
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task] = []
        self._wake: asyncio.Event | None = None
        self._dirty: set[str] = set()
        self._unsubscribe: dict[str, Any] = {}
        self._running: dict[tuple[str, str], asyncio.Task] = {}
        self._discovery: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.sweep_banks = sweep_banks
        self._synced_at: dict[str, float] = {}  # db id -> loop time its last round started
        self.rounds = 0
        self.last_round: tuple[str, ...] = ()  # the databases of the latest round
        self.banks_synced = 0  # databases synced over every round
        # What the event stream was last told per (db, peer): connected or not, and the lag.
        self._connected: dict[tuple[str, str], bool] = {}
        self._lags: dict[tuple[str, str], Lag] = {}

    # ------------------------------------------------------------------ lifecycle
    def add_routes(self, app: web.Application) -> None:
        """Add the peer sync API (/sync/v1/*) to the serve app."""
        sync_app_routes(app, self.server, self._run)

    async def start(self) -> None:
        """Start the daemon (and discovery), on the loop it runs on."""
        self._loop = asyncio.get_running_loop()  # from here on pokes and reloads reach the daemon
        self._wake = asyncio.Event()
        self._session = aiohttp.ClientSession()
        await self._run(lambda: self.node.sync.set_address(self.address))
        if self.discovery:
            await self._start_discovery()
        self._tasks.append(asyncio.create_task(self._daemon(), name="memmesh-sync-daemon"))

    async def stop(self) -> None:
        """Stop the daemon and discovery; in-flight exchanges end; nothing acknowledged is lost."""
        for task in self._tasks + list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._tasks, *self._running.values(), return_exceptions=True)
        self._tasks.clear()
        run = self._run
        for unsubscribe in list(self._unsubscribe.values()):
            await run(unsubscribe)
        self._unsubscribe.clear()
        await run(self.node.sync.save_peers)
        if self._discovery is not None:
            try:
                await self._discovery.stop()
            except Exception as exc:  # stopping must not lose the rest of the shutdown
                log.warning("discovery did not stop cleanly: %s", exc)
        if self._session is not None:
            await self._session.close()

    async def _start_discovery(self) -> None:
        try:
            from memmesh.node.sync.discovery import Discovery
        except ImportError:  # pragma: no cover - the module ships with memmesh
            return
        host, port = self.address[len("http:"):].rsplit(":", 1)
        try:
            # A node listening on loopback announces (and looks) on loopback only.
            self._discovery = (Discovery(interfaces=["127.0.0.1"], addresses=["127.0.0.1"]) if _loopback(host)
                               else Discovery())
            await self._discovery.start(int(port), str(self.node.peer_key.public))
        except Exception as exc:
            log.warning("LAN discovery is off: %s", exc)
            self._discovery = None

    # ------------------------------------------------------------------ daemon
    def _watch(self, db_id: str, hosted: set[str] | None = None) -> None:
        """Push soon after every commit to this database (called on the database thread;
        ``hosted``: the databases hosted, when the caller read them already)."""
        if db_id in self._unsubscribe or db_id not in (set(self.node.database_ids()) if hosted is None else hosted):
            return
        loop = self._loop

        def stored(_ids: tuple[str, ...]) -> None:
            self._tell_lag(db_id)  # a commit changes what each peer lacks
            if loop is not None:
                loop.call_soon_threadsafe(self._poke, db_id)

        self._unsubscribe[db_id] = self.node.database(db_id).on_stored(stored)

    def poke(self, db_id: str) -> None:
        """Sync ``db_id`` soon (any thread; nothing before the daemon starts)."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._poke, db_id)

    def _poke(self, db_id: str) -> None:
        self._dirty.add(db_id)
        if self._wake is not None:
            self._wake.set()

    async def _daemon(self) -> None:
        run = self._run
        last_sweep: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            # interval_s is read each time round: a reload (configure) changes it live
            if last_sweep is None or self._full_now or now >= last_sweep + self.interval_s:
                last_sweep, self._full_now = now, False
                shared = await run(self._shared_and_watch)
                todo = self._sweep(shared)
                self._dirty.clear()  # a changed database that is no longer shared is not synced
            else:
                asked = set(self._dirty)
                self._dirty -= asked
                todo = await run(partial(self._still_shared, asked)) if asked else set()
            if todo:
                self.rounds += 1
                self.last_round = tuple(sorted(todo))
                self.banks_synced += len(todo)
                for db_id in todo:
                    self._synced_at[db_id] = now
                configured = await self._configured_peers()
                await asyncio.gather(*(self._round(db_id, configured) for db_id in sorted(todo)),
                                     return_exceptions=True)
            assert self._wake is not None
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.0, last_sweep + self.interval_s - loop.time()))
                await asyncio.sleep(PUSH_DEBOUNCE_S)  # gather the commits of one burst
            except TimeoutError:
                pass
            self._wake.clear()

    def _sweep(self, shared: Sequence[str]) -> set[str]:
        """A sweep's databases: every changed one, and the ``sweep_banks`` unchanged ones synced
        longest ago (never synced first)."""
        changed = self._dirty & set(shared)
        rest = sorted((d for d in shared if d not in changed), key=lambda d: (self._synced_at.get(d, -1.0), d))
        return changed | set(rest[:self.sweep_banks])

    def _still_shared(self, db_ids: set[str]) -> set[str]:
        """Of the databases that changed, those shared and hosted now, watched from now on (a
        database shared since the last sweep pokes the daemon)."""
        hosted = set(self.node.database_ids())
        out = {d for d in db_ids if d in hosted and self.node.sync.is_shared(d)}
        for db_id in out:
            self._watch(db_id, hosted)
        return out

    def _shared_and_watch(self) -> list[str]:
        hosted = set(self.node.database_ids())
        shared = [d for d in self.node.sync.shared() if d in hosted]
        for db_id in shared:
            self._watch(db_id, hosted)
        kept = set(shared)
        for db_id in list(self._unsubscribe):
            if db_id not in kept:
                self._unsubscribe.pop(db_id)()
        for db_id in list(self._synced_at):
            if db_id not in kept:
                del self._synced_at[db_id]
        return shared

    async def _round(self, db_id: str, configured: Sequence[tuple[str, str]] = ()) -> None:
        run = self._run
        targets = await run(lambda: self.targets(db_id, configured))
        results = await asyncio.gather(*(self.exchange(db_id, key, addrs) for key, addrs in targets.items()),
                                       return_exceptions=True)
        for (key, _addrs), r in zip(targets.items(), results):
            if isinstance(r, SyncError) and r.reason != "sync.not_found":
                # Maybe another node answers at that address now: ask it for its key again.
                for address in [a for a, k in self._peer_keys.items() if k == key]:
                    del self._peer_keys[address]
            if isinstance(r, BaseException) and not isinstance(r, (SyncError, asyncio.CancelledError)):
                log.warning("sync of %s failed: %s", db_id, r)
        await run(self.node.sync.save_peers)

    def targets(self, db_id: str, configured: Sequence[tuple[str, str]] = ()) -> dict[str, list[str]]:
        """This round's peers of ``db_id`` and their addresses (database thread): a fan-out drawn
        among the known peers that may read it now, and every configured peer that may. Asked
        each round, never cached: a key that lost Read is not contacted for the bank from this
        round on. A configured peer, or one synced before, that may not read it is told in its
        link status why nothing is sent to it."""
        if db_id not in self.node.database_ids():
            return {}
        db = self.node.database(db_id)
        peers = self.node.sync.peers.choose(db_id, self.fanout, now_ms(), self._rnd,
                                            keep=lambda key: readers.may_read(self.node, db, key))
        targets = {p.key: list(p.addrs) for p in peers}
        refused: dict[str, str] = {}
        for key, address in configured:  # every configured peer that may read it, chosen or not
            why = readers.refusal(self.node, db, key)
            if why is not None:
                refused[key] = why
                continue
            addrs = targets.setdefault(key, [])
            if address not in addrs:
                addrs.insert(0, address)
        for link in self.node.sync.links(db_id):
            if link.peer not in targets and link.peer not in refused:
                why = readers.refusal(self.node, db, link.peer)
                if why is not None:
                    refused[link.peer] = why
        for key, why in refused.items():
            self._not_sent(db_id, key, why)
        return targets

    def _not_sent(self, db_id: str, peer: str, why: str) -> None:
        """The link status of a peer that may not read the bank says so (written on a change only)."""
        error = f"{readers.NO_GRANT}: {why}: nothing of it is sent to this peer"
        link = self.node.sync.link_if_any(db_id, peer)
        if link is not None and link.last_error == error:
            return
        link = self.node.sync.link(db_id, peer)
        link.last_attempt_ms, link.last_error = now_ms(), error
        self.node.sync.save_link(link)
        self._tell_link(db_id, peer, error)
        log.info("not syncing %s with %s: %s", db_id[:15], peer[:20], why)

    # ------------------------------------------------------------------ configured peers
    def configure(self, *, interval_s: float, fanout: int, peers: Sequence[str]) -> None:
        """New daemon settings from a reload (callable from any thread): they hold from the next
        round, which starts at once."""
        def apply() -> None:
            self.interval_s, self.fanout, self.peers = interval_s, fanout, tuple(peers)
            self._full_now = True
            if self._wake is not None:
                self._wake.set()

        if self._loop is None:
            apply()
        else:
            self._loop.call_soon_threadsafe(apply)

    async def _configured_peers(self) -> list[tuple[str, str]]:
        """(key, address) of each configured peer that answers (never this node itself)."""
        keys = await asyncio.gather(*(self._key_at(a) for a in self.peers))
        me = str(self.node.peer_key.public)
        return [(k, a) for k, a in zip(keys, self.peers) if k is not None and k != me]

    async def _key_at(self, address: str) -> str | None:
        """The key of the node at ``address`` (hello), remembered; after a failure, asked again
        only after a backoff (doubling, up to 5 min)."""
        if address in self._peer_keys:
            return self._peer_keys[address]
        assert self._session is not None and self._loop is not None
        failures, not_before = self._hello_backoff.get(address, (0, 0.0))
        if self._loop.time() < not_before:
            return None
        try:
            key, _hello = await call(HttpTransport(self._session, timeout=HELLO_TIMEOUT_S), self.client,
                                     address, "*", m.Hello())
        except SyncError as exc:
            wait = min(HELLO_BACKOFF_CAP_S, float(2 ** min(failures, 16)))
            self._hello_backoff[address] = (failures + 1, self._loop.time() + wait)
            log.info("configured peer %s does not answer (asking again in %g s): %s", address, wait, exc)
            return None
        self._hello_backoff.pop(address, None)
        self._peer_keys[address] = key
        return key

    async def exchange(self, db_id: str, peer: str, addrs: list[str]) -> Exchange | None:
        """One exchange of ``db_id`` with ``peer``, trying its addresses (and, with discovery,
        the address the LAN announces for its key); the outcome goes to the link status."""
        key = (db_id, peer)
        if key in self._running:  # one exchange per link at a time
            return None
        task = asyncio.current_task()
        if task is not None:
            self._running[key] = task
        try:
            return await self._exchange(db_id, peer, addrs)
        finally:
            self._running.pop(key, None)

    async def _exchange(self, db_id: str, peer: str, addrs: list[str]) -> Exchange:
        assert self._session is not None
        run = self._run
        candidates = list(addrs)
        if self._discovery is not None:
            found = self._discovery.find(peer)
            if found is not None:
                candidates += [a for a in found.addresses if a not in candidates]
        db = await run(lambda: self.node.database(db_id))
        known = await run(lambda: [m.PeerInfo(str(self.node.peer_key.public), (self.address,))]
                          + self.node.sync.peers.infos(db_id, exclude=peer, k=16, rnd=self._rnd,
                                                       keep=lambda key: readers.may_read(self.node, db, key)))
        last_error: SyncError | None = None
        seen = None  # the stats of the last attempt that got past the feeds step
        for address in candidates:
            # asked again before each request: a revocation pulled meanwhile stops it
            exchange = Exchange(db, peer, known_peers=known, refusal=lambda: readers.refusal(self.node, db, peer),
                                deadline_s=EXCHANGE_S)
            try:
                await run_exchange(HttpTransport(self._session), self.client, address, peer, exchange, run)
            except SyncError as exc:
                last_error = exc
                if exchange.stats.peer_feeds is not None:
                    seen = exchange.stats
                continue
            await run(partial(self._record_success, db, peer, address, exchange))
            if exchange.stats.cut:  # its deadline stopped it: the rest goes in the next round, now
                self._poke(db_id)
            return exchange
        error = last_error or SyncError("sync.no_address", f"no address known for {peer}")
        await run(lambda: self._record_failure(db_id, peer, error, seen))
        raise error

    def _record_success(self, db: Database, peer: str, address: str, exchange: Exchange) -> None:
        db_id = db.id
        exchange.stats.peers = readers.readers(self.node, db, exchange.stats.peers)  # learn only readers
        self.node.sync.record_exchange(db_id, peer, address, exchange.stats)
        fence.after_exchange(self.node, db, peer, exchange.stats)  # the node's own entries may be back
        self._tell_link(db_id, peer, None)
        st = exchange.stats
        log.info("synced %s with %s at %s: pulled %d, pushed %d", db_id[:15], peer[:20], address, st.pulled, st.pushed)

    def _record_failure(self, db_id: str, peer: str, error: SyncError, seen: Any = None) -> None:
        self.node.sync.record_failure(db_id, peer, f"{error.reason}: {error}", seen)
        self._tell_link(db_id, peer, f"{error.reason}: {error}")
        log.info("sync of %s with %s failed: %s", db_id[:15], peer[:20], error)

    # ------------------------------------------------------------------ events (database thread)
    def _tell_link(self, db_id: str, peer: str, error: str | None) -> None:
        """peer.connected / peer.lost when an exchange's outcome differs from the last one's, and
        lag.changed; ``error`` None: the exchange succeeded."""
        link = (db_id, peer)
        ok = error is None
        if self._connected.get(link) is not ok:
            self._connected[link] = ok
            if ok:
                self._events.publish("peer.connected", {"peer": peer, "db": db_id})
            else:
                self._events.publish("peer.lost", {"peer": peer, "db": db_id, "error": error})
        self._tell_lag(db_id, peer)

    def _tell_lag(self, db_id: str, peer: str | None = None) -> None:
        """lag.changed for each link of ``db_id`` (or the one with ``peer``) whose exact lag
        (node/sync/state.lag) differs from what was last told; a first zero is no change."""
        if db_id not in self.node.database_ids():
            return
        db = self.node.database(db_id)
        for status in self.node.sync.links(db_id):
            if peer is not None and status.peer != peer:
                continue
            now, link = lag(db, status), (db_id, status.peer)
            before = self._lags.get(link, Lag(0, 0))
            self._lags[link] = now
            if now != before:
                self._events.publish("lag.changed", {
                    "db": db_id, "bank": self.node.agents.name_of(db_id), "peer": status.peer,
                    "peer_lacks": now.peer_lacks, "we_lack": now.we_lack})

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        discovered = []
        if self._discovery is not None:
            discovered = [{"key": p.key, "addresses": list(p.addresses)} for p in self._discovery.peers()]
        return {"address": self.address, "discovery": self._discovery is not None, "rounds": self.rounds,
                "interval_s": self.interval_s, "fanout": self.fanout, "peers": list(self.peers),
                "discovered": discovered}

    # ------------------------------------------------------------------ discovery (PeerDiscovery)
    def lookup(self, key: str) -> list[str]:
        """The addresses the LAN announces for ``key``."""
        if self._discovery is None:
            return []
        found = self._discovery.find(key)
        return list(found.addresses) if found else []

    def discovered(self) -> list[dict[str, Any]]:
        """The peers seen on the LAN."""
        return list(self.status()["discovered"])


def _loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "[::1]") or host.startswith("127.")
