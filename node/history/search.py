"""History search for recall: turns and chunks ranked by BM25 over their text.

Documents: each turn's text, and each stored chunk's summaries (the extractive one and the
newest model one, joined). The index is the database's :class:`~node.history.state.HistoryState`
one, kept current by the database's row events; statistics (N, df, avgdl) are over all those
documents together, so a turn and the chunk that summarises it compete on one scale.

Only what the pyramid currently holds is returned: a stale chunk row (its span changed since
it was written) is passed over, and so is a turn signed by a writer under an active
quarantine of the database (node/memory/quarantine.py). Ties in score go to (kind, id) in
string order, so every replica ranks alike.

Each hit is a dict with ``kind`` ("turn" | "chunk"), ``id`` (for ``history expand`` or, for a
turn, ``history show --level 0``), ``session``, ``level`` (0 for a turn), ``seq`` (turns) or
``from_seq``/``to_seq`` (chunks), ``role`` (None for a chunk), ``text`` (for a chunk, the shown
summary, also under ``summary``), ``time`` (ISO 8601; a chunk's is its newest turn's),
``score`` and ``past_discussion: True``; turns add ``trust`` and ``written_by``, chunks ``by``.
"""
from __future__ import annotations

from typing import Any

from memmesh.crdt.database import Database
from memmesh.node.memory.quarantine import hides, quarantines
from memmesh.node.memory.rows import iso_utc
from memmesh.node.memory.tokens import tokenize

from .record import TRUST
from .state import state_of

__all__ = ["MAX_LIMIT", "search_history"]

MAX_LIMIT = 1000


def search_history(db: Database, query: str, limit: int) -> list[dict[str, Any]]:
    """The best ``limit`` history hits for ``query`` in ``db`` (none for a query without tokens)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be a whole number from 1 to {MAX_LIMIT}, got {limit!r}")
    tokens = tokenize(query) if isinstance(query, str) else []
    if not tokens:
        return []
    qs = [q for q in quarantines(db) if q.active]
    st = state_of(db)
    with st.lock:
        st.refresh(db)
        index = st.index()

        def allowed(doc_id: int) -> bool:
            kind, item = st.doc(doc_id)
            if kind == "turn":
                t = st.turn(item)
                return t is not None and not (qs and hides(qs, t.author, t.ts))
            span, _ = st.find(item)
            return span is not None

        hits = index.search(tokens, limit=limit, allowed=allowed, tiebreak=st.doc)
        out: list[dict[str, Any]] = []
        for doc_id, score in hits:
            kind, item = st.doc(doc_id)
            if kind == "turn":
                t = st.turn(item)
                assert t is not None  # allowed() checked it
                out.append({"kind": "turn", "id": t.id, "session": t.session, "level": 0, "seq": t.seq,
                            "role": t.role, "trust": TRUST[t.role], "written_by": t.author,
                            "text": st.text(t.hash), "time": iso_utc(t.ts), "score": float(score),
                            "past_discussion": True})
            else:
                span, _ = st.find(item)
                assert span is not None
                summary, by, _author = st.shown(span.id, st.extractive(span))
                last = st.last_ts(span)
                out.append({"kind": "chunk", "id": span.id, "session": span.session, "level": span.level,
                            "from_seq": span.from_seq, "to_seq": span.to_seq, "role": None, "text": summary,
                            "summary": summary, "by": by, "time": None if last is None else iso_utc(last),
                            "score": float(score), "past_discussion": True})
        return out
