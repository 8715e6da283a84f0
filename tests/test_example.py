"""examples/agent_loop.py runs against a real serve's HTTP API, as a harness author would run it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import processes

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "agent_loop.py"
CLI = [sys.executable, "-m", "memmesh.node.cli"]


def mm(home: Path, *args: str) -> str:
    out = subprocess.run([*CLI, "--home", str(home), *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out
    return out.stdout


@pytest.mark.slow
def test_the_agent_loop_remembers_then_answers_from_its_relevant_memories(tmp_path):
    home = tmp_path / "home"
    mm(home, "init")
    mm(home, "embedder", "set", "none")
    mm(home, "agent", "new", "alpha")
    with processes() as procs:
        procs.serve(home).start().wait_ready()
        run = subprocess.run(
            [sys.executable, str(EXAMPLE), "--home", str(home), "--agent", "alpha",
             "remember: the deploy key lives in the ops vault",
             "where does the deploy key live?"],
            capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert run.returncode == 0, run
        lines = run.stdout.splitlines()
        # the first turn made a remember tool call, answered with the committed entry's id
        assert lines[1].startswith("agent: Noted (entry sha256:"), run.stdout
        # the second turn was answered from the ## Relevant Memories block fetched before the model call
        assert lines[3] == "agent: From memory: **the deploy key lives**: the deploy key lives in the ops vault", run.stdout
        entry = lines[1].split("entry ")[1].rstrip(").")
        explained = json.loads(mm(home, "--json", "explain", entry))
        assert explained["entry"] == entry and "Accepted" in explained["explanation"], explained
