"""What a memmesh node announces on the LAN (mDNS / DNS-SD, docs/protocol.md): its service
type, its instance name, its TXT record (exactly ``pk`` and ``v``), and the strict reading of
an announcement, which is a hint to try and never a proof of anything."""
from __future__ import annotations

import hashlib
import ipaddress

from zeroconf import IPVersion
from zeroconf.asyncio import AsyncServiceInfo

from memmesh.auth.errors import KeyFormatError
from memmesh.auth.keys import PublicKey

SERVICE_TYPE = "_memmesh._tcp.local."
PROTOCOL_VERSION = "1"
MAX_TXT_BYTES = 256  # a v1 TXT is ~62 bytes; anything much larger is not ours
MAX_VALUE_BYTES = 64  # a key string is 51 characters
MAX_ADDRESSES = 8  # addresses kept per announcement (and announced)
TXT_KEYS = frozenset({b"pk", b"v"})


def node_label(peer_key: str) -> str:
    """The instance name of a node: ``mm-`` and 16 hex digits of sha256 of its key string."""
    return "mm-" + hashlib.sha256(peer_key.encode("utf-8")).hexdigest()[:16]


def address_hint(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    return f"http:[{ip}]:{port}" if ip.version == 6 else f"http:{ip}:{port}"


def usable(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    # IPv6 link-local needs a scope id that an http:<host>:<port> hint cannot carry.
    return not (ip.is_unspecified or ip.is_multicast or (ip.version == 6 and ip.is_link_local)
                or (ip.version == 4 and ip == ipaddress.IPv4Address("255.255.255.255")))


def parse_announcement(info: AsyncServiceInfo, versions: set[int]) -> tuple[str, tuple[str, ...]] | str:
    """``(key, address hints)`` from a resolved announcement, or the reason it is ignored."""
    text = info.text or b""
    if len(text) > MAX_TXT_BYTES:
        return "txt-size"
    props = info.properties  # parsed only once the size is known to be small
    if b"pk" not in props:
        return "pk-missing"
    if b"v" not in props:
        return "v-missing"
    if set(props) != TXT_KEYS:
        return "txt-extra"  # a v1 announcement is exactly pk and v (never a database id)
    version, pk = props[b"v"], props[b"pk"]
    if version is None or len(version) > MAX_VALUE_BYTES or version.decode("ascii", "replace") != PROTOCOL_VERSION:
        return "version"
    if pk is None or len(pk) > MAX_VALUE_BYTES:
        return "pk"
    try:
        key = str(PublicKey.parse(pk.decode("ascii")))
    except (UnicodeDecodeError, KeyFormatError):
        return "pk"
    port = info.port
    if not isinstance(port, int) or not 0 < port < 65536:
        return "port"
    hints: list[str] = []
    for ip in info.ip_addresses_by_version(IPVersion.All):
        if ip.version in versions and usable(ip):
            hint = address_hint(ip, port)
            if hint not in hints:
                hints.append(hint)
        if len(hints) >= MAX_ADDRESSES:
            break
    if not hints:
        return "address"
    return key, tuple(hints)
