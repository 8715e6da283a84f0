"""What the memory tools (remember, recall, list_memory_banks) and auto-recall do.

The tool table, with each tool's argument schema, is in node/commands/tools.py; every
transport reaches these methods through it. Results are plain JSON-able dicts. Fallbacks
never error (docs/memory.md): no embedder, no vectors yet, an embedder failing on write (the memory
is stored without a vector, with a warning) or on read (BM25 only, with a warning).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from memmesh.auth.errors import AuthError
from memmesh.auth.permissions import Permission
from memmesh.crdt.clock import now_ms
from memmesh.crdt.database import Database
from memmesh.node.memory.access import AccessCounts
from memmesh.node.memory.agents import Agent, Agents, agent_state
from memmesh.node.memory.dedup import CHOICES, Duplicate, check_choice, find_duplicate
from memmesh.node.memory.defaults import BuiltIn, MemorySettings
from memmesh.node.memory.embedders import Embedder, EmbedderError
from memmesh.node.memory.framing import DEFAULT_CONTEXT_WINDOW, budget_chars, fit, memory_line
from memmesh.node.memory.fusion import decay_factor, decayed, salience_factor
from memmesh.node.memory.graph import neighbors
from memmesh.node.memory.input_error import MemoryInputError
from memmesh.node.memory.labels import Labels, labels_of, tier
from memmesh.node.memory.open_views import KEEP_RECENT, OpenViews, ViewStats
from memmesh.node.memory.rows import MEMORY_STORE, Memory, embedding_value, memory_value
from memmesh.node.memory.saving import plan_write
from memmesh.node.memory.scope import by_precedence
from memmesh.node.memory.snapshot import VIEWS_DIR, Snapshots
from memmesh.node.memory.timeline import Filters
from memmesh.node.memory.tokens import autorecall_query_tokens
from memmesh.node.memory.view import DEFAULT_LIMIT, MAX_LIMIT, MAX_PAGE_DEPTH, MemoryView
from memmesh.node.registry import NameError_

log = logging.getLogger(__name__)

NO_MEMORIES = "No memories found"
OWN_MEMORY = "own memory"  # how a missed deadline names the agent's own database
SEARCH_THREADS = 4
WARM_LIMIT = 32  # databases built at serve's start at most (first_turn_ids)


@dataclass(frozen=True, slots=True)
class Found:
    """A recall hit: the memory, the score that ranked it (times its trust weight and age
    decay), its trust tier for the reading agent, and its labels."""

    memory: Any
    score: float
    trust: str
    labels: Labels

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"trust": self.trust}
        if self.labels.flag is not None:
            out["flagged"] = self.labels.flag
        if self.labels.secret is not None:
            out["secret"] = self.labels.secret
        return out


@dataclass(frozen=True)
class Ranking:
    """How one agent's recall ranks and filters (from its memory config)."""

    reader: str | None = None  # the agent's public key: its rows are "owner"
    weights: dict[str, float] | None = None  # None: every tier weighs 1
    half_lives: dict[str, float] | None = None
    include_secrets: bool = True
    hide_flagged: bool = False
    min_similarity: float | None = None  # None: the embedder's calibrated floor (node/memory/relevance.py)

    @classmethod
    def of(cls, agent: Agent, config: dict[str, Any], *, auto: bool = False) -> Ranking:
        """``auto``: for auto-recall, which never shows flagged rows or secrets."""
        return cls(str(agent.key.public), dict(config["trust_weights"]), dict(config["half_lives"]),
                   include_secrets=False if auto else bool(config["include_secrets"]), hide_flagged=auto,
                   min_similarity=config.get("min_similarity"))


def perm_name(perm: Permission | None) -> str:
    return "none" if perm is None else perm.level


def _not_serving() -> bool:
    return False


