"""The per-database memory view (node.memory.view) and memory rows (node.memory.rows).

Everything runs on real Databases (MemoryStorage): rows are written with Database.transaction,
remote and malicious rows are signed entries ingested through the full validation pipeline.
"""
from __future__ import annotations

import functools
import logging
import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.crdt.database import Database
from memmesh.crdt.storage import MemoryStorage
from memmesh.node.memory import view_feed as view_module  # where the view parses the rows it is fed
from memmesh.node.memory.bm25 import InvertedIndex
from memmesh.node.memory.rows import (
    MAX_KEY_CHARS,
    MAX_TAG_CHARS,
    MAX_TAGS,
    MAX_VALUE_CHARS,
    MEMORY_STORE,
    Memory,
    MemoryInputError,
    embedding_store,
    embedding_value,
    memory_value,
    parse_embedding,
    parse_memory,
)
from memmesh.node.memory.timeline import Filters
from memmesh.node.memory.tokens import document_text, tokenize
from memmesh.node.memory.vectors import VectorIndex
from memmesh.node.memory.view import MemoryView
from tests.dbkit import craft, feed, grant, key, new_db, next_clock, replica, revoke, rows_update

ADMIN, ALICE, BOB = key(1), key(2), key(3)
STORE = embedding_store("test", "hand-3")


@pytest.fixture
def db() -> Database:
    d = new_db(ADMIN)
    grant(d, ADMIN, ALICE, "write", 10)
    grant(d, ADMIN, BOB, "write", 10)
    return d


def remember(db: Database, who, k: str, v: str, tags=(), vector=None, store: str = STORE) -> str:
    """Write one memory (and its vector, in the same entry); returns the memory's row key."""
    txn = db.transaction(who)
    row = txn.append(MEMORY_STORE, memory_value(k, v, tags))
    if vector is not None:
        txn.append(store, embedding_value(row, np.asarray(vector, dtype=np.float32)))
    txn.commit()
    return row


def keys(memories: list[Memory]) -> list[str]:
    return [m.key for m in memories]


def values(memories: list[Memory]) -> list[str]:
    return [m.value for m in memories]


# ------------------------------------------------------------------------------ basics
def test_remember_and_recall_basics(db):
    view = MemoryView(db)
    assert len(view) == 0 and view.recall("anything") == [] and view.recall() == []
    row = remember(db, ALICE, "coffee order", "oat flat white, no sugar", ["Prefs", "drinks"])
    remember(db, BOB, "standup", "daily at 9:30 in room 4", ["work"])
    assert len(view) == 2
    [m] = view.recall("coffee")
    assert (m.key, m.value, m.tags) == ("coffee order", "oat flat white, no sugar", ("Prefs", "drinks"))
    assert m.author == str(ALICE.public) and m.row_key == row
    assert db.is_accepted(m.entry_id) and m.order[1] == m.entry_id
    d = m.to_dict(bank="personal")
    assert set(d) == {"key", "value", "tags", "time", "written_by", "entry", "bank"}
    assert d["tags"] == ["Prefs", "drinks"] and d["written_by"] == str(ALICE.public)
    assert d["entry"] == m.entry_id and d["bank"] == "personal"
    assert d["time"].endswith("Z") and d["time"][:2] == "20" and "T" in d["time"]
    # The view built from scratch (e.g. after a restart) agrees with the incremental one.
    assert MemoryView(Database.open(db.storage, db.id)).recall("coffee") == [m]
    assert keys(view.recall("room 4 standup")) == ["standup"]


def test_to_dict_time_is_exact_utc_milliseconds():
    m = Memory("k", "v", (), 1_700_000_000_123, "a", "sha256:" + "0" * 64, "1/0", (1, "sha256:" + "0" * 64, 0))
    assert m.to_dict()["time"] == "2023-11-14T22:13:20.123Z"
    assert Memory("k", "v", (), 10**20, "a", "e", "r", (1, "e", 0)).to_dict()["time"] is None


def test_bm25_order_for_a_hand_checked_corpus(db):
    view = MemoryView(db)
    remember(db, ALICE, "cat", "the cat sat on the mat")  # 7 tokens, tf(cat)=2
    remember(db, ALICE, "dog", "a dog chased the cat")  # "a" dropped: 5 tokens, tf(cat)=1
    remember(db, ALICE, "bird", "birds sing")  # 3 tokens
    # N=3, avgdl=5. idf(cat) = ln(1 + 1.5/2.5) = ln 1.6, idf(sing) = ln(1 + 2.5/1.5).
    # cat:  2 / (2 + 1.5 * (0.25 + 0.75 * 7/5)) = 0.5063  -> 0.2380
    # dog:  1 / (1 + 1.5 * (0.25 + 0.75 * 5/5)) = 0.4     -> 0.1880
    # bird: sing 1 / (1 + 1.5 * (0.25 + 0.75 * 3/5)) = 0.4878 -> 0.4785
    assert 2 / 3.95 * math.log(1.6) > 0.4 * math.log(1.6)
    assert keys(view.recall("cat")) == ["cat", "dog"]  # bird matches no token: dropped
    assert keys(view.recall("cat sing")) == ["bird", "cat", "dog"]
    assert keys(view.recall("SING, cat!")) == ["bird", "cat", "dog"]  # tokens are lowercased
    assert keys(view.recall("cat", limit=1)) == ["cat"]


