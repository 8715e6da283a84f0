"""A damaged home gives one clear line, never a traceback and never a wrong memory (issue 13).

One small populated home is built once (an agent, a bank, memories in both, two payloads
erased), then copied and damaged 200 times, seeded: byte ranges overwritten anywhere in
node.sqlite, truncations, a page zeroed, the write-ahead log overwritten or truncated (from a
copy taken while another connection kept the log un-checkpointed), key files truncated, damaged
or removed. Each copy runs `status` and `recall` through ``node.cli.main`` in this process:
either it works and every memory returned is one that was written (key and value, never an
erased one), or it exits non-zero with exactly one stderr line, "memmesh: error: ...", that
names the damaged file. An exception escaping main() fails the test with the case that raised it.

Then one test per kind of damage pins its exact message.
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
import random
import shutil
import sqlite3
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from memmesh.node import cli
from memmesh.node.library import Node
from tests.homes import agent_with_bank

SEED = 13
CASES = 200
REPAIR = "run: memmesh check --repair, or restore a backup (memmesh restore)"
KEY_RESTORE = "restore it from a backup (memmesh backup copies keys/)"


@dataclass
class Base:
    plain: Path  # checkpointed: everything in node.sqlite
    wal: Path  # the same node with its writes still in node.sqlite-wal
    written: dict[str, dict[str, str]] = field(default_factory=dict)  # bank -> key -> value
    erased: dict[str, set[str]] = field(default_factory=dict)  # bank -> keys whose value was erased


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def remember(node: Node, bank: str | None, key: str, value: str) -> str:
    args = {"key": key, "value": value} | ({"bank": bank} if bank else {})
    return node.call_tool("alpha", "remember", args)["entry"]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    root = tmp_path_factory.mktemp("damage")
    home = root / "plain"
    out = Base(home, root / "wal")
    node, _ = Node.init(home)
    # A second connection that has read the file keeps SQLite from checkpointing the log away
    # when the node closes: the copy taken then has every write in node.sqlite-wal.
    keeper = sqlite3.connect(home / "node.sqlite")
    keeper.execute("SELECT count(*) FROM sqlite_master").fetchone()
    with node:
        node.run("embedder.set", {"provider": "none"})
        agent_with_bank(node.run, description="shared notes")
        entries: dict[tuple[str, str], str] = {}
        for i in range(30):
            if i == 12:
                # Two payloads erased by signed erases (the author's own, and the bank admin's).
                # Early: an erase checkpoints the log away, the later writes fill it again.
                agent, notes = node.agents.agent("alpha"), node.agents.resolve("notes")
                agent.db.erase(agent.key, entries[("alpha", "topic-4")], "memory")
                notes.db.erase(notes.admin_key, entries[("notes", "topic-9")], "memory")
                out.erased = {"alpha": {"topic-4"}, "notes": {"topic-9"}}
            bank = "notes" if i % 3 == 0 else None
            key, value = f"topic-{i}", f"fact number {i}: the {['red', 'green', 'blue'][i % 3]} deploy notes"
            entries[(bank or "alpha", key)] = remember(node, bank, key, value)
            out.written.setdefault(bank or "alpha", {})[key] = value
    shutil.copytree(home, out.wal)
    keeper.close()  # the last connection: SQLite checkpoints and removes the log
    assert not (home / "node.sqlite-wal").exists() or (home / "node.sqlite-wal").stat().st_size == 0
    assert (out.wal / "node.sqlite-wal").stat().st_size > 10 * 4096
    return out


# ------------------------------------------------------------------------------ damage


def _overwrite(path: Path, rnd: random.Random, zero: bool = False) -> str:
    data = bytearray(path.read_bytes())
    length = rnd.choice([1, 4, 16, 64, 256, 1024])
    at = rnd.randrange(max(1, len(data) - length))
    data[at:at + length] = bytes(length) if zero else rnd.randbytes(length)
    path.write_bytes(bytes(data))
    return f"{'zeroed' if zero else 'overwrote'} {length} bytes at {at}"


def _truncate(path: Path, rnd: random.Random) -> str:
    size = path.stat().st_size
    n = rnd.choice([0, rnd.randrange(1, 100), rnd.randrange(size)])
    with open(path, "r+b") as f:
        f.truncate(n)
    return f"truncated to {n} of {size} bytes"


def _zero_page(path: Path, rnd: random.Random) -> str:
    data = bytearray(path.read_bytes())
    pages = len(data) // 4096
    page = rnd.randrange(pages)
    data[page * 4096:(page + 1) * 4096] = bytes(4096)
    path.write_bytes(bytes(data))
    return f"zeroed page {page + 1} of {pages}"


def damage(copy: Path, rnd: random.Random) -> tuple[Path, str]:
    """Damage one file of the home at ``copy``; returns the file and what was done to it."""
    kind = rnd.choices(["sqlite", "truncate", "page", "wal", "wal-truncate", "key"], [40, 12, 12, 20, 6, 10])[0]
    sqlite_file, wal = copy / "node.sqlite", copy / "node.sqlite-wal"
    if kind == "sqlite":
        return sqlite_file, _overwrite(sqlite_file, rnd)
    if kind == "truncate":
        return sqlite_file, _truncate(sqlite_file, rnd)
    if kind == "page":
        return sqlite_file, _zero_page(sqlite_file, rnd)
    if kind in ("wal", "wal-truncate") and wal.exists():
        if kind == "wal-truncate":
            return wal, _truncate(wal, rnd)
        if rnd.random() < 0.15:  # the header and the first frame's header
            data = bytearray(wal.read_bytes())
            at = rnd.randrange(56)
            data[at] ^= 1 << rnd.randrange(8)
            wal.write_bytes(bytes(data))
            return wal, f"flipped a bit at {at}"
        return wal, _overwrite(wal, rnd, zero=rnd.random() < 0.2)
    if kind.startswith("wal"):  # a checkpointed copy has no log: damage its file instead
        return sqlite_file, _overwrite(sqlite_file, rnd)
    key = copy / "keys" / rnd.choice(["peer.key", "agent-alpha.key"])
    how = rnd.choice(["truncate", "remove", "overwrite"])
    if how == "remove":
        key.unlink()
        return key, "removed"
    if how == "truncate":
        return key, _truncate(key, rnd)
    return key, _overwrite(key, rnd)


# ------------------------------------------------------------------------------ the fuzz


def _check_run(case: str, damaged: Path, argv: list[str], base: Base, bank: str) -> tuple[int, str | None]:
    """The exit code of one command on a damaged copy, and what is wrong with its outcome."""
    try:
        code, out, err = run(*argv)
    except BaseException:  # noqa: BLE001 -- any escape is the failure under test
        return -1, f"{case}: {argv[2:]} raised\n{traceback.format_exc()}"
    lines = err.strip().splitlines()
    if code == 0:
        if argv[2] != "recall":
            return code, None
        written, erased = base.written[bank], base.erased.get(bank, set())
        for m in json.loads(out)["memories"]:
            if written.get(m["key"]) != m["value"] or m["key"] in erased:
                return code, f"{case}: recall returned a memory that was not written: {m['key']!r}: {m['value']!r}"
        return code, None
    if len(lines) != 1 or not lines[0].startswith("memmesh: error: "):
        return code, f"{case}: {argv[2:]} exit {code} with stderr {err!r}"
    # Damage to the log can surface as damage to the file it belongs to.
    names = [str(damaged)] + ([str(damaged.parent / "node.sqlite")] if damaged.name == "node.sqlite-wal" else [])
    if not any(n in lines[0] for n in names):
        return code, f"{case}: the error names no damaged file ({damaged.name}): {lines[0]}"
    return code, None


@pytest.mark.slow
def test_damaged_copies_fail_clearly_or_answer_truly(base: Base, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Building the argument parser is half of a command's time here, and not what is tested:
    # one parser serves the 400 commands.
    monkeypatch.setattr(cli, "build_parser", functools.lru_cache(maxsize=None)(cli.build_parser))
    rnd = random.Random(SEED)
    problems: list[str] = []
    outcomes = {"ok": 0, "refused": 0}
    for i in range(CASES):
        source = base.wal if rnd.random() < 0.4 else base.plain
        copy = tmp_path / f"c{i}"
        shutil.copytree(source, copy)
        damaged, what = damage(copy, rnd)
        case = f"case {i} ({source.name} home, {damaged.name}: {what})"
        bank = rnd.choice(["alpha", "notes"])
        recall = ["--home", str(copy), "recall", "alpha", rnd.choice(["", "deploy notes", "green"]),
                  "--json", "--limit", "50"] + (["--bank", "notes"] if bank == "notes" else [])
        for argv in (["--home", str(copy), "status", "--json"], recall):
            code, problem = _check_run(case, damaged, argv, base, bank)
            if problem:
                problems.append(problem)
        outcomes["ok" if code == 0 else "refused"] += 1
        shutil.rmtree(copy)
    assert not problems, "\n\n".join(problems[:10]) + f"\n\n({len(problems)} problems in {CASES} copies)"
    # Most damage is caught, some lands where nothing reads it: both must have happened.
    assert outcomes["ok"] and outcomes["refused"], outcomes


def test_the_undamaged_copies_answer(base: Base) -> None:
    for home in (base.plain, base.wal):
        code, out, err = run("--home", str(home), "recall", "alpha", "", "--json", "--limit", "50")
        assert code == 0, err
        got = {m["key"]: m["value"] for m in json.loads(out)["memories"]}
        assert got == {k: v for k, v in base.written["alpha"].items() if k not in base.erased.get("alpha", ())}


# ------------------------------------------------------------------------------ each kind, exactly

DB_REPAIR = ("run: memmesh check --repair (it fetches damaged entries again from peers), "
             "or restore a backup (memmesh restore)")


def short(entry_id: str) -> str:
    return entry_id[:19] + "..."


@pytest.fixture
def home(base: Base, tmp_path: Path) -> Path:
    copy = tmp_path / "home"
    shutil.copytree(base.plain, copy)
    return copy


def one_error(*argv: str) -> str:
    code, _, err = run(*argv)
    assert code == 1, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("memmesh: error: "), err
    return lines[0][len("memmesh: error: "):]


def recall_error(home: Path) -> str:
    return one_error("--home", str(home), "recall", "alpha", "deploy")


def test_a_missing_agent_key(home: Path) -> None:
    key = home / "keys" / "agent-alpha.key"
    key.unlink()
    assert recall_error(home) == f"key file {key} is missing; {KEY_RESTORE}"


@pytest.mark.parametrize("content, what", [
    (b"", "empty (truncated)"),
    (b"ed25519-private:qfAkFR57PkTP", "truncated: 28 of its 59 characters"),
    (b"ed25519-pri", "truncated: 11 of its 59 characters"),
    (b"ed25519-private:qfAkFR57PkTPNx!TPx7BG4JL8VkGabJFdPNSFQgmlBM\n", "damaged: it does not hold an Ed25519 private key"),
    (b"\x00" * 60, "damaged: it does not hold an Ed25519 private key"),
])
def test_a_truncated_or_damaged_key(home: Path, content: bytes, what: str) -> None:
    key = home / "keys" / "agent-alpha.key"
    key.write_bytes(content)
    line = recall_error(home)
    assert line == f"key file {key} is {what}; {KEY_RESTORE}"
    assert "qfAk" not in line  # never quote what is left of a private key


def test_a_key_file_that_decodes_to_another_key(home: Path) -> None:
    """One changed character of a key file can still decode: the agent's database says whose
    key it must be, so the agent does not silently become someone else."""
    from memmesh.auth.keys import SigningKey, encode_private

    key = home / "keys" / "agent-alpha.key"
    key.write_bytes(encode_private(SigningKey.generate()))
    db_id, _ = _alpha_entries(home)
    assert recall_error(home) == (f"key file {key} is damaged: it holds another key than the one that created "
                                  f"database {short(db_id)}; {KEY_RESTORE}")


def test_a_lost_peer_key_is_not_replaced_by_a_new_identity(home: Path) -> None:
    peer = home / "keys" / "peer.key"
    peer.unlink()
    expected = (f"key file {peer} is missing, but {home} holds a node ({home / 'node.sqlite'}): the node's "
                "identity is gone, and a new key would make it another node; restore keys/peer.key from a backup "
                "(memmesh backup copies keys/)")
    assert one_error("--home", str(home), "status") == expected
    assert one_error("--home", str(home), "init") == expected
    assert not peer.exists()  # init did not make the node someone else
    peer.write_bytes(b"")
    peer.chmod(0o600)
    assert one_error("--home", str(home), "status") == f"key file {peer} is empty (truncated); {KEY_RESTORE}"


@pytest.mark.parametrize("how", ["removed", "emptied"])
def test_a_lost_storage_file_beside_the_keys(home: Path, how: str) -> None:
    storage = home / "node.sqlite"
    if how == "removed":
        storage.unlink()
    else:
        storage.write_bytes(b"")
    keys = sorted(p.name for p in (home / "keys").glob("*.key") if p.name != "peer.key")
    assert one_error("--home", str(home), "status") == (
        f"{storage} is {'missing' if how == 'removed' else 'empty'}, but {home / 'keys'} holds this node's keys "
        f"({', '.join(keys)}): the node's data is gone; restore a backup (memmesh restore)")
    assert not storage.exists() or storage.stat().st_size == 0  # nothing was created in its place


def _damage_root_page(home: Path, table: str) -> None:
    """Change the count of fragmented free bytes in the header of ``table``'s root page: damage
    SQLite's quick_check finds that reading the rows does not meet."""
    raw = sqlite3.connect(home / "node.sqlite")
    page = raw.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    raw.close()
    data = bytearray((home / "node.sqlite").read_bytes())
    data[(page - 1) * 4096 + 7] = 0x3F
    (home / "node.sqlite").write_bytes(bytes(data))


