"""Access counts (peer-local, never synced) and scope precedence in auto-recall.

Real homes (SQLite in tmp_path), config.yaml applied by `reload`, one real CLI process for
`--no-count` and `memory stats` as an operator types them.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

import memmesh.node as node_module
from memmesh.auth.errors import MemmeshError
from memmesh.node import Node
from memmesh.node.cli_args import build_parser, command_of
from memmesh.node.commands.params import ParamsError
from memmesh.node.memory.access import NS_ACCESS
from memmesh.node.registry import UnknownName
from tests.test_cli import mm

# Config order of the default banks is the reverse of their attachment order below, so the
# test tells "config order" from "attachment order".
CONFIG = """\
agents:
  - name: alpha
    default_memory_banks: [def-b, def-a]
"""
BANKS = ("sess", "def-a", "def-b", "other")


def _fresh(path: Path) -> Node:
    node, _ = Node.init(path)
    node.run("embedder.set", {"provider": "none"})  # BM25 only: every rank below is exact
    (path / "config.yaml").write_text(CONFIG)
    node.run("reload", {})  # creates def-a and def-b, grants alpha write
    for bank in ("sess", "other"):
        node.run("memory.new", {"name": bank})
        node.run("memory.grant", {"bank": bank, "agent": "alpha", "perm": "write"})
    # Attachment order: other, def-a, def-b for every session; sess for session s1 only.
    for bank in ("other", "def-a", "def-b"):
        node.run("memory.attach", {"bank": bank, "agent": "alpha"})
    node.run("memory.attach", {"bank": "sess", "agent": "alpha", "session": "s1"})
    return node


@pytest.fixture
def node(tmp_path):
    n = _fresh(tmp_path / "h")
    with n:
        yield n


def remember(node: Node, key: str, value: str, bank: str | None = None) -> None:
    # Stores here hold the same text under several keys on purpose: written anyway (on_duplicate).
    node.call_tool("alpha", "remember", {"key": key, "value": value, "bank": bank, "on_duplicate": "create"})


def recall(node: Node, query: str, bank: str | None = None, **extra: Any) -> dict[str, dict[str, Any]]:
    """key -> memory, through the agent tool, or the operator command when ``extra`` is given."""
    if extra:
        data = node.run("recall", {"agent": "alpha", "query": query, "bank": bank, **extra}).data
    else:
        data = node.call_tool("alpha", "recall", {"query": query, "bank": bank})
    return {m["key"]: m for m in data["memories"]}


def signed_state(node: Node) -> dict[str, Any]:
    """What is in every database's signed log: entry counts and heads."""
    return {d: (len(node.database(d)), node.database(d).heads) for d in node.database_ids()}


def autorecall(node: Node, message: str, session: str | None = None) -> dict[str, Any]:
    data = node.run("autorecall", {"agent": "alpha", "messages": [message], "session": session}).data
    if data["block"]:  # the block and its lines say the same, line for line
        memory_lines = [t for t in data["block"].splitlines() if t.startswith("- ")]  # not the frame
        assert memory_lines == [line["text"] for line in data["lines"]]
    return data


# ---------------------------------------------------------------------------- access counts
def test_recall_counts_each_returned_memory_and_no_count_does_not(node):
    remember(node, "deploy", "deploy with nix build")
    remember(node, "rollback", "rollback the deploy")
    remember(node, "lunch", "lunch at noon")
    first = recall(node, "deploy")
    assert {k: m["access_count"] for k, m in first.items()} == {"deploy": 1, "rollback": 1}
    assert first["deploy"]["recalls"] == 1 and first["deploy"]["injections"] == 0
    assert first["deploy"]["last_access"].endswith("Z")
    assert recall(node, "nix")["deploy"]["access_count"] == 2
    # The operator's --no-count shows the counts as they stand and leaves them.
    quiet = recall(node, "deploy", no_count=True)
    assert {k: m["access_count"] for k, m in quiet.items()} == {"deploy": 2, "rollback": 1}
    assert quiet["deploy"]["last_access"] == recall(node, "deploy", no_count=True)["deploy"]["last_access"]
    assert recall(node, "lunch", no_count=True)["lunch"]["access_count"] == 0
    assert recall(node, "lunch", no_count=True)["lunch"]["last_access"] is None
    # A changed memory (a newer row for the key) keeps its key's count.
    remember(node, "deploy", "deploy with nix build --impure")
    assert recall(node, "impure")["deploy"]["access_count"] == 3
    # Superseded rows listed with --all count their key once per recall.
    assert recall(node, "deploy", include_superseded=True)["deploy"]["access_count"] == 4


