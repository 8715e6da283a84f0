"""Status, peers, refusals and the auto-recall preview against hand-made situations.

Real homes (SQLite in tmp_path); entries are moved between two homes by hand (the pages sync
would send), so every count is known in advance. The issue's scenario (a peer held back by a
fault-injecting link until it lacks exactly 37 entries) runs two real serve processes.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from memmesh.auth.errors import MemmeshError
from memmesh.node import Node
from memmesh.node.sync.protocol import ExchangeStats
from tests.dbkit import craft, key, rows_update
from tests.procs import processes, until
from tests.test_cli import mm

BANK = "notes"
SYNC_OPS = ("/sync/v1/pull", "/sync/v1/push")


def _node(path: Path, embedder: str = "none") -> Node:
    node, _ = Node.init(path)
    node.run("embedder.set", {"provider": embedder})
    return node


def _bank(status: dict, name: str = BANK) -> dict:
    [d] = [d for d in status["databases"] if name in (d["bank"], d["id"])]
    return d


@pytest.fixture
def a(tmp_path):
    node = _node(tmp_path / "a")
    node.run("agent.new", {"name": "alpha"})
    node.run("agent.new", {"name": "beta"})
    node.run("memory.new", {"name": BANK})
    node.run("memory.grant", {"bank": BANK, "agent": "alpha", "perm": "write"})
    with node:
        yield node


def _copy(src: Node, dst: Node, db_id: str, ids: list[str] | None = None, strip: bool = False,
          source: str = "peer:test") -> None:
    """Give ``dst`` the entries ``ids`` of ``src``'s database (all by default), as a pull would."""
    db = src.database(db_id)
    if db_id not in dst.database_ids():
        dst.storage.add_database(db_id)
    ids = ids if ids is not None else db.missing_for({})
    entries, _n = db.page(ids, 1 << 30)
    if strip:
        entries = [(h, dict.fromkeys(p)) for h, p in entries]
    dst.database(db_id).ingest(entries, source=source)


# ---------------------------------------------------------------------------- bank numbers
def test_grants_are_listed_with_level_priority_status_granter_and_entry(a):
    a.run("memory.grant", {"bank": BANK, "agent": "beta", "perm": "read"})
    a.run("memory.revoke", {"bank": BANK, "agent": "beta"})
    d = _bank(a.run("status", {}).data)
    db = a.database(d["id"])
    by_name = {g["name"]: g for g in d["grants"]}
    assert set(by_name) == {"alpha", "beta", f"bank {BANK}"}
    bank_key = by_name[f"bank {BANK}"]["key"]
    assert by_name[f"bank {BANK}"] == {"key": bank_key, "name": f"bank {BANK}", "level": "admin", "priority": 0,
                                       "status": "active", "granted_by": bank_key, "entry": d["id"]}
    alpha = by_name["alpha"]
    assert (alpha["level"], alpha["status"], alpha["granted_by"]) == ("write", "active", bank_key)
    assert alpha["priority"] == db.permission(alpha["key"]).priority
    assert db.entry(alpha["entry"]).author_key == bank_key  # the grant's own entry
    beta = by_name["beta"]
    assert (beta["status"], beta["level"], beta["granted_by"]) == ("revoked", None, bank_key)
    assert beta["entry"] != alpha["entry"] and db.is_accepted(beta["entry"])
    text = a.run("status", {}).text
    grant_line = [line for line in text.splitlines() if "grants:" in line][-1]
    assert "alpha write(" in grant_line and "beta revoked" in grant_line and f"bank {BANK} admin(0)" in grant_line


