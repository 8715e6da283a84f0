"""Conversation history: the raw record, the chunk pyramid, drill-down, replicas, the window, search.

Real homes and real SQLite databases; replicas are fed each other's entries in process.
"""
from __future__ import annotations

import json

import pytest

import memmesh.node.commands.history  # noqa: F401  (registers the commands until node/commands imports it)
from memmesh.auth.ops import GrantOp
from memmesh.crdt.yjs import encode_any
from memmesh.node import Node
from memmesh.node.commands import ParamsError
from memmesh.node.history import service
from memmesh.node.history.record import (
    CHUNKS_STORE,
    HISTORY_STORE,
    TEXT_STORE,
    HistoryInputError,
    UnknownChunk,
    turn_value,
)
from memmesh.node.history.search import search_history
from memmesh.node.history.state import state_of
from tests.dbkit import feed
from tests.homes import alpha_node
from tests.test_cli import mm_here


@pytest.fixture
def n(node):
    """conftest's node: alpha, no embedder."""
    return node


def add(n: Node, text: str, session: str = "s", role: str = "user", agent: str = "alpha") -> dict:
    return n.run("history.add", {"agent": agent, "session": session, "role": role, "text": text}).data


def talk(n: Node, count: int, session: str = "s", start: int = 1) -> None:
    for i in range(start, start + count):
        add(n, f"Turn {i} is about subject{i} and item{i * 7}. It is a plain message.", session,
            "user" if i % 2 else "assistant")


def show(n: Node, level: int | None = None, session: str = "s") -> dict:
    return n.run("history.show", {"agent": "alpha", "session": session, "level": level}).data


def db_of(n: Node):
    return n.agents.agent("alpha").db


# ------------------------------------------------------------------------------ the raw record


def test_a_turn_is_stored_verbatim_with_role_seq_and_trust(n):
    text = "Ça marche: the build uses\n  python 3.12 (not 3.11)."
    out = add(n, text, role="assistant")
    assert out["recorded"] and out["seq"] == 1 and out["trust"] == "derived"
    [turn] = show(n, 0)["items"]
    assert turn["text"] == text and turn["role"] == "assistant" and turn["id"] == out["id"]
    assert turn["written_by"] == str(n.agents.agent("alpha").key.public) and turn["time"].endswith("Z")
    [row] = db_of(n).rows(HISTORY_STORE)
    assert row.value == {"role": "assistant", "seq": 1, "session": "s", "text": row.value["text"]}
    assert text not in repr(db_of(n).rows(TEXT_STORE)[0].value)  # compressed, not the text itself
    assert add(n, "next", role="user")["seq"] == 2 and add(n, "other", session="t")["seq"] == 1


def test_repeated_text_is_stored_once_and_counted_each_time(n):
    for session in ("s", "s", "s", "t"):
        add(n, "Same words again.", session)
    add(n, "Different words.", "s")
    assert len(db_of(n).rows(HISTORY_STORE)) == 5
    assert len(db_of(n).rows(TEXT_STORE)) == 2
    assert [t["text"] for t in show(n, 0)["items"]] == ["Same words again."] * 3 + ["Different words."]
    assert show(n, 0, "t")["turns"] == 1


@pytest.mark.parametrize("params, fragment", [
    ({"session": ""}, "session must be a non-empty string"),
    ({"session": "x" * 513}, "at most 512 characters"),
    ({"text": "   "}, "empty or blank"),
    ({"text": "y" * 65537}, "at most 65536 characters"),
    ({"text": "bad \ud800 text"}, "lone surrogate"),
])
def test_bad_input_is_refused_and_nothing_is_written(n, params, fragment):
    before = len(db_of(n))
    args = {"session": "s", "role": "user", "text": "hello", **params}
    with pytest.raises(HistoryInputError, match=fragment):  # the library's path
        service.add_turn(db_of(n), n.agents.agent("alpha").key, **args)
    with pytest.raises((HistoryInputError, ParamsError)):  # every transport's (JSON has no lone surrogates)
        n.run("history.add", {"agent": "alpha", **args})
    assert len(db_of(n)) == before
    assert all(not db_of(n).rows(store) for store in (HISTORY_STORE, TEXT_STORE, CHUNKS_STORE))


def test_a_bad_role_or_budget_is_refused_by_the_schema(n):
    with pytest.raises(ParamsError, match="role"):
        n.run("history.add", {"agent": "alpha", "session": "s", "role": "system", "text": "hi"})
    with pytest.raises(ParamsError, match="budget"):
        n.run("history.window", {"agent": "alpha", "session": "s", "budget": 0})
    with pytest.raises(ParamsError, match="level"):
        n.run("history.show", {"agent": "alpha", "session": "s", "level": 3})
    assert not db_of(n).rows(HISTORY_STORE)


