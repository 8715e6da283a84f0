"""A node of many banks (issue 23): serve starts and answers without building every bank's
recall index (only what a first turn needs, then each bank on its first use), and the sync
daemon's rounds hold the banks that changed, plus a bounded sweep, never every bank hosted.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from memmesh.node import Node
from memmesh.node.memory.embedders import EmbedderConfig
from memmesh.node.memory.rows import MEMORY_STORE, memory_value
from memmesh.node.sync.service import SyncService
from tests.procs import processes, until

HANG_GUARD_S = 60.0  # only so that a hang fails: nothing here asserts how long anything took


def _banks(node: Node, n: int, per_bank: int) -> list[str]:
    """``n`` banks of ``per_bank`` memories each, written by each bank's own key in one entry."""
    names = []
    for i in range(n):
        name = f"b{i:03d}"
        node.run("memory.new", {"name": name})
        ref = node.agents.resolve(name)
        txn = ref.db.transaction(ref.admin_key)
        for j in range(per_bank):
            txn.append(MEMORY_STORE, memory_value(f"{name}-m{j}", f"note {j} of {name} about the river garden", ()))
        txn.commit()
        names.append(name)
    return names


@pytest.mark.slow
def test_serve_with_200_banks_answers_without_building_every_index(tmp_path: Path):
    home = tmp_path / "home"
    with Node.open(home) as node:
        node.set_embedder_config(EmbedderConfig("none"))
        node.agents.create_agent("alpha")
        _banks(node, 200, 5)
        for name in ("b000", "b001", "b150"):
            node.run("memory.grant", {"bank": name, "agent": "alpha", "perm": "read"})
        for name in ("b000", "b001"):  # what alpha's turns auto-recall: built at start
            node.run("memory.attach", {"agent": "alpha", "bank": name})
    with processes() as procs:
        serve = procs.serve(home).start().wait_ready()
        got = serve.run("recall", {"agent": "alpha", "query": "river", "bank": "b150", "limit": 3}).data
        assert got["bank"] == "b150" and len(got["memories"]) == 3
        want = {"alpha", "b000", "b001", "b150"}

        def open_banks() -> set[str] | None:
            data = serve.run("status", {}).data
            assert len(data["databases"]) == 201
            built = {d["bank"] for d in data["databases"] if d["recall"] is not None}
            # the start-up builds run on the search threads: wait for them, never for more
            assert built <= want, built
            return built if built == want and data["node"]["memory"]["views_open"] == len(want) else None

        until(open_banks, HANG_GUARD_S, "the start-up indexes and b150's")
        # A bank never used has no index; its first use builds it, with the same answer as offline.
        data = serve.run("recall", {"agent": "alpha", "query": "garden", "bank": "b001", "limit": 100}).data
        assert data["count"] == 5
        assert serve.stop() == 0
    with Node.open(home) as node:
        offline = node.call_tool("alpha", "recall", {"query": "river", "bank": "b150", "limit": 3})
        assert [m["key"] for m in offline["memories"]] == [m["key"] for m in got["memories"]]


async def _until(predicate, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def test_a_round_holds_the_changed_banks_and_a_bounded_sweep_never_every_bank(tmp_path: Path):
    with Node.open(tmp_path / "home") as node:
        node.set_embedder_config(EmbedderConfig("none"))
        node.agents.create_agent("alpha")
        names = _banks(node, 40, 1)
        ids = {name: node.agents.resolve(name).db.id for name in names}
        for db_id in ids.values():
            node.sync.share(db_id)
        node.run("memory.grant", {"bank": "b017", "agent": "alpha", "perm": "write"})

        async def main() -> None:
            service = SyncService(node, address="http:127.0.0.1:1", discovery=False, interval_s=3600, sweep_banks=4)
            await service.start()
            try:
                await _until(lambda: service.rounds >= 1, "the first sweep")
                first = set(service.last_round)
                assert len(first) == 4 and first <= set(ids.values())
                # One bank changes: the next round is that bank alone.
                node.call_tool("alpha", "remember", {"key": "k", "value": "a change", "bank": "b017"})
                await _until(lambda: service.rounds >= 2, "the round of the change")
                assert service.last_round == (ids["b017"],)
                # A sweep (a reload starts one at once): 4 more, those synced longest ago.
                service.configure(interval_s=3600, fanout=3, peers=())
                await _until(lambda: service.rounds >= 3, "the second sweep")
                second = set(service.last_round)
                assert len(second) == 4 and not second & (first | {ids["b017"]})
                assert service.banks_synced == 9  # never the 40 banks hosted
            finally:
                await service.stop()

        asyncio.run(main())
