"""The signature worker process, seen from this side: send (author, body, signature) triples,
collect one verdict each.

cryptography's Ed25519 verify holds the GIL (measured with cryptography 50: two threads verify
no faster than one), so threads cannot spread signature checks over cores; one child process
(crdt/verify_worker.py), shared by every database of this process, can. It sees only bytes and
answers with the same ``memmesh.auth.keys.verify`` the serial path calls, so its verdicts are
the serial path's. When it cannot be started or fails, ``progress`` says so and the caller
verifies here: the verdicts never depend on the worker. The caller never waits on the worker
for long: it checks a batch from its end while the worker checks it from its start
(``gather``), so both cores stay busy however the work falls.

The worker is started on first use and stopped at interpreter exit (``shutdown``); it also exits
by itself when this process dies (its stdin closes). No thread is started in this process.
"""
from __future__ import annotations

import atexit
import logging
import os
import select
import subprocess
import sys
import threading
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from memmesh.auth.keys import DOMAIN_ENTRY, verify
from memmesh.crdt import verifystats
from memmesh.crdt.verify_wire import LIMIT, REPLY, REQUEST, SIGNATURES, STOP, signatures_request

log = logging.getLogger(__name__)

Triple = tuple[bytes, bytes, bytes]  # (author, signed body, signature)

# Fewer signatures than this are checked here: the round trip costs more than it saves.
MIN_WORKER_BATCH = 16
# This thread takes over a batch's signatures from its end in slices of this many (about 2 ms),
# telling the worker each time; it waits at most WAIT seconds for a worker that has one slice left.
STEAL = 16
WAIT = 0.05


# --------------------------------------------------------------------------- the process
class _Ticket:
    """What the worker answered so far for one request: verdicts from item 0 on, in order."""

    __slots__ = ("final", "got", "size", "started", "wanted")

    def __init__(self, size: int) -> None:
        self.size = size
        self.got = bytearray()
        self.started = False  # the worker is on it (or was): it answers within a slice
        self.final = False  # it answered its last: nothing more comes for this ticket
        self.wanted = True  # False once released: dropped when its last answer arrives


@dataclass(frozen=True, slots=True)
class Progress:
    got: bytes  # verdicts of items 0 .. len(got) - 1, 1 where the signature verifies
    started: bool
    final: bool