def test_bm25_statistics_cover_current_rows_only(db):
    """Superseded rows leave N, df and avgdl: the ranking is the one over current rows."""
    view = MemoryView(db)
    remember(db, ALICE, "a", "xx pad pad pad pad pad pad")
    remember(db, ALICE, "b", "yy filler")
    for i in range(6):  # old versions of "c" full of yy; the current "c" has none
        remember(db, ALICE, "c", f"yy yy yy version {i}")
    remember(db, ALICE, "c", "zz")
    rows = [parse_memory(r) for r in db.rows(MEMORY_STORE)]
    current = [m for m in rows if "version" not in m.value]

    def oracle(memories):
        ix = InvertedIndex()
        for i, m in enumerate(memories):
            ix.add(i, tokenize(document_text(m.key, m.value, m.tags)))
        return [memories[i].key for i, _ in ix.search(tokenize("xx yy"), limit=None)]

    expected, with_superseded = oracle(current), oracle(rows)
    assert expected == ["b", "a"]
    # Counting the superseded rows would put "a" before "b": the test can tell the two apart.
    assert with_superseded.index("a") < with_superseded.index("b")
    assert keys(view.recall("xx yy")) == expected
    assert keys(MemoryView(db).recall("xx yy")) == expected


# ------------------------------------------------------------------ newest row per key
def test_newest_row_per_key_wins_and_superseded_rows_are_listed_on_request(db):
    view = MemoryView(db)
    remember(db, ALICE, "favourite colour", "blue", ["prefs"])
    remember(db, BOB, "favourite colour", "green", ["prefs"])
    remember(db, ALICE, "pet", "a cat named Blue")
    assert len(view) == 2
    assert values(view.recall("favourite colour")) == ["green"]
    assert values(view.recall("blue")) == ["a cat named Blue"]  # the superseded "blue" row is not a candidate
    assert values(view.recall("", tags=["prefs"])) == ["green"]
    assert values(view.memories()) == ["a cat named Blue", "green"]
    # include_superseded: every row is a candidate, and is listed, newest first.
    # Both rows have 4 tokens and tf(blue)=1: a tie, broken newest first.
    assert values(view.recall("blue", include_superseded=True)) == ["a cat named Blue", "blue"]
    assert values(view.recall("favourite", include_superseded=True)) == ["green", "blue"]
    assert values(view.memories(include_superseded=True)) == ["a cat named Blue", "green", "blue"]
    assert values(view.recall("", include_superseded=True, tags=["prefs"])) == ["green", "blue"]
    # The scan cache follows new writes.
    remember(db, ALICE, "favourite colour", "red", ["prefs"])
    assert values(view.recall("favourite", include_superseded=True)) == ["red", "green", "blue"]
    assert values(view.recall("favourite")) == ["red"]


def test_concurrent_rows_for_one_key_pick_the_same_winner_everywhere(db):
    alice_side, bob_side = replica(db), replica(db)
    va, vb = MemoryView(alice_side), MemoryView(bob_side)
    remember(alice_side, ALICE, "meeting", "tuesday")
    remember(bob_side, BOB, "meeting", "wednesday")
    assert values(va.recall("meeting")) == ["tuesday"] and values(vb.recall("meeting")) == ["wednesday"]
    feed(alice_side, bob_side)
    feed(bob_side, alice_side)
    rows = [parse_memory(r) for r in alice_side.rows(MEMORY_STORE)]
    winner = max(rows, key=lambda m: m.order)  # same height: the larger entry id wins
    assert rows[0].order[0] == rows[1].order[0]
    assert va.recall("meeting") == vb.recall("meeting") == [winner]
    assert va.memories(include_superseded=True) == vb.memories(include_superseded=True)
    assert len(va) == len(vb) == 1


def test_ties_are_broken_by_t_order_newest_first_on_every_replica(db):
    view = MemoryView(db)
    remember(db, ALICE, "k1", "shared words here")
    remember(db, ALICE, "k2", "shared words here")
    remember(db, ALICE, "k3", "shared words here")
    assert keys(view.recall("shared")) == ["k3", "k2", "k1"]
    assert keys(view.recall("shared", limit=2)) == ["k3", "k2"]
    other = replica(db)
    assert keys(MemoryView(other).recall("shared")) == ["k3", "k2", "k1"]


def test_empty_query_is_recency_order_with_tag_filter(db):
    view = MemoryView(db)
    remember(db, ALICE, "first", "one", ["t"])
    remember(db, BOB, "second", "two")
    remember(db, ALICE, "third", "three", ["T"])
    remember(db, ALICE, "first", "one again", ["t"])  # updating moves it to the front
    assert keys(view.recall()) == ["first", "third", "second"]
    assert keys(view.recall("")) == ["first", "third", "second"]
    assert keys(view.recall("a ! ,")) == ["first", "third", "second"]  # no tokens: recency
    assert keys(view.recall("", limit=2)) == ["first", "third"]
    assert keys(view.recall("", tags=["T"])) == ["first", "third"]
    assert [m.key for m in view.memories()] == ["first", "third", "second"]
    for i in range(10):  # now the tag is selective: only the tagged rows are ranked
        remember(db, BOB, f"untagged {i}", "filler")
    assert keys(view.recall("", tags=["t"])) == ["first", "third"]
    assert keys(view.recall("", tags=["t"], limit=1)) == ["first"]
    assert keys(view.recall("", limit=2)) == ["untagged 9", "untagged 8"]