class MemoryService:
    def __init__(self, agents: Agents, embedder: Embedder | None, *, settings: MemorySettings | None = None,
                 serving: Callable[[], bool] = _not_serving, keep_recent: int = KEEP_RECENT) -> None:
        """``settings``: the node's config in force (built-in defaults when None); ``serving``:
        whether serve runs this node now (asked when a view opens); ``keep_recent``: how many
        of the most recently used views stay open whatever the budget (node/memory/open_views.py)."""
        self.agents = agents
        self.embedder = embedder
        self.settings: MemorySettings = settings if settings is not None else BuiltIn()
        self._serving = serving
        # Open views, least recently used first, closed over the memory budget when idle
        # (node/memory/open_views.py): a search submitted for a view keeps it open.
        self._views = OpenViews(self._budget, busy=self._busy, keep_recent=keep_recent)
        # Built views are kept on disk (node/memory/snapshot.py), so the next opening of the
        # node reads them instead of rebuilding them from the log.
        self.snapshots = Snapshots(agents.home.home / VIEWS_DIR)
        self.access = AccessCounts(agents.home.storage)
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: dict[str, Future] = {}  # db id -> its auto-recall search (or start-up build) still running

    @property
    def serving(self) -> bool:
        """Under serve, an index is built on a search thread, never on the database thread."""
        return self._serving()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self.save_snapshots()
        self._views.close_all()

    def save_snapshots(self) -> int:
        """Write the snapshot of every open view that is due one (large enough, and none on
        disk that holds nearly all of it); how many were written. A view a search holds is
        left for the next round; a write that fails (disk full) is logged, never raised: the
        view itself is intact and the next opening rebuilds from the log."""
        written = 0
        for view in list(self._views.values()):
            if not view.snapshot_due:
                continue
            try:
                written += view.save_snapshot()
            except OSError as exc:
                log.warning("could not write the view snapshot of %s (%s); the next opening rebuilds it "
                            "from the log", view.db.id, exc)
        return written

    def _threads(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(SEARCH_THREADS, thread_name_prefix="memmesh-recall")
        return self._pool

    def warm(self, db_ids: Sequence[str] | None = None) -> None:
        """Build these databases' indexes (None: ``first_turn_ids()``) and load the embedder's
        model on the search threads (serve, at start), so a first turn's deadline pays for
        neither. Every other bank's index is built on its first use."""
        if self.embedder is not None:
            self._threads().submit(self._load_embedder)
        for db_id in self.first_turn_ids() if db_ids is None else db_ids:
            view = self.view(self.agents.home.database(db_id))
            if not view.loaded:
                self._inflight[db_id] = self._threads().submit(self._build, db_id, view)

    def first_turn_ids(self, limit: int = WARM_LIMIT) -> list[str]:
        """What an agent's first turn searches, at most ``limit`` databases: every agent's own
        database, then the banks each auto-recalls in every session (attached, then its default
        banks from config.yaml), agent by agent. Nothing else is read: a node of a thousand
        banks starts as fast as one of ten."""
        home = self.agents.home
        hosted = set(home.database_ids())
        records = self.agents.agents()
        out = [r.db_id for r in records if r.db_id in hosted][:limit]
        for rec in records:
            if len(out) >= limit:
                break
            if rec.db_id not in hosted:
                continue
            state = agent_state(home.database(rec.db_id))
            banks = list(state.attached.get(None, []))
            banks += [b.db_id for name in self.settings.default_banks(rec.name)
                      if (b := home.registry.bank(name)) is not None]
            for db_id in banks:
                if db_id in hosted and db_id not in out and len(out) < limit:
                    out.append(db_id)
        return out

    def _build(self, db_id: str, view: MemoryView) -> None:
        """Build ``view`` (a search thread) and record its size for the budget."""
        view.load()
        self._views.measure(db_id, view)

    # ------------------------------------------------------------------ views
    def view(self, db: Database) -> MemoryView:
        """The database's view, opened on first use (built now, or under serve on its first
        search); opening one may close the least recently used idle views over the memory
        budget (node/memory/open_views.py)."""
        view = self._views.use(db.id)
        if view is None or view.db is not db:
            store, dim = None, None
            if self.embedder is not None:
                store = self.embedder.store_name
                # Only a size known without a network call: a view must open even when a
                # remote embedder is down.
                dim = self.embedder.known_dim if hasattr(self.embedder, "known_dim") else self.embedder.dim
            view = MemoryView(db, embedding_store=store, dim=dim, lazy=self.serving, snapshots=self.snapshots)
            self._views.add(db.id, view)
        return view

    def open_view(self, db_id: str) -> MemoryView | None:
        """The database's view if it is open and built, else None: never opens or builds one,
        and is not counted as a use (status reads counts through it)."""
        view = self._views.peek(db_id)
        return view if view is not None and view.loaded else None

    def view_stats(self) -> ViewStats:
        """How many views are open, their estimated bytes and the budget (status)."""
        return self._views.stats()

    def open_view_ids(self) -> list[str]:
        """The databases whose view is open, least recently used first."""
        return self._views.ids()

    def _budget(self) -> int:
        return self.settings.view_budget_bytes()

    def _busy(self, db_id: str) -> bool:
        running = self._inflight.get(db_id)
        return running is not None and not running.done()

    def _load_embedder(self) -> None:
        assert self.embedder is not None
        try:
            self.embedder.load()
        except EmbedderError as exc:  # said again, with what it means, at the first embed
            log.warning("embedder %s/%s could not load: %s", self.embedder.provider, self.embedder.model, exc)

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
                 now: int | None = None, on_duplicate: str | None = None, **fields: Any) -> dict[str, Any]:
        """``fields``: the optional row fields (node/memory/rows.py); dedup, merge and
        supersession as node/memory/saving.py decides. ``now`` (ms): the caller's clock.

        A new key whose memory a current memory of the bank already states (the same text, or
        similar by the embedder's threshold: node/memory/dedup.py) writes nothing and answers
        with that memory (``ok`` false, ``duplicate``), unless ``on_duplicate`` chooses:
        ``merge`` (write into that key, by the rules above), ``supersede`` (write the new key,
        retiring that one) or ``create`` (write it anyway)."""
        tags = tags if tags is not None else ()
        memory_value(key, value, tags, **fields)  # bad input fails first
        choice = check_choice(on_duplicate)
        target = self.agents.open_for(agent, bank, "write")
        view = self.view(target.db)
        now = now_ms() if now is None else now
        plan = plan_write(view, key, value, tags, supersedes=supersedes, now=now, **fields)
        prepared: tuple[Labels, np.ndarray | None, list[str]] | None = None
        duplicate = None
        if plan.row is not None and plan.current is None and choice != "create":  # a key new to the bank
            prepared = self._prepare(plan.row)
            skip = {plan.row["key"], *(s["key"] for s in plan.superseded)}
            duplicate = find_duplicate(view, plan.row["value"], prepared[1], now=now, skip=skip)
            if duplicate is not None:
                if choice is None:
                    return self._duplicate_answer(plan.row["key"], target.name, duplicate, prepared[2])
                if choice == "merge":
                    plan = plan_write(view, duplicate.memory.key, value, tags, supersedes=supersedes, now=now,
                                      **fields)
                    prepared = None  # another key: another text to embed
                else:  # supersede: the same row, retiring the duplicate too
                    plan = plan_write(view, key, value, tags, supersedes=[*supersedes, duplicate.memory.key],
                                      now=now, **fields)
        about = {"duplicate_of": duplicate.to_dict(), "on_duplicate": choice} if duplicate is not None else {}
        if plan.row is None:
            current = plan.current
            assert current is not None  # nothing to write: the current row says the same
            return {"ok": True, "key": current.key, "bank": target.name, "entry": current.entry_id,
                    "embedded": False, "warnings": [], "deduplicated": True, "merged_into": current.key, **about}
        row = plan.row
        labels, vector, warnings = prepared if prepared is not None else self._prepare(row)
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
            **({"flagged": labels.flag} if labels.flag is not None else {}),
            **({"secret": labels.secret} if labels.secret is not None else {}),
            **({"merged": True} if plan.merged else {}),
            **({"supersedes": plan.superseded} if plan.superseded else {}),
            **about,
        }

    def _prepare(self, row: dict[str, Any]) -> tuple[Labels, np.ndarray | None, list[str]]:
        """A row's labels, its vector (None for a secret, or when the embedder fails or there is
        none) and the warnings to give with it."""
        warnings: list[str] = []
        labels = labels_of(row["key"], row["value"], row["tags"], row.get("source"))
        if labels.secret is not None:
            what = "is tagged contains-secrets" if labels.secret == "tagged" else f"holds a credential ({labels.secret})"
            warnings.append(f"this memory {what}: stored without a vector; never auto-recalled, and recall returns "
                            "it only to an agent whose config sets include_secrets")
            vector = None
        else:
            vector = self._embed(f"{row['key']} {row['value']}", warnings, "write")
        if labels.flag is not None:
            warnings.append(f"this memory reads like an instruction to the assistant (rule {labels.flag}): stored and "
                            "flagged; never auto-recalled, and recall shows it with the flag")
        return labels, vector, warnings

    @staticmethod
    def _duplicate_answer(key: str, bank: str, dup: Duplicate, warnings: list[str]) -> dict[str, Any]:
        """Nothing written: the memory that already says it, and how to choose."""
        have = dup.memory.key
        how = "the same text" if dup.why == "same text" else f"similar, cosine {dup.similarity:.2f}"
        message = (f"not saved: {bank} already has this as {have!r} ({how}); to save it give on_duplicate: "
                   f"merge (write into {have!r}), supersede (save {key!r} and retire {have!r}) or create (keep both)")
        return {"ok": False, "key": key, "bank": bank, "entry": dup.memory.entry_id, "embedded": False,
                "warnings": [w.replace("; stored without a vector", "; only the same text was compared")
                             for w in warnings if not w.startswith("this memory ")], "duplicate": dup.to_dict(),
                "choices": list(CHOICES), "message": message}

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
        offset: int = 0,
    ) -> dict[str, Any]:
        """Arguments are checked by the recall tool's model and again by the view. ``count``:
        count this recall in the access counts of the memories it returns (node/memory/access.py).
        ``offset``: skip that many of the ranking first (a page: offset + limit <= MAX_PAGE_DEPTH)."""
        if offset < 0 or offset + limit > MAX_PAGE_DEPTH:
            raise MemoryInputError(f"offset + limit must be at most {MAX_PAGE_DEPTH}, got {offset} + {limit}")
        target = self.agents.open_for(agent, bank, "read")
        warnings: list[str] = []
        if filters is None:
            filters = Filters(now=now_ms())
        ranking = Ranking.of(agent, agent_state(agent.db, self.settings.defaults()).config)
        found = self._search(target.db, query, tags, offset + limit, warnings, include_superseded, filters=filters,
                             ranking=ranking)[offset:]
        counted = self.access.record([(target.db.id, f.memory.key) for f in found], "recall") if count else {}
        view = self.view(target.db)
        memories = [self._element(view, target, f, filters.as_known_at, counted.get((target.db.id, f.memory.key)))
                    for f in found]
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

    def get(self, agent: Agent, key: str, bank: str | None = None,
            now: int | None = None) -> tuple[str, dict[str, Any] | None]:
        """The bank's name and its current memory ``key`` (the agent's own database when bank is
        None) as recall shows one memory, or None when recall would not show it: no row of the key, forgotten,
        retired (by a supersedes edge, or by its valid_to at ``now``), quarantined, a secret the
        agent's config withholds, or a trust tier the agent weighs 0. AuthError when the agent
        may not read the bank, as for recall. Read through the view's per-key index (not a
        search: a bank of any size), and not counted as an access: nothing was recalled."""
        target = self.agents.open_for(agent, bank, "read")
        ranking = Ranking.of(agent, agent_state(agent.db, self.settings.defaults()).config)
        view = self.view(target.db)
        m = view.shown(key, now=now_ms() if now is None else now, include_secrets=ranking.include_secrets)
        if m is None:
            return target.name, None
        found = self._found(view, m, 0.0, ranking)
        if self._weight(found, ranking) <= 0:
            return target.name, None  # a weight of 0: recall never returns it
        return target.name, self._element(view, target, found)

    def _element(self, view: MemoryView, target: Any, f: Found, as_known_at: Any = None,
                 counted: Any = None) -> dict[str, Any]:
        """One memory as recall answers it: the row, its tier and labels, its relations, its
        access counts (``counted``: this recall's, already recorded)."""
        access = counted or self.access.get(target.db.id, f.memory.key)
        return {**f.memory.to_dict(target.name), **f.fields(), **view.relations(f.memory, as_known_at),
                **access.fields()}

    @staticmethod
    def _weight(f: Found, ranking: Ranking) -> float:
        """The row's trust weight times its importance and confidence (0: never recalled)."""
        m = f.memory
        return (ranking.weights or {}).get(f.trust, 1.0) * salience_factor(m.importance, m.confidence)

    def _search(self, db: Database, query: str, tags: Sequence[str], limit: int,
                warnings: list[str], include_superseded: bool = False,
                filters: Filters | None = None, ranking: Ranking = Ranking()) -> list[Found]:
        """Recall in one database, best first."""
        view = self.view(db)
        vector = None
        if query.strip() and view.has_vectors():
            vector = self._embed(query, warnings, "read")
        return self._ranked(view, query, tags, limit, vector, include_superseded, filters, ranking)

    def _ranked(self, view: MemoryView, query: str, tags: Sequence[str], limit: int,
                vector: np.ndarray | None, include_superseded: bool, filters: Filters | None,
                ranking: Ranking) -> list[Found]:
        """The view's ranking times each row's trust weight and age decay (docs/memory.md, "Trust
        tiers", "Age decay") and its importance and confidence ("Importance and confidence"). They
        re-rank the view's best MAX_LIMIT candidates (a bounded factor moves a row past close
        matches, not past the hundred best); when every candidate would weigh 1 the view's own
        ranking is the answer."""
        def scored(n: int) -> list[tuple[Memory, float]]:
            hits = view.recall(query, tags=tags, limit=n, query_vector=vector, include_superseded=include_superseded,
                               with_scores=True, filters=filters, include_secrets=ranking.include_secrets,
                               hide_flagged=ranking.hide_flagged, min_similarity=ranking.min_similarity)
            return cast("list[tuple[Memory, float]]", hits)  # with_scores: (memory, score) pairs

        if not self._reweighs(view, ranking):
            return [self._found(view, m, score, ranking) for m, score in scored(limit)]
        now = filters.now if filters is not None and filters.now is not None else now_ms()
        half_lives = ranking.half_lives or {}

        def factor(f: Found) -> float:
            weight = self._weight(f, ranking)
            m = f.memory
            return weight * decay_factor(now - m.ts, half_life(m, half_lives)) if half_lives else weight

        def reweighed(pool: int) -> list[Found]:
            found = [self._found(view, m, score, ranking) for m, score in scored(pool)]
            return [Found(f.memory, score, f.trust, f.labels)
                    for f, score in decayed([(f, f.score) for f in found], factor)
                    if factor(f) > 0]  # a weight of 0: never recalled

        best = reweighed(MAX_LIMIT)[:limit]
        if limit <= MAX_LIMIT:
            return best
        # A page past the first hundred: the hundred best as above, then the rest of the view's
        # best MAX_PAGE_DEPTH re-weighed, so that pages put together are one ranking (each row
        # once) whatever page size walks it.
        shown = {f.memory.row_key for f in best}
        rest = [f for f in reweighed(MAX_PAGE_DEPTH) if f.memory.row_key not in shown]
        return (best + rest)[:limit]

    @staticmethod
    def _found(view: MemoryView, m: Any, score: float, ranking: Ranking) -> Found:
        labels, quarantined = view.labels(m)
        return Found(m, score, tier(m.author, labels, ranking.reader, quarantined), labels)

    @staticmethod
    def _reweighs(view: MemoryView, ranking: Ranking) -> bool:
        if ranking.half_lives or view.has_scores():
            return True
        w = ranking.weights
        if not w:
            return False
        if w.get("owner", 1.0) != 1.0 or w.get("peer", 1.0) != 1.0:
            return True
        present = view.weighted_tiers_present()
        return (present["ingested"] and w.get("ingested", 1.0) != 1.0) or (
            present["derived"] and w.get("derived", 1.0) != 1.0) or (
            present["flagged"] and not ranking.hide_flagged and w.get("flagged", 1.0) != 1.0)

    def neighbors(self, agent: Agent, key: str | None, bank: str | None = None, types: Sequence[str] = (),
                  depth: int = 1, now: int | None = None, entity: str | None = None) -> dict[str, Any]:
        """The memories linked to ``key`` (or about ``entity``) by edges, both ways, across
        readable banks (node/memory/graph.py)."""
        return neighbors(self, agent, key, bank, types, depth, now_ms() if now is None else now, entity)

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
    def auto_recall_result(self, agent: Agent, messages: Sequence[str], session: str | None = None,
                           count: bool = True, context_window: int = DEFAULT_CONTEXT_WINDOW,
                           now: int | None = None) -> tuple[str, list[dict[str, Any]], int, list[str]]:
        """The Relevant Memories block, per line of it where it came from: the line's text
        (as in the block), the memory's key, the bank (None: the agent's own memory), the
        database, the score that ranked it there (scores compare within one store only) and
        its trust tier, and how many lines did not fit the budget of ``context_window``
        (tokens; node/memory/framing.py), which the block's closing line counts. ``count``:
        count the lines shown as injections (False for a preview that no model sees); lines
        left out are not. ``now`` (ms): the caller's clock, for age decay and expired facts.

        The stores are searched at once on the search threads, and the call waits for them
        until the agent's ``auto_recall_deadline_ms``; a store still searching then is named in
        the block as not searched this turn (its search finishes in the background, so its
        index is ready next time), never waited for, and listed last in the result (the names
        of the stores that missed the deadline). Flagged rows and secrets are never shown."""
        start = time.monotonic()  # the deadline covers the whole call, reading the config included
        state = agent_state(agent.db, self.settings.defaults())
        deadline_ms = int(state.config["auto_recall_deadline_ms"])
        if not state.config["auto_recall_enabled"] or deadline_ms == 0:
            return "", [], 0, []
        tokens = autorecall_query_tokens(list(messages)) if messages else []
        if not tokens:
            return "", [], 0, []
        query = " ".join(tokens)
        limit = int(state.config["max_entries"])
        now = now_ms() if now is None else now
        ranking = Ranking.of(agent, state.config, auto=True)
        warnings: list[str] = []
        stores: list[tuple[Database, str | None]] = [(agent.db, None)]
        for db_id in self._recall_banks(agent, state, session):
            try:
                target = self.agents.open_for(agent, db_id, "read")
            except (AuthError, NameError_):
                continue  # banks the agent cannot open (or no longer knows) are skipped silently
            stores.append((target.db, target.name))
        found, missed = self._search_all(stores, query, limit, ranking, Filters(now=now), start + deadline_ms / 1000,
                                         deadline_ms / 1000, warnings)
        # Scope precedence (node/memory/scope.py): stores closest first, and a memory key shown
        # from a closer store is not shown again; a store was asked for as many more as it may
        # lose that way (limit per closer store), so it still fills its max_entries.
        lines: list[dict[str, Any]] = []
        shown_keys: set[str] = set()
        for (db, bank), hits in zip(stores, found):
            fresh = [f for f in hits if f.memory.key not in shown_keys][:limit]
            lines += [{"text": memory_line(f.memory.key, f.memory.value, bank), "key": f.memory.key,
                       "bank": bank, "db": db.id, "score": f.score, "trust": f.trust} for f in fresh]
            shown_keys.update(f.memory.key for f in fresh)
        missing = [agent.name + " (" + OWN_MEMORY + ")" if bank is None else bank
                   for (db, bank), miss in zip(stores, missed) if miss]
        if not lines and not missing:
            return "", [], 0, []
        block = fit([line["text"] for line in lines], budget_chars(context_window), missing=missing)
        shown = lines[:block.shown]
        if count and shown:
            self.access.record([(line["db"], line["key"]) for line in shown], "injection")
        return block.text, shown, block.left_out, missing

    def _search_all(self, stores: Sequence[tuple[Database, str | None]], query: str, limit: int,
                    ranking: Ranking, filters: Filters, until: float, deadline_s: float,
                    warnings: list[str]) -> tuple[list[list[Found]], list[bool]]:
        """Each store's hits (empty for a store that missed), and which missed the deadline
        (``until``, monotonic seconds; ``deadline_s`` for a one-shot process, see below)."""
        views = [self.view(db) for db, _bank in stores]
        pool = self._threads()
        vector: Future | None = None
        if not self.serving:
            # A one-shot process has nothing to do but this call: its indexes are built and its
            # embedder's model loaded first, the query embedded, and the deadline is for the
            # searches (loading a model or building an index never counts against it).
            for view in views:
                if not view.loaded:
                    view.load()
            if self.embedder is not None and any(v.has_vectors() for v in views):
                vector = Future()
                vector.set_result(self._embed(query, warnings, "read"))
            until = time.monotonic() + deadline_s
        elif self.embedder is not None and any(v.loaded and v.has_vectors() for v in views):
            vector = pool.submit(self._embed, query, warnings, "read")
        futures: list[Future | None] = []
        for i, ((db, _bank), view) in enumerate(zip(stores, views)):
            running = self._inflight.get(db.id)
            if running is not None and not running.done():
                futures.append(None)  # still busy since an earlier turn: not asked again
                continue
            n = min(limit * (i + 1), MAX_LIMIT)
            fut = pool.submit(self._store_search, view, query, n, vector, until, filters, ranking)
            self._inflight[db.id] = fut
            futures.append(fut)
        found: list[list[Found]] = []
        missed: list[bool] = []
        for asked in futures:
            hits = None
            if asked is not None:
                try:
                    hits = asked.result(timeout=max(0.0, until - time.monotonic()))
                except FutureTimeout:
                    hits = None
            found.append(hits or [])
            missed.append(hits is None)
        return found, missed

    def _store_search(self, view: MemoryView, query: str, n: int, vector: Future | None, until: float,
                      filters: Filters, ranking: Ranking) -> list[Found] | None:
        """One store's auto-recall search on a search thread; None if it could not start in
        time (another call holds the view). Once started it runs to the end, so a late store's
        index is built for the next turn."""
        with view.held(until - time.monotonic()) as got:
            if not got:
                return None
            qv = None
            if vector is not None and view.has_vectors():
                try:
                    qv = vector.result(timeout=max(0.0, until - time.monotonic()))
                except FutureTimeout:
                    qv = None  # the embedder is slower than the deadline: BM25 only this turn
            return self._ranked(view, query, (), n, qv, False, filters, ranking)

    def _recall_banks(self, agent: Agent, state, session: str | None) -> list[str]:
        """The banks auto-recall searches, closest first (node/memory/scope.py)."""
        defaults = [rec.db_id for name in self.settings.default_banks(agent.name)
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
