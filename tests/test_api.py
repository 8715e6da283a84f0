"""The local HTTP API: the real aiohttp app on 127.0.0.1 against a real node (its SQLite home in
tmp_path) on a real database thread, run exactly as serve runs it; one test against a real
`memmesh serve` process. Every answer is checked against the OpenAPI document (openapi-core),
and so is every request meant to be valid; bad requests must change nothing on disk.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import re
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from openapi_core import OpenAPI
from openapi_core.testing import MockRequest, MockResponse
from openapi_spec_validator import validate
from pydantic import Field

from memmesh.auth.errors import AuthError, MemmeshError
from memmesh.node import Node
from memmesh.node.api.app import MAX_BODY_BYTES, ROUTES, build_app
from memmesh.node.api.errors import CODES, kind_of
from memmesh.node.api.live import LIVE_ROUTES
from memmesh.node.api.page import PAGE_ROUTES
from memmesh.node.api.routes import OPENAPI_PATH, build_routes
from memmesh.node.api_token import TOKEN_FILE, TokenError, ensure_token, read_token
from memmesh.node.commands import REGISTRY
from memmesh.node.commands.params import NoParams, Params, ParamsError
from memmesh.node.commands.registry import Registry
from memmesh.node.commands.result import Result
from memmesh.node.control_server import CommandRunner
from memmesh.node.registry import NameTaken, UnknownName
from memmesh.node.settings import ToolNotAllowed
from memmesh.node.worker import DbThread
from tests.procs import processes


# ---------------------------------------------------------------------- the harness
def written(node: Node) -> dict[str, Any]:
    """Everything a command could write: entries per database and every peer-local record."""
    local = {ns: sorted(node.storage.items_local(ns))
             for ns in ("agents", "banks", "archived-banks", "node-config", "credentials")}
    return {"entries": {d: len(node.database(d)) for d in node.database_ids()}, "local": local}


class Api:
    """An HTTP client of the app; every answer is validated against the app's OpenAPI document."""

    def __init__(self, base: str, token: str, session: aiohttp.ClientSession, node: Node, db: DbThread,
                 app: Any) -> None:
        self.base, self.token, self.session, self.node, self.db, self.app = base, token, session, node, db, app
        self.doc: dict[str, Any] = {}
        self.openapi: OpenAPI | None = None

    async def load_doc(self) -> None:
        async with self.session.get(self.base + OPENAPI_PATH) as resp:  # no token: public
            assert resp.status == 200
            self.doc = await resp.json()
        self.openapi = _openapi(json.dumps(self.doc, sort_keys=True))

    async def written(self) -> dict[str, Any]:
        return await self.db.run(lambda: written(self.node))

    async def call(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
                   token: str | None = "good", content_type: str = "application/json", valid: bool = True,
                   pattern: str | None = None) -> tuple[int, Any, Any]:
        """(status, JSON answer, headers). ``valid``: the request itself must fit the document."""
        headers = {}
        if token is not None:
            headers["Authorization"] = f"Bearer {self.token if token == 'good' else token}"
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        if data is not None:
            headers["Content-Type"] = content_type
        async with self.session.request(method, self.base + path, data=data, headers=headers) as resp:
            payload = await resp.read()
            status, resp_headers = resp.status, resp.headers
        answer = json.loads(payload)
        assert resp_headers["Content-Type"].startswith("application/json")
        request = MockRequest(self.base, method, path.partition("?")[0], headers=headers, data=data,
                              content_type=content_type if data is not None else "application/json")
        assert self.openapi is not None
        if valid:
            self.openapi.validate_request(request)
        if method.lower() in self.doc["paths"].get(pattern or path, {}):
            self.openapi.validate_response(request, MockResponse(payload, status, dict(resp_headers)))
        return status, answer, resp_headers


@functools.lru_cache(maxsize=2)
def _openapi(doc: str) -> OpenAPI:
    return OpenAPI.from_dict(json.loads(doc))  # checks the document first: 1-2 s, so once per document