def test_tags_are_an_and_filter_compared_case_insensitively(db):
    view = MemoryView(db)
    remember(db, ALICE, "deploy", "deploy the api on friday", ["Work", "urgent"])
    remember(db, ALICE, "report", "write the friday report", ["work"])
    remember(db, ALICE, "groceries", "buy milk on friday", ["home"])
    # 8, 6 and 6 tokens, tf(friday)=1 each: the shorter rows first, their tie newest first.
    assert keys(view.recall("friday")) == ["groceries", "report", "deploy"]
    assert set(keys(view.recall("friday", tags=["WORK"]))) == {"deploy", "report"}
    assert keys(view.recall("friday", tags=["work", "URGENT"])) == ["deploy"]
    assert keys(view.recall("friday", tags=["wOrK", "home"])) == []
    assert keys(view.recall("", tags=["Home"])) == ["groceries"]
    assert keys(view.recall("", tags=["urg"])) == []  # whole tags only
    assert keys(view.recall("milk", tags=["work"])) == []


def test_nothing_matched_gives_an_empty_list(db):
    view = MemoryView(db)
    remember(db, ALICE, "k", "some value")
    assert view.recall("unrelated") == []
    assert view.recall("unrelated", query_vector=np.ones(3)) == []  # no vectors: BM25 only
    assert view.recall("value", tags=["missing"]) == []


# ------------------------------------------------------------------------------- hybrid
def test_hybrid_fuses_bm25_and_cosine_with_rrf(db):
    view = MemoryView(db, embedding_store=STORE, dim=3)
    remember(db, ALICE, "a", "feline companion", vector=[1, 0, 0])
    remember(db, ALICE, "b", "cat cat toy", vector=[0, 1, 0])
    remember(db, ALICE, "c", "cat food", vector=[0, 0, 1])
    assert view.has_vectors() and view.missing_vectors() == []
    # BM25 alone: b (tf 2) then c; a has no "cat".
    assert keys(view.recall("cat")) == ["b", "c"]
    # Cosine with [1, 0, 0.5]: a 0.894, c 0.447, b 0 (dropped). RRF k=60:
    # c = 1/62 + 1/62 = 0.03226; a = 1/61; b = 1/61 (tie: newer first, b).
    q = np.array([1.0, 0.0, 0.5])
    assert keys(view.recall("cat", query_vector=q)) == ["c", "b", "a"]
    assert keys(view.recall("cat", query_vector=q, limit=1)) == ["c"]
    # Cosine-only matches are found; the tag filter applies to both lists.
    assert keys(view.recall("nothing lexical", query_vector=q)) == ["a", "c"]
    # A query vector of another length, or a zero vector, falls back to BM25.
    assert keys(view.recall("cat", query_vector=np.ones(4))) == ["b", "c"]
    assert keys(view.recall("cat", query_vector=np.zeros(3))) == ["b", "c"]
    # Empty query: recency, the vector is not used.
    assert keys(view.recall("", query_vector=q)) == ["c", "b", "a"]
    # A fresh view, and one on a replica, agree.
    assert keys(MemoryView(replica(db), embedding_store=STORE).recall("cat", query_vector=q)) == ["c", "b", "a"]


def test_rows_without_vectors_are_still_found_by_bm25(db):
    view = MemoryView(db, embedding_store=STORE)
    remember(db, ALICE, "a", "cat sleeping", vector=[1, 0, 0])
    remember(db, ALICE, "nap", "the cat naps all day")  # embedder was down: no vector
    assert keys(view.missing_vectors()) == ["nap"]
    got = keys(view.recall("cat", query_vector=np.array([1.0, 0.0, 0.0])))
    assert got == ["a", "nap"]
    # BM25 alone ranks "a" first too (shorter doc); with a vector pointing away from "a",
    # the row without a vector still appears.
    assert "nap" in keys(view.recall("naps", query_vector=np.array([1.0, 0.0, 0.0])))


def test_vectors_follow_the_active_store_and_late_reindex(db):
    other = embedding_store("test", "other-3")
    view = MemoryView(db)  # no embedder configured
    remember(db, ALICE, "a", "alpha text", vector=[1, 0, 0])
    remember(db, ALICE, "b", "beta text", vector=[0, 1, 0], store=other)
    row_c = remember(db, ALICE, "c", "gamma text")
    q = np.array([0.0, 1.0, 0.0])
    assert not view.has_vectors()
    assert keys(view.recall("text", query_vector=q)) == ["c", "b", "a"]  # BM25 only: a tie, newest first
    view.set_embedding_store(STORE)
    assert view.has_vectors() and keys(view.missing_vectors()) == ["c", "b"]
    view.set_embedding_store(other, dim=3)
    assert keys(view.missing_vectors()) == ["c", "a"]
    assert keys(view.recall("text", query_vector=q))[0] == "b"
    # A reindex writes c's vector later, in another entry (by another author): it is used.
    txn = db.transaction(BOB)
    txn.append(other, embedding_value(row_c, np.array([0.0, 1.0, 0.1], dtype=np.float32)))
    txn.commit()
    assert keys(view.missing_vectors()) == ["a"]
    assert keys(view.recall("text", query_vector=np.array([0.0, 0.1, 1.0])))[0] == "c"
    # A newer vector for the same row replaces the older one.
    txn = db.transaction(BOB)
    txn.append(other, embedding_value(row_c, np.array([-1.0, 0.0, 0.0], dtype=np.float32)))
    txn.commit()
    assert keys(view.recall("nothing", query_vector=np.array([0.0, 0.1, 1.0]))) == ["b"]
    fresh = MemoryView(db, embedding_store=other)
    assert keys(fresh.recall("nothing", query_vector=np.array([0.0, 0.1, 1.0]))) == ["b"]
    view.set_embedding_store(None)
    assert not view.has_vectors()


