"""The signature worker: a child process that checks entry signatures for crdt/verify_process.py.

cryptography's Ed25519 verify holds the GIL (measured with cryptography 50: two threads verify
no faster than one), so a thread cannot check signatures beside the thread that applies
entries; a process can. It only ever sees bytes: (author, signed body, signature) triples in,
one verdict per triple out, computed by the same ``memmesh.auth.keys.verify`` the serial path
calls. It never opens a database.

Wire (stdin -> stdout, little-endian; crdt/verify_wire.py). A request is ``kind:u8 ticket:u32
size:u32`` then ``size`` bytes. ``SIGNATURES``: ``count:u32`` then ``count`` records
``author[32] signature[64] length:u32 body[length]``. ``STOP``: ``limit:u32``: check no item of
that ticket at or past ``limit`` (the parent checks those itself: it takes work from the end of
a batch while this process works from the start). Tickets are worked in the order sent.

Replies are ``ticket:u32 offset:u32 seconds:f64 final:u8 count:u32`` then ``count`` verdict
bytes (1 where the signature verifies) for the items ``offset .. offset+count``: an empty one
when a ticket is started, one per slice of ``SLICE`` items, and the last with ``final`` set
(the ticket is finished, or stopped at its limit); ``seconds`` is what the slice's checks took.

The worker exits when its stdin closes (the parent closed it, or died), dropping what it has
not answered: nobody waits for it then.
"""
from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import BinaryIO

from memmesh.auth.keys import DOMAIN_ENTRY, verify
from memmesh.crdt.verify_wire import COUNT, LIMIT, RECORD, REPLY, REQUEST, SIGNATURES, STOP

# Items checked between two looks at stdin (and one reply): about 2 ms of checks, so that a
# STOP takes effect soon and the parent sees progress in small steps. One thread: a reader
# thread would wait for the GIL that every check holds.
SLICE = 16


class _Closed(Exception):
    """The parent closed our input: nobody waits for the answers."""


class _Unknown(Exception):
    """A request of a kind this worker does not know: a parent of another version."""


class _Requests:
    """Requests parsed from what stdin delivered so far: signature batches queue in order; a
    STOP lowers the limit of a ticket queued or being worked (one already answered is past
    stopping, and is forgotten)."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.ready: deque[tuple[int, bytes]] = deque()
        self.queued: set[int] = set()
        self.current: int | None = None
        self.limits: dict[int, int] = {}

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= REQUEST.size:
            kind, ticket, size = REQUEST.unpack_from(self.buffer)
            if len(self.buffer) < REQUEST.size + size:
                break
            payload = bytes(self.buffer[REQUEST.size:REQUEST.size + size])
            del self.buffer[:REQUEST.size + size]
            if kind == SIGNATURES:
                self.ready.append((ticket, payload))
                self.queued.add(ticket)
            elif kind == STOP and len(payload) == LIMIT.size:
                if ticket in self.queued or ticket == self.current:
                    (limit,) = LIMIT.unpack(payload)
                    self.limits[ticket] = min(limit, self.limits.get(ticket, limit))
            else:
                raise _Unknown

    def next(self) -> tuple[int, bytes]:
        ticket, payload = self.ready.popleft()
        self.queued.discard(ticket)
        self.current = ticket
        return ticket, payload

    def finished(self, ticket: int) -> None:
        self.current = None
        self.limits.pop(ticket, None)


def serve(inp: int, out: BinaryIO) -> None:
    requests = _Requests()
    open_input = True

    def drain(block: bool) -> None:
        nonlocal open_input
        while open_input and (block or select.select([inp], [], [], 0)[0]):
            data = os.read(inp, 1 << 20)
            if not data:
                open_input = False
            requests.feed(data)
            block = False
        if not open_input:
            raise _Closed

    try:
        while True:
            if not requests.ready:
                drain(block=True)
                continue
            ticket, payload = requests.next()
            _signatures(ticket, payload, requests, drain, out)
            requests.finished(ticket)
    except (_Closed, _Unknown, OSError):  # closed input, another version, or a parent gone: done
        return


def _signatures(ticket: int, payload: bytes, requests: _Requests, drain: Callable[[bool], None],
                out: BinaryIO) -> None:
    (count,) = COUNT.unpack_from(payload)
    view = memoryview(payload)
    items: list[tuple[bytes, bytes, int, int]] = []
    at = COUNT.size
    for _ in range(count):
        author, signature, length = RECORD.unpack_from(view, at)
        at += RECORD.size
        items.append((author, signature, at, length))
        at += length
    out.write(REPLY.pack(ticket, 0, 0.0, 0, 0))  # started: the parent waits for us, not steals
    out.flush()
    done = 0
    while True:
        drain(False)  # a STOP for this ticket, or the next request, may have arrived
        end = min(count, requests.limits.get(ticket, count), done + SLICE)
        if done >= end:
            out.write(REPLY.pack(ticket, done, 0.0, 1, 0))
            out.flush()
            return
        started = time.perf_counter()
        verdicts = bytes(verify(a, DOMAIN_ENTRY, payload[b:b + n], s) for a, s, b, n in items[done:end])
        seconds = time.perf_counter() - started
        final = end >= min(count, requests.limits.get(ticket, count))
        out.write(REPLY.pack(ticket, done, seconds, int(final), len(verdicts)) + verdicts)
        out.flush()
        done = end
        if final:
            return


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    serve(sys.stdin.fileno(), sys.stdout.buffer)


if __name__ == "__main__":
    main()
