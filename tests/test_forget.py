"""forget: a memory erased for real in one home (docs/memory.md, "Forget").

Real homes (SQLite files, WAL), real Ed25519 keys, the command registry as every transport runs
it. The replication of a forget between two serve processes is tests/test_forget_sync.py; the
retention option that erases retired memory rows is tests/test_forget_retention.py.
"""
from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.auth.errors import AuthError, MemmeshError
from memmesh.auth.keys import public_key_str
from memmesh.node import Node
from memmesh.node.commands.chat_grammar import ChatUsageError
from memmesh.node.commands.params import ParamsError
from memmesh.node.memory.embedders import EmbedderConfig
from memmesh.node.memory.rows import MEMORY_STORE
from memmesh.node.registry import UnknownName


def marker(word: str = "secret") -> str:
    """A text that appears nowhere else in a home: what the byte checks look for."""
    return f"{word}-{uuid.uuid4().hex}"


def checkpoint(home: Path) -> None:
    """Fold every database file's WAL into it and empty the WAL (the node is closed)."""
    for path in home.rglob("*.sqlite"):
        conn = sqlite3.connect(path)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            conn.close()


def files_holding(home: Path, text: str) -> list[str]:
    """Every file under ``home`` (node.sqlite, its -wal and -shm, keys, records, ...) whose bytes
    hold ``text``."""
    needle = text.encode()
    return sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file() and needle in p.read_bytes())


def open_node(home: Path, embedder: str = "hashed") -> Node:
    node = Node.open(home)
    node.set_embedder_config(EmbedderConfig(embedder))
    return node


def tool(node: Node, agent: str, name: str, **args: Any) -> dict[str, Any]:
    return node.call_tool(agent, name, args)


def recalled(node: Node, agent: str, bank: str | None = None, query: str = "") -> list[dict[str, Any]]:
    """Every row recall lists, superseded ones too (recall --all), for ``agent``."""
    params: dict[str, Any] = {"agent": agent, "query": query, "include_superseded": True, "limit": 100,
                              "no_count": True}
    if bank is not None:
        params["bank"] = bank
    return node.run("recall", params).data["memories"]


def entries(node: Node, bank: str) -> int:
    return len(node.agents.resolve(bank).db)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


# ------------------------------------------------------------------ by the author, in its own database
def test_forget_erases_every_version_and_its_vectors_from_every_file_and_index(home):
    old, new, keep = marker("old"), marker("new"), marker("keep")
    node = open_node(home)
    node.agents.create_agent("alpha")
    first = tool(node, "alpha", "remember", key="wifi.password", value=f"the wifi password is {old}")
    second = tool(node, "alpha", "remember", key="wifi.password", value=f"the wifi password is {new}")
    assert first["embedded"] and second["supersedes"] == [{"key": "wifi.password", "entry": first["entry"]}]
    tool(node, "alpha", "remember", key="plan", value=f"the plan {keep}",
         edges=[{"type": "depends-on", "to": "wifi.password"}])
    db = node.agents.agent("alpha").db
    assert {m["key"] for m in recalled(node, "alpha")} == {"wifi.password", "plan"}

    before = len(db)
    preview = node.run("forget", {"agent": "alpha", "key": "wifi.password", "preview": True})
    assert preview.data["preview"] is True and "entries" not in preview.data
    assert len(db) == before  # a preview writes nothing
    assert "would forget 'wifi.password' in alpha: 2 versions" in preview.text

    done = node.run("forget", {"agent": "alpha", "key": "wifi.password"})
    data = done.data
    assert data["ok"] and data["key"] == "wifi.password" and data["bank"] == "alpha" and not data["preview"]
    assert [v["entry"] for v in data["versions"]] == [first["entry"], second["entry"]]
    store = node.memory.embedder.store_name
    assert sorted((e["entry"], e["store"]) for e in data["erased"]) == sorted(
        (e, s) for e in (first["entry"], second["entry"]) for s in (MEMORY_STORE, store))
    assert data["erased"] == preview.data["erased"]  # the preview said exactly what went
    assert data["erased_with"] == [] and data["vectors_rewritten"] == [] and len(data["entries"]) == 1
    assert done.text.startswith("forgot 'wifi.password' in alpha: 2 versions, 4 payloads erased")
    for e in (first["entry"], second["entry"]):
        assert db.payload_state(e, MEMORY_STORE) == "erased" and db.payload_state(e, store) == "erased"

    # Nowhere to be seen: recall (every version), auto-recall, neighbors, status, the view's index.
    assert [m["key"] for m in recalled(node, "alpha")] == ["plan"]
    assert {m["key"] for m in recalled(node, "alpha", query=f"wifi password {old} {new}")} <= {"plan"}
    block = node.run("autorecall", {"agent": "alpha", "messages": [f"what is the wifi password {new}?"],
                                    "no_count": True}).data["block"]
    assert old not in block and new not in block
    links = tool(node, "alpha", "neighbors", key="plan")
    assert links["neighbors"] == [] and [m["key"] for m in links["missing"]] == ["wifi.password"]
    with pytest.raises(MemmeshError, match="no current memory 'wifi.password'"):
        tool(node, "alpha", "neighbors", key="wifi.password")
    status = node.run("memory.status", {"bank": "alpha"}).data
    assert old not in json.dumps(status) and new not in json.dumps(status)
    view = node.memory.view(db)
    assert view.loaded and [m.key for m in view.memories(include_superseded=True)] == ["plan"]
    assert view.timeline("wifi.password") == []
    node.close()

    checkpoint(home)
    assert files_holding(home, old) == [] and files_holding(home, new) == []
    assert files_holding(home, keep) != []  # the check can see a value that is there
    with open_node(home) as again:  # opened again: the same, and the other memory is recalled
        assert [m["key"] for m in recalled(again, "alpha", query=keep)] == ["plan"]
        assert [m["key"] for m in recalled(again, "alpha")] == ["plan"]


