"""Listening sockets, bound before anything is served: a TCP listener at HOST:PORT, and the
control channel's Unix socket, of mode 0600 from the moment it exists.

Below the transports: serve binds its sync API, HTTP API and control channel here, MCP its
Streamable HTTP listener.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

from memmesh.node.control import ServeError, socket_address
from memmesh.node.listen import parse_listen

BACKLOG = 128


def bind_listen(listen: str) -> socket.socket:
    """A listening TCP socket at ``listen`` (HOST:PORT; port 0: any free port)."""
    host, port = parse_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=BACKLOG)
    except OSError as exc:
        raise ServeError(f"cannot listen on {listen}: {exc.strerror or exc}") from None


def bind_control_socket(path: Path) -> socket.socket:
    """A listening Unix socket at ``path``, mode 0600 from the moment it exists: bound under
    umask 0177, so nobody else ever finds it writable, then chmod; only its owner connects."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o177)
        try:
            with socket_address(path) as address:
                sock.bind(address)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def host_port(sock: socket.socket) -> tuple[str, int]:
    """Where ``sock`` listens, its host as an address names it (an IPv6 one in brackets)."""
    host, port = sock.getsockname()[:2]
    return (f"[{host}]" if ":" in host else host), port