@pytest.fixture
async def api(home):
    """The API of conftest's home (no embedder) with agents alpha and beta, bank notes alpha writes."""
    node = Node.open(home)
    for name in ("alpha", "beta"):
        node.run("agent.new", {"name": name})
    node.run("memory.new", {"name": "notes", "description": "team notes"})
    node.run("memory.grant", {"bank": "notes", "agent": "alpha", "perm": "write"})
    if not (home / "config.yaml").exists():
        (home / "config.yaml").write_text("")  # the defaults: config check and reload have a file
    db = DbThread()
    runner = CommandRunner(node, db, {"pid": os.getpid(), "listen": "127.0.0.1:0"})
    app = build_app(runner.run, read_token(home))
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            client = Api(str(server.make_url("")).rstrip("/"), read_token(home), session, node, db, app)
            await client.load_doc()
            yield client
    finally:
        await server.close()
        db.stop()
        node.close()


def router_routes(app: Any) -> set[tuple[str, str]]:
    return {(r.method, r.resource.canonical) for r in app.router.routes()}


# A valid call for every route, in an order that works on the fixture's node; {entry} is the
# entry id the remember call answered, {backup} a new directory. A new route must be added here (the test says so).
EXAMPLES: list[tuple[str, str, Any, int]] = [
    ("GET", "/v1/status", None, 200),
    ("GET", "/v1/agent/list", None, 200),
    ("GET", "/v1/embedder/show", None, 200),
    ("GET", "/v1/memory/list", None, 200),
    ("GET", "/v1/peers", None, 200),
    ("POST", "/v1/refusals", {"limit": 10}, 200),
    ("POST", "/v1/agent/new", {"name": "gamma"}, 200),
    ("POST", "/v1/agents/{agent}/tools/remember", {"key": "deploy", "value": "nix build", "tags": ["ops"]}, 200),
    ("POST", "/v1/agents/{agent}/tools/recall", {"query": "deploy", "limit": 3}, 200),
    ("POST", "/v1/agents/{agent}/tools/list_memory_banks", {}, 200),
    ("POST", "/v1/agents/{agent}/tools/neighbors", {"key": "deploy", "depth": 2}, 200),
    ("POST", "/v1/agents/{agent}/tools/forget", {"key": "deploy", "preview": True}, 200),
    ("POST", "/v1/agents/{agent}/autorecall", {"messages": ["how do we deploy?"], "session": "s1"}, 200),
    ("POST", "/v1/agents/{agent}/command", {"line": "/memory list", "session": "s1"}, 200),
    ("POST", "/v1/embedder/set", {"provider": "hashed"}, 200),  # offline and fast: reindex has work
    ("POST", "/v1/memory/new", {"name": "scratch", "description": "for a while"}, 200),
    ("POST", "/v1/memory/grant", {"bank": "scratch", "agent": "beta", "perm": "read"}, 200),
    ("POST", "/v1/memory/revoke", {"bank": "scratch", "agent": "beta"}, 200),
    ("POST", "/v1/memory/grants", {"bank": "scratch"}, 200),
    ("POST", "/v1/memory/attach", {"bank": "notes", "agent": "alpha", "session": "s1"}, 200),
    ("POST", "/v1/memory/detach", {"bank": "notes", "agent": "alpha", "session": "s1"}, 200),
    ("POST", "/v1/memory/config", {"agent": "alpha", "action": "set", "key": "max_entries", "value": 5}, 200),
    ("POST", "/v1/memory/reindex", {"bank": "notes"}, 200),
    ("POST", "/v1/memory/stats", {"bank": "notes", "limit": 5}, 200),
    ("POST", "/v1/explain", {"entry_id": "{entry}"}, 200),
    ("POST", "/v1/memory/share", {"bank": "notes"}, 200),
    ("POST", "/v1/memory/unshare", {"bank": "notes"}, 200),
    ("POST", "/v1/memory/import", {"ticket": "memmesh:?db=nothing"}, 422),
    ("POST", "/v1/sync", {}, 200),
    ("POST", "/v1/memory/status", {"bank": "notes", "agent": "alpha"}, 200),
    ("POST", "/v1/memory/entities", {"bank": "notes"}, 200),
    ("POST", "/v1/memory/get", {"agent": "alpha", "key": "deploy"}, 200),
    ("POST", "/v1/memory/proposals", {"agent": "alpha"}, 200),
    ("POST", "/v1/memory/accept", {"agent": "alpha", "id": "prop:0123456789abcdef"}, 404),
    ("POST", "/v1/memory/drop", {"agent": "alpha", "id": "prop:0123456789abcdef"}, 404),
    ("POST", "/v1/memory/quarantine", {"bank": "notes", "who": "alpha"}, 200),
    ("POST", "/v1/memory/quarantines", {"bank": "notes"}, 200),
    ("POST", "/v1/memory/release", {"bank": "notes", "quarantine": "{quarantine}"}, 200),
    ("POST", "/v1/retention/set", {"db": "alpha", "days": 30}, 200),
    ("POST", "/v1/retention/show", {"db": "alpha"}, 200),
    ("POST", "/v1/retention/preview", {"db": "alpha"}, 200),
    ("POST", "/v1/retention/run", {"db": "alpha"}, 200),
    ("POST", "/v1/history/add", {"agent": "alpha", "session": "s1", "role": "user", "text": "we deploy with nix"}, 200),
    ("POST", "/v1/history/show", {"agent": "alpha", "session": "s1"}, 200),
    ("POST", "/v1/history/compact", {"agent": "alpha"}, 200),
    ("POST", "/v1/history/expand", {"agent": "alpha", "chunk": "chunk:" + "0" * 64}, 404),
    ("POST", "/v1/history/window", {"agent": "alpha", "session": "s1", "budget": 2000}, 200),
    ("POST", "/v1/history/summary", {"agent": "alpha", "chunk": "chunk:" + "0" * 64, "text": "a summary"}, 404),
    ("POST", "/v1/episode/add", {"agent": "alpha", "kind": "deploy", "steps": [{"tool": "build", "status": "ok"}],
                                 "outcome": "success", "checked_by": "test", "summary": "deploy the api"}, 200),
    ("POST", "/v1/episode/verdict", {"agent": "alpha", "episode": "{episode}", "verdict": "yes"}, 200),
    ("POST", "/v1/episode/list", {"agent": "alpha"}, 200),
    ("POST", "/v1/methods/learn", {"agent": "alpha"}, 200),
    ("POST", "/v1/methods/list", {"agent": "alpha"}, 200),
    ("POST", "/v1/methods/promote", {"agent": "alpha", "method": "method:" + "0" * 24}, 404),
    ("POST", "/v1/plan-context", {"agent": "alpha", "task": "deploy the api"}, 200),
    ("POST", "/v1/memory/delete", {"ref": "scratch"}, 200),
    ("GET", "/v1/config/show", None, 200),
    ("POST", "/v1/config/check", {}, 200),
    ("POST", "/v1/reload", None, 200),
    ("POST", "/v1/backup", {"dest": "{backup}"}, 200),
    ("POST", "/v1/check", {}, 200),
    ("POST", "/v1/unfence", {"db": "notes"}, 200),  # not fenced: says so, changes nothing
]


