"""The rows of conversation history in an agent's database, and how they are read.

Stores (names fixed by the design):

* ``history``: one row per turn, ``{"role", "seq", "session", "text"}`` where ``text`` is
  the sha256 hex of the turn's UTF-8 text. Its time is its entry's timestamp, its writer the
  entry's author; its trust follows from the role (:data:`TRUST`).
* ``history_text``: ``{"hash": H, "z": zlib(UTF-8 text)}``, written only when no row of
  that hash exists in the database yet, so a text said twice (in a session or anywhere in
  the database) is stored once; every turn is still its own row.
* ``history_chunks``: the pyramid (node/history/pyramid.py), ``{"by", "children",
  "from_seq", "id", "level", "session", "summary", "to_seq"}``.

Local input is checked strictly (:class:`HistoryInputError`, nothing written). Stored rows
come from peers too and may be malformed: the ``parse_*`` functions return None for a row
that breaks a rule (logged at debug) and never raise. A text row counts only when its
decompressed text hashes to its ``hash``; a chunk row only when its ``id`` is the hash of its
span and children (:func:`chunk_id`), so a row cannot claim another chunk's place.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import zlib
from dataclasses import dataclass
from typing import Any

from memmesh.auth.errors import MemmeshError
from memmesh.crdt.records import RowRecord
from memmesh.node.memory.rows import MemoryInputError
from memmesh.node.memory.rows import check_text as check_memory_text
from memmesh.node.registry import UnknownName

log = logging.getLogger(__name__)

HISTORY_STORE = "history"
TEXT_STORE = "history_text"
CHUNKS_STORE = "history_chunks"
STORES = (HISTORY_STORE, TEXT_STORE, CHUNKS_STORE)

ROLES = ("user", "assistant", "tool")
TRUST = {"user": "owner", "assistant": "derived", "tool": "ingested"}
BATCH = 10  # turns per level-1 chunk, level-1 chunks per level-2 chunk
LEVELS = (1, 2)
SPAN = {1: BATCH, 2: BATCH * BATCH}  # seqs a chunk of each level covers
BY = ("extractive", "model")

MAX_SESSION_CHARS = 512
MAX_TEXT_CHARS = 64 * 1024
MAX_SUMMARY_CHARS = 64 * 1024  # a summary a model supplies
# An extractive summary is at most ~30 % of ten turns of MAX_TEXT_CHARS; a stored one longer
# than ten whole turns is not one.
MAX_STORED_SUMMARY_CHARS = BATCH * MAX_TEXT_CHARS
MAX_CHILDREN = 1000  # a level-1 span with duplicate seqs lists each turn; beyond this: not a chunk
MAX_SEQ = 2**53 - 1
_MAX_UTF8 = 4 * MAX_TEXT_CHARS  # the most bytes a text row may expand to
_HEX64 = re.compile(r"[0-9a-f]{64}")
_TURN_ID = re.compile(r"sha256:[0-9a-f]{64}/\d+/\d+")
_CHUNK_ID = re.compile(r"chunk:[0-9a-f]{64}")


class HistoryInputError(MemmeshError):
    """Input to a history operation that is refused; nothing was written. The message says what to change."""


class UnknownChunk(UnknownName):
    """A chunk or turn id that names nothing in the agent's history."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn row as read from the database."""

    id: str  # entry id + "/" + row key: stable on every replica
    session: str
    seq: int
    role: str
    hash: str
    author: str
    ts: int  # the entry's timestamp, ms (informational)
    order: tuple[int, str, int]  # T order

    @property
    def trust(self) -> str:
        return TRUST[self.role]


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk row as read from the database (several rows may carry one id)."""

    id: str
    session: str
    level: int
    from_seq: int
    to_seq: int
    children: tuple[str, ...]
    summary: str
    by: str
    author: str
    ts: int
    order: tuple[int, str, int]
    row: str  # entry id + "/" + row key of this row


# ------------------------------------------------------------------------------ local input
def check_text(what: str, value: Any, limit: int) -> str:
    """A non-blank string of 1..limit code points, encodable as UTF-8: the rule memory keys and
    values follow (node/memory/rows.py), raised as a history input error."""
    try:
        return check_memory_text(what, value, limit)
    except MemoryInputError as exc:
        raise HistoryInputError(str(exc)) from None


def check_session(session: Any) -> str:
    return check_text("session", session, MAX_SESSION_CHARS)


def check_role(role: Any) -> str:
    if role not in ROLES:
        raise HistoryInputError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


def check_level(level: Any) -> int:
    if type(level) is not int or level not in (0, *LEVELS):
        raise HistoryInputError(f"level is 0 (turns), 1 or 2 (chunks), got {level!r}")
    return level


# ------------------------------------------------------------------------------ row values
def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def compress(text: str) -> bytes:
    return zlib.compress(text.encode("utf-8"), 9)


def decompress(z: bytes) -> str | None:
    """The text of a ``z`` field, or None when it is not zlib data of at most
    :data:`MAX_TEXT_CHARS` characters of UTF-8 (bounded: a peer's row cannot inflate to more)."""
    try:
        inflater = zlib.decompressobj()
        data = inflater.decompress(z, _MAX_UTF8 + 1)
        if len(data) > _MAX_UTF8 or inflater.unconsumed_tail or not inflater.eof:
            return None
        text = data.decode("utf-8")
    except (zlib.error, UnicodeDecodeError, TypeError, ValueError):
        return None
    return text if 0 < len(text) <= MAX_TEXT_CHARS else None


def turn_value(session: str, seq: int, role: str, digest: str) -> dict[str, Any]:
    return {"role": role, "seq": seq, "session": session, "text": digest}


def text_value(digest: str, text: str) -> dict[str, Any]:
    return {"hash": digest, "z": compress(text)}


def chunk_id(session: str, level: int, from_seq: int, to_seq: int, children: tuple[str, ...] | list[str]) -> str:
    """The id of a chunk: the sha256 of its span and children as canonical JSON, so two
    replicas computing the same chunk name it alike."""
    canon = json.dumps([session, level, from_seq, to_seq, list(children)], ensure_ascii=False,
                       separators=(",", ":"))
    return "chunk:" + hashlib.sha256(canon.encode("utf-8")).hexdigest()


def chunk_value(session: str, level: int, from_seq: int, to_seq: int, children: tuple[str, ...] | list[str],
                summary: str, by: str) -> dict[str, Any]:
    """A chunk row (keys in sorted order: the row's bytes depend on it)."""
    return {"by": by, "children": list(children), "from_seq": from_seq,
            "id": chunk_id(session, level, from_seq, to_seq, children), "level": level,
            "session": session, "summary": summary, "to_seq": to_seq}


def turn_id_of(rec: RowRecord) -> str:
    return f"{rec.entry_id}/{rec.key}"


# ------------------------------------------------------------------------------ stored rows
def _seq(value: Any) -> bool:
    return type(value) is int and 1 <= value <= MAX_SEQ


def _session_ok(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_SESSION_CHARS and not value.isspace()


def parse_turn(rec: RowRecord) -> Turn | None:
    v = rec.value
    if (not isinstance(v, dict) or not _session_ok(v.get("session")) or not _seq(v.get("seq"))
            or v.get("role") not in ROLES or not isinstance(v.get("text"), str) or not _HEX64.fullmatch(v["text"])):
        log.debug("history: ignored a malformed turn row %s in entry %s", rec.key, rec.entry_id)
        return None
    return Turn(turn_id_of(rec), v["session"], v["seq"], v["role"], v["text"], rec.author, rec.ts, rec.order)


def parse_text(rec: RowRecord) -> tuple[str, bytes] | None:
    """(hash, z) of a text row whose text hashes to its hash."""
    v = rec.value
    if isinstance(v, dict) and isinstance(v.get("hash"), str) and isinstance(v.get("z"), bytes):
        text = decompress(v["z"])
        if text is not None and text_hash(text) == v["hash"]:
            return v["hash"], v["z"]
    log.debug("history: ignored a malformed or mismatched text row %s in entry %s", rec.key, rec.entry_id)
    return None


def parse_chunk(rec: RowRecord) -> Chunk | None:
    v = rec.value
    try:
        ok = (isinstance(v, dict) and _session_ok(v.get("session")) and v.get("level") in LEVELS
              and type(v.get("level")) is int and _seq(v.get("from_seq")) and _seq(v.get("to_seq"))
              and v.get("by") in BY and isinstance(v.get("summary"), str)
              and len(v["summary"]) <= MAX_STORED_SUMMARY_CHARS and isinstance(v.get("children"), list)
              and isinstance(v.get("id"), str))
        if ok:
            level, a, b, children = v["level"], v["from_seq"], v["to_seq"], v["children"]
            pattern = _TURN_ID if level == 1 else _CHUNK_ID
            ok = (b - a + 1 == SPAN[level] and (a - 1) % SPAN[level] == 0
                  and (BATCH <= len(children) <= MAX_CHILDREN if level == 1 else len(children) == BATCH)
                  and all(isinstance(c, str) and pattern.fullmatch(c) for c in children)
                  and v["id"] == chunk_id(v["session"], level, a, b, children))
    except (UnicodeEncodeError, TypeError, ValueError):
        ok = False
    if not ok:
        log.debug("history: ignored a malformed chunk row %s in entry %s", rec.key, rec.entry_id)
        return None
    return Chunk(v["id"], v["session"], v["level"], v["from_seq"], v["to_seq"], tuple(v["children"]),
                 v["summary"], v["by"], rec.author, rec.ts, rec.order, turn_id_of(rec))