def test_entries_authors_pending_and_payload_pending_counts(a, tmp_path):
    for i in range(4):
        a.run("remember", {"agent": "alpha", "key": f"k{i}", "value": f"value {i}", "bank": BANK})
    db_id = _bank(a.run("status", {}).data)["id"]
    src = a.database(db_id)
    order = src.missing_for({})  # T order: parents first
    with _node(tmp_path / "b") as b:
        _copy(a, b, db_id, order[:-3])  # up to the first memory
        _copy(a, b, db_id, order[-2:])  # the last two wait for their parent
        d = _bank(b.run("status", {}).data, db_id)
        assert (d["entries"], d["pending"], d["payload_pending"]) == (len(order) - 3, 2, 0)
        assert d["authors"] == len({src.entry(i).author_key for i in order[:-3]})
        _copy(a, b, db_id, [order[-3]], strip=True)  # the parent arrives without its payload
        d = _bank(b.run("status", {}).data, db_id)
        assert (d["entries"], d["pending"], d["payload_pending"]) == (len(order) - 3, 3, 1)
        assert "pending=3  payload-pending=1" in b.run("status", {}).text
        _copy(a, b, db_id, [order[-3]])  # now whole: the children follow it
        d = _bank(b.run("status", {}).data, db_id)
        assert (d["entries"], d["pending"], d["payload_pending"]) == (len(order), 0, 0)
        assert d["authors"] == 2 and d["heads"] == list(src.heads)


def test_refused_by_reason_and_refusals_paged_newest_first_with_explain(a, tmp_path):
    a.run("remember", {"agent": "alpha", "key": "k", "value": "v", "bank": BANK})
    db_id = _bank(a.run("status", {}).data)["id"]
    src = a.database(db_id)
    with _node(tmp_path / "b") as b:
        _copy(a, b, db_id, src.missing_for({})[:1])  # the root only
        [(header, payloads)], _ = src.page(src.missing_for({})[1:2], 1 << 30)
        forged = [(header[:-1] + bytes([header[-1] ^ (1 + i)]), payloads) for i in range(5)]
        b.database(db_id).ingest(forged[:3], source="peer:ed25519:mallory")
        b.database(db_id).ingest(forged[3:], source="local")
        d = _bank(b.run("status", {}).data, db_id)
        assert d["refused_by_reason"] == {"entry.signature": 5}
        assert d["refused"] == {"peer:ed25519:mallory": {"entry.signature": 3}, "local": {"entry.signature": 2}}

        pages, before = [], None
        while True:
            r = b.run("refusals", {"limit": 2} | ({"before": before} if before is not None else {})).data
            pages.append(r["refusals"])
            before = r["next"]
            if before is None:
                break
        assert [len(p) for p in pages] == [2, 2, 1]
        rows = [row for p in pages for row in p]
        assert len({row["entry"] for row in rows}) == 5
        cursors = [row["cursor"] for row in rows]
        assert cursors == sorted(cursors, reverse=True) and len(set(cursors)) == 5
        assert [row["source"] for row in rows] == ["local"] * 2 + ["ed25519:mallory"] * 3  # newest first
        for row in rows:
            assert row["reason"] == "entry.signature" and row["db"] == db_id and row["bank"] == BANK
            assert row["explain"].startswith(f"{row['entry']} was refused (entry.signature)")
        text = b.run("refusals", {"limit": 2}).text
        assert "entry.signature" in text and "more: memmesh refusals --before" in text
        # A bad signature names no author (the bytes' claim is unproven); a well-signed entry
        # by a key the bank never granted names its author.
        assert all(row["author"] is None for row in rows)
        mallory = key(77)
        bdb = b.database(db_id)
        b_entry = craft(bdb, mallory, {"memory": rows_update(mallory, "memory", 0, [{"key": "x", "value": "y"}])})
        bdb.ingest_entries([b_entry], source="peer:ed25519:mallory")
        [row] = b.run("refusals", {"limit": 1}).data["refusals"]
        assert (row["entry"], row["author"], row["reason"]) == (b_entry.id, str(mallory.public), "auth.unknown_key")

        # bad input: a clear line, nothing written
        for bad, words in (({"limit": 0}, "greater than or equal to 1"), ({"limit": 501}, "less than or equal to 500"),
                           ({"before": -1}, "greater than or equal to 0"), ({"before": "x"}, "before")):
            with pytest.raises(MemmeshError, match=words):
                b.run("refusals", bad)
        assert _bank(b.run("status", {}).data, db_id)["refused_by_reason"] == {"entry.signature": 5,
                                                                               "auth.unknown_key": 1}


