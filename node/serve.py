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
``node.network`` points at both, so a command that needs the network runs its coroutine on
this loop while the database thread keeps serving everyone else.

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
import contextlib
import datetime
import json
import logging
import os
import re
import signal
import socket
import stat
import sys
import threading
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from memmesh.auth.errors import MemmeshError
from memmesh.node.api.address import api_listen as resolve_api_listen
from memmesh.node.api.app import build_app
from memmesh.node.api.live import Live
from memmesh.node.api_token import ensure_token
from memmesh.node.commands import REGISTRY, Result
from memmesh.node.commands.registry import Event, Registry
from memmesh.node.listen import DEFAULT_HOST, DEFAULT_PORT, parse_listen
from memmesh.node.control import SERVE_JSON, SERVE_SOCK, AlreadyServing, ServeError, read_info, refuse_if_serving, \
    remove_files, socket_address
from memmesh.node.config_apply import reload_config
from memmesh.node.events import DatabaseWatch, EventBus
from memmesh.node.home import make_private, private_line
from memmesh.node.library import Node
from memmesh.node.sync.sharing import revoke_old_invite_grants
from memmesh.node.listeners import GuardedSite, Limits, reserve_fds
from memmesh.node.logthrottle import REPEAT_INTERVAL_S, RepeatFilter
from memmesh.node.serve_config import LiveConfig, SyncFlags
from memmesh.node.settings import ApiSpec
from memmesh.node.sync.messages import MAX_BODY_BYTES
from memmesh.node.sync.service import SyncService
from memmesh.node.worker import DbThread, Network

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "DRAIN_S", "ControlChannel", "LogFormatter", "serve", "serve_node"]

DRAIN_S = 10.0  # how long in-flight requests get to finish on shutdown
log = logging.getLogger("memmesh.serve")


