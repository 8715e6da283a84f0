"""The door of every local HTTP listener (the API, `memmesh mcp --http`): Host, then bearer token.

One rule each, below the transports that apply them, so the API (node/api/app.py) and the MCP
transport (node/mcp_server.py) cannot come to differ: a request must name the address it
arrived on, or a localhost form of it (a page loaded by DNS rebinding carries its own host
name), and carry ``Authorization: Bearer <the content of HOME/api.token>``, compared in
constant time.
"""
from __future__ import annotations

import ipaddress
from typing import Any

from memmesh.node.api_token import matches

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})
NO_TOKEN = "no token"  # no Authorization header, or not a bearer token
WRONG_TOKEN = "wrong token"  # a bearer token that is not this node's


def bearer_refusal(authorization: str, token: str) -> str | None:
    """None when the Authorization header's bearer token is ``token``; else why not
    (NO_TOKEN or WRONG_TOKEN), for the listener to word its 401."""
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return NO_TOKEN
    if not matches(given.strip(), token):
        return WRONG_TOKEN
    return None


def host_allowed(host: str, sockname: Any) -> bool:
    """Whether a Host header value names the local address ``sockname`` (the socket's own
    address, a tuple) or a localhost form of it. Any well-formed port passes: a rebinding page
    is told apart by its host name, never by a port, and a port forward (``ssh -L 9000:...``,
    a local proxy) puts its own port in the Host header."""
    if not sockname or not isinstance(sockname, tuple):
        return False
    local = str(sockname[0])
    name, _, given_port = host.strip().lower().rpartition(":")
    if not name or "]" in given_port:  # no port (or a bare IPv6 literal)
        name, given_port = host.strip().lower(), "80"
    if not given_port.isascii() or not given_port.isdigit() or not 0 < int(given_port) < 65536:
        return False
    if name in LOCAL_HOSTS or name == "localhost.":  # the root-anchored name is localhost too (RFC 6761)
        return True
    # An address literal in any spelling ([0:0:0:0:0:0:0:1], [::ffff:127.0.0.1]) of the listen
    # address or of loopback: a page reaches a literal only by naming it, so no rebinding
    # stands behind one.
    given_ip = _host_address(name)
    if given_ip is None:
        return False
    try:
        local_ip = _plain(ipaddress.ip_address(local))
    except ValueError:  # not an address the socket could have; nothing then names it
        local_ip = None
    return given_ip in _LOOPBACK_IPS or given_ip == local_ip


_LOOPBACK_IPS = frozenset({ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")})
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _host_address(name: str) -> Address | None:
    """The address a Host literal names (IPv6 only in brackets, without a zone id); None for a
    host name or anything ipaddress does not read (127.1, 2130706433, leading zeros)."""
    bracketed = name.startswith("[") and name.endswith("]")
    if ":" in name and not bracketed:
        return None
    try:
        ip = ipaddress.ip_address(name[1:-1] if bracketed else name)
    except ValueError:
        return None
    if bracketed != isinstance(ip, ipaddress.IPv6Address) or getattr(ip, "scope_id", None):
        return None
    return _plain(ip)


def _plain(ip: Address) -> Address:
    """IPv4-mapped IPv6 (::ffff:127.0.0.1) as the IPv4 address it is."""
    return ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else ip
