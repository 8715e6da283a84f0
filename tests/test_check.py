"""`memmesh check [--repair]`: every kind of damage found and named, repairs that move damage aside
and say exactly what was lost, the salvage of a damaged SQLite file, a sync server that never
hands out damaged bytes, and (slow) a repair from a peer across two real `serve` processes.

Damage is done the way a disk does it: bytes of the real node.sqlite changed behind memmesh's
back (plain SQL on the file, or pages overwritten), key files changed on disk.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from memmesh.crdt.database import Database
from memmesh.crdt.entry import id_of
from memmesh.node import Node
from memmesh.node.integrity import CheckRefused
from memmesh.node.library import run_in_home
from memmesh.node.storage import SqliteStorage
from tests.homes import agent_with_bank
from tests.procs import processes, until
from tests.test_cli import mm

BANK = "notes"
NOTES = 40  # enough entries that the entries table spans several pages


# ----------------------------------------------------------------------------- a home to damage


def _build(home: Path) -> None:
    node, _ = Node.init(home)
    with node:
        node.run("embedder.set", {"provider": "none"})
        agent_with_bank(node.run, bank=BANK)
        for i in range(NOTES):
            node.call_tool("alpha", "remember", {"key": f"note.{i}", "value": f"note {i} about the deploy", "bank": BANK})
        for i in range(4):
            node.call_tool("alpha", "remember", {"key": f"own.{i}", "value": f"alpha's own memory {i}"})


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("template") / "home"
    _build(home)
    return home


@pytest.fixture
def home(template: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "home"
    shutil.copytree(template, copy)
    return copy


def _raw(home: Path) -> sqlite3.Connection:
    return sqlite3.connect(home / "node.sqlite", isolation_level=None)


def _db_id(home: Path, name: str) -> str:
    conn = _raw(home)
    try:
        for ns in ("banks", "agents"):
            row = conn.execute("SELECT value FROM local WHERE ns = ? AND key = ?", (ns, name)).fetchone()
            if row:
                return json.loads(row[0])["db_id"]
    finally:
        conn.close()
    raise AssertionError(name)


def _log(home: Path, name: str) -> list[tuple[int, str]]:
    """(seq, id) of a database's stored entries, in storage order."""
    conn = _raw(home)
    try:
        return conn.execute("SELECT e.seq, e.id FROM entries e JOIN databases d ON d.seq = e.db WHERE d.db_id = ? "
                            "ORDER BY e.seq", (_db_id(home, name),)).fetchall()
    finally:
        conn.close()


def _descendants(home: Path, name: str, entry_id: str) -> set[str]:
    """The entry and every stored entry whose causal past holds it (read before the damage)."""
    storage = SqliteStorage(home / "node.sqlite")
    try:
        db = Database.open(storage, _db_id(home, name))
        return {entry_id} | {i for i in db.accepted_ids() | set(db._nodes) if db.precedes(entry_id, i)}
    finally:
        storage.close()


def _flip_header(home: Path, seq: int, at: int = 40) -> None:
    conn = _raw(home)
    header = bytearray(conn.execute("SELECT header FROM entries WHERE seq = ?", (seq,)).fetchone()[0])
    header[at] ^= 0xFF
    conn.execute("UPDATE entries SET header = ? WHERE seq = ?", (bytes(header), seq))
    conn.close()


