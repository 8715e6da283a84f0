"""The history operations on one agent database: add, compact, show, expand, window, summary.

They take the database and, to write, the key that signs (the agent's own in the commands),
so a test or a second replica can run them with any key allowed to write. Results are
JSON-able dicts. Every write validates first and writes nothing when input is refused.
"""
from __future__ import annotations

import json
from typing import Any

from memmesh.auth.keys import SigningKey
from memmesh.crdt.database import Database
from memmesh.node.memory.proposals import capture_turn
from memmesh.node.memory.rows import iso_utc

from .pyramid import Span
from .record import (
    CHUNKS_STORE,
    HISTORY_STORE,
    MAX_SUMMARY_CHARS,
    MAX_TEXT_CHARS,
    TEXT_STORE,
    TRUST,
    HistoryInputError,
    Turn,
    UnknownChunk,
    check_level,
    check_role,
    check_session,
    check_text,
    chunk_value,
    text_hash,
    text_value,
    turn_value,
)
from .state import HistoryState, state_of
from .window import build_window

__all__ = ["MAX_BUDGET", "TOOL_CONFIG_KEY", "add_turn", "compact", "expand", "set_summary", "show", "window"]

TOOL_CONFIG_KEY = "record_tool_output"
MAX_BUDGET = 100_000_000  # characters
# Chunk rows per entry: well under the 1 MiB payload cap of one store in one entry.
_PAYLOAD_BYTES = 512 * 1024


# ------------------------------------------------------------------------------ shapes
def turn_dict(st: HistoryState, t: Turn) -> dict[str, Any]:
    return {"kind": "turn", "id": t.id, "session": t.session, "seq": t.seq, "level": 0, "role": t.role,
            "trust": TRUST[t.role], "time": iso_utc(t.ts), "written_by": t.author, "text": st.text(t.hash),
            **st.turn_labels(t).fields()}


def chunk_dict(st: HistoryState, span: Span, *, current: bool = True) -> dict[str, Any]:
    rows = st.rows_of(span.id)
    extractive = st.extractive(span)
    summary, by, model_by = st.shown(span.id, extractive)
    model = None if model_by is None else {"summary": summary, "written_by": model_by}
    last = st.last_ts(span)
    return {"kind": "chunk", "id": span.id, "session": span.session, "level": span.level,
            "from_seq": span.from_seq, "to_seq": span.to_seq, "children": list(span.children),
            "summary": summary, "by": by, "extractive": extractive, "model": model,
            "stored": rows is not None and rows.extractive is not None, "current": current,
            "time": None if last is None else iso_utc(last), **st.labels(summary).fields()}


# ------------------------------------------------------------------------------ writing
def add_turn(db: Database, key: SigningKey, session: str, role: str, text: str, *,
             record_tool_output: bool = False, compact_after: bool = True) -> dict[str, Any]:
    """Append one turn verbatim; then write the chunks its session's complete batches lack.

    A ``tool`` turn is recorded only with ``record_tool_output``; otherwise nothing is written
    and the result says ``recorded: False`` with a warning naming the config key.
    """
    check_session(session)
    check_role(role)
    check_text("text", text, MAX_TEXT_CHARS)
    if role == "tool" and not record_tool_output:
        return {"recorded": False, "session": session, "role": role, "id": None, "seq": None, "chunks": [],
                "warnings": [f"tool output is not recorded: the agent's config {TOOL_CONFIG_KEY} is false "
                             f"(memmesh memory config AGENT set {TOOL_CONFIG_KEY} true records it)"]}
    st = state_of(db)
    digest = text_hash(text)
    with st.write_lock:
        with st.lock:
            st.refresh(db)
            seq = st.max_seq(session) + 1
            new_text = not st.has_text(digest)
        txn = db.transaction(key)
        row_key = txn.append(HISTORY_STORE, turn_value(session, seq, role, digest))
        if new_text:
            txn.append(TEXT_STORE, text_value(digest, text))
        entry = txn.commit()
        written = _compact(db, key, st, [session], at=seq) if compact_after else []
    captured = capture_turn(db, key, role, text, session=session, turn=f"{entry}/{row_key}")  # auto-capture
    return {"recorded": True, "session": session, "seq": seq, "role": role, "trust": TRUST[role],
            "id": f"{entry}/{row_key}", "entry": entry, "text_stored": new_text, "chunks": written, "warnings": [],
            **({"captured": captured} if captured is not None else {})}


