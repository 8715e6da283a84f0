"""A node's sync state, peer-local (never synced): which databases it serves, the peers it
knows for each, the invites it issued, and per database and peer the outcome of the last
exchanges. Kept in the storage's local records, so it survives restarts and a one-shot
`memmesh status` reads what the daemon last recorded."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from memmesh.crdt.clock import now_ms
from memmesh.crdt.storage import Storage
from memmesh.node.sync.peerbook import PeerBook, PeerBookError

NS = "sync"
NS_SHARED = "sync-shared"
NS_INVITES = "sync-invites"
NS_STATUS = "sync-status"
PEERBOOK_KEY = "peerbook"
ADDRESS_KEY = "address"


@dataclass
class Invite:
    """An invite this node issued. The record alone makes it redeemable: the invite key holds
    no grant in the bank's settings (an older version granted it Read; see sharing.py)."""

    db: str
    perm: str
    priority: int | None
    expires: int  # seconds since the epoch
    ticket: str  # the ticket's text without its secret
    used_by: str | None = None
    entry: str | None = None  # the settings entry that recorded the redemption
    ended: str | None = None  # why it ended unredeemed: "unshared", "deleted", "revoked"

    def outstanding(self, now_s: int) -> bool:
        """Still redeemable: not used, not ended, not expired."""
        return self.used_by is None and self.ended is None and now_s < self.expires


@dataclass
class LinkStatus:
    """What the last exchanges of one database with one peer showed."""

    db: str
    peer: str
    last_attempt_ms: int = 0
    last_success_ms: int | None = None
    last_error: str | None = None
    lacking: int = 0  # entries we lacked, per the peer, at the last exchange
    peer_lacking: int = 0  # entries the peer lacked, per us
    pulled: int = 0  # entries stored from the peer, all exchanges
    pushed: int = 0  # entries the peer stored from us, all exchanges
    refused: dict[str, int] = field(default_factory=dict)  # reason -> count, both directions
    bytes_in: int = 0
    bytes_out: int = 0
    exchanges: int = 0
    # The peer's feed positions as last seen (author -> [seq, head id]), from the feeds step of
    # an exchange even one that then failed: what exact lag is counted from (see lag()).
    peer_feeds: dict[str, list[Any]] | None = None
    peer_evidence: dict[str, list[str]] = field(default_factory=dict)
    feeds_ms: int | None = None  # when they were seen
    since_ms: int = field(default_factory=lambda: now_ms())  # when this link was first recorded


@dataclass(frozen=True)
class Lag:
    """Exact lag of one link, in entries: the peer's feeds as last seen against ours now."""

    peer_lacks: int  # entries we hold that the peer's feeds do not cover
    we_lack: int  # entries the peer's feeds cover that ours do not


def lag(db: Any, link: LinkStatus) -> Lag:
    """``db`` is the link's Database. Both counts go by per-author feed positions: every
    author's entries form a hash-linked feed, so "the peer holds author A up to seq n" says
    exactly which entries it holds. A forked author's second entries are counted by
    missing_for (peer_lacks) but not by seq (we_lack). Zero until a feeds step was seen."""
    if link.peer_feeds is None:
        return Lag(0, 0)
    theirs = {a: (int(v[0]), v[1]) for a, v in link.peer_feeds.items()}
    peer_lacks = len(db.missing_for(theirs, link.peer_evidence))
    ours = db.feeds()
    we_lack = sum(max(0, seq - ours.get(a, (-1, None))[0]) for a, (seq, _h) in theirs.items())
    return Lag(peer_lacks, we_lack)


def _feeds_json(feeds: dict[str, tuple[int, str]]) -> dict[str, list[Any]]:
    return {a: [int(seq), head] for a, (seq, head) in feeds.items()}


