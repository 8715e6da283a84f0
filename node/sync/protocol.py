"""The sync protocol as state machines, without sockets (as h11 is for HTTP).

``SyncServer.handle(method, path, headers, body, now_ms)`` takes one request's bytes and the
node's state and returns the response's bytes; ``Exchange`` is the client's side of one sync
of one database with one peer: it says which request to send next and takes each reply. The
aiohttp adapter (node/sync/http.py) only moves their bytes; tests and the many-peer simulator
(bench/sim.py) drive them directly.

One exchange: ``feeds`` (one round trip: each side learns from the other's per-author feed
positions what it lacks), then ``pull`` pages until the server has nothing more after the
cursor, then ``push`` pages of what the server lacks, then ``peers`` (peer exchange). Pages
are bounded in bytes; cost grows with what is missing, not with the history.
"""
from __future__ import annotations

import logging
import time
from bisect import bisect_right
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from memmesh.auth.keys import SigningKey
from memmesh.crdt.clock import now_ms as _now_ms  # methods take a now_ms argument
from memmesh.crdt.database import Database
from memmesh.crdt.errors import MemmeshError, RejectedError, StorageError, WriteFailedError
from memmesh.node.sync import messages as m
from memmesh.node.sync.backoff import PushBackoff, backoff_reply
from memmesh.node.sync.client import PREFIX, Client, Outgoing, SyncError, hello
from memmesh.node.sync.envelope import Caller, EnvelopeError, RequestVerifier, sign_response

if TYPE_CHECKING:
    from memmesh.crdt.records import IngestResult

# The client's side (client.py) and the push backoff (backoff.py) are named from here too: one
# module for what a transport or a test drives.
__all__ = ["EXCHANGE_S", "NOT_FOUND", "OFF_THREAD", "PREFIX", "PUSH_SLICE_ENTRIES", "SLICE", "SLICE_S", "Client",
           "Exchange", "ExchangeStats", "Intake", "Outgoing", "PushBackoff", "Response", "ServedNode", "SyncError",
           "SyncServer", "hello", "next_chunk", "wire_bytes"]

log = logging.getLogger(__name__)

NOT_FOUND = m.ErrorReply("sync.not_found", "no such database on this node")  # also: not shared, not readable
# Markers SyncServer.steps yields: what the next step of a request needs (see its docstring).
OFF_THREAD = "off-thread"
SLICE = "slice"
# A push (or a pulled page) is ingested this many entries at a time, and gives the database
# thread back after a slice of SLICE_S (docs/protocol.md 6.3): one entry costs well under a
# millisecond to park or admit (64 memory rows: about 8 ms), so a chunk stays far inside the
# slice, and other work waits at most about one slice. Each chunk is one transaction and one
# batch of parallel signature checks: 64 costs about 8 % of bulk ingest, 32 about 12 %.
PUSH_SLICE_ENTRIES = 64
SLICE_S = 0.1
MAX_CHUNK_ENTRIES = 2048


def next_chunk(done: int, seconds: float, current: int) -> int:
    """The next chunk's size: as many entries as the rate so far fits in half a slice, between
    ``PUSH_SLICE_ENTRIES`` and ``MAX_CHUNK_ENTRIES``. Larger chunks amortise the transaction and
    the parallel signature checks of each; cheap entries (honest memory rows) get large chunks,
    costly ones stay small, and a chunk never runs much past the slice."""
    if done <= 0 or seconds <= 0:
        return min(MAX_CHUNK_ENTRIES, current * 2)
    fits = int(done / seconds * SLICE_S / 2)
    return max(PUSH_SLICE_ENTRIES, min(MAX_CHUNK_ENTRIES, fits))


FIRST_PULL_BYTES = 256 * 1024  # the first page an exchange asks for; each next one 4 x, up to its page size
# The daemon's and `memmesh sync`'s exchanges ask no new page after this long (docs/protocol.md
# 6.3): a round waits for its exchanges, so one peer answering "more" forever, or slowly, would
# hold every bank's sync. An honest page takes well under a second on a LAN; what is left is
# pulled or pushed by the next exchange, which the daemon starts at once.
EXCHANGE_S = 60.0