def test_counts_are_per_database(node):
    remember(node, "deploy", "deploy from own memory")
    remember(node, "deploy", "deploy from the bank", bank="other")
    recall(node, "deploy")
    recall(node, "deploy")
    assert recall(node, "deploy", bank="other")["deploy"]["access_count"] == 1
    assert recall(node, "deploy", no_count=True)["deploy"]["access_count"] == 2


def test_auto_recall_counts_injections_of_the_lines_it_shows(node):
    remember(node, "deploy", "deploy with nix")
    remember(node, "deploy", "the bank's deploy", bank="other")  # hidden by the agent's own
    remember(node, "deploy.window", "deploy on fridays", bank="other")
    autorecall(node, "how do we deploy?")
    autorecall(node, "how do we deploy?")
    own = recall(node, "deploy", no_count=True)["deploy"]
    assert (own["access_count"], own["injections"], own["recalls"]) == (2, 2, 0)
    bank = recall(node, "deploy", bank="other", no_count=True)
    assert bank["deploy.window"]["injections"] == 2
    assert bank["deploy"]["access_count"] == 0  # found, but not shown: not injected
    assert autorecall(node, "the of and") == {"block": "", "lines": [], "not_shown": 0, "not_searched": []}  # nothing shown, nothing counted
    assert recall(node, "deploy", no_count=True)["deploy"]["access_count"] == 2


def test_an_auto_recall_preview_is_not_counted_as_an_injection(node, tmp_path):
    remember(node, "deploy", "deploy with nix")
    shown = autorecall(node, "how do we deploy?")  # what a harness calls before a model turn
    counted = node.memory.access.get(node.agents.agent("alpha").db.id, "deploy")
    assert (counted.injections, counted.recalls) == (1, 0)
    # The cockpit's preview (and `memmesh autorecall --no-count`) shows the same block, counting nothing.
    preview = node.run("autorecall", {"agent": "alpha", "messages": ["how do we deploy?"], "no_count": True}).data
    assert preview == shown
    name, params = command_of(build_parser().parse_args(
        ["autorecall", "alpha", "--no-count", "how do we deploy?"]))
    assert node.run(name, {k: v for k, v in params.items() if v is not None}).data == shown
    assert node.memory.access.get(node.agents.agent("alpha").db.id, "deploy") == counted
    # The block the page shows is requested as a preview (node/api/static/app.js).
    page = (Path(node_module.__file__).parent / "api" / "static" / "app.js").read_text()
    assert re.search(r'/autorecall`, \{messages, no_count: true\}', page)


def test_reads_never_write_to_any_database_and_counts_survive_a_reopen(tmp_path):
    home = tmp_path / "h"
    node = _fresh(home)
    with node:
        remember(node, "deploy", "deploy with nix")
        remember(node, "deploy", "the bank's deploy", bank="def-a")
        before = signed_state(node)
        for _ in range(3):
            recall(node, "deploy")
            recall(node, "deploy", bank="def-a")
            autorecall(node, "deploy please", session="s1")
        node.run("memory.stats", {"bank": "alpha"})
        assert signed_state(node) == before  # no entry, no new head: nothing to sync
        # The counts are peer-local records: one per (database, memory key) counted.
        assert len(node.storage.items_local(NS_ACCESS)) == 2
    with Node.open(home) as again:
        own = recall(again, "deploy", no_count=True)["deploy"]
        assert (own["recalls"], own["injections"]) == (3, 3)
        assert recall(again, "deploy", bank="def-a", no_count=True)["deploy"]["recalls"] == 3
        assert signed_state(again) == before


def test_refused_calls_count_nothing(node):
    remember(node, "deploy", "deploy with nix")
    with pytest.raises(ParamsError):
        node.call_tool("alpha", "recall", {"query": "deploy", "limit": 500})
    with pytest.raises(MemmeshError):
        node.call_tool("alpha", "recall", {"query": "deploy", "bank": "nowhere"})
    assert node.storage.items_local(NS_ACCESS) == []
    assert recall(node, "deploy", no_count=True)["deploy"]["access_count"] == 0


# ---------------------------------------------------------------------------- memory stats
def test_memory_stats_orders_most_and_least_used(node):
    for key in ("alpha-note", "beta-note", "gamma-note", "delta-note"):
        remember(node, key, f"{key} text", bank="other")
    for query, times in (("gamma", 3), ("alpha", 1), ("beta", 1)):
        for _ in range(times):
            recall(node, query, bank="other")
        time.sleep(0.005)  # last access is kept in ms, and a recall can take less than one
    data = node.run("memory.stats", {"bank": "other"}).data
    assert (data["bank"], data["memories"], data["used"]) == ("other", 4, 3)
    # Most used: count, then the latest access first (beta was recalled after alpha).
    assert [(r["key"], r["access_count"]) for r in data["most_used"]] == \
        [("gamma-note", 3), ("beta-note", 1), ("alpha-note", 1)]
    # Least used: never used first, then the oldest access first.
    assert [r["key"] for r in data["least_used"]] == ["delta-note", "alpha-note", "beta-note", "gamma-note"]
    assert data["least_used"][0]["last_access"] is None
    short = node.run("memory.stats", {"bank": "other", "limit": 1}).data
    assert [r["key"] for r in short["most_used"]] == ["gamma-note"]
    assert [r["key"] for r in short["least_used"]] == ["delta-note"]
    # The chat form reaches the same command.
    chat = node.run("command", {"agent": "alpha", "line": "/memory stats other --limit 1"})
    assert chat.data == short and "gamma-note" in chat.text


