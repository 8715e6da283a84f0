"""The `memmesh` command, run as a user runs it: a separate process per command.

``mm`` runs one such process. ``mm_here`` runs the same command through ``node.cli.main`` in
the test's own process, the code the console script runs (parse, route to serve or open the
home, run, render, exit code), without the cold interpreter and imports each process costs
(0.5-1 s): for tests of what a command does. What only a process shows (the exit status the
interpreter returns, everything on its stderr, a second process waiting for the home) is
tested with ``mm``.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from memmesh.auth.keys import PublicKey
from memmesh.node.cli import main
from memmesh.node.home import Home


def mm(*args: str, home: Path | None = None, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "memmesh.node.cli"]
    if home is not None:
        cmd += ["--home", str(home)]
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(cmd + list(args), capture_output=True, text=True, env=full_env, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"memmesh {' '.join(args)} failed: {proc.stderr}")
    return proc


def mm_here(*args: str, home: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """``mm`` through ``node.cli.main`` in this process: its exit code, stdout and stderr (what
    it prints there; log records go to pytest's log capture, not into ``stderr``)."""
    argv = (["--home", str(home)] if home is not None else []) + list(args)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors (2) and --help (0)
            code = exc.code if isinstance(exc.code, int) else 1
    proc = subprocess.CompletedProcess(["memmesh", *argv], code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"memmesh {' '.join(args)} failed ({code}): {proc.stderr}")
    return proc


def test_init_prints_peer_key_and_creates_0600_key(tmp_path):
    home = tmp_path / "node"
    out = mm("init", home=home).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("peer key: "))
    key = PublicKey.parse(line.removeprefix("peer key: "))
    key_file = home / "keys" / "peer.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    with Home.open(home) as node:
        assert node.peer_key.public == key


def test_init_twice_keeps_the_key(tmp_path):
    home = tmp_path / "node"
    first = json.loads(mm_here("--json", "init", home=home).stdout)
    second = json.loads(mm_here("--json", "init", home=home).stdout)
    assert first["created"] is True and second["created"] is False
    assert first["peer_key"] == second["peer_key"]


def test_status_json_lists_databases_with_counts_and_heads(tmp_path):
    home = tmp_path / "node"
    mm_here("init", home=home)
    with Home.open(home) as node:
        key = node.new_key("bank-x")
        db = node.create_database(key, {"kind": "bank", "display_name": "notes"})
        with db.transaction(key) as txn:
            txn.append("memory", {"key": "a", "value": "b"})
        heads = list(db.heads)
    data = json.loads(mm_here("status", "--json", home=home).stdout)
    assert data["peer_key"].startswith("ed25519:")
    [entry] = data["databases"]
    assert entry["id"] == db.id and entry["entries"] == 2 and entry["heads"] == heads
    assert entry["kind"] == "bank" and entry["name"] == "notes"
    human = mm("status", home=home).stdout
    assert db.id in human and "entries=2" in human


def test_memmesh_home_is_the_default(tmp_path, monkeypatch):
    home = tmp_path / "from-env"
    mm("init", env={"MEMMESH_HOME": str(home)})
    assert (home / "keys" / "peer.key").exists()
    monkeypatch.setenv("MEMMESH_HOME", str(home))
    data = json.loads(mm_here("--json", "status").stdout)
    assert data["home"] == str(home)


def test_status_without_init_is_one_clear_line(tmp_path):
    proc = mm("status", home=tmp_path / "nothing", check=False)
    assert proc.returncode == 1
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "run: memmesh" in lines[0] and lines[0].endswith(" init")


def test_key_file_readable_by_others_is_refused(tmp_path):
    home = tmp_path / "node"
    mm_here("init", home=home)
    os.chmod(home / "keys" / "peer.key", 0o644)
    proc = mm("status", home=home, check=False)
    assert proc.returncode == 1 and "chmod 600" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_home_that_is_a_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "file"
    bad.write_text("not a directory")
    proc = mm("init", home=bad, check=False)
    assert proc.returncode != 0
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_usage_error_exits_2():
    proc = mm("no-such-command", check=False)
    assert proc.returncode == 2


