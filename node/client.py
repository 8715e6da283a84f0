"""``connect(home)``: the library's way into a home, through its serve when one runs.

    from memmesh.node import connect
    with connect("/path/to/home") as node:
        node.call_tool("alpha", "remember", {"key": "k", "value": "v"})
        print(node.call_tool("alpha", "recall", {"query": "k"}))
        print(node.run("memory.list", {}).text)

While ``memmesh serve`` runs for a home it holds the home's lock, so ``Node.open(home)`` would
wait for it and give up (HomeBusy). ``connect`` does what the CLI does (node/control.py): each
call goes through serve's control channel while serve runs, and when no serve runs the home is
opened in this process and held until ``close()``. The calls are ``Node``'s (node/library.py):
``run``, ``call_tool``, ``history_add``, ``history_window``, ``auto_recall``, with the same
signatures and results, so code written for one works with the other.

Each call through serve opens its own connection to the control socket: serve closes an idle
connection after its keep-alive time, and a request sent on a connection the other end has just
closed could not say whether it was done. A serve that stopped since the last call is noticed
on the next one, which then opens the home here (a serve started while the home is held here
waits for ``close()``, as it waits for any process holding the home).

Calls are serialised (one lock per client), so one client may be shared by threads.
"""
from __future__ import annotations

import threading
import time
from os import PathLike
from pathlib import Path
from typing import Any

from memmesh.node.command_result import Result
from memmesh.node.commands import EventSink
from memmesh.node.control import ControlClient, remote, route
from memmesh.node.home import DEFAULT_LOCK_TIMEOUT, HomeBusy
from memmesh.node.library import Calls, Node

# How long one attempt to take the home's lock waits before looking for a serve again: a serve
# that starts between the look and the lock would otherwise make the open wait out its timeout.
_LOCK_SLICE_S = 0.5


class Client(Calls):
    """A home reached through its serve, or opened here when none runs (see the module doc)."""

    def __init__(self, home: Path, timeout: float) -> None:
        self.home = home
        self.timeout = timeout
        self._node: Node | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def through_serve(self) -> bool:
        """Whether the calls go through serve (False: the home is open in this process)."""
        return self._node is None

    def _attach(self) -> ControlClient | None:
        """A control client of the running serve, or None once the home is open here; waits
        (up to ``timeout``) while another process holds the home without serving it."""
        deadline = time.monotonic() + self.timeout
        while True:
            client = route(self.home, timeout=max(0.0, deadline - time.monotonic()))
            if client is not None:
                return client
            try:
                self._node = Node.open(self.home, create=False,
                                       lock_timeout=min(_LOCK_SLICE_S, max(0.0, deadline - time.monotonic())))
                return None
            except HomeBusy:
                if time.monotonic() >= deadline:
                    raise

    def run(self, name: str, params: dict[str, Any], events: EventSink | None = None) -> Result:
        """Run any command by name with JSON-compatible parameters (see node.commands)."""
        with self._lock:
            if self._closed:
                raise ValueError(f"this connection to {self.home} is closed")
            if self._node is None:
                client = remote(self.home)
                if client is None:
                    client = self._attach()
                if client is not None:
                    with client:
                        return client.run(name, params, events=events)
            assert self._node is not None
            return self._node.run(name, params, events=events)

    def close(self) -> None:
        """Let the home go (when it was opened here); further calls are refused."""
        with self._lock:
            self._closed = True
            node, self._node = self._node, None
        if node is not None:
            node.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        how = "closed" if self._closed else "through serve" if self._node is None else "open here"
        return f"<memmesh Client {self.home} ({how})>"


def connect(home: str | PathLike[str], *, timeout: float = DEFAULT_LOCK_TIMEOUT) -> Client:
    """A client of the node in ``home``: through its serve while one runs, else the home opened
    here (NotInitialised if it holds no node). ``timeout``: how long to wait, in seconds, while
    another process holds the home without serving it (a one-shot command), before HomeBusy."""
    client = Client(Path(home), timeout)
    with client._lock:
        control = client._attach()
    if control is not None:
        control.close()  # each call connects anew (see the module doc)
    return client