def test_superseded_rows_lose_their_vectors(db):
    view = MemoryView(db, embedding_store=STORE)
    remember(db, ALICE, "k", "old", vector=[1, 0, 0])
    remember(db, ALICE, "k", "new")  # newer row, no vector
    q = np.array([1.0, 0.0, 0.0])
    assert view.recall("zzz", query_vector=q) == []
    assert keys(view.missing_vectors()) == ["k"] and not view.has_vectors()
    assert values(view.recall("zzz", query_vector=q, include_superseded=True)) == ["old"]


# ------------------------------------------------------------------------ hostile input
BAD_MEMORY_VALUES = [
    "a string instead of an object",
    None,
    [1, 2, 3],
    {"key": "good-key"},  # value missing: must not supersede the good row
    {"value": "no key"},
    {"key": "good-key", "value": "tags not a list", "tags": "urgent"},
    {"key": "good-key", "value": "tag not a string", "tags": [1]},
    {"key": "good-key", "value": "empty tag", "tags": [""]},
    {"key": "good-key", "value": "too many tags", "tags": [f"t{i}" for i in range(MAX_TAGS + 1)]},
    {"key": 5, "value": "key not a string"},
    {"key": "", "value": "empty key"},
    {"key": "   ", "value": "blank key"},
    {"key": "k" * (MAX_KEY_CHARS + 1), "value": "key too long"},
    {"key": "good-key", "value": b"bytes value"},
    {"key": "good-key", "value": 3.5},
    {"key": {"nested": "object"}, "value": "v"},
]


def test_malformed_remote_rows_are_ignored(db, caplog):
    view = MemoryView(db, embedding_store=STORE, dim=3)
    loose = MemoryView(db, embedding_store=STORE)  # no dim: wrong lengths live apart
    good_row = remember(db, ALICE, "good-key", "the good memory", ["ok"], vector=[1, 0, 0])
    bad_embeddings = [
        "not an object",
        {"row": good_row},  # v missing
        {"row": good_row, "v": [1.0, 0.0, 0.0]},  # a list, not bytes
        {"row": good_row, "v": np.array([0, 1, 0, 0, 0], dtype="<f4").tobytes()},  # wrong length
        {"row": good_row, "v": np.array([np.nan, 1, 0], dtype="<f4").tobytes()},  # NaN
        {"row": good_row, "v": b"\x00\x01\x02"},  # not a multiple of 4 bytes
        {"row": 7, "v": np.array([0, 1, 0], dtype="<f4").tobytes()},
        {"v": np.array([0, 1, 0], dtype="<f4").tobytes()},
    ]
    e = craft(db, BOB, {
        MEMORY_STORE: rows_update(BOB, MEMORY_STORE, next_clock(db, BOB, MEMORY_STORE), BAD_MEMORY_VALUES),
        STORE: rows_update(BOB, STORE, next_clock(db, BOB, STORE), bad_embeddings),
    })
    with caplog.at_level(logging.DEBUG, logger="memmesh.node.memory.rows"):
        result = db.ingest([(e.header, dict(e.payloads))])
    assert result.accepted == [e.id]  # the database accepts any value from a writer
    assert "ignoring memory row" in caplog.text and "ignoring embedding row" in caplog.text
    assert len(db.rows(MEMORY_STORE)) == 1 + len(BAD_MEMORY_VALUES)
    q = np.array([1.0, 0.0, 0.0])
    for v in (view, loose, MemoryView(db, embedding_store=STORE, dim=3), MemoryView(replica(db), embedding_store=STORE)):
        assert len(v) == 1
        assert values(v.recall("good")) == ["the good memory"]
        assert values(v.recall("")) == ["the good memory"]
        assert values(v.recall("zzz", query_vector=q)) == ["the good memory"]  # the good vector stays
        assert v.recall("string tags list empty blank nested bytes") == []
        assert values(v.recall("", include_superseded=True)) == ["the good memory"]
        assert v.missing_vectors() == []
    assert view.recall("zzz", query_vector=np.array([0.0, 1.0, 0.0, 0.0, 0.0])) == []
    # Later writes still work and are found.
    remember(db, ALICE, "after", "written after the attack", vector=[0, 1, 0])
    assert keys(view.recall("attack")) == ["after"]


def test_a_listener_failure_never_breaks_the_database(db, monkeypatch):
    view = MemoryView(db)
    real = view_module.parse_memory
    calls = {"n": 0}

    def flaky(record):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("bug")
        return real(record)

    monkeypatch.setattr(view_module, "parse_memory", flaky)
    remember(db, ALICE, "k", "still stored")  # the view's bug does not fail the write
    assert values(view.recall("stored")) == ["still stored"]  # rebuilt on the next call


def test_revocation_that_voids_rows_removes_them_from_recall():
    d = new_db(ADMIN)
    grant(d, ADMIN, ALICE, "write", 10)
    remember(d, ALICE, "plan", "plan A, agreed")
    alice_side = replica(d)
    view = MemoryView(alice_side)
    revoke(d, ADMIN, ALICE)  # the admin has not seen what Alice writes next
    remember(alice_side, ALICE, "plan", "plan B, written while being revoked")
    remember(alice_side, ALICE, "extra", "extra note while being revoked")
    assert values(view.recall("plan")) == ["plan B, written while being revoked"]
    assert len(view) == 2
    feed(alice_side, d)  # the revocation arrives: Alice's concurrent writes are voided (Rebuilt)
    assert values(view.recall("plan")) == ["plan A, agreed"]  # the older row is current again
    assert view.recall("extra") == [] and len(view) == 1
    assert values(view.recall("plan", include_superseded=True)) == ["plan A, agreed"]
    assert view.recall("plan") == MemoryView(d).recall("plan")