def _fill(body: Any, state: dict[str, str]) -> Any:
    if isinstance(body, dict):
        return {k: (v.format(**state) if isinstance(v, str) and "{" in v else v) for k, v in body.items()}
    return body


async def test_every_route_answers_with_the_token_and_refuses_without(api):
    # The page's static files are public (tests/test_cockpit.py); every other route needs the token.
    # The event stream, metrics and health answer other than JSON or without the token:
    # tests/test_events.py checks each with and without it.
    routed = {(m, p) for m, p in router_routes(api.app)
              if p != OPENAPI_PATH and (m, p) not in PAGE_ROUTES | LIVE_ROUTES}
    examples = {(m, p) for m, p, _, _ in EXAMPLES}
    assert routed == examples, f"routes without an example here: {sorted(routed - examples)}"

    for method, pattern, _, _ in EXAMPLES:  # first without a token, then with a wrong one
        path = pattern.format(agent="alpha")
        before = await api.written()
        for token, error in ((None, None), ("not-the-token", 'error="invalid_token"')):
            status, answer, headers = await api.call(method, path, {}, token=token, pattern=pattern, valid=False)
            assert status == 401 and answer["error"]["code"] == "unauthorized", (method, path, answer)
            assert headers["WWW-Authenticate"].startswith("Bearer")
            assert (error in headers["WWW-Authenticate"]) if error else "error=" not in headers["WWW-Authenticate"]
        assert await api.written() == before

    state = {"backup": str(api.node.home.parent / "backup")}
    for method, pattern, body, expected in EXAMPLES:
        path = pattern.format(agent="alpha")
        status, answer, _ = await api.call(method, path, _fill(body, state), pattern=pattern)
        assert status == expected, (method, path, answer)
        if status == 200:
            assert set(answer) == {"data", "text", "warnings"}
        else:
            assert answer["error"]["code"] == ("not_found" if status == 404 else "refused") and answer["error"]["message"]
        if pattern.endswith("/remember"):
            state["entry"] = answer["data"]["entry"]
        if pattern.endswith("/episode/add"):
            state["episode"] = answer["data"]["id"]
        if pattern.endswith("/memory/quarantine"):
            state["quarantine"] = answer["data"]["id"]


