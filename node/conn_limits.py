"""What one listener allows: its connection caps (per listener, per source address), its request
timers, and the file descriptors the process keeps aside (docs/operations.md, "Connection
limits"). The defaults hold unless an environment variable (``ENV``) overrides one.
"""
from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from memmesh.auth.errors import MemmeshError

__all__ = ["ACCEPT_PAUSE_S", "BODY_TIMEOUT_S", "ENV", "HEAD_TIMEOUT_S", "KEEPALIVE_S", "MAX_PER_LISTENER",
           "MAX_PER_SOURCE", "RESERVED_FDS", "Limits", "LimitsError", "reserve_fds", "source_of"]

# A well-behaved client (our own sync client, curl, a browser) sends its whole request head in one
# write, milliseconds after connecting; 10 s still covers a lossy link's retransmissions (1+2+4 s)
# and bounds what a slow-header client holds: a slot for 10 s, not forever.
HEAD_TIMEOUT_S = 10.0
# A request body (8 MiB at most on the sync port, 1 MiB on the API) must be complete this long
# after its head. Above the sync routes' own read timeout (30 s), so those answer 408 first;
# the backstop for every other route (the API's, the control socket's, an unknown path's, an
# Expect: 100-continue that never sends its body), none of which times its body itself.
BODY_TIMEOUT_S = 40.0
# Idle time allowed between requests on one connection (and for the next request's head). Above
# aiohttp's client keep-alive (15 s), so our own sync client drops an idle connection first and
# never reuses one the server is closing; the default sync interval (5 s) reuses well within it.
KEEPALIVE_S = 20.0
# Far above what a node needs (peers x fanout, a handful of API clients), far below the
# descriptors a process gets once reserve_fds raised its limit (1,024 is the usual floor).
MAX_PER_LISTENER = 256
# One address gets an eighth of a listener: several peers behind one NAT still fit, and eight
# addresses are needed to fill a listener. IPv6 sources count per /64 (what one host is given).
MAX_PER_SOURCE = 32
RESERVED_FDS = 128  # for the databases, the log, outgoing sync connections, DNS, the control socket's clients
ACCEPT_PAUSE_S = 1.0  # how long a listener stops accepting when no descriptor is left

ENV = {"head_timeout_s": "MEMMESH_HEAD_TIMEOUT_S", "body_timeout_s": "MEMMESH_BODY_TIMEOUT_S",
       "per_listener": "MEMMESH_MAX_CONNECTIONS", "per_source": "MEMMESH_MAX_CONNECTIONS_PER_SOURCE",
       "keepalive_s": "MEMMESH_KEEPALIVE_S"}


class LimitsError(MemmeshError):
    """A connection limit given in the environment is not a number serve can use."""


@dataclass(frozen=True)
class Limits:
    """What one listener allows. None: no bound of that kind (the control socket's per-source
    bound: only the home's owner can connect to it)."""

    head_timeout_s: float | None = HEAD_TIMEOUT_S
    keepalive_s: float = KEEPALIVE_S
    per_listener: int | None = MAX_PER_LISTENER
    per_source: int | None = MAX_PER_SOURCE
    body_timeout_s: float | None = BODY_TIMEOUT_S
    evict_stalled: bool = False  # at the listener cap, close a stalled connection instead of refusing

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Limits:
        """The defaults, each overridable by its environment variable (``ENV``; for tests and for
        operators who know their load)."""
        env: Mapping[str, str] = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field, var in ENV.items():
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            try:
                value = float(raw) if field.endswith("_s") else int(raw)
            except ValueError:
                raise LimitsError(f"{var} should be a {'number of seconds' if field.endswith('_s') else 'whole number'}"
                                  f", got {raw!r}") from None
            if not value > 0 or value != value or value == float("inf"):
                raise LimitsError(f"{var} should be greater than 0, got {raw!r}")
            values[field] = value
        return cls(**values)

    def within(self, fds_for_listener: int) -> Limits:
        """These limits with the listener cap no larger than ``fds_for_listener``."""
        cap = fds_for_listener if self.per_listener is None else min(self.per_listener, fds_for_listener)
        source = None if self.per_source is None else min(self.per_source, cap)
        return replace(self, per_listener=cap, per_source=source)


def reserve_fds(listeners: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (as far as the kernel allows);
    how many descriptors each of ``listeners`` listeners may use, RESERVED_FDS kept aside."""
    try:
        import resource
    except ImportError:  # not on this platform: assume the common 1,024
        return max(8, (1024 - RESERVED_FDS) // listeners)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for target in (hard, 1 << 20, 65536):  # RLIM_INFINITY / above nr_open are refused: try less
        if target == resource.RLIM_INFINITY or (soft != resource.RLIM_INFINITY and target <= soft):
            continue
        if hard != resource.RLIM_INFINITY and target > hard:
            continue
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
            break
        except (ValueError, OSError):
            continue
    usable = 1 << 20 if soft == resource.RLIM_INFINITY else soft
    return max(8, (usable - RESERVED_FDS) // listeners)


def source_of(addr: Any) -> str | None:
    """The address a per-source cap counts: the IP (an IPv6 one as its /64), None for a Unix peer."""
    if not isinstance(addr, tuple) or not addr:
        return None
    try:
        ip = ipaddress.ip_address(str(addr[0]).split("%", 1)[0])
    except ValueError:
        return str(addr[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{ip}/64", strict=False))
    return str(ip)