def compact(db: Database, key: SigningKey, session: str | None = None) -> list[str]:
    """Write every chunk the pyramid has and the database lacks (all sessions, or one); the
    ids written. Chunks whose turns' texts have not all arrived wait for them."""
    if session is not None:
        check_session(session)
    st = state_of(db)
    with st.write_lock:
        with st.lock:
            st.refresh(db)
            sessions = st.sessions() if session is None else [session]
        return _compact(db, key, st, sessions)


def _compact(db: Database, key: SigningKey, st: HistoryState, sessions: list[str], at: int | None = None) -> list[str]:
    """``at``: only the spans of that seq (what one add can complete), else every span."""
    values: list[dict[str, Any]] = []
    with st.lock:
        st.refresh(db)
        for session in sessions:
            if at is not None:
                spans = st.spans_at(session, at)
            else:
                p = st.pyramid(session)
                spans = [*p.level1, *p.level2]
            for span in spans:  # level 2 reads level-1 summaries: stored or computed here
                rows = st.rows_of(span.id)
                if rows is not None and rows.extractive is not None:
                    continue
                summary = st.extractive(span)
                if summary is None:
                    continue
                values.append(chunk_value(span.session, span.level, span.from_seq, span.to_seq, span.children,
                                          summary, "extractive"))
    batch: list[dict[str, Any]] = []
    size = 0
    for value in values:
        cost = len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
        if batch and size + cost > _PAYLOAD_BYTES:
            _write(db, key, batch)
            batch, size = [], 0
        batch.append(value)
        size += cost
    if batch:
        _write(db, key, batch)
    return [v["id"] for v in values]


def _write(db: Database, key: SigningKey, values: list[dict[str, Any]]) -> str:
    txn = db.transaction(key)
    for value in values:
        txn.append(CHUNKS_STORE, value)
    return txn.commit()


def set_summary(db: Database, key: SigningKey, chunk_id: str, summary: str) -> dict[str, Any]:
    """Record a model's summary of a chunk (``by: model``, signed by ``key``): shown instead of
    the extractive one, which stays in its own row and recomputable."""
    check_text("summary", summary, MAX_SUMMARY_CHARS)
    st = state_of(db)
    with st.lock:
        st.refresh(db)
        span, rows = st.find(chunk_id)
        if span is None:
            raise _unknown(st, chunk_id, "summarise")
    txn = db.transaction(key)
    txn.append(CHUNKS_STORE, chunk_value(span.session, span.level, span.from_seq, span.to_seq, span.children,
                                         summary, "model"))
    entry = txn.commit()
    return {"id": chunk_id, "session": span.session, "level": span.level, "by": "model",
            "written_by": str(key.public), "entry": entry}


# ------------------------------------------------------------------------------ reading
def show(db: Database, session: str, level: int | None = None) -> dict[str, Any]:
    """``level`` None: the session at decreasing resolution (level-2 chunks, level-1 chunks
    outside them, turns outside any chunk); 0: every turn; 1 or 2: every chunk of that level."""
    check_session(session)
    if level is not None:
        check_level(level)
    st = state_of(db)
    with st.lock:
        st.refresh(db)
        p = st.pyramid(session)
        if level is None:
            items = [turn_dict(st, x) if isinstance(x, Turn) else chunk_dict(st, x) for x in p.cover()]
        elif level == 0:
            items = [turn_dict(st, t) for t in p.turns]
        else:
            items = [chunk_dict(st, c) for c in p.chunks(level)]
        return {"session": session, "level": level, "turns": len(p.turns), "level1": len(p.level1),
                "level2": len(p.level2), "items": items}