def test_tool_output_is_recorded_only_when_the_config_says_so(n):
    out = n.run("history.add", {"agent": "alpha", "session": "s", "role": "tool", "text": "ls: 3 files"})
    assert out.data["recorded"] is False and "record_tool_output" in out.warnings[0]
    assert not db_of(n).rows(HISTORY_STORE) and not db_of(n).rows(TEXT_STORE)
    n.run("memory.config", {"agent": "alpha", "action": "set", "key": "record_tool_output", "value": "true"})
    out = n.run("history.add", {"agent": "alpha", "session": "s", "role": "tool", "text": "ls: 3 files"})
    assert out.data["recorded"] is True and out.data["trust"] == "ingested" and not out.warnings
    assert [t["role"] for t in show(n, 0)["items"]] == ["tool"]


# ------------------------------------------------------------------------------ the pyramid


def test_25_turns_give_two_level1_chunks_and_five_raw_turns(n):
    talk(n, 25)
    s = show(n)
    assert (s["turns"], s["level1"], s["level2"]) == (25, 2, 0)
    kinds = [(i["kind"], i.get("from_seq", i.get("seq"))) for i in s["items"]]
    assert kinds == [("chunk", 1), ("chunk", 11)] + [("turn", q) for q in range(21, 26)]
    chunks = show(n, 1)["items"]
    assert [(c["from_seq"], c["to_seq"], len(c["children"])) for c in chunks] == [(1, 10, 10), (11, 20, 10)]
    assert all(c["stored"] and c["by"] == "extractive" and c["summary"] for c in chunks)
    assert len(db_of(n).rows(CHUNKS_STORE)) == 2  # written as the batches completed


def test_100_turns_give_one_level2_chunk_and_drill_down_reaches_every_turn(n):
    talk(n, 100)
    s = show(n)
    assert (s["level1"], s["level2"]) == (10, 1) and [i["level"] for i in s["items"]] == [2]
    top = s["items"][0]
    reached = []
    for child in n.run("history.expand", {"agent": "alpha", "chunk": top["id"]}).data["children"]:
        assert child["kind"] == "chunk" and child["level"] == 1
        turns = n.run("history.expand", {"agent": "alpha", "chunk": child["id"]}).data["children"]
        reached += [(t["seq"], t["id"]) for t in turns]
    assert reached == [(t["seq"], t["id"]) for t in show(n, 0)["items"]] and len(reached) == 100
    assert len(db_of(n).rows(CHUNKS_STORE)) == 11


def test_the_level2_summary_is_made_from_child_summaries_only(n):
    talk(n, 100)
    l1 = show(n, 1)["items"]
    [l2] = show(n, 2)["items"]
    from memmesh.node.history.summary import summarise
    assert l2["summary"] == summarise([c["summary"] for c in l1])
    words = set(" ".join(c["summary"] for c in l1).split())
    assert set(l2["summary"].split()) <= words


def test_a_turn_at_a_taken_seq_makes_a_new_chunk_and_the_old_one_stale(n):
    talk(n, 10)
    [old] = show(n, 1)["items"]
    a = n.agents.agent("alpha")
    digest = db_of(n).rows(HISTORY_STORE)[0].value["text"]
    with a.db.transaction(a.key) as txn:  # what a second writer racing for seq 5 leaves
        txn.append(HISTORY_STORE, turn_value("s", 5, "user", digest))
    [new] = show(n, 1)["items"]
    assert new["id"] != old["id"] and len(new["children"]) == 11 and not new["stored"]
    assert n.run("history.compact", {"agent": "alpha"}).data["written"] == [new["id"]]
    assert show(n, 1)["items"][0]["stored"]
    stale = n.run("history.expand", {"agent": "alpha", "chunk": old["id"]}).data
    assert stale["chunk"]["current"] is False and len(stale["children"]) == 10


def test_expand_names_what_went_wrong(n):
    talk(n, 3)
    turn_id = show(n, 0)["items"][0]["id"]
    with pytest.raises(UnknownChunk, match="is a turn, not a chunk"):
        n.run("history.expand", {"agent": "alpha", "chunk": turn_id})
    with pytest.raises(UnknownChunk, match="no chunk"):
        n.run("history.expand", {"agent": "alpha", "chunk": "chunk:" + "0" * 64})