class Intake:
    """Entries taken into a database a chunk at a time, each chunk one ingest (one transaction)
    sized to the rate so far (``next_chunk``): what a push and a pulled page share, so that
    their callers can give the database thread back between chunks."""

    def __init__(self) -> None:
        self.entries: Sequence[m.EntryWire] = ()
        self.done = 0  # how many of ``entries`` have been taken (or tried)
        self.size = PUSH_SLICE_ENTRIES  # the next chunk's size; carried over to the next entries

    def start(self, entries: Sequence[m.EntryWire]) -> None:
        self.entries, self.done = entries, 0

    def more(self) -> bool:
        return self.done < len(self.entries)

    def next(self, db: Database, source: str, room: int | None = None) -> IngestResult:
        """Ingest the next chunk (at most ``room`` entries, if given)."""
        chunk = self.entries[self.done:self.done + (self.size if room is None else min(self.size, room))]
        self.done += len(chunk)
        # The signature worker takes this chunk (announced already, unless it starts the
        # entries), then the next, while this one is decoded and applied; this thread checks
        # what the worker has not reached from the chunk's end (crdt/verify_pipeline.py).
        db.verify_ahead(chunk)
        db.verify_ahead(self.entries[self.done:self.done + self.size])
        t0 = time.monotonic()
        result = db.ingest(chunk, source=source)
        self.size = next_chunk(len(chunk), time.monotonic() - t0, self.size)
        return result


def after_cursor(db: Database, ids: list[str], after: tuple[int, str], want: Sequence[str]) -> list[str]:
    """Of ``ids`` (missing_for's answer, in T order), those after the cursor ``after`` and the
    wanted ones before it, in order: the entries after the cursor are a suffix, found by
    bisection rather than a lookup per id."""
    def t_key(entry_id: str) -> tuple[int, str]:
        height = db.height_of(entry_id)
        assert height is not None  # missing_for answers with stored entries only
        return height, entry_id

    at = bisect_right(ids, after, key=t_key)
    wanted = set(want)
    return ([i for i in ids[:at] if i in wanted] if wanted else []) + ids[at:]


def wire_bytes(entries: Sequence[m.EntryWire]) -> int:
    """The bytes of entries as they travel: headers and the payloads present."""
    return sum(len(h) + sum(len(p) for p in ps.values() if p) for h, ps in entries)


def _cursor_at(db: Database, entry_id: str) -> tuple[int, str]:
    """The pull cursor after ``entry_id``, an entry the page just read from ``db``."""
    height = db.height_of(entry_id)
    assert height is not None  # a stored entry has its height
    return height, entry_id


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


class ServedNode(Protocol):
    """What the server needs from the node that runs it."""

    def readable(self, db_id: str, caller: str) -> Database | None:
        """The database if it is shared and ``caller`` holds at least Read on it, else None."""

    def peers_of(self, db_id: str, caller: str) -> list[m.PeerInfo]:
        """The peers this node syncs the database with (not the caller)."""

    def learn_peers(self, db_id: str, caller: str, peers: list[m.PeerInfo]) -> None:
        """Hints from a peer that may read the database: whom it syncs it with."""

    def redeem(self, db_id: str, caller: str, ticket: str, perm: str, proof: bytes) -> str | None:
        """Redeem an invite for ``caller``: the settings entry id; None (answered as not found)
        unless the proof shows the caller holds this node's invite; RejectedError after that."""


