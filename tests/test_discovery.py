"""LAN discovery over real zeroconf, confined to loopback (``interfaces=["127.0.0.1"]``, IPv4).

Nodes find each other's key and address, a stopped node is withdrawn, our own announcement is
never listed, and malformed announcements (registered raw by the test) are ignored and counted.
Every wait polls with a deadline; nothing sleeps a fixed time.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
from zeroconf import IPVersion
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

from memmesh.auth.keys import SigningKey
from memmesh.node.sync.discovery import (
    MAX_TXT_BYTES,
    SERVICE_TYPE,
    DiscoveredPeer,
    Discovery,
    DiscoveryError,
    node_label,
)

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = ["127.0.0.1"]
DEADLINE_S = 8.0
DB_ID = "sha256:4120585c810070fad66f663aa6781039ece449ca4ee78c6c4ffde5acb38b7c9d"


def new_key() -> str:
    return str(SigningKey.generate().public)


def node() -> Discovery:
    return Discovery(interfaces=LOOPBACK, ip_version=IPVersion.V4Only)


async def until(predicate, what, timeout: float = DEADLINE_S):
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` (a string or a
    function giving one) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what() if callable(what) else what}")
        await asyncio.sleep(0.02)


def other_tasks() -> set[asyncio.Task]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()}


RUN = os.urandom(4).hex()  # raw names are unique per run: other test sessions may share loopback


def raw_info(name: str, properties: dict, port: int = 7999, address: str = "127.0.0.1") -> AsyncServiceInfo:
    name = f"{name}-{RUN}"
    return AsyncServiceInfo(SERVICE_TYPE, f"{name}.{SERVICE_TYPE}", port=port, properties=properties,
                            server=f"{name}.local.", addresses=[socket.inet_aton(address)])


async def test_two_nodes_find_each_other_and_not_themselves():
    ka, kb = new_key(), new_key()
    a, b = node(), node()
    events: list[tuple[str, DiscoveredPeer]] = []
    b.on_change(lambda event, peer: events.append((event, peer)))
    await asyncio.gather(a.start(7101, ka), b.start(7102, kb))
    try:
        pa = await until(lambda: b.find(ka), "b to see a")
        pb = await until(lambda: a.find(kb), "a to see b")
        assert pa.addresses == ("http:127.0.0.1:7101",) and pa.how == "lan"
        assert pb.addresses == ("http:127.0.0.1:7102",)
        assert abs(pa.last_seen - time.time() * 1000) < 60_000
        assert a.find(ka) is None and b.find(kb) is None  # our own announcement is not listed
        assert ka not in {p.key for p in a.peers()} and kb not in {p.key for p in b.peers()}
        # last_seen advances as a's repeated announcements are heard; the rest is the same
        assert [(e, p.addresses) for e, p in events if p.key == ka] == [("added", pa.addresses)]
        assert a.name == f"{node_label(ka)}.{SERVICE_TYPE}"
    finally:
        await asyncio.gather(a.stop(), b.stop())


async def test_the_announcement_carries_the_key_version_and_port_and_nothing_else():
    key = new_key()
    d = node()
    await d.start(7111, key)
    probe = AsyncZeroconf(interfaces=LOOPBACK, ip_version=IPVersion.V4Only)
    try:
        info = AsyncServiceInfo(SERVICE_TYPE, f"{node_label(key)}.{SERVICE_TYPE}")
        assert await info.async_request(probe.zeroconf, 3000)
        assert info.properties == {b"pk": key.encode(), b"v": b"1"}
        assert info.port == 7111 and info.parsed_addresses() == ["127.0.0.1"]
        assert info.server == f"{node_label(key)}.local."
        assert node_label(key).startswith("mm-") and len(node_label(key)) == 19
    finally:
        await probe.async_close()
        await d.stop()


async def test_a_stopped_node_is_withdrawn_and_a_later_node_does_not_see_it():
    ka, kb, kc = new_key(), new_key(), new_key()
    a, b = node(), node()
    removed = []
    b.on_change(lambda event, peer: removed.append(peer.key) if event == "removed" and peer.key == ka else None)
    await asyncio.gather(a.start(7121, ka), b.start(7122, kb))
    c = node()
    try:
        await until(lambda: b.find(ka), "b to see a")
        await a.stop()
        await until(lambda: b.find(ka) is None, "a's goodbye to reach b")
        assert removed == [ka]
        await c.start(7123, kc)
        await until(lambda: c.find(kb), "c to see b")  # c browses fine...
        assert c.find(ka) is None  # ...and a is not announced any more
    finally:
        await asyncio.gather(a.stop(), b.stop(), c.stop())


async def test_malformed_foreign_and_own_announcements_are_ignored():
    own, good, other = new_key(), new_key(), new_key()
    infos = {
        "pk": raw_info("mm-bad-pk", {"pk": "ed25519:not-a-key", "v": "1"}),
        "pk-missing": raw_info("mm-no-pk", {"v": "1"}),
        "v-missing": raw_info("mm-no-v", {"pk": other}),
        "version": raw_info("mm-v2", {"pk": other, "v": "2"}),
        "txt-extra": raw_info("mm-with-db", {"pk": other, "v": "1", "db": DB_ID}),
        "txt-size": raw_info("mm-huge", {"pk": other, "v": "1", "x": "y" * 200, "z": "y" * (MAX_TXT_BYTES // 2)}),
        "own": raw_info("mm-impostor", {"pk": own, "v": "1"}),  # our key under another name
        "ok": raw_info("mm-good", {"pk": good, "v": "1"}, port=7132),
    }
    d = Discovery(interfaces=LOOPBACK, ip_version=IPVersion.V4Only, addresses=["127.0.0.1"])
    await d.start(7131, own)
    raw = AsyncZeroconf(interfaces=LOOPBACK, ip_version=IPVersion.V4Only)
    try:
        await asyncio.gather(*(raw.async_register_service(i, cooperating_responders=True) for i in infos.values()))
        await until(lambda: d.find(good), "the well-formed announcement")
        reasons = [r for r in infos if r != "ok"]
        await until(lambda: all(d.ignored[r] >= 1 for r in reasons),
                    lambda: f"every malformed announcement to be ignored (so far {dict(d.ignored)})")
        assert [p.key for p in d.peers() if p.key in (own, good, other)] == [good]
        assert d.find(good).addresses == ("http:127.0.0.1:7132",)
        assert d.find(other) is None and d.find(own) is None
        assert DB_ID not in repr(d.peers())
    finally:
        await raw.async_close()
        await d.stop()


async def test_a_changed_announcement_updates_the_peer_and_a_spoiled_one_removes_it():
    key = new_key()
    d = node()
    events: list[tuple[str, tuple[str, ...]]] = []
    d.on_change(lambda event, peer: events.append((event, peer.addresses)) if peer.key == key else None)
    await d.start(7145, new_key())
    raw = AsyncZeroconf(interfaces=LOOPBACK, ip_version=IPVersion.V4Only)
    info = raw_info("mm-moving", {"pk": key, "v": "1"}, port=7146)
    try:
        await raw.async_register_service(info, cooperating_responders=True)
        await until(lambda: d.find(key), "the announcement")
        await raw.async_update_service(raw_info("mm-moving", {"pk": key, "v": "1"}, port=7147))
        await until(lambda: d.find(key) and d.find(key).addresses == ("http:127.0.0.1:7147",), "the new port")
        await raw.async_update_service(raw_info("mm-moving", {"pk": "ed25519:garbage", "v": "1"}, port=7147))
        await until(lambda: d.find(key) is None, "the spoiled announcement to be dropped")
        assert events == [("added", ("http:127.0.0.1:7146",)), ("updated", ("http:127.0.0.1:7147",)),
                          ("removed", ("http:127.0.0.1:7147",))]
    finally:
        await raw.async_close()
        await d.stop()


async def test_peers_kept_are_bounded():
    d = Discovery(interfaces=LOOPBACK, ip_version=IPVersion.V4Only, max_peers=2)
    await d.start(7141, new_key())
    raw = AsyncZeroconf(interfaces=LOOPBACK, ip_version=IPVersion.V4Only)
    try:
        infos = [raw_info(f"mm-many-{i}", {"pk": new_key(), "v": "1"}) for i in range(5)]
        await asyncio.gather(*(raw.async_register_service(i, cooperating_responders=True) for i in infos))
        # (>= : another memmesh node on this machine's loopback may also be refused)
        await until(lambda: len(d.peers()) == 2 and d.ignored["full"] >= 3,
                    lambda: f"two peers kept and three refused (so far {len(d.peers())}, {dict(d.ignored)})")
    finally:
        await raw.async_close()
        await d.stop()


async def test_start_and_stop_are_idempotent_and_leave_nothing_running():
    threads = threading.active_count()
    key = new_key()
    d = node()
    await d.stop()  # stop before start: nothing to do
    await d.start(7151, key)
    await d.start(7151, key)  # same arguments: no-op
    assert await d.wait_announced() and d.announced
    with pytest.raises(DiscoveryError, match="already runs"):
        await d.start(7152, key)
    assert d.running
    await d.stop()
    await d.stop()
    assert not d.running and d.peers() == []
    assert threading.active_count() == threads
    assert other_tasks() == set()
    await d.start(7153, key)  # can start again after a stop
    await d.stop()
    assert threading.active_count() == threads
    assert other_tasks() == set()


async def test_bad_arguments_are_refused_before_touching_the_network():
    d = node()
    with pytest.raises(ValueError):
        await d.start(0, new_key())
    with pytest.raises(ValueError):
        await d.start(7161, "ed25519:short")
    with pytest.raises(ValueError):
        Discovery(interfaces=LOOPBACK, addresses=["not-an-ip"])
    with pytest.raises(ValueError):
        Discovery(interfaces=["eth0"])
    assert not d.running


@pytest.mark.parametrize("interfaces, says", [
    (["10.255.255.1"], "no interface here has the address 10.255.255.1"),
    ([], "no IPv4 address to announce"),
])
async def test_zeroconf_failures_become_an_actionable_error(interfaces, says):
    d = Discovery(interfaces=interfaces, ip_version=IPVersion.V4Only)
    with pytest.raises(DiscoveryError) as err:
        await d.start(7171, new_key())
    message = str(err.value)
    assert message.startswith("LAN discovery could not start: ") and says in message
    assert message.endswith("run with --no-discovery")
    assert err.value.__cause__ is None and "Traceback" not in message
    assert not d.running and other_tasks() == set()


async def test_no_multicast_sender_is_an_error():
    # Announcing an address but listening on no interface: zeroconf would start deaf and mute.
    d = Discovery(interfaces=[], ip_version=IPVersion.V4Only, addresses=["127.0.0.1"])
    with pytest.raises(DiscoveryError, match="could join the mDNS multicast group"):
        await d.start(7181, new_key())
    assert not d.running and other_tasks() == set()


CHILD = r"""
import asyncio, json, signal, sys, threading
from memmesh.node.sync.discovery import Discovery