async def test_remember_answers_the_committed_entry_id_which_recall_then_finds(api):
    before = await api.written()
    status, answer, _ = await api.call("POST", "/v1/agents/alpha/tools/remember",
                                       {"key": "architecture.sessions", "value": "one database per conversation",
                                        "bank": "notes"}, pattern="/v1/agents/{agent}/tools/remember")
    assert status == 200
    entry = answer["data"]["entry"]
    assert entry.startswith("sha256:") and answer["data"]["bank"] == "notes"
    assert await api.written() != before  # what the bad requests below compare would show a write
    # Committed before the answer: the bank's database has it now (no "queued").
    bank_id = await api.db.run(lambda: api.node.agents.resolve("notes").db.id)
    assert await api.db.run(lambda: api.node.database(bank_id).knows(entry))

    status, answer, _ = await api.call("POST", "/v1/agents/alpha/tools/recall",
                                       {"query": "sessions", "bank": "notes"},
                                       pattern="/v1/agents/{agent}/tools/recall")
    assert status == 200 and [m["key"] for m in answer["data"]["memories"]] == ["architecture.sessions"]
    status, answer, _ = await api.call("POST", "/v1/explain", {"entry_id": entry})
    assert status == 200 and answer["data"]["entry"] == entry and answer["data"]["database"] == bank_id


async def test_autorecall_gives_the_relevant_memories_block(api):
    await api.call("POST", "/v1/agents/alpha/tools/remember", {"key": "deploy process", "value": "nix build && scp"},
                   pattern="/v1/agents/{agent}/tools/remember")
    status, answer, _ = await api.call("POST", "/v1/agents/alpha/autorecall",
                                       {"messages": ["hello", "what is the deploy process?"], "session": "s1"},
                                       pattern="/v1/agents/{agent}/autorecall")
    assert status == 200 and "## Relevant Memories" in answer["data"]["block"]
    assert "nix build && scp" in answer["text"]
    # The path names the agent, and the body's schema has none: naming it there, even with the
    # path's value, is refused as the schema says.
    for agent in ("alpha", "beta"):
        status, answer, _ = await api.call("POST", "/v1/agents/alpha/autorecall", {"agent": agent, "messages": ["x"]},
                                           pattern="/v1/agents/{agent}/autorecall", valid=False)
        assert status == 400 and answer["error"] == {
            "code": "invalid_params", "message": "autorecall: the path gives agent, so leave agent out of the body"}


