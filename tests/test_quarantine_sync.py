"""Quarantine across three real `memmesh serve` processes, on 127.0.0.1 only.

A creates a shared bank; B and C import it (admin tickets). gamma, a writer on B, and alpha on
A write to it. A quarantines gamma's key: once the quarantine entry has reached B and C (the
daemons carry it like any entry), recall on every node hides exactly gamma's rows, with no
further step. A releases it: recall on every node is byte for byte (JSON) what it was before.
Every wait has a deadline (tests/procs.py); every serve is killed in a finally block.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memmesh.node import Node
from tests.homes import agent_with_bank
from tests.procs import Serve, processes, until

pytestmark = pytest.mark.slow

BANK = "project-notes"
REACH_S = 10.0  # what one node commits reaches the others within this (one or two daemon rounds)


def _init(home: Path) -> None:
    node, _ = Node.init(home)
    with node:
        node.run("embedder.set", {"provider": "none"})


def _recall(serve: Serve, agent: str, query: str) -> str:
    data = serve.run("recall", {"agent": agent, "query": query, "bank": BANK, "limit": 100, "no_count": True}).data
    return json.dumps(data, sort_keys=True)


def _authors(recalled: str) -> list[str]:
    return [m["written_by"] for m in json.loads(recalled)["memories"]]


def _quarantines(serve: Serve) -> list[dict[str, Any]]:
    return serve.run("memory.quarantines", {"bank": BANK}).data["quarantines"]


def _heads(serve: Serve) -> list[str]:
    [db] = [d for d in serve.run("status", {}).data["databases"] if d["bank"] == BANK]
    return db["heads"]


def test_a_quarantine_applied_on_one_serve_hides_the_rows_on_every_replica(tmp_path):
    homes = [tmp_path / n for n in ("a", "b", "c")]
    for h in homes:
        _init(h)
    with processes() as procs:
        sa, sb, sc = (procs.serve(h, interval=1).start() for h in homes)
        for s in (sa, sb, sc):
            s.wait_ready()
        agent_with_bank(sa.run, bank=BANK)
        for s, agent, perm in ((sb, "gamma", "write"), (sc, "delta", "read")):
            ticket = sa.run("memory.share", {"bank": BANK, "perm": "admin"}).data["ticket"]
            s.run("memory.import", {"ticket": ticket, "perm": "admin"})
            s.run("agent.new", {"name": agent})
            s.run("memory.grant", {"bank": BANK, "agent": agent, "perm": perm})
        for i in range(3):
            sb.run("remember", {"agent": "gamma", "key": f"gamma.{i}", "value": f"gamma's deploy note {i}",
                                "bank": BANK})
        for i in range(2):
            sa.run("remember", {"agent": "alpha", "key": f"alpha.{i}", "value": f"alpha's deploy note {i}",
                                "bank": BANK})
        until(lambda: _heads(sa) == _heads(sb) == _heads(sc), 3 * REACH_S, "A, B and C to hold the same entries")
        readers = ((sa, "alpha"), (sb, "gamma"), (sc, "delta"))
        queries = ("deploy", "")  # by words, and the newest first
        before = {(i, q): _recall(s, agent, q) for i, (s, agent) in enumerate(readers) for q in queries}
        gamma = {a["name"]: a["key"] for a in sb.run("agent.list", {}).data["agents"]}["gamma"]
        assert all(_authors(r).count(gamma) == 3 and len(_authors(r)) == 5 for r in before.values())

        # A quarantines gamma (A does not know gamma by name: by its key)
        qid = sa.run("memory.quarantine", {"bank": BANK, "who": gamma}).data["id"]
        for s in (sb, sc):
            until(lambda s=s: [q["id"] for q in _quarantines(s)] == [qid], REACH_S, "the quarantine to reach B and C")
        listed = [_quarantines(s)[0] for s in (sa, sb, sc)]
        assert all(q["key"] == gamma and q["active"] and q["hides"]["rows"] == 3 for q in listed)
        assert listed[1]["name"] == "gamma"  # B knows the key's agent
        for i, (s, agent) in enumerate(readers):  # no further round: holding the entry is enough
            for q in queries:
                shown = _authors(_recall(s, agent, q))
                assert gamma not in shown and len(shown) == 2, (i, q, shown)

        # A releases it: every replica recalls exactly what it did before
        sa.run("memory.release", {"bank": BANK, "quarantine": qid})
        for s in (sb, sc):
            until(lambda s=s: not _quarantines(s)[0]["active"], REACH_S, "the release to reach B and C")
        after = {(i, q): _recall(s, agent, q) for i, (s, agent) in enumerate(readers) for q in queries}
        assert after == before