def test_memory_stats_refuses_bad_input_and_writes_nothing(node):
    remember(node, "deploy", "deploy with nix")
    before = (signed_state(node), node.storage.items_local(NS_ACCESS))
    with pytest.raises(UnknownName):
        node.run("memory.stats", {"bank": "nowhere"})
    with pytest.raises(ParamsError, match="limit"):
        node.run("memory.stats", {"bank": "alpha", "limit": 0})
    with pytest.raises(ParamsError):
        node.run("memory.stats", {"bank": "alpha", "colour": "red"})
    assert (signed_state(node), node.storage.items_local(NS_ACCESS)) == before


def test_the_cli_no_count_and_memory_stats(tmp_path):
    home = tmp_path / "h"
    with _fresh(home) as node:
        remember(node, "deploy", "deploy with nix")
    out = json.loads(mm("--json", "recall", "alpha", "deploy", "--no-count", home=home).stdout)
    assert out["memories"][0]["access_count"] == 0
    mm("recall", "alpha", "deploy", home=home)
    stats = mm("memory", "stats", "alpha", home=home).stdout
    assert stats.splitlines()[0] == "alpha: 1 memories, 1 used on this node"
    assert "deploy  (1 recalls, 0 auto-recalls, last " in stats


# ---------------------------------------------------------------------------- scope precedence
def _precedence_fixture(node: Node) -> None:
    # k1 everywhere; k2 in every bank; k3 in both default banks and other; k4 only in other.
    remember(node, "k1", "deploy own")
    for bank in BANKS:
        remember(node, "k1", f"deploy {bank}", bank=bank)
        remember(node, "k2", f"deploy {bank}", bank=bank)
    for bank in ("def-a", "def-b", "other"):
        remember(node, "k3", f"deploy {bank}", bank=bank)
    remember(node, "k4", "deploy other", bank="other")


def test_the_closest_store_wins_and_lines_follow_precedence(node):
    _precedence_fixture(node)
    node.run("memory.config", {"agent": "alpha", "action": "set", "key": "max_entries", "value": 10})
    shown = [(line["key"], line["bank"]) for line in autorecall(node, "deploy", session="s1")["lines"]]
    # own, then the session's bank, then default banks in config order (def-b before def-a),
    # then the other attached bank; each key once, from the closest store holding it.
    assert shown == [("k1", None), ("k2", "sess"), ("k3", "def-b"), ("k4", "other")]
    block = autorecall(node, "deploy", session="s1")["block"]
    assert "- **k1**: deploy own\n" in block and "deploy def-a" not in block
    # Without the session, its bank is not searched: the first default bank wins k2.
    shown = [(line["key"], line["bank"]) for line in autorecall(node, "deploy")["lines"]]
    assert dict(shown) == {"k1": None, "k2": "def-b", "k3": "def-b", "k4": "other"}
    assert [bank for _key, bank in shown] == [None, "def-b", "def-b", "other"]  # within a store: by rank


def test_a_store_still_fills_max_entries_with_keys_not_shown_yet(node):
    _precedence_fixture(node)
    node.run("memory.config", {"agent": "alpha", "action": "set", "key": "max_entries", "value": 1})
    lines = autorecall(node, "deploy", session="s1")["lines"]
    # Each store shows one memory, never one a closer store already showed.
    assert [(line["key"], line["bank"]) for line in lines] == \
        [("k1", None), ("k2", "sess"), ("k3", "def-b"), ("k4", "other")]


def test_precedence_also_orders_chosen_auto_recall_banks(node):
    _precedence_fixture(node)
    node.run("memory.config", {"agent": "alpha", "action": "set", "key": "max_entries", "value": 10})
    node.run("memory.config", {"agent": "alpha", "action": "set", "key": "auto_recall_banks",
                               "value": "other, def-a, sess"})
    shown = [(line["key"], line["bank"]) for line in autorecall(node, "deploy", session="s1")["lines"]]
    assert shown == [("k1", None), ("k2", "sess"), ("k3", "def-a"), ("k4", "other")]