# Bad requests: (what, method, path pattern, raw body, content type, status, code, message part).
REMEMBER = "/v1/agents/{agent}/tools/remember"
BAD = [
    ("malformed JSON", "POST", REMEMBER, b'{"key": "k", "value": ', "application/json", 400, "invalid_json",
     "the body is not valid JSON: Expecting value at line 1 column 23"),
    ("not UTF-8", "POST", REMEMBER, b'{"key": "\xff"}', "application/json", 400, "invalid_json", "not UTF-8"),
    ("NaN", "POST", "/v1/agents/{agent}/tools/recall", b'{"limit": NaN}', "application/json", 400, "invalid_json",
     "NaN is not a JSON number"),
    ("an array", "POST", REMEMBER, b'[1, 2]', "application/json", 400, "invalid_json",
     "the body must be a JSON object, got an array"),
    ("a wrong type", "POST", REMEMBER, b'{"key": "k", "value": 5}', "application/json", 400, "invalid_params",
     "remember: value should be a valid string (got 5)"),
    ("a string for a number", "POST", "/v1/agents/{agent}/tools/recall", b'{"limit": "3"}', "application/json",
     400, "invalid_params", "recall: limit should be a valid integer (got '3')"),
    ("an unknown field", "POST", REMEMBER, b'{"key": "k", "value": "v", "colour": "red"}', "application/json", 400,
     "invalid_params", "remember does not take colour; it takes bank, category, confidence, edges, entities, importance, key, on_duplicate, source, supersedes, tags, valid_from, valid_to, value"),
    ("a malformed name", "POST", "/v1/agent/new", b'{"name": "no spaces"}', "application/json", 400, "invalid_params",
     "agent.new: name should be 1-64 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit "
     "(got 'no spaces')"),
    ("an empty key", "POST", REMEMBER, b'{"key": "", "value": "v"}', "application/json", 400, "invalid_params",
     "remember: key should have at least 1 character (got '')"),
    ("a value over its length", "POST", REMEMBER, b'{"key": "k", "value": "' + b"v" * 65537 + b'"}',
     "application/json", 400, "invalid_params", "remember: value should have at most 65536 characters"),
    ("a missing field", "POST", "/v1/memory/new", b'{}', "application/json", 400, "invalid_params",
     "memory.new needs name"),
    ("no body where one is needed", "POST", "/v1/memory/grant", b'', "application/json", 400, "invalid_params",
     "memory.grant needs bank and agent and perm"),
    ("a form", "POST", "/v1/memory/new", b'name=x', "application/x-www-form-urlencoded", 415,
     "unsupported_media_type", "application/json (got application/x-www-form-urlencoded)"),
    ("too large", "POST", REMEMBER,
     json.dumps({"key": "k", "value": "v" * MAX_BODY_BYTES}).encode(), "application/json", 413, "body_too_large",
     f"over the limit of {MAX_BODY_BYTES} bytes"),
    ("a query string", "GET", "/v1/status?verbose=1", None, "application/json", 400, "invalid_params",
     "takes no query parameters"),
    ("an unknown tool", "POST", "/v1/agents/{agent}/tools/obliterate", b'{}', "application/json", 404, "not_found",
     "no route POST /v1/agents/alpha/tools/obliterate"),
    ("a wrong method", "GET", "/v1/memory/new", None, "application/json", 405, "method_not_allowed",
     "/v1/memory/new does not take GET (it takes POST)"),
]


