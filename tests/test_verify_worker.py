"""The signature worker and the thread that shares a batch with it (crdt/verify_worker.py,
crdt/verify_process.py ``gather``): every verdict is ``verify``'s, whoever checked it, however
the two meet, whatever the worker is busy with, and when it dies half-way.

Real Ed25519 keys and signatures, a real worker process over its pipes.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Set as AbstractSet
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memmesh.auth.keys import DOMAIN_ENTRY, SigningKey
from memmesh.crdt.verify_process import SignatureWorker, gather, verify_here, verify_split
from memmesh.crdt.verify_wire import COUNT, LIMIT, REPLY, REQUEST, SIGNATURES, STOP, signatures_request
from memmesh.crdt.verify_worker import SLICE, _Requests

Triple = tuple[bytes, bytes, bytes]

_KEYS = [SigningKey.generate() for _ in range(3)]


def _triples(n: int, bad: AbstractSet[int] = frozenset()) -> list[Triple]:
    out = []
    for i in range(n):
        k = _KEYS[i % len(_KEYS)]
        body = f"entry {i} ".encode() * (1 + i % 5)
        sig = k.sign(DOMAIN_ENTRY, body)
        if i in bad:  # a flipped bit, in the signature or in the body
            if i % 2:
                sig = bytes([sig[0] ^ 1]) + sig[1:]
            else:
                body = body[:-1] + bytes([body[-1] ^ 1])
        out.append((k.public.raw, body, sig))
    return out


TRIPLES = _triples(300, bad={0, 7, 64, 150, 151, 299})
EXPECTED = verify_here(TRIPLES)


@pytest.fixture(scope="module")
def worker():
    w = SignatureWorker()
    assert w.start()
    yield w
    w.shutdown()


def _settled(w: SignatureWorker) -> bool:
    """Whether every released ticket is dropped once the worker's last answers are read."""
    deadline = time.monotonic() + 30
    while w._tickets and time.monotonic() < deadline:
        with w._lock:
            w._pump(0.05)
    return not w._tickets


def test_expected_verdicts_are_mixed():
    assert EXPECTED.count(False) == 6 and all(EXPECTED[i] for i in (1, 2, 65, 298))


def test_a_split_batch_gives_the_serial_verdicts(worker):
    assert verify_split(TRIPLES, worker) == EXPECTED
    assert _settled(worker)  # released and answered: nothing kept


@settings(max_examples=30, deadline=None)
@given(start=st.integers(0, 299), size=st.integers(1, 300), step=st.integers(1, 4),
       busy=st.integers(0, 200))
def test_any_part_of_a_ticket_gives_the_serial_verdicts(worker, start, size, step, busy):
    # The worker may be busy with another ticket first (the thread then checks most of ours),
    # and only some items of ours may be wanted (a batch announced one way, ingested another).
    other = worker.submit(TRIPLES[:busy]) if busy else None
    ticket = worker.submit(TRIPLES)
    assert ticket is not None
    at = list(range(start, min(300, start + size), step))
    oks, from_worker = gather(worker, ticket, [TRIPLES[i] for i in at], at)
    assert oks == [EXPECTED[i] for i in at]
    assert 0 <= from_worker <= len(at)
    worker.release(ticket)
    if other is not None:
        worker.release(other)


def test_the_worker_and_the_thread_both_check_a_large_batch(worker):
    big = TRIPLES * 4
    shares = []
    for _ in range(5):  # a loaded machine may not run the worker at all during one batch
        ticket = worker.submit(big)
        assert ticket is not None
        oks, from_worker = gather(worker, ticket, big, range(len(big)))
        worker.release(ticket)
        assert oks == EXPECTED * 4
        shares.append(from_worker)
        if 0 < from_worker < len(big):
            break
    assert _settled(worker)
    # Neither waited for the other: each checked a real part (the split follows their speeds).
    assert any(0 < n < len(big) for n in shares), shares


