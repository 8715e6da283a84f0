"""The write fence (node/fence.py): after a restore, and after a repair that lost entries this
node's keys signed, a database that peers may hold refuses local writes, so that a write never
reuses a feed position a peer already holds (equivocation). It lifts by itself once a sync
brings the node's own later entries back (slow: two real serve processes), or by hand."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from memmesh.auth.keys import SigningKey
from memmesh.crdt.entry import id_of
from memmesh.node import Node
from memmesh.node.cli import run_command
from memmesh.node.fence import WriteFenced, caught_up, read
from memmesh.node.library import run_in_home
from memmesh.node.registry import UnknownName
from tests.homes import agent_with_bank
from tests.procs import processes, until
from tests.test_cli import mm_here

BANK = "notes"
OTHER_PEER = str(SigningKey.generate().public)  # a peer key this home does not hold


def _build(home: Path, *, share: bool) -> None:
    node, _ = Node.init(home)
    with node:
        node.run("embedder.set", {"provider": "none"})
        agent_with_bank(node.run, bank=BANK)
        if share:  # a ticket for another peer: the bank is served, and that peer's key is granted
            node.run("memory.share", {"bank": BANK, "recipient": OTHER_PEER})
        for i in range(3):
            node.call_tool("alpha", "remember", {"key": f"k{i}", "value": f"deploy note {i}", "bank": BANK})


def _backup_and_restore(tmp_path: Path, *, share: bool) -> Path:
    home, dest, restored = tmp_path / "home", tmp_path / "backup", tmp_path / "restored"
    _build(home, share=share)
    with Node.open(home, create=False) as node:
        node.run("backup", {"dest": str(dest)})
    run_command(restored, "restore", {"src": str(dest), "force": False})
    return restored


def _entries(home: Path) -> dict[str, set[str]]:
    with Node.open(home, create=False) as node:
        return {i: set(node.database(i).accepted_ids()) for i in node.database_ids()}


def test_a_restored_shared_bank_refuses_writes_with_one_line_and_writes_nothing(tmp_path):
    restored = _backup_and_restore(tmp_path, share=True)
    before = _entries(restored)
    with Node.open(restored, create=False) as node:
        [fenced] = node.run("status", {}).data["fenced"]
        assert (fenced["name"], fenced["reason"]) == (BANK, "restore")
        with pytest.raises(WriteFenced) as err:
            node.call_tool("alpha", "remember", {"key": "after", "value": "written too early", "bank": BANK})
        line = str(err.value)
        assert line.startswith(f"database {BANK} was restored from a backup (") and "\n" not in line
        assert line.endswith("): its agents may have written after the backup, and writing again before those "
                             "entries are back would flag their keys for equivocation on every peer; run memmesh "
                             f"sync (serve syncs by itself), or memmesh unfence {BANK} if no peer has this database")
        # settings changes go through the same local write path
        node.run("agent.new", {"name": "beta"})
        with pytest.raises(WriteFenced):
            node.run("memory.grant", {"bank": BANK, "agent": "beta", "perm": "write"})
        # reads are never fenced; alpha's own database is held by nobody else, so it takes writes
        got = node.call_tool("alpha", "recall", {"query": "deploy", "bank": BANK})["memories"]
        assert sorted(m["key"] for m in got) == ["k0", "k1", "k2"]
        node.call_tool("alpha", "remember", {"key": "mine", "value": "alpha's own note"})
        alpha_db = node.registry.agent("alpha").db_id
        beta_db = node.registry.agent("beta").db_id
    after = _entries(restored)
    bank_db = fenced["db"]
    assert after[bank_db] == before[bank_db]  # nothing was written to the bank
    assert len(after[alpha_db]) == len(before[alpha_db]) + 1 and beta_db not in before
    # the CLI: one line, exit 1; status says it in one line too
    out = mm_here("remember", "alpha", "later", "too early", "--bank", BANK, home=restored, check=False)
    assert out.returncode == 1 and out.stderr.count("\n") == 1
    assert out.stderr.startswith(f"memmesh: error: database {BANK} was restored from a backup (")
    status = mm_here("status", home=restored).stdout
    [line] = [s for s in status.splitlines() if s.startswith("FENCED")]
    assert f"{BANK}, restored from a backup (" in line and "memmesh unfence NAME" in line


def test_restore_says_what_it_fenced(tmp_path):
    home, dest = tmp_path / "home", tmp_path / "backup"
    _build(home, share=True)
    with Node.open(home, create=False) as node:
        node.run("backup", {"dest": str(dest)})
    result = run_command(tmp_path / "restored", "restore", {"src": str(dest), "force": False})
    assert result.data["fenced"] == [BANK]
    assert f"fenced 1 database that peers may hold ({BANK}): local writes to them are refused" in result.text


def test_unfence_by_hand_lifts_it_and_says_what_the_operator_takes_on(tmp_path):
    restored = _backup_and_restore(tmp_path, share=True)
    with Node.open(restored, create=False) as node:
        with pytest.raises(UnknownName):
            node.run("unfence", {"db": "no-such-bank"})
        result = node.run("unfence", {"db": BANK})
        assert result.data["was_fenced"] and result.data["fence"]["reason"] == "restore"
        assert "lifted the write fence on notes (restored from a backup (" in result.text
        assert "flags the key for equivocation" in result.text
        assert node.run("status", {}).data["fenced"] == []
        node.call_tool("alpha", "remember", {"key": "after", "value": "the operator decided", "bank": BANK})
        again = node.run("unfence", {"db": result.data["db"]})  # by database id; nothing left to lift
        assert not again.data["was_fenced"] and again.text == f"{BANK} is not fenced; nothing changed"


def test_a_database_no_other_node_can_hold_is_not_fenced(tmp_path):
    restored = _backup_and_restore(tmp_path, share=False)
    with Node.open(restored, create=False) as node:
        assert node.run("status", {}).data["fenced"] == []
        node.call_tool("alpha", "remember", {"key": "after", "value": "nobody else has this bank", "bank": BANK})


def test_a_grant_to_another_nodes_key_is_enough_to_fence(tmp_path):
    """Shared once, unshared since: the peer that imported it still holds it."""
    home, dest = tmp_path / "home", tmp_path / "backup"
    _build(home, share=True)
    with Node.open(home, create=False) as node:
        node.run("memory.unshare", {"bank": BANK})
        assert not node.sync.shared() and not node.sync.peers.databases()
        node.run("backup", {"dest": str(dest)})
    result = run_command(tmp_path / "restored", "restore", {"src": str(dest), "force": False})
    assert result.data["fenced"] == [BANK]


# ----------------------------------------------------------------------------- check --repair
def _damage_signature(home: Path, db_id: str, author: str, seq: int) -> None:
    """Damage one stored entry by its feed position, as test_check does: a bit of its signature
    changed, the id column with it (its header still says whose entry it is, and where)."""
    with Node.open(home, create=False) as node:
        [entry_id] = node.database(db_id).entries_at(author, seq)
    conn = sqlite3.connect(home / "node.sqlite", isolation_level=None)
    try:
        row, header = conn.execute("SELECT seq, header FROM entries WHERE id = ?", (entry_id,)).fetchone()
        header = bytearray(header)
        header[-5] ^= 0x10
        conn.execute("UPDATE entries SET header = ?, id = ? WHERE seq = ?", (bytes(header), id_of(bytes(header)), row))
    finally:
        conn.close()


def test_a_repair_that_loses_the_nodes_own_entries_fences_the_database(tmp_path):
    home = tmp_path / "home"
    _build(home, share=True)
    with Node.open(home, create=False) as node:
        alpha = str(node.agents.agent("alpha").key.public)
        bank = node.agents.resolve(BANK).db
        db_id, top = bank.id, bank.feeds()[alpha][0]
        original = [node.storage.get(db_id, i) for i in bank.entries_at(alpha, top)]
        own_db = node.registry.agent("alpha").db_id
    _damage_signature(home, db_id, alpha, top)  # alpha's last entry in the bank
    _damage_signature(home, own_db, alpha, 1)  # and one in alpha's own database, which nobody else holds
    result = run_in_home(home, "check", {"repair": True})
    by_name = {d["name"]: d for d in result.data["databases"]}
    assert by_name[BANK]["repair"]["fenced"] and by_name[BANK]["repair"]["lost"]
    assert by_name["alpha"]["repair"]["lost"] and not by_name["alpha"]["repair"]["fenced"]
    assert "FENCED: it lost entries this node's keys signed" in result.text
    with Node.open(home, create=False) as node:
        fence = read(node.storage, db_id)
        assert fence is not None and fence.reason == "repair" and fence.lost == {alpha: top} and not fence.catch_up
        with pytest.raises(WriteFenced) as err:
            node.call_tool("alpha", "remember", {"key": "after", "value": "would reuse seq", "bank": BANK})
        assert str(err.value).startswith(f"database {BANK} lost entries its own keys signed in memmesh check "
                                         "--repair (")
        assert str(err.value).endswith(f"or memmesh unfence {BANK} if no peer has them")
        node.call_tool("alpha", "remember", {"key": "mine", "value": "its own database takes writes"})
        # What a sync that brings the lost entry back leaves behind: the fence's condition is met.
        bank = node.database(db_id)
        assert not caught_up(fence, bank.feeds(), {})
        bank.ingest([(s.header, dict(s.payloads)) for s in original], source="peer:test")
        assert caught_up(fence, bank.feeds(), {})


# ----------------------------------------------------------------------------- across two serve processes
def _bank(serve) -> dict:
    [d] = [d for d in serve.run("status", {}).data["databases"] if d["bank"] == BANK]
    return d


@pytest.mark.slow
def test_after_a_restore_a_sync_lifts_the_fence_and_the_next_write_follows_the_later_entries(tmp_path):
    """A writes to a bank it shares with B, is backed up, writes more (B gets it), loses its home
    and is restored from the backup: it refuses writes until a sync with B (`memmesh sync`, then
    serve's own daemon after a second restore) brought its later entries back; then its next
    write follows them, and B accepts it without flagging the key."""
    a, b, dest = tmp_path / "a", tmp_path / "b", tmp_path / "backup"
    for h in (a, b):
        node, _ = Node.init(h)
        with node:
            node.run("embedder.set", {"provider": "none"})
    with processes() as procs:
        sa, sb = procs.serve(a).start(), procs.serve(b).start()
        sa.wait_ready(), sb.wait_ready()
        agent_with_bank(sa.run, bank=BANK)
        for i in range(3):
            sa.run("remember", {"agent": "alpha", "key": f"k{i}", "value": f"before the backup {i}", "bank": BANK})
        ticket = sa.run("memory.share", {"bank": BANK, "perm": "write"}).data["ticket"]
        sb.run("memory.import", {"ticket": ticket, "perm": "write"})
        # A knows B as a peer of the bank (peer exchange) before the backup is taken
        until(lambda: any(p["key"] == sb.node_key for p in sa.run("peers", {}).data["peers"]), 30, "A to learn B")
        sa.run("backup", {"dest": str(dest)})
        for i in range(3, 6):
            sa.run("remember", {"agent": "alpha", "key": f"k{i}", "value": f"after the backup {i}", "bank": BANK})
        until(lambda: _bank(sa)["heads"] == _bank(sb)["heads"], 30, "B to hold A's later entries")
        assert sa.stop() == 0

        # --- restored, no serve: `memmesh sync` lifts the fence
        run_command(a, "restore", {"src": str(dest), "force": True})
        with Node.open(a, create=False) as node:
            with pytest.raises(WriteFenced):
                node.call_tool("alpha", "remember", {"key": "early", "value": "too early", "bank": BANK})
            alpha = str(node.agents.agent("alpha").key.public)
            assert node.agents.resolve(BANK).db.feeds()[alpha][0] == 2
            node.run("sync", {})
            assert node.run("status", {}).data["fenced"] == []
            first = node.call_tool("alpha", "remember", {"key": "k6", "value": "after a sync", "bank": BANK})
            node.run("sync", {})  # pushes it to B

        # --- restored again, from the same backup: serve's daemon lifts it
        run_command(a, "restore", {"src": str(dest), "force": True})
        sa = procs.serve(a).start().wait_ready()
        until(lambda: sa.run("status", {}).data["fenced"] == [], 30, "serve's sync to lift the fence")
        assert "write fence on notes lifted: synced with" in sa.log()
        second = sa.run("remember", {"agent": "alpha", "key": "k7", "value": "after serve synced", "bank": BANK}).data
        until(lambda: _bank(sa)["heads"] == _bank(sb)["heads"], 30, "B to take A's new write")
        assert sa.stop() == 0 and sb.stop() == 0
    with Node.open(b, create=False) as node:
        db = node.agents.resolve(BANK).db
        assert db.equivocators == {}
        for seq, written in ((6, first), (7, second)):
            assert db.entries_at(alpha, seq) == [written["entry"]] and db.is_accepted(written["entry"])
        assert db.feeds()[alpha][0] == 7
