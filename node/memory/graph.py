"""The neighbors tool: the memories linked to one memory by typed edges, in both directions.

Rules (docs/memory.md, "Neighbors"):

* **A node of the graph** is a memory key in one database, ``(db id, key)``; what it holds is
  the key's current row (newest in T order, not retired, its ``valid_to`` not passed at the
  caller's clock). Only current rows' edges are links: a superseded row's edges are history.
* **Edge targets.** An edge's ``to`` is ``BANK:KEY`` when the text before its first colon
  names a bank on this node (a bank name, an agent name, or a database id, whose own colon is
  part of it), else a key in the edge's own bank. So a key that contains a colon stays a
  same-bank key unless its prefix is the name of a bank here.
* **Links in both directions.** From a node, its own row's edges (``outgoing``) and the current
  rows of every readable database whose edges resolve to it (``backlink``). ``supersedes``
  edges are not links (they are what recall's ``supersedes`` / ``superseded_by`` show).
  Backlinks come from each view's backlink index (:mod:`node.memory.backlinks`, kept up to date
  by every row that arrives), so a call costs the links it meets, not the rows of the banks.
* **Reach.** The agent's own database and every database of this node whose AuthSettings give
  the agent's key Read. An edge into any other database is listed under ``unreachable`` and
  never followed: that database is not read at all, so nothing about its content (not even
  whether the key exists) leaks. Backlinks come only from readable databases.
* **Hidden rows.** A row an active quarantine covers is not a node, and neither is a row
  holding a secret unless the agent's config sets ``include_secrets`` (as for recall): a
  hidden row is "missing" where a link names it, and its links are not followed.
* **Depth** d (1-3): every memory at most d links away, each at its shortest distance, with
  the links that reach it from the memories one step closer. Deterministic order: depth, then
  bank name, then key; links and the other lists sorted likewise, so the same entries give the
  same answer on every replica (bank names are this node's).

Nothing here writes: a neighbors call changes no database and counts no access.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memmesh.auth.permissions import holds
from memmesh.crdt.database import Database
from memmesh.node.memory.agents import agent_state
from memmesh.node.memory.backlinks import split_target
from memmesh.node.memory.rows import SUPERSEDES, Memory
from memmesh.node.memory.timeline import Filters
from memmesh.node.registry import NameError_, UnknownName

if TYPE_CHECKING:
    from memmesh.node.memory.agents import Agent
    from memmesh.node.memory.service import MemoryService

__all__ = ["MAX_DEPTH", "MAX_NEIGHBORS", "NoSuchMemory", "Ref", "neighbors", "split_target"]

MAX_DEPTH = 3
# A dense graph at depth 3 can reach most of a bank; an agent needs the nearest, not all.
MAX_NEIGHBORS = 200


class NoSuchMemory(UnknownName):
    """The memory a neighbors call starts from has no current row in that bank."""


@dataclass(frozen=True, order=True, slots=True)
class Ref:
    """A node of the graph: a memory key in one database."""

    db: str
    key: str


@dataclass(frozen=True, slots=True)
class Link:
    type: str
    source: Ref  # the memory whose row holds the edge
    target: Ref


@dataclass
class _Found:
    memory: Memory
    depth: int
    links: set[tuple[str, str, str, str]] = field(default_factory=set)  # (via bank, via key, direction, type)


class _Graph:
    """One call's view of the graph: readable databases, their current rows, the backlinks."""

    def __init__(self, service: MemoryService, agent: Agent, now: int, names: dict[str, str],
                 include_secrets: bool) -> None:
        self._service = service
        self._agents = service.agents
        by_time = Filters(now=now).keep
        self._keep_in = lambda db, m: by_time(m) and service.view(db).visible(m, include_secrets=include_secrets)
        self._resolved: dict[str, str | None] = {}
        self._names: dict[str, str] = {agent.db.id: agent.name, **names}
        self._readable: dict[str, Database] = {agent.db.id: agent.db}
        public = str(agent.key.public)
        home = self._agents.home
        hosted = set(home.database_ids())
        self._hosted = hosted
        for db_id in sorted(hosted - {agent.db.id}):
            db = home.database(db_id)
            if holds(db.permission(public), "read"):
                self._readable[db_id] = db
        self._backlinks: dict[Ref, list[Link]] = {}

    def name(self, db_id: str) -> str:
        if db_id not in self._names:
            self._names[db_id] = self._agents.name_of(db_id)
        return self._names[db_id]

    def readable(self, db_id: str) -> bool:
        return db_id in self._readable

    def hosted(self, db_id: str) -> bool:
        return db_id in self._hosted

    def current(self, ref: Ref) -> Memory | None:
        db = self._readable[ref.db]
        m = self._service.view(db).current(ref.key)
        return m if m is not None and self._keep_in(db, m) else None

    def _resolve(self, bank: str) -> str | None:
        if bank not in self._resolved:
            try:
                self._resolved[bank] = self._agents.resolve(bank).db.id
            except NameError_:
                self._resolved[bank] = None
        return self._resolved[bank]

    def links_of(self, db_id: str, m: Memory) -> list[Link]:
        """The links a current row holds (its edges, ``supersedes`` left out)."""
        source = Ref(db_id, m.key)
        out = []
        for edge in m.edges:
            if edge.type == SUPERSEDES:
                continue
            db, key = split_target(edge.to, self._resolve)
            out.append(Link(edge.type, source, Ref(db_id if db is None else db, key)))
        return out

    def backlinks(self, ref: Ref) -> list[Link]:
        """The links of current rows, in every readable database, that point at ``ref``: each
        view's backlink index gives the rows whose edges may name the key (O(links), not
        O(rows)); resolving their targets keeps those that name this bank's key."""
        if ref not in self._backlinks:
            out = []
            for db_id, db in self._readable.items():
                for m in self._service.view(db).linking_to(ref.key):
                    if self._keep_in(db, m):
                        out += [link for link in self.links_of(db_id, m) if link.target == ref]
            self._backlinks[ref] = out
        return self._backlinks[ref]