# ------------------------------------------------------------------------ server
class SyncServer:
    def __init__(self, key: SigningKey, node: ServedNode, *, verifier: RequestVerifier | None = None,
                 backoff: PushBackoff | None = None) -> None:
        self.key = key
        self.node = node
        self.verifier = verifier or RequestVerifier(str(key.public))
        self.backoff = backoff or PushBackoff()

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes, now_ms: int | None = None) -> Response:
        """One request, start to end, in place (the simulator's and the tests' way)."""
        steps = self.steps(method, path, headers, body, now_ms)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def steps(self, method: str, path: str, headers: dict[str, str], body: bytes | bytearray,
              now_ms: int | None = None) -> Generator[str, None, Response]:
        """The request as steps, for a driver that lets other work run between them.

        Each ``next()`` runs one step and yields what the next one needs: ``OFF_THREAD`` (it
        touches no database: decoding, which may run elsewhere) or ``SLICE`` (database work
        again, after other queued work had its turn). The Response is the generator's value.
        """
        now = _now_ms() if now_ms is None else now_ms
        if method != "POST" or not path.startswith(PREFIX):
            return self._plain(404, m.ErrorReply("sync.unknown_op", "not a sync path"))
        op = path[len(PREFIX):]
        if op not in m.REQUESTS:
            return self._plain(404, m.ErrorReply("sync.unknown_op", f"no sync operation {op!r}"))
        try:
            caller = self.verifier.verify(method, path, headers, body, now, allow_any_target=(op == "hello"))
        except EnvelopeError as exc:
            status = 503 if exc.reason == "sync.busy" else 401
            return self._plain(status, m.ErrorReply(exc.reason, str(exc)))
        try:
            early = self._before_decoding(op, body, caller, now)
            if early is not None:
                status, reply = early
            else:
                yield OFF_THREAD
                request = m.decode_request(op, body)
                yield SLICE
                status, reply = yield from self._dispatch(op, request, caller, now)
        except RejectedError as exc:
            status, reply = 400, m.ErrorReply(exc.reason, str(exc))
        except StorageError as exc:
            # Never a success that lists entries as stored: the caller keeps them and sends them
            # again. The peer is told what to do; the file and its fault are for our operator.
            log.warning("sync %s from %s failed in storage: %s", op, caller.key, exc)
            what = ("could not write (its disk is full or failing)" if isinstance(exc, WriteFailedError)
                    else "could not use its storage")
            status, reply = 503, m.ErrorReply("sync.storage", f"this node {what}; nothing of this request is "
                                                              "acknowledged: send it again later")
        except MemmeshError as exc:
            status, reply = 500, m.ErrorReply("sync.internal", str(exc))
        payload = m.pack(reply.encode())
        return Response(status, {**sign_response(self.key, status, payload, caller),
                                 "content-type": "application/msgpack"}, payload)

    def _before_decoding(self, op: str, body: bytes | bytearray, caller: Caller, now: int) -> tuple[int, Any] | None:
        """What can be answered from the signed envelope and the body's ``db`` field alone: a
        caller that may not read the database (or a pusher in backoff) costs no decoding."""
        if op in ("hello", "redeem"):  # no database yet / the invite in the body is the proof
            return None
        db_id = m.peek_db(body)
        if db_id is None:
            # Every other request names its database: without a readable ``db`` field (32
            # bytes, among the first fields) it is refused before anything else is decoded,
            # or a stranger could make the node decode whatever precedes a malformed one.
            return 400, m.ErrorReply("sync.bad_message", "the body has no db field of 32 bytes")
        if self.node.readable(db_id, caller.key) is None:
            return 404, NOT_FOUND
        if op == "push":
            blocked = self.backoff.blocked_for(caller.key, now)
            if blocked:
                return 429, backoff_reply(blocked)
        return None

    def _plain(self, status: int, reply: m.ErrorReply) -> Response:
        # Unauthenticated callers get an unsigned answer: signing would let anyone make the node
        # sign bytes of their choosing (the nonce).
        return Response(status, {"content-type": "application/msgpack"}, m.pack(reply.encode()))

    def _push(self, db: Database, request: m.PushRequest, caller: Caller, now: int) -> Generator[str, None, tuple[int, Any]]:
        """Ingest a push in slices of ``PUSH_SLICE_ENTRIES``, yielding ``SLICE`` whenever one
        has run ``SLICE_S``, so that no push holds the database thread for long; the backoff and
        the caller's Read are checked again between slices."""
        blocked = self.backoff.blocked_for(caller.key, now)
        if blocked:
            return 429, backoff_reply(blocked)
        source = f"peer:{caller.key}"
        stored = pending = duplicates = 0
        refused: dict[str, int] = {}
        entries = request.entries
        intake = Intake()
        intake.start(entries)
        started = time.monotonic()
        while intake.more():
            if intake.done and time.monotonic() - started >= SLICE_S:
                yield SLICE
                started = time.monotonic()
                still = self.node.readable(request.db, caller.key)
                if still is None:
                    return 404, NOT_FOUND
                db = still
            result = intake.next(db, source, room=self.backoff.room(caller.key, now))
            here: dict[str, int] = {}
            for _id, reason, _detail in result.rejected:
                here[reason] = here.get(reason, 0) + 1
                refused[reason] = refused.get(reason, 0) + 1
            self.backoff.record(caller.key, here, now, parked=len(result.pending))
            stored += len(result.accepted) + len(result.stored_rejected)
            pending += len(result.pending)
            duplicates += result.duplicates
            blocked = self.backoff.blocked_for(caller.key, now)
            if blocked and intake.more():
                # What was taken in stays, and the pusher is told what it was and why it was cut;
                # the rest is not looked at (the pusher sends it again).
                why = ", ".join(f"{r} {n}" for r, n in sorted(refused.items())) or "none"
                return 429, backoff_reply(blocked, f" (of this push's {len(entries)} entries, {intake.done} were looked at: "
                                                    f"{stored} stored, {pending} parked, {duplicates} already "
                                                    f"held; refused: {why})")
        return 200, m.PushReply(stored, pending, duplicates, refused)

    def _dispatch(self, op: str, request: Any, caller: Caller, now: int) -> Generator[str, None, tuple[int, Any]]:
        if op == "hello":
            return 200, m.Hello()
        if op == "redeem":  # the caller cannot read the database yet: the invite is its proof
            entry = self.node.redeem(request.db, caller.key, request.ticket, request.perm, request.proof)
            return (404, NOT_FOUND) if entry is None else (200, m.RedeemReply(entry))
        db = self.node.readable(request.db, caller.key)
        if db is None:
            return 404, NOT_FOUND
        if op == "feeds":
            lacking = len(db.missing_for(request.feeds, request.evidence))
            return 200, m.FeedsReply(db.feeds(), db.evidence(), lacking)
        if op == "pull":
            ids = db.missing_for(request.feeds, request.evidence, request.want)
            if request.after is not None:
                ids = after_cursor(db, ids, request.after, request.want)
            entries, n = db.page(ids, max(1, request.max_bytes))
            cursor = _cursor_at(db, ids[n - 1]) if n else request.after
            return 200, m.PullReply(entries, cursor, n < len(ids))
        if op == "push":
            return (yield from self._push(db, request, caller, now))
        if op == "peers":
            self.node.learn_peers(request.db, caller.key, request.peers)
            return 200, m.PeersReply(self.node.peers_of(request.db, caller.key))
        raise AssertionError(op)