def test_erased_payload_leaves_recall(db):
    view = MemoryView(db)
    e1 = db.transaction(ALICE)
    e1.append(MEMORY_STORE, memory_value("secret", "password hunter2"))
    entry = e1.commit()
    remember(db, ALICE, "other", "a normal password hint")
    assert len(view.recall("password")) == 2
    db.erase(ADMIN, entry, MEMORY_STORE)
    assert keys(view.recall("password")) == ["other"] and len(view) == 1


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("limit", [0, 1001, -1, True, "5", 5.0, None])
def test_limit_is_validated(db, limit):
    view = MemoryView(db)
    with pytest.raises(MemoryInputError, match="limit must be an integer from 1 to 1000"):
        view.recall("x", limit=limit)


def test_limit_bounds_and_other_recall_arguments(db):
    view = MemoryView(db)
    for i in range(105):
        remember(db, ALICE, f"k{i}", "common text")
    assert len(view.recall("common", limit=100)) == 100
    assert len(view.recall("", limit=1)) == 1
    assert len(view.recall("common")) == 10  # the default
    with pytest.raises(MemoryInputError, match="tags must be a list"):
        view.recall("x", tags="work")
    with pytest.raises(MemoryInputError, match="non-empty string"):
        view.recall("x", tags=["ok", 3])
    with pytest.raises(MemoryInputError, match="query must be a string"):
        view.recall(5)
    with pytest.raises(MemoryInputError, match="query_vector"):
        view.recall("x", query_vector=np.array([[1.0, 2.0]]))
    with pytest.raises(MemoryInputError, match="query_vector"):
        view.recall("x", query_vector=np.array([1.0, np.inf]))
    with pytest.raises(MemoryInputError, match="embeddings store"):
        view.set_embedding_store("memory")
    with pytest.raises(MemoryInputError, match="embeddings store"):
        MemoryView(db, embedding_store="embeddings:Bad/Upper")


def test_memory_value_validation():
    assert memory_value("k", "v") == {"key": "k", "value": "v", "tags": []}
    assert memory_value("k", "v", None)["tags"] == []
    assert memory_value("k", "v", ("Work", "urgent", "WORK", "work", "Urgent"))["tags"] == ["Work", "urgent"]
    assert memory_value("k", "v", iter(["a"]))["tags"] == ["a"]
    assert memory_value("k" * MAX_KEY_CHARS, "v" * MAX_VALUE_CHARS, [f"t{i}" for i in range(MAX_TAGS)])
    cases = [
        (("", "v"), "key must be a non-empty string of at most 512 characters"),
        ((" \t", "v"), "key must be a non-empty string"),
        (("k" * (MAX_KEY_CHARS + 1), "v"), "at most 512 characters (got 513 characters)"),
        ((None, "v"), "key must be a non-empty string"),
        (("k", ""), "value must be a non-empty string of at most 65536 characters"),
        (("k", "v" * (MAX_VALUE_CHARS + 1)), "value must be"),
        (("k", 5), "value must be"),
        (("k\ud800", "v"), "lone surrogate"),
        (("k", "v", "work"), "tags must be a list of strings"),
        (("k", "v", 5), "tags must be a list of strings"),
        (("k", "v", {"work": True}), "tags must be a list of strings"),
        (("k", "v", ["ok", ""]), "tag 2 must be a non-empty string of at most 64 characters"),
        (("k", "v", ["x" * (MAX_TAG_CHARS + 1)]), "tag 1 must be"),
        (("k", "v", [f"t{i}" for i in range(MAX_TAGS + 1)]), "at most 32 different tags"),
    ]
    for args, message in cases:
        with pytest.raises(MemoryInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
            memory_value(*args)
    # Duplicates are removed before counting.
    assert len(memory_value("k", "v", [f"T{i}" for i in range(MAX_TAGS)] + ["t0"])["tags"]) == MAX_TAGS


def test_embedding_rows_round_trip_and_store_names():
    assert embedding_store("hashed", "hashed-v1-256") == "embeddings:hashed/hashed-v1-256"
    for provider, model in [("", "m"), ("p", ""), ("Open/AI", "m"), ("openai", "Text-Embedding"), ("p", "m" * 200)]:
        with pytest.raises(MemoryInputError):
            embedding_store(provider, model)
    vec = np.array([0.5, -1.25, 3.0], dtype=np.float64)
    value = embedding_value("123/4", vec)
    assert value["v"] == np.array([0.5, -1.25, 3.0], dtype="<f4").tobytes()
    from memmesh.crdt.database import RowRecord

    rec = RowRecord(STORE, "9/0", value, "sha256:" + "a" * 64, "author", 0, (1, "sha256:" + "a" * 64, 0))
    row, got = parse_embedding(rec, 3)
    assert row == "123/4" and got.dtype == np.float32 and got.tolist() == [0.5, -1.25, 3.0]
    assert parse_embedding(rec, 4) is None and parse_embedding(rec, None)[0] == "123/4"
    for bad in ([[1.0]], np.array([]), np.array([np.nan]), np.array([1e39])):
        with pytest.raises(MemoryInputError):
            embedding_value("r", bad)
    with pytest.raises(MemoryInputError):
        embedding_value("", vec)


# ------------------------------------------------------------- convergence (property)
WORDS = ["apple", "banana", "cherry", "delta", "echo", "fig"]
MKEYS = ["k0", "k1", "k2", "k3"]
TAGS = ["Red", "red", "Blue", "green"]
ENTITIES = ["Billing", "billing", "Helm"]
WRITERS = [ADMIN, ALICE, BOB]

op_strategy = st.tuples(
    st.integers(0, 2),  # author
    st.sampled_from(MKEYS),
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=4),
    st.lists(st.sampled_from(TAGS), max_size=2),
    st.one_of(st.none(), st.lists(st.integers(-2, 2), min_size=3, max_size=3)),
    st.integers(0, 5),  # < 3: afterwards sync this author's replica to replica n
    st.lists(st.sampled_from(ENTITIES), max_size=2),
    st.one_of(st.none(), st.integers(1, 10)),  # importance
)