def test_a_damaged_page_of_peer_local_records(home: Path) -> None:
    """The registry's rows carry no hash: a damaged page could hide an agent's record without
    any error ("no agent named alpha"). Every open checks those tables page by page."""
    _damage_root_page(home, "local")
    line = recall_error(home)
    assert line.startswith(f"{home / 'node.sqlite'} is damaged (SQLite's quick_check: ")
    assert line.endswith(f"); {REPAIR}")


def _alpha_entries(home: Path) -> tuple[str, list[str]]:
    """alpha's database id and its entry ids in stored order."""
    raw = sqlite3.connect(home / "node.sqlite")
    rec = json.loads(raw.execute("SELECT value FROM local WHERE ns = 'agents' AND key = 'alpha'").fetchone()[0])
    seq = raw.execute("SELECT seq FROM databases WHERE db_id = ?", (rec["db_id"],)).fetchone()[0]
    ids = [r[0] for r in raw.execute("SELECT id FROM entries WHERE db = ? ORDER BY seq", (seq,))]
    raw.close()
    return rec["db_id"], ids


def _sql(home: Path, statement: str, *args: object) -> None:
    raw = sqlite3.connect(home / "node.sqlite")
    raw.execute(statement, args)
    raw.commit()


def _flip(home: Path, table: str, column: str, where: str, arg: object, at: int) -> None:
    """Change byte ``at`` of one stored blob to a different byte whatever it held (writing a
    fixed byte changed nothing when the byte, a timestamp's say, already was that one)."""
    raw = sqlite3.connect(home / "node.sqlite")
    [(blob,)] = raw.execute(f"SELECT {column} FROM {table} WHERE {where}", (arg,)).fetchall()
    damaged = bytearray(blob)
    damaged[at] ^= 0xFF
    raw.execute(f"UPDATE {table} SET {column} = ? WHERE {where}", (bytes(damaged), arg))
    raw.commit()
    raw.close()


