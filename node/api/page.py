"""The cockpit page (node/api/static/): ``GET /``, ``GET /ui/{file}`` and ``GET /favicon.ico``,
without the token (a browser asks for the icon by itself, with no token to send).

The files are static and hold no secret: the page asks for the token and sends it on every
API call itself. Only the files shipped in node/api/static/ are served (looked up by exact
name, so no path can leave the folder), read once when the app is built. The answers forbid
framing and any resource from elsewhere (the page needs none: no CDN, it works offline).
"""
from __future__ import annotations

from importlib import resources
from typing import Any

from aiohttp import web

from memmesh.node.api import errors
from memmesh.node.api.errors import HttpError

INDEX_PATH = "/"
FILE_PATH = "/ui/{file}"
ICON_PATH = "/favicon.ico"
PAGE_ROUTES = frozenset({("GET", INDEX_PATH), ("GET", FILE_PATH), ("GET", ICON_PATH)})
TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".png": "image/png",
         ".ico": "image/x-icon"}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # a new memmesh version's page is picked up on the next load
}
FILES = web.AppKey("page_files", dict)


def is_page(method: str, path: str) -> bool:
    """Whether the token middleware lets this request through (the page's static files)."""
    return method == "GET" and (path in (INDEX_PATH, ICON_PATH) or path.startswith("/ui/"))


def add_page(app: web.Application) -> None:
    app[FILES] = _files()
    app.router.add_route("GET", INDEX_PATH, _index)
    app.router.add_route("GET", FILE_PATH, _file)
    app.router.add_route("GET", ICON_PATH, _icon)


def _files() -> dict[str, tuple[bytes, str]]:
    out: dict[str, tuple[bytes, str]] = {}
    for item in resources.files("memmesh.node.api").joinpath("static").iterdir():
        suffix = "." + item.name.rpartition(".")[2]
        if item.is_file() and suffix in TYPES:
            out[item.name] = (item.read_bytes(), TYPES[suffix])
    return out


def _answer(app: web.Application, name: str) -> web.Response:
    files: dict[str, Any] = app[FILES]
    found = files.get(name)
    if found is None:
        raise HttpError(errors.NOT_FOUND, f"the page has no file {name!r} (it has {', '.join(sorted(files))})")
    body, content_type = found
    return web.Response(body=body, content_type=content_type,
                        charset="utf-8" if content_type.startswith("text/") else None, headers=HEADERS)


async def _index(request: web.Request) -> web.Response:
    return _answer(request.app, "index.html")


async def _file(request: web.Request) -> web.Response:
    return _answer(request.app, request.match_info["file"])


async def _icon(request: web.Request) -> web.Response:
    return _answer(request.app, "favicon.ico")


def openapi_paths() -> dict[str, Any]:
    """The page's two routes in the OpenAPI document (public: ``security: []``)."""
    def op(op_id: str, summary: str, types: list[str], params: list[dict[str, Any]]) -> dict[str, Any]:
        return {"get": {
            "operationId": op_id, "summary": summary, "tags": ["page"], "security": [],
            **({"parameters": params} if params else {}),
            "responses": {"200": {"description": "the file",
                                  "content": {t: {"schema": {"type": "string"}} for t in types}},
                          "404": {"description": "not_found: the page has no such file",
                                  "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}},
        }}
    return {
        INDEX_PATH: op("page", "the cockpit page (no token needed; it asks for the token)", ["text/html"], []),
        FILE_PATH: op("page_file", "a file of the cockpit page: app.js, app.css (no token needed)",
                      sorted(set(TYPES.values())),
                      [{"name": "file", "in": "path", "required": True, "schema": {"type": "string"},
                        "description": "the file's name"}]),
        ICON_PATH: op("favicon", "the page's icon (no token needed)", ["image/x-icon"], []),
    }
