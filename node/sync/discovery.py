"""LAN discovery: announce this node and find peers with zeroconf (mDNS/DNS-SD).

A node announces one service of type ``_memmesh._tcp.local.``:

- instance name ``mm-<16 hex of sha256(peer key)>`` (a stable label, nothing else), host name
  ``<label>.local.``, the node's sync port in the SRV record and its addresses in A/AAAA;
- TXT exactly ``pk=<peer key "ed25519:<base64url>">`` and ``v=1`` (this format's version).

Never a database id, a database count or anything else about what the node holds: anyone on
the LAN can read an announcement. (A database that must be findable would use a keyed hash.)

What is read from the LAN is a hint, never trusted beyond "try this address": a peer proves its
key on first contact (the signed sync handshake). Reading is bounded: at most ``max_peers``
announcements are kept, TXT records over ``MAX_TXT_BYTES`` and values over ``MAX_VALUE_BYTES``
are ignored, at most ``MAX_ADDRESSES`` addresses per announcement are kept, and resolutions run
``MAX_RESOLVING`` at a time. Announcements whose ``pk`` is not a well-formed key, whose ``v`` is
unknown, whose TXT carries anything else (a v1 announcement is exactly ``pk`` and ``v``) or that
are our own are ignored and counted in ``Discovery.ignored`` by reason.

Everything runs on the caller's asyncio loop (no thread); ``stop()`` sends the goodbye packets,
cancels every task it started and closes the sockets. Zeroconf failures at start (no multicast,
port 5353 held, no usable interface) raise ``DiscoveryError`` with a sentence an operator can act
on.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from zeroconf import (
    DNSQuestionType,
    InterfaceChoice,
    IPVersion,
    ServiceStateChange,
    current_time_millis,
)
from zeroconf import (
    Error as ZeroconfError,
)
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from memmesh.auth.errors import MemmeshError
from memmesh.auth.keys import PublicKey
from memmesh.crdt.clock import now_ms
from memmesh.node.sync.announcement import (
    MAX_ADDRESSES,
    MAX_TXT_BYTES,
    PROTOCOL_VERSION,
    SERVICE_TYPE,
    node_label,
    parse_announcement,
    usable,
)
from memmesh.node.sync.lan_errors import explain

log = logging.getLogger(__name__)

HOW_LAN = "lan"

MAX_PEERS = 1024  # announcements (instance names) kept; new ones beyond are ignored
MAX_RESOLVING = 16  # concurrent resolutions of announcements
RESOLVE_TIMEOUT_MS = 3000
TTL_S = 120  # short TTLs for every record: a peer that vanished without a goodbye ages out fast

_NO_DISCOVERY = "run with --no-discovery"

__all__ = [  # the announcement's names too: callers and tests name them from here
    "MAX_TXT_BYTES",
    "DiscoveredPeer",
    "Discovery",
    "DiscoveryError",
    "HOW_LAN",
    "PROTOCOL_VERSION",
    "SERVICE_TYPE",
    "node_label",
]


class DiscoveryError(MemmeshError):
    """LAN discovery could not start (or was misused); the message says what to do."""


@dataclass(frozen=True)
class DiscoveredPeer:
    """A peer seen on the LAN: a hint to try, not a proof of anything.

    ``addresses`` are ``http:<host>:<port>`` hints (IPv6 in brackets), most recent first;
    ``last_seen`` is the wall-clock time in ms when an announcement of this key was last read.
    """

    key: str
    addresses: tuple[str, ...]
    last_seen: int
    how: str = HOW_LAN


@dataclass
class _Entry:  # one resolved announcement (one instance name)
    key: str
    addresses: tuple[str, ...]
    heard: float  # zeroconf's monotonic ms when its records were last received


OnChange = Callable[[str, DiscoveredPeer], None]


def _versions(ip_version: IPVersion) -> set[int]:
    return {IPVersion.V4Only: {4}, IPVersion.V6Only: {6}}.get(ip_version, {4, 6})


class Discovery:
    """Announce this node on the LAN and keep a bounded list of the peers announced there.

    ``interfaces``: zeroconf's choice (default ``InterfaceChoice.All``) or a list of IP
    addresses (tests pass ``["127.0.0.1"]``). ``ip_version``: IPv4 only by default.
    ``addresses``: the IP addresses to announce; by default the listed interface addresses, or
    for an ``InterfaceChoice`` this machine's non-loopback addresses.
    """

    def __init__(
        self,
        interfaces: InterfaceChoice | Sequence[str | int] = InterfaceChoice.All,
        ip_version: IPVersion = IPVersion.V4Only,
        addresses: Sequence[str] | None = None,
        *,
        max_peers: int = MAX_PEERS,
        on_change: OnChange | None = None,
    ) -> None:
        if isinstance(interfaces, InterfaceChoice):
            self._interfaces: InterfaceChoice | list[str | int] = interfaces
        else:  # IP addresses, or IPv6 interface indexes, as zeroconf takes them
            self._interfaces = [i if isinstance(i, int) and not isinstance(i, bool) else self._check_ip(i)
                                for i in interfaces]
        if max_peers < 1:
            raise ValueError(f"max_peers is at least 1, got {max_peers}")
        self._ip_version = ip_version
        self._versions = _versions(ip_version)
        self._addresses = None if addresses is None else [self._check_ip(a) for a in addresses]
        self._max_peers = max_peers
        self._callbacks: list[OnChange] = [on_change] if on_change else []
        self._lock = asyncio.Lock()
        self._zc: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._info: AsyncServiceInfo | None = None
        self._key: str | None = None
        self._port: int | None = None
        self._tasks: set[asyncio.Future] = set()
        self._resolving: dict[str, asyncio.Task] = {}
        self._again: set[str] = set()
        self._semaphore = asyncio.Semaphore(MAX_RESOLVING)
        self._announced = asyncio.Event()
        self._entries: dict[str, _Entry] = {}  # instance name -> its resolved announcement
        self._by_key: dict[str, set[str]] = {}  # peer key -> instance names announcing it
        self.ignored: Counter[str] = Counter()  # announcements ignored, by reason
        self._wall_offset = now_ms() - current_time_millis()  # zeroconf's monotonic ms -> wall ms

    # -- public API -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._zc is not None

    @property
    def name(self) -> str | None:
        """Our registered instance name (zeroconf may have suffixed it after a conflict)."""
        return self._info.name if self._info else None

    @property
    def announced(self) -> bool:
        """True once our announcement is registered (start() returns before: probing the name
        on the LAN takes about a second)."""
        return self._announced.is_set()

    async def wait_announced(self, timeout: float = 5.0) -> bool:
        """Wait until our announcement is registered; False if it is not within ``timeout``."""
        try:
            await asyncio.wait_for(self._announced.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def on_change(self, callback: OnChange) -> Callable[[], None]:
        """Call ``callback(event, peer)`` when a peer appears ("added"), changes its addresses
        ("updated") or disappears ("removed"); on the event loop, so keep it quick. Returns a
        function that unsubscribes it."""
        self._callbacks.append(callback)

        def unsubscribe() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)
        return unsubscribe

    def peers(self) -> list[DiscoveredPeer]:
        """The peers currently announced on the LAN (not us), most recently seen first."""
        found = [p for p in map(self._peer, list(self._by_key)) if p is not None]
        return sorted(found, key=lambda p: (-p.last_seen, p.key))

    def find(self, key: str) -> DiscoveredPeer | None:
        """The LAN hint for a peer key, if it is announced."""
        return self._peer(key)

    async def start(self, port: int, peer_key: str) -> None:
        """Announce ``peer_key`` at ``port`` and start browsing; a no-op if already started with
        the same arguments. Raises DiscoveryError if zeroconf cannot run here."""
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"a port is 1..65535, got {port!r}")
        key = str(PublicKey.parse(peer_key))  # KeyFormatError for a malformed key
        async with self._lock:
            if self._zc is not None:
                if (self._port, self._key) == (port, key):
                    return
                raise DiscoveryError(f"LAN discovery already runs for {self._key} on port {self._port}; stop it first")
            addresses = self._announced_addresses()
            try:
                await self._start(port, key, addresses)
            except asyncio.CancelledError:
                await self._teardown(goodbye=False)
                raise
            except (OSError, RuntimeError, ValueError, ZeroconfError) as exc:
                await self._teardown(goodbye=False)
                raise DiscoveryError(f"LAN discovery could not start: {explain(exc)}"
                                     f" (interfaces: {self._describe_interfaces()}); {_NO_DISCOVERY}") from None

    async def stop(self) -> None:
        """Withdraw our announcement (goodbye packets), stop browsing and close the sockets.
        Idempotent; the instance can be started again."""
        async with self._lock:
            await self._teardown(goodbye=True)

    async def __aenter__(self) -> Discovery:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- start and stop ---------------------------------------------------------------------

    async def _start(self, port: int, key: str, addresses: list[str]) -> None:
        if isinstance(self._interfaces, list):
            # zeroconf raises ENODEV for an address no interface has, leaking its listen socket
            local = {ipaddress.ip_address(a) for a in self._local_addresses(loopback=True)}
            missing = [a for a in self._interfaces if isinstance(a, str) and ipaddress.ip_address(a) not in local
                       and ipaddress.ip_address(a).version in self._versions]
            if missing:
                raise RuntimeError(f"no interface here has the address {', '.join(missing)}")
        self._zc = AsyncZeroconf(interfaces=self._interfaces, ip_version=self._ip_version)
        zc = self._zc.zeroconf
        await zc.async_wait_for_start()
        if not zc.engine.senders:
            raise RuntimeError("no interface could join the mDNS multicast group 224.0.0.251"
                               " (no multicast on this machine?)")
        label = node_label(key)
        self._info = AsyncServiceInfo(
            SERVICE_TYPE,
            f"{label}.{SERVICE_TYPE}",
            port=port,
            properties={"pk": key, "v": PROTOCOL_VERSION},
            server=f"{label}.local.",
            addresses=[ipaddress.ip_address(a).packed for a in addresses],
            host_ttl=TTL_S,
            other_ttl=TTL_S,
        )
        self._key, self._port = key, port
        self._browser = AsyncServiceBrowser(
            zc, SERVICE_TYPE, handlers=[self._on_service_state_change],
            question_type=DNSQuestionType.QM,  # multicast answers: several nodes may share a host
        )
        # Probing the name takes about a second; it runs in the background so that start()
        # returns as soon as the sockets are up (every error that can happen here already did).
        self._track(asyncio.ensure_future(self._announce(self._zc, self._info)))

    async def _announce(self, aiozc: AsyncZeroconf, info: AsyncServiceInfo) -> None:
        try:
            # Another responder with our name is us (same key) or an impostor: take
            # "<label>-2" rather than fail; names say nothing, readers go by the TXT key.
            broadcasts = await aiozc.async_register_service(info, allow_name_change=True)
            self._announced.set()
            await broadcasts
        except asyncio.CancelledError:
            raise
        except (OSError, RuntimeError, ValueError, ZeroconfError) as exc:
            log.warning("LAN discovery could not announce this node: %s", explain(exc))

    async def _teardown(self, goodbye: bool) -> None:
        aiozc, browser, info = self._zc, self._browser, self._info
        self._zc = self._browser = self._info = None
        self._key = self._port = None
        self._announced.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self._resolving.clear()
        self._again.clear()
        gone = self.peers()
        self._entries.clear()
        self._by_key.clear()
        if aiozc is not None:
            try:
                if browser is not None:
                    await browser.async_cancel()
                if goodbye and info is not None and aiozc.zeroconf.registry.async_get_info_name(info.name):
                    await (await aiozc.async_unregister_service(info))
                await aiozc.async_close()
            except (OSError, RuntimeError, ZeroconfError) as exc:  # closing must not fail the caller
                log.warning("LAN discovery did not stop cleanly: %s", explain(exc))
        for peer in gone:  # stopped: every peer we listed is gone from our view
            self._emit("removed", peer)

    def _announced_addresses(self) -> list[str]:
        if self._addresses is not None:
            chosen = [a for a in self._addresses if ipaddress.ip_address(a).version in self._versions]
        elif isinstance(self._interfaces, list):
            chosen = [a for a in self._interfaces if isinstance(a, str)
                      and ipaddress.ip_address(a).version in self._versions]
        else:
            chosen = self._local_addresses()
        chosen = [a for a in dict.fromkeys(chosen) if usable(ipaddress.ip_address(a))][:MAX_ADDRESSES]
        if not chosen:
            versions = "/".join(f"IPv{v}" for v in sorted(self._versions))
            raise DiscoveryError(f"LAN discovery could not start: no {versions} address to announce"
                                 f" (interfaces: {self._describe_interfaces()}); pass addresses= or {_NO_DISCOVERY}")
        return chosen

    def _local_addresses(self, loopback: bool = False) -> list[str]:
        """This machine's addresses of our IP versions (loopback only if asked)."""
        import ifaddr  # a dependency of zeroconf

        ips = []
        for adapter in ifaddr.get_adapters():
            for addr in adapter.ips:
                ip = ipaddress.ip_address(addr.ip if isinstance(addr.ip, str) else addr.ip[0])
                if ip.version in self._versions and (loopback or not ip.is_loopback) and usable(ip):
                    ips.append(str(ip))
        return ips

    def _describe_interfaces(self) -> str:
        if isinstance(self._interfaces, InterfaceChoice):
            return f"InterfaceChoice.{self._interfaces.name}"
        return ", ".join(map(str, self._interfaces)) or "(none)"

    @staticmethod
    def _check_ip(text: str | int) -> str:
        try:
            return str(ipaddress.ip_address(text))
        except ValueError:
            raise ValueError(f"interfaces and addresses are IP addresses, got {text!r}") from None

    def _track(self, task: asyncio.Future) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- browsing -----------------------------------------------------------------------------

    def _on_service_state_change(self, zeroconf: object, service_type: str, name: str,
                                 state_change: ServiceStateChange) -> None:
        if self._zc is None or service_type != SERVICE_TYPE or not name.endswith("." + SERVICE_TYPE):
            return
        if self._info is not None and name.lower() == self._info.name.lower():
            return  # our own announcement
        if state_change is ServiceStateChange.Removed:
            task = self._resolving.pop(name, None)
            if task is not None:
                task.cancel()
            self._again.discard(name)
            self._drop(name)
            return
        if name in self._resolving:
            self._again.add(name)  # changed while resolving: resolve once more after
            return
        if name not in self._entries and len(self._entries) + len(self._resolving) >= self._max_peers:
            self.ignored["full"] += 1
            return
        task = asyncio.ensure_future(self._resolve(name))
        self._resolving[name] = task
        self._track(task)

    async def _resolve(self, name: str) -> None:
        try:
            while True:
                self._again.discard(name)
                zc = self._zc
                if zc is None:
                    return
                info = AsyncServiceInfo(SERVICE_TYPE, name)
                async with self._semaphore:
                    ok = await info.async_request(zc.zeroconf, RESOLVE_TIMEOUT_MS,
                                                  question_type=DNSQuestionType.QM)
                if not ok:
                    self.ignored["unresolved"] += 1
                elif self._zc is zc:
                    self._accept(name, info)
                if name not in self._again:
                    return
        except asyncio.CancelledError:
            raise
        except (OSError, RuntimeError, ValueError, ZeroconfError) as exc:
            self.ignored["error"] += 1
            log.debug("resolving %s failed: %s", name, explain(exc))
        finally:
            if self._resolving.get(name) is asyncio.current_task():
                del self._resolving[name]

    def _accept(self, name: str, info: AsyncServiceInfo) -> None:
        parsed = parse_announcement(info, self._versions)
        if isinstance(parsed, str):
            self.ignored[parsed] += 1
            log.debug("ignoring LAN announcement %s: %s", name, parsed)
            self._drop(name)  # an announcement that turned bad no longer counts
            return
        key, hints = parsed
        if key == self._key:
            self.ignored["own"] += 1  # our key under another name (e.g. a second process)
            self._drop(name)
            return
        if name not in self._entries and len(self._entries) >= self._max_peers:
            self.ignored["full"] += 1
            return
        previous = self._entries.get(name)
        before = {previous.key: self._peer(previous.key)} if previous else {}
        before.setdefault(key, self._peer(key))
        if previous is not None and previous.key != key:
            self._unindex(name, previous.key)
        self._entries[name] = _Entry(key, hints, current_time_millis())
        self._by_key.setdefault(key, set()).add(name)
        self._changed(before)

    def _drop(self, name: str) -> None:
        entry = self._entries.get(name)
        if entry is None:
            return
        before = {entry.key: self._peer(entry.key)}
        del self._entries[name]
        self._unindex(name, entry.key)
        self._changed(before)

    def _unindex(self, name: str, key: str) -> None:
        names = self._by_key.get(key)
        if names is not None:
            names.discard(name)
            if not names:
                del self._by_key[key]

    # -- the peer view ------------------------------------------------------------------------

    def _peer(self, key: str) -> DiscoveredPeer | None:
        names = self._by_key.get(key)
        if not names:
            return None
        heard = sorted(((self._heard(n), n) for n in names), reverse=True)
        hints = list(dict.fromkeys(h for _, n in heard for h in self._entries[n].addresses))
        last_seen = int(heard[0][0] + self._wall_offset)  # zeroconf's clock is monotonic
        return DiscoveredPeer(key=key, addresses=tuple(hints[:MAX_ADDRESSES]), last_seen=last_seen)

    def _heard(self, name: str) -> float:
        """When the announcement ``name`` was last heard: its PTR record in zeroconf's cache
        is replaced at every refresh, so it is later than the resolution when the peer is alive."""
        entry = self._entries[name]
        if self._zc is not None:
            record = self._zc.zeroconf.cache.current_entry_with_name_and_alias(SERVICE_TYPE, name)
            if record is not None and record.created > entry.heard:
                return record.created
        return entry.heard

    def _changed(self, before: dict[str, DiscoveredPeer | None]) -> None:
        for key, old in before.items():
            new = self._peer(key)
            if old is None and new is not None:
                self._emit("added", new)
            elif old is not None and new is None:
                self._emit("removed", old)
            elif old is not None and new is not None and old.addresses != new.addresses:
                self._emit("updated", new)

    def _emit(self, event: str, peer: DiscoveredPeer) -> None:
        for callback in list(self._callbacks):
            try:
                callback(event, peer)
            except Exception:  # a subscriber's bug must not break discovery
                log.exception("LAN discovery on_change callback failed")