def test_recall_share_of_memories_with_a_vector(a):
    a.run("remember", {"agent": "alpha", "key": "k1", "value": "no vector", "bank": BANK})
    a.run("remember", {"agent": "alpha", "key": "k2", "value": "no vector either", "bank": BANK})
    assert _bank(a.run("status", {}).data)["recall"] == {
        "embedder": None, "memories": 2, "with_vectors": 0, "embeddable": 2, "share": None,
        "tiers": {"owner": 0, "peer": 2, "ingested": 0, "flagged": 0, "quarantined": 0},
        "flagged_by_rule": {}, "secrets": 0, "quarantines": {"active": 0, "released": 0}}
    a.run("embedder.set", {"provider": "hashed"})
    a.run("remember", {"agent": "alpha", "key": "k3", "value": "with a vector", "bank": BANK})
    a.run("remember", {"agent": "alpha", "key": "k1", "value": "now with a vector", "bank": BANK})  # supersedes
    r = _bank(a.run("status", {}).data)["recall"]
    assert r["embedder"].startswith("hashed/") and (r["memories"], r["with_vectors"]) == (3, 2)
    assert r["share"] == round(2 / 3, 4)
    assert "3 memories, 2/3 with vectors" in a.run("status", {}).text


# ---------------------------------------------------------------------------- lag
def test_lag_is_counted_from_the_peers_feeds_as_last_seen(a, tmp_path):
    for i in range(5):
        a.run("remember", {"agent": "alpha", "key": f"k{i}", "value": f"v{i}", "bank": BANK})
    db_id = _bank(a.run("status", {}).data)["id"]
    src = a.database(db_id)
    order = src.missing_for({})
    with _node(tmp_path / "b") as b:
        _copy(a, b, db_id, order[:-5])
        peer_a, peer_b = str(a.peer_key.public), str(b.peer_key.public)
        # B saw A's feeds, then the exchange failed (as when pulls are refused)
        b.sync.record_failure(db_id, peer_a, "sync.unreachable: refused",
                              ExchangeStats(peer_feeds=src.feeds(), our_feeds=b.database(db_id).feeds()))
        a.sync.record_failure(db_id, peer_b, "sync.unreachable: refused",
                              ExchangeStats(peer_feeds=b.database(db_id).feeds(), our_feeds=src.feeds()))
        [pb] = _bank(b.run("status", {}).data, db_id)["sync"]["peers"]
        [pa] = _bank(a.run("status", {}).data)["sync"]["peers"]
        assert (pb["we_lack"], pb["peer_lacks"], pb["peer"]) == (5, 0, peer_a)
        assert (pa["we_lack"], pa["peer_lacks"], pa["peer"]) == (0, 5, peer_b)
        assert pb["last_error"].startswith("sync.unreachable") and pb["last_exchange_ms"] is None
        assert _bank(b.run("status", {}).data, db_id)["sync"]["worst_lag"] == 5
        assert f"5 behind {peer_a[:18]}" in b.run("status", {}).text
        # counted against ours now: two arrive from elsewhere
        _copy(a, b, db_id, order[-5:-3])
        [pb] = _bank(b.run("status", {}).data, db_id)["sync"]["peers"]
        assert (pb["we_lack"], pb["peer_lacks"]) == (3, 0)
        # a local write on A that B's feeds (as last seen) do not hold
        a.run("remember", {"agent": "alpha", "key": "k9", "value": "v9", "bank": BANK})
        assert _bank(a.run("status", {}).data)["sync"]["peers"][0]["peer_lacks"] == 6