class SignatureWorker:
    """The child process and its pipes; thread-safe. ``submit`` returns a ticket, or None when
    no worker runs (the caller then verifies itself); ``progress`` says what the worker has
    answered for a ticket so far, or None when it failed; ``stop`` tells it where the caller
    took over; ``release`` ends the caller's interest in a ticket (crdt/verify_worker.py has
    the wire)."""

    MAX_FAILURES = 3

    def __init__(self, *, spawn: bool = True) -> None:
        """``spawn=False``: never start a process (every signature is checked by the caller)."""
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._failures = 0 if spawn else self.MAX_FAILURES
        self._next = 0
        self._tickets: dict[int, _Ticket] = {}  # sent, not yet both answered and released
        self._buffer = bytearray()  # replies read, not yet parsed
        self._pid = os.getpid()

    def submit(self, items: list[Triple]) -> int | None:
        """Signatures to check (a ``SIGNATURES`` request)."""
        payload = signatures_request(items)
        with self._lock:
            self._pump(0.0)  # replies nobody waits for are read here too: the pipe never fills
            ticket = self._send(SIGNATURES, None, payload)
            if ticket is not None:
                self._tickets[ticket] = _Ticket(len(items))
            return ticket

    def progress(self, ticket: int, wait: float = 0.0) -> Progress | None:
        """The ticket's verdicts so far; waits up to ``wait`` seconds for a reply when none is
        ready. None when the worker failed (or the ticket is unknown): the caller checks what
        it lacks itself."""
        with self._lock:
            if ticket not in self._tickets:
                return None
            self._pump(wait)
            state = self._tickets.get(ticket)
            if state is None:
                return None
            return Progress(bytes(state.got), state.started, state.final)

    def stop(self, ticket: int, limit: int) -> None:
        """The worker need not check items of ``ticket`` at or past ``limit``."""
        with self._lock:
            state = self._tickets.get(ticket)
            if state is not None and not state.final and limit < state.size:
                self._send(STOP, ticket, LIMIT.pack(limit))

    def release(self, ticket: int) -> None:
        """Nobody reads this ticket again: the worker stops on it, its last answer is dropped."""
        with self._lock:
            state = self._tickets.get(ticket)
            if state is None:
                return
            if state.final:
                del self._tickets[ticket]
                return
            state.wanted = False
            self._send(STOP, ticket, LIMIT.pack(0))

    def start(self) -> bool:
        """Start the worker now rather than on first use (its start takes a fraction of a
        second); whether one runs."""
        with self._lock:
            return self._running() is not None

    def shutdown(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                self._stop()

    # -- under the lock
    def _send(self, kind: int, ticket: int | None, payload: bytes) -> int | None:
        """One request; its ticket (a new one when ``ticket`` is None), or None."""
        proc = self._running()
        if proc is None or proc.stdin is None:
            return None
        if ticket is None:
            ticket = self._next
            self._next = (self._next + 1) & 0xFFFFFFFF
        try:
            proc.stdin.write(REQUEST.pack(kind, ticket, len(payload)) + payload)
            proc.stdin.flush()
        except (OSError, ValueError) as exc:
            self._fail(f"could not send to it: {exc}")
            return None
        return ticket

    def _pump(self, wait: float) -> None:
        """Read and file every reply that is ready, waiting up to ``wait`` seconds for one."""
        proc = self._proc
        if proc is None or proc.stdout is None:
            return
        fd = proc.stdout.fileno()
        try:
            while select.select([fd], [], [], wait)[0]:
                data = os.read(fd, 1 << 16)
                if not data:
                    self._fail("it exited")
                    return
                self._buffer += data
                if not self._file():
                    return
                wait = 0.0
        except (OSError, ValueError) as exc:
            self._fail(f"could not read from it: {exc}")

    def _file(self) -> bool:
        buffer = self._buffer
        while len(buffer) >= REPLY.size:
            ticket, offset, seconds, final, count = REPLY.unpack_from(buffer)
            if len(buffer) < REPLY.size + count:
                break
            body = bytes(buffer[REPLY.size:REPLY.size + count])
            del buffer[:REPLY.size + count]
            state = self._tickets.get(ticket)
            if state is None or state.final or offset != len(state.got) or offset + count > state.size:
                self._fail("it answered out of turn")
                return False
            state.started = True
            state.got += body
            if count:
                verifystats.VERIFIED.add(count, seconds)
            if final:
                state.final = True
                if not state.wanted:
                    del self._tickets[ticket]
        return True

    def _running(self) -> subprocess.Popen[bytes] | None:
        if self._pid != os.getpid():
            # A forked child: the worker and its pipes are the parent's; this process starts its own.
            self._pid, self._proc = os.getpid(), None
            self._tickets.clear()
            self._buffer.clear()
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
        self._tickets.clear()
        self._buffer.clear()
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
    """Verdicts for a batch, in order: the worker checks from the start while this thread
    checks from the end (``gather``)."""
    worker = worker or _WORKER
    if len(triples) < 2 * MIN_WORKER_BATCH or not well_formed(triples):
        return verify_here(triples)
    ticket = worker.submit(triples)
    if ticket is None:
        return verify_here(triples)
    try:
        return gather(worker, ticket, triples, range(len(triples)))[0]
    finally:
        worker.release(ticket)


def gather(worker: SignatureWorker, ticket: int, triples: Sequence[Triple], at: Sequence[int]
           ) -> tuple[list[bool], int]:
    """Verdicts for ``triples``, sent to the worker as items ``at`` (ascending) of ``ticket``,
    and how many of them the worker gave.

    The worker checks a ticket from its first item on; this thread checks from the last one
    down, a slice at a time, telling the worker where it took over, until the two meet. Neither
    core waits for the other, whatever the worker is busy with and however the work is split;
    only when the worker is on this ticket with at most a slice left does this thread wait
    for it (a slice both would check is a slice lost). Every verdict is ``verify``'s, here or
    in the worker; when the worker fails, what it did not answer is checked here.
    """
    hi = len(at)
    mine: list[list[bool]] = []  # verdicts of triples[hi:], checked here, the last slice first
    wait, waited_at = 0.0, -1
    while True:
        state = worker.progress(ticket, wait)
        got = state.got if state is not None else b""
        lo = min(hi, bisect_left(at, len(got)))
        if state is None or lo >= hi or state.final:
            break
        if state.started and hi - lo <= STEAL and lo > waited_at:
            # The worker is on this ticket with at most a slice left: wait for it (again only
            # if it answered meanwhile), rather than check the same slice twice.
            wait, waited_at = WAIT, lo
            continue
        wait = 0.0
        new_hi = max(lo, hi - STEAL)
        worker.stop(ticket, at[new_hi])
        mine.append(verify_here(list(triples[new_hi:hi])))
        hi = new_hi
    mine.append(verify_here(list(triples[lo:hi])))
    here = [ok for part in reversed(mine) for ok in part]
    return [got[i] == 1 for i in at[:lo]] + here, lo
