"""Where a listener listens: the HOST:PORT form every listening option takes, and its defaults.

Below the commands and the configuration, which both check listen addresses with this one rule.
"""
from __future__ import annotations

import ipaddress

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7411
OFF = "off"  # where the HTTP API listens when it should not: nowhere


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


def check_listen(value: str | None) -> str | None:
    """The rule as a field validator applies it: not given (None) passes, anything else is
    HOST:PORT (ValueError says why not)."""
    if value is not None:
        parse_listen(value)
    return value


def check_listen_or_off(value: str | None) -> str | None:
    """``check_listen`` for a listener that may be turned off (the HTTP API's ``off``)."""
    return value if value == OFF else check_listen(value)
