"""memmesh backup and restore: a consistent copy of a home that is itself a home, with or without
serve, taken while serve accepts writes; put back in place by restore, which never overwrites a
home it was not told to replace."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from memmesh.node.api_token import read_token
from memmesh.node.cli import run_command
from memmesh.node.commands import REGISTRY, ParamsError
from memmesh.node.commands.backup import BackupError, RestoreError
from memmesh.node.library import Node
from tests.procs import Serve, processes, until

CLI = [sys.executable, "-m", "memmesh.node.cli"]


def mm(home: Path, *args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([*CLI, "--home", str(home), *args], capture_output=True, text=True, cwd=cwd, timeout=60)
    if check:
        assert out.returncode == 0, out
    return out


@pytest.fixture
def home(tmp_path) -> Path:
    h = tmp_path / "home"
    with Node.open(h) as node:
        node.run("agent.new", {"name": "alpha"})
        node.run("memory.new", {"name": "notes"})
        node.run("memory.grant", {"bank": "notes", "agent": "alpha", "perm": "write"})
        for i in range(20):
            node.call_tool("alpha", "remember", {"key": f"k{i}", "value": f"value number {i}", "bank": "notes",
                                                 "on_duplicate": "create"})  # near-duplicates of each other
    return h


def _recalled(home: Path) -> list[str]:
    with Node.open(home, create=False) as node:
        data = node.call_tool("alpha", "recall", {"query": "", "bank": "notes", "limit": 100})
        assert len(data["memories"]) < 100, "more memories than one recall lists: this would miss some"
        return sorted(m["key"] for m in data["memories"])


def test_a_backup_is_a_home_holding_everything_with_private_modes(home, tmp_path):
    dest = tmp_path / "backup"
    with Node.open(home, create=False) as node:
        result = node.run("backup", {"dest": str(dest)})
        ids = sorted(node.database_ids())
    assert result.data["databases"] == len(ids) == 2  # alpha's database and the bank
    assert _recalled(dest) == _recalled(home) == sorted(f"k{i}" for i in range(20))
    with Node.open(dest, create=False) as copy:
        assert sorted(copy.database_ids()) == ids
        # the same keys: the copy can go on writing as the node it was
        copy.call_tool("alpha", "remember", {"key": "after", "value": "written on the restored home", "bank": "notes"})
    for f in [dest, dest / "keys", *dest.rglob("*")]:
        mode = stat.S_IMODE(f.stat().st_mode)
        assert mode & 0o077 == 0, f"{f} has mode {mode:o}"


@pytest.mark.parametrize("case", ["not empty", "inside the home", "relative"])
def test_a_bad_destination_is_refused_and_nothing_is_written(home, tmp_path, case):
    if case == "not empty":
        dest = tmp_path / "busy"
        dest.mkdir()
        (dest / "mine.txt").write_text("keep me")
    elif case == "inside the home":
        dest = home / "nested"
    else:
        dest = Path("relative/dir")
    with Node.open(home, create=False) as node:
        before = sorted(p.name for p in home.iterdir())
        with pytest.raises(ParamsError if case == "relative" else BackupError) as err:
            node.run("backup", {"dest": str(dest)})
        assert sorted(p.name for p in home.iterdir()) == before
    assert {"not empty": "not an empty directory", "inside the home": "inside the home",
            "relative": "absolute path"}[case] in str(err.value)
    if case == "not empty":
        assert [p.name for p in dest.iterdir()] == ["mine.txt"]


@pytest.mark.slow
def test_backup_through_a_running_serve_with_a_relative_path(home, tmp_path):
    with processes() as procs:
        procs.serve(home).start().wait_ready()
        out = mm(home, "backup", "bk", cwd=tmp_path)  # relative to where the user stands
        assert f"to {tmp_path / 'bk'}" in out.stdout
        mm(home, "remember", "alpha", "later", "after the backup", "--bank", "notes")
    assert "later" not in _recalled(tmp_path / "bk")
    assert _recalled(tmp_path / "bk") == sorted(f"k{i}" for i in range(20))
    assert os.path.exists(tmp_path / "bk" / "api.token")


# ============================================================================ restore
def _modes_private(root: Path) -> None:
    for f in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(f.stat().st_mode)
        assert mode == (0o700 if f.is_dir() else 0o600), f"{f} has mode {mode:o}"


def _restore(home: Path, src: Path, force: bool = False):
    return run_command(home, "restore", {"src": str(src), "force": force})


@pytest.fixture
def backup_dir(home, tmp_path) -> Path:
    dest = tmp_path / "backup"
    with Node.open(home, create=False) as node:
        node.run("backup", {"dest": str(dest)})
    return dest


def test_restore_into_a_new_home_gives_the_backup_back(home, backup_dir, tmp_path):
    new = tmp_path / "restored"
    result = _restore(new, backup_dir)
    assert result.data["databases"] == 2 and result.data["moved_aside"] is None
    assert "start serve" in result.text and "private keys unencrypted" in result.text
    _modes_private(new)
    assert sorted(p.name for p in new.iterdir()) == sorted(p.name for p in backup_dir.iterdir())
    assert _recalled(new) == _recalled(home)
    assert not [p for p in tmp_path.iterdir() if "restoring" in p.name]  # no staging left behind


def test_restore_refuses_a_home_that_is_not_empty_and_force_moves_it_aside(home, backup_dir, tmp_path):
    target = tmp_path / "target"
    _restore(target, backup_dir)
    with Node.open(target, create=False) as node:  # the target now differs from the backup
        node.call_tool("alpha", "remember", {"key": "only-here", "value": "kept aside", "bank": "notes"})
    with pytest.raises(RestoreError) as err:
        _restore(target, backup_dir)
    assert "is not empty; nothing was changed" in str(err.value) and "--force" in str(err.value)
    assert "only-here" in _recalled(target)
    result = _restore(target, backup_dir, force=True)
    aside = Path(result.data["moved_aside"])
    assert aside.parent == tmp_path and aside.name.startswith("target.replaced-")
    assert "only-here" in _recalled(aside) and "only-here" not in _recalled(target)
    assert f"now {aside}" in result.text


def test_restore_replaces_a_home_too_damaged_to_open(home, backup_dir, tmp_path):
    """What restore is for: it never opens the home it replaces."""
    target = tmp_path / "damaged"
    _restore(target, backup_dir)
    (target / "node.sqlite").write_bytes(b"\x00garbage" * 1000)
    result = _restore(target, backup_dir, force=True)
    assert _recalled(target) == _recalled(home)
    assert (Path(result.data["moved_aside"]) / "node.sqlite").read_bytes() == b"\x00garbage" * 1000


@pytest.mark.parametrize("case", ["no storage", "no peer key", "damaged storage", "inside the home", "relative"])
def test_restore_refuses_what_is_not_a_backup_and_changes_nothing(home, backup_dir, tmp_path, case):
    src = tmp_path / "src"
    target = tmp_path / "target"
    if case == "inside the home":
        src = target / "backup"
        target.mkdir()
    import shutil
    shutil.copytree(backup_dir, src)
    if case == "no storage":
        (src / "node.sqlite").unlink()
    elif case == "no peer key":
        (src / "keys" / "peer.key").unlink()
    elif case == "damaged storage":
        with open(src / "node.sqlite", "r+b") as f:
            f.seek(4096)  # the second page: the schema page is fine, the data is not
            f.write(os.urandom(4096))
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ParamsError if case == "relative" else RestoreError) as err:
        _restore(target, Path("relative/src") if case == "relative" else src)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no target made, no staging left
    assert {"no storage": "is not a memmesh backup", "no peer key": "is not a memmesh backup",
            "damaged storage": "is damaged", "inside the home": "overlap",
            "relative": "absolute path"}[case] in str(err.value)
    if case == "damaged storage":
        assert str(err.value).endswith("nothing was changed: restore another backup")


def test_home_may_follow_the_command_as_the_issue_writes_it():
    from memmesh.node.cli_args import build_parser, command_of

    for argv in (["--home", "/h", "restore", "/b"], ["restore", "/b", "--home", "/h"]):
        args = build_parser().parse_args(argv)
        assert args.home == Path("/h") and command_of(args) == ("restore", {"src": "/b"})
    assert not hasattr(build_parser().parse_args(["restore", "/b"]), "home")  # then: $MEMMESH_HOME


# ============================================================================ while serve writes
class ApiWriter(threading.Thread):
    """Remembers w0, w1, ... through serve's local HTTP API, one request after another; ``acked``
    lists, in order, each key whose answer came back ok (the write is committed then)."""

    def __init__(self, serve: Serve, limit: int = 70) -> None:
        super().__init__(daemon=True)
        self.url = f"http://{serve.info['api']}/v1/agents/alpha/tools/remember"
        self.token = read_token(serve.home)
        self.limit = limit
        self.acked: list[str] = []
        self.errors: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        for i in range(self.limit):
            if self._halt.is_set():
                return
            body = json.dumps({"key": f"w{i}", "value": f"written while backing up {i}", "bank": "notes"})
            req = urllib.request.Request(self.url, data=body.encode(), method="POST", headers={
                "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    answer = json.loads(resp.read())
            except Exception as exc:  # the test fails on it, with what went wrong
                self.errors.append(repr(exc))
                return
            if answer.get("data", {}).get("ok"):
                self.acked.append(f"w{i}")
            self._halt.wait(0.01)

    def stop(self) -> None:
        self._halt.set()
        self.join(60)


@pytest.mark.slow
def test_a_backup_taken_while_serve_accepts_writes_holds_every_acknowledged_write(home, tmp_path):
    dest, new = tmp_path / "backup", tmp_path / "restored"
    with Node.open(home, create=False) as node:  # no model to load in every process that recalls
        node.run("embedder.set", {"provider": "none"})
    with processes() as procs:
        serve = procs.serve(home).start().wait_ready()
        writer = ApiWriter(serve)
        writer.start()
        try:
            until(lambda: len(writer.acked) >= 15 or writer.errors, 60, "the writer's first writes")
            acked_before = list(writer.acked)  # acknowledged before the backup started
            mm(home, "backup", str(dest))
            during = len(writer.acked)
            until(lambda: len(writer.acked) >= during + 5 or writer.errors or not writer.is_alive(), 60,
                  "writes after the backup")
        finally:
            writer.stop()
        assert not writer.errors, writer.errors
        assert len(writer.acked) > len(acked_before)  # writes went on around the backup

        # The backup opens, holds every write acknowledged before it started, and verifies.
        assert mm(dest, "status").returncode == 0
        backed_up = _recalled(dest)
        assert set(acked_before) | {f"k{i}" for i in range(20)} <= set(backed_up)
        assert set(backed_up) <= set(writer.acked) | {f"k{i}" for i in range(20)}
        found = run_command(dest, "recall", {"agent": "alpha", "query": "written while backing up", "bank": "notes",
                                             "limit": 100}).data["memories"]
        assert set(acked_before) <= {m["key"] for m in found}
        if "check" in REGISTRY.names():  # `memmesh check` (issue 13, part 2): every entry verifies
            assert mm(dest, "check").returncode == 0

        # Restore it into a new home (--home after the command, as the issue writes it).
        out = subprocess.run([*CLI, "restore", str(dest), "--home", str(new)], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out
        assert f"restored {dest} into {new}" in out.stdout and "unencrypted" in out.stdout
        assert _recalled(new) == backed_up
        _modes_private(new)

        # Never into the home serve runs on, --force or not; nothing of it changes.
        before = sorted(p.name for p in home.iterdir())
        out = mm(home, "restore", str(dest), "--force", check=False)
        assert out.returncode == 1 and f"serve is running for {home} (pid {serve.proc.pid})" in out.stderr, out
        assert sorted(p.name for p in home.iterdir()) == before
        assert not [p for p in tmp_path.iterdir() if ".replaced-" in p.name]

    # A home that is there is refused without --force, and moved aside (not deleted) with it.
    with pytest.raises(RestoreError, match="is not empty; nothing was changed"):
        _restore(new, dest)
    aside = Path(_restore(new, dest, force=True).data["moved_aside"])
    assert aside.name.startswith("restored.replaced-")
    assert _recalled(aside) == _recalled(new) == backed_up