@pytest.mark.parametrize("what,method,pattern,raw,ctype,status,code,message", BAD, ids=[b[0] for b in BAD])
async def test_bad_requests_get_a_clear_4xx_and_change_nothing(api, what, method, pattern, raw, ctype, status, code,
                                                               message):
    before = await api.written()
    path = pattern.format(agent="alpha")
    got, answer, headers = await api.call(method, path, raw=raw, content_type=ctype, valid=False,
                                          pattern=None if "?" in path or "forget" in path else pattern)
    assert (got, answer["error"]["code"]) == (status, code), answer
    assert message in answer["error"]["message"]
    assert await api.written() == before
    if status == 405:
        assert headers["Allow"] == "POST"


async def test_a_chunked_body_over_the_limit_is_refused(api):
    async def chunks():
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b" " * 65536  # no Content-Length: only reading finds it too large

    before = await api.written()
    async with api.session.post(api.base + "/v1/memory/new", data=chunks(),
                                headers={"Authorization": f"Bearer {api.token}",
                                         "Content-Type": "application/json"}) as resp:
        assert resp.status == 413 and (await resp.json())["error"]["code"] == "body_too_large"
    assert await api.written() == before


async def test_refusals_of_the_node_map_to_their_codes(api):
    cases = [
        ("POST", "/v1/agents/nobody/tools/recall", {}, 404, "not_found", "no agent named 'nobody'"),
        ("POST", "/v1/memory/grant", {"bank": "nobank", "agent": "alpha", "perm": "read"}, 404, "not_found",
         "no bank 'nobank'"),
        ("POST", "/v1/agent/new", {"name": "alpha"}, 409, "conflict", "'alpha' is already"),
        ("POST", "/v1/memory/new", {"name": "beta"}, 409, "conflict", "'beta' is already"),
        ("POST", "/v1/agents/beta/tools/remember", {"key": "k", "value": "v", "bank": "notes"}, 403, "forbidden",
         "agent beta may not write to bank notes"),
        ("POST", "/v1/explain", {"entry_id": "sha256:" + "0" * 64}, 404, "not_found", "is not known"),
        ("POST", "/v1/retention/run", {"db": "alpha"}, 422, "refused", "alpha has no retention policy"),
        # two fields that each fit the schema, refused for what they mean together
        ("POST", "/v1/memory/quarantine", {"bank": "notes", "who": "alpha", "from": "2026-02-01", "to": "2026-01-01"},
         422, "refused", "must be before to"),
    ]
    before = await api.written()
    for method, path, body, status, code, message in cases:
        pattern = None
        if path.startswith("/v1/agents/"):
            pattern = "/v1/agents/{agent}/" + path.split("/", 4)[4]
        got, answer, _ = await api.call(method, path, body, pattern=pattern)
        assert (got, answer["error"]["code"]) == (status, code), (path, answer)
        assert message in answer["error"]["message"]
    assert await api.written() == before


async def test_a_tool_outside_allowed_tools_is_403_tool_not_allowed(api):
    (api.node.home / "config.yaml").write_text("agents:\n  - name: alpha\n    allowed_tools: [recall]\n")
    status, answer, _ = await api.call("POST", "/v1/reload", None)
    assert status == 200, answer
    before = await api.written()
    status, answer, _ = await api.call("POST", "/v1/agents/alpha/tools/remember", {"key": "k", "value": "v"},
                                       pattern=REMEMBER)
    assert status == 403 and answer["error"]["code"] == "tool_not_allowed"
    assert answer["error"]["message"].startswith("agent alpha may not use remember")
    assert await api.written() == before
    status, _, _ = await api.call("POST", "/v1/agents/alpha/tools/recall", {"query": "k"},
                                  pattern="/v1/agents/{agent}/tools/recall")
    assert status == 200