def test_stale_after_the_configured_time(a, tmp_path):
    (a.home / "config.yaml").write_text("sync:\n  stale_after_s: 0.001\n")
    a.run("reload", {})
    db_id = _bank(a.run("status", {}).data)["id"]
    a.sync.record_failure(db_id, "ed25519:somepeer", "sync.unreachable: down")
    import time
    time.sleep(0.01)
    s = _bank(a.run("status", {}).data)["sync"]
    assert s["stale"] is True and s["stale_since_ms"] is not None
    assert "STALE since" in a.run("status", {}).text
    (a.home / "config.yaml").write_text("sync:\n  stale_after_s: 300\n")
    a.run("reload", {})
    assert _bank(a.run("status", {}).data)["sync"]["stale"] is False


# ---------------------------------------------------------------------------- agents
def test_autorecall_lines_match_the_block_line_for_line(a):
    a.run("remember", {"agent": "alpha", "key": "deploy", "value": "nix build then scp"})
    a.run("remember", {"agent": "alpha", "key": "deploy.bank", "value": "the bank says deploy on fridays",
                       "bank": BANK})
    a.run("remember", {"agent": "alpha", "key": "deploy.rollback", "value": "rollback deploy with nix",
                       "bank": BANK})
    a.run("memory.attach", {"bank": BANK, "agent": "alpha"})
    r = a.run("autorecall", {"agent": "alpha", "messages": ["how do we deploy with nix?"]}).data
    assert r["block"] == a.auto_recall("alpha", ["how do we deploy with nix?"])
    body = [t for t in r["block"].splitlines() if t.startswith("- ")]  # the memory lines, not the frame
    assert [line["text"] for line in r["lines"]] == body and len(body) == 3
    assert [line["bank"] for line in r["lines"]] == [None, BANK, BANK]
    bank_id = _bank(a.run("status", {}).data)["id"]
    assert [line["db"] for line in r["lines"]][1:] == [bank_id, bank_id]
    for line in r["lines"]:
        assert line["key"] in line["text"] and isinstance(line["score"], float) and line["score"] > 0
    bank_scores = [line["score"] for line in r["lines"][1:]]
    assert bank_scores == sorted(bank_scores, reverse=True)
    assert a.run("autorecall", {"agent": "alpha", "messages": ["the of and"]}).data == {"block": "", "lines": [], "not_shown": 0, "not_searched": []}


def test_agent_list_shows_attached_banks_and_autorecall_config(a):
    a.run("memory.attach", {"bank": BANK, "agent": "alpha"})
    a.run("memory.attach", {"bank": BANK, "agent": "beta", "session": "s1"})
    a.run("memory.config", {"agent": "beta", "action": "set", "key": "max_entries", "value": 5})
    rows = {r["name"]: r for r in a.run("agent.list", {}).data["agents"]}
    assert rows["alpha"]["attached"] == {"*": [BANK]} and rows["beta"]["attached"] == {"s1": [BANK]}
    assert rows["alpha"]["config"]["max_entries"] == 3 and rows["beta"]["config"]["max_entries"] == 5
    assert rows["alpha"]["config"]["auto_recall_enabled"] is True
    assert {"name", "id", "key"} <= set(rows["alpha"])
    text = a.run("agent.list", {}).text
    assert "every session: notes" in text and "session s1: notes" in text and "5 per store" in text


# ---------------------------------------------------------------------------- the 37-entry lag
def _link(serve, bank: str = BANK) -> dict | None:
    d = _bank(serve.run("status", {}).data, bank)
    return d["sync"]["peers"][0] if d["sync"]["peers"] else None


