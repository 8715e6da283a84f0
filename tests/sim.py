"""A seeded, in-process simulator of many peers syncing one bank (no sockets, no threads).

Every peer is real: a ``Database`` on ``MemoryStorage``, its own Ed25519 key, a ``SyncServer``
and a ``Client`` (node/sync/protocol.py), and a ``PeerBook``. Only the network is simulated:

- each request and each reply is lost with probability ``p_loss`` (the exchange stops there
  and the peer is backed off: ``record_failure``); each request is duplicated with probability
  ``p_dup``, and the copy is delivered later in the round (it must be refused as a replay, or,
  if the original was lost, it is a first delivery whose answer nobody reads);
- the exchanges of one round run interleaved, one message at a time in a random order;
- a partition splits the peers into 2 or 3 groups that cannot reach each other for some
  rounds, then heals.

The bank's admin grants every peer key Read and each writer key Write in the root; every peer
starts with that root only. Each peer first knows 2 or 3 others (a sparse random graph, made
weakly connected, learnt as from a ticket); peer exchange (``known_peers``) spreads the rest.
In each round every peer runs one ``Exchange`` with each of up to ``fanout`` peers drawn by
``PeerBook.choose``; writers (one writer key on one peer only) write during the first rounds.
The run stops when every peer stores the same set of entries (compared each round) and has the
same ``state`` (compared at the end), or after ``max_rounds``.

``simulate(SimConfig(...))`` returns a ``SimResult``; bench/sim.py is the command line.
"""
from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import pycrdt

from memmesh.auth.keys import SigningKey
from memmesh.auth.ops import GrantOp
from memmesh.auth.permissions import holds
from memmesh.crdt.database import SETTINGS, Database
from memmesh.crdt.storage import MemoryStorage
from memmesh.node.sync import messages as m
from memmesh.node.sync.peerbook import PeerBook
from memmesh.node.sync.protocol import Client, Exchange, Outgoing, SyncError, SyncServer

__all__ = ["SimConfig", "SimResult", "SimError", "simulate", "db_state", "max_requests_per_exchange"]


@dataclass(frozen=True)
class SimConfig:
    peers: int = 100
    seed: int = 1
    fanout: int = 3
    degree: tuple[int, int] = (2, 3)  # how many peers each one knows at the start
    writers: int = 5  # writer keys, each on its own peer
    write_rounds: int = 3  # rounds 0 .. write_rounds-1 have writes
    writes_per_round: int = 2  # entries per writer per write round
    p_loss: float = 0.05
    p_dup: float = 0.05
    partition: tuple[int, int] | None = (1, 5)  # rounds [start, end) split; healed at `end`
    groups: int | None = None  # 2 or 3 (None: drawn from the seed)
    max_rounds: int = 60
    page_bytes: int = 2048  # small pages: several pulls and pushes per exchange
    round_ms: int = 10_000  # simulated time between rounds
    share: int | None = None  # peers told per peer exchange (None: every known one)
    value_bytes: int = 40
    interleave: bool = True  # False: each exchange runs to its end before the next starts


@dataclass
class SimResult:
    config: dict[str, Any]
    converged: bool
    rounds: int  # rounds run
    converged_round: int | None  # index of the round at whose end all peers were identical
    last_write_round: int
    heal_round: int | None
    rounds_after_last_write: int | None  # rounds run from the last write's round to convergence
    rounds_after_heal: int | None
    entries: int  # entries stored on every peer at the end (the root included)
    requests_per_peer_round_mean: float
    requests_per_peer_round_max: int
    exchanges_per_peer_round_max: int
    requests_per_exchange_max: int
    request_bound_per_round: int  # fanout x max_requests_per_exchange(entries)
    incoming_per_peer_round_max: int
    requests: int
    exchanges: int
    failed_exchanges: int
    lost: int
    unreachable: int  # across the partition
    duplicates: int
    replays_refused: int
    late_copies: int  # duplicates whose original was lost: served once, answer unread
    pulled: int  # entries stored by pulling
    pulled_pending: int  # pulled entries that had to wait for a parent
    pushed: int  # entries stored by pushing
    pushed_pending: int
    pushed_duplicates: int  # pushed entries the peer already held (sent for nothing)
    pending_left: int  # entries still waiting in some peer's pending area at the end
    errors: dict[str, int]  # SyncError reasons seen by clients
    push_refused: dict[str, int]
    pulled_refused: dict[str, int]
    peerbook_max: int
    peerbook_mean: float
    states_equal: bool
    setup_s: float
    wall_s: float
    per_round: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class SimError(AssertionError):
    """An invariant of the simulation does not hold (a fan-out exceeded, a replay accepted)."""