def test_a_worker_that_dies_half_way_changes_no_verdict():
    w = SignatureWorker()
    try:
        big = TRIPLES * 4
        ticket = w.submit(big)
        assert ticket is not None and w._proc is not None
        while (p := w.progress(ticket, 1.0)) is not None and len(p.got) < SLICE:
            pass
        w._proc.kill()
        w._proc.wait()
        oks, from_worker = gather(w, ticket, big, range(len(big)))
        assert oks == EXPECTED * 4
        assert from_worker < len(big)
        assert w.progress(ticket) is None  # forgotten with the worker
    finally:
        w.shutdown()


def test_no_worker_means_every_check_here():
    w = SignatureWorker(spawn=False)
    assert w.submit(TRIPLES) is None
    assert verify_split(TRIPLES, w) == EXPECTED


# ------------------------------------------------------------------------- the wire itself
def _run_worker() -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    return subprocess.Popen([sys.executable, "-m", "memmesh.crdt.verify_worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env)


def _replies(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """The whole replies in ``data`` (a partial one at its end is left out)."""
    out = []
    while len(data) >= REPLY.size and len(data) >= REPLY.size + REPLY.unpack_from(data)[4]:
        ticket, offset, _seconds, final, count = REPLY.unpack_from(data)
        out.append((ticket, offset, final, data[REPLY.size:REPLY.size + count]))
        data = data[REPLY.size + count:]
    return out


def test_a_stop_sent_before_the_work_bounds_it_and_the_replies_are_contiguous():
    proc = _run_worker()
    assert proc.stdin is not None and proc.stdout is not None
    first = signatures_request(TRIPLES[:100])
    proc.stdin.write(REQUEST.pack(SIGNATURES, 5, len(first)) + first)
    proc.stdin.write(REQUEST.pack(STOP, 5, LIMIT.size) + LIMIT.pack(40))  # arrives before or during
    proc.stdin.write(REQUEST.pack(STOP, 99, LIMIT.size) + LIMIT.pack(0))  # an unknown ticket: ignored
    second = signatures_request(TRIPLES[100:150])
    proc.stdin.write(REQUEST.pack(SIGNATURES, 6, len(second)) + second)
    proc.stdin.flush()
    out = b""
    while sum(r[2] for r in _replies(out)) < 2:  # both tickets' last answers (input kept open:
        out += os.read(proc.stdout.fileno(), 1 << 16)  # a closed one means nobody waits)
    proc.stdin.close()
    assert proc.stdout.read() == b"" and proc.wait(timeout=30) == 0
    replies = _replies(out)
    for ticket, expected in ((5, EXPECTED[:100]), (6, EXPECTED[100:150])):
        mine = [r for r in replies if r[0] == ticket]
        assert [r[1] for r in mine] == [sum(len(r[3]) for r in mine[:i]) for i in range(len(mine))]
        assert [r[2] for r in mine].count(1) == 1 and mine[-1][2] == 1  # one final, the last
        got = b"".join(r[3] for r in mine)
        assert [b == 1 for b in got] == expected[:len(got)]
        if ticket == 5:
            assert 40 <= len(got) < 40 + SLICE or len(got) == 100  # stopped at the slice after 40
        else:
            assert len(got) == 50


def test_a_request_of_an_unknown_kind_ends_the_worker():
    proc = _run_worker()
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(REQUEST.pack(7, 1, 0))
    proc.stdin.flush()
    assert proc.stdout.read() == b""
    assert proc.wait(timeout=30) == 0
    proc.stdin.close()


@settings(max_examples=50, deadline=None)
@given(cuts=st.lists(st.integers(0, 400), max_size=8))
def test_requests_parse_the_same_whatever_the_chunks(cuts):
    body = signatures_request(TRIPLES[:3])
    stream = (REQUEST.pack(SIGNATURES, 1, len(body)) + body + REQUEST.pack(STOP, 1, LIMIT.size) + LIMIT.pack(2)
              + REQUEST.pack(SIGNATURES, 2, COUNT.size) + COUNT.pack(0))
    bounds = [0, *sorted(c for c in cuts if c < len(stream)), len(stream)]
    requests = _Requests()
    for a, b in zip(bounds, bounds[1:]):
        requests.feed(stream[a:b])
    assert [t for t, _p in requests.ready] == [1, 2]
    assert requests.ready[0][1] == body and requests.limits == {1: 2}
