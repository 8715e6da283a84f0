"""What a database's history rows say, kept current by following the database's row events.

One :class:`HistoryState` per open database (:func:`state_of`). It subscribes to the
database like the memory view does (node/memory/view.py): the listener only queues events of
the three history stores (it runs inside the database's ingest and must never block or raise);
whoever reads takes the state's lock and applies the queue first (:meth:`HistoryState.refresh`).
``Rebuilt`` (verdicts changed, a payload erased) makes the next reader rebuild from
``db.rows``, because rows may have gone. Following events rather than comparing ``heads``
keeps a write O(its rows): a new head would mean rereading every history row.

Applying a row is idempotent (rows are keyed by entry id and row key), so a row that is both
read during a rebuild and queued by a concurrent ingest counts once.

The BM25 index for history search is built on the first search and then kept current by the
same events (adds and window builds never pay for it).
"""
from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from memmesh.crdt.database import Database, Rebuilt, RowRecord, RowsAdded
from memmesh.node.memory.bm25 import InvertedIndex
from memmesh.node.memory.tokens import tokenize

from .labels import CLEAN, TextLabels, text_labels
from .pyramid import Pyramid, SessionIndex, Span, summarise_level1, summarise_level2
from .record import (
    CHUNKS_STORE,
    HISTORY_STORE,
    STORES,
    TEXT_STORE,
    Chunk,
    Turn,
    decompress,
    parse_chunk,
    parse_text,
    parse_turn,
    text_hash,
)

__all__ = ["ChunkRows", "HistoryState", "state_of"]


@dataclass
class ChunkRows:
    """The rows that carry one chunk id: the extractive summary that counts (the first in T
    order: every honest writer computes the same one) and the newest model summary."""

    extractive: Chunk | None = None
    model: Chunk | None = None
    rows: set[str] = field(default_factory=set)

    @property
    def any(self) -> Chunk:
        found = self.extractive or self.model
        assert found is not None  # a ChunkRows exists only once a row was added
        return found