def test_a_damaged_entry_header(home: Path) -> None:
    db_id, ids = _alpha_entries(home)
    _flip(home, "entries", "header", "id = ?", ids[-1], 40)
    assert recall_error(home) == (
        f"{home / 'node.sqlite'} is damaged: database {short(db_id)} has 1 damaged stored entry (the first, "
        f"{short(ids[-1])}: its header bytes no longer hash to its id); {DB_REPAIR}")


def test_a_damaged_payload(home: Path) -> None:
    db_id, ids = _alpha_entries(home)
    _flip(home, "payloads", "data", "entry = (SELECT seq FROM entries WHERE id = ?) AND store = 'memory'",
          ids[-1], 30)
    line = recall_error(home)
    assert line.startswith(f"{home / 'node.sqlite'} is damaged: database {short(db_id)} has 1 damaged stored "
                           f"entry (the first, {short(ids[-1])}: ")
    assert "memory" in line and line.endswith(f"); {DB_REPAIR}")


def test_an_entry_lost_from_the_middle_of_the_log(home: Path) -> None:
    """Rows gone from the file: the first entry that names one is damaged, its descendants wait on it."""
    db_id, ids = _alpha_entries(home)
    gone = ids[5]
    _sql(home, "DELETE FROM payloads WHERE entry = (SELECT seq FROM entries WHERE id = ?)", gone)
    _sql(home, "DELETE FROM entries WHERE id = ?", gone)
    line = recall_error(home)
    assert line.startswith(f"{home / 'node.sqlite'} is damaged: database {short(db_id)} has 1 damaged stored "
                           f"entry (the first, {short(ids[6])}: it names {short(gone)}, which is not stored "
                           "before it), and ")
    assert line.endswith(f" more that depend on them; {DB_REPAIR}")


