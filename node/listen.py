"""Where a listener listens: the HOST:PORT form every listening option takes, and its defaults.

Below the commands and the configuration, which both check listen addresses with this one rule.
"""
from __future__ import annotations

import ipaddress

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7411


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) as (host, port); port 0 picks a free port."""
    host, sep, port = text.rpartition(":")
    # isascii: str.isdigit() also accepts '²', which int() refuses; at most 5 digits before int().
    digits = port.isascii() and port.isdigit() and len(port) <= 5
    if not sep or not host or not digits or not 0 <= int(port) <= 65535:
        raise ValueError("should be HOST:PORT with a port from 0 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"should be HOST:PORT, and {host!r} is not an IPv6 address") from None
    elif ":" in host:
        raise ValueError(f"should be HOST:PORT, an IPv6 address in brackets: [{host}]:{port}")
    return host, int(port)
