"""The database thread and the network bridge: commands that wait for the network keep the
database thread running the calls others hand it (no deadlock, order kept)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from memmesh.node.worker import DbThread, Network, OnServeLoop


def test_runs_in_order_on_one_thread():
    db = DbThread()
    seen = []
    futs = [db.submit(lambda i=i: seen.append((i, threading.current_thread().name))) for i in range(50)]
    for f in futs:
        f.result(5)
    assert [i for i, _ in seen] == list(range(50)) and {n for _, n in seen} == {"memmesh-db"}
    db.stop()


def test_errors_come_back_to_the_caller():
    db = DbThread()
    with pytest.raises(ZeroDivisionError):
        db.submit(lambda: 1 / 0).result(5)
    assert db.submit(lambda: 2).result(5) == 2
    db.stop()


def test_a_command_waiting_for_the_network_does_not_block_the_database_thread():
    """A handler on the database thread runs a coroutine on the loop whose database steps go
    back to that same thread; meanwhile another caller's database call is served too."""
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    db = DbThread()
    net = Network(OnServeLoop(loop, db))
    other_done = threading.Event()

    async def remote_work(run):
        a = await run(lambda: threading.current_thread().name)
        # While this coroutine waits, someone else's database call arrives and is served.
        await asyncio.wrap_future(db.submit(other_done.set))
        await asyncio.sleep(0.05)
        b = await run(lambda: 40 + 2)
        return a, b

    result = db.submit(lambda: net.run(remote_work, timeout=10)).result(10)
    assert result == ("memmesh-db", 42) and other_done.is_set()
    db.stop()
    loop.call_soon_threadsafe(loop.stop)
    t.join(5)


def test_one_shot_network_runs_in_place():
    net = Network()

    async def work(run):
        return await run(lambda: threading.current_thread().name)

    assert net.run(work) == threading.current_thread().name
