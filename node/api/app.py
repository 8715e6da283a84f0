"""The local HTTP API's aiohttp application: parse the request, run its command, render.

    app = build_app(run, token)      # run(name, params) -> Result, awaited (serve's runner)

Per request, in order: the Host header (every route: it must name the address the request
arrived on, or a localhost form of it, with any port; else 421, so a page a browser loaded
from another site by DNS rebinding reaches nothing, not even the public routes), the bearer
token (every route but ``GET /v1/openapi.json``, the page's files and ``GET /v1/health``;
compared in constant time), the body (at most MAX_BODY_BYTES and MAX_JSON_DEPTH,
``application/json``, a JSON object; no query parameters anywhere but ``GET /v1/events``'s),
the route's parameters (path values merged into the body), then the command, run by name exactly as the control channel runs it. The answer is
``{"data", "text", "warnings"}`` or ``{"error": {"code", "message"}}`` (node/api/errors.py).
Nothing is validated here that the command's model validates: bad parameters are refused by
the registry before the handler runs, so they change nothing.
"""
from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.web_protocol import RequestPayloadError

from memmesh.node.api import errors
from memmesh.node.api.errors import HttpError, envelope, kind_of
from memmesh.node.api.live import Live, add_live, is_public
from memmesh.node.api.live import openapi_paths as live_paths
from memmesh.node.api.openapi import document
from memmesh.node.api.page import add_page, is_page, openapi_paths
from memmesh.node.api.routes import OPENAPI_PATH, Route, build_routes
from memmesh.node.commands import REGISTRY
from memmesh.node.commands.params import MAX_DEPTH, json_nesting, no_json_constant, unique_keys
from memmesh.node.commands.registry import Registry
from memmesh.node.commands.result import Result
from memmesh.node.http_guard import NO_TOKEN, WRONG_TOKEN, bearer_refusal, host_allowed
from memmesh.node.refusal import failure
from memmesh.node.validation_text import json_type

MAX_BODY_BYTES = 1 << 20  # 1 MiB: a memory's value is at most a few KiB; nothing needs more
# No command takes parameters nested more than a few levels (edges, a config value's mapping);
# 64 is far above that and far below what recursion in the decoder or the validator could hit.
MAX_JSON_DEPTH = MAX_DEPTH
Runner = Callable[[str, dict[str, Any]], Awaitable[Result]]
ROUTES = web.AppKey("routes", list)
OPS = web.AppKey("ops", dict)  # (method, path template) -> the command's name, for the log
DOCUMENT = web.AppKey("openapi", dict)
log = logging.getLogger("memmesh.api")


def build_app(run: Runner, token: str, *, registry: Registry = REGISTRY, live: Live | None = None
              ) -> web.Application:
    """The API for the commands of ``registry``, each run through ``run``; ``live``: serve's
    event bus and node key for the event stream and health (node/api/live.py)."""
    routes = build_routes(registry)
    # Errors outermost, so that a refused token is rendered (and logged) like any other error.
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_errors, _host, _bearer(token)])
    app[ROUTES] = routes
    app[OPS] = {(r.method, r.path): r.command.name for r in routes}
    app[DOCUMENT] = document(routes)
    app[DOCUMENT]["paths"].update(openapi_paths())  # the page's files are documented too (public)
    for route in routes:
        app.router.add_route(route.method, route.path, _handler(route, run))
    app.router.add_route("GET", OPENAPI_PATH, _openapi)
    add_page(app)  # the cockpit page's static files (node/api/page.py)
    app[DOCUMENT]["paths"].update(live_paths())
    add_live(app, live or Live(), run)  # events, metrics, health (node/api/live.py)
    return app


async def _openapi(request: web.Request) -> web.Response:
    return _json(200, request.app[DOCUMENT])


def _handler(route: Route, run: Runner) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        if request.query_string:
            raise HttpError(errors.INVALID_PARAMS, f"{route.method} {route.path} takes no query parameters"
                                                   + ("" if route.body is None else "; send them in the JSON body"))
        body = await _body(request) if route.body is not None else {}
        params = route.params(dict(request.match_info), body)
        result = await run(route.command.name, params)
        return _json(200, {"data": result.data, "text": result.text, "warnings": list(result.warnings)})
    return handle


async def _body(request: web.Request) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise _too_large(request.content_length)
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:  # a chunked body that grew past the limit
        raise _too_large(None) from None
    except (RequestPayloadError, BadHttpMessage) as exc:  # a Content-Encoding that does not decode, a bad chunk
        raise HttpError(errors.INVALID_JSON, f"the body could not be read: {_one_line(exc)}") from None
    except ConnectionError:  # the client went away (or the body timer cut it) mid-body
        raise HttpError(errors.INVALID_JSON, "the body ended before it was complete (the connection closed)") from None
    if not raw.strip():
        return {}  # no body: the command's defaults (and its refusal of what is missing)
    if request.content_type != "application/json":
        raise HttpError(errors.UNSUPPORTED_MEDIA_TYPE,
                        f"the body must be application/json (got {request.content_type or 'no content type'})")
    if json_nesting(raw) > MAX_JSON_DEPTH:
        raise _too_deep()
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=no_json_constant, object_pairs_hook=unique_keys)
    except (UnicodeDecodeError, ValueError) as exc:
        raise HttpError(errors.INVALID_JSON, f"the body is not valid JSON: {_why(exc)}") from None
    except RecursionError:  # not reached past the scan above; a last guard, never a 500
        raise _too_deep() from None
    if not isinstance(value, dict):
        raise HttpError(errors.INVALID_JSON, f"the body must be a JSON object, got {json_type(value)}")
    return value


