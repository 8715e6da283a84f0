"""serve's log: one line per event, every field escaped, repeats folded (node/logthrottle.py).

``logging_to(stream, as_json)`` routes every record of the process there for serve's lifetime;
``event(name, **fields)`` writes one of serve's own lines; ``access_log`` is the sync API's
middleware, one line per request, folded per operation and outcome.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import re
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TextIO

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from memmesh.node.logthrottle import REPEAT_INTERVAL_S, RepeatFilter

__all__ = ["ACCESS_BURST", "LogFormatter", "access_key", "access_log", "event", "flush_repeats_every", "log",
           "logging_to"]

log = logging.getLogger("memmesh.serve")


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
        ts = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
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


def event(name: str, level: int = logging.INFO, exc_info: Any = None, **fields: Any) -> None:
    log.log(level, name, extra={"fields": fields}, exc_info=exc_info)


@contextlib.contextmanager
def logging_to(stream: TextIO, as_json: bool) -> Iterator[logging.Handler]:
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
        flush_repeats(handler, everything=True)
        threading.excepthook = saved_hook
        logging.captureWarnings(False)
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        for n, level in saved_levels.items():
            logging.getLogger(n).setLevel(level)


def _thread_died(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    event("thread.error", logging.ERROR, exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
           thread=getattr(args.thread, "name", None))


def flush_repeats(handler: logging.Handler | None, everything: bool = False) -> None:
    """Write the counts owed by the handler's RepeatFilter (the bursts whose interval ended)."""
    if handler is None:
        return
    for f in handler.filters:
        if isinstance(f, RepeatFilter):
            for record in f.flush(everything):
                handler.handle(record)


async def flush_repeats_every(handler: logging.Handler | None) -> None:
    while True:
        await asyncio.sleep(REPEAT_INTERVAL_S)
        flush_repeats(handler)


# ---------------------------------------------------------------------- the sync API's log
@web.middleware
async def access_log(request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
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
