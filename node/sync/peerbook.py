"""The peers a node knows, per database: pure, bounded, persistable (no I/O, no clock).

A ``PeerBook`` holds, for each database, up to ``max_peers`` (256) ``PeerRecord``s: the peer's
key, its addresses (most recent first, at most 8), how it was first learnt (``ticket``,
``exchange``, ``lan`` or ``manual``) and every way it was learnt since, when it was first and
last seen, the last success and error, and the backoff after failures.

- **Never the node itself**: adding the node's own key does nothing.
- **Bounded**: a new peer beyond ``max_peers`` evicts the least recently seen peer that was not
  learnt from a ticket (a ticket is the user's explicit choice). If every peer came from a
  ticket, only another ticket's peer gets in (evicting the least recently seen one).
- **Seen** means first-hand: learnt from a ticket, the LAN or the operator, or a successful sync.
  A hint from peer exchange adds a peer (and addresses) but does not refresh a known one's
  ``last_seen``: otherwise any peer could keep stale entries alive by gossiping them.
- **Backoff**: each failure in a row doubles the wait (base 1 s, cap 5 min), with jitter: the
  wait is drawn uniformly in [d/2, d] from the book's ``random.Random``, so a simulator is
  seeded and a crowd of peers does not retry in lockstep. A success clears it. An address newly
  learnt first-hand (ticket, LAN, operator) lets the peer be tried again at once; one learnt
  from a hint does not (a peer could otherwise make us hammer one we are backing off).
- **Choosing** is uniform: ``choose(db, k, now, rnd)`` draws up to ``k`` peers at random among
  those not backing off. That is the bounded fan-out of a sync round.
- **Who may read** is not the book's to decide: ``choose`` and ``infos`` take a ``keep``
  predicate (node/sync/readers.py asks the bank's settings at that moment). A peer that lost
  Read stays in the book, never chosen nor handed out for that bank, and is back if granted again.

Times are milliseconds given by the caller (``now_ms``); nothing here reads a clock.
``to_bytes()``/``from_bytes()`` persist the book as msgpack (strictly decoded, bounded).
"""
from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from memmesh.auth.errors import KeyFormatError
from memmesh.auth.keys import PublicKey
from memmesh.node.sync.messages import MAX_ADDR_LEN, MAX_ADDRS, MAX_PEERS, PeerInfo

HOWS = ("ticket", "exchange", "lan", "manual")
FIRST_HAND = frozenset({"ticket", "lan", "manual"})
BASE_MS = 1_000
CAP_MS = 300_000
MAX_ERROR_LEN = 200
FORMAT_VERSION = 1
MAX_BOOK_BYTES = 64 * 1024 * 1024


class PeerBookError(ValueError):
    """A peer, an address or a persisted book that is not well-formed."""


@dataclass(frozen=True, slots=True)
class PeerRecord:
    key: str
    addrs: tuple[str, ...]  # most recent first, at most MAX_ADDRS
    how: str  # the first way it was learnt
    ways: frozenset[str]  # every way it was learnt
    first_seen: int
    last_seen: int
    last_success: int | None = None
    last_error: str | None = None
    failures: int = 0  # in a row, since the last success
    next_try_ms: int = 0  # not chosen before this time

    def backing_off(self, now_ms: int) -> bool:
        return self.next_try_ms > now_ms

    def info(self) -> PeerInfo:
        return PeerInfo(self.key, self.addrs)


def _check_key(key: str) -> str:
    try:
        PublicKey.parse(key)
    except KeyFormatError as exc:
        raise PeerBookError(f"not a peer key: {exc}") from None
    return key


def _check_addrs(addrs: Iterable[str]) -> tuple[str, ...]:
    if isinstance(addrs, str):
        raise PeerBookError("addrs is a sequence of addresses, not one string")
    out = tuple(addrs)
    for a in out:
        if not isinstance(a, str) or not a.startswith("http:") or len(a) > MAX_ADDR_LEN:
            raise PeerBookError(f"an address looks like http:<host>:<port> (at most {MAX_ADDR_LEN} characters), "
                                f"got {str(a)[:40]!r}")
    return out


def _merge_addrs(new: Sequence[str], old: Sequence[str]) -> tuple[str, ...]:
    merged: list[str] = []
    for a in (*new, *old):
        if a not in merged:
            merged.append(a)
            if len(merged) == MAX_ADDRS:
                break
    return tuple(merged)


class _Db:
    __slots__ = ("records", "evictable")

    def __init__(self) -> None:
        self.records: dict[str, PeerRecord] = {}
        # Keys not learnt from a ticket, least recently seen first (move_to_end when seen).
        self.evictable: OrderedDict[str, None] = OrderedDict()