# Candidate depth = the cosine list's depth (100): the bulk below puts the cut inside tie groups.
_QUANTISED = functools.partial(VectorIndex, quantise_from=0, candidate_factor=1, candidate_min=1)
BULK = 130  # memories with vectors written first: more than the cosine list's depth


def _fresh(db_id: str) -> Database:
    storage = MemoryStorage()
    storage.add_database(db_id)
    return Database(storage, db_id)


def _observe(view: MemoryView, rnd: random.Random) -> list:
    out: list = [view.memories(), view.memories(include_superseded=True), view.missing_vectors(), len(view)]
    queries = [""] + WORDS + [" ".join(rnd.sample(WORDS, 2)) for _ in range(4)] + ["nothing"]
    for q in queries:
        for tags in ([], ["RED"], ["blue", "GREEN"]):
            for qv in (None, np.array([1.0, 0.0, 0.0]), np.array([0.3, -1.0, 0.5])):
                for sup in (False, True):
                    # A seeded share of the combinations per example (the same for every view
                    # compared): across the examples every one is asked, at a third of the cost.
                    if rnd.random() < 0.35:
                        out.append(view.recall(q, tags=tags, limit=rnd.randint(1, 6), query_vector=qv,
                                               include_superseded=sup))
        for about in (("BILLING",), ("billing", "helm")):
            out.append(view.recall(q, limit=rnd.randint(1, 6), filters=Filters(entities=about)))
    out += [view.entities(include_secrets=True), view.has_scores()]
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op_strategy, min_size=1, max_size=25), st.randoms(use_true_random=False))
def test_replicas_fed_in_any_order_return_identical_rankings(ops, rnd):
    root = new_db(ADMIN)
    grant(root, ADMIN, ALICE, "write", 10)
    grant(root, ADMIN, BOB, "write", 10)
    replicas = [root, replica(root), replica(root)]
    # Concurrent entries of the three writers: each replica fed in another order stores these rows
    # at other positions. Few distinct directions: exact ties in the codes and in the cosines; more
    # positive cosines than the list's depth, so the cut decides (else the pass widens to all rows).
    for i in range(0, BULK, 10):
        who = i // 10 % 3
        txn = replicas[who].transaction(WRITERS[who])
        for j in range(i, min(BULK, i + 10)):
            row = txn.append(MEMORY_STORE, memory_value(f"b{j}", rnd.choice(WORDS), []))
            vec = [rnd.randint(1, 2), rnd.randint(-1, 1), rnd.randint(0, 1)]  # mostly positive cosines
            txn.append(STORE, embedding_value(row, np.array(vec, dtype=np.float32)))
        txn.commit()
    for author, k, words, tags, vec, sync_to, entities, importance in ops:
        txn = replicas[author].transaction(WRITERS[author])
        row = txn.append(MEMORY_STORE, memory_value(k, " ".join(words), tags, entities=entities or None,
                                                    importance=importance))
        if vec is not None:
            txn.append(STORE, embedding_value(row, np.asarray(vec, dtype=np.float32)))
        txn.commit()
        if sync_to < 3:
            feed(replicas[sync_to], replicas[author])
    entries: dict[str, tuple] = {}
    for d in replicas:
        for s in d.storage.entries(d.id):
            entries.setdefault(s.id, (s.header, dict(s.payloads)))
    delivery = list(entries.values())

    # Two fresh replicas with views attached before anything arrives, fed in shuffled batches.
    # Each also has a view whose vector blocks take the quantised first pass from the first row,
    # with as many candidates as the limit (node/memory/vectors.py): its cut must not depend on
    # where the rows sit in the matrix either.
    views, quantised = [], []
    for _ in range(2):
        target = _fresh(root.id)
        views.append(MemoryView(target, embedding_store=STORE, dim=3))
        quantised.append(MemoryView(target, embedding_store=STORE, dim=3, vector_index=_QUANTISED))
        order = delivery[:]
        rnd.shuffle(order)
        i = 0
        while i < len(order):
            size = rnd.randint(1, 4)
            target.ingest(order[i:i + size])
            i += size
        assert target.storage.pending(root.id) == []
    views.append(MemoryView(views[0].db, embedding_store=STORE))  # built from scratch, no dim
    quantised.append(MemoryView(views[0].db, embedding_store=STORE, vector_index=_QUANTISED))

    # The current set is exactly the newest well-formed row per key.
    newest: dict[str, Memory] = {}
    for r in views[0].db.rows(MEMORY_STORE):
        m = parse_memory(r)
        if m.key not in newest or m.order > newest[m.key].order:
            newest[m.key] = m
    assert sorted(views[0].memories(), key=lambda m: m.key) == sorted(newest.values(), key=lambda m: m.key)

    seed = rnd.random()
    observed = [_observe(v, random.Random(seed)) for v in views]
    assert observed[0] == observed[1] == observed[2]
    observed = [_observe(v, random.Random(seed)) for v in quantised]
    assert observed[0] == observed[1] == observed[2]


# ------------------------------------------------------ bulk rebuild == incremental feed
REBUILD_WORDS = WORDS + ["gamma", "hotel", "india"]