def test_before_forget_the_text_is_in_the_files(home):
    """The control of the byte checks: a remembered value is in the home's files."""
    text = marker()
    with open_node(home) as node:
        node.agents.create_agent("alpha")
        tool(node, "alpha", "remember", key="k", value=text)
    checkpoint(home)
    assert files_holding(home, text) == ["node.sqlite"]


# ------------------------------------------------------------------ who may
def _bank_home(home: Path) -> Node:
    node = open_node(home, "none")
    for name in ("alpha", "beta", "gamma"):
        node.agents.create_agent(name)
    node.run("memory.new", {"name": "notes"})
    node.run("memory.grant", {"bank": "notes", "agent": "alpha", "perm": "write"})
    node.run("memory.grant", {"bank": "notes", "agent": "gamma", "perm": "write"})
    node.run("memory.grant", {"bank": "notes", "agent": "beta", "perm": "read"})
    return node


def test_a_writer_forgets_what_it_wrote_and_nobody_else_may(home):
    text = marker()
    node = _bank_home(home)
    tool(node, "alpha", "remember", key="token", value=f"token {text}", bank="notes")
    before = entries(node, "notes")
    refusals = [
        ("beta", "agent beta may not forget in bank notes: its key holds read permission; forgetting needs Write"),
        ("gamma", "agent gamma may not forget 'token' in bank notes: some of what holds it was written by other "
                  "keys (ed25519:"),
    ]
    for agent, says in refusals:
        with pytest.raises(AuthError) as err:
            node.run("forget", {"agent": agent, "key": "token", "bank": "notes"})
        assert str(err.value).startswith(says) and "\n" not in str(err.value)
        assert str(err.value).endswith("nothing was erased")
        assert entries(node, "notes") == before
        assert [m["value"] for m in recalled(node, "beta", "notes")] == [f"token {text}"]
    node.agents.create_agent("delta")  # no permission at all: told so, before the key is looked up
    with pytest.raises(AuthError, match="agent delta may not forget in bank notes: its key holds no permission"):
        node.run("forget", {"agent": "delta", "key": "no-such-key", "bank": "notes"})

    out = node.run("forget", {"agent": "alpha", "key": "token", "bank": "notes"}).data
    assert out["bank"] == "notes" and [e["store"] for e in out["erased"]] == [MEMORY_STORE]
    assert recalled(node, "beta", "notes") == [] and recalled(node, "alpha", "notes") == []
    node.close()
    checkpoint(home)
    assert files_holding(home, text) == []


def test_an_admin_forgets_another_writers_memory(home):
    text = marker()
    node = _bank_home(home)
    # beta may write alpha's own database; alpha holds Admin(0) there.
    node.run("memory.grant", {"bank": "alpha", "agent": "beta", "perm": "write"})
    tool(node, "beta", "remember", key="beta.note", value=f"beta says {text}", bank="alpha")
    tool(node, "alpha", "remember", key="alpha.note", value="alpha's own")
    with pytest.raises(AuthError, match="some of what holds it was written by other keys"):
        node.run("forget", {"agent": "beta", "key": "alpha.note", "bank": "alpha"})
    out = node.run("forget", {"agent": "alpha", "key": "beta.note"}).data
    [version] = out["versions"]
    assert version["written_by"] == str(node.agents.agent("beta").key.public)
    assert [m["key"] for m in recalled(node, "alpha")] == ["alpha.note"]
    node.close()
    checkpoint(home)
    assert files_holding(home, text) == []