def test_damage_in_memory_storage_names_the_adapter() -> None:
    from memmesh.crdt.database import Database
    from memmesh.crdt.errors import DamagedError
    from memmesh.crdt.storage import MemoryStorage, StoredEntry
    from tests.dbkit import key, new_db

    db = new_db(key(1))
    txn = db.transaction(key(1))
    txn.append("memory", {"key": "k", "value": "v"})
    txn.commit()
    damaged = MemoryStorage()
    damaged.add_database(db.id)
    stored = list(db.storage.entries(db.id))
    header = bytearray(stored[-1].header)
    header[30] ^= 1
    damaged.append(db.id, [stored[0], StoredEntry(stored[-1].id, bytes(header), stored[-1].payloads)])
    with pytest.raises(DamagedError) as caught:
        Database.open(damaged, db.id)
    assert str(caught.value) == (
        f"the storage (MemoryStorage) is damaged: database {short(db.id)} has 1 damaged stored entry (the first, "
        f"{short(stored[-1].id)}: its header bytes no longer hash to its id); {DB_REPAIR}")


def _serve(home: Path) -> subprocess.CompletedProcess:
    """`memmesh serve` on ``home``: it must refuse at once (a timeout means it started)."""
    return subprocess.run([sys.executable, "-m", "memmesh.node.cli", "--home", str(home), "serve", "--listen", "127.0.0.1:0",
                           "--no-discovery", "--api-listen", "off"], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, check=False)


@pytest.mark.slow
def test_serve_refuses_a_damaged_home(home: Path) -> None:
    db_id, ids = _alpha_entries(home)
    _flip(home, "entries", "header", "id = ?", ids[-1], 40)
    proc = _serve(home)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [(
        f"memmesh: error: {home / 'node.sqlite'} is damaged: database {short(db_id)} has 1 damaged stored entry "
        f"(the first, {short(ids[-1])}: its header bytes no longer hash to its id); {DB_REPAIR}")]
    assert not (home / "serve.json").exists()


@pytest.mark.slow
def test_serve_runs_quick_check_first(home: Path) -> None:
    """Damage that reading does not meet (a b-tree page's count of fragmented bytes, in the log's
    table, which every open does not check page by page): commands still answer, serve's
    quick_check of every page refuses to start on it."""
    _damage_root_page(home, "entries")
    assert run("--home", str(home), "recall", "alpha", "deploy")[0] == 0
    proc = _serve(home)
    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"memmesh: error: {home / 'node.sqlite'} is damaged (SQLite's quick_check: ")
    assert line.endswith(f"); {REPAIR}")
