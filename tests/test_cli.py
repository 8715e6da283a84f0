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