def _flip_payload(home: Path, seq: int, store: str = "memory") -> None:
    conn = _raw(home)
    data = bytearray(conn.execute("SELECT data FROM payloads WHERE entry = ? AND store = ?", (seq, store)).fetchone()[0])
    data[len(data) // 2] ^= 0x01
    conn.execute("UPDATE payloads SET data = ? WHERE entry = ? AND store = ?", (bytes(data), seq, store))
    conn.close()


def _check(home: Path, repair: bool = False) -> dict:
    result = run_in_home(home, "check", {"repair": repair})
    assert result.exit_code == (0 if result.data["healthy"] else 1)
    return result.data


def _problems(data: dict, name: str | None = None) -> list[dict]:
    out = list(data["storage"]["problems"]) + data["keys"]["problems"] + data["local"]
    for d in data["databases"]:
        if name is None or d["name"] == name:
            out += d["problems"]
    return out


def _codes(data: dict, name: str | None = None) -> dict[str, list[dict]]:
    by: dict[str, list[dict]] = {}
    for p in _problems(data, name):
        by.setdefault(p["code"], []).append(p)
    return by


def _database(data: dict, name: str) -> dict:
    [d] = [d for d in data["databases"] if d["name"] == name]
    return d


def _file_digest(home: Path) -> str:
    return hashlib.sha256((home / "node.sqlite").read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- healthy


def test_a_healthy_home_is_healthy(home):
    out = mm("check", home=home)
    assert out.returncode == 0 and out.stdout.rstrip().endswith("verdict: healthy"), out
    assert "SQLite integrity check ok" in out.stdout and f"bank {BANK}" in out.stdout and "agent alpha" in out.stdout
    data = _check(home)
    assert data["healthy"] and not data["found_damage"] and _problems(data) == []
    total = sum(len(_log(home, n)) for n in (BANK, "alpha"))
    assert data["entries"] == data["signatures"] == total
    assert _database(data, BANK)["kind"] == "bank" and _database(data, "alpha")["kind"] == "agent"
    assert data["keys"]["checked"] == 3  # peer, alpha, the bank's own key


# ----------------------------------------------------------------------------- each kind of damage


def _damage_header(home):
    seq, entry_id = _log(home, BANK)[10]
    expected = _descendants(home, BANK, entry_id)
    _flip_header(home, seq)
    return {"entry.id": {entry_id}, "entry.orphaned": expected - {entry_id}}


def _damage_payload(home):
    seq, entry_id = _log(home, BANK)[12]
    _flip_payload(home, seq)
    return {"entry.payload": {entry_id}}


def _damage_missing_parent(home):
    seq, entry_id = _log(home, BANK)[8]
    expected = _descendants(home, BANK, entry_id)
    conn = _raw(home)
    conn.execute("DELETE FROM payloads WHERE entry = ?", (seq,))
    conn.execute("DELETE FROM entries WHERE seq = ?", (seq,))
    conn.close()
    return {"entry.parent_missing": {entry_id}, "entry.orphaned": expected - {entry_id}}


def _damage_signature(home):
    """Header bytes and id column changed together: consistent with its id, not with its author."""
    seq, entry_id = _log(home, BANK)[14]
    expected = _descendants(home, BANK, entry_id)
    conn = _raw(home)
    header = bytearray(conn.execute("SELECT header FROM entries WHERE seq = ?", (seq,)).fetchone()[0])
    header[-5] ^= 0x10  # inside the signature
    forged = id_of(bytes(header))
    conn.execute("UPDATE entries SET header = ?, id = ? WHERE seq = ?", (bytes(header), forged, seq))
    conn.close()
    # Its children name the real id, which is now stored nowhere.
    return {"entry.signature": {forged}, "entry.parent_missing": {entry_id}, "entry.orphaned": expected - {entry_id}}


def _damage_page(home):
    conn = _raw(home)
    pages = [p for (p,) in conn.execute("SELECT pageno FROM dbstat WHERE name = 'entries' AND pagetype = 'leaf'")]
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    assert len(pages) >= 3, pages
    with open(home / "node.sqlite", "r+b") as f:
        f.seek((pages[1] - 1) * page_size)
        f.write(os.urandom(page_size))
    return {"sqlite.integrity": None}


def _damage_key_mode(home):
    os.chmod(home / "keys" / "agent-alpha.key", 0o644)
    return {"key.mode": None}


def _damage_missing_key(home):
    (home / "keys" / "agent-alpha.key").unlink()
    return {"key.missing": None}


@pytest.mark.parametrize("damage", [_damage_header, _damage_payload, _damage_missing_parent, _damage_signature,
                                    _damage_page, _damage_key_mode, _damage_missing_key],
                         ids=["header", "payload", "missing parent", "signature", "sqlite page", "key mode 0644",
                              "missing agent key"])
def test_each_kind_of_damage_is_found_and_named(home, damage):
    expected = damage(home)
    before = _file_digest(home)
    data = _check(home)
    assert not data["healthy"] and data["found_damage"]
    codes = _codes(data)
    for code, ids in expected.items():
        assert code in codes, (code, list(codes))
        if ids is not None:
            assert {p["entry"] for p in codes[code]} == ids, code
            assert all(p["damage"] for p in codes[code])
    if "entry.id" in expected or "entry.payload" in expected:
        assert all(p["author"] and p["seq"] is not None for p in codes.get("entry.id", []) + codes.get("entry.payload", []))
    assert _file_digest(home) == before  # verifying changes nothing


def test_the_cli_names_damage_and_exits_1(home):
    _damage_payload(home)
    _damage_key_mode(home)
    out = mm("check", home=home, check=False)
    assert out.returncode == 1 and out.stderr == "", out
    assert "entry.payload" in out.stdout and "chmod 600" in out.stdout
    assert "verdict: DAMAGED" in out.stdout and "memmesh check --repair" in out.stdout


# ----------------------------------------------------------------------------- repairs without peers


def test_a_repair_without_peers_says_exactly_what_was_lost(home):
    seq, entry_id = _log(home, "alpha")[2]
    lost = _descendants(home, "alpha", entry_id)
    _flip_header(home, seq)
    pseq, pid = _log(home, BANK)[20]
    _flip_payload(home, pseq)
    data = _check(home, repair=True)
    assert data["found_damage"] and not data["healthy"]
    alpha = _database(data, "alpha")["repair"]
    assert {x["entry"] for x in alpha["lost"]} == lost and alpha["recovered"] == []
    assert set(alpha["moved_aside"]) == lost
    assert {(x["entry"], x["seq"]) for x in alpha["lost"] if x["entry"] == entry_id} == {(entry_id, 2)}
    bank = _database(data, BANK)["repair"]
    assert bank["payloads_cleared"] == [[pid, "memory"]]
    assert [(x["entry"], x["store"]) for x in bank["lost"]] == [(pid, "memory")]
    assert all("no peer shares this database" in x["why"] for x in bank["lost"])
    # The repaired home is consistent: check passes, the normal open works, the rest is there.
    after = _check(home)
    assert after["healthy"], _problems(after)
    assert {a["entry"] for a in _database(after, "alpha")["aside"]} == lost
    assert _database(after, BANK)["missing_payloads"] == [[pid, "memory"]]  # fetched if a peer ever has it
    with Node.open(home) as node:
        got = node.call_tool("alpha", "recall", {"query": "deploy", "bank": BANK, "limit": 100})["memories"]
        assert len(got) == NOTES - 1  # the one whose payload is lost is not shown
        own = node.call_tool("alpha", "recall", {"query": "own memory", "limit": 100})["memories"]
        assert len(own) == 4 - len(lost)


def test_orphans_go_back_once_their_past_is_stored_again(home, template):
    """The damaged entry comes back later (as sync would bring it from a peer): the next repair
    applies its descendants again from the damaged area, through the normal pipeline."""
    seq, entry_id = _log(home, BANK)[10]
    orphans = _descendants(home, BANK, entry_id) - {entry_id}
    _flip_header(home, seq)
    first = _database(_check(home, repair=True), BANK)["repair"]
    assert {x["entry"] for x in first["lost"]} == orphans | {entry_id}
    good = SqliteStorage(template / "node.sqlite")
    original = good.get(_db_id(home, BANK), entry_id)
    good.close()
    with Node.open(home) as node:
        result = node.agents.resolve(BANK).db.ingest([(original.header, dict(original.payloads))], source="peer:test")
        assert result.accepted == [entry_id]
    second = _check(home, repair=True)
    assert second["healthy"] and set(_database(second, BANK)["repair"]["reapplied"]) == orphans
    after = _check(home)
    assert after["healthy"]
    assert [a["entry"] for a in _database(after, BANK)["aside"]] == [entry_id]  # the damaged copy, kept
    with Node.open(home) as node:
        got = node.call_tool("alpha", "recall", {"query": "deploy", "bank": BANK, "limit": 100})["memories"]
        assert len(got) == NOTES


def test_a_repair_salvages_a_damaged_sqlite_file(home):
    _damage_page(home)
    damaged = _file_digest(home)
    out = mm("--json", "check", "--repair", home=home, check=False)
    data = json.loads(out.stdout)
    salvaged = data["storage"]["salvaged"]
    assert salvaged and salvaged["rows"] > 0 and salvaged["unreadable"], salvaged
    kept = Path(salvaged["kept"])
    assert kept.exists() and kept.parent == home and kept.name.startswith("node.sqlite.damaged-")
    assert out.returncode == 1  # what the damaged page held is lost: no peer has this node's databases
    after = _check(home)
    assert after["healthy"], _problems(after)
    with Node.open(home) as node:
        bank = node.agents.resolve(BANK).db
        assert 0 < len(bank) < NOTES + 2
        node.call_tool("alpha", "remember", {"key": "after", "value": "written after the salvage", "bank": BANK})
    assert hashlib.sha256(kept.read_bytes()).hexdigest() == damaged  # the old file, kept as it was found


def test_a_damaged_table_definition_is_found_and_the_file_rebuilt(home):
    """Damage to the schema's text (a column renamed) passes SQLite's own integrity check."""
    conn = _raw(home)
    conn.execute("PRAGMA writable_schema=ON")
    conn.execute("UPDATE sqlite_master SET sql = replace(sql, 'data', 'dxta') WHERE name = 'payloads'")
    conn.close()
    [problem] = _codes(_check(home))["sqlite.schema"]
    assert "table payloads" in problem["detail"] and "dxta" in problem["detail"]
    data = _check(home, repair=True)
    assert data["storage"]["salvaged"] and data["healthy"], data["remaining"]  # rows are read by position
    assert _check(home)["healthy"]
    with Node.open(home) as node:
        assert len(node.call_tool("alpha", "recall", {"query": "deploy", "bank": BANK, "limit": 100})["memories"]) == NOTES


def test_a_repair_erases_what_an_accepted_erase_covers(home):
    with Node.open(home) as node:
        bank = node.agents.resolve(BANK)
        target = bank.db.rows("memory")[3].entry_id
        secret = node.storage.get(bank.db.id, target).payloads["memory"]
        bank.db.erase(bank.admin_key, target, "memory")
    conn = _raw(home)  # as if the payload had come back after the erase (an old backup's row)
    [(seq,)] = conn.execute("SELECT seq FROM entries WHERE id = ?", (target,)).fetchall()
    conn.execute("UPDATE payloads SET data = ? WHERE entry = ? AND store = 'memory'", (secret, seq))
    conn.close()
    [problem] = _codes(_check(home))["erase.not_applied"]
    assert problem["entry"] == target and problem["store"] == "memory"
    assert _database(_check(home, repair=True), BANK)["repair"]["erased"] == 1
    assert _check(home)["healthy"]
    conn = _raw(home)
    assert conn.execute("SELECT data FROM payloads WHERE entry = ? AND store = 'memory'", (seq,)).fetchone()[0] is None
    conn.close()


def test_pending_totals_that_drifted_are_found_and_recounted(home):
    conn = _raw(home)
    conn.execute("UPDATE pending_totals SET count = 5, bytes = 999")
    conn.close()
    assert "pending.totals" in _codes(_check(home))
    assert _check(home, repair=True)["healthy"]
    assert _check(home)["healthy"]


def test_repair_is_refused_on_an_open_node_and_check_runs_on_it(home):
    with Node.open(home) as node:
        with pytest.raises(CheckRefused, match="needs the home to itself"):
            node.run("check", {"repair": True})
        result = node.run("check", {})
        assert result.data["healthy"] and result.exit_code == 0


def test_check_of_a_missing_home_is_a_clear_error(tmp_path):
    out = mm("check", home=tmp_path / "nowhere", check=False)
    assert out.returncode == 1 and out.stderr.startswith("memmesh: error: no memmesh node in"), out


# ----------------------------------------------------------------------------- never served


def test_the_sync_read_path_never_hands_out_damaged_bytes(home):
    storage = SqliteStorage(home / "node.sqlite")
    try:
        db = Database.open(storage, _db_id(home, BANK))
        ids = db.missing_for({})
        log = {i: s for s, i in _log(home, BANK)}
        bad_header, bad_payload = ids[5], ids[7]
        _flip_header(home, log[bad_header])  # behind the open database's back
        _flip_payload(home, log[bad_payload])
        entries, covered = db.page(ids, 1 << 30)
        assert covered == len(ids)
        sent = {id_of(h): p for h, p in entries}
        assert bad_header not in sent and len(sent) == len(ids) - 1
        assert sent[bad_payload] == {"memory": None}  # travels as not held: fetched from another replica
        assert all(p["memory"] is not None for i, p in sent.items() if i != bad_payload and "memory" in p)
        page, n = db.page(ids[5:6], 1)  # a page of only the damaged entry covers it and sends nothing
        assert page == [] and n == 1
    finally:
        storage.close()


# ----------------------------------------------------------------------------- across two serve processes


def _status_db(serve, name: str) -> dict:
    [d] = [d for d in serve.run("status", {}).data["databases"] if d["name"] == name]
    return d


def _recall(serve, agent: str, query: str) -> list[dict]:
    memories = serve.run("recall", {"agent": agent, "query": query, "bank": BANK, "limit": 100,
                                    "no_count": True}).data["memories"]
    keep = ("entry", "key", "value", "written_by", "time", "tags")
    return [{k: m.get(k) for k in keep} for m in memories]


@pytest.mark.slow
def test_repair_across_two_serve_processes(tmp_path):
    """A and B share a bank; B also has its own agent DB nobody else holds. B is stopped and some
    entries of its node.sqlite damaged: B's serve refuses to start; `check --repair` on B fetches
    the shared bank back from A (B ends identical to A) and names exactly what its own DB lost."""
    a, b = tmp_path / "a", tmp_path / "b"
    for h in (a, b):
        node, _ = Node.init(h)
        with node:
            node.run("embedder.set", {"provider": "none"})
    with processes() as procs:
        sa = procs.serve(a).start()
        sb = procs.serve(b).start()
        sa.wait_ready(), sb.wait_ready()
        agent_with_bank(sa.run, bank=BANK)
        for i in range(12):
            sa.run("remember", {"agent": "alpha", "key": f"a.{i}", "value": f"alpha wrote deploy note {i}", "bank": BANK})
        ticket = sa.run("memory.share", {"bank": BANK, "perm": "admin"}).data["ticket"]
        sb.run("memory.import", {"ticket": ticket, "perm": "admin"})
        sb.run("agent.new", {"name": "gamma"})
        sb.run("memory.grant", {"bank": BANK, "agent": "gamma", "perm": "write"})
        for i in range(6):
            sb.run("remember", {"agent": "gamma", "key": f"g.{i}", "value": f"gamma wrote deploy note {i}", "bank": BANK})
        for i in range(6):
            sb.run("remember", {"agent": "gamma", "key": f"own.{i}", "value": f"gamma's own note {i}"})
        until(lambda: _status_db(sa, BANK)["heads"] == _status_db(sb, BANK)["heads"], 30, "A and B to converge")
        assert sb.stop() == 0

        # --- damage B's copy: two entries of the shared bank, one in the middle of gamma's own DB
        bank_log = _log(b, BANK)
        own_log = _log(b, "gamma")
        _flip_header(b, bank_log[5][0])
        _flip_payload(b, bank_log[3][0])  # before the damaged header: it stays, its payload is fetched
        own_seq, own_id = own_log[4]
        own_lost = _descendants(b, "gamma", own_id)
        assert 1 < len(own_lost) < len(own_log)
        _flip_header(b, own_seq)

        refused = procs.serve(b).start()
        assert refused.proc.wait(60) != 0
        assert "check --repair" in refused.log(), refused.log()

        out = mm("--json", "check", "--repair", home=b, check=False)
        assert out.returncode == 1 and out.stdout, out.stderr  # gamma's own DB lost entries: no peer holds it
        data = json.loads(out.stdout)
        shared = _database(data, BANK)["repair"]
        assert shared["lost"] == [] and shared["exchanges"] and all(x["ok"] for x in shared["exchanges"])
        assert bank_log[5][1] in shared["recovered"] and shared["payloads_recovered"] == [[bank_log[3][1], "memory"]]
        own = _database(data, "gamma")["repair"]
        assert {x["entry"] for x in own["lost"]} == own_lost
        assert all(x["author"] and x["seq"] is not None for x in own["lost"])
        assert data["remaining"] == [f"{len(own_lost)} entries or payloads could not be recovered"]

        # --- B serves again, identical to A for the shared bank; check goes through serve
        sb = procs.serve(b).start().wait_ready()
        through = mm("check", home=b, check=False)
        assert through.returncode == 0 and "verdict: healthy" in through.stdout, through
        assert "control op=check status=ok" in sb.log()
        again = mm("check", "--repair", home=b, check=False)
        assert again.returncode == 1 and "stop it (kill -TERM" in again.stderr, again
        assert _status_db(sb, BANK)["heads"] == _status_db(sa, BANK)["heads"]
        assert _recall(sb, "gamma", "deploy note") == _recall(sa, "alpha", "deploy note")
        assert len(_recall(sa, "alpha", "deploy note")) == 18
        assert sa.stop() == 0 and sb.stop() == 0
    ids = {}
    for h in (a, b):
        storage = SqliteStorage(h / "node.sqlite")
        ids[h] = sorted(e.id for e in storage.entries(_db_id(h, BANK)))
        storage.close()
    assert ids[a] == ids[b]
