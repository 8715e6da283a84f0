"""What the memory tools (remember, recall, list_memory_banks) and auto-recall do.

The tool table, with each tool's argument schema, is in node/commands/tools.py; every
transport reaches these methods through it. Results are plain JSON-able dicts. Fallbacks
never error (DESIGN 7): no embedder, no vectors yet, an embedder failing on write (the memory
is stored without a vector, with a warning) or on read (BM25 only, with a warning).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import numpy as np

from auth.errors import AuthError
from auth.permissions import Permission
from crdt.database import Database
from node.memory.access import AccessCounts
from node.memory.agents import Agent, Agents, agent_state
from node.memory.embedders import Embedder, EmbedderError
from node.memory.framing import DEFAULT_CONTEXT_WINDOW, budget_chars, fit, memory_line
from node.memory.fusion import decay_factor, decayed
from node.memory.graph import neighbors
from node.memory.rows import MEMORY_STORE, embedding_value, memory_value
from node.memory.saving import plan_write
from node.memory.scope import by_precedence
from node.memory.timeline import Filters
from node.memory.tokens import autorecall_query_tokens
from node.memory.view import DEFAULT_LIMIT, MAX_LIMIT, MemoryView
from node.registry import NameError_
from node.settings import applied, memory_defaults

log = logging.getLogger(__name__)

NO_MEMORIES = "No memories found"


def perm_name(perm: Permission | None) -> str:
    return "none" if perm is None else perm.level


class MemoryService:
    def __init__(self, agents: Agents, embedder: Embedder | None) -> None:
        self.agents = agents
        self.embedder = embedder
        self._views: dict[str, MemoryView] = {}
        self.access = AccessCounts(agents.home.storage)

    def close(self) -> None:
        for view in self._views.values():
            view.close()
        self._views.clear()

    # ------------------------------------------------------------------ views
    def view(self, db: Database) -> MemoryView:
        view = self._views.get(db.id)
        if view is None:
            store, dim = None, None
            if self.embedder is not None:
                store = self.embedder.store_name
                # Only a size known without a network call: a view must open even when a
                # remote embedder is down.
                dim = self.embedder.known_dim if hasattr(self.embedder, "known_dim") else self.embedder.dim
            view = self._views[db.id] = MemoryView(db, embedding_store=store, dim=dim)
        return view

    def _embed(self, text: str, warnings: list[str], when: str) -> np.ndarray | None:
        if self.embedder is None:
            return None
        try:
            return self.embedder.embed([text])[0]
        except EmbedderError as exc:
            msg = f"embedder {self.embedder.provider}/{self.embedder.model} failed on {when}: {exc}"
            warnings.append(msg + ("; stored without a vector" if when == "write" else "; ranked by BM25 only"))
            log.warning("%s", warnings[-1])
            return None

    # ------------------------------------------------------------------ tools
    def remember(self, agent: Agent, key: str, value: str, tags: Sequence[str] = (),
                 bank: str | None = None, *, supersedes: Sequence[str] = (),
                 now: int | None = None, **fields: Any) -> dict[str, Any]:
        """``fields``: the optional row fields (node/memory/rows.py); dedup, merge and
        supersession as node/memory/saving.py decides. ``now`` (ms): the caller's clock."""
        memory_value(key, value, tags if tags is not None else (), **fields)  # bad input fails first
        target = self.agents.open_for(agent, bank, "write")
        plan = plan_write(self.view(target.db), key, value, tags if tags is not None else (),
                          supersedes=supersedes, now=_now_ms() if now is None else now, **fields)
        if plan.row is None:
            return {"ok": True, "key": plan.current.key, "bank": target.name, "entry": plan.current.entry_id,
                    "embedded": False, "warnings": [], "deduplicated": True, "merged_into": plan.current.key}
        row = plan.row
        warnings: list[str] = []
        vector = self._embed(f"{row['key']} {row['value']}", warnings, "write")
        txn = target.db.transaction(agent.key)
        row_key = txn.append(MEMORY_STORE, row)
        if vector is not None and self.embedder is not None:
            txn.append(self.embedder.store_name, embedding_value(row_key, vector))
        entry_id = txn.commit()
        return {
            "ok": True,
            "key": row["key"],
            "bank": target.name,
            "entry": entry_id,
            "embedded": vector is not None,
            "warnings": warnings,
            **({"merged": True} if plan.merged else {}),
            **({"supersedes": plan.superseded} if plan.superseded else {}),
        }

    def recall(
        self,
        agent: Agent,
        query: str = "",
        tags: Sequence[str] = (),
        limit: int = DEFAULT_LIMIT,
        bank: str | None = None,
        include_superseded: bool = False,
        count: bool = True,
        filters: Filters | None = None,
    ) -> dict[str, Any]:
        """Arguments are checked by the recall tool's model and again by the view. ``count``:
        count this recall in the access counts of the memories it returns (node/memory/access.py)."""
        target = self.agents.open_for(agent, bank, "read")
        warnings: list[str] = []
        if filters is None:
            filters = Filters(now=_now_ms())
        half_lives = agent_state(agent.db, memory_defaults(self.agents.home)).config["half_lives"]
        found = self._search(target.db, query, tags, limit, warnings, include_superseded, filters=filters,
                             half_lives=half_lives)
        counted = self.access.record([(target.db.id, m.key) for m in found], "recall") if count else {}
        view = self.view(target.db)
        memories = [{**m.to_dict(target.name), **view.relations(m, filters.as_known_at),
                     **(counted.get((target.db.id, m.key)) or self.access.get(target.db.id, m.key)).fields()}
                    for m in found]
        if memories:
            message = f"Found {len(memories)} memor{'y' if len(memories) == 1 else 'ies'}"
        else:
            # The query is not echoed: callers grep results, and an echo would "find" it.
            message = f"{NO_MEMORIES} matching the query" if query.strip() else f"{NO_MEMORIES} yet"
            if tags:
                message += " and tags"
            message += "."
        return {"memories": memories, "count": len(memories), "bank": target.name,
                "message": message, "warnings": warnings}

    def _search(self, db: Database, query: str, tags: Sequence[str], limit: int,
                warnings: list[str], include_superseded: bool = False,
                vectors: dict[str, np.ndarray | None] | None = None, with_scores: bool = False,
                filters: Filters | None = None, half_lives: dict[str, float] | None = None):
        """Recall in one database. ``vectors`` caches the query's embedding across the
        databases of one call (auto-recall searches several), so it is computed once.
        ``half_lives``: the agent's age decay per category (empty: none), at ``filters.now``."""
        view = self.view(db)
        vector = None
        if query.strip() and view.has_vectors():
            cache = vectors if vectors is not None else {}
            if query not in cache:
                cache[query] = self._embed(query, warnings, "read")
            vector = cache[query]
        if not half_lives:
            return view.recall(query, tags=tags, limit=limit, query_vector=vector,
                               include_superseded=include_superseded, with_scores=with_scores, filters=filters)
        # Age decay only lowers scores: re-rank the best MAX_LIMIT candidates and keep ``limit``.
        now = filters.now if filters is not None and filters.now is not None else _now_ms()
        hits = view.recall(query, tags=tags, limit=MAX_LIMIT, query_vector=vector,
                           include_superseded=include_superseded, with_scores=True, filters=filters)
        ranked = decayed(hits, lambda m: decay_factor(now - m.ts, half_life(m, half_lives)))[:limit]
        return ranked if with_scores else [m for m, _score in ranked]

    def neighbors(self, agent: Agent, key: str, bank: str | None = None, types: Sequence[str] = (),
                  depth: int = 1, now: int | None = None) -> dict[str, Any]:
        """The memories linked to ``key`` by edges, both ways, across readable banks (node/memory/graph.py)."""
        return neighbors(self, agent, key, bank, types, depth, _now_ms() if now is None else now)

    def list_banks(self, agent: Agent) -> dict[str, Any]:
        own = perm_name(self._perm_on(agent, agent.db.id))
        banks = [{"name": agent.name, "id": agent.db.id, "kind": "self", "permission": own, "self": True}]
        state = agent_state(agent.db)
        seen = {agent.db.id}
        # Refs first (a ref left without auth is still listed, with its real permission) ...
        for db_id, ref in state.refs.items():
            if db_id in seen:
                continue
            seen.add(db_id)
            perm = self._perm_on(agent, db_id)
            name = self.agents.name_of(db_id)
            if name == db_id and ref["name"]:  # not hosted here: the name the ref was given
                name = ref["name"]
            banks.append({"name": name, "id": db_id, "kind": "bank",
                          "permission": perm_name(perm), "self": False})
        # ... then every other database on this node the agent's key opens.
        for db_id in self.agents.home.database_ids():
            if db_id in seen:
                continue
            perm = self._perm_on(agent, db_id)
            if perm is None:
                continue
            seen.add(db_id)
            banks.append({"name": self.agents.name_of(db_id), "id": db_id, "kind": "bank",
                          "permission": perm_name(perm), "self": False})
        return {"banks": banks, "count": len(banks)}

    def _perm_on(self, agent: Agent, db_id: str) -> Permission | None:
        if db_id not in self.agents.home.database_ids():
            return None
        return self.agents.home.database(db_id).permission(str(agent.key.public))

    # ------------------------------------------------------------------ auto-recall
    def auto_recall(self, agent: Agent, messages: Sequence[str], session: str | None = None,
                    context_window: int = DEFAULT_CONTEXT_WINDOW) -> str:
        return self.auto_recall_lines(agent, messages, session, context_window=context_window)[0]

    def auto_recall_lines(self, agent: Agent, messages: Sequence[str], session: str | None = None,
                          count: bool = True, context_window: int = DEFAULT_CONTEXT_WINDOW,
                          ) -> tuple[str, list[dict[str, Any]], int]:
        """The Relevant Memories block, per line of it where it came from: the line's text
        (as in the block), the memory's key, the bank (None: the agent's own memory), the
        database and the score that ranked it there (scores compare within one store only),
        and how many lines did not fit the budget of ``context_window`` (tokens; node/memory/
        framing.py), which the block's closing line counts. ``count``: count the lines shown
        as injections (False for a preview that no model sees); lines left out are not."""
        state = agent_state(agent.db, memory_defaults(self.agents.home))
        if not state.config["auto_recall_enabled"]:
            return "", [], 0
        tokens = autorecall_query_tokens(list(messages)) if messages else []
        if not tokens:
            return "", [], 0
        query = " ".join(tokens)
        limit = int(state.config["max_entries"])
        now = _now_ms()
        warnings: list[str] = []
        lines: list[dict[str, Any]] = []
        vectors: dict[str, np.ndarray | None] = {}
        # Scope precedence (node/memory/scope.py): stores closest first, and a memory key shown
        # from a closer store is not shown again; a store is asked for as many more as it may
        # lose that way, so it still fills its max_entries with other keys.
        shown: set[str] = set()

        def add(db: Database, bank: str | None) -> None:
            hits = self._search(db, query, (), min(limit + len(shown), MAX_LIMIT), warnings,
                                vectors=vectors, with_scores=True, filters=Filters(now=now),
                                half_lives=state.config["half_lives"])
            fresh = [(m, score) for m, score in hits if m.key not in shown][:limit]
            for m, score in fresh:
                lines.append({"text": memory_line(m.key, m.value, bank), "key": m.key, "bank": bank, "db": db.id,
                              "score": score})
            shown.update(m.key for m, _score in fresh)

        add(agent.db, None)
        for db_id in self._recall_banks(agent, state, session):
            try:
                target = self.agents.open_for(agent, db_id, "read")
            except (AuthError, NameError_):
                continue  # banks the agent cannot open (or no longer knows) are skipped silently
            add(target.db, target.name)
        if not lines:
            return "", [], 0
        block = fit([line["text"] for line in lines], budget_chars(context_window))
        shown = lines[:block.shown]
        if count and shown:
            self.access.record([(line["db"], line["key"]) for line in shown], "injection")
        return block.text, shown, block.left_out

    def _recall_banks(self, agent: Agent, state, session: str | None) -> list[str]:
        """The banks auto-recall searches, closest first (node/memory/scope.py)."""
        spec = applied(self.agents.home).agent(agent.name)
        defaults = [rec.db_id for name in (spec.default_memory_banks if spec else [])
                    if (rec := self.agents.home.registry.bank(name)) is not None]
        in_session = state.attached.get(session, []) if session is not None else []
        return by_precedence(self._searched_banks(agent, state, session), in_session, defaults)

    def _searched_banks(self, agent: Agent, state, session: str | None) -> list[str]:
        chosen = state.config.get("auto_recall_banks") or []
        if chosen:
            ids = []
            for ref in chosen:
                try:
                    ids.append(self.agents.resolve(ref).db.id)
                except NameError_:
                    continue  # a bank deleted since it was chosen
            return [i for i in ids if i != agent.db.id]
        ids = list(state.attached.get(None, []))
        if session is not None:
            ids += [i for i in state.attached.get(session, []) if i not in ids]
        return [i for i in ids if i != agent.db.id]

    # ------------------------------------------------------------------ reindex
    def reindex(self, db: Database, key_for: Callable[[Database], Any],
                progress: Callable[[int, int], None] | None = None, batch: int = 256) -> dict[str, Any]:
        """Backfill vectors for the active model; one entry per batch, signed by ``key_for(db)``.

        Batches are large (256 texts, ~400 KB of vectors, well under the 1 MiB payload cap)
        because the local model pads each call's texts to a common length: it sorts a call's
        texts by length, so bigger calls waste less on padding (2x faster than calls of 32).
        """
        if self.embedder is None:
            raise EmbedderError("no embedder is configured; choose one with: memmesh embedder set hashed|local|openai|ollama")
        view = self.view(db)
        missing = view.missing_vectors()
        total, done = len(missing), 0
        key = key_for(db)
        for i in range(0, total, batch):
            chunk = missing[i:i + batch]
            vectors = self.embedder.embed([f"{m.key} {m.value}" for m in chunk])
            txn = db.transaction(key)
            for m, v in zip(chunk, vectors):
                txn.append(self.embedder.store_name, embedding_value(m.row_key, v))
            txn.commit()
            done += len(chunk)
            if progress:
                progress(done, total)
        return {"embedded": done, "store": self.embedder.store_name}


PINNED_TAG = "pinned"


def half_life(m: Any, half_lives: dict[str, float]) -> float | None:
    """The row's half-life in days: by its category, else "*"; None (never decays) for a row
    tagged ``pinned`` or of a category the config does not list when it has no "*"."""
    if PINNED_TAG in m.tags:
        return None
    if m.category is not None and m.category in half_lives:
        return half_lives[m.category]
    return half_lives.get("*")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000

