"""memmesh backup: a consistent copy of a home that is itself a home, with or without serve."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from node.commands import ParamsError
from node.commands.backup import BackupError
from node.library import Node
from tests.procs import processes

CLI = [sys.executable, "-m", "node.cli"]


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
            node.call_tool("alpha", "remember", {"key": f"k{i}", "value": f"value number {i}", "bank": "notes"})
    return h


def _recalled(home: Path) -> list[str]:
    with Node.open(home, create=False) as node:
        data = node.call_tool("alpha", "recall", {"query": "", "bank": "notes", "limit": 50})
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
