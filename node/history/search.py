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

Hygiene (node/history/labels.py), as for memory rows: a turn or chunk whose text holds a
credential is a candidate only when ``include_secrets`` (then it carries ``secret``); a flagged
one carries ``flagged`` and the trust ``flagged``, and its score is multiplied by
``flagged_weight`` (0: never returned), re-ranking the best :data:`RERANK` candidates as recall
does for memories. Without flagged candidates (or with a weight of 1) the ranking is plain BM25.
Both default to the agent's own config in the searched database (its ``include_secrets`` and
``trust_weights.flagged`` rows over the built-in defaults: hidden, 0.5); a caller that knows the
node's config passes them. ``inject`` is for text that goes to a model as it is: flagged and
secret hits are never candidates, whatever the rest says.
"""
from __future__ import annotations

from typing import Any

from memmesh.crdt.database import Database
from memmesh.node.memory.agents import agent_state
from memmesh.node.memory.quarantine import hides, quarantines
from memmesh.node.memory.rows import iso_utc
from memmesh.node.memory.tokens import tokenize

from .labels import TextLabels
from .pyramid import Span
from .record import TRUST, Turn
from .state import state_of

__all__ = ["MAX_LIMIT", "RERANK", "search_history"]

MAX_LIMIT = 1000
RERANK = 100  # candidates re-ranked by the flagged weight, as recall re-ranks memories


def _config(db: Database, include_secrets: bool | None, flagged_weight: float | None) -> tuple[bool, float]:
    if include_secrets is not None and flagged_weight is not None:
        return include_secrets, flagged_weight
    config = agent_state(db).config
    if include_secrets is None:
        include_secrets = bool(config["include_secrets"])
    if flagged_weight is None:
        flagged_weight = float(config["trust_weights"].get("flagged", 0.5))
    return include_secrets, flagged_weight


def search_history(db: Database, query: str, limit: int, *, include_secrets: bool | None = None,
                   flagged_weight: float | None = None, inject: bool = False) -> list[dict[str, Any]]:
    """The best ``limit`` history hits for ``query`` in ``db`` (none for a query without tokens)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be a whole number from 1 to {MAX_LIMIT}, got {limit!r}")
    if flagged_weight is not None and (isinstance(flagged_weight, bool) or not isinstance(flagged_weight, (int, float))
                                       or not 0 <= flagged_weight <= 1):
        raise ValueError(f"flagged_weight must be a number from 0 to 1, got {flagged_weight!r}")
    tokens = tokenize(query) if isinstance(query, str) else []
    if not tokens:
        return []
    secrets, weight = _config(db, include_secrets, flagged_weight)
    if inject:
        secrets, weight = False, 0.0
    qs = [q for q in quarantines(db) if q.active]
    st = state_of(db)
    with st.lock:
        st.refresh(db)
        index = st.index()

        def found(kind: str, item: str) -> Turn | Span | None:
            """The turn or the current chunk behind a doc (None: not a result)."""
            if kind == "turn":
                t = st.turn(item)
                return None if t is None or (qs and hides(qs, t.author, t.ts)) else t
            return st.find(item)[0]

        def labels(x: Turn | Span) -> TextLabels:
            if isinstance(x, Turn):
                return st.turn_labels(x)  # judged once per text
            return st.labels(st.shown(x.id, st.extractive(x))[0])

        def allowed(doc_id: int) -> bool:
            x = found(*st.doc(doc_id))
            if x is None:
                return False
            got = labels(x)
            if got.secret is not None and not secrets:
                return False
            return not (got.flag is not None and weight == 0)

        rerank = weight != 1
        hits = index.search(tokens, limit=max(limit, RERANK) if rerank else limit, allowed=allowed, tiebreak=st.doc)
        scored: list[tuple[Turn | Span, float, TextLabels]] = []
        for doc_id, score in hits:
            x = found(*st.doc(doc_id))
            assert x is not None  # allowed() checked it
            got = labels(x)
            scored.append((x, float(score) * (weight if got.flag is not None else 1.0), got))
        if rerank:
            scored.sort(key=lambda h: -h[1])  # stable: equal scores keep BM25's order, (kind, id)
        out: list[dict[str, Any]] = []
        for x, score, got in scored[:limit]:
            if isinstance(x, Turn):
                t = x
                out.append({"kind": "turn", "id": t.id, "session": t.session, "level": 0, "seq": t.seq,
                            "role": t.role, "trust": "flagged" if got.flag is not None else TRUST[t.role],
                            "written_by": t.author, "text": st.text(t.hash), "time": iso_utc(t.ts),
                            "score": score, "past_discussion": True, **got.fields()})
            else:
                span = x
                summary, by, _author = st.shown(span.id, st.extractive(span))
                last = st.last_ts(span)
                out.append({"kind": "chunk", "id": span.id, "session": span.session, "level": span.level,
                            "from_seq": span.from_seq, "to_seq": span.to_seq, "role": None, "text": summary,
                            "summary": summary, "by": by, "time": None if last is None else iso_utc(last),
                            "score": score, "past_discussion": True,
                            **({"trust": "flagged"} if got.flag is not None else {}), **got.fields()})
        return out
