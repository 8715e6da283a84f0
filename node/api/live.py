"""The routes that are not commands: ``GET /v1/events`` (server-sent events from serve's event
bus, node/events.py), ``GET /metrics`` (node/api/metrics.py) and ``GET /v1/health``.

The stream, per connection: a ``hello`` event ``{"run", "last_id"}``; when ``since`` is older
than the ring holds, a ``missed`` event ``{"from", "to"}``; then every event after ``since``
(all of them, or those of ``types``) as ``id: N / event: TYPE / data: JSON``, live; a
``: keepalive`` comment when nothing happened for ``keepalive_s``. ``hello`` and ``missed``
carry no id, so a client's last id is always a real event's. Without ``since`` (or the
``Last-Event-ID`` header) the stream starts at the newest event. Ids restart with each serve
run, which the hello's ``run`` tells; a ``since`` above the run's last id is refused (400).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from memmesh.node.api import errors
from memmesh.node.api.errors import HttpError
from memmesh.node.api.metrics import CONTENT_TYPE, render
from memmesh.node.commands.result import Result
from memmesh.node.events import EVENT_TYPES, Event, EventBus

EVENTS_PATH = "/v1/events"
METRICS_PATH = "/metrics"
HEALTH_PATH = "/v1/health"
LIVE_ROUTES = frozenset({("GET", EVENTS_PATH), ("GET", METRICS_PATH), ("GET", HEALTH_PATH)})
KEEPALIVE_S = 15.0
EVENTS_PER_WRITE = 256
_ID = re.compile(r"^[0-9]{1,18}$")


@dataclass
class Live:
    """What these routes read: serve's event bus, the node's key, when serve started."""

    bus: EventBus = field(default_factory=EventBus)
    node_key: str = ""
    started: float = field(default_factory=time.monotonic)
    keepalive_s: float = KEEPALIVE_S


LIVE = web.AppKey("live", Live)


def is_public(method: str, path: str) -> bool:
    """Whether the token middleware lets this request through: liveness only."""
    return method == "GET" and path == HEALTH_PATH


def add_live(app: web.Application, live: Live, run: Callable[[str, dict[str, Any]], Awaitable[Result]]) -> None:
    app[LIVE] = live

    async def metrics(request: web.Request) -> web.Response:
        _no_query(request, METRICS_PATH)
        status = await run("status", {})  # the same numbers as `memmesh status`, one way of counting
        return web.Response(body=render(status.data).encode(), headers={"Content-Type": CONTENT_TYPE})

    app.router.add_route("GET", EVENTS_PATH, _events)
    app.router.add_route("GET", METRICS_PATH, metrics)
    app.router.add_route("GET", HEALTH_PATH, _health)


async def _health(request: web.Request) -> web.Response:
    _no_query(request, HEALTH_PATH)
    live: Live = request.app[LIVE]
    body = {"ok": True, "uptime_s": round(time.monotonic() - live.started, 3), "node_key": live.node_key}
    return web.json_response(body)


def _no_query(request: web.Request, path: str) -> None:
    if request.query_string:
        raise HttpError(errors.INVALID_PARAMS, f"GET {path} takes no query parameters")


def parse_query(query: Any, last_event_id: str | None, bus: EventBus) -> tuple[int, frozenset[str] | None]:
    """(the cursor to start after, the types wanted or None for all); HttpError 400 otherwise."""
    unknown = sorted(set(query) - {"since", "types"})
    if unknown:
        raise HttpError(errors.INVALID_PARAMS, f"GET {EVENTS_PATH} takes since and types, not {', '.join(unknown)}")
    for name in ("since", "types"):
        if len(query.getall(name, [])) > 1:
            raise HttpError(errors.INVALID_PARAMS, f"give {name} once")
    since_text = query.get("since", last_event_id)
    if since_text is None or since_text == "":
        since = bus.last_id  # from now on
    elif not _ID.match(since_text):
        raise HttpError(errors.INVALID_PARAMS, f"since is the id of the last event seen, a whole number >= 0 "
                                               f"(got {since_text!r})")
    else:
        since = int(since_text)
        if since > bus.last_id:
            raise HttpError(errors.INVALID_PARAMS, f"since {since} is after this serve run's last event "
                                                   f"({bus.last_id}, run {bus.run}): ids restart with each run; "
                                                   "connect without since to follow this one")
    types: frozenset[str] | None = None
    if "types" in query:
        names = [t.strip() for t in query["types"].split(",")]
        bad = [t for t in names if t not in EVENT_TYPES]
        if not names or bad:
            raise HttpError(errors.INVALID_PARAMS, f"types is a comma-separated list of {', '.join(EVENT_TYPES)}"
                                                   f" (unknown: {', '.join(repr(t) for t in bad) or 'none given'})")
        types = frozenset(names)
    return since, types


def frame(event: Event) -> bytes:
    return f"id: {event.id}\nevent: {event.type}\ndata: {_data(event.data)}\n\n".encode()


def _unnumbered(type_: str, data: dict[str, Any]) -> bytes:
    return f"event: {type_}\ndata: {_data(data)}\n\n".encode()


def _data(data: dict[str, Any]) -> str:
    # One line: JSON escapes every newline, so "data:" never needs splitting.
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)


async def _events(request: web.Request) -> web.StreamResponse:
    live: Live = request.app[LIVE]
    bus = live.bus
    if not bus.attached:  # an app built without serve's bus: wake its followers on this loop
        bus.attach(asyncio.get_running_loop())
    cursor, types = parse_query(request.query, request.headers.get("Last-Event-ID"), bus)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                       "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    with bus.subscribe() as sub:
        try:
            await resp.write(_unnumbered("hello", {"run": bus.run, "last_id": bus.last_id}))
            while True:
                sub.clear()  # before reading: what is published from here on wakes the wait below
                batch = bus.read(cursor, types)
                if batch.missed is not None:
                    await resp.write(_unnumbered("missed", {"from": batch.missed[0], "to": batch.missed[1]}))
                # A bounded slice per write: a client that stops reading holds at most this much
                # in its connection's buffer, not the whole ring (10,000 events) once it lags.
                events = batch.events[:EVENTS_PER_WRITE]
                if events:
                    await resp.write(b"".join(frame(e) for e in events))
                cursor = batch.cursor if len(events) == len(batch.events) else events[-1].id
                if len(events) < len(batch.events):
                    continue
                if bus.closed:
                    break
                if not await sub.wait(live.keepalive_s):
                    await resp.write(b": keepalive\n\n")
        except (ConnectionError, RuntimeError):  # the client left (or serve is closing its transport)
            return resp
    with contextlib.suppress(ConnectionError, RuntimeError):
        await resp.write_eof()
    return resp


def openapi_paths() -> dict[str, Any]:
    """These routes in the OpenAPI document."""
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    unauthorized = {"description": "unauthorized: no bearer token, or not this node's", "content": error}
    bad = {"description": "invalid_params: a bad since or types (the message says which)", "content": error}
    return {
        EVENTS_PATH: {"get": {
            "operationId": "events",
            "summary": "the live event stream (server-sent events); docs/api.md lists the types",
            "tags": ["live"],
            "parameters": [
                {"name": "since", "in": "query", "required": False,
                 "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
                 "description": "the id of the last event seen: the stream resumes after it (a missed "
                                "event first when the buffer no longer holds all of them)"},
                {"name": "types", "in": "query", "required": False, "schema": {"type": "string"},
                 "description": "a comma-separated list of event types: only those ("
                                + ", ".join(EVENT_TYPES) + ")"},
            ],
            "responses": {
                "200": {"description": "a stream: hello first, then id/event/data frames and keepalive comments",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                "400": bad, "401": unauthorized,
            },
        }},
        METRICS_PATH: {"get": {
            "operationId": "metrics",
            "summary": "the status numbers in the Prometheus text format 0.0.4",
            "tags": ["live"],
            "responses": {
                "200": {"description": "Prometheus exposition text",
                        "content": {"text/plain": {"schema": {"type": "string"}}}},
                "400": {"description": "invalid_params: it takes no query parameters", "content": error},
                "401": unauthorized,
            },
        }},
        HEALTH_PATH: {"get": {
            "operationId": "health",
            "summary": "liveness (no token needed)",
            "tags": ["live"],
            "security": [],
            "responses": {
                "200": {"description": "serve is up", "content": {"application/json": {"schema": {
                    "type": "object", "required": ["ok", "uptime_s", "node_key"], "additionalProperties": False,
                    "properties": {"ok": {"type": "boolean", "const": True},
                                   "uptime_s": {"type": "number", "minimum": 0},
                                   "node_key": {"type": "string"}}}}}},
                "400": {"description": "invalid_params: it takes no query parameters", "content": error},
            },
        }},
    }
