"""config.yaml's default_memory_banks: created, granted, referenced and attached for every
session, so auto-recall searches them; shown by `agent list`; a second reload writes nothing.

Real homes (SQLite in tmp_path), the real CLI in process, config.yaml applied by `reload`.
"""
from __future__ import annotations

import json

import pytest

from memmesh.node import Node
from memmesh.node.memory.agents import agent_state
from tests.test_cli import mm_here

CONFIG = """\
agents:
  - name: alpha
    default_memory_banks: [notes, ops]
"""


def _entries(node: Node) -> dict[str, int]:
    return {db_id: len(node.database(db_id)) for db_id in node.database_ids()}


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    mm_here("init", home=h)
    mm_here("embedder", "set", "none", home=h)
    (h / "config.yaml").write_text(CONFIG)
    return h


def test_default_banks_are_attached_searched_by_autorecall_and_listed(home):
    changes = json.loads(mm_here("--json", "reload", home=home).stdout)["changes"]
    assert "bank notes attached to alpha (every session)" in changes
    assert "bank ops attached to alpha (every session)" in changes
    mm_here("remember", "alpha", "deploy.window", "Deploys happen on Tuesday mornings", "--bank", "ops", home=home)
    block = json.loads(mm_here("--json", "autorecall", "alpha", "when do deploys happen", home=home).stdout)
    assert "Deploys happen on Tuesday mornings" in block["block"]
    assert [line["bank"] for line in block["lines"]] == ["ops"]

    listed = json.loads(mm_here("--json", "agent", "list", home=home).stdout)["agents"]
    alpha = next(a for a in listed if a["name"] == "alpha")
    assert alpha["attached"] == {"*": ["notes", "ops"]} and alpha["default_banks"] == ["notes", "ops"]
    text = mm_here("agent", "list", home=home).stdout
    assert "every session: notes (default), ops (default)" in text

    with Node.open(home) as node:
        before = _entries(node)
        alpha_db = node.agents.agent("alpha").db
        attached = agent_state(alpha_db).attached[None]
        assert attached == [node.agents.resolve("notes").db.id, node.agents.resolve("ops").db.id]
    again = json.loads(mm_here("--json", "reload", home=home).stdout)["changes"]
    assert again == []
    with Node.open(home) as node:
        assert _entries(node) == before  # the second reload wrote no entry anywhere


def test_a_default_bank_detached_by_hand_is_shown_so_and_attached_again_by_reload(home):
    mm_here("reload", home=home)
    mm_here("memory", "detach", "notes", "--agent", "alpha", home=home)
    text = mm_here("agent", "list", home=home).stdout
    assert "every session: ops (default)" in text
    assert "default banks not attached: notes (memmesh reload attaches them)" in text
    changes = json.loads(mm_here("--json", "reload", home=home).stdout)["changes"]
    assert changes == ["bank notes attached to alpha (every session)"]
    listed = json.loads(mm_here("--json", "agent", "list", home=home).stdout)["agents"]
    assert sorted(next(a for a in listed if a["name"] == "alpha")["attached"]["*"]) == ["notes", "ops"]


def test_all_the_missing_attachments_of_an_agent_are_one_entry(home):
    """Granted and referenced by hand already: the reload adds only the attachments, together."""
    with Node.open(home) as node:
        node.run("agent.new", {"name": "alpha"})
        for bank in ("notes", "ops"):
            node.run("memory.new", {"name": bank})
            node.run("memory.grant", {"bank": bank, "agent": "alpha", "perm": "write"})
        before = _entries(node)
        alpha = node.agents.agent("alpha").db.id
        changes = node.run("reload", {}).data["changes"]
        assert [c for c in changes if "attached" in c] == ["bank notes attached to alpha (every session)",
                                                           "bank ops attached to alpha (every session)"]
        after = _entries(node)
        assert {k: after[k] - before[k] for k in after} == {
            alpha: 1, node.agents.resolve("notes").db.id: 0, node.agents.resolve("ops").db.id: 0}


def test_a_bad_config_attaches_nothing(home):
    mm_here("agent", "new", "alpha", home=home)
    (home / "config.yaml").write_text("agents:\n  - name: alpha\n    default_memory_banks: [alpha]\n")
    bad = mm_here("reload", home=home, check=False)
    assert bad.returncode != 0 and "'alpha' is an agent" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    with Node.open(home) as node:
        assert agent_state(node.agents.agent("alpha").db).attached == {}