def expand(db: Database, chunk_id: str) -> dict[str, Any]:
    """A chunk and its children: turns (level 1) or level-1 chunks (level 2)."""
    if not isinstance(chunk_id, str) or not chunk_id:
        raise HistoryInputError("a chunk id is chunk: and 64 hex digits, as history show prints it")
    st = state_of(db)
    with st.lock:
        st.refresh(db)
        span, rows = st.find(chunk_id)
        current = span is not None
        if span is None and rows is not None:  # stale: a later turn changed its span; its row still answers
            c = rows.any
            span = Span(c.id, c.session, c.level, c.from_seq, c.to_seq, c.children)
        if span is None:
            raise _unknown(st, chunk_id, "expand")
        children: list[dict[str, Any]] = []
        missing = []
        p = st.pyramid(span.session)
        for child in span.children:
            if span.level == 1:
                t = st.turn(child)
                if t is None:
                    missing.append(child)
                else:
                    children.append(turn_dict(st, t))
            else:
                sub = p.by_id.get(child)
                if sub is not None:
                    children.append(chunk_dict(st, sub))
                else:
                    sub_rows = st.rows_of(child)
                    if sub_rows is None:
                        missing.append(child)
                        continue
                    c = sub_rows.any
                    children.append(chunk_dict(st, Span(c.id, c.session, c.level, c.from_seq, c.to_seq, c.children),
                                               current=False))
        return {"chunk": chunk_dict(st, span, current=current), "children": children, "missing": missing}


def window(db: Database, session: str, budget: int) -> dict[str, Any]:
    check_session(session)
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= MAX_BUDGET:
        raise HistoryInputError(f"budget is a number of characters from 1 to {MAX_BUDGET}, got {budget!r}")
    st = state_of(db)
    withheld: dict[str, dict[str, Any]] = {}

    def turn_text(t: Turn) -> str | None:
        # A flagged turn or one holding a credential is left out of the window: it is shown to
        # a model as it is (docs/memory.md, "History"; node/history/labels.py).
        text = st.text(t.hash)
        reason = st.turn_labels(t).reason()
        if reason is None:
            return text
        withheld[t.id] = {"kind": "turn", "id": t.id, "level": 0, "from_seq": t.seq, "to_seq": t.seq,
                          "reason": reason}
        return None

    def summary(c: Span) -> str | None:
        # A withheld summary stands as its children, each judged in turn.
        text = st.shown(c.id, st.extractive(c))[0]
        reason = st.labels(text).reason()
        if reason is None:
            return text
        withheld[c.id] = {"kind": "chunk", "id": c.id, "level": c.level, "from_seq": c.from_seq,
                          "to_seq": c.to_seq, "reason": reason}
        return None

    with st.lock:
        st.refresh(db)
        p = st.pyramid(session)
        w = build_window(p, turn_text, summary, budget)
    items = [{"kind": i.kind, "id": i.id, "level": i.level, "from_seq": i.from_seq, "to_seq": i.to_seq}
             for i in w.items]
    raw = [i for i in w.items if i.kind == "turn"]
    # Every item the window judged and left out (the session's cover, and the children of the
    # chunks it opened), oldest first.
    left_out = sorted(withheld.values(), key=lambda x: (x["from_seq"], -x["level"], x["id"]))
    return {"session": session, "budget": budget, "chars": w.chars, "text": w.text, "items": items,
            "turns": len(p.turns), "raw_turns": len(raw), "withheld": left_out}


def _unknown(st: HistoryState, chunk_id: str, doing: str) -> UnknownChunk:
    if st.turn(chunk_id) is not None:
        return UnknownChunk(f"{chunk_id} is a turn, not a chunk: a turn has no children to {doing} "
                            "(memmesh history show AGENT --session S --level 0 shows turns)")
    return UnknownChunk(f"no chunk {chunk_id} in this agent's history (memmesh history show AGENT --session S "
                        "--level 1 lists chunks; a batch becomes a chunk once its 10 turns exist)")
