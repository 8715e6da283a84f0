"""The log index: what a database knows of its stored entries, from their headers alone.

Per entry its causal metadata (height, version vector) and what its payloads carry; per author
its feed (entries by seq, the highest one, the next Yjs clock per store) and whether it forked;
the DAG's heads; which payloads storage lacks; which entries stored erases name. Nothing here
depends on authorisation: verdicts are derived state (crdt/derived.py), so the index is the same
whatever the settings say, and only grows (or is rebuilt from the log on open).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from memmesh.auth.ops import GrantOp, RevokeOp
from memmesh.crdt.entry import Entry, StoreDescriptor
from memmesh.crdt.erasure import ERASE, UNERASABLE, EraseOp
from memmesh.crdt.errors import EntryRejected, RejectedError
from memmesh.crdt.records import _NO_PAYLOADS, SETTINGS, _with_payloads, checked_name_shape, valid_store_name
from memmesh.crdt.row_keys import KeyRange, ShownKeys, canonical
from memmesh.crdt.yjs import Row

log = logging.getLogger("memmesh.crdt.database")

# What an entry's payloads carry once checked: settings operations, rows by store, erasures.
Checked = tuple[tuple[GrantOp | RevokeOp, ...], dict[str, tuple[Row, ...]], tuple[EraseOp, ...]]
# The same on load, where a payload already checked (crdt/open_marks.py) gives its key range.
CheckedStored = tuple[tuple[GrantOp | RevokeOp, ...], dict[str, ShownKeys], tuple[EraseOp, ...]]
# Stores open always decodes: it needs their operations (and they are small).
DECODED_ON_OPEN = frozenset({SETTINGS, ERASE})


@dataclass(slots=True)
class IndexedEntry:
    """What the database keeps in memory about one stored entry (its payloads stay in storage)."""

    entry: Entry
    author_key: str
    height: int
    vv: dict[str, int]
    ops: tuple[GrantOp | RevokeOp, ...]
    erases: tuple[EraseOp, ...] = ()
    excluded: bool = False  # equivocation evidence: never evaluated or applied
    size: int = 0  # header and payload bytes it arrived with


class LogIndex:
    """The stored entries of one database, indexed by id, by author feed and by what they erase."""

    def __init__(self) -> None:
        self._nodes: dict[str, IndexedEntry] = {}
        # Both entries of a fork stay findable. Tuples: one entry per seq is the rule, and a tuple
        # of strings is no object the garbage collector keeps visiting.
        self._by_seq: dict[tuple[str, int], tuple[str, ...]] = {}
        self._feed_top: dict[str, tuple[int, str]] = {}  # author -> (highest seq, entry id)
        self._equivocators: dict[str, int] = {}  # author -> first forked seq
        self._next_clock: dict[tuple[str, str], int] = {}  # along each unflagged author's feed
        self._clock_memo: dict[tuple[str, str], int] = {}  # (entry id, store) -> next clock after it
        self._stores: set[str] = set()
        self._heads: set[str] = set()
        self._absent: dict[str, set[str]] = {}  # entry id -> stores whose payload storage lacks
        self._covers: dict[tuple[str, str], set[str]] = {}  # (entry, store) -> authors stored erases name
        self._erase_nodes: set[str] = set()
        # Entry id -> its stores that passed check_payloads with clock-keyed rows, until the
        # derived state records them as checked (crdt/open_marks.py) once they are stored.
        self._fresh_marks: dict[str, set[str]] = {}

    # ------------------------------------------------------------------------- lookups
    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._nodes

    def get(self, entry_id: str) -> IndexedEntry | None:
        return self._nodes.get(entry_id)

    def __getitem__(self, entry_id: str) -> IndexedEntry:
        return self._nodes[entry_id]

    @property
    def nodes(self) -> Mapping[str, IndexedEntry]:
        return self._nodes

    @property
    def heads(self) -> AbstractSet[str]:
        return self._heads

    @property
    def stores(self) -> AbstractSet[str]:
        return self._stores

    @property
    def equivocators(self) -> Mapping[str, int]:
        return self._equivocators

    @property
    def next_clocks(self) -> Mapping[tuple[str, str], int]:
        return self._next_clock

    @property
    def erase_nodes(self) -> AbstractSet[str]:
        return self._erase_nodes

    def entries_at(self, author: str, seq: int) -> Sequence[str]:
        return self._by_seq.get((author, seq), ())

    def feed_top(self, author: str) -> tuple[int, str] | None:
        return self._feed_top.get(author)

    def feeds(self) -> dict[str, tuple[int, str]]:
        return dict(self._feed_top)

    def next_clock(self, author: str, store: str) -> int:
        return self._next_clock.get((author, store), 0)

    # ------------------------------------------------------------------ absent payloads
    def absent(self, entry_id: str) -> AbstractSet[str]:
        """The stores of the entry whose payload storage lacks (erased, or not arrived)."""
        return self._absent.get(entry_id, frozenset())

    def absent_payloads(self) -> Iterable[tuple[str, str]]:
        return ((entry_id, store) for entry_id, stores in self._absent.items() for store in stores)

    def set_absent(self, entry_id: str, stores: set[str]) -> None:
        self._absent[entry_id] = stores

    def mark_absent(self, entry_id: str, store: str) -> None:
        self._absent.setdefault(entry_id, set()).add(store)

    def mark_held(self, entry_id: str, store: str) -> None:
        """A payload storage lacked was filled in."""
        stores = self._absent.get(entry_id)
        if stores is None:
            return
        stores.discard(store)
        if not stores:
            del self._absent[entry_id]

    def covered_by_stored_erase(self, entry_id: str, store: str, author: str) -> bool:
        return author in self._covers.get((entry_id, store), ())

    # --------------------------------------------------------------------- causality
    def past_of(self, entry: Entry) -> tuple[dict[str, int], int]:
        """The version vector of the entry's causal past (its parents' merged) and its height."""
        parents = [self._nodes[p] for p in entry.parents]
        if not parents:
            return {}, 0
        vv = dict(parents[0].vv)
        height = parents[0].height + 1
        for parent in parents[1:]:
            height = max(height, parent.height + 1)
            for a, s in parent.vv.items():
                if vv.get(a, -1) < s:
                    vv[a] = s
        return vv, height

    def precedes(self, earlier: str, later: str) -> bool:
        a, b = self._nodes.get(earlier), self._nodes.get(later)
        return (a is not None and b is not None and a.entry.id != b.entry.id
                and b.vv.get(a.author_key, -1) >= a.entry.seq)

    # ---------------------------------------------------------------------- indexing
    def insert(self, node: IndexedEntry) -> None:
        entry = node.entry
        if entry.payloads:
            # Headers stay in memory; payloads live in storage only (read when rebuilding).
            entry = node.entry = _with_payloads(entry, _NO_PAYLOADS)
        author = node.author_key
        self._nodes[entry.id] = node
        at = (author, entry.seq)
        self._by_seq[at] = self._by_seq.get(at, ()) + (entry.id,)
        top = self._feed_top.get(author)
        if top is None or entry.seq > top[0]:
            self._feed_top[author] = (entry.seq, entry.id)
        for p in entry.parents:
            self._heads.discard(p)
        self._heads.add(entry.id)
        for op in node.erases:
            self._covers.setdefault((op.entry, op.store), set()).add(op.author)
        if node.erases:
            self._erase_nodes.add(entry.id)
        if not node.excluded:
            for store, desc in entry.stores.items():
                self._next_clock[(author, store)] = desc.clock + desc.clock_len  # desc.clock_end
                self._stores.add(store)

    def index_stored(self, entry: Entry, marked: AbstractSet[str] = frozenset()
                     ) -> tuple[IndexedEntry, dict[str, ShownKeys], set[str]]:
        """Index a stored entry on load (no authorisation: derived state judges it).

        ``marked``: its stores whose payloads passed these checks before (crdt/open_marks.py);
        they are not decoded again. Returns the node, each held payload's rows (or key range),
        and the stores checked now that may be marked."""
        author = entry.author_key
        vv, height = self.past_of(entry)
        vv[author] = entry.seq
        excluded = entry.seq >= self._equivocators.get(author, entry.seq + 1)
        if self._by_seq.get((author, entry.seq)):
            self.flag_equivocator(author, entry.seq)
            excluded = True
        ops: tuple[GrantOp | RevokeOp, ...]
        rows: dict[str, ShownKeys]
        erases: tuple[EraseOp, ...]
        fresh: set[str] = set()
        try:
            ops, rows, erases = self._check_stored(entry, author, marked, fresh)
        except RejectedError as exc:
            # Stored by an older release that kept evidence unchecked: keep it as evidence only.
            log.warning("stored entry %s fails today's checks (%s); kept, never applied", entry.id, exc.reason)
            ops, rows, erases, excluded = (), {}, (), True
            fresh = set()
        absent = {s for s, p in entry.payloads.items() if p is None}
        if absent:
            self._absent[entry.id] = absent
        size = len(entry.header) + sum(d.length for s, d in entry.stores.items() if s not in absent)
        node = IndexedEntry(entry, author, height, vv, ops, erases, excluded=excluded, size=size)
        self.insert(node)
        return node, rows, fresh

    def flag_equivocator(self, author: str, seq: int) -> None:
        """Stop applying ``author``'s feed from ``seq`` on: its entries become evidence only."""
        fork = min(self._equivocators.get(author, seq), seq)
        self._equivocators[author] = fork
        for node in self._nodes.values():
            if node.author_key == author and node.entry.seq >= fork:
                node.excluded = True

    # ----------------------------------------------------------- checks along a feed
    def check_payloads(self, entry: Entry, author: str) -> Checked:
        """Strict checks of every payload: shape, clocks along the author's feed; returns the
        settings operations and erasures it carries."""
        ops: list[GrantOp | RevokeOp] = []
        erases: list[EraseOp] = []
        decoded_rows: dict[str, tuple[Row, ...]] = {}
        fresh: set[str] = set()
        for store, desc in entry.stores.items():
            update = self._header_checks(entry, author, store)
            if update is None:
                continue
            decoded_rows[store] = self._shape(store, desc, update, ops, erases, fresh)
        if fresh:
            self._fresh_marks[entry.id] = fresh
        return tuple(ops), decoded_rows, tuple(erases)

    def take_fresh_marks(self, entry_ids: Iterable[str]) -> dict[str, set[str]]:
        """The stores of these entries that passed check_payloads with clock-keyed rows; forgets
        every other entry checked so far (refused, or left to a rebuild: checked again on open)."""
        fresh, self._fresh_marks = self._fresh_marks, {}
        return {i: fresh[i] for i in entry_ids if i in fresh}

    def _check_stored(self, entry: Entry, author: str, marked: AbstractSet[str], fresh: set[str]) -> CheckedStored:
        """check_payloads on load: a marked payload (its bytes were hashed against the header
        already) is known by its key range instead of being decoded again."""
        ops: list[GrantOp | RevokeOp] = []
        erases: list[EraseOp] = []
        keys: dict[str, ShownKeys] = {}
        for store, desc in entry.stores.items():
            update = self._header_checks(entry, author, store)
            if update is None:
                continue
            if store in marked and store not in DECODED_ON_OPEN:
                keys[store] = KeyRange(desc.client, desc.clock, desc.clock_len)
                continue
            keys[store] = self._shape(store, desc, update, ops, erases, fresh)
        return tuple(ops), keys, tuple(erases)

    @staticmethod
    def _shape(store: str, desc: StoreDescriptor, update: bytes, ops: list[GrantOp | RevokeOp],
               erases: list[EraseOp], fresh: set[str]) -> tuple[Row, ...]:
        """check_payload_shape of one payload: its rows; its operations added to ``ops`` and
        ``erases``, and the store to ``fresh`` when its rows may be marked (clock-keyed)."""
        shape = checked_name_shape(store, desc, update)  # _header_checks checked the name
        ops.extend(shape.ops)
        erases.extend(shape.erases)
        if store not in DECODED_ON_OPEN and canonical(shape.rows, desc.client, desc.clock):
            fresh.add(store)
        return shape.rows

    def _header_checks(self, entry: Entry, author: str, store: str) -> bytes | None:
        """The checks of one store that need only the header and the feed; its payload, or
        None when it is not held."""
        desc = entry.stores[store]
        if not valid_store_name(store):
            raise EntryRejected("entry.store_name", f"invalid store name {store!r}")
        expected = self._expected_clock(entry, author, store)
        if desc.clock != expected:
            raise EntryRejected("yjs.clock_gap" if desc.clock > expected else "yjs.clock_reuse",
                                f"store {store!r} clock {desc.clock}, expected {expected}")
        update = entry.payloads.get(store)
        if update is None and store in UNERASABLE:
            raise EntryRejected("entry.payload_missing", f"{store} payloads always travel with their entry")
        return update

    def _expected_clock(self, entry: Entry, author: str, store: str) -> int:
        """The author's next clock in ``store`` along the entry's own feed (its prev chain)."""
        if entry.prev is None:
            return 0
        if author not in self._equivocators and self._feed_top.get(author) == (entry.seq - 1, entry.prev):
            return self._next_clock.get((author, store), 0)
        # A fork, or a flagged author's entry: follow its own feed back (rare; memoised).
        chain: list[str] = []
        pid: str | None = entry.prev
        clock = 0
        while pid is not None:
            memo = self._clock_memo.get((pid, store))
            if memo is not None:
                clock = memo
                break
            chain.append(pid)
            prior = self._nodes[pid].entry
            desc = prior.stores.get(store)
            if desc is not None:
                clock = desc.clock_end
                break
            pid = prior.prev
        for visited in chain:
            self._clock_memo[(visited, store)] = clock
        return clock

    # ------------------------------------------------------------ what sync compares
    def evidence(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for author, fork in self._equivocators.items():
            top = self._feed_top[author][0]
            out[author] = sorted(i for seq in range(fork, top + 1) for i in self._by_seq.get((author, seq), ()))
        return out

    def missing_for(self, feeds: Mapping[str, tuple[int, str | None]],
                    evidence: Mapping[str, Sequence[str]], want: Iterable[str]) -> list[str]:
        missing: set[str] = {i for i in want if i in self._nodes}
        for author, (top, _head) in self._feed_top.items():
            peer_seq = feeds.get(author, (-1, None))[0]
            for seq in range(peer_seq + 1, top + 1):
                missing.update(self._by_seq.get((author, seq), ()))
            if author in self._equivocators:
                held = set(evidence.get(author, ())) | {feeds.get(author, (-1, None))[1]}
                for seq in range(self._equivocators[author], min(peer_seq, top) + 1):
                    missing.update(i for i in self._by_seq.get((author, seq), ()) if i not in held)
        nodes = self._nodes
        return sorted(missing, key=lambda i: (nodes[i].height, i))
