"""`make demo`: the walkthrough across two real peers, A and B, as a user would type it.

Two homes in a temporary directory, one `memmesh serve` process for each (loopback only, no LAN
discovery), and every step a real `memmesh` command in its own process: the command is printed
as it would be typed (homes shown as A and B), then its output, then checked. A step that does
not show what it must stops the demo with a one-line reason and exit code 1.

The serves run in their own sessions, so a Ctrl-C at the terminal reaches the demo (and the
command it is running) but not them: the demo stops them itself, whatever happens (SIGTERM,
then SIGKILL after a deadline), and removes the directory unless ``--keep``. SIGINT or SIGTERM
to the demo prints "interrupted, stopping the peers" and exits 128 + the signal (130 for
Ctrl-C). On Linux each serve is also told to stop when the demo dies without cleaning up
(``PR_SET_PDEATHSIG``), so even a ``kill -9`` of the demo leaves no peer running.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from memmesh.auth.errors import MemmeshError
from memmesh.node.control import read_info, remote

CLI = [sys.executable, "-m", "memmesh.node.cli"]
BANK = "project-notes"
EMBEDDER = "hashed"
# Why that embedder, said in the output: the demo must run offline and fast on any machine.
EMBEDDER_WHY = ("offline, nothing to download or load, and bit-identical vectors on every machine, so both "
                "peers rank alike (`memmesh embedder set local` gives semantic recall)")
# Any free ports (two nodes share this machine, and a node of the user's may hold the defaults),
# loopback only, no LAN announcements, a pull every second.
SERVE_ARGS = ["--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0", "--no-discovery", "--interval", "1"]
COMMAND_TIMEOUT_S = 60.0  # one cold `memmesh` process on a loaded 2-core machine takes 1-3 s
START_TIMEOUT_S = 30.0
REACH_TIMEOUT_S = 20.0  # the daemons push on commit and pull every second: seconds, not this
STOP_TIMEOUT_S = 15.0  # serve drains in-flight work for up to 10 s before it exits
POLL_S = 0.05
PR_SET_PDEATHSIG = 1


class DemoFailed(Exception):
    """A step did not show what it must (the message says which and what it showed)."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached the demo (a BaseException, so no handler swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass
class Peer:
    """One node of the demo: its home and, while it runs, its `memmesh serve` process."""

    name: str
    home: Path
    proc: subprocess.Popen | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def log(self) -> Path:
        return self.home.parent / f"{self.name}-serve.log"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def started(self) -> subprocess.Popen:
        """Its serve process; asked only of a peer whose serve was started."""
        assert self.proc is not None
        return self.proc

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except FileNotFoundError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty log)"