class SyncState:
    def __init__(self, storage: Storage, self_key: str) -> None:
        self._s = storage
        self.self_key = self_key
        self._book: PeerBook | None = None
        self._links: dict[tuple[str, str], LinkStatus] = {}
        for _, raw in storage.items_local(NS_STATUS):
            try:
                status = LinkStatus(**json.loads(raw))
            except (TypeError, ValueError):
                continue  # a record of an older layout: it is rewritten at the next exchange
            self._links[(status.db, status.peer)] = status

    # ------------------------------------------------------------------ serving
    def shared(self) -> list[str]:
        return [k for k, _ in self._s.items_local(NS_SHARED)]

    def is_shared(self, db_id: str) -> bool:
        return self._s.get_local(NS_SHARED, db_id) is not None

    def share(self, db_id: str) -> None:
        self._s.put_local(NS_SHARED, db_id, json.dumps({"since_ms": now_ms()}).encode())

    def unshare(self, db_id: str) -> bool:
        return self._s.delete_local(NS_SHARED, db_id)

    def address(self) -> str | None:
        raw = self._s.get_local(NS, ADDRESS_KEY)
        try:
            return None if raw is None else raw.decode()
        except UnicodeDecodeError as exc:
            raise self._damaged(NS, ADDRESS_KEY, exc) from exc

    def set_address(self, address: str) -> None:
        self._s.put_local(NS, ADDRESS_KEY, address.encode())

    # ------------------------------------------------------------------ peers
    @property
    def peers(self) -> PeerBook:
        if self._book is None:
            raw = self._s.get_local(NS, PEERBOOK_KEY)
            try:
                self._book = PeerBook.from_bytes(raw, self_key=self.self_key) if raw else PeerBook(self.self_key)
            except PeerBookError:
                self._book = PeerBook(self.self_key)  # a damaged book is rebuilt from tickets and exchange
        return self._book

    def save_peers(self) -> None:
        if self._book is not None:
            self._s.put_local(NS, PEERBOOK_KEY, self._book.to_bytes())

    # ------------------------------------------------------------------ invites
    def invite(self, key: str) -> Invite | None:
        raw = self._s.get_local(NS_INVITES, key)
        return None if raw is None else self._invite(key, raw)

    def _invite(self, key: str, raw: bytes) -> Invite:
        try:
            return Invite(**json.loads(raw))
        except (TypeError, ValueError) as exc:
            raise self._damaged(NS_INVITES, key, exc) from exc

    def _damaged(self, ns: str, key: str, exc: Exception) -> Exception:
        """Damaged bytes in a record: one line naming the storage file, never a traceback."""
        from memmesh.node.file_check import clean, damaged

        return damaged(str(getattr(self._s, "path", "the storage")),
                       f"its peer-local record {ns}/{clean(key, 80)} cannot be read: {clean(exc, 80)}")

    def put_invite(self, key: str, invite: Invite) -> None:
        self._s.put_local(NS_INVITES, key, json.dumps(asdict(invite), sort_keys=True).encode())

    def is_invite(self, key: str) -> bool:
        """Whether ``key`` is an invite key this node issued, in any state (one indexed read,
        nothing parsed: the sync server asks it for every request)."""
        return self._s.get_local(NS_INVITES, key) is not None

    def invites(self, db_id: str | None = None, *, skip_damaged: bool = False) -> list[tuple[str, Invite]]:
        """(invite key, record) of every invite this node issued (for ``db_id`` only, if given).
        ``skip_damaged``: pass over a record that cannot be read (where a listing only names
        keys; `memmesh check` reports the damage) rather than refuse."""
        out = []
        for key, raw in self._s.items_local(NS_INVITES):
            try:
                invite = Invite(**json.loads(raw))
            except (TypeError, ValueError) as exc:
                if skip_damaged:
                    continue
                raise self._damaged(NS_INVITES, key, exc) from exc
            if db_id is None or invite.db == db_id:
                out.append((key, invite))
        return out

    # ------------------------------------------------------------------ link status
    def link(self, db_id: str, peer: str) -> LinkStatus:
        status = self._links.get((db_id, peer))
        if status is None:
            status = self._links[(db_id, peer)] = LinkStatus(db_id, peer)
        return status

    def link_if_any(self, db_id: str, peer: str) -> LinkStatus | None:
        return self._links.get((db_id, peer))

    def links(self, db_id: str | None = None) -> list[LinkStatus]:
        return [s for (d, _p), s in sorted(self._links.items()) if db_id is None or d == db_id]

    def save_link(self, status: LinkStatus) -> None:
        self._s.put_local(NS_STATUS, f"{status.db} {status.peer}", json.dumps(asdict(status), sort_keys=True).encode())

    def record_exchange(self, db_id: str, peer: str, address: str, stats: Any, how: str = "exchange") -> LinkStatus:
        """A finished exchange (``stats``: protocol.ExchangeStats): the peer, what it taught us
        about other peers, and the link's status."""
        t = now_ms()
        self.peers.add(db_id, peer, [address], how, t)
        self.peers.record_success(db_id, peer, t)
        for p in stats.peers:
            if p.addrs:
                self.peers.add(db_id, p.key, p.addrs, "exchange", t)
        link = self.link(db_id, peer)
        link.last_attempt_ms = link.last_success_ms = t
        link.last_error = None
        link.lacking = max(0, stats.lacking - stats.pulled)
        link.peer_lacking = max(0, stats.peer_lacking - stats.pushed)
        link.pulled += stats.pulled
        link.pushed += stats.pushed
        for reason, n in list(stats.pulled_refused.items()) + list(stats.push_refused.items()):
            link.refused[reason] = link.refused.get(reason, 0) + n
        link.bytes_in += stats.bytes_in
        link.bytes_out += stats.bytes_out
        link.exchanges += 1
        if stats.peer_feeds is not None:
            feeds = dict(stats.peer_feeds)
            if stats.pushed >= stats.peer_lacking:
                # The peer stored everything we held at the feeds step: it holds our feeds of
                # then too (entries written since are still counted as lacking).
                for author, (seq, head) in stats.our_feeds.items():
                    if seq > feeds.get(author, (-1, None))[0]:
                        feeds[author] = (seq, head)
            self._seen_feeds(link, feeds, stats.peer_evidence, t)
        self.save_link(link)
        return link

    def record_failure(self, db_id: str, peer: str, error: str, stats: Any = None) -> LinkStatus:
        """A failed exchange; ``stats`` (protocol.ExchangeStats) if it got that far, so that
        the peer's feeds seen before the failure still count for the lag."""
        t = now_ms()
        if self.peers.get(db_id, peer) is not None:
            self.peers.record_failure(db_id, peer, t, error)
        link = self.link(db_id, peer)
        link.last_attempt_ms = t
        link.last_error = error
        if stats is not None and stats.peer_feeds is not None:
            self._seen_feeds(link, stats.peer_feeds, stats.peer_evidence, t)
        self.save_link(link)
        return link

    @staticmethod
    def _seen_feeds(link: LinkStatus, feeds: dict[str, tuple[int, str]], evidence: dict[str, list[str]],
                    t: int) -> None:
        link.peer_feeds = _feeds_json(feeds)
        link.peer_evidence = {a: list(ids) for a, ids in evidence.items()}
        link.feeds_ms = t

    def to_dict(self) -> dict[str, Any]:
        return {"shared": self.shared(), "links": [asdict(s) for s in self.links()]}