# ------------------------------------------------------------------ bad input: one line, nothing changed
@pytest.mark.parametrize("params, error, says", [
    ({"agent": "alpha", "key": "nope"}, UnknownName,
     "no memory 'nope' in alpha (no row of that key, current or superseded); nothing was erased"),
    ({"agent": "alpha", "key": "k", "bank": "nosuch"}, UnknownName, "no bank 'nosuch' on this node"),
    ({"agent": "alpha", "key": "k", "bank": "bad\x00name"}, ParamsError, "bank must not contain control characters"),
    ({"agent": "omega", "key": "k"}, UnknownName, "no agent named 'omega'"),
    ({"agent": "al\npha", "key": "k"}, ParamsError, "agent must not contain control characters"),
    ({"agent": "alpha", "key": ""}, ParamsError, "should have at least 1 character"),
    ({"agent": "alpha", "key": "k" * 513}, ParamsError, "should have at most 512 characters"),
    ({"agent": "alpha"}, ParamsError, "forget needs key"),
    ({"agent": "alpha", "key": "k", "colour": "red"}, ParamsError, "forget does not take colour"),
    ({"agent": "alpha", "key": "k", "preview": "yes"}, ParamsError, "forget: preview should be"),
])
def test_bad_input_is_one_line_and_changes_nothing(home, params, error, says):
    with open_node(home, "none") as node:
        node.agents.create_agent("alpha")
        tool(node, "alpha", "remember", key="k", value="v")
        before = entries(node, "alpha")
        with pytest.raises(error) as err:
            node.run("forget", params)
        assert says in str(err.value) and "\n" not in str(err.value), str(err.value)
        assert entries(node, "alpha") == before and [m["key"] for m in recalled(node, "alpha")] == ["k"]


def test_the_tool_is_refused_by_allowed_tools_and_takes_the_same_arguments(home):
    with open_node(home, "none") as node:
        node.agents.create_agent("alpha")
        tool(node, "alpha", "remember", key="k", value="v")
        with pytest.raises(ParamsError, match="forget does not take agent"):
            node.run("tool", {"agent": "alpha", "tool": "forget", "args": {"key": "k", "agent": "alpha"}})
        out = node.run("tool", {"agent": "alpha", "tool": "forget", "args": {"key": "k"}}).data
        assert out["versions"] and recalled(node, "alpha") == []


# ------------------------------------------------------------------ chat
def test_a_chat_line_forgets_for_the_calling_agent(home):
    text = marker()
    with open_node(home, "none") as node:
        node.agents.create_agent("alpha")
        tool(node, "alpha", "remember", key="pin code", value=text)
        line = node.run("command", {"agent": "alpha", "line": "/memory forget 'pin code' --preview"})
        assert line.data["preview"] and line.text.startswith("would forget 'pin code' in alpha")
        with pytest.raises(ChatUsageError, match=r"missing KEY; usage: /memory forget KEY \[--bank BANK\] \[--preview\]"):
            node.run("command", {"agent": "alpha", "line": "/memory forget"})
        with pytest.raises(ChatUsageError, match="unknown option --agent"):
            node.run("command", {"agent": "alpha", "line": "/memory forget k --agent beta"})
        node.run("command", {"agent": "alpha", "line": "/memory forget 'pin code'"})
        assert recalled(node, "alpha") == []
    checkpoint(home)
    assert files_holding(home, text) == []


# ------------------------------------------------------------------ what goes with it
def test_other_rows_of_an_erased_payload_are_named_and_other_vectors_written_again(home):
    """A memory payload holding two keys' rows (written by other software) takes both; a reindex
    batch of vectors is written again for the memories that stay."""
    gone, shared, stays = marker("gone"), marker("shared"), marker("stays")
    node = open_node(home, "none")
    agent = node.agents.create_agent("alpha")
    with agent.db.transaction(agent.key) as txn:  # one entry, two keys
        txn.append(MEMORY_STORE, {"key": "a", "value": gone, "tags": []})
        txn.append(MEMORY_STORE, {"key": "b", "value": shared, "tags": []})
    tool(node, "alpha", "remember", key="c", value=stays)
    node.run("embedder.set", {"provider": "hashed"})
    assert node.run("memory.reindex", {"bank": "alpha"}).data  # one entry: vectors of a, b and c
    node.close()
    node = open_node(home)
    db = node.agents.agent("alpha").db
    view = node.memory.view(db)
    assert view.missing_vectors() == []

    out = node.run("forget", {"agent": "alpha", "key": "a"})
    data = out.data
    assert [d["key"] for d in data["erased_with"]] == ["b"]
    assert data["warnings"] == ["also erased 1 row(s) of other keys written in the same entries: b"]
    assert "erased with it: b" in out.text
    assert [d["key"] for d in data["vectors_rewritten"]] == ["c"]  # b goes with a; c keeps its vector
    assert [m["key"] for m in recalled(node, "alpha")] == ["c"]
    assert node.memory.view(db).missing_vectors() == []
    node.close()
    checkpoint(home)
    assert files_holding(home, gone) == [] and files_holding(home, shared) == []
    assert files_holding(home, stays) != []


