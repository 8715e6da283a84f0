"""`make demo` (python -m node.demo) as a user runs it: two real serve processes, every step a
real `memmesh` process; it finishes (exit 0, every step shown and checked) and leaves no process
behind, also when it is interrupted (Ctrl-C reaches its whole process group, as a terminal
sends it). How long it takes is not asserted: the demo prints it ("# demo finished in ...") and
each wait for the other peer; the demo itself gives up on a peer after its REACH_TIMEOUT_S.

No process is left behind = no process on the machine has the demo's temporary directory on
its command line (every serve and every step runs with --home inside it)."""
from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memmesh.node.demo import Demo, DemoFailed

pytestmark = pytest.mark.slow

DEMO = [sys.executable, "-m", "memmesh.node.demo"]
REPO = Path(__file__).resolve().parent.parent
HANG_GUARD_S = 300.0  # only so that a hung demo fails: how long it took is printed, not asserted
ROOT_LINE = re.compile(r"^# memmesh demo: two peers, A and B, in (\S+) ", re.MULTILINE)
SERVE_PID = re.compile(r" serves peers at \S+.*\(pid (\d+),")
PEERS_UP = "$ memmesh --home A agent new alpha"  # the first step after both serves answered


def _mentioning(text: str) -> list[str]:
    """Command lines of the processes on this machine that mention ``text``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            args = cmdline.read_bytes().split(b"\0")
            if any(text.encode() in a for a in args) and cmdline.parent.name != str(os.getpid()):
                found.append(f"{cmdline.parent.name}: {b' '.join(args).decode(errors='replace')}")
    return found


def _root(out: str) -> str:
    match = ROOT_LINE.search(out)
    assert match, out[:500]
    return match.group(1)


class Running:
    """The demo in its own session, its output collected by a thread (lines as they come)."""

    def __init__(self, *args: str, command: list[str] = DEMO) -> None:
        self.proc = subprocess.Popen([*command, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def has_line(self, start: str) -> bool:
        return any(line.startswith(start) for line in list(self.lines))

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(10)
        return code

    def kill(self) -> None:
        """What the test started, whatever state it is in: the demo's group and its serves."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        root = ROOT_LINE.search(self.out)
        for pid in SERVE_PID.findall(self.out):
            with contextlib.suppress(OSError):  # only if that pid is still the demo's serve
                if root and root.group(1).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(int(pid), signal.SIGKILL)


def test_demo_runs_the_walkthrough_across_two_peers_and_leaves_nothing_behind():
    # `make demo` itself, as the README says to run it (its virtualenv exists: make test made it).
    demo = Running(command=["make", "-s", "demo"] if shutil.which("make") else DEMO)
    try:
        code = demo.wait(HANG_GUARD_S)
        out = demo.out
        assert code == 0, out
        print("\n" + "".join(line for line in demo.lines if line.startswith("# demo finished in ")).strip())
    finally:
        demo.kill()
    root = _root(out)
    # Each step is printed as typed (homes A and B, never the temporary paths), then its output.
    for step in ("$ memmesh --home A init", "$ memmesh --home B init", "$ memmesh --home A embedder set hashed",
                 "$ memmesh --home A serve --listen 127.0.0.1:0",
                 "$ memmesh --home A memory grant project-notes beta read",
                 "$ memmesh --home A memory share project-notes --perm admin",
                 "$ memmesh --home B memory import 'memmesh:?db=",
                 "$ memmesh --home B memory grant project-notes gamma write",
                 "$ memmesh --home A memory revoke project-notes beta"):
        assert f"\n{step}" in out, step
    assert not [line for line in out.splitlines() if line.startswith("$ ") and root in line]
    assert "initialised memmesh node in A\n" in out
    assert "# embedder hashed: offline" in out
    assert "imported project-notes (" in out and " with admin: " in out
    # beta reads, its write is refused (nothing stored); after the revocation it may not even read.
    assert out.count("Each conversation gets its own database.") >= 2
    assert "agent beta may not write to bank project-notes (its key holds read permission)" in out
    assert "agent beta may not write to bank project-notes (its key holds no permission)" in out
    assert "agent beta may not read from bank project-notes (its key holds no permission)" in out
    # Writes travel both ways through the daemons (the demo only waits and looks: no step syncs),
    # each wait reported by the demo (within its own REACH_TIMEOUT_S, or it would have failed).
    a_recall = out.split("$ memmesh --home A recall alpha gamma", 1)[1].split("\n$ ", 1)[0]
    assert "gamma.note: gamma wrote this on node B" in a_recall
    b_recall = out.split("$ memmesh --home B recall gamma later", 1)[1].split("\n$ ", 1)[0]
    assert "alpha.later: alpha wrote this later on node A" in b_recall
    waits = re.findall(r"^# \.\.\. on ([AB]) (\d+\.\d\d) s after the command returned", out, re.MULTILINE)
    assert [w[0] for w in waits] == ["A", "B", "B"], out
    assert not re.search(r"^\$ memmesh --home [AB] sync\b", out, re.MULTILINE), out  # the daemons carried them
    print(f"waits for the other peer: {waits}")
    assert "# serve for A stopped" in out and "# serve for B stopped" in out and "# demo finished in " in out
    # Nothing left: no process mentions the demo's directory, and the directory is gone.
    assert len(SERVE_PID.findall(out)) == 2
    assert _mentioning(root) == []
    assert not Path(root).exists()