rebuild_op = st.one_of(
    # remember: author, key, words, tags, vector (length 3 or 4, or none)
    st.tuples(st.just("remember"), st.integers(0, 2), st.sampled_from(MKEYS + ["k4", "k5"]),
              st.lists(st.sampled_from(REBUILD_WORDS), min_size=1, max_size=5),
              st.lists(st.sampled_from(TAGS), max_size=3),
              st.one_of(st.none(), st.lists(st.integers(-2, 2), min_size=3, max_size=4))),
    # reindex: a later vector for an earlier row (chosen by index), in its own entry
    st.tuples(st.just("reindex"), st.integers(0, 2), st.integers(0, 50),
              st.lists(st.integers(-2, 2), min_size=3, max_size=4)),
    # batch: several memories (and vectors) in one entry, maybe the same key twice
    st.tuples(st.just("batch"), st.integers(0, 2),
              st.lists(st.tuples(st.sampled_from(MKEYS), st.lists(st.sampled_from(REBUILD_WORDS), min_size=1,
                                                                  max_size=3)), min_size=1, max_size=4)),
    # a malformed memory row and a malformed / non-finite vector, from a writer
    st.tuples(st.just("hostile"), st.integers(0, 50)),
)


def _by_row(view: MemoryView, hits) -> list:
    return [(view._ix.mem[d].row_key, s) for d, s in hits]


def _view_state(view: MemoryView, rnd: random.Random) -> list:
    out: list = _observe(view, rnd)
    for q in ["apple", "gamma hotel", "india echo fig", "k0", "red blue"]:
        out.append(view.recall(q, limit=7, query_vector=np.array([0.5, 1.0, -1.0, 2.0])))
        # Exact BM25 and cosine scores, by row key (local doc ids may differ).
        out.append(sorted(_by_row(view, view._ix.bm25.search(tokenize(q), limit=None))))
    for dim, index in sorted(view._ix.vectors.items()):
        if not len(index):  # an emptied index (fed) and none at all (rebuilt) answer alike
            continue
        for q in (np.arange(1.0, dim + 1), -np.ones(dim)):
            out.append((dim, sorted(_by_row(view, index.search(q, limit=None)))))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(rebuild_op, min_size=1, max_size=30), st.randoms(use_true_random=False))
def test_a_view_rebuilt_from_scratch_equals_one_fed_incrementally(ops, rnd):
    db = new_db(ADMIN)
    grant(db, ADMIN, ALICE, "write", 10)
    grant(db, ADMIN, BOB, "write", 10)
    fed = [MemoryView(db, embedding_store=STORE), MemoryView(db, embedding_store=STORE, dim=3)]
    row_keys: list[str] = []
    for op in ops:
        who = BOB if op[0] == "hostile" else WRITERS[op[1]]
        if op[0] == "remember":
            _, _, k, words, tags, vec = op
            row_keys.append(remember(db, who, k, " ".join(words), tags, vector=vec))
        elif op[0] == "reindex" and row_keys:
            txn = db.transaction(who)
            txn.append(STORE, embedding_value(row_keys[op[2] % len(row_keys)], np.array(op[3], dtype=np.float32)))
            txn.commit()
        elif op[0] == "batch":
            txn = db.transaction(who)
            for i, (k, words) in enumerate(op[2]):
                row = txn.append(MEMORY_STORE, memory_value(k, " ".join(words), ["batch"] if i % 2 else []))
                txn.append(STORE, embedding_value(row, np.array([i, 1, -1], dtype=np.float32)))
                row_keys.append(row)
            txn.commit()
        elif op[0] == "hostile":
            target = row_keys[op[1] % len(row_keys)] if row_keys else "0/0"
            e = craft(db, who, {
                MEMORY_STORE: rows_update(who, MEMORY_STORE, next_clock(db, who, MEMORY_STORE),
                                          [{"key": "k0", "value": "bad tags", "tags": [""]}]),
                STORE: rows_update(who, STORE, next_clock(db, who, STORE), [
                    {"row": target, "v": np.array([np.inf, 0, 0], dtype="<f4").tobytes()},
                    {"row": target, "v": b"\x00\x01"},
                ]),
            })
            assert db.ingest([(e.header, dict(e.payloads))]).accepted == [e.id]
    # A replica fed the entries in shuffled batches (vectors may arrive before their rows).
    other = _fresh(db.id)
    fed.append(MemoryView(other, embedding_store=STORE))
    delivery = [(s.header, dict(s.payloads)) for s in db.storage.entries(db.id)]
    rnd.shuffle(delivery)
    for i in range(0, len(delivery), 3):
        other.ingest(delivery[i:i + 3])
    built = [MemoryView(db, embedding_store=STORE), MemoryView(db, embedding_store=STORE, dim=3),
             MemoryView(other, embedding_store=STORE)]
    seed = rnd.random()
    for a, b in zip(fed, built):
        assert not a._stale  # really fed incrementally, never rebuilt
        assert _view_state(a, random.Random(seed)) == _view_state(b, random.Random(seed))
    # A stale view rebuilds (bulk) into the same state; switching stores reloads vectors in bulk.
    fed[0]._stale = True
    assert _view_state(fed[0], random.Random(seed)) == _view_state(built[0], random.Random(seed))
    fed[1].set_embedding_store(STORE, dim=3)
    assert _view_state(fed[1], random.Random(seed)) == _view_state(built[1], random.Random(seed))