# ------------------------------------------------------------------ the property
KEYS = st.sampled_from(["k1", "k2", "k3", "k4"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writes=st.lists(st.tuples(KEYS, st.booleans()), min_size=1, max_size=8), pick=st.integers(0, 7),
       embedder=st.sampled_from(["none", "hashed"]))
def test_any_forgotten_key_leaves_no_byte_and_the_rest_stays_recallable(tmp_path_factory, writes, pick, embedder):
    home = tmp_path_factory.mktemp("prop") / "home"
    node = open_node(home, embedder)
    node.agents.create_agent("alpha")
    values: dict[str, list[str]] = {}
    for key, with_tag in writes:
        value = marker(key)
        values.setdefault(key, []).append(value)
        tool(node, "alpha", "remember", key=key, value=value, tags=["t"] if with_tag else [])
    keys = sorted(values)
    forgotten = keys[pick % len(keys)]
    out = node.run("forget", {"agent": "alpha", "key": forgotten}).data
    assert len(out["versions"]) == len(values[forgotten])
    listed = recalled(node, "alpha")
    assert forgotten not in {m["key"] for m in listed}
    for key in keys:
        if key != forgotten:  # the current value of every other key is still recalled, by its words
            assert [m["value"] for m in recalled(node, "alpha", query=values[key][-1]) if m["key"] == key][:1] \
                == [values[key][-1]]
    for value in values[forgotten]:
        assert all(value not in m["value"] for m in recalled(node, "alpha", query=value))
    node.close()
    checkpoint(home)
    for value in values[forgotten]:
        assert files_holding(home, value) == []
    for key in keys:
        if key != forgotten:
            assert files_holding(home, values[key][-1]) == ["node.sqlite"]


def test_after_a_bank_reindex_a_writer_forgets_its_own_memory_and_the_banks_vectors_of_it(home):
    """memory reindex signs a bank's vectors with the bank's Admin key, which this node holds: a
    writer forgetting its own memory gets those vectors erased with that key too (nothing of the
    text is left), while a version another key wrote still needs an Admin (refused whole)."""
    text, other = marker(), marker("other")
    node = _bank_home(home)
    tool(node, "alpha", "remember", key="k", value=text, bank="notes")
    tool(node, "gamma", "remember", key="g", value=other, bank="notes")
    node.run("embedder.set", {"provider": "hashed"})
    node.run("memory.reindex", {"bank": "notes"})
    admin = str(node.agents.resolve("notes").admin_key.public)
    node.close()
    node = open_node(home)
    out = node.run("forget", {"agent": "alpha", "key": "k", "bank": "notes"}).data
    assert any(e["store"].startswith("embeddings:hashed/") for e in out["erased"])
    assert out["vectors_rewritten"] == [{"key": "g", "store": "embeddings:hashed/hashed-v1-384"}]
    erasers = {public_key_str(node.agents.resolve("notes").db.entry(e).author) for e in out["entries"]}
    assert erasers == {str(node.agents.agent("alpha").key.public), admin}
    assert all(m["key"] != "k" for m in recalled(node, "alpha", "notes"))
    # gamma's memory keeps its vector (written again by alpha before the batch was erased).
    assert [m["key"] for m in node.call_tool("gamma", "recall", {"query": other, "bank": "notes"})["memories"]] == ["g"]
    # A key gamma also wrote a version of: alpha (Write) may not erase gamma's writing.
    tool(node, "alpha", "remember", key="shared", value=marker("a"), bank="notes")
    tool(node, "gamma", "remember", key="shared", value=marker("g"), bank="notes")
    before = entries(node, "notes")
    with pytest.raises(AuthError) as err:
        node.run("forget", {"agent": "alpha", "key": "shared", "bank": "notes"})
    assert "some of what holds it was written by other keys" in str(err.value) and entries(node, "notes") == before
    node.close()
    checkpoint(home)
    assert files_holding(home, text) == []