def test_a_model_summary_is_shown_signed_and_the_extractive_one_kept(n):
    talk(n, 10)
    [c] = show(n, 1)["items"]
    out = n.run("history.summary", {"agent": "alpha", "chunk": c["id"], "text": "The user listed ten subjects."}).data
    assert out["written_by"] == str(n.agents.agent("alpha").key.public)
    [shown] = show(n, 1)["items"]
    assert shown["summary"] == "The user listed ten subjects." and shown["by"] == "model"
    assert shown["extractive"] == c["summary"] and shown["model"]["written_by"] == out["written_by"]
    assert "The user listed ten subjects." in n.run("history.window", {"agent": "alpha", "session": "s",
                                                                        "budget": 80}).data["text"]
    with pytest.raises(ParamsError, match="text must not be blank"):
        n.run("history.summary", {"agent": "alpha", "chunk": c["id"], "text": " "})


def test_malformed_rows_from_elsewhere_are_ignored(n):
    talk(n, 10)
    a = n.agents.agent("alpha")
    with a.db.transaction(a.key) as txn:
        txn.append(HISTORY_STORE, {"session": "s", "seq": 0, "role": "user", "text": "0" * 64})
        txn.append(HISTORY_STORE, {"session": "s", "seq": 11, "role": "king", "text": "0" * 64})
        txn.append(HISTORY_STORE, "not a row")
        txn.append(TEXT_STORE, {"hash": "0" * 64, "z": b"not zlib"})
        txn.append(CHUNKS_STORE, {"id": "chunk:" + "1" * 64, "session": "s", "level": 1, "from_seq": 1,
                                  "to_seq": 10, "children": [], "summary": "forged", "by": "extractive"})
    s = show(n)
    assert s["turns"] == 10 and s["level1"] == 1 and "forged" not in json.dumps(s)
    assert search_history(a.db, "forged", 5) == []


# ------------------------------------------------------------------------------ replicas


def test_two_replicas_compacting_the_same_turns_write_byte_identical_chunks(tmp_path):
    a_home, b_home = Node.open(tmp_path / "a"), Node.open(tmp_path / "b")
    try:
        agent = a_home.agents.create_agent("alpha")
        db_a = agent.db
        db_a.change_settings(agent.key, [GrantOp(str(b_home.peer_key.public), "write", 10)])
        for i in range(1, 106):
            service.add_turn(db_a, agent.key, "s", "user" if i % 3 else "assistant",
                             f"Message {i}: the value of knob{i % 13} is {i * 31}. Sounds good.", compact_after=False)
        b_home.storage.add_database(db_a.id)
        db_b = b_home.database(db_a.id)
        feed(db_b, db_a)
        written_a = service.compact(db_a, agent.key)
        written_b = service.compact(db_b, b_home.peer_key)
        assert written_a == written_b and len(written_a) == 11

        def chunks(db):
            rows = db.rows(CHUNKS_STORE)
            return {r.value["id"]: encode_any(r.value) for r in rows}, {r.author for r in rows}

        (bytes_a, by_a), (bytes_b, by_b) = chunks(db_a), chunks(db_b)
        assert bytes_a == bytes_b and by_a != by_b  # same bytes, each signed by its own writer
        feed(db_a, db_b)
        feed(db_b, db_a)
        assert service.show(db_a, "s") == service.show(db_b, "s")
        assert service.compact(db_a, agent.key) == [] and service.compact(db_b, b_home.peer_key) == []
        assert len(service.show(db_a, "s", 1)["items"]) == 10  # two rows per id, one chunk each
    finally:
        a_home.close()
        b_home.close()


def test_compact_writes_the_chunks_of_turns_received_without_them(n):
    a = n.agents.agent("alpha")
    for i in range(25):
        service.add_turn(a.db, a.key, "s", "user", f"Line {i} of the log.", compact_after=False)
    assert not a.db.rows(CHUNKS_STORE)
    out = n.run("history.compact", {"agent": "alpha", "session": "s"}).data
    assert len(out["written"]) == 2
    assert n.run("history.compact", {"agent": "alpha"}).data["written"] == []


# ------------------------------------------------------------------------------ window and search


def test_the_window_is_newest_turns_then_summaries_within_the_budget(n):
    talk(n, 125)
    for budget in (1, 50, 400, 1500, 4000, 20_000):
        w = n.run("history.window", {"agent": "alpha", "session": "s", "budget": budget}).data
        assert w["chars"] == len(w["text"]) <= budget
    w = n.run("history.window", {"agent": "alpha", "session": "s", "budget": 4000}).data
    assert w["items"][0]["level"] == 2 and w["items"][-1] == {**w["items"][-1], "kind": "turn", "from_seq": 125}
    assert w["text"].startswith("[summary of turns 1-100]") and w["text"].endswith("It is a plain message.")


