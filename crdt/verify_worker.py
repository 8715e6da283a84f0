"""The signature worker: a child process that checks entry signatures for crdt/verify_process.py.

cryptography's Ed25519 verify holds the GIL (measured with cryptography 50: two threads verify
no faster than one), so a thread cannot check signatures beside the thread that applies
entries; a process can. It only ever sees bytes: (author, signed body, signature) triples in,
one verdict per triple out, computed by the same ``memmesh.auth.keys.verify`` the serial path
calls. It never opens a database.

Wire (stdin -> stdout, little-endian). A request is ``kind:u8 ticket:u32 size:u32`` then
``size`` bytes: ``count:u32`` then ``count`` records ``author[32] signature[64] length:u32
body[length]``. The reply is ``ticket:u32 seconds:f64 size:u32`` (``seconds``: the time the
checks took) then ``size`` bytes, one per record, 1 where the signature verifies.

The worker exits when its stdin closes (the parent closed it, or died), dropping what it has
not answered: nobody waits for it then.
"""
from __future__ import annotations

import os
import select
import signal
import sys
import time
from typing import Any, BinaryIO

from memmesh.auth.keys import DOMAIN_ENTRY, verify
from memmesh.crdt.verify_wire import COUNT, RECORD, REPLY, REQUEST, SIGNATURES


class _Requests:
    """Requests parsed from what stdin delivered so far."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.ready: list[tuple[int, int, bytes]] = []

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= REQUEST.size:
            kind, ticket, size = REQUEST.unpack_from(self.buffer)
            if len(self.buffer) < REQUEST.size + size:
                break
            self.ready.append((kind, ticket, bytes(self.buffer[REQUEST.size:REQUEST.size + size])))
            del self.buffer[:REQUEST.size + size]


# Between slices of this many items the worker drains its stdin, so that a parent sending the
# next batch while this one is checked never waits on a full pipe. One thread: a reader thread
# would wait for the GIL that every check holds.
SLICE = 32


class _Closed(Exception):
    """The parent closed our input: nobody waits for the answers."""


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
            kind, ticket, payload = requests.ready.pop(0)
            if kind != SIGNATURES:
                return  # a parent of another version: it falls back to checking itself
            reply, seconds = _signatures(payload, lambda: drain(block=False))
            out.write(REPLY.pack(ticket, seconds, len(reply)) + reply)
            out.flush()
    except (_Closed, OSError):  # closed input, or a parent that stopped reading: done
        return


def _signatures(payload: bytes, between: Any) -> tuple[bytes, float]:
    (count,) = COUNT.unpack_from(payload)
    view = memoryview(payload)
    at = COUNT.size
    result = bytearray()
    spent = 0.0
    for i in range(count):
        author, signature, length = RECORD.unpack_from(view, at)
        at += RECORD.size
        started = time.perf_counter()
        result.append(verify(author, DOMAIN_ENTRY, bytes(view[at:at + length]), signature))
        spent += time.perf_counter() - started
        at += length
        if i % SLICE == SLICE - 1:
            between()
    return bytes(result), spent


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    serve(sys.stdin.fileno(), sys.stdout.buffer)


if __name__ == "__main__":
    main()