class HistoryState:
    def __init__(self) -> None:
        self.lock = threading.RLock()  # readers and refresh
        self.write_lock = threading.Lock()  # seq assignment through commit, per database
        self._backlog: deque[RowsAdded | Rebuilt] = deque()
        self._stale = True
        # text hash -> its labels (node/history/labels.py): a function of the text alone, so it
        # outlives a rebuild; one entry per distinct text judged, like the texts themselves.
        self._labels: dict[str, TextLabels] = {}
        self._reset()

    def _reset(self) -> None:
        self._turns: dict[str, Turn] = {}
        self._sessions: dict[str, SessionIndex] = {}
        self._texts: dict[str, bytes] = {}
        self._chunks: dict[str, ChunkRows] = {}
        self._computed: dict[str, str] = {}  # chunk id -> extractive summary computed here
        self._bm25: InvertedIndex | None = None
        self._docs: list[tuple[str, str]] = []  # doc id -> (kind, id)
        self._doc_of: dict[tuple[str, str], int] = {}
        self._waiting: dict[str, list[str]] = {}  # text hash -> turns indexed once it arrives

    # ------------------------------------------------------------------------- following
    def on_event(self, event: RowsAdded | Rebuilt) -> None:
        if isinstance(event, Rebuilt) or (isinstance(event, RowsAdded) and event.store in STORES):
            self._backlog.append(event)

    def refresh(self, db: Database) -> None:
        """Apply what happened since the last call (the caller holds :attr:`lock`)."""
        while True:
            if self._stale:
                self._stale = False
                self._backlog.clear()  # db.rows holds every row these events carried
                searched = self._bm25 is not None
                self._reset()
                for store in (TEXT_STORE, HISTORY_STORE, CHUNKS_STORE):
                    for rec in db.rows(store):
                        self._add(store, rec)
                if searched:
                    self.index()
            while self._backlog:
                event = self._backlog.popleft()
                if isinstance(event, Rebuilt):
                    self._stale = True
                    break
                for rec in event.rows:
                    self._add(event.store, rec)
            if not self._stale:
                return

    def _add(self, store: str, rec: RowRecord) -> None:
        if store == HISTORY_STORE:
            t = parse_turn(rec)
            if t is None or t.id in self._turns:
                return
            self._turns[t.id] = t
            index = self._sessions.get(t.session)
            if index is None:
                index = self._sessions[t.session] = SessionIndex(t.session)
            index.add(t)
            if self._bm25 is not None:
                self._index_turn(t)
        elif store == TEXT_STORE:
            parsed = parse_text(rec)
            if parsed is None or parsed[0] in self._texts:
                return
            self._texts[parsed[0]] = parsed[1]
            for turn_id in self._waiting.pop(parsed[0], ()):
                self._index_turn(self._turns[turn_id])
        elif store == CHUNKS_STORE:
            c = parse_chunk(rec)
            if c is None:
                return
            rows = self._chunks.setdefault(c.id, ChunkRows())
            if c.row in rows.rows:
                return
            rows.rows.add(c.row)
            if c.by == "extractive":
                if rows.extractive is None or c.order < rows.extractive.order:
                    rows.extractive = c
            elif rows.model is None or c.order > rows.model.order:
                rows.model = c
            if self._bm25 is not None:
                self._index_chunk(c.id)

    # ------------------------------------------------------------------------- reading
    def sessions(self) -> list[str]:
        return sorted(self._sessions)

    def turn(self, turn_id: str) -> Turn | None:
        return self._turns.get(turn_id)

    def has_text(self, digest: str) -> bool:
        return digest in self._texts

    def text(self, digest: str) -> str | None:
        z = self._texts.get(digest)
        return None if z is None else decompress(z)

    def labels(self, text: str | None, digest: str | None = None) -> TextLabels:
        """The labels of a turn's text or a summary (``digest``: its hash when known, as a
        turn's is); judged once per distinct text."""
        if text is None:
            return CLEAN
        key = digest if digest is not None else text_hash(text)
        found = self._labels.get(key)
        if found is None:
            found = self._labels[key] = text_labels(text)
        return found

    def turn_labels(self, t: Turn) -> TextLabels:
        """The labels of a turn's text (clean while its text is not held)."""
        found = self._labels.get(t.hash)
        return found if found is not None else self.labels(self.text(t.hash), t.hash)

    def max_seq(self, session: str) -> int:
        index = self._sessions.get(session)
        return 0 if index is None else index.max_seq

    def pyramid(self, session: str) -> Pyramid:
        index = self._sessions.get(session)
        return (index or SessionIndex(session)).pyramid()

    def spans_at(self, session: str, seq: int) -> list[Span]:
        """The chunks (complete spans) that a turn at ``seq`` belongs to: what an add may complete."""
        index = self._sessions.get(session)
        return [] if index is None else index.spans_at(seq)

    def rows_of(self, chunk_id: str) -> ChunkRows | None:
        return self._chunks.get(chunk_id)

    def extractive(self, span: Span) -> str | None:
        """The chunk's extractive summary: its stored row's, else computed here (None while a
        turn's text has not arrived)."""
        rows = self._chunks.get(span.id)
        if rows is not None and rows.extractive is not None:
            return rows.extractive.summary
        done = self._computed.get(span.id)
        if done is not None:
            return done
        if span.level == 1:
            texts = [self.text(t.hash) for t in (self._turns.get(c) for c in span.children) if t is not None]
            if len(texts) != len(span.children) or any(x is None for x in texts):
                return None
            summary = summarise_level1([x for x in texts if x is not None])
        else:
            p = self.pyramid(span.session)
            parts = [self.extractive(p.by_id[c]) if c in p.by_id else None for c in span.children]
            if any(x is None for x in parts):
                return None
            summary = summarise_level2([x for x in parts if x is not None])
        self._computed[span.id] = summary
        return summary

    def shown(self, span_id: str, extractive: str | None) -> tuple[str | None, str, str | None]:
        """(summary, by, model author): the newest model summary when there is one, else the
        extractive one."""
        rows = self._chunks.get(span_id)
        if rows is not None and rows.model is not None:
            return rows.model.summary, "model", rows.model.author
        return extractive, "extractive", None

    def last_ts(self, span: Span) -> int | None:
        """The time of the newest turn a chunk covers (the same on every replica)."""
        p = self.pyramid(span.session)
        last = span.children[-1] if span.children else None
        if span.level == 2:
            child = p.by_id.get(last or "")
            return None if child is None else self.last_ts(child)
        t = self._turns.get(last or "")
        return None if t is None else t.ts

    def find(self, chunk_id: str) -> tuple[Span | None, ChunkRows | None]:
        """The chunk of that id in its session's current pyramid (or None: not current), and
        its stored rows (or None: not written yet)."""
        rows = self._chunks.get(chunk_id)
        if rows is not None:
            return self.pyramid(rows.any.session).by_id.get(chunk_id), rows
        for session in self.sessions():
            span = self.pyramid(session).by_id.get(chunk_id)
            if span is not None:
                return span, None
        return None, None

    # ------------------------------------------------------------------------- search
    def index(self) -> InvertedIndex:
        """The BM25 index over turn texts and stored chunk summaries (built on first use)."""
        if self._bm25 is None:
            self._bm25 = InvertedIndex()
            for t in self._turns.values():
                self._index_turn(t)
            for chunk_id in self._chunks:
                self._index_chunk(chunk_id)
        return self._bm25

    def doc(self, doc_id: int) -> tuple[str, str]:
        return self._docs[doc_id]

    def _put(self, key: tuple[str, str], tokens: Iterable[str]) -> None:
        assert self._bm25 is not None
        old = self._doc_of.get(key)
        if old is not None:
            self._bm25.remove(old)
        doc_id = self._doc_of[key] = len(self._docs)
        self._docs.append(key)
        self._bm25.add(doc_id, list(tokens))

    def _index_turn(self, t: Turn) -> None:
        text = self.text(t.hash)
        if text is None:
            self._waiting.setdefault(t.hash, []).append(t.id)
            return
        self._put(("turn", t.id), tokenize(text))

    def _index_chunk(self, chunk_id: str) -> None:
        rows = self._chunks[chunk_id]
        parts = [c.summary for c in (rows.extractive, rows.model) if c is not None]
        self._put(("chunk", chunk_id), tokenize(" ".join(parts)))


_STATES: weakref.WeakKeyDictionary[Database, HistoryState] = weakref.WeakKeyDictionary()
_STATES_LOCK = threading.Lock()


def state_of(db: Database) -> HistoryState:
    """The history state of ``db``, refreshed; the caller holds ``state.lock`` while reading.

    Keyed weakly by the database object: the state holds no reference to the database, so it
    goes when the database does.
    """
    with _STATES_LOCK:
        state = _STATES.get(db)
        if state is None:
            state = _STATES[db] = HistoryState()
            db.subscribe(state.on_event)
    return state
