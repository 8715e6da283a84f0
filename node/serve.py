"""`memmesh serve`: one long-running process per home (docs/operations.md, "Running serve").

It holds the home (its lock, for its whole life), serves the sync API to peers and runs the
sync daemon (node/sync/service.py), and answers every other `memmesh` command for the home
over a control channel, so those never wait on the home's lock:

    HOME/serve.sock   the control channel: HTTP over a Unix socket of mode 0600 (node/control.py
                      has the protocol and the client)
    HOME/serve.json   pid, listen address, control socket, node key, start time, the local
                      HTTP API's address (``api``, null when off; node/api/) (mode 0600);
                      written once everything answers, removed first on the way out

Every listener is a node/listeners.py GuardedSite: a timeout for each request's head and one for
its body, an idle keep-alive timeout, caps per listener and per source address within the
file-descriptor limit (raised at start), and no accept spin when descriptors run out, so nobody
who can open a socket can stall the node or starve the control channel. The log folds repeats
(node/logthrottle.py) and escapes every field (LogFormatter).

Threads: the asyncio loop moves bytes (sync API, control channel, HTTP API); one database thread
(node.worker.DbThread) runs every call that touches the node, commands included, in order.
For the run the node gets a network built from serve's parts (node/worker.py: the loop and
database thread, the event bus, the sync daemon, the live config), so a command that needs
the network runs its coroutine on this loop while the database thread keeps serving everyone
else.

The parts have a module each: node/server.py (the run: what starts and stops, in which order),
node/control_server.py (the control channel's serve side), node/binding.py (listening sockets),
node/serve_log.py (the log lines). This module is the entry: checks before anything starts.

Who may use the control channel: whoever can connect to the socket, i.e. its owner. The
socket is created with mode 0600 (bound under umask 0177, then chmod), in a home that serve
refuses unless the current user owns it and neither group nor others may write it, so nobody
else can connect to it, or replace it with a socket of their own. Peer credentials
(SO_PEERCRED) would check the same thing again, and are not portable; they are not read.

config.yaml is read before anything listens and again on SIGHUP, which does what `memmesh
reload` does (node/config_apply.py); the sync flags resolve against it (node/serve_config.py).

SIGINT and SIGTERM stop it gracefully: serve.json goes (new commands then wait for the home
and open it directly), the sync daemon stops, the listeners close, in-flight control commands
and sync requests get up to DRAIN_S seconds to finish, the database thread drains its queue,
then the socket goes and the node closes (which releases the lock). A command that was
answered ok had committed before its answer (handlers commit before they return), so nothing
acknowledged is lost; one still running at the deadline finishes on the database thread, its
client is told the connection was lost.
"""
from __future__ import annotations

import asyncio
import logging
import os
import stat
import sys
from pathlib import Path
from typing import TextIO

from memmesh.node.commands import REGISTRY, Result
from memmesh.node.commands.registry import Registry
from memmesh.node.conn_limits import Limits
from memmesh.node.control import ServeError, refuse_if_serving
from memmesh.node.home import make_private, private_line
from memmesh.node.library import Node
from memmesh.node.listen import DEFAULT_HOST, DEFAULT_PORT, parse_listen
from memmesh.node.serve_config import SyncFlags
from memmesh.node.serve_log import event, logging_to
from memmesh.node.server import DRAIN_S, ServeOptions, Server
from memmesh.node.sync.sharing import revoke_old_invite_grants

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "DRAIN_S", "check_home_private", "serve", "serve_node"]


def serve(home: Path | str, listen: str | None = None, discovery: bool | None = None,
          log_json: bool = False, interval_s: float | None = None, fanout: int | None = None,
          advertise: str | None = None, api_listen: str | None = None) -> Result:
    """Open the node in ``home`` and serve it until SIGINT or SIGTERM (the library's entry).
    A sync setting left None comes from config.yaml, else its default (node/serve_config.py)."""
    home = Path(home)
    refuse_if_serving(home, log_json=log_json)
    node = Node.open(home, create=False)
    try:
        return serve_node(node, listen=listen, discovery=discovery, log_json=log_json,
                          interval_s=interval_s, fanout=fanout, advertise=advertise, api_listen=api_listen)
    finally:
        node.close()


def serve_node(node: Node, *, listen: str | None = None, discovery: bool | None = None,
               log_json: bool = False, interval_s: float | None = None, fanout: int | None = None,
               advertise: str | None = None, registry: Registry = REGISTRY, log_stream: TextIO | None = None,
               api_listen: str | None = None) -> Result:
    """Serve an open node (its caller holds the home and closes the node afterwards) until
    SIGINT or SIGTERM; the `serve` command's handler."""
    try:
        if listen is not None:
            parse_listen(listen)
    except ValueError as exc:
        raise ServeError(f"serve: listen {exc} (got {listen!r})") from None
    limits = Limits.from_env()  # a bad MEMMESH_* limit stops serve before anything starts
    check_home_private(node.home)
    made_private = make_private(node.home)  # nothing of the home readable by others (node/home.py)
    node.verify()  # a damaged home is refused before anything listens or syncs (node/home.py)
    with logging_to(log_stream or sys.stderr, log_json) as handler:
        if made_private:
            event("home.private", logging.WARNING, note=private_line(node.home, made_private))
        # Invite keys hold nothing in the settings; older versions granted them Read, which
        # other replicas would honour until this revocation reaches them.
        revoked = revoke_old_invite_grants(node)
        if revoked:
            event("invites.old_grants_revoked", keys=revoked)
        options = ServeOptions(SyncFlags(listen, advertise, discovery, interval_s, fanout), api_listen=api_listen,
                               registry=registry, limits=limits, log_handler=handler)
        return asyncio.run(Server(node, options).run())


def check_home_private(home: Path) -> None:
    """Refuse a home that another user could write (and so replace the control socket in)."""
    st = os.stat(home)
    if st.st_uid != os.getuid():
        raise ServeError(f"{home} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}); "
                         "serve runs only in a home its user owns")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "group and others" if st.st_mode & stat.S_IWGRP and st.st_mode & stat.S_IWOTH \
            else "its group" if st.st_mode & stat.S_IWGRP else "others"
        raise ServeError(f"{home} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}), so another user "
                         f"could replace the control socket; run: chmod go-w {home}")