@pytest.mark.slow
def test_a_peer_held_back_by_the_link_lacks_exactly_37_on_both_sides_then_0(tmp_path):
    for h in ("a", "b"):
        _node(tmp_path / h).close()
    with processes() as procs:
        pa, pb = procs.proxy(), procs.proxy()
        sa = procs.serve(tmp_path / "a", interval=0.5, advertise=pa.address).start()
        sb = procs.serve(tmp_path / "b", interval=0.5, advertise=pb.address).start()
        for s, p in ((sa, pa), (sb, pb)):
            s.wait_ready()
            p.retarget(s.port)
        sa.run("agent.new", {"name": "w"})
        sa.run("memory.new", {"name": BANK})
        sa.run("memory.grant", {"bank": BANK, "agent": "w", "perm": "write"})
        ticket = sa.run("memory.share", {"bank": BANK, "perm": "admin"}).data["ticket"]
        db_id = sb.run("memory.import", {"ticket": ticket, "perm": "admin"}).data["db"]
        until(lambda: all(_link(s) and _link(s)["last_exchange_ms"] for s in (sa, sb)), 20, "a first exchange")
        before = _bank(sb.run("status", {}).data)["entries"]

        for p in (pa, pb):
            p.refuse_paths(SYNC_OPS)  # feeds go through, no entry moves
        for i in range(37):
            sa.run("remember", {"agent": "w", "key": f"k{i}", "value": f"entry {i}", "bank": BANK})

        def held() -> bool:
            la, lb = _link(sa), _link(sb)
            return la["peer_lacks"] == 37 and lb["we_lack"] == 37

        until(held, 30, lambda: f"37 on both sides: A {_link(sa)}, B {_link(sb)}")
        sa_json = json.loads(mm("--json", "status", home=sa.home).stdout)
        sb_json = json.loads(mm("--json", "status", home=sb.home).stdout)
        [la] = _bank(sa_json)["sync"]["peers"]
        [lb] = _bank(sb_json)["sync"]["peers"]
        assert (la["peer"], la["peer_lacks"], la["we_lack"]) == (sb.node_key, 37, 0)
        assert (lb["peer"], lb["we_lack"], lb["peer_lacks"]) == (sa.node_key, 37, 0)
        assert _bank(sa_json)["sync"]["worst_lag"] == _bank(sb_json)["sync"]["worst_lag"] == 37
        assert _bank(sb_json)["entries"] == before  # nothing moved
        assert la["last_error"] and lb["last_error"]
        assert pa.refused_requests + pb.refused_requests > 0
        human = mm("status", home=sb.home).stdout
        assert f"37 behind {sa.node_key[:18]}" in human and "we lack 37" in human

        for p in (pa, pb):
            p.heal()
        # heal: an exchange now from each side, whatever backoff the failures built up
        sb.run("sync", {"bank": BANK})
        sa.run("sync", {"bank": BANK})
        until(lambda: _link(sa)["peer_lacks"] == 0 and _link(sb)["we_lack"] == 0, 20,
              lambda: f"0 on both sides: A {_link(sa)}, B {_link(sb)}")
        for s in (sa, sb):
            d = _bank(json.loads(mm("--json", "status", home=s.home).stdout))
            [link] = d["sync"]["peers"]
            assert (link["peer_lacks"], link["we_lack"], d["sync"]["worst_lag"]) == (0, 0, 0)
            assert d["entries"] == before + 37 and d["id"] == db_id
            assert "in sync with 1 peer" in mm("status", home=s.home).stdout
        node = json.loads(mm("--json", "status", home=sb.home).stdout)["node"]
        assert node["serving"] and node["listeners"]["sync"] == sb.info["listen"] and node["discovery"] is False
        assert node["uptime_s"] > 0 and node["verify"]["entries"] >= 37 and node["verify"]["per_s"] > 0
        assert node["counts"]["peers"] == 1
        peers = json.loads(mm("--json", "peers", home=sb.home).stdout)["peers"]
        [row] = [r for r in peers if r["key"] == sa.node_key]
        assert row["banks"] == [BANK] and row["connected"] and row["how"] == "ticket"
        # The 37 entries moved either by B pulling (B's link counts bytes in) or by A pushing
        # (A's link counts bytes out): the side that starts an exchange is the one that records it.
        [row_a] = [r for r in json.loads(mm("--json", "peers", home=sa.home).stdout)["peers"]
                   if r["key"] == sb.node_key]
        assert row["bytes_in"] > 0 or row_a["bytes_out"] > 0, (row, row_a)