@pytest.fixture(scope="module")
def interrupted() -> Iterator[dict[str, tuple[int, str]]]:
    """Two demos run at once, each interrupted as soon as its peers run: one by Ctrl-C at the
    terminal (SIGINT to its whole process group), one with --keep by `kill PID` (SIGTERM to the
    demo alone). Each spends most of its time waiting for its own processes, so together they
    take about the time of one. Their exit codes and outputs, by name."""
    demos = {"ctrl-c": Running(), "sigterm --keep": Running("--keep")}
    kept = None
    try:
        # What a terminal does for Ctrl-C: the demo and the step it runs; `kill PID`: the demo.
        stop = {"ctrl-c": lambda d: os.killpg(d.proc.pid, signal.SIGINT),
                "sigterm --keep": lambda d: d.proc.send_signal(signal.SIGTERM)}
        waiting = dict(demos)
        deadline = time.monotonic() + 60.0
        while waiting:
            for name, demo in list(waiting.items()):
                if demo.has_line(PEERS_UP):
                    if name == "sigterm --keep":
                        kept = _root(demo.out)
                    stop[name](demo)
                    del waiting[name]
                else:
                    assert demo.proc.poll() is None, f"the demo exited {demo.proc.returncode} first:\n{demo.out}"
                    assert time.monotonic() < deadline, f"no line {PEERS_UP!r} in 60 s:\n{demo.out}"
            time.sleep(0.05)
        codes = {name: demo.wait(60) for name, demo in demos.items()}
        yield {name: (codes[name], demo.out) for name, demo in demos.items()}
    finally:
        for demo in demos.values():
            demo.kill()
        if kept is not None:
            shutil.rmtree(kept, ignore_errors=True)


def test_ctrl_c_stops_the_peers_and_exits_130(interrupted):
    code, out = interrupted["ctrl-c"]
    assert code == 130, out
    assert "# interrupted, stopping the peers" in out
    assert "# serve for A stopped" in out and "# serve for B stopped" in out
    assert "demo finished" not in out and "Traceback" not in out
    root = _root(out)
    assert _mentioning(root) == []
    assert not Path(root).exists()


def test_sigterm_with_keep_stops_the_peers_and_keeps_the_homes(interrupted):
    code, out = interrupted["sigterm --keep"]
    root = _root(out)
    assert code == 128 + signal.SIGTERM, out
    assert "# interrupted, stopping the peers" in out and f"# kept {root} " in out
    assert _mentioning(root) == []
    # The homes stay, and each serve went away cleanly (it removes its serve.json last thing).
    for home in ("A", "B"):
        assert (Path(root) / home / "node.sqlite").exists()
        assert not (Path(root) / home / "serve.json").exists()
        assert (Path(root) / f"{home}-serve.log").exists()


def test_a_step_that_does_not_show_what_it_must_stops_the_demo(tmp_path):
    """The checks of a step, on real `memmesh` processes for a real home (no serve needed)."""
    out = io.StringIO()
    demo = Demo(tmp_path, out)
    demo.mm(demo.a, "init", expect=["peer key: "])
    with pytest.raises(DemoFailed, match=r"`memmesh --home A agent new alpha` should have shown 'agent beta created'"):
        demo.mm(demo.a, "agent", "new", "alpha", expect=["agent beta created"])
    with pytest.raises(DemoFailed, match=r"memory grant nope` failed \(exit 1\): memmesh: error: .*nope"):
        demo.mm(demo.a, "memory", "grant", "nope", "alpha", "write")
    with pytest.raises(DemoFailed, match=r"should have been refused with one line saying 'may not write'; it exited 0"):
        demo.mm(demo.a, "agent", "list", refused="may not write")
    # Each was printed as typed, with its output, and the home shown as A.
    text = out.getvalue()
    assert "$ memmesh --home A memory grant nope alpha write\nmemmesh: error: " in text
    assert "initialised memmesh node in A\n" in text and str(tmp_path) not in text