def test_rebuild_bulk_path_matches_incremental_on_a_larger_bank():
    # Enough memories for the bulk indexes to use their chunked paths (more documents than
    # one add_many chunk, more vectors than one normalisation block).
    db = new_db(ADMIN)
    fed = MemoryView(db, embedding_store=STORE, dim=3)
    rnd = random.Random(11)
    words = [f"w{i}" for i in range(300)] + WORDS
    for start in range(0, 5000, 250):
        txn = db.transaction(ADMIN)
        for i in range(start, start + 250):
            k = f"key{i}" if rnd.random() < 0.9 else f"key{rnd.randrange(i + 1)}"  # some superseded rows
            row = txn.append(MEMORY_STORE, memory_value(k, " ".join(rnd.choices(words, k=rnd.randint(1, 12))),
                                                        rnd.sample(TAGS, rnd.randint(0, 2))))
            if rnd.random() < 0.9:
                txn.append(STORE, embedding_value(row, np.array([rnd.gauss(0, 1) for _ in range(3)], dtype=np.float32)))
        txn.commit()
    built = MemoryView(db, embedding_store=STORE, dim=3)
    assert len(built) == len(fed) > 4096
    for q in ["w1 w2", "apple", "w299 banana w7", "key17", ""]:
        for tags in ([], ["red"]):
            for qv in (None, np.array([1.0, -0.5, 0.25])):
                assert built.recall(q, tags=tags, limit=100, query_vector=qv) == fed.recall(
                    q, tags=tags, limit=100, query_vector=qv)
        assert sorted(_by_row(built, built._ix.bm25.search(tokenize(q), limit=None))) == sorted(
            _by_row(fed, fed._ix.bm25.search(tokenize(q), limit=None)))
    assert built.missing_vectors() == fed.missing_vectors()
    assert built._ix.vectors[3].capacity == len(built._ix.vectors[3])  # sized exactly


# ------------------------------------------------------------------- row parsing paths
def _reference_check_tags(tags):
    """The tag rules stated one tag at a time (as memory_value documents them)."""
    if tags is None:
        return ()
    if isinstance(tags, (str, bytes)) or not isinstance(tags, (list, tuple)):
        raise MemoryInputError("tags must be a list of strings")
    out, seen = [], set()
    for tag in tags:
        if not isinstance(tag, str) or not tag or len(tag) > MAX_TAG_CHARS or tag.isspace():
            raise MemoryInputError("bad tag")
        try:
            tag.encode("utf-8")
        except UnicodeEncodeError:
            raise MemoryInputError("lone surrogate") from None
        if tag.casefold() not in seen:
            seen.add(tag.casefold())
            out.append(tag)
    if len(out) > MAX_TAGS:
        raise MemoryInputError("too many")
    return tuple(out)


_tag = st.one_of(
    st.sampled_from(["a", "A", "work", "WORK", "Straße", "STRASSE", " ", "\t", "", "\ud800", "x\udfff", "é", "É"]),
    st.text(max_size=3),
    st.text(alphabet="ab", min_size=MAX_TAG_CHARS - 1, max_size=MAX_TAG_CHARS + 1),
    st.integers(), st.none(), st.binary(max_size=2),
)


@settings(max_examples=500)
@given(st.one_of(st.lists(_tag, max_size=6), st.lists(_tag, max_size=6).map(tuple),
                 st.lists(st.sampled_from([f"t{i}" for i in range(40)] + ["T1", "T2"]), max_size=40),
                 st.none(), st.text(max_size=3), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2)))
def test_tag_check_fast_path_is_as_strict_as_the_rules(tags):
    from memmesh.node.memory.rows import _check_tags

    try:
        expected = _reference_check_tags(tags)
    except MemoryInputError:
        with pytest.raises(MemoryInputError):
            _check_tags(tags)
        return
    got = _check_tags(tags)
    assert got == expected and type(got) is tuple and all(type(a) is type(b) for a, b in zip(got, expected))


def test_parse_embeddings_gives_parse_embedding_verdicts(caplog):
    from memmesh.crdt.database import RowRecord
    from memmesh.node.memory.rows import parse_embeddings

    eid = "sha256:" + "b" * 64
    rnd = random.Random(4)
    values = []
    for i in range(3000):
        n = rnd.choice([3, 3, 3, 4])
        vec = np.array([rnd.gauss(0, 1) for _ in range(n)], dtype="<f4")
        if rnd.random() < 0.05:
            vec[rnd.randrange(n)] = rnd.choice([np.nan, np.inf, -np.inf])
        values.append(rnd.choice([
            {"row": f"1/{i}", "v": vec.tobytes()}, {"row": f"1/{i}", "v": vec.tobytes()},
            {"row": f"1/{i}", "v": vec.tobytes()}, "junk", {"row": "", "v": vec.tobytes()},
            {"row": f"1/{i}", "v": vec.tobytes()[:-1]}, {"row": f"1/{i}", "v": b""},
            {"row": f"1/{i}", "v": list(vec)},
        ]))
    records = [RowRecord(STORE, f"2/{i}", v, eid, "author", 0, (1, eid, i)) for i, v in enumerate(values)]
    for dim in (None, 3, 4):
        with caplog.at_level(logging.DEBUG, logger="memmesh.node.memory.rows"):
            caplog.clear()
            one = [parse_embedding(r, dim) for r in records]
            logs_one = sorted(caplog.messages)
            caplog.clear()
            many = parse_embeddings(records, dim)
            logs_many = sorted(caplog.messages)
        assert logs_many == logs_one
        assert len(many) == len(one) and any(p is None for p in one) and any(p is not None for p in one)
        for a, b in zip(one, many):
            assert (a is None) == (b is None)
            if a is not None:
                assert a[0] == b[0] and b[1].dtype == np.float32 and a[1].tobytes() == b[1].tobytes()
    assert parse_embeddings([], 3) == []