def neighbors(service: MemoryService, agent: Agent, key: str | None, bank: str | None,
              types: Sequence[str], depth: int, now: int, entity: str | None = None) -> dict[str, Any]:
    """The neighbors tool's result (arguments already checked by its model); ``now``: the
    caller's clock in ms, which only hides facts whose ``valid_to`` has passed. From ``entity``
    instead of a key: the bank's current memories about it are at depth 1 (linked to the
    entity by ``about``), and their links are followed from there."""
    target = service.agents.open_for(agent, bank, "read")  # AuthError when the agent may not read it
    config = agent_state(agent.db, service.settings.defaults()).config
    graph = _Graph(service, agent, now, {target.db.id: target.name}, bool(config["include_secrets"]))
    wanted = set(types)
    found: dict[Ref, _Found] = {}
    unreachable: set[tuple[str, str, str, str, str, str]] = set()
    missing: set[tuple[str, str, str, str, str]] = set()
    if entity is not None:
        about = [Ref(target.db.id, m.key) for m in service.view(target.db).about(entity)]
        frontier = sorted({ref for ref in about if graph.current(ref) is not None})
        if not frontier:
            raise NoSuchMemory(f"no current memory about {entity!r} in bank {target.name}; "
                               "memory entities lists the entities there")
        seen: dict[Ref, int] = dict.fromkeys(frontier, 1)
        for ref in frontier:
            m = graph.current(ref)
            assert m is not None  # the frontier holds current memories only
            found[ref] = _Found(m, 1, {(target.name, entity, "about", "entity")})
        first = 2
    else:
        assert key is not None  # the model requires a key or an entity
        start = Ref(target.db.id, key)
        if graph.current(start) is None:
            raise NoSuchMemory(f"no current memory {key!r} in bank {target.name}; recall lists the memories there")
        seen = {start: 0}
        frontier = [start]
        first = 1
    for d in range(first, depth + 1):
        reached: list[Ref] = []
        for node in sorted(frontier):
            memory = graph.current(node)
            assert memory is not None  # only current memories enter the frontier
            via = (graph.name(node.db), node.key)
            steps = [(link.target, "outgoing", link) for link in graph.links_of(node.db, memory)]
            steps += [(link.source, "backlink", link) for link in graph.backlinks(node)]
            for other, direction, link in steps:
                if wanted and link.type not in wanted:
                    continue
                if other == node:
                    continue  # a memory linking to itself
                if not graph.readable(other.db):
                    reason = "no read permission" if graph.hosted(other.db) else "not on this node"
                    unreachable.add((*via, link.type, graph.name(other.db), other.key, reason))
                    continue
                if seen.get(other, d) < d:
                    continue  # already closer
                m = graph.current(other)
                if m is None:
                    missing.add((*via, link.type, graph.name(other.db), other.key))
                    continue
                if other not in seen:
                    seen[other] = d
                    found[other] = _Found(m, d)
                    reached.append(other)
                found[other].links.add((*via, direction, link.type))
        frontier = reached
        if not frontier:
            break
    ordered = sorted(found.items(), key=lambda item: (item[1].depth, graph.name(item[0].db), item[0].key))
    warnings = []
    if len(ordered) > MAX_NEIGHBORS:
        warnings.append(f"{len(ordered)} memories are linked; the nearest {MAX_NEIGHBORS} are listed "
                        "(ask with a smaller depth or fewer types)")
    out = []
    for ref, f in ordered[:MAX_NEIGHBORS]:
        links = [{"type": t, "direction": direction, "key": k, "bank": b}
                 for b, k, direction, t in sorted(f.links)]
        out.append({**f.memory.to_dict(graph.name(ref.db)), "depth": f.depth, "links": links})
    n = len(out)
    message = (f"Found {n} linked memor{'y' if n == 1 else 'ies'}" if n else "No linked memories found") + "."
    return {
        "key": key,
        **({"entity": entity} if entity is not None else {}),
        "bank": target.name,
        "depth": depth,
        "neighbors": out,
        "count": n,
        "unreachable": [{"from": {"key": k, "bank": b}, "type": t, "bank": tb, "key": tk, "reason": r}
                        for b, k, t, tb, tk, r in sorted(unreachable)],
        "missing": [{"from": {"key": k, "bank": b}, "type": t, "bank": tb, "key": tk}
                    for b, k, t, tb, tk in sorted(missing)],
        "truncated": len(ordered) > MAX_NEIGHBORS,
        "message": message,
        "warnings": warnings,
    }
