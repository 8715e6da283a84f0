"""The signature worker process, seen from this side: send (author, body, signature) triples,
collect one verdict each.

cryptography's Ed25519 verify holds the GIL (measured with cryptography 50: two threads verify
no faster than one), so threads cannot spread signature checks over cores; one child process
(crdt/verify_worker.py), shared by every database of this process, can. It sees only bytes and
answers with the same ``memmesh.auth.keys.verify`` the serial path calls, so its verdicts are
the serial path's. When it cannot be started or fails, ``collect`` says so and the caller
verifies here: the verdicts never depend on the worker.

The worker is started on first use and stopped at interpreter exit (``shutdown``); it also exits
by itself when this process dies (its stdin closes). No thread is started in this process.
"""
from __future__ import annotations

import atexit
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

from memmesh.auth.keys import DOMAIN_ENTRY, verify
from memmesh.crdt import verifystats
from memmesh.crdt.verify_wire import REPLY, REQUEST, SIGNATURES, signatures_request

log = logging.getLogger(__name__)

Triple = tuple[bytes, bytes, bytes]  # (author, signed body, signature)

# Fewer signatures than this are checked here: the round trip costs more than it saves.
MIN_WORKER_BATCH = 16


# --------------------------------------------------------------------------- the process
class SignatureWorker:
    """The child process and its pipe; thread-safe. ``submit`` returns a ticket, or None when
    no worker runs (the caller then verifies itself); ``collect`` returns the verdicts of a
    ticket, or None when the worker failed before answering it."""

    MAX_FAILURES = 3

    def __init__(self, *, spawn: bool = True) -> None:
        """``spawn=False``: never start a process (every signature is checked by the caller)."""
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._failures = 0 if spawn else self.MAX_FAILURES
        self._next = 0
        self._waiting: set[int] = set()  # sent, reply not read
        self._replies: dict[int, tuple[bytes, float]] = {}  # read, not yet collected
        self._unwanted: set[int] = set()  # replies to drop when read
        self._pid = os.getpid()

    def submit(self, items: list[Triple]) -> int | None:
        """Signatures to check (a ``SIGNATURES`` request)."""
        return self.send(SIGNATURES, signatures_request(items))

    def send(self, kind: int, payload: bytes) -> int | None:
        """One request of the wire (crdt/verify_wire.py); its ticket, or None."""
        with self._lock:
            proc = self._running()
            if proc is None or proc.stdin is None:
                return None
            ticket = self._next
            self._next = (self._next + 1) & 0xFFFFFFFF
            try:
                proc.stdin.write(REQUEST.pack(kind, ticket, len(payload)) + payload)
                proc.stdin.flush()
            except (OSError, ValueError) as exc:
                self._fail(f"could not send to it: {exc}")
                return None
            self._waiting.add(ticket)
            return ticket

    def collect(self, ticket: int) -> tuple[bytes, float] | None:
        """The ticket's reply (for signatures: one byte per item, in order) and the seconds its
        signature checks took."""
        with self._lock:
            while ticket not in self._replies:
                if ticket not in self._waiting or self._proc is None or self._proc.stdout is None:
                    return None
                try:
                    head = self._proc.stdout.read(REPLY.size)
                    got, seconds, count = REPLY.unpack(head) if len(head) == REPLY.size else (-1, 0.0, 0)
                    body = self._proc.stdout.read(count) if got >= 0 else b""
                except (OSError, ValueError) as exc:
                    self._fail(f"could not read from it: {exc}")
                    return None
                if got not in self._waiting or len(body) != count:
                    self._fail("it stopped or answered out of turn")
                    return None
                self._waiting.discard(got)
                if got in self._unwanted:
                    self._unwanted.discard(got)
                else:
                    self._replies[got] = (body, seconds)
            return self._replies.pop(ticket)

    def discard(self, ticket: int) -> None:
        """Nobody will collect this ticket: drop its reply."""
        with self._lock:
            if self._replies.pop(ticket, None) is None and ticket in self._waiting:
                self._unwanted.add(ticket)

    def start(self) -> bool:
        """Start the worker now rather than on first use (its start takes a fraction of a
        second); whether one runs."""
        with self._lock:
            return self._running() is not None

    def shutdown(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                self._stop()

    def _running(self) -> subprocess.Popen[bytes] | None:
        if self._pid != os.getpid():
            # A forked child: the worker and its pipes are the parent's; this process starts its own.
            self._pid, self._proc = os.getpid(), None
            self._waiting.clear()
            self._replies.clear()
            self._unwanted.clear()
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        if self._proc is not None:
            self._fail("it exited")
        if self._failures >= self.MAX_FAILURES:
            return None
        # The child imports memmesh from where this process did, whatever its working directory.
        env = dict(os.environ)
        package_root = str(Path(sys.modules["memmesh"].__file__ or ".").resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "memmesh.crdt.verify_worker"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, env=env, close_fds=True, start_new_session=True)
        except OSError as exc:
            self._failures = self.MAX_FAILURES
            log.warning("no signature worker process (%s): signatures are checked on one core", exc)
            return None
        _widen(self._proc)
        return self._proc

    def _fail(self, why: str) -> None:
        self._failures += 1
        log.warning("the signature worker failed (%s); its signatures are checked here%s", why,
                    "" if self._failures < self.MAX_FAILURES else ", and no worker is started again")
        self._stop()

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        self._waiting.clear()
        self._replies.clear()
        self._unwanted.clear()
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # the worker exits at end of input
            proc.wait(timeout=2)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        finally:
            if proc.stdout is not None:
                proc.stdout.close()


def _widen(proc: subprocess.Popen[bytes]) -> None:
    """Larger pipes (Linux): a batch sent ahead, and its reply, fit in them whole, so neither
    side waits for the other to read (the worker also drains its input between checks)."""
    try:
        import fcntl

        setsize = getattr(fcntl, "F_SETPIPE_SZ", None)
        if setsize is not None:
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    fcntl.fcntl(pipe.fileno(), setsize, 1 << 20)
    except (ImportError, OSError):
        pass


_WORKER = SignatureWorker()


def shared_worker() -> SignatureWorker:
    return _WORKER


def shutdown() -> None:
    """Stop the worker process (started again on next use)."""
    _WORKER.shutdown()


atexit.register(shutdown)


def verify_here(triples: list[Triple]) -> list[bool]:
    started = verifystats.clock()
    oks = [verify(a, DOMAIN_ENTRY, b, s) for a, b, s in triples]
    if triples:
        verifystats.VERIFIED.add(len(triples), verifystats.clock() - started)
    return oks


def well_formed(triples: list[Triple]) -> bool:
    """Whether every triple fits the worker's fixed-size fields (anything else is checked here,
    where a key or signature of the wrong length is refused as by ``verify``)."""
    return all(len(a) == 32 and len(s) == 64 for a, _b, s in triples)


def verify_split(triples: list[Triple], worker: SignatureWorker | None = None) -> list[bool]:
    """Verdicts for a batch, in order: the worker checks the first half while this thread
    checks the second."""
    worker = worker or _WORKER
    if len(triples) < 2 * MIN_WORKER_BATCH or not well_formed(triples):
        return verify_here(triples)
    half = len(triples) // 2
    ticket = worker.submit(triples[:half])
    if ticket is None:
        return verify_here(triples)
    second = verify_here(triples[half:])
    return verdicts_of(worker, ticket, triples[:half]) + second


def verdicts_of(worker: SignatureWorker, ticket: int, triples: list[Triple]) -> list[bool]:
    """The worker's verdicts for what ``ticket`` sent (``triples``); checked here if it failed."""
    got = worker.collect(ticket)
    if got is None:
        return verify_here(triples)
    verifystats.VERIFIED.add(len(got[0]), got[1])
    return [b == 1 for b in got[0]]