def test_one_table_gives_each_exception_its_status_and_code():
    assert (kind_of(ParamsError("x")).status, kind_of(ParamsError("x")).code) == (400, "invalid_params")
    assert kind_of(ToolNotAllowed("x")).code == "tool_not_allowed" and kind_of(ToolNotAllowed("x")).status == 403
    assert kind_of(AuthError("auth.not_writer", "x")).code == "forbidden"
    assert kind_of(UnknownName("x")).status == 404 and kind_of(NameTaken("x")).status == 409
    assert kind_of(MemmeshError("x")).code == "refused" and kind_of(MemmeshError("x")).status == 422
    assert kind_of(FileNotFoundError(2, "No such file")).code == "refused"
    assert kind_of(ZeroDivisionError()).code == "internal" and kind_of(KeyError("x")).status == 500
    assert len(set(CODES)) == len(CODES)


class Boom(Params):
    n: Annotated[int, Field(description="a number")] = 1


async def test_a_bug_is_a_500_logged_in_full_and_the_message_says_where(tmp_path, caplog):
    reg = Registry()

    @reg.command("bug", Boom, "always fails")
    def bug(node, p: Boom) -> Result:
        raise ZeroDivisionError("division by zero")

    @reg.command("fine", NoParams, "works", read_only=True)
    def fine(node, p: NoParams) -> Result:
        return Result({"ok": True}, "ok")

    db = DbThread()
    app = build_app(CommandRunner(object(), db, {}, reg).run, "t0ken", registry=reg)  # type: ignore[arg-type]
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer t0ken"}) as s:
            with caplog.at_level(logging.INFO, logger="memmesh.api"):
                async with s.post(server.make_url("/v1/bug"), json={}) as resp:
                    assert resp.status == 500
                    error = (await resp.json())["error"]
            async with s.get(server.make_url("/v1/fine")) as resp:  # read-only, no parameters: GET
                assert resp.status == 200 and (await resp.json())["data"] == {"ok": True}
    finally:
        await server.close()
        db.stop()
    assert error == {"code": "internal", "message": "serve failed running bug: ZeroDivisionError: division by zero "
                                                    "(serve's log has the details)"}
    logged = [r for r in caplog.records if r.getMessage() == "api.error"]
    assert logged and logged[0].exc_info and logged[0].exc_info[0] is ZeroDivisionError
    assert any(r.getMessage() == "api" and r.fields["status"] == 500 for r in caplog.records)  # type: ignore[attr-defined]
    assert {(r.method, r.resource.canonical) for r in app.router.routes()} == {
        ("POST", "/v1/bug"), ("GET", "/v1/fine"), ("GET", OPENAPI_PATH)} | PAGE_ROUTES | LIVE_ROUTES


# ---------------------------------------------------------------------- the OpenAPI document
async def test_the_openapi_document_is_valid_public_and_covers_exactly_the_router(api):
    validate(api.doc)  # openapi-spec-validator: OpenAPI 3.1
    assert api.doc["openapi"].startswith("3.1")
    documented = {(m.upper(), p) for p, ops in api.doc["paths"].items() for m in ops}
    assert documented == router_routes(api.app)
    assert {(r.method, r.path) for r in api.app[ROUTES]} | {("GET", OPENAPI_PATH)} | PAGE_ROUTES | LIVE_ROUTES \
        == documented
    # Every command is routed but the ones the rule leaves out.
    routed = {r.command.name for r in api.app[ROUTES]}
    left_out = {c.name for c in REGISTRY if c.name not in routed}
    assert left_out == {"serve", "init", "remember", "recall", "forget"} | {c.name for c in REGISTRY if c.standalone}
    # The body of a tool route is the tool's own argument model, hoisted into components.
    remember = api.doc["paths"][REMEMBER]["post"]
    assert remember["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/RememberArgs"}
    assert api.doc["components"]["schemas"]["RememberArgs"]["additionalProperties"] is False
    assert "$defs" not in json.dumps(api.doc)
    assert api.doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"] == \
        list(CODES)
    assert api.doc["paths"][OPENAPI_PATH]["get"]["security"] == []
    assert api.doc["security"] == [{"bearer": []}]
    assert api.doc["paths"]["/v1/status"]["get"].get("requestBody") is None


