"""What an operator reads when LAN discovery fails: a sentence to act on for an error from
zeroconf or the socket layer (which port, which permission, which route)."""
from __future__ import annotations

import errno

from zeroconf import NotRunningException


def explain(exc: BaseException) -> str:
    """A sentence an operator can act on for an error from zeroconf or the socket layer."""
    if isinstance(exc, OSError) and exc.errno is not None:
        hints = {
            errno.EADDRINUSE: "UDP port 5353 is held by another mDNS responder that does not share it"
                              " (stop it, or let memmesh use the system's responder)",
            errno.EACCES: "not permitted to open multicast UDP sockets on port 5353",
            errno.EPERM: "not permitted to open multicast UDP sockets on port 5353",
            errno.ENODEV: "no interface to join the mDNS group on (an address that no interface has,"
                          " or no route for multicast 224.0.0.251: pass interfaces= or add a route)",
            errno.EADDRNOTAVAIL: "an address to listen on is not assigned to any interface",
            errno.ENETUNREACH: "no route for multicast 224.0.0.251 (add one, e.g."
                               " 'ip route add 224.0.0.0/4 dev <interface>')",
            errno.ENOBUFS: "the kernel refused another multicast membership"
                           " (raise net.ipv4.igmp_max_memberships)",
        }
        hint = hints.get(exc.errno)
        detail = f"{exc.strerror or exc} (errno {exc.errno})"
        return f"{hint}: {detail}" if hint else detail
    if isinstance(exc, NotRunningException):
        return "zeroconf did not come up in time (is the event loop blocked?)"
    return str(exc) or type(exc).__name__
