"""The control channel's client: how a `memmesh` command reaches a running `memmesh serve`.

While serve runs for a home it holds the home's lock, so every other command for that home
goes through serve instead of opening the home (docs/operations.md, "Running serve"):

    client = remote(home)            # a ControlClient, or None: open the home directly
    result = client.run("status", {}, events=sink)

Serve leaves two files in the home while it runs: ``serve.json`` (pid, listen address, control
socket, node key, start time; written last, removed first) and ``serve.sock``, a Unix socket of
mode 0600 in a home directory only its owner may write, so only the home's owner can connect
(no credentials beyond the file mode are checked; see node/serve.py).

The protocol (one HTTP/1.1 request per command over the socket):

    POST /run  {"name": "memory.reindex", "params": {"bank": "notes"}}
    -> 200, application/x-ndjson, one JSON object per line:
       {"event": {"event": "progress", "bank": "notes", "done": 32, "total": 100}}   (0..n)
       {"ok": true, "data": ..., "text": "...", "warnings": [...], "exit_code": 0} (last)
       {"ok": false, "error": "ParamsError", "type": "memmesh.node.refusal.ParamsError",
        "message": "...", "exit": 1}                                               (or this)
    GET /status -> {"serve": <serve.json>, "sync": <SyncService.status()>}

A refused command raises here the exception type it raises in-process (rebuilt from its class
name, or an OSError from errno/strerror/filename), so the CLI renders both identically.

Only the standard library is used (HTTP/1.1 over the AF_UNIX socket: node/unix_http.py), with the error types
and Result (node/command_result.py): the client imports no aiohttp, pydantic or node, so the
CLI sends a command to serve without loading the commands (tests/test_cli_table.py checks it).
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from memmesh.auth.errors import MemmeshError
from memmesh.node import unix_http
from memmesh.node.command_result import Result
from memmesh.node.unix_http import CONNECT_TIMEOUT_S, MAX_SOCKET_PATH  # noqa: F401  (imported from here)

SERVE_JSON = "serve.json"
SERVE_SOCK = "serve.sock"
LOCK_FILE = "node.lock"  # node.home.LOCK_FILE (not imported: this module stays light)
POLL_S = 0.05

EventSink = Callable[[dict[str, Any]], None]


class AlreadyServing(MemmeshError):
    """``memmesh serve`` already runs for this home."""


class ServeError(MemmeshError):
    """The control channel failed: serve went away mid-command, or answered what we cannot read."""


class RemoteError(MemmeshError):
    """A refusal from serve whose exception type cannot be rebuilt here; ``name`` is its type."""

    def __init__(self, message: str, name: str = "MemmeshError", exit_code: int = 1) -> None:
        super().__init__(message)
        self.name = name
        self.exit_code = exit_code


# ---------------------------------------------------------------------- the socket
@contextlib.contextmanager
def socket_address(path: Path) -> Iterator[str]:
    """An address for ``path`` that fits in sun_path (node/unix_http.py), or ServeError."""
    try:
        with unix_http.socket_address(path) as address:
            yield address
    except unix_http.SocketPathTooLong:
        raise ServeError(f"the control socket path {path} is longer than a Unix socket allows "
                         f"({MAX_SOCKET_PATH} bytes); use a shorter --home") from None


class _UnixConnection(unix_http.UnixConnection):
    def connect(self) -> None:
        try:
            super().connect()
        except unix_http.SocketPathTooLong:
            raise ServeError(f"the control socket path {self.path} is longer than a Unix socket allows "
                             f"({MAX_SOCKET_PATH} bytes); use a shorter --home") from None


# ---------------------------------------------------------------------- the client
class ControlClient:
    """A connection to the serve of one home. ``run`` is ``REGISTRY.run`` done by serve."""

    def __init__(self, home: Path, info: dict[str, Any], conn: _UnixConnection) -> None:
        self.home = home
        self.info = info
        self._conn = conn

    @property
    def pid(self) -> int | None:
        return self.info.get("pid")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _lost(self, what: str, exc: BaseException | None = None) -> ServeError:
        why = f" ({exc.__class__.__name__}: {exc})" if exc is not None else ""
        return ServeError(f"lost the connection to serve (pid {self.pid}) while running {what}{why}; "
                          f"it may or may not have been done: check, then try again")

    def run(self, name: str, params: dict[str, Any], events: EventSink | None = None) -> Result:
        """Run command ``name`` in serve; events reach ``events`` while it runs."""
        body = json.dumps({"name": name, "params": params}).encode()
        try:
            self._conn.request("POST", "/run", body, {"Content-Type": "application/json"})
            resp = self._conn.getresponse()
            final = None
            while final is None:
                raw = resp.readline()
                if not raw:
                    break
                msg = json.loads(raw)
                if "ok" in msg:
                    final = msg
                elif events is not None:
                    events(msg["event"])
            resp.read()  # the end of the chunked body: the connection can carry the next request
        except (OSError, ValueError, KeyError) as exc:
            raise self._lost(name, exc) from None
        if final is None:
            raise self._lost(name)
        if final["ok"]:
            return Result(final.get("data"), final.get("text", ""), list(final.get("warnings", [])),
                          int(final.get("exit_code", 0)))
        raise rebuild_error(final)

    def status(self) -> dict[str, Any]:
        """serve.json's content and the sync service's status, as serve sees them now."""
        try:
            self._conn.request("GET", "/status")
            resp = self._conn.getresponse()
            data = json.loads(resp.read())
        except (OSError, ValueError) as exc:
            raise self._lost("status", exc) from None
        return data


def rebuild_error(final: dict[str, Any]) -> BaseException:
    """The exception a final ``{"ok": false, ...}`` line stands for, of the type raised in serve
    when this process knows it (its str() is the message serve rendered), else a RemoteError."""
    message = str(final.get("message", ""))
    name = str(final.get("error", "MemmeshError"))
    if "errno" in final:  # OSError(errno, strerror, filename) gives back the same subclass
        args = [final["errno"], final.get("strerror") or message]
        if final.get("filename") is not None:
            args.append(final["filename"])
        return OSError(*args)
    module, _, qualname = str(final.get("type", "")).rpartition(".")
    if module.split(".")[0] == "memmesh" and qualname == name:  # only our own types are imported
        try:
            cls = getattr(importlib.import_module(module), qualname)
            if isinstance(cls, type) and issubclass(cls, MemmeshError):
                exc = cls(message)
                if str(exc) == message:
                    return exc
        except Exception:  # a type this side cannot rebuild: the message is what matters
            pass
    return RemoteError(message, name, int(final.get("exit", 1)))


# ---------------------------------------------------------------------- finding serve
def read_info(home: Path) -> dict[str, Any] | None:
    """serve.json's content, None when it cannot be read (absent; or the home is not a
    directory we may read, which opening the home directly then reports), {} when garbled."""
    try:
        return json.loads((home / SERVE_JSON).read_text())
    except OSError:
        return None
    except ValueError:
        return {}


def lock_holder(home: Path) -> str | None:
    """None when nobody holds the home's lock (or it has none yet), else the holder's pid (as
    the lock file says). Probes with a non-blocking flock that it lets go at once."""
    try:
        fd = os.open(home / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
        return None
    finally:
        os.close(fd)  # releases the probe's lock


@contextlib.contextmanager
def _holding_lock(home: Path) -> Iterator[bool]:
    """Hold the home's lock, without waiting, for the body; yields False if someone has it."""
    try:
        fd = os.open(home / LOCK_FILE, os.O_RDONLY)
    except OSError:
        yield True  # no lock file: no node has ever been opened here, so no serve runs
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def remote(home: Path | str, *, clean_stale: bool = True) -> ControlClient | None:
    """A client of the serve running for ``home``, or None to open the home directly.

    When serve's files are there but nothing answers (serve was killed) and nobody holds the
    home's lock, the files are stale: say so in one line on stderr, remove them, and return None.
    With ``clean_stale`` False (for `serve`) they are left alone: serve removes them itself once it
    holds the lock, and says so in its own log (one JSON object with --log-json, like every line).
    """
    home = Path(home)
    sock_path = home / SERVE_SOCK
    info = read_info(home)
    if info is None and not sock_path.exists():
        return None
    if info is not None:
        conn = _UnixConnection(sock_path)
        try:
            conn.connect()
            return ControlClient(home, info, conn)
        except OSError:
            conn.close()
    # Nothing answers. Stale only if no process holds the lock (serve holds it for its whole
    # life); the files are removed while holding it, so a serve starting now cannot lose its own.
    with _holding_lock(home) as free:
        if not free or not clean_stale:
            return None  # serve is starting or stopping, or a command runs: the caller waits
        pid = (info or {}).get("pid", "?")
        what = sock_path if sock_path.exists() or info is None else home / SERVE_JSON
        print(f"memmesh: serve is not running (stale {what} from pid {pid}); running here", file=sys.stderr)
        remove_files(home)
    return None