def test_docs_list_every_route():
    doc = (Path(__file__).parent.parent / "docs" / "api.md").read_text()
    listed = set(re.findall(r"^\| `(GET|POST) (/v1/\S+)` \|", doc, re.M))
    assert listed == {(r.method, r.path) for r in build_routes()} | {("GET", OPENAPI_PATH)} \
        | {(m, p) for m, p in LIVE_ROUTES if p.startswith("/v1/")}


# ---------------------------------------------------------------------- the token file
def test_init_creates_the_token_0600_and_serve_creates_it_for_an_older_home(tmp_path):
    node, _ = Node.init(tmp_path / "h")
    node.close()
    path = tmp_path / "h" / TOKEN_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = read_token(tmp_path / "h")
    assert len(token) >= 43 and token == path.read_text().strip()
    assert ensure_token(tmp_path / "h") == token  # never replaced
    path.unlink()  # a home from before the API
    new = ensure_token(tmp_path / "h")
    assert new != token and stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)
    with pytest.raises(TokenError, match=r"readable by other users \(mode 644\); run: chmod 600"):
        read_token(tmp_path / "h")


def test_api_listen_is_checked_before_anything_runs():
    serve = REGISTRY.get("serve")
    assert serve.parse({"api_listen": "off"}).api_listen == "off"  # type: ignore[attr-defined]
    with pytest.raises(ParamsError, match=r"serve: api_listen should be HOST:PORT .* \(got 'nowhere'\)"):
        serve.parse({"api_listen": "nowhere"})


# ---------------------------------------------------------------------- a real serve
def _http(method: str, url: str, token: str | None, body: Any = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.slow
def test_a_real_serve_serves_the_api_on_loopback_with_the_home_token(tmp_path):
    home = tmp_path / "node"
    node, _ = Node.init(home)
    with node:
        node.run("embedder.set", {"provider": "none"})
        node.run("agent.new", {"name": "alpha"})
    (home / TOKEN_FILE).unlink()  # as a home made before the API: serve creates the token

    refused = subprocess.run([sys.executable, "-m", "memmesh.node.cli", "--home", str(home), "serve", "--listen",
                              "127.0.0.1:0", "--no-discovery", "--api-listen", "0.0.0.0:0"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "not a loopback address" in refused.stderr.splitlines()[-1]
    assert "api.allow_remote: true" in refused.stderr and not (home / "serve.json").exists()

    with processes() as procs:
        serve = procs.serve(home, extra=["--api-listen", "127.0.0.1:0"]).start().wait_ready()
        api = serve.info["api"]
        assert api.startswith("127.0.0.1:") and not api.endswith(":0")
        token = read_token(home)
        assert stat.S_IMODE((home / TOKEN_FILE).stat().st_mode) == 0o600
        base = f"http://{api}"

        assert _http("GET", base + "/v1/status", None)[0] == 401
        status, answer = _http("POST", base + "/v1/agents/alpha/tools/remember", token,
                               {"key": "deploy", "value": "through the API"})
        assert status == 200 and answer["data"]["entry"].startswith("sha256:")
        # The CLI goes through the same serve (its control channel) and sees it at once.
        recalled = subprocess.run([sys.executable, "-m", "memmesh.node.cli", "--home", str(home), "recall", "alpha", "deploy"],
                                  capture_output=True, text=True, timeout=60)
        assert recalled.returncode == 0 and "deploy: through the API" in recalled.stdout
        status, answer = _http("GET", base + "/v1/status", token)
        assert status == 200 and answer["data"]["sync"]["serving"] is True
        status, doc = _http("GET", base + OPENAPI_PATH, None)
        assert status == 200 and doc["openapi"] == "3.1.0"
        assert serve.stop() == 0
        log = serve.log()
    assert f"api.listening address={api}" in log
    assert "info api op=tool method=POST path=/v1/agents/alpha/tools/remember status=200" in log