def test_search_finds_a_planted_turn_and_its_chunk(n):
    talk(n, 14)
    add(n, "The staging database password rotates every Tuesday at 04:00.", role="user")  # seq 15
    talk(n, 10, start=16)
    hits = search_history(db_of(n), "staging database rotates Tuesday", 10)
    kinds = {(h["kind"], h.get("seq"), h.get("from_seq")) for h in hits[:2]}
    assert kinds == {("turn", 15, None), ("chunk", None, 11)}
    assert all(h["past_discussion"] is True and h["session"] == "s" for h in hits)
    chunk = next(h for h in hits if h["kind"] == "chunk")
    children = n.run("history.expand", {"agent": "alpha", "chunk": chunk["id"]}).data["children"]
    assert hits[0]["id"] in {t["id"] for t in children} | {chunk["id"]}
    assert search_history(db_of(n), "", 5) == [] and search_history(db_of(n), "zzqqxx", 5) == []


def test_search_follows_new_rows_and_a_reopened_node_ranks_alike(tmp_path):
    home = tmp_path / "home"
    gen = alpha_node(home)
    n = next(gen)
    talk(n, 12)
    first = search_history(db_of(n), "subject3 item21", 5)
    add(n, "A late remark about subject3 once more.")
    second = search_history(db_of(n), "subject3 item21", 5)
    assert len(second) == len(first) + 1
    assert any(h["text"] == "A late remark about subject3 once more." for h in second)
    old = state_of(db_of(n))
    next(gen, None)  # closes the node
    with Node.open(home) as again:
        assert search_history(again.agents.agent("alpha").db, "subject3 item21", 5) == second
        assert state_of(again.agents.agent("alpha").db) is not old  # rebuilt from the rows


# ------------------------------------------------------------------------------ the CLI


def test_the_cli_adds_shows_expands_and_windows(tmp_path):
    home = tmp_path / "home"
    mm_here("init", home=home)
    mm_here("agent", "new", "alpha", home=home)
    for i in range(1, 12):
        mm_here("history", "add", "alpha", "--session", "chat", "--role", "user" if i % 2 else "assistant",
                f"Message number {i} mentions gadget{i}.", home=home)
    shown = json.loads(mm_here("--json", "history", "show", "alpha", "--session", "chat", home=home).stdout)
    assert shown["level1"] == 1 and [i["kind"] for i in shown["items"]] == ["chunk", "turn"]
    text = mm_here("history", "show", "alpha", "--session", "chat", "--level", "0", home=home).stdout
    assert "Message number 11 mentions gadget11." in text
    chunk = shown["items"][0]["id"]
    expanded = json.loads(mm_here("--json", "history", "expand", "alpha", chunk, home=home).stdout)
    assert [t["seq"] for t in expanded["children"]] == list(range(1, 11))
    window = mm_here("history", "window", "alpha", "--session", "chat", "--budget", "120", home=home).stdout
    assert "gadget11" in window and len(window.rstrip("\n")) <= 120
    refused = mm_here("history", "add", "alpha", "--session", "chat", "--role", "tool", "ls", home=home)
    assert "record_tool_output" in refused.stdout + refused.stderr
    bad = mm_here("history", "add", "alpha", "--session", "chat", "--role", "user", " ", home=home, check=False)
    assert bad.returncode != 0 and "blank" in bad.stderr
    assert json.loads(mm_here("--json", "history", "compact", "alpha", home=home).stdout)["written"] == []


def test_an_erased_turn_leaves_the_history_and_its_chunk_goes_with_it(n):
    talk(n, 12)
    a = n.agents.agent("alpha")
    assert show(n)["level1"] == 1
    first = show(n, 0)["items"][0]
    search_history(a.db, "subject1", 5)  # the index exists: the erase must reach it too
    a.db.erase(a.key, first["id"].rsplit("/", 2)[0], HISTORY_STORE)
    s = show(n)
    assert s["turns"] == 11 and s["level1"] == 0  # seq 1 is gone, so batch 1-10 is not complete
    assert first["id"] not in {h["id"] for h in search_history(a.db, "subject1 item7", 10)}


def test_a_long_sessions_window_ends_with_raw_turns_then_level1_then_level2(n):
    talk(n, 300)  # 30 level-1 chunks, 3 level-2 chunks, no raw tail
    data = n.run("history.window", {"agent": "alpha", "session": "s", "budget": 6000}).data
    text = data["text"]
    assert len(text) <= 6000
    lines = text.split("\n")
    assert lines[-1].startswith("user: Turn 300 ") or lines[-1].startswith("assistant: Turn 300 ")
    levels = [item["level"] for item in data["items"]]
    assert levels == sorted(levels, reverse=True)  # resolution only falls with age
    assert levels[-10:] == [0] * 10 and 1 in levels and levels[0] == 2  # raw, then level 1, then level 2
    seqs = [(item["from_seq"], item["to_seq"]) for item in data["items"]]
    assert all(a[1] + 1 == b[0] for a, b in zip(seqs, seqs[1:]))  # one unbroken stretch to the newest turn