def _too_deep() -> HttpError:
    return HttpError(errors.INVALID_JSON, f"the body nests arrays and objects more than {MAX_JSON_DEPTH} deep")


def _too_large(size: int | None) -> HttpError:
    got = f" (got {size} bytes)" if size is not None else ""
    return HttpError(errors.BODY_TOO_LARGE, f"the body is over the limit of {MAX_BODY_BYTES} bytes{got}")


def _one_line(exc: BaseException) -> str:
    """aiohttp's messages span lines ("400, message:\n  ..."); the part after them, on one line."""
    text = " ".join(str(exc).split())
    return re.sub(r"^\d{3}, message: ", "", text)[:200]


def _why(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    if isinstance(exc, UnicodeDecodeError):
        return "it is not UTF-8"
    if "integer string conversion" in str(exc):  # Python's own wording names an interpreter setting
        return "a number has more digits than any parameter can hold"
    return str(exc)


# ---------------------------------------------------------------------- middlewares
@web.middleware
async def _host(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                ) -> web.StreamResponse:
    """Only a request that names this API answers: a DNS-rebinding page's requests carry its
    own host name, though they reach 127.0.0.1. Compared with the address the connection
    arrived on, so it holds for any --api-listen (and port 0) without being told."""
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    given = request.headers.get("Host", "")
    # An absolute-form target (GET http://host/path) names a host too, which aiohttp's URL
    # then takes; both must name this API. For the usual origin-form it is the Host header.
    if host_allowed(given, sockname):
        given = request.url.raw_authority or ""
    if not host_allowed(given, sockname):
        shown = given if given.isprintable() and len(given) <= 80 else repr(given[:80])
        raise HttpError(errors.MISDIRECTED, f"the Host header {shown!r} does not name this API; use the address it "
                                            "listens on (or localhost, 127.0.0.1, [::1])")
    return await handler(request)


def _bearer(token: str) -> Any:
    @web.middleware
    async def bearer(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        if request.method == "GET" and request.path == OPENAPI_PATH:
            return await handler(request)  # public: a client reads it before it has the token
        if is_page(request.method, request.path):
            return await handler(request)  # static files, no secret: the page asks for the token
        if is_public(request.method, request.path):
            return await handler(request)  # liveness: a supervisor checks it without the token
        refused = bearer_refusal(request.headers.get("Authorization", ""), token)
        if refused == NO_TOKEN:
            raise HttpError(errors.UNAUTHORIZED, "this API needs the node's token: send Authorization: Bearer "
                                                 "<the content of HOME/api.token>",
                            {"WWW-Authenticate": 'Bearer realm="memmesh"'})
        if refused == WRONG_TOKEN:
            raise HttpError(errors.UNAUTHORIZED, "the bearer token is not this node's (it is in HOME/api.token)",
                            {"WWW-Authenticate": 'Bearer realm="memmesh", error="invalid_token"'})
        return await handler(request)
    return bearer


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                  ) -> web.StreamResponse:
    """Every error as the error envelope, and one log line per request."""
    t0 = time.monotonic()
    code = None
    try:
        resp = await handler(request)
    except HttpError as exc:
        code = exc.kind.code
        resp = _json(exc.kind.status, envelope(code, exc.message), exc.headers)
    except web.HTTPException as exc:  # aiohttp's own: no such route, wrong method, body too large
        kind = {404: errors.NOT_FOUND, 405: errors.METHOD_NOT_ALLOWED, 413: errors.BODY_TOO_LARGE}.get(exc.status)
        if kind is None:
            raise
        code = kind.code
        message = {404: f"no route {request.method} {request.path}; GET {OPENAPI_PATH} lists them",
                   405: f"{request.path} does not take {request.method}"
                        f" (it takes {exc.headers.get('Allow', 'another method')})",
                   413: f"the body is over the limit of {MAX_BODY_BYTES} bytes"}[exc.status]
        resp = _json(kind.status, envelope(code, message),
                     {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None)
    except Exception as exc:  # the command's own refusal, or a bug
        kind = kind_of(exc)
        code = kind.code
        resp = _json(kind.status, envelope(code, _message(exc, request)))
    # Folded per route and status past a few per 10 s (node/logthrottle.py): a flood of requests
    # (2,000 pipelined in one write) must not write a line each; unknown paths share one key.
    fold = f"api {_op(request) if request.match_info.route.resource is not None else 'other'} {resp.status}"
    log.info("api", extra={"fields": {"op": _op(request), "method": request.method, "path": request.path,
                                      "status": resp.status, **({"code": code} if code else {}),
                                      "peer": request.remote, "ms": round((time.monotonic() - t0) * 1000, 1)},
                           "throttle": fold, "throttle_burst": 10})
    return resp


def _op(request: web.Request) -> str:
    resource = request.match_info.route.resource
    template = resource.canonical if resource is not None else None
    return request.app[OPS].get((request.method, template)) or request.path


def _message(exc: Exception, request: web.Request) -> str:
    """The line the CLI prints for a refusal; for a bug, what failed (logged in full)."""
    if kind_of(exc) is errors.INTERNAL:
        log.error("api.error", exc_info=exc, extra={"fields": {"op": _op(request), "path": request.path}})
    mapped = failure(exc)
    if mapped is not None:
        return mapped[0]
    return f"serve failed running {_op(request)}: {type(exc).__name__}: {exc} (serve's log has the details)"


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=json.dumps(body, default=str, ensure_ascii=False),
                        content_type="application/json", headers=headers)