# ---------------------------------------------------------------------- logging
class LogFormatter(logging.Formatter):
    """One line per event. ``log.info("listening", extra={"fields": {...}})`` gives
    ``2025-01-02T03:04:05.678Z info listening address=127.0.0.1:7411`` or, as JSON,
    ``{"ts": ..., "level": "info", "event": "listening", "address": "127.0.0.1:7411"}``.
    A plain record (another module's ``log.info("...", args)``) becomes the event ``log`` with
    its logger and message; a traceback stays on the line (escaped). A library's record about a
    peer's fault (a malformed request, a connection gone) keeps one ``error`` field instead of
    its traceback: nothing of ours failed. ``repeated=N``: N records like it were not written
    (node/logthrottle.py). Every field is escaped: text from a request (a path with CR or ESC
    in it) never reaches a terminal or a log parser raw."""

    def __init__(self, as_json: bool = False) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        fields: dict[str, Any] = {"ts": ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z",
                                  "level": record.levelname.lower()}
        structured = getattr(record, "fields", None)
        if structured is not None:
            fields["event"] = record.getMessage()
            fields.update(structured)
        else:
            fields.update({"event": "log", "logger": record.name, "message": _message(record)})
        if record.exc_info and record.exc_info[1] is not None and _peer_fault(record):
            exc = record.exc_info[1]
            fields["error"] = _clip(f"{type(exc).__name__}: {exc}")
        elif record.exc_info:
            fields["traceback"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        repeated = getattr(record, "repeated", None)
        if repeated:
            fields["repeated"] = repeated
        if self.as_json:
            return _escape(json.dumps(fields, default=str, ensure_ascii=False))
        head = f"{fields.pop('ts')} {fields.pop('level')} {_word(fields.pop('event'))}"
        return " ".join([head, *(f"{_word(k)}={_value(v)}" for k, v in fields.items())])


# What a terminal or a log parser could act on: C0 and C1 controls, DEL, line and paragraph
# separators, and the invisible bidi and format marks that reorder what is shown.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
# Records of these loggers describe what a peer did to a connection, not a failure of ours.
_LIBRARY_NET = ("aiohttp", "asyncio")
MAX_ERROR_CHARS = 300  # an exception's text can quote request bytes: keep the line short


def _escape(text: str) -> str:
    """``\\uXXXX`` for every unsafe character (valid inside a JSON string, inert in a terminal)."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _word(text: Any) -> str:
    text = str(text)
    return text if text and not _UNSAFE.search(text) and not any(c in text for c in ' "=\\') else _value(text)


def _value(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, default=str, ensure_ascii=False)
    if text and not _UNSAFE.search(text) and not any(c in text for c in ' "=\\'):
        return text
    return _escape(json.dumps(text, ensure_ascii=False))


def _clip(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "..."


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # a library's bad format string: still one line
        return f"{record.msg!r} {record.args!r}"


def _peer_fault(record: logging.LogRecord) -> bool:
    """A library's record whose exception a peer caused (it sent bad HTTP, or went away). Only
    these lose their traceback: a refused connection, a timeout or an EOF can be a failure of
    our own code that happens to pass through aiohttp or asyncio, and keeps its traceback."""
    if record.name.split(".", 1)[0] not in _LIBRARY_NET:
        return False
    exc = record.exc_info[1] if record.exc_info else None
    return isinstance(exc, (HttpProcessingError, web.RequestPayloadError, ConnectionResetError, BrokenPipeError,
                            ConnectionAbortedError, asyncio.CancelledError))


def _event(name: str, level: int = logging.INFO, exc_info: Any = None, **fields: Any) -> None:
    log.log(level, name, extra={"fields": fields}, exc_info=exc_info)


@contextlib.contextmanager
def _logging_to(stream: TextIO, as_json: bool) -> Iterator[logging.Handler]:
    """Every log record of the process, one line each, to ``stream`` for serve's lifetime:
    memmesh's own at INFO, other libraries' at WARNING, repeats folded (node/logthrottle.py)."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    saved_levels = {n: logging.getLogger(n).level for n in ("memmesh",)}
    handler = logging.StreamHandler(stream)
    handler.setFormatter(LogFormatter(as_json))
    handler.addFilter(RepeatFilter())
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    for n in saved_levels:
        logging.getLogger(n).setLevel(logging.INFO)
    # Python's warnings and a thread's uncaught exception would print plain text to stderr:
    # through the handler they are lines of the log like any other (JSON with --log-json).
    logging.captureWarnings(True)
    saved_hook = threading.excepthook
    threading.excepthook = _thread_died
    try:
        yield handler
    finally:
        _flush_repeats(handler, everything=True)
        threading.excepthook = saved_hook
        logging.captureWarnings(False)
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        for n, level in saved_levels.items():
            logging.getLogger(n).setLevel(level)


def _thread_died(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    _event("thread.error", logging.ERROR, exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
           thread=getattr(args.thread, "name", None))


def _flush_repeats(handler: logging.Handler | None, everything: bool = False) -> None:
    """Write the counts owed by the handler's RepeatFilter (the bursts whose interval ended)."""
    if handler is None:
        return
    for f in handler.filters:
        if isinstance(f, RepeatFilter):
            for record in f.flush(everything):
                handler.handle(record)


async def _flush_repeats_every(handler: logging.Handler | None) -> None:
    while True:
        await asyncio.sleep(REPEAT_INTERVAL_S)
        _flush_repeats(handler)


# ---------------------------------------------------------------------- the home's files
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


def bind_control_socket(path: Path) -> socket.socket:
    """A listening Unix socket at ``path``, mode 0600 from the moment it exists."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o177)
        try:
            with socket_address(path) as address:
                sock.bind(address)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def bind_listen(listen: str) -> socket.socket:
    host, port = parse_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=128)
    except OSError as exc:
        raise ServeError(f"cannot listen on {listen}: {exc.strerror or exc}") from None


def bind_api(spec: ApiSpec, flag: str | None) -> socket.socket | None:
    """The local HTTP API's listening socket (node/api/address.py says where), None when off."""
    listen = resolve_api_listen(flag, spec)
    if listen is None:
        return None
    try:
        return bind_listen(listen)
    except ServeError as exc:
        raise ServeError(f"{exc} (the HTTP API: choose another address with --api-listen HOST:PORT, or off)") from None


async def start_api(home: Path, sock: socket.socket | None, commands: "CommandRunner",
                    runners: list[web.AppRunner], live: Live | None = None, limits: Limits | None = None) -> str | None:
    """Serve the local HTTP API on ``sock`` (its runner joins ``runners``, so it drains on the way
    out like the others); its HOST:PORT, None when it is off. ``live``: the event bus it streams;
    ``limits``: its connection limits (node/listeners.py)."""
    if sock is None:
        return None
    limits = limits or Limits()
    runner = web.AppRunner(build_app(commands.run, ensure_token(home), live=live), access_log=None,
                           shutdown_timeout=DRAIN_S, keepalive_timeout=limits.keepalive_s)
    await runner.setup()
    runners.append(runner)
    host, port = _host_port(sock)
    await GuardedSite(runner, sock, limits, "api").start()
    _event("api.listening", address=f"{host}:{port}", openapi=f"http://{host}:{port}/v1/openapi.json")
    return f"{host}:{port}"


def _host_port(sock: socket.socket) -> tuple[str, int]:
    host, port = sock.getsockname()[:2]
    return (f"[{host}]" if ":" in host else host), port


def write_info(home: Path, info: dict[str, Any]) -> None:
    """serve.json, mode 0600, replaced atomically (a reader sees all of it or nothing)."""
    tmp = home / f".{SERVE_JSON}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f, indent=2, sort_keys=True)
        f.write("\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, home / SERVE_JSON)


# ---------------------------------------------------------------------- running commands
class CommandRunner:
    """How serve runs a command for each of its transports (the control channel, the HTTP
    API): by name, on the database thread, in order with every other call to the node."""

    def __init__(self, node: Node, db: DbThread, info: dict[str, Any], registry: Registry = REGISTRY) -> None:
        self.node = node
        self.db = db
        self.info = info
        self.registry = registry

    async def run(self, name: str, params: Any, events: Callable[[Event], None] | None = None) -> Result:
        return await self.db.run(lambda: self._run(name, params, events))

    def _run(self, name: str, params: Any, events: Callable[[Event], None] | None) -> Result:
        if name == "serve":
            raise AlreadyServing(f"serve is already running for {self.node.home} (pid {self.info.get('pid')}, "
                                 f"listening on {self.info.get('listen')})")
        return self.registry.run(self.node, name, params, events=events)


# ---------------------------------------------------------------------- the control channel
class ControlChannel:
    """The control channel's routes (protocol: node/control.py): each command runs on the
    database thread, its events streamed as NDJSON lines while it runs, then its Result."""

    def __init__(self, node: Node, db: DbThread, info: dict[str, Any], *, registry: Registry = REGISTRY,
                 status: Callable[[], dict[str, Any]] = dict) -> None:
        self.commands = CommandRunner(node, db, info, registry)
        self.info = info
        self.sync_status = status

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/run", self.handle_run)
        app.router.add_get("/status", self.handle_status)
        return app

    async def handle_status(self, request: web.Request) -> web.Response:
        return web.json_response({"serve": self.info, "sync": self.sync_status()})

    async def handle_run(self, request: web.Request) -> web.StreamResponse:
        t0 = time.monotonic()
        try:
            body = await request.json()
            name, params = body["name"], body.get("params", {})
            if not isinstance(name, str):
                raise TypeError("name is not a string")
        except (ValueError, KeyError, TypeError) as exc:
            line = {"ok": False, "error": "ProtocolError", "type": "ProtocolError", "exit": 1,
                    "message": f"a control request is a JSON object {{\"name\", \"params\"}} ({exc})"}
            return web.Response(status=400, text=json.dumps(line) + "\n", content_type="application/x-ndjson")

        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        gone = False

        async def send(line: dict[str, Any]) -> None:
            nonlocal gone
            if gone:
                return
            try:
                await resp.write(json.dumps(line, default=str, ensure_ascii=False).encode() + b"\n")
            except (ConnectionError, RuntimeError):  # the client went away; the command goes on
                gone = True

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue()

        def sink(event: Event) -> None:  # called on the database thread
            with contextlib.suppress(RuntimeError):  # the loop is closing: nobody listens
                loop.call_soon_threadsafe(queue.put_nowait, event)

        job = asyncio.ensure_future(self.commands.run(name, params, sink))
        while True:
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({job, getter}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                await send({"event": getter.result()})
                continue
            getter.cancel()
            break
        while not queue.empty():  # events sent just before the handler returned
            await send({"event": queue.get_nowait()})
        try:
            result: Result = job.result()
            final: dict[str, Any] = {"ok": True, "data": result.data, "text": result.text,
                                     "warnings": list(result.warnings), "exit_code": result.exit_code}
        except BaseException as exc:  # everything goes back to the client as one line
            final = error_line(exc, name)
        # Logged before the answer goes out: whatever a client was told is in the log already.
        # Folded past ACCESS_BURST per command and outcome per 10 s, like the access logs: a
        # local script looping on the socket must not write a line per call either.
        status = "ok" if final["ok"] else final["error"]
        kind = name if name in self.commands.registry.names() else "other"
        log.info("control", extra={"fields": {"op": name, "status": status,
                                              "ms": round((time.monotonic() - t0) * 1000, 1)},
                                   "throttle": f"control {kind} {status}", "throttle_burst": ACCESS_BURST})
        await send(final)
        if not gone:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await resp.write_eof()
        if gone:
            log.warning("control.gone", extra={"fields": {"op": name, "note": "the client left before the answer"},
                                               "throttle": f"control.gone {kind}", "throttle_burst": ACCESS_BURST})
        return resp


def error_line(exc: BaseException, name: str) -> dict[str, Any]:
    """The final line for a command that raised: the CLI's own mapping (node.cli.failure) of
    exceptions to a message and an exit code; anything else is a bug, logged in full."""
    from memmesh.node.refusal import failure

    cls = type(exc)
    line: dict[str, Any] = {"ok": False, "error": cls.__name__, "type": f"{cls.__module__}.{cls.__qualname__}"}
    mapped = failure(exc)
    if mapped is None:
        _event("control.error", logging.ERROR, exc_info=(cls, exc, exc.__traceback__), op=name)
        line.update(message=f"serve failed running {name}: {cls.__name__}: {exc} (serve's log has the details)",
                    exit=1)
        return line
    line["message"], line["exit"] = mapped
    if isinstance(exc, OSError) and not isinstance(exc, MemmeshError):
        line.update(errno=exc.errno, strerror=exc.strerror, filename=exc.filename)
    return line


# ---------------------------------------------------------------------- the sync API's log
@web.middleware
async def _access_log(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
    t0 = time.monotonic()
    status: int | str = 500
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except web.HTTPException as exc:
        status = exc.status
        raise
    except (ConnectionError, HttpProcessingError, web.RequestPayloadError) as exc:
        # The peer went away mid-request, or sent a body HTTP cannot frame: its fault, not a 500,
        # and one line here rather than aiohttp's traceback. Nobody may be left to answer.
        # (node/sync/http.py answers a cut-off body itself; this catches whatever else escapes.)
        gone = request.transport is None or request.transport.is_closing()
        status = "aborted" if gone else 400
        code = "sync.aborted" if gone else "sync.bad_message"
        return web.Response(status=400, body=_sync_error(code, f"the request was cut off or could not be framed "
                                                               f"({type(exc).__name__})"),
                            content_type="application/msgpack")
    finally:
        fields = {"op": request.match_info.get("op") or request.path, "peer": request.remote, "status": status,
                  "ms": round((time.monotonic() - t0) * 1000, 1)}
        key = request.headers.get("memmesh-key")
        if key:
            fields["key"] = key  # as claimed: the protocol checks the signature
        # Anyone can send requests by the thousand (2,000 pipelined in one write): lines of one
        # operation and outcome are folded per interval (node/logthrottle.py), keyed by nothing
        # the sender chooses freely, so neither the count of lines nor of keys grows with them.
        log.info("request", extra={"fields": fields, "throttle": access_key("request", fields["op"], status),
                                   "throttle_burst": ACCESS_BURST})


# Access-log lines of one kind (operation, status) written per 10 s before the rest are folded
# into a count: honest peers send a few of each per interval; a flood writes at most this many
# per kind (a few dozen kinds), not one per request.
ACCESS_BURST = 10


def access_key(event: str, op: Any, status: Any) -> str:
    """The fold key of an access-log line: its operation (a known sync operation, else "other")
    and its status."""
    from memmesh.node.sync import messages as m

    return f"{event} {op if op in m.REQUESTS else 'other'} {status}"


def _sync_error(code: str, message: str) -> bytes:
    from memmesh.node.sync import messages as m

    return m.pack(m.ErrorReply(code, message).encode())


# ---------------------------------------------------------------------- running
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
    with _logging_to(log_stream or sys.stderr, log_json) as handler:
        if made_private:
            _event("home.private", logging.WARNING, note=private_line(node.home, made_private))
        # Invite keys hold nothing in the settings; older versions granted them Read, which
        # other replicas would honour until this revocation reaches them.
        revoked = revoke_old_invite_grants(node)
        if revoked:
            _event("invites.old_grants_revoked", keys=revoked)
        return asyncio.run(_serve(node, listen=listen, discovery=discovery, interval_s=interval_s,
                                  fanout=fanout, registry=registry, advertise=advertise, api_listen=api_listen,
                                  log_handler=handler, limits=limits))


async def _serve(node: Node, *, listen: str | None, discovery: bool | None, interval_s: float | None,
                 fanout: int | None, registry: Registry, advertise: str | None = None,
                 api_listen: str | None = None, log_handler: logging.Handler | None = None,
                 limits: Limits | None = None) -> Result:
    loop = asyncio.get_running_loop()
    home = node.home
    stop = asyncio.Event()
    stopped_by: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        if stopped_by:
            _event("signal", signal=sig.name, note="already stopping")
            return
        stopped_by.append(sig.name)
        stop.set()

    db_ready: list[DbThread] = []

    def on_hangup() -> None:  # SIGHUP: what `memmesh reload` does, on the database thread
        if stopped_by or not db_ready:
            _event("signal", signal="SIGHUP", note="not reloading config.yaml: serve is " +
                   ("stopping" if stopped_by else "starting (and reads it as it starts)"))
            return
        _event("signal", signal="SIGHUP", note="reloading config.yaml")
        asyncio.ensure_future(db_ready[0].run(_reload_quietly))

    def _reload_quietly() -> None:
        with contextlib.suppress(MemmeshError):  # reload_config logged the outcome either way
            reload_config(node)

    signals = []
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
            signals.append(sig)
        loop.add_signal_handler(signal.SIGHUP, on_hangup)
        signals.append(signal.SIGHUP)

    _event("start", home=str(home), pid=os.getpid(), node_key=str(node.peer_key.public))
    # Connection limits (node/listeners.py): the network listeners' caps stay within what the
    # descriptor limit leaves after a reserve, so the control socket always has some.
    fds_each = reserve_fds(3)  # sync, API, control
    net_limits = (limits or Limits()).within(fds_each)
    # The control socket: only the owner connects, so no per-source cap; its clients send each
    # request at once, so the same request timers hold, and a full listener closes its oldest
    # stalled connection rather than refuse the CLI (a stalled local script cannot lock it out).
    ctl_limits = replace(net_limits, per_source=None, per_listener=fds_each, evict_stalled=True)
    _event("limits", head_timeout_s=net_limits.head_timeout_s, body_timeout_s=net_limits.body_timeout_s,
           keepalive_s=net_limits.keepalive_s,
           per_listener=net_limits.per_listener, per_source=net_limits.per_source, control=fds_each)
    flusher = asyncio.ensure_future(_flush_repeats_every(log_handler))
    stale = read_info(home)
    if stale is not None or (home / SERVE_SOCK).exists():
        # We hold the home's lock, so no other serve runs: these are a dead serve's files.
        _event("stale", logging.WARNING, pid=(stale or {}).get("pid", "?"), note="removed a dead serve's files")
        remove_files(home)

    db = DbThread()
    node.network.loop, node.network.db = loop, db
    # The live event stream (node/events.py): the databases, the daemon and the sharing
    # commands publish onto it from here on; GET /v1/events follows it.
    bus = EventBus()
    bus.attach(loop)
    node.network.publish = bus.publish
    watch = DatabaseWatch(node, bus.publish)
    tcp_sock = ctl_sock = api_sock = None
    sync: SyncService | None = None
    sync_started = False
    runners: list[web.AppRunner] = []
    info: dict[str, Any] = {}
    try:
        # config.yaml before anything listens: it may say where (serve's flags win over it)
        flags = SyncFlags(listen, advertise, discovery, interval_s, fanout)
        await db.run(watch.start)
        live = await db.run(lambda: LiveConfig.start(node, flags))
        db_ready.append(db)
        # Recall indexes are built on the search threads, so the first turns do not wait for them
        # on the database thread (auto-recall names a store whose index is still building).
        await db.run(lambda: node.memory.warm(node.database_ids()))
        listen, advertise, discovery = live.running.listen, live.running.advertise, live.running.discovery
        interval_s, fanout = live.running.interval_s, live.running.fanout
        tcp_sock = bind_listen(listen)
        host, port = _host_port(tcp_sock)
        sock_path = (home / SERVE_SOCK).absolute()
        ctl_sock = bind_control_socket(sock_path)
        api_sock = bind_api(live.api, api_listen)  # the api section as serve started with it

        if advertise is None and host in ("0.0.0.0", "::", "[::]"):
            raise ServeError(f"serve: listening on {host} needs --advertise http:HOST:PORT (the address peers "
                             "and tickets should use)")
        address = advertise or f"http:{host}:{port}"
        sync = SyncService(node, address=address, discovery=discovery, interval_s=interval_s,
                           fanout=fanout, peers=live.running.peers)
        live.attach(node, sync)  # from here on a reload reaches the daemon
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_access_log])
        sync.add_routes(app)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=DRAIN_S, keepalive_timeout=net_limits.keepalive_s)
        await runner.setup()
        runners.append(runner)
        await GuardedSite(runner, tcp_sock, net_limits, "sync").start()
        tcp_sock = None  # the site owns it now
        _event("listening", address=f"{host}:{port}", sync=f"http://{host}:{port}/sync/v1/")

        info.update(pid=os.getpid(), home=str(home.absolute()), listen=f"{host}:{port}", address=address,
                    control=str(sock_path), node_key=str(node.peer_key.public),
                    started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
        channel = ControlChannel(node, db, info, registry=registry, status=sync.status)
        ctl_runner = web.AppRunner(channel.app(), access_log=None, shutdown_timeout=DRAIN_S,
                                   keepalive_timeout=ctl_limits.keepalive_s)
        await ctl_runner.setup()
        runners.append(ctl_runner)
        await GuardedSite(ctl_runner, ctl_sock, ctl_limits, "control").start()
        ctl_sock = None
        _event("control.listening", socket=str(sock_path), mode="0600")
        info["api"] = await start_api(home, api_sock, channel.commands, runners,
                                      Live(bus, str(node.peer_key.public)), net_limits)
        api_sock = None  # the API's site owns it now (or it was off)

        sync_started = True  # from here on stop() is owed, even if start() fails half-way
        await sync.start()
        # What `memmesh status` reports about this serve (read on the database thread).
        node.serve_info = {"sync": info["listen"], "api": info["api"], "address": address,
                           "discovery": sync.status()["discovery"], "started_mono": time.monotonic()}
        write_info(home, info)
        _event("ready", pid=os.getpid(), listen=info["listen"], discovery=discovery, interval_s=interval_s,
               fanout=fanout)
        await stop.wait()
        _event("stopping", signal=stopped_by[0] if stopped_by else None, drain_s=DRAIN_S)
    finally:
        with contextlib.suppress(FileNotFoundError):
            (home / SERVE_JSON).unlink()  # first: new commands stop coming here
        if sync is not None and sync_started:
            try:
                await sync.stop()
            except Exception:
                _event("sync.stop", logging.ERROR, exc_info=True)
        bus.close()  # event streams end now rather than hold the drain below for DRAIN_S
        # Stop listening; in-flight requests and control commands get DRAIN_S to finish.
        for r in reversed(runners):
            await r.cleanup()
        for s in (tcp_sock, ctl_sock, api_sock):
            if s is not None:
                s.close()
        await db.run(watch.stop)
        await loop.run_in_executor(None, db.stop)  # after the queue drains
        node.network = Network()  # back to one-shot: nothing points at this loop any more
        node.serve_info = None
        with contextlib.suppress(FileNotFoundError):
            (home / SERVE_SOCK).unlink()
        for sig in signals:
            loop.remove_signal_handler(sig)
        flusher.cancel()
        _event("stop", pid=os.getpid(), signal=stopped_by[0] if stopped_by else None)
    return Result({"pid": os.getpid(), "listen": info.get("listen"), "signal": stopped_by[0] if stopped_by else None},
                  "")