@pytest.mark.parametrize("garbage", [b"", b"not sqlite at all" * 100])
def test_damaged_storage_file_is_a_clear_error(tmp_path, garbage):
    home = tmp_path / "node"
    mm_here("init", home=home)
    mm_here("status", home=home)
    (home / "node.sqlite").write_bytes(garbage)
    for suffix in ("-wal", "-shm"):
        p = home / f"node.sqlite{suffix}"
        if p.exists():
            p.unlink()
    proc = mm("status", home=home, check=False)
    if garbage:
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
    else:
        assert proc.returncode == 0  # an empty file is a new, empty database


def test_one_process_at_a_time_per_home(tmp_path):
    """Two writers with one agent key would fork its feed (equivocation): a home is locked."""
    from memmesh.node.home import HomeBusy

    home = tmp_path / "node"
    mm_here("init", home=home)
    holder = Home.open(home)
    try:
        with pytest.raises(HomeBusy) as err:
            Home.open(home, lock_timeout=0.2)
        assert str(os.getpid()) in str(err.value)
        # A command from another process waits for the lock, then runs.
        proc = subprocess.Popen([sys.executable, "-m", "memmesh.node.cli", "--home", str(home), "status", "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        import time

        time.sleep(1.0)
        assert proc.poll() is None, "the second process must wait while the home is open"
    finally:
        holder.close()
    out, errs = proc.communicate(timeout=60)
    assert proc.returncode == 0, errs
    assert json.loads(out)["peer_key"].startswith("ed25519:")


# ---------------------------------------------------------------- what the README promises
@pytest.mark.parametrize("argv,prog,message", [
    (["memory", "grant"], "memmesh memory grant", "the following arguments are required: bank, who, perm"),
    (["memory"], "memmesh memory", "the following arguments are required: ACTION"),
    (["no-such-command"], "memmesh", "argument COMMAND: invalid choice: 'no-such-command'"),
    (["recall", "alpha", "q", "--limit", "many"], "memmesh recall", "argument --limit: invalid int value: 'many'"),
    (["memory", "grant", "b", "a", "owner"], "memmesh memory grant", "argument perm: invalid choice: 'owner'"),
    (["status", "--no-such-flag"], "memmesh", "unrecognized arguments: --no-such-flag"),
])
def test_a_usage_error_is_one_line_naming_the_commands_help(argv, prog, message):
    proc = mm_here(*argv, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"{prog}: error: {message}") and line.endswith(f" (see {prog} --help)"), line


def test_a_usage_error_of_a_real_process_is_one_line():
    proc = mm("tool", check=False)
    assert proc.returncode == 2
    assert proc.stderr == ("memmesh tool: error: the following arguments are required: agent, tool "
                           "(see memmesh tool --help)\n")


def test_the_memory_summary_names_every_memory_action():
    from memmesh.node.commands import load

    actions = [c.name.split(".")[1] for c in load() if c.name.startswith("memory.")]
    assert len(actions) > 17
    top = mm_here("--help").stdout
    summary = " ".join(top.split("\n    memory", 1)[1].split("\n    reload", 1)[0].split())
    assert summary == "memory banks: " + ", ".join(actions)


def test_a_bank_name_outside_ascii_is_refused_saying_ascii(tmp_path):
    home = tmp_path / "node"
    mm_here("init", home=home)
    proc = mm_here("memory", "new", "ünïcødé-bank", home=home, check=False)
    assert proc.returncode == 1
    # the model's pattern or the registry's check says it, in the same words
    [line] = proc.stderr.splitlines()
    assert "'ünïcødé-bank'" in line and "1-64 ASCII letters, digits, '.', '_' or '-'" in line, line
    from memmesh.node.registry import NameError_, check_name

    with pytest.raises(NameError_) as err:
        check_name("ünïcødé-bank", "bank")
    assert str(err.value).endswith("starting with a letter or digit ('ü' is none of these)")


def test_a_home_below_a_file_names_the_file(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    init = mm_here("init", home=afile, check=False)
    assert init.returncode == 1
    assert init.stderr == f"memmesh: error: {afile} is a file, not a directory: a home is a directory; name another " \
                          "path for it\n"
    status = mm_here("status", home=afile, check=False)  # not "no memmesh node ...; run: init"
    assert status.returncode == 1 and status.stderr == init.stderr
    below = mm_here("init", home=afile / "sub" / "home", check=False)
    assert below.returncode == 1
    assert below.stderr == (f"memmesh: error: {afile} is a file, not a directory, so the home {afile / 'sub' / 'home'} "
                            "cannot be made in it; name another path for the home\n")
    assert afile.read_text() == "not a directory"


def _remembered(home: Path) -> str:
    mm_here("agent", "new", "alpha", home=home)
    return json.loads(mm_here("--json", "remember", "alpha", "k", "a value", home=home).stdout)["entry"]


def test_explain_resolves_a_unique_short_id(tmp_path):
    home = tmp_path / "node"
    mm_here("init", home=home)
    entry = _remembered(home)
    digits = entry.removeprefix("sha256:")
    for short in (f"sha256:{digits[:8]}", digits[:12], f"sha256:{digits[:10]}…"):  # the last: as status prints it
        data = json.loads(mm_here("--json", "explain", short, home=home).stdout)
        assert data["entry"] == entry and "Accepted" in data["explanation"], short
    too_short = mm_here("explain", f"sha256:{digits[:7]}", home=home, check=False)
    assert too_short.returncode == 1
    [line] = too_short.stderr.splitlines()  # the model's pattern or the handler says it
    assert f"sha256:{digits[:7]}" in line and "at least 8 hex digits" in line, line
    other = "0" * 8 if not digits.startswith("0" * 8) else "f" * 8
    unknown = mm_here("explain", f"sha256:{other}", home=home, check=False)
    assert unknown.returncode == 1
    assert unknown.stderr == f"memmesh: error: sha256:{other} is not known to any database of this node\n"


def test_explain_lists_the_ids_an_ambiguous_short_id_starts(tmp_path):
    from memmesh.node import Node

    home = tmp_path / "node"
    mm_here("init", home=home)
    _remembered(home)
    # Two refusals whose ids share 8 hex digits (no two real digests do, short of 2^32 tries):
    # recorded as a refused entry's digest is, in the database's refusal log.
    twins = [f"sha256:c94cdf41{'a' * 56}", f"sha256:c94cdf41{'b' * 56}"]
    with Node.open(home) as node:
        db = node.agents.resolve("alpha").db
        db._refusals.record([(t, "entry.signature", "the signature does not verify") for t in twins], "peer:test")
    proc = mm_here("explain", "sha256:c94cdf41", home=home, check=False)
    assert proc.returncode == 1
    assert proc.stderr == (f"memmesh: error: sha256:c94cdf41 starts 2 entry ids: {twins[0]}, {twins[1]}; "
                           "give more of the id\n")
    data = json.loads(mm_here("--json", "explain", "sha256:c94cdf41b", home=home).stdout)
    assert data["entry"] == twins[1] and "refused (entry.signature) from peer:test" in data["explanation"]


@pytest.mark.parametrize("peer,detail", [
    ("http://127.0.0.1:1", "not an IPv4 address: '//127.0.0.1'"),
    ("127.0.0.1:7411", "an address hint looks like 'http:<host>:<port>', got '127.0.0.1:7411'"),
    ("http:127.0.0.1:port", "a port is a decimal integer in 1..65535"),
])
def test_sync_refuses_a_malformed_peer_address_before_connecting(tmp_path, peer, detail):
    home = tmp_path / "node"
    mm_here("init", home=home)
    proc = mm_here("sync", "--peer", peer, home=home, check=False)
    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    assert line.startswith("memmesh: error: --peer is not a peer address (http:HOST:PORT, e.g. http:127.0.0.1:7411): "
                           + detail), line


def test_sync_with_an_unreachable_peer_says_so_in_a_sentence(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        home = tmp_path / "node"
        mm_here("init", home=home)
        proc = mm_here("sync", "--peer", f"http:127.0.0.1:{port}", home=home, check=False)
    assert proc.returncode == 1
    assert proc.stderr == (f"memmesh: error: http:127.0.0.1:{port}: FAILED: cannot connect to 127.0.0.1:{port} "
                           "(connection refused)\n")


def test_check_of_a_storage_file_without_its_header_says_restore_at_once(tmp_path):
    home = tmp_path / "node"
    mm_here("init", home=home)
    _remembered(home)
    with open(home / "node.sqlite", "r+b") as f:
        f.write(b"\0" * 100)  # SQLite's header, and with it every way into the file
    check = mm_here("check", home=home, check=False)
    assert check.returncode == 1
    assert check.stdout.splitlines()[-1] == ("verdict: DAMAGED: the storage file cannot be read, and check --repair "
                                             "cannot rebuild it: restore a backup (memmesh restore)")
    assert "--repair (with serve stopped)" not in check.stdout
    status = mm_here("status", home=home, check=False)
    assert status.returncode == 1 and "restore a backup (memmesh restore)" in status.stderr