# ------------------------------------------------------------------------ client
@dataclass
class ExchangeStats:
    lacking: int = 0  # entries we lacked, per the peer, when the exchange began
    peer_lacking: int = 0  # entries the peer lacked, per us
    pulled: int = 0  # entries we stored from the peer
    pulled_pending: int = 0
    pulled_refused: dict[str, int] = field(default_factory=dict)
    pushed: int = 0  # entries the peer stored from us
    push_refused: dict[str, int] = field(default_factory=dict)
    pages: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    peers: list[m.PeerInfo] = field(default_factory=list)
    # The feeds step's view of both sides, kept for the link status even when a later step
    # fails: the peer's feeds and evidence (None before that step), and ours at that moment.
    peer_feeds: dict[str, tuple[int, str]] | None = None
    peer_evidence: dict[str, list[str]] = field(default_factory=dict)
    our_feeds: dict[str, tuple[int, str]] = field(default_factory=dict)
    cut: bool = False  # the exchange's deadline stopped it before it pulled or pushed all
    withheld: str | None = None  # why a blind exchange sent the peer nothing of ours


class Exchange:
    """One sync of one database with one peer, as a state machine.

    ``next_message()`` gives the next request to send (None when done); ``on_reply(reply)``
    takes its decoded reply: pulled entries are ingested here, through the full pipeline.
    """

    def __init__(self, db: Database, peer: str, *, page_bytes: int = m.DEFAULT_PAGE_BYTES,
                 pull: bool = True, push: bool = True, known_peers: list[m.PeerInfo] | None = None,
                 refusal: Callable[[], str | None] | None = None, blind: bool = False,
                 deadline_s: float | None = None, pull_ahead: bool = False) -> None:
        self.db = db
        # Why nothing of the bank may be sent to the peer (None: it may), asked before every
        # request: a revocation of the peer pulled during this very exchange stops it. Our
        # feeds, evidence and wanted ids are the bank's too (who wrote how much, which heads).
        self._refusal = refusal
        # ``blind`` (a repair, whose own copy of the settings may have lost the peer's grant):
        # a peer refused now is still pulled from, but told nothing of ours (no feeds, no
        # evidence, no wanted ids, no peers), and never pushed to.
        self._blind = blind
        # After ``deadline_s`` no new pull or push page is asked (what is left waits for the
        # next exchange): a peer that keeps answering "more" cannot hold a sync round forever.
        self._deadline = None if deadline_s is None else time.monotonic() + deadline_s
        self._page_stored = 0  # entries of the page being taken in that entered the log
        self.peer = peer
        self.page_bytes = page_bytes
        # The first page asked is small, each next one four times larger up to ``page_bytes``:
        # the peer answers the first at once and it is taken in while the next, larger, is
        # built and sent (an import waited for a whole 2 MB page before anything else ran).
        self._pull_size = min(page_bytes, FIRST_PULL_BYTES)
        self.stats = ExchangeStats()
        self._do_pull = pull
        self._do_push = push
        self._known_peers = known_peers
        self._stage = "feeds"
        self._cursor: tuple[int, str] | None = None
        self._first_pull = True
        self._asked_again = False
        self._to_push: list[str] = []
        self._sent: int = 0  # how many of _to_push the last push request carried
        self._page: Any = None  # the pulled page being taken in (``work``)
        self._intake = Intake()  # its entries, and how many have been taken in
        self._blinded = False  # the last pull request told the peer nothing of ours
        # ``pull_ahead``: the next page may be asked while this one is taken in (``pull_ahead()``).
        self._may_pull_ahead = pull_ahead
        self._ahead: m.PullRequest | None = None  # that request, until next_message takes or drops it
        self._ahead_hidden = False  # whether it told the peer nothing of ours

    @property
    def done(self) -> bool:
        return self._stage == "done"

    def next_message(self) -> Any | None:
        while self.work():  # a driver that does not slice takes the page in here, whole
            pass
        db = self.db
        ahead, self._ahead = self._ahead, None
        if self._stage in ("pull", "push") and self._deadline is not None and time.monotonic() >= self._deadline:
            self.stats.cut = True
            self._stage = "peers" if self._known_peers is not None else "done"
        if self._stage == "done":
            return None
        why = self._refusal() if self._refusal is not None else None
        hide = why is not None and self._blind and self._stage in ("feeds", "pull")
        if why is not None and not hide:
            if self._blind:  # what was pulled is kept; nothing of ours goes to the peer
                self.stats.withheld = why
                self._stage = "done"
                return None
            raise SyncError("sync.no_grant", f"{why}: nothing more is sent to this peer")
        if self._stage == "feeds":
            if hide:
                return m.FeedsRequest(db.id, {}, {})
            return m.FeedsRequest(db.id, db.feeds(), db.evidence())
        if self._stage == "pull":
            self._blinded = hide
            if (ahead is not None and ahead.after == self._cursor and hide == self._ahead_hidden
                    and not (self._first_pull or self._asked_again)):
                return ahead  # asked already (pull_ahead): the driver has its reply, or soon will
            if hide:
                return m.PullRequest(db.id, {}, {}, (), self._cursor, self._pull_bytes())
            want: tuple[str, ...] = ()
            if self._first_pull or self._asked_again:
                # Missing parents, and stored entries whose payload has not arrived (a relay
                # stripped it and no valid erase accounts for it): the peer sends them whole.
                wanted = db.wanted()
                ids = list(wanted["parents"]) + sorted({e for e, _store in wanted["payloads"]})
                want = tuple(ids[: m.MAX_WANT])
            return m.PullRequest(db.id, db.feeds(), db.evidence(), want, self._cursor, self._pull_bytes())
        if self._stage == "push":
            entries, n = db.page(self._to_push, self.page_bytes)
            self._sent = n
            self.stats.bytes_out += wire_bytes(entries)
            return m.PushRequest(db.id, entries)
        if self._stage == "peers":
            return m.PeersRequest(db.id, list(self._known_peers or []))
        return None

    def on_reply(self, reply: Any) -> None:
        if self._stage == "feeds":
            self.stats.lacking = reply.lacking
            self.stats.peer_feeds, self.stats.peer_evidence = dict(reply.feeds), dict(reply.evidence)
            self.stats.our_feeds = self.db.feeds()
            self._to_push = self.db.missing_for(reply.feeds, reply.evidence)
            self.stats.peer_lacking = len(self._to_push)
            wanted = self.db.wanted()
            wants = bool(wanted["parents"] or wanted["payloads"])
            self._stage = "pull" if self._do_pull and (reply.lacking or wants) else self._after_pull()
        elif self._stage == "pull":
            self._first_pull = False
            self.stats.pages += 1
            if reply.entries:
                self.stats.bytes_in += wire_bytes(reply.entries)
            self._page = reply
            self._intake.start(reply.entries)
            self.work()
        elif self._stage == "push":
            self.stats.pages += 1
            self.stats.pushed += reply.stored
            for reason, n in reply.refused.items():
                self.stats.push_refused[reason] = self.stats.push_refused.get(reason, 0) + n
            self._to_push = self._to_push[self._sent:]
            if not self._to_push:
                self._stage = "peers" if self._known_peers is not None else "done"
        elif self._stage == "peers":
            self.stats.peers = list(reply.peers)
            self._stage = "done"

    @property
    def pulls_ahead(self) -> bool:
        """Whether this exchange may ask a page ahead (``pull_ahead``): a driver asks nothing
        of it (no hop to the database thread) when it may not."""
        return self._may_pull_ahead

    def pull_ahead(self, reply: Any) -> m.PullRequest | None:
        """For a pulled page about to be taken in (``reply``, before ``on_reply``), the request
        for the page after it (None if there is none to ask for, or ``pull_ahead`` was not
        given): a driver sends it meanwhile, so that the peer builds and sends the next page
        while this one is ingested, at most one page ahead. ``next_message`` gives this very
        object back when it is still the page to ask for; otherwise it gives another request
        and the driver drops the reply to this one.

        It carries our feeds of before the page is taken in: the peer pages from the cursor in
        (height, id) order, so what this page holds lies at or before the cursor and is not
        sent again. Every check of a request holds as in ``next_message``: none is asked past
        the deadline, nor of a peer that may not be told of ours (a blind exchange tells it
        nothing, as its next request would)."""
        if (not self._may_pull_ahead or self._stage != "pull" or not isinstance(reply, m.PullReply)
                or not reply.more or not reply.entries or reply.after is None or reply.after == self._cursor):
            return None
        if self._deadline is not None and time.monotonic() >= self._deadline:
            return None
        why = self._refusal() if self._refusal is not None else None
        if why is not None and not self._blind:
            return None  # next_message says why, and stops
        db = self.db
        self._ahead_hidden = why is not None
        size = self._pull_bytes()
        self._ahead = (m.PullRequest(db.id, {}, {}, (), reply.after, size) if self._ahead_hidden
                       else m.PullRequest(db.id, db.feeds(), db.evidence(), (), reply.after, size))
        return self._ahead

    def _pull_bytes(self) -> int:
        """The size to ask of the next pulled page (see ``__init__``)."""
        size = self._pull_size
        self._pull_size = min(self.page_bytes, size * 4)
        return size

    def working(self) -> bool:
        """Whether a pulled page is still being taken in (call ``work`` until it is not)."""
        return self._page is not None

    def work(self) -> bool:
        """Take in the pulled page for at most about ``SLICE_S`` (``PUSH_SLICE_ENTRIES`` at a
        time), so that a large page never holds the database thread for long: a driver calls it
        again, as a new job, while it returns True. ``next_message`` finishes what is left."""
        started = time.monotonic()
        while self._intake.more():
            try:
                result = self._intake.next(self.db, f"peer:{self.peer}")
            except StorageError as exc:
                # The exchange fails like any sync failure (the link's status says why);
                # what the page held that was not stored, the next exchange pulls again.
                self._intake.start(())
                self._page = None
                raise SyncError("sync.storage", f"could not store what {self.peer} sent: {exc}") from exc
            self.stats.pulled += len(result.accepted) + len(result.stored_rejected)
            self._page_stored += len(result.accepted) + len(result.stored_rejected) + len(result.filled)
            self.stats.pulled_pending += len(result.pending)
            for _id, reason, _detail in result.rejected:
                self.stats.pulled_refused[reason] = self.stats.pulled_refused.get(reason, 0) + 1
            if self._intake.more() and time.monotonic() - started >= SLICE_S:
                return True
        if self._page is not None:
            self._page_done(self._page)
        return False

    def _page_done(self, reply: Any) -> None:
        self._page = None
        progressed = reply.after is not None and reply.after != self._cursor
        # A page asked with our feeds holds only what we lack: one that put nothing into the
        # log (duplicates, refusals, orphans) ends the pull, whatever cursor and "more" it
        # claims, or a peer could keep us pulling forever. (A blind pull gets what we hold too.)
        if not self._blinded and not self._page_stored:
            progressed = False
        self._page_stored = 0
        self._cursor = reply.after
        if not reply.more or not progressed or not reply.entries:
            # Entries the peer stored below the cursor while we paged (a child above it
            # arrived, its parent did not): ask for the missing parents once more.
            if not self._asked_again and self.stats.pulled_pending and self.db.wanted()["parents"]:
                self._asked_again = True
            else:
                self._asked_again = False
                self._stage = self._after_pull()

    def _after_pull(self) -> str:
        if self._do_push and self._to_push:
            return "push"
        return "peers" if self._known_peers is not None else "done"
