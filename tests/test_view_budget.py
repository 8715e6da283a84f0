"""The memory budget of open views (node/memory/open_views.py, docs/operations.md "Memory budget"):
views past the budget are closed when idle and reopened on their next use with the same
answers; a view a search holds is never closed under it; status builds no view; the
``memory.view_budget_mib`` key of config.yaml sets the budget.
"""
from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from memmesh.node import Node
from memmesh.node.config_apply import reload_config
from memmesh.node.memory.embedders import EmbedderConfig
from memmesh.node.memory.open_views import DEFAULT_SHARE, PY_BYTES_PER_ROW, physical_bytes
from memmesh.node.memory.service import MemoryService
from memmesh.node.settings import CONFIG_FILE

BANKS = 12
WORDS = ("deploy", "server", "cache", "index", "garden", "river", "coffee", "invoice", "ticket", "train")


class Budget:
    """Memory settings (node/memory/defaults.py) with the built-in config and a fixed budget."""

    def __init__(self, budget: int) -> None:
        self.budget = budget

    def defaults(self) -> dict:
        from memmesh.node.memory.agent_config import CONFIG_DEFAULTS

        return dict(CONFIG_DEFAULTS)

    def default_banks(self, agent: str) -> list[str]:
        return []

    def view_budget_bytes(self) -> int:
        return self.budget


def _text(rnd: random.Random, n: int = 6) -> str:
    return " ".join(rnd.choice(WORDS) for _ in range(n))


@pytest.fixture
def node(tmp_path: Path):
    n = Node.open(tmp_path / "home")
    n.set_embedder_config(EmbedderConfig("hashed"))
    n.agents.create_agent("alpha")
    rnd = random.Random(3)
    for i in range(BANKS):
        n.run("memory.new", {"name": f"b{i}"})
        n.run("memory.grant", {"bank": f"b{i}", "agent": "alpha", "perm": "write"})
        for j in range(15):
            n.call_tool("alpha", "remember", {"key": f"b{i}-k{j}", "value": _text(rnd), "bank": f"b{i}",
                                              "on_duplicate": "create"})
    yield n
    n.close()


def _answer(service: MemoryService, node: Node, bank: str, query: str) -> list[tuple]:
    agent = node.agents.agent("alpha")
    got = service.recall(agent, query, bank=bank, limit=10, count=False)
    return [(m["key"], m["value"], m["bank"], m["trust"]) for m in got["memories"]]


def test_views_over_a_tiny_budget_close_and_reopen_with_the_same_answers(node):
    """A service whose budget holds no view against one that keeps every view: after each
    operation of a seeded walk (recalls and remembers over the banks), the same answers."""
    tiny = MemoryService(node.agents, node.memory.embedder, settings=Budget(1), keep_recent=2)
    roomy = MemoryService(node.agents, node.memory.embedder, settings=Budget(1 << 40))
    agent = node.agents.agent("alpha")
    rnd = random.Random(11)
    try:
        for step in range(150):
            bank = f"b{rnd.randrange(BANKS)}"
            if rnd.random() < 0.25:  # written through one service: both views follow the database
                writer = tiny if step % 2 else roomy
                writer.remember(agent, f"{bank}-w{step}", _text(rnd), bank=bank, on_duplicate="create")
            query = " ".join(rnd.sample(WORDS, 2))
            assert _answer(tiny, node, bank, query) == _answer(roomy, node, bank, query), (step, bank, query)
            assert len(tiny.open_view_ids()) <= 3  # the two most recent, and at most one still unmeasured
        stats = tiny.view_stats()
        assert stats.closed > BANKS  # views were closed, and opened again later
        assert roomy.view_stats().closed == 0 and roomy.view_stats().built >= BANKS
    finally:
        tiny.close()
        roomy.close()


def test_a_closed_view_stops_following_its_database_and_its_reopening_sees_every_row(node):
    service = MemoryService(node.agents, node.memory.embedder, settings=Budget(1), keep_recent=1)
    agent = node.agents.agent("alpha")
    try:
        b0 = node.agents.resolve("b0").db
        first = service.view(b0)
        assert len(first) == 15
        service.view(node.agents.resolve("b1").db)  # b0 is now least recently used, idle: closed
        assert b0.id not in service.open_view_ids()
        service.remember(agent, "late", "written while b0's view was closed", bank="b1")
        service.remember(agent, "late", "written while b0's view was closed", bank="b0")
        assert len(first) == 15  # closed: no longer fed by the database
        again = service.view(b0)
        assert again is not first and len(again) == 16
        assert [m["key"] for m in service.recall(agent, "written while closed", bank="b0", count=False)
                ["memories"]][:1] == ["late"]
    finally:
        service.close()


def test_a_view_a_search_holds_is_never_closed_under_it(node):
    service = MemoryService(node.agents, node.memory.embedder, settings=Budget(1), keep_recent=1)
    agent = node.agents.agent("alpha")
    held_db = node.agents.resolve("b0").db
    view = service.view(held_db)
    view.load()
    holding, release = threading.Event(), threading.Event()

    def search() -> None:
        with view.held(10) as got:
            assert got
            holding.set()
            release.wait(30)

    t = threading.Thread(target=search)
    t.start()
    try:
        assert holding.wait(10)
        for i in range(1, BANKS):  # every other bank opened and built past the budget
            service.view(node.agents.resolve(f"b{i}").db).load()
            service.view(node.agents.resolve(f"b{i}").db)
        assert held_db.id in service.open_view_ids()
        assert service.view_stats().closed >= BANKS - 3
    finally:
        release.set()
        t.join(10)
    # Still the service's view of b0, still following its database.
    service.remember(agent, "after", "a row after the search", bank="b0")
    assert service.view(held_db) is view and view.current("after") is not None
    service.close()


def test_status_builds_no_view_and_counts_the_open_ones(node):
    node.memory.close()  # a fresh service: no view open
    data = node.run("status", {}).data
    banks = {d["bank"]: d for d in data["databases"]}
    assert all(d["recall"] is None for d in banks.values())
    assert data["node"]["memory"]["views_open"] == 0 and node.memory.open_view_ids() == []
    assert "recall indexes: 0 open" in node.run("status", {}).text
    node.call_tool("alpha", "recall", {"query": "deploy", "bank": "b3"})
    data = node.run("status", {}).data
    banks = {d["bank"]: d for d in data["databases"]}
    assert [name for name, d in banks.items() if d["recall"] is not None] == ["b3"]
    assert banks["b3"]["recall"]["memories"] == 15
    assert data["node"]["memory"]["views_open"] == 1
    assert data["node"]["memory"]["view_bytes"] >= 15 * PY_BYTES_PER_ROW
    assert node.memory.open_view_ids() == [banks["b3"]["id"]]


def test_the_budget_comes_from_config_yaml_and_defaults_to_a_share_of_memory(node):
    phys = physical_bytes()
    assert phys is not None
    assert node.memory.view_stats().budget == int(phys * DEFAULT_SHARE)
    (node.home / CONFIG_FILE).write_text("memory:\n  view_budget_mib: 0.5\n")
    done = reload_config(node)
    assert "memory.view_budget_mib: null -> 0.5" in done.changes
    assert node.memory.view_stats().budget == 2**19
    assert node.run("config.show", {}).data["memory"] == {"view_budget_mib": 0.5}
    # Within half a MiB, with every view idle, at most the 8 most recent stay open.
    for i in range(BANKS):
        node.call_tool("alpha", "recall", {"query": "river", "bank": f"b{i}"})
    assert len(node.memory.open_view_ids()) <= 8 + 1
    assert node.memory.view_stats().closed > 0