def json_log_line(event: str, level: str = "info", **fields: Any) -> str:
    """A line of serve's --log-json log (node/serve.py's LogFormatter; this module stays light)."""
    now = time.time()
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
    return json.dumps({"ts": ts, "level": level, "event": event, **fields}, ensure_ascii=True)


def remove_files(home: Path) -> None:
    for name in (SERVE_JSON, SERVE_SOCK):
        with contextlib.suppress(FileNotFoundError):
            (home / name).unlink()


def route(home: Path | str, *, timeout: float = 30.0, say_waiting: bool = False, clean_stale: bool = True,
          log_json: bool = False) -> ControlClient | None:
    """Where a command for ``home`` runs: a ControlClient when serve runs, None when the home is
    free to open here. While another process holds the home (a one-shot command, or a serve
    starting or stopping) poll both, up to ``timeout`` seconds, so a command never waits on
    the lock of a serve it could have gone through. ``clean_stale``: see ``remote``;
    ``log_json``: the waiting notice as a JSON log line (serve's --log-json)."""
    home = Path(home)
    deadline = time.monotonic() + timeout
    said = False
    while True:
        client = remote(home, clean_stale=clean_stale)
        if client is not None:
            return client
        holder = lock_holder(home)
        if holder is None:
            return None
        if say_waiting and not said:
            text = f"{home} is in use by process {holder}; waiting up to {timeout:g} s"
            print(json_log_line("waiting", message=text) if log_json else f"memmesh: {text}", file=sys.stderr)
            said = True
        if time.monotonic() >= deadline:
            from memmesh.node.home import HomeBusy

            # The wording of node.home's own wait (the same situation, the same advice).
            raise HomeBusy(f"{home} is in use by process {holder} (waited {timeout:g} s); "
                           "let it finish, or stop it, and try again")
        time.sleep(POLL_S)


def refuse_if_serving(home: Path | str, *, timeout: float = 30.0, log_json: bool = False) -> None:
    """For `memmesh serve`: refuse when a serve already runs for ``home`` (naming its pid and
    address); when another process holds the home, say so and wait like other commands. A dead
    serve's files are left for serve to remove and log (its `stale` event)."""
    client = route(home, timeout=timeout, say_waiting=True, clean_stale=False, log_json=log_json)
    if client is not None:
        with client:
            info = client.info
        raise AlreadyServing(f"serve is already running for {home} (pid {info.get('pid', '?')}, "
                             f"listening on {info.get('listen', '?')}); stop it first (kill -TERM {info.get('pid', '?')})")