def say(**fields):
    print(json.dumps(fields), flush=True)

async def main(port, key):
    d = Discovery(interfaces=["127.0.0.1"])
    d.on_change(lambda event, peer: say(event=event, key=peer.key, addresses=list(peer.addresses)))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await d.start(port, key)
    say(event="started")
    await stop.wait()
    await d.stop()
    left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    say(event="stopped", threads=threading.active_count(), tasks=len(left))

asyncio.run(main(int(sys.argv[1]), sys.argv[2]))
"""


@pytest.mark.slow
async def test_a_node_in_another_process_is_found_and_withdrawn():
    parent_key, child_key = new_key(), new_key()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, "7191", child_key, cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    lines: list[dict] = []

    async def read() -> None:
        assert child.stdout is not None
        while line := await child.stdout.readline():
            lines.append(json.loads(line))

    reader = asyncio.ensure_future(read())
    d, later = node(), node()
    try:
        await d.start(7192, parent_key)
        peer = await until(lambda: d.find(child_key), "the child node")
        assert peer.addresses == ("http:127.0.0.1:7191",)
        seen = await until(lambda: [m for m in lines if m.get("key") == parent_key], "the child to see us")
        assert seen[0]["event"] == "added" and seen[0]["addresses"] == ["http:127.0.0.1:7192"]
        child.terminate()
        await until(lambda: any(m["event"] == "stopped" for m in lines), "the child to stop")
        assert await asyncio.wait_for(child.wait(), DEADLINE_S) == 0
        stopped = [m for m in lines if m["event"] == "stopped"][0]
        assert stopped["threads"] == 1 and stopped["tasks"] == 0
        await until(lambda: d.find(child_key) is None, "the child's goodbye")
        await later.start(7193, new_key())
        await until(lambda: later.find(parent_key), "a later node to see us")
        assert later.find(child_key) is None
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
        await reader
        await asyncio.gather(d.stop(), later.stop())