def _die_with_parent() -> None:
    """In the serve child before exec: SIGTERM when the demo dies (Linux only; best effort)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


_PREEXEC = _die_with_parent if sys.platform == "linux" else None


class Demo:
    """The peers, how a step runs and is checked, and the clean-up."""

    def __init__(self, root: Path, out: TextIO) -> None:
        self.root = root
        self.out = out
        self.a = Peer("A", root / "A")
        self.b = Peer("B", root / "B")
        self.peers = (self.a, self.b)
        self._hurry = False  # a second signal during clean-up: SIGKILL at once
        self.key_names: dict[str, str] = {}  # public key -> who holds it, to read listings

    # ------------------------------------------------------------------ printing
    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def note(self, text: str) -> None:
        """Narration, as shell comments, so the transcript reads like a terminal session."""
        self.say(f"# {text}")

    def shown(self, text: str) -> str:
        """Text as the user would see it with homes named A and B."""
        for peer in self.peers:
            text = text.replace(str(peer.home), peer.name)
        return text

    # ------------------------------------------------------------------ steps
    def mm(self, peer: Peer, *args: str, expect: Sequence[str] = (), refused: str | None = None,
           json_out: bool = False) -> str:
        """Run `memmesh --home PEER ARGS` as its own process; print it and its output; check it.

        ``expect``: texts the output must contain. ``refused``: the command must fail with exit
        code 1, print nothing on stdout and one line on stderr containing this text."""
        for p in self.peers:
            if p.proc is not None and not p.running():
                raise DemoFailed(f"serve for {p.name} exited with {p.proc.returncode}; its log ends: {p.log_tail()}")
        argv = (["--json"] if json_out else []) + list(args)
        self.say(f"$ memmesh --home {peer.name} {shlex.join(argv)}")
        try:
            done = _run_step([*CLI, "--home", str(peer.home), *argv])
        except subprocess.TimeoutExpired:
            raise DemoFailed(f"`memmesh {args[0]}` on {peer.name} did not finish in {COMMAND_TIMEOUT_S:g} s") from None
        stdout, stderr = self.shown(done.stdout).rstrip("\n"), self.shown(done.stderr).rstrip("\n")
        for text in (stdout, stderr):
            if text:
                self.say(text)
        what = f"`memmesh --home {peer.name} {' '.join(args[:3])}`"
        if refused is not None:
            if done.returncode != 1 or stdout or refused not in stderr or len(stderr.splitlines()) != 1:
                raise DemoFailed(f"{what} should have been refused with one line saying {refused!r}; "
                                 f"it exited {done.returncode}")
        elif done.returncode != 0:
            raise DemoFailed(f"{what} failed (exit {done.returncode}): {stderr or stdout}")
        for text in expect:
            if text not in stdout:
                raise DemoFailed(f"{what} should have shown {text!r}")
        return done.stdout

    def name_key(self, output: str, prefix: str, name: str) -> str:
        """The key on the output's line starting with ``prefix``, remembered as ``name``."""
        key = next((line.strip().removeprefix(prefix) for line in output.splitlines()
                    if line.strip().startswith(prefix)), None)
        if key is None:
            raise DemoFailed(f"no line starting with {prefix!r} in the output of the step above")
        self.key_names[key] = name
        return key

    def call(self, peer: Peer, name: str, params: dict[str, Any]) -> Any:
        """One command through the peer's running serve (its control channel): how the demo
        watches a peer between steps without a process per look."""
        client = remote(peer.home)
        if client is None:
            raise DemoFailed(f"serve for {peer.name} does not answer; its log ends: {peer.log_tail()}")
        with client:
            return client.run(name, params).data

    def wait_for(self, what: str, where: Peer, seen: Callable[[], str | None]) -> str:
        """Poll ``seen`` until it answers (None: not there yet; else a detail to print); print
        and return how long it took since the writing command returned. DemoFailed after the
        deadline."""
        self.note(f"waiting for {what} to reach {where.name} ...")
        start = time.monotonic()
        while (detail := seen()) is None:
            if time.monotonic() - start > REACH_TIMEOUT_S:
                raise DemoFailed(f"{what} did not reach {where.name} in {REACH_TIMEOUT_S:g} s")
            time.sleep(POLL_S)
        said = f"on {where.name} {time.monotonic() - start:.2f} s after the command returned{detail}"
        self.note(f"... {said}")
        return said

    def recalled(self, peer: Peer, agent: str, query: str, value: str) -> str | None:
        """Once ``agent`` on ``peer`` recalls the memory ``value``: how long after it was signed."""
        data = self.call(peer, "recall", {"agent": agent, "query": query, "bank": BANK, "limit": 50})
        signed = next((m["time"] for m in data["memories"] if m["value"] == value), None)
        if signed is None:
            return None
        at = datetime.datetime.fromisoformat(signed).timestamp()
        return f" ({time.time() - at:.2f} s after it was signed)"

    def bank_keys(self, peer: Peer) -> dict[str, str]:
        [bank] = [b for b in self.call(peer, "memory.list", {})["banks"] if b["name"] == BANK]
        return {k["key"]: k["permission"] for k in bank["keys"]}

    def bank_entries(self, peer: Peer) -> int:
        [db] = [d for d in self.call(peer, "status", {})["databases"] if d["name"] == BANK]
        return int(db["entries"])

    # ------------------------------------------------------------------ serve processes
    def start_serves(self) -> None:
        for peer in self.peers:
            self.say(f"$ memmesh --home {peer.name} serve {shlex.join(SERVE_ARGS)} &")
            with open(peer.log, "w") as log:
                # preexec_fn is unsafe only with threads running, and the demo starts none.
                peer.proc = subprocess.Popen([*CLI, "--home", str(peer.home), "serve", *SERVE_ARGS],
                                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                             start_new_session=True, preexec_fn=_PREEXEC)
        for peer in self.peers:
            peer.info = self._ready(peer)
            api = f", its HTTP API at {peer.info['api']}" if peer.info.get("api") else ""
            self.note(f"{peer.name} serves peers at {peer.info['address']}{api} (pid {peer.started().pid}, "
                      f"log {peer.log.name}); commands for {peer.name} now go through it")

    def _ready(self, peer: Peer) -> dict[str, Any]:
        """serve.json once it names this very process (serve writes it when everything answers)."""
        assert peer.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if peer.proc.poll() is not None:
                raise DemoFailed(f"serve for {peer.name} exited with {peer.proc.returncode}: {peer.log_tail()}")
            info = read_info(peer.home)
            if info is not None and info.get("pid") == peer.proc.pid:
                return info
            if time.monotonic() >= deadline:
                raise DemoFailed(f"serve for {peer.name} did not start in {START_TIMEOUT_S:g} s: {peer.log_tail()}")
            time.sleep(POLL_S)

    def stop_serves(self) -> None:
        """SIGTERM to each serve's process group, SIGKILL to what is left after the deadline
        (or at once after a second signal). Never raises: it runs on every way out."""
        running = [p for p in self.peers if p.running()]
        if not running:
            return
        for peer in running:
            self._signal(peer, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(p.running() for p in running) and time.monotonic() < deadline and not self._hurry:
            time.sleep(POLL_S)
        for peer in running:
            if peer.running():
                self._signal(peer, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    peer.started().wait(5)
            code = peer.started().returncode
            self.note(f"serve for {peer.name} stopped (pid {peer.started().pid}, exit {code})")

    @staticmethod
    def _signal(peer: Peer, sig: int) -> None:
        # Only while the process is not reaped: its pid, and so its group id, is still ours.
        if peer.running():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(peer.started().pid, sig)

    def hurry(self, signum: int, frame: object) -> None:
        self._hurry = True

    # ------------------------------------------------------------------ the walkthrough
    def walkthrough(self) -> dict[str, str]:
        """Every step; how long each replication took."""
        took: dict[str, str] = {}
        self.say()
        self.note("two nodes, each with its own home (data directory and keys)")
        for peer in self.peers:
            self.name_key(self.mm(peer, "init", expect=["peer key: "]), "peer key: ", f"peer {peer.name}")
        self.note(f"embedder {EMBEDDER}: {EMBEDDER_WHY}")
        for peer in self.peers:
            self.mm(peer, "embedder", "set", EMBEDDER, expect=[f"embedder: {EMBEDDER}"])
        self.note("each node runs `memmesh serve`: the sync API for peers and the sync daemon")
        self.start_serves()

        self.say()
        self.note("on A: two agents and a bank; alpha may write it, beta may only read it")
        self.name_key(self.mm(self.a, "agent", "new", "alpha", expect=["agent alpha created"]), "key ", "alpha")
        beta_key = self.name_key(self.mm(self.a, "agent", "new", "beta", expect=["agent beta created"]), "key ", "beta")
        self.mm(self.a, "memory", "new", BANK, "Shared notes", expect=[f"bank {BANK} created"])
        self.mm(self.a, "memory", "grant", BANK, "alpha", "write")
        self.mm(self.a, "memory", "grant", BANK, "beta", "read")

        self.say()
        self.note("alpha remembers, through the agent tool an agent calls (JSON arguments)")
        sessions = "Each conversation gets its own database."
        self.mm(self.a, "tool", "alpha", "remember",
                json.dumps({"key": "architecture.sessions", "value": sessions, "bank": BANK}))
        self.note("beta recalls it")
        self.mm(self.a, "tool", "beta", "recall", json.dumps({"query": "sessions", "bank": BANK}), expect=[sessions])
        self.note("beta holds Read only: its write is refused, and nothing is stored")
        before = self.bank_entries(self.a)
        self.mm(self.a, "tool", "beta", "remember",
                json.dumps({"key": "beta.note", "value": "beta should never store this", "bank": BANK}),
                refused="may not write")
        after = self.bank_entries(self.a)
        if after != before:
            raise DemoFailed(f"beta's refused write changed the bank ({before} entries, then {after})")
        self.note(f"{BANK} still holds {after} entries on A")

        self.say()
        self.note("share the bank by ticket; admin, so B can grant its own agents")
        share = self.mm(self.a, "memory", "share", BANK, "--perm", "admin", expect=["memmesh:?", "(admin)"])
        ticket = next((w for w in share.split() if w.startswith("memmesh:")), None)
        if ticket is None:
            raise DemoFailed("`memmesh memory share` printed no ticket")
        self.note("on B: import it (B reaches A at the address the ticket carries and copies the bank)")
        self.mm(self.b, "memory", "import", ticket, "admin", expect=[f"imported {BANK}", "with admin"])
        if self.bank_keys(self.b).get(beta_key) != "read":
            raise DemoFailed(f"B's copy of {BANK} does not carry A's settings (beta's read grant)")
        self.note("B creates gamma and grants it write: a settings entry signed on B")
        self.name_key(self.mm(self.b, "agent", "new", "gamma", expect=["agent gamma created"]), "key ", "gamma")
        self.mm(self.b, "memory", "grant", BANK, "gamma", "write")

        self.say()
        self.note("gamma writes on B; the daemons carry it to A (no `memmesh sync`)")
        gamma_note = "gamma wrote this on node B"
        self.mm(self.b, "remember", "gamma", "gamma.note", gamma_note, "--bank", BANK)
        took["gamma's write, B to A"] = self.wait_for("gamma's write", self.a,
                                                      lambda: self.recalled(self.a, "alpha", "gamma", gamma_note))
        self.mm(self.a, "recall", "alpha", "gamma", "--bank", BANK, expect=[gamma_note])
        self.note("alpha writes on A; it reaches B")
        alpha_note = "alpha wrote this later on node A"
        self.mm(self.a, "remember", "alpha", "alpha.later", alpha_note, "--bank", BANK)
        took["alpha's write, A to B"] = self.wait_for("alpha's write", self.b,
                                                      lambda: self.recalled(self.b, "gamma", "later", alpha_note))
        self.mm(self.b, "recall", "gamma", "later", "--bank", BANK, expect=[alpha_note])

        self.say()
        self.note("A revokes beta; the daemons carry the revocation to B")
        self.mm(self.a, "memory", "revoke", BANK, "beta")
        took["beta's revocation, A to B"] = self.wait_for("the revocation", self.b,
                                                          lambda: None if beta_key in self.bank_keys(self.b) else "")
        self.note("beta may neither write nor read the bank any more")
        self.mm(self.a, "tool", "beta", "remember",
                json.dumps({"key": "beta.after", "value": "revoked beta should never store this", "bank": BANK}),
                refused="may not write")
        self.mm(self.a, "tool", "beta", "recall", json.dumps({"query": "sessions", "bank": BANK}),
                refused="may not read")
        self.note(f"what B's copy of {BANK} grants now")
        listed = json.loads(self.mm(self.b, "memory", "list", json_out=True))
        [bank] = [b for b in listed["banks"] if b["name"] == BANK]
        holders = {k["key"]: k["permission"] for k in bank["keys"]}
        if beta_key in holders:
            raise DemoFailed(f"B's copy of {BANK} still grants beta")
        # By elimination: the only key this demo did not name is the one `memory new` made the root.
        unnamed = [k for k in holders if k not in self.key_names]
        names = {**self.key_names, **({unnamed[0]: "the bank's own key"} if len(unnamed) == 1 else {})}
        held = sorted((perm, names.get(k, k[:20] + "...")) for k, perm in holders.items())
        self.note("that is: " + ", ".join(f"{who} {perm}" for perm, who in held) + "; beta holds nothing")
        return took


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _install(handler: Any) -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)


# A stop signal that lands while a step's process is being started is held until Popen has
# returned: raised inside Popen (after the fork), it would leave that process running, as
# nothing would have it to kill.
_spawning = False
_held: list[int] = []


def _run_step(argv: list[str]) -> subprocess.CompletedProcess:
    """subprocess.run(argv, capture_output=True, timeout=COMMAND_TIMEOUT_S), the step killed on
    every way out, an interruption while it starts included."""
    global _spawning
    proc = None
    try:
        _spawning = True
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        finally:
            _spawning = False
        if _held:
            raise Interrupted(_held.pop())
        stdout, stderr = proc.communicate(timeout=COMMAND_TIMEOUT_S)
    except BaseException:
        if proc is not None:
            proc.kill()
            proc.communicate()  # reaped, its pipes closed
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def _interrupt(signum: int, frame: object) -> None:
    if _spawning:
        _held.append(signum)
        return
    raise Interrupted(signum)


def run(keep: bool = False, out: TextIO = sys.stdout) -> int:
    """The demo; its exit code (0, 1 when a step failed, 128 + signal when interrupted)."""
    started = time.monotonic()
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    _install(_interrupt)
    root = Path(tempfile.mkdtemp(prefix="memmesh-demo-"))
    demo = Demo(root, out)
    code = 1
    try:
        demo.note(f"memmesh demo: two peers, A and B, in {root}"
                  + (" (kept afterwards)" if keep else " (removed afterwards)"))
        demo.note(f"A = {demo.a.home}, B = {demo.b.home}")
        took = demo.walkthrough()
        demo.say()
        demo.note("replication through the daemons (no `memmesh sync`):")
        for what, said in took.items():
            demo.note(f"  {what}: {said}")
        code = 0
    except Interrupted as exc:
        demo.say()
        demo.note("interrupted, stopping the peers")
        code = 128 + exc.signum
    except (DemoFailed, MemmeshError, OSError) as exc:  # a step, or the machine (no port, a full disk)
        demo.say()
        print(f"memmesh demo failed: {exc}", file=sys.stderr, flush=True)
        if not keep:
            demo.note("`python -m node.demo --keep` keeps both homes and the serve logs to look at")
    finally:
        _install(demo.hurry)  # clean-up must finish: a second Ctrl-C only makes it faster
        demo.stop_serves()
        if keep:
            demo.note(f"kept {root} (homes A and B, serve logs)")
        else:
            shutil.rmtree(root, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code == 0:
        demo.note(f"demo finished in {time.monotonic() - started:.0f} s")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m node.demo",
                                     description="the memmesh walkthrough across two real peers on this machine")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and print where it is")
    args = parser.parse_args(argv)
    return run(keep=args.keep)


if __name__ == "__main__":
    sys.exit(main())