class PeerBook:
    def __init__(self, self_key: str | None = None, *, rnd: random.Random | None = None,
                 max_peers: int = MAX_PEERS, base_ms: int = BASE_MS, cap_ms: int = CAP_MS) -> None:
        if max_peers < 1:
            raise PeerBookError("max_peers is at least 1")
        self.self_key = self_key
        self.rnd = rnd or random.Random()
        self.max_peers = max_peers
        self.base_ms = base_ms
        self.cap_ms = cap_ms
        self._dbs: dict[str, _Db] = {}

    # ------------------------------------------------------------------------ reading
    def databases(self) -> list[str]:
        return list(self._dbs)

    def peers(self, db_id: str) -> list[PeerRecord]:
        """Every peer known for the database, in the order they were first learnt."""
        book = self._dbs.get(db_id)
        return list(book.records.values()) if book else []

    def get(self, db_id: str, key: str) -> PeerRecord | None:
        book = self._dbs.get(db_id)
        return book.records.get(key) if book else None

    def __len__(self) -> int:
        return sum(len(b.records) for b in self._dbs.values())

    def infos(self, db_id: str, *, exclude: str | None = None, k: int | None = None,
              rnd: random.Random | None = None, keep: Callable[[str], bool] | None = None) -> list[PeerInfo]:
        """The peers to tell another peer about (peer exchange), never ``exclude`` nor a key
        ``keep`` refuses: all of them, or a uniform sample of at most ``k`` (drawn after the
        filter, so refused keys never crowd out the others)."""
        records = [r for r in self.peers(db_id) if r.key != exclude and (keep is None or keep(r.key))]
        if k is not None and len(records) > k:
            records = (rnd or self.rnd).sample(records, k)
        return [PeerInfo(r.key, r.addrs) for r in records]

    # ------------------------------------------------------------------------ learning
    def add(self, db_id: str, key: str, addrs: Iterable[str], how: str, now_ms: int) -> PeerRecord | None:
        """Learn (or learn again) a peer of the database; returns its record, or None when it is
        the node itself or the book is full of peers that cannot be evicted."""
        if how not in HOWS:
            raise PeerBookError(f"how is one of {', '.join(HOWS)}, got {how!r}")
        addrs = _check_addrs(addrs)
        if key == self.self_key:
            return None
        known = self._known(db_id, key)
        if known is None:
            _check_key(key)
            book = self._dbs.get(db_id)
            if book is None:
                book = self._dbs[db_id] = _Db()
            if len(book.records) >= self.max_peers and not self._evict(book, how == "ticket"):
                return None
            rec = PeerRecord(key, _merge_addrs(addrs, ()), how, frozenset((how,)), now_ms, now_ms)
            book.records[key] = rec
            if how != "ticket":
                book.evictable[key] = None
            return rec
        book, old = known
        first_hand = how in FIRST_HAND
        # What a peer says of itself (first hand) goes first; hearsay (peer exchange) only after
        # the addresses known already, so a reader naming another peer with made-up addresses
        # cannot push that peer's working ones out of its list.
        merged = _merge_addrs(addrs, old.addrs) if first_hand else _merge_addrs(old.addrs, addrs)
        if merged == old.addrs and how in old.ways and not first_hand:
            return old  # a hint that tells nothing new: the common case in peer exchange
        fresh_addr = any(a not in old.addrs for a in addrs)
        rec = PeerRecord(
            key, merged, old.how, old.ways | {how}, old.first_seen,
            max(old.last_seen, now_ms) if first_hand else old.last_seen,
            old.last_success, old.last_error, old.failures,
            min(old.next_try_ms, now_ms) if first_hand and fresh_addr else old.next_try_ms,
        )
        book.records[key] = rec
        if how == "ticket":
            book.evictable.pop(key, None)
        elif first_hand and key in book.evictable:
            book.evictable.move_to_end(key)
        return rec

    def _known(self, db_id: str, key: str) -> tuple[_Db, PeerRecord] | None:
        """The database's book and the peer's record in it, if the peer is known."""
        book = self._dbs.get(db_id)
        old = book.records.get(key) if book is not None else None
        return None if book is None or old is None else (book, old)

    def _evict(self, book: _Db, for_ticket: bool) -> bool:
        if book.evictable:
            victim, _ = book.evictable.popitem(last=False)
        elif for_ticket:
            victim = min(book.records.values(), key=lambda r: r.last_seen).key
        else:
            return False
        del book.records[victim]
        return True

    def remove(self, db_id: str, key: str) -> bool:
        book = self._dbs.get(db_id)
        if book is None or key not in book.records:
            return False
        del book.records[key]
        book.evictable.pop(key, None)
        if not book.records:
            del self._dbs[db_id]
        return True

    def forget(self, db_id: str) -> None:
        """Drop every peer of a database (it was deleted or unshared)."""
        self._dbs.pop(db_id, None)

    # ------------------------------------------------------------------------ outcomes
    def record_success(self, db_id: str, key: str, now_ms: int) -> PeerRecord | None:
        """A sync with the peer succeeded: clear its backoff. None if the peer is not known."""
        known = self._known(db_id, key)
        if known is None:
            return None
        book, old = known
        rec = PeerRecord(key, old.addrs, old.how, old.ways, old.first_seen, max(old.last_seen, now_ms),
                         now_ms, old.last_error, 0, 0)
        book.records[key] = rec
        if key in book.evictable:
            book.evictable.move_to_end(key)
        return rec

    def backoff_ms(self, failures: int) -> int:
        """The wait after ``failures`` failures in a row, before jitter."""
        if failures <= 0:
            return 0
        return min(self.cap_ms, self.base_ms << min(failures - 1, 40))

    def record_failure(self, db_id: str, key: str, now_ms: int, error: str) -> PeerRecord | None:
        """A sync with the peer failed: back off. None if the peer is not known."""
        known = self._known(db_id, key)
        if known is None:
            return None
        book, old = known
        failures = old.failures + 1
        d = self.backoff_ms(failures)
        wait = d // 2 + int(self.rnd.random() * (d - d // 2 + 1))
        rec = PeerRecord(key, old.addrs, old.how, old.ways, old.first_seen, old.last_seen, old.last_success,
                         str(error)[:MAX_ERROR_LEN], failures, now_ms + min(wait, d))
        book.records[key] = rec
        return rec

    # ------------------------------------------------------------------------ choosing
    def choose(self, db_id: str, k: int, now_ms: int, rnd: random.Random | None = None,
               keep: Callable[[str], bool] | None = None) -> list[PeerRecord]:
        """Up to ``k`` peers drawn uniformly among those not backing off and not refused by
        ``keep`` (in random order)."""
        book = self._dbs.get(db_id)
        if book is None or k <= 0:
            return []
        ready = [r for r in book.records.values() if r.next_try_ms <= now_ms and (keep is None or keep(r.key))]
        return (rnd or self.rnd).sample(ready, min(k, len(ready)))

    # ------------------------------------------------------------------------ persistence
    def to_bytes(self) -> bytes:
        dbs = {
            db_id: [[r.key, list(r.addrs), r.how, sorted(r.ways), r.first_seen, r.last_seen, r.last_success,
                     r.last_error, r.failures, r.next_try_ms] for r in book.records.values()]
            for db_id, book in self._dbs.items()
        }
        return msgpack.packb({"v": FORMAT_VERSION, "self": self.self_key, "dbs": dbs}, use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes, *, self_key: str | None = None, rnd: random.Random | None = None,
                   max_peers: int = MAX_PEERS, base_ms: int = BASE_MS, cap_ms: int = CAP_MS) -> PeerBook:
        """A book persisted by ``to_bytes``; PeerBookError if the bytes are not one. ``self_key``
        (default: the persisted one) is never kept as a peer."""
        if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_BOOK_BYTES:
            raise PeerBookError("a persisted peer book is bytes of bounded size")
        try:
            obj = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True, max_ext_len=0)
        except Exception as exc:  # msgpack raises several unrelated types for bad bytes
            raise PeerBookError(f"not a persisted peer book: {exc.__class__.__name__}") from None
        if type(obj) is not dict or set(obj) != {"v", "self", "dbs"} or obj["v"] != FORMAT_VERSION:
            raise PeerBookError("not a persisted peer book (or an unknown version)")
        stored_self = obj["self"]
        if stored_self is not None and type(stored_self) is not str:
            raise PeerBookError("the book's own key is a string")
        book = cls(self_key if self_key is not None else stored_self, rnd=rnd, max_peers=max_peers,
                   base_ms=base_ms, cap_ms=cap_ms)
        if type(obj["dbs"]) is not dict:
            raise PeerBookError("dbs is a map")
        for db_id, rows in obj["dbs"].items():
            if type(db_id) is not str or type(rows) is not list:
                raise PeerBookError("dbs maps a database id to a list of peers")
            for row in rows:
                book._load_row(db_id, row)
        for bk in book._dbs.values():  # eviction order from last_seen (ties: the stored order)
            bk.evictable = OrderedDict.fromkeys(sorted(bk.evictable, key=lambda k: bk.records[k].last_seen))
        return book

    def _load_row(self, db_id: str, row: Any) -> None:
        if type(row) is not list or len(row) != 10:
            raise PeerBookError("a persisted peer is a list of 10 fields")
        key, addrs, how, ways, first_seen, last_seen, last_success, last_error, failures, next_try = row
        if type(key) is not str or type(addrs) is not list or len(addrs) > MAX_ADDRS:
            raise PeerBookError("a persisted peer has a key and at most 8 addresses")
        if how not in HOWS or type(ways) is not list or not set(ways) <= set(HOWS) or how not in ways:
            raise PeerBookError("a persisted peer's ways are among " + ", ".join(HOWS))
        ints = (first_seen, last_seen, failures, next_try) + ((last_success,) if last_success is not None else ())
        if any(type(i) is not int or i < 0 for i in ints):
            raise PeerBookError("a persisted peer's times and failures are non-negative integers")
        if last_error is not None and (type(last_error) is not str or len(last_error) > MAX_ERROR_LEN):
            raise PeerBookError("a persisted peer's last error is a short string")
        _check_key(key)
        if key == self.self_key:
            return
        bk = self._dbs.setdefault(db_id, _Db())
        if key in bk.records or len(bk.records) >= self.max_peers:
            return  # a repeated or surplus row is dropped, as a bounded add would
        bk.records[key] = PeerRecord(key, _check_addrs(addrs), how, frozenset(ways), first_seen, last_seen,
                                     last_success, last_error, failures, next_try)
        if "ticket" not in ways:
            bk.evictable[key] = None