def db_state(db: Database) -> dict[str, Any]:
    """Everything observable of a database (as tests/dbkit.py ``state``): the accepted set, the
    store documents, the shown rows, the settings."""
    stores = {}
    for store in db.stores():
        stores[store] = json.dumps(db.doc(store).get(store, type=pycrdt.Map).to_py(), sort_keys=True, default=repr)
    return {
        "accepted": sorted(db.accepted_ids()),
        "stores": stores,
        "rows": {s: [(r.key, json.dumps(r.value, sort_keys=True, default=repr)) for r in db.rows(s)]
                 for s in db.stores()},
        "settings": sorted((k, repr(v.permission), v.status) for k, v in db.settings().items()),
    }


def max_requests_per_exchange(entries: int) -> int:
    """The most requests one Exchange can make when ``entries`` entries are in flight: feeds,
    at most one pull page per entry plus the last empty one, at most one push page per entry,
    and peers."""
    return 1 + (entries + 1) + entries + 1


# --------------------------------------------------------------------------- the peers
class _Clock:
    """Simulated time in ms, shared by a peer's client and database."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


class _Peer:
    """One simulated node: its key, database, peer book, server and client."""

    def __init__(self, index: int, key: SigningKey, db: Database, clock: _Clock, rnd: random.Random,
                 share: int | None) -> None:
        self.index = index
        self.key = key
        self.pub = str(key.public)
        self.addr = f"http:10.{index >> 16 & 255}.{index >> 8 & 255}.{index & 255}:7411"
        self.db = db
        self.rnd = rnd
        self.share = share
        self.book = PeerBook(self.pub, rnd=rnd)
        self._clock = clock
        self.stored: set[str] = {s.id for s in db.storage.entries(db.id)}
        self._settings = None  # the database's AuthSettings, until a settings entry arrives
        db.on_stored(self._on_stored)
        self.server = SyncServer(key, self)
        self.client = Client(key, clock=clock)
        self.writer_keys: list[SigningKey] = []
        self.writes = 0

    @property
    def now(self) -> int:
        return self._clock.now

    @now.setter
    def now(self, value: int) -> None:
        self._clock.now = value

    def _on_stored(self, ids: tuple[str, ...]) -> None:
        self.stored.update(ids)
        # Database.settings() / permission() rebuild the settings from every grant on each call
        # (O(grants)): keep them until a settings entry arrives.
        if self._settings is not None and any(SETTINGS in getattr(self.db.entry(i), "stores", ()) for i in ids):
            self._settings = None

    def may_read(self, key: str) -> bool:
        if self._settings is None:
            self._settings = self.db.settings()
        st = self._settings.get(key)  # as Database.permission reads it
        return st is not None and st.status == "active" and holds(st.permission, "read")

    # ServedNode
    def readable(self, db_id: str, caller: str) -> Database | None:
        return self.db if db_id == self.db.id and self.may_read(caller) else None

    def peers_of(self, db_id: str, caller: str) -> list[m.PeerInfo]:
        return self.book.infos(db_id, exclude=caller, k=self.share, rnd=self.rnd)

    def learn_peers(self, db_id: str, caller: str, peers: list[m.PeerInfo]) -> None:
        self.learn(peers)

    def redeem(self, db: Database, caller: str, ticket: str, proof: bytes) -> str:
        raise SyncError("ticket.unknown", "no invites in the simulator")

    def learn(self, peers: list[m.PeerInfo]) -> None:
        # Peer exchange only with keys that may read the database (the server checked the
        # caller; each hint is checked here).
        for p in peers:
            if p.key != self.pub and self.may_read(p.key):
                self.book.add(self.db.id, p.key, p.addrs, "exchange", self.now)


@dataclass
class _Task:
    peer: _Peer
    target: _Peer
    exchange: Exchange
    requests: int = 0


@dataclass
class _Dup:
    target: _Peer
    out: Outgoing
    original_delivered: bool


class _Sim:
    def __init__(self, cfg: SimConfig, state: Callable[[Database], Any]) -> None:
        if cfg.peers < 2:
            raise ValueError("a simulation needs at least 2 peers")
        self.cfg = cfg
        self.state = state
        self.rnd = random.Random(cfg.seed)
        self.counts: dict[str, int] = dict.fromkeys(
            ("requests", "exchanges", "failed", "lost", "unreachable", "duplicates", "replays", "late",
             "pulled", "pulled_pending", "pushed", "pushed_pending", "pushed_duplicates"), 0)
        self.errors: dict[str, int] = {}
        self.push_refused: dict[str, int] = {}
        self.pulled_refused: dict[str, int] = {}
        self.group: list[int] | None = None

    # ------------------------------------------------------------------------ setup
    def setup(self) -> None:
        cfg, rnd = self.cfg, self.rnd
        seed = rnd.getrandbits(64).to_bytes(8, "big")

        def derive(label: str, i: int) -> SigningKey:
            return SigningKey.from_seed(hashlib.sha256(seed + label.encode() + i.to_bytes(4, "big")).digest())

        admin = derive("admin", 0)
        keys = [derive("peer", i) for i in range(cfg.peers)]
        writer_keys = [derive("writer", i) for i in range(min(cfg.writers, cfg.peers))]
        grants = [GrantOp(str(k.public), "read", None) for k in keys]
        grants += [GrantOp(str(k.public), "write", 10) for k in writer_keys]
        # The same seed makes the same database (its id and every entry id), hence the same run.
        origin = Database.create(MemoryStorage(), admin, meta={"kind": "bank", "display_name": "sim"},
                                 extra_grants=grants, nonce=hashlib.sha256(seed + b"nonce").digest()[:16],
                                 clock=lambda: 0)
        first = [(s.header, dict(s.payloads)) for s in origin.storage.entries(origin.id)]
        self.db_id = origin.id
        self.universe: set[str] = {s.id for s in origin.storage.entries(origin.id)}
        self.peers: list[_Peer] = []
        for i, k in enumerate(keys):
            storage = MemoryStorage()
            storage.add_database(origin.id)
            clock = _Clock()
            db = Database(storage, origin.id, clock=clock)  # the pending area's TTL runs on simulated time
            db.ingest(first, source="bank")
            self.peers.append(_Peer(i, k, db, clock, random.Random(rnd.getrandbits(64)), cfg.share))
        for wk, p in zip(writer_keys, rnd.sample(self.peers, len(writer_keys))):
            p.writer_keys.append(wk)  # one key writes from one place
        self._initial_graph()

    def _initial_graph(self) -> None:
        cfg, rnd, n = self.cfg, self.rnd, self.cfg.peers
        lo, hi = cfg.degree
        links: list[set[int]] = [set() for _ in range(n)]
        for i in range(n):
            others = [j for j in rnd.sample(range(n), min(n, hi + 1)) if j != i]
            links[i].update(others[: rnd.randint(min(lo, n - 1), min(hi, n - 1))])
        # Weakly connected, or some peers could never learn of the others.
        parent = list(range(n))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for i in range(n):
            for j in links[i]:
                parent[find(i)] = find(j)
        roots = sorted({find(i) for i in range(n)})
        for a, b in zip(roots, roots[1:]):
            links[a].add(b)
        for i, p in enumerate(self.peers):
            for j in sorted(links[i]):
                p.book.add(self.db_id, self.peers[j].pub, (self.peers[j].addr,), "ticket", 0)
        self.by_key = {p.pub: p for p in self.peers}

    # ------------------------------------------------------------------------ one round
    def write(self, r: int) -> int:
        n = 0
        for p in self.peers:
            for wk in p.writer_keys:
                for _ in range(self.cfg.writes_per_round):
                    txn = p.db.transaction(wk)
                    txn.append("memory", {"key": f"w{wk.public.raw[:3].hex()}-{p.writes}",
                                          "value": "x" * self.cfg.value_bytes, "tags": [f"r{r}"]})
                    self.universe.add(txn.commit())
                    p.writes += 1
                    n += 1
        return n

    def reachable(self, a: _Peer, b: _Peer) -> bool:
        return self.group is None or self.group[a.index] == self.group[b.index]

    def run_round(self, r: int, now: int) -> dict[str, Any]:
        cfg, rnd = self.cfg, self.rnd
        for p in self.peers:
            p.now = now
        pool: list[_Task | _Dup] = []
        sent = [0] * cfg.peers
        exchanges = [0] * cfg.peers
        incoming = [0] * cfg.peers
        for p in self.peers:
            targets = p.book.choose(self.db_id, cfg.fanout, now, p.rnd)
            for rec in targets:
                known = p.book.infos(self.db_id, exclude=rec.key, k=cfg.share, rnd=p.rnd)
                ex = Exchange(p.db, rec.key, page_bytes=cfg.page_bytes, known_peers=known)
                pool.append(_Task(p, self.by_key[rec.key], ex))
                exchanges[p.index] += 1
        failed = 0
        max_per_exchange = 0
        if not cfg.interleave:
            rnd.shuffle(pool)
            # taken from the end: a random order, each exchange to its end (a duplicate request,
            # appended, arrives right after its original)
        while pool:
            i = rnd.randrange(len(pool)) if cfg.interleave else len(pool) - 1
            item = pool[i]
            finished = True
            if isinstance(item, _Dup):
                self._deliver_dup(item, now)
            else:
                finished, ok = self._step(item, now, pool, sent, incoming)
                if finished:
                    max_per_exchange = max(max_per_exchange, item.requests)
                    failed += not ok
                    self._account(item.exchange.stats)
            if finished:
                pool[i] = pool[-1]
                pool.pop()
        self.counts["exchanges"] += sum(exchanges)
        self.counts["failed"] += failed
        return {"round": r, "requests": sum(sent), "exchanges": sum(exchanges), "failed": failed,
                "sent_max": max(sent), "exchanges_max": max(exchanges), "incoming_max": max(incoming),
                "per_exchange_max": max_per_exchange, "sent": sent}

    def _step(self, task: _Task, now: int, pool: list, sent: list[int], incoming: list[int]) -> tuple[bool, bool]:
        """Send the exchange's next request and take its reply; (finished, succeeded)."""
        cfg, rnd = self.cfg, self.rnd
        p, t, ex = task.peer, task.target, task.exchange
        msg = ex.next_message()
        if msg is None:
            self._done(task, now)
            return True, True
        out = p.client.request(t.pub, msg)
        task.requests += 1
        sent[p.index] += 1
        self.counts["requests"] += 1
        if not self.reachable(p, t):
            self.counts["unreachable"] += 1
            p.book.record_failure(self.db_id, t.pub, now, "unreachable (timed out)")
            return True, False
        lost_request = rnd.random() < cfg.p_loss
        if rnd.random() < cfg.p_dup:
            self.counts["duplicates"] += 1
            pool.append(_Dup(t, out, not lost_request))
        if lost_request:
            self.counts["lost"] += 1
            p.book.record_failure(self.db_id, t.pub, now, "request lost (timed out)")
            return True, False
        r = out.request
        incoming[t.index] += 1
        resp = t.server.handle(r.method, r.path, r.headers, r.body, now)
        if rnd.random() < cfg.p_loss:
            self.counts["lost"] += 1
            p.book.record_failure(self.db_id, t.pub, now, "reply lost (timed out)")
            return True, False
        try:
            _node, reply = p.client.reply(out, resp.status, resp.headers, resp.body)
        except SyncError as exc:
            self.errors[exc.reason] = self.errors.get(exc.reason, 0) + 1
            p.book.record_failure(self.db_id, t.pub, now, f"{exc.reason}: {exc}")
            return True, False
        if isinstance(reply, m.PushReply):
            self.counts["pushed_pending"] += reply.pending
            self.counts["pushed_duplicates"] += reply.duplicates
        ex.on_reply(reply)
        if ex.done:
            self._done(task, now)
            return True, True
        return False, False

    def _done(self, task: _Task, now: int) -> None:
        p, ex = task.peer, task.exchange
        p.book.record_success(self.db_id, task.target.pub, now)
        p.learn(ex.stats.peers)

    def _account(self, st: Any) -> None:
        c = self.counts
        c["pulled"] += st.pulled
        c["pulled_pending"] += st.pulled_pending
        c["pushed"] += st.pushed
        for d, src in ((self.push_refused, st.push_refused), (self.pulled_refused, st.pulled_refused)):
            for reason, n in src.items():
                d[reason] = d.get(reason, 0) + n

    def _deliver_dup(self, dup: _Dup, now: int) -> None:
        r = dup.out.request
        before = len(dup.target.stored)
        resp = dup.target.server.handle(r.method, r.path, r.headers, r.body, now)
        if not dup.original_delivered:
            self.counts["late"] += 1  # a first delivery after all; nobody reads its answer
            return
        try:
            error = m.ErrorReply.decode(m.unpack(resp.body)).error
        except m.MessageError:
            error = None
        if resp.status != 401 or error != "sync.replay" or len(dup.target.stored) != before:
            raise SimError(f"a duplicated {dup.out.op} request was not refused as a replay: "
                           f"status {resp.status}, {error}")
        self.counts["replays"] += 1

    # ------------------------------------------------------------------------ the run
    def converged(self) -> bool:
        want = self.universe
        return all(len(p.stored) == len(want) and p.stored == want for p in self.peers)

    def run(self) -> SimResult:
        cfg, rnd = self.cfg, self.rnd
        t0 = time.perf_counter()
        self.setup()
        setup_s = time.perf_counter() - t0
        part = cfg.partition
        groups = cfg.groups or rnd.choice((2, 3))
        per_round: list[dict[str, Any]] = []
        sent_total = 0
        peer_rounds = 0
        sent_max = exchanges_max = per_exchange_max = incoming_max = 0
        last_write = -1
        converged_round = None
        base_now = 1_700_000_000_000
        for r in range(cfg.max_rounds):
            now = base_now + r * cfg.round_ms
            if part and r == part[0]:
                self.group = [rnd.randrange(groups) for _ in self.peers]
            if part and r == part[1]:
                self.group = None
            wrote = self.write(r) if r < cfg.write_rounds else 0
            if wrote:
                last_write = r
            stats = self.run_round(r, now)
            sent = stats.pop("sent")
            sent_total += sum(sent)
            peer_rounds += len(sent)
            sent_max = max(sent_max, stats["sent_max"])
            exchanges_max = max(exchanges_max, stats["exchanges_max"])
            per_exchange_max = max(per_exchange_max, stats["per_exchange_max"])
            incoming_max = max(incoming_max, stats["incoming_max"])
            bound = cfg.fanout * max_requests_per_exchange(len(self.universe))
            if stats["exchanges_max"] > cfg.fanout or stats["sent_max"] > bound:
                raise SimError(f"round {r}: a peer ran {stats['exchanges_max']} exchanges (fan-out {cfg.fanout}) "
                               f"and sent {stats['sent_max']} requests (bound {bound})")
            complete = sum(len(p.stored) == len(self.universe) for p in self.peers)
            stats.update(wrote=wrote, complete=complete, partitioned=self.group is not None)
            per_round.append(stats)
            if r >= cfg.write_rounds - 1 and self.group is None and complete == len(self.peers) and self.converged():
                converged_round = r
                break
        states_equal = False
        if converged_round is not None:
            first = self.state(self.peers[0].db)
            states_equal = all(self.state(p.db) == first for p in self.peers[1:])
        heal = part[1] if part else None
        sizes = [len(p.book.peers(self.db_id)) for p in self.peers]
        return SimResult(
            config=asdict(cfg),
            converged=converged_round is not None and states_equal,
            rounds=len(per_round),
            converged_round=converged_round,
            last_write_round=last_write,
            heal_round=heal,
            rounds_after_last_write=None if converged_round is None else converged_round - last_write + 1,
            rounds_after_heal=None if converged_round is None or heal is None else converged_round - heal + 1,
            entries=len(self.universe),
            requests_per_peer_round_mean=sent_total / peer_rounds if peer_rounds else 0.0,
            requests_per_peer_round_max=sent_max,
            exchanges_per_peer_round_max=exchanges_max,
            requests_per_exchange_max=per_exchange_max,
            request_bound_per_round=cfg.fanout * max_requests_per_exchange(len(self.universe)),
            incoming_per_peer_round_max=incoming_max,
            requests=self.counts["requests"],
            exchanges=self.counts["exchanges"],
            failed_exchanges=self.counts["failed"],
            lost=self.counts["lost"],
            unreachable=self.counts["unreachable"],
            duplicates=self.counts["duplicates"],
            replays_refused=self.counts["replays"],
            late_copies=self.counts["late"],
            pulled=self.counts["pulled"],
            pulled_pending=self.counts["pulled_pending"],
            pushed=self.counts["pushed"],
            pushed_pending=self.counts["pushed_pending"],
            pushed_duplicates=self.counts["pushed_duplicates"],
            pending_left=sum(len(p.db.pending_ids()) for p in self.peers),
            errors=dict(sorted(self.errors.items())),
            push_refused=dict(sorted(self.push_refused.items())),
            pulled_refused=dict(sorted(self.pulled_refused.items())),
            peerbook_max=max(sizes),
            peerbook_mean=sum(sizes) / len(sizes),
            states_equal=states_equal,
            setup_s=setup_s,
            wall_s=time.perf_counter() - t0,
            per_round=per_round,
        )


def simulate(cfg: SimConfig, *, state: Callable[[Database], Any] = db_state) -> SimResult:
    """Run one seeded simulation (see the module docstring)."""
    return _Sim(cfg, state).run()
