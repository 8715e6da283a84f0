"""`memmesh mcp`: the Model Context Protocol server of one agent (docs/mcp.md).

    memmesh --home HOME mcp --agent alpha                                # stdio, as clients spawn it
    memmesh --home HOME mcp --agent alpha --http --listen 127.0.0.1:7413  # Streamable HTTP, loopback

Over HTTP every request carries the node's API token (``Authorization: Bearer`` and the content
of HOME/api.token, as for the HTTP API; ``BearerGuard``); stdio needs none (the client spawned
this process as the home's user).

It publishes the agent tools of the catalogue (node/catalogue.py: remember, recall,
list_memory_banks, neighbors, forget; their argument models are node/commands/tools.TOOLS) and the
auto-recall block as the prompt ``relevant_memories``, with the official SDK's ``MCPServer``;
the agent's banks and memories as resources (``memory://``, ``memory://BANK/KEY``; AgentResources).
It is a transport and nothing more: every call is a registry command (``tool``, ``autorecall``,
``recall``) run by ``node.dispatch.run_command`` through the home's running serve. MCP clients each spawn
their own server, so this process must never write the home itself: when no serve runs for
the home it starts one, detached, and says so on stderr (``ensure_serve``); two clients on one
home then share that one serve.

One schema: a tool's input schema is its argument model's ``model_json_schema()``; the SDK
derives nothing from a Python signature and validates nothing, the arguments reach the
registry exactly as the client sent them, and a refusal is the registry's one line (the line
the CLI prints) as a tool result with ``isError``.

Stdout carries the protocol; everything this process says goes to stderr.
"""
from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import importlib.metadata
import json
import logging
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, unquote

import anyio
import anyio.to_thread
from mcp import types as wire
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import MCPServer, UserMessage
from mcp.server.mcpserver.exceptions import UnexpectedToolError
from mcp.server.mcpserver.prompts import Prompt
from mcp.server.mcpserver.prompts.base import Message, PromptArgument
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, INVALID_PARAMS, CallToolResult, TextContent, ToolAnnotations
from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError

from memmesh.auth.errors import MemmeshError
from memmesh.crdt.errors import StorageError
from memmesh.node.api_token import read_token
from memmesh.node.catalogue import CATALOGUE, ToolSpec
from memmesh.node.command_result import Result, json_text
from memmesh.node.commands.answers import tool_output_schema
from memmesh.node.commands.tools import TOOLS, AutoRecall
from memmesh.node.control import POLL_S, ServeError, remote, route
from memmesh.node.dispatch import run_command
from memmesh.node.home import Home, HomeBusy, NotInitialised, flock_within
from memmesh.node.http_guard import bearer_refusal, host_allowed
from memmesh.node.memory.forgetting import UnknownMemory
from memmesh.node.memory.view import MAX_LIMIT, MAX_PAGE_DEPTH
from memmesh.node.refusal import failure, one_line

PROMPT = "relevant_memories"
SERVE_LOG = "serve.log"  # where a serve started here writes (appended: one file per home)
SPAWN_LOCK = "serve.spawn.lock"  # held while one `memmesh mcp` starts serve for the home
START_TIMEOUT_S = 30.0  # a cold interpreter importing memmesh on a loaded machine

log = logging.getLogger(__name__)



def tool_annotations(tool: ToolSpec) -> ToolAnnotations:
    """The catalogue's hints for clients (never security) as MCP states them: a read-only tool
    needs no destructive or idempotent hint (MCP: they mean nothing then)."""
    if tool.read_only:
        return ToolAnnotations(read_only_hint=True, open_world_hint=tool.open_world)
    return ToolAnnotations(read_only_hint=False, destructive_hint=tool.destructive, idempotent_hint=tool.idempotent,
                           open_world_hint=tool.open_world)


ANNOTATIONS: dict[str, ToolAnnotations] = {tool.name: tool_annotations(tool) for tool in CATALOGUE}


class ServeStartError(MemmeshError):
    """memmesh mcp could not start serve for the home; the message names serve's log."""


# ---------------------------------------------------------------------- the home's serve
def ensure_serve(home: Path, timeout: float = START_TIMEOUT_S) -> int | None:
    """Make sure a serve answers for ``home``, starting one, detached, when none runs.

    Returns the pid of the serve started here, None when one was running already. Two
    processes calling this at once start one serve: the second waits on the spawn lock, then
    finds the first one's serve answering."""
    if _answers(home):
        return None
    with _spawn_lock(home, timeout):
        if _answers(home):
            return None
        return _start_serve(home, timeout)


def _answers(home: Path) -> bool:
    client = route(home)  # waits (bounded) while a one-shot command holds the home
    if client is None:
        return False
    client.close()
    return True


@contextlib.contextmanager
def _spawn_lock(home: Path, timeout: float) -> Iterator[None]:
    fd = os.open(home / SPAWN_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        # The holder waits at most ``timeout`` for its serve, so this wait is bounded as well.
        if not flock_within(fd, timeout + 5.0, POLL_S):
            raise ServeStartError(f"another memmesh mcp has been starting serve for {home} for over "
                                  f"{timeout:g} s; see {home / SERVE_LOG}")
        yield
    finally:
        os.close(fd)  # releases the lock


def _start_serve(home: Path, timeout: float) -> int | None:
    log_path = home / SERVE_LOG
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    start = os.fstat(log_fd).st_size
    try:
        # Its own session: the MCP client stopping this server (or its process group) must not
        # stop the serve other clients of the home use. Listen addresses come from config.yaml.
        proc = subprocess.Popen([sys.executable, "-m", "memmesh.node.cli", "--home", str(home), "serve"],
                                stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, start_new_session=True)
    finally:
        os.close(log_fd)
    print(f"memmesh: no serve was running for {home}; started one, detached (pid {proc.pid}, log {log_path})",
          file=sys.stderr, flush=True)
    deadline = time.monotonic() + timeout
    while True:
        client = remote(home)
        if client is not None:
            client.close()
            # Another serve (one a user started meanwhile) answers just as well; ours then refuses.
            return proc.pid if client.pid == proc.pid else None
        code = proc.poll()
        if code is not None:
            raise ServeStartError(f"serve for {home} exited with code {code} before answering"
                                  f"{_last_line(log_path, start)}; its log: {log_path}")
        if time.monotonic() >= deadline:
            proc.terminate()
            raise ServeStartError(f"serve for {home} (pid {proc.pid}) did not answer within {timeout:g} s and was "
                                  f"stopped; its log: {log_path}")
        time.sleep(POLL_S)


def _last_line(path: Path, start: int) -> str:
    """' (<the last line serve wrote>)', its error, or nothing."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return f" ({lines[-1]})" if lines else ""


def call(home: Path, name: str, params: dict[str, Any]) -> Result:
    """Run registry command ``name`` through the home's serve (started again if it went away)."""
    ensure_serve(home)
    return run_command(home, name, params)


# ---------------------------------------------------------------------- tools and the prompt
class RegistryTool(Tool):
    """A tool whose published input schema is given (the registry's model) and whose
    arguments reach ``fn`` untouched: the registry validates them, once, for every transport."""

    async def run(self, arguments: dict[str, Any], context: Any, convert_result: bool = False) -> Any:
        try:
            return await self.fn(arguments)
        except MCPError:
            raise
        except Exception as exc:  # a bug: the SDK logs it, the client gets no internals
            raise UnexpectedToolError(f"Error executing tool {self.name}") from exc


class RegistryPrompt(Prompt):
    """A prompt whose arguments reach ``fn`` untouched (the SDK's own checks would answer a
    missing argument with a generic internal error)."""

    async def render(self, arguments: dict[str, Any] | None, context: Any) -> list[Message]:
        # fn is what build_server gave: _in_thread(_relevant_memories), whose messages it awaits.
        render = cast(Callable[[dict[str, Any]], Awaitable[list[Message]]], self.fn)
        return await render(arguments or {})


def _run_tool(home: Path, agent: str, name: str, arguments: dict[str, Any]) -> CallToolResult:
    try:
        result = call(home, "tool", {"agent": agent, "tool": name, "args": arguments})
    except (MemmeshError, OSError) as exc:
        line, _ = failure(exc)  # type: ignore[misc]
        return CallToolResult(content=[TextContent(type="text", text=line)], is_error=True)
    return CallToolResult(content=[TextContent(type="text", text=result.text)], structured_content=result.data)


# The prompt takes the autorecall command's parameters but the agent, which is this server's,
# and no_count: the prompt's block goes into the conversation, so it counts as an injection.
PROMPT_ARGS = [name for name in AutoRecall.model_fields if name not in ("agent", "no_count")]
LINES = {"messages": "; one message per line"}  # a list parameter, as a prompt's string argument
NUMBERS = {"context_window"}  # whole numbers, as a prompt's string argument (else refused as not a number)


def _relevant_memories(home: Path, agent: str, arguments: dict[str, str]) -> list[Message]:
    unknown = sorted(set(arguments) - set(PROMPT_ARGS))
    if unknown:
        raise MCPError(INVALID_PARAMS,
                       f"{PROMPT} does not take {', '.join(unknown)}; it takes {', '.join(PROMPT_ARGS)}")
    params: dict[str, Any] = dict(arguments)
    for name in LINES:
        if isinstance(params.get(name), str):
            params[name] = [line for line in params[name].splitlines() if line.strip()]
    for name in NUMBERS:
        # ASCII digits only, and few: str.isdigit() accepts '²' and '①', which int() refuses,
        # and int() refuses more than 4300 digits. Anything else goes on as text, and the
        # registry answers that it is not a whole number.
        if isinstance(params.get(name), str) and re.fullmatch(r"[0-9]{1,18}", params[name].strip()):
            params[name] = int(params[name].strip())
    try:
        block = call(home, "autorecall", {**params, "agent": agent}).data["block"]
    except (MemmeshError, OSError) as exc:
        raise _refusal(exc) from None
    return [UserMessage(block)] if block else []  # nothing relevant: nothing to add to the conversation


def _in_thread(fn: Callable[..., Any]) -> Callable[[Any], Awaitable[Any]]:
    """``fn(arg)`` on a worker thread: the control channel's client blocks."""
    async def run(arg: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, arg)
    return run


# ---------------------------------------------------------------------- resources, and the names a client may ask for
BANKS_URI = "memory://"  # the agent's banks: what list_memory_banks answers
MEMORY_TEMPLATE = "memory://{bank}/{key}"  # one memory; both parts percent-encoded (memory_uri)
PAGE_SIZE = MAX_LIMIT  # memories in one resources/list page at most: one recall's
MAX_OFFSET = MAX_PAGE_DEPTH - PAGE_SIZE  # how deep the pages of one bank go (recall's offset)
JSON = "application/json"
MAX_CURSOR = 2048  # characters: a cursor this server hands out is about a hundred
GIST = 200  # characters of a memory's value its resources/list entry shows (a value may hold 65,536)
# A resource that does not exist, to a client of the initialize handshake (MCP 2025-11-25 and
# before); the 2026-07-28 revision answers -32602 instead (SEP-2164), and the SDK has no constant.
RESOURCE_NOT_FOUND = -32002
# A refusal is the caller's to fix (-32602); these mean serve did not answer (-32603).
SERVE_FAILURES: tuple[type[BaseException], ...] = (ServeError, ServeStartError, HomeBusy, StorageError, OSError)


def memory_uri(bank: str, key: str) -> str:
    """The URI of memory ``key`` of ``bank``. Each part is percent-encoded as UTF-8, every
    character but RFC 3986's unreserved ones ('/' and '%' included, as RFC 6570 expands
    ``{key}``), so any key round-trips exactly through parse_memory_uri."""
    return f"{BANKS_URI}{quote(bank, safe='')}/{quote(key, safe='')}"


class NoSuchResource(LookupError):
    """A URI that names no resource of this server (answered by not_found)."""


def parse_memory_uri(uri: str) -> tuple[str, str]:
    """(bank, key) of a memory's URI; anything else is NoSuchResource."""
    bank, slash, key = uri.removeprefix(BANKS_URI).partition("/")
    if not uri.startswith(BANKS_URI) or not slash or not bank or not key:
        raise NoSuchResource(f"no resource {uri!r}: this server has {BANKS_URI} (the agent's banks) and "
                             f"{MEMORY_TEMPLATE} (a memory; both parts percent-encoded)")
    try:
        return unquote(bank, errors="strict"), unquote(key, errors="strict")
    except UnicodeDecodeError:
        raise NoSuchResource(f"no resource {uri!r}: its percent-encoded bytes are not UTF-8") from None


def not_found(exc: NoSuchResource, uri: str, protocol_version: str | None) -> MCPError:
    """The error MCP gives a resource that does not exist, the URI in data: -32002 in the
    revisions of the initialize handshake (2025-11-25 and before), -32602 from 2026-07-28 on."""
    code = RESOURCE_NOT_FOUND if protocol_version in HANDSHAKE_PROTOCOL_VERSIONS else INVALID_PARAMS
    return MCPError(code, one_line(str(exc)), {"uri": uri})


def _refusal(exc: MemmeshError | OSError, data: dict[str, Any] | None = None) -> MCPError:
    """The registry's one line, as a JSON-RPC error (the line the CLI prints)."""
    line, _ = failure(exc)  # type: ignore[misc]
    return MCPError(INTERNAL_ERROR if isinstance(exc, SERVE_FAILURES) else INVALID_PARAMS, line, data)


class Cursors:
    """resources/list cursors: the bank the next page lists and how many of its newest memories
    the pages before it listed, signed with a key this process
    drew. The client cannot make one up (nor read one: they are opaque), so a cursor that
    fails the check was not handed out by this server (or the server restarted): -32602."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, hashlib.sha256).digest()[:16]

    def make(self, bank: str, offset: int = 0) -> str:
        body = json.dumps({"bank": bank, "offset": offset}).encode()
        return base64.urlsafe_b64encode(self._mac(body) + body).decode().rstrip("=")

    def read(self, cursor: str) -> tuple[str, int]:
        try:
            if len(cursor) > MAX_CURSOR:
                raise ValueError(cursor)
            raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
            mac, body = raw[:16], raw[16:]
            if not hmac.compare_digest(mac, self._mac(body)):
                raise ValueError(cursor)
            fields = json.loads(body)
            bank, offset = fields["bank"], fields["offset"]
            if not isinstance(bank, str) or not isinstance(offset, int) or not 0 <= offset <= MAX_OFFSET:
                raise ValueError(cursor)
        except (binascii.Error, ValueError, KeyError, TypeError):
            raise MCPError(INVALID_PARAMS, "resources/list: the cursor is not one this server gave (or it has "
                                           "restarted since); list again without a cursor") from None
        return bank, offset


class AgentResources:
    """The agent's memory as MCP resources, every read a registry command run through the home's
    serve as the agent (its key opens a bank or does not): ``memory://``, the answer of
    list_memory_banks, and ``memory://BANK/KEY``, one current memory as recall returns it.

    resources/list is paged by bank: the first page holds ``memory://`` and the agent's own
    database's PAGE_SIZE newest memories, each next page the next PAGE_SIZE of that bank (recall's
    ``offset``) and then of the next bank, down to a bank's MAX_OFFSET + PAGE_SIZE newest; older
    ones are read by their URI (the template). Listing and reading count as
    nobody's recall (``no_count``): a client browsing its resources is not the agent using them."""

    def __init__(self, home: Path, agent: str, allowed: set[str]) -> None:
        self.home, self.agent = home, agent
        self.lists_banks = "list_memory_banks" in allowed  # the tools config.yaml lets the agent use
        self.recalls = "recall" in allowed
        self.cursors = Cursors()

    def install(self, server: MCPServer) -> None:
        low = _lowlevel(server)
        low.add_request_handler("resources/list", wire.PaginatedRequestParams, self.list_resources)
        low.add_request_handler("resources/templates/list", wire.PaginatedRequestParams, self.list_templates)
        low.add_request_handler("resources/read", wire.ReadResourceRequestParams, self.read_resource)

    # the registry calls, each on a worker thread (the control channel's client blocks)
    def _banks(self) -> dict[str, Any]:
        return call(self.home, "tool", {"agent": self.agent, "tool": "list_memory_banks", "args": {}}).data

    def _newest(self, bank: str, offset: int = 0) -> list[dict[str, Any]]:
        params = {"agent": self.agent, "bank": bank, "limit": PAGE_SIZE, "offset": offset, "no_count": True}
        return cast(list[dict[str, Any]], call(self.home, "recall", params).data["memories"])

    def _memory(self, bank: str, key: str) -> dict[str, Any]:
        # memory.get reads exactly the key (whatever the bank's size), as recall would show it,
        # and counts no access; a key recall would not show is a resource that does not exist.
        try:
            return cast(dict[str, Any], call(self.home, "memory.get", {"agent": self.agent, "key": key,
                                                                       "bank": bank}).data)
        except UnknownMemory:
            raise NoSuchResource(f"no current memory {key!r} in bank {bank}; resources/list and the recall "
                                 "tool show the memories there") from None

    async def _run(self, fn: Callable[..., Any], *args: Any, data: dict[str, Any] | None = None) -> Any:
        try:
            return await anyio.to_thread.run_sync(partial(fn, *args))
        except (MemmeshError, OSError) as exc:
            raise _refusal(exc, data) from None

    # the handlers
    async def list_resources(self, ctx: Any, params: wire.PaginatedRequestParams | None) -> wire.ListResourcesResult:
        cursor = params.cursor if params is not None else None
        bank, offset = (None, 0) if cursor is None else self.cursors.read(cursor)
        names = ([b["name"] for b in (await self._run(self._banks))["banks"]] if self.lists_banks
                 else [self.agent])  # its own database, which it always reads
        resources: list[wire.Resource] = []
        if bank is None:
            at = 0
            if self.lists_banks:
                resources.append(wire.Resource(
                    uri=BANKS_URI, name="banks", title=f"The memory banks of agent {self.agent}", mime_type=JSON,
                    description="The databases the agent can use (its own first) with its permission on each: "
                                "the list_memory_banks answer."))
        elif bank in names:
            at = names.index(bank)
        else:
            raise MCPError(INVALID_PARAMS, one_line(f"resources/list: agent {self.agent} can no longer read bank "
                                                    f"{bank!r}, where the cursor resumes; list again without a cursor"))
        if not self.recalls or at >= len(names):
            return wire.ListResourcesResult(resources=resources)
        page = await self._run(self._newest, names[at], offset)
        resources += [wire.Resource(uri=memory_uri(names[at], m["key"]), name=m["key"], mime_type=JSON,
                                    description=_gist(m["value"]), annotations=wire.Annotations(last_modified=m["time"]))
                      for m in page]
        # A full page may have more after it (an empty next page then moves on to the next bank).
        following: str | None
        if len(page) == PAGE_SIZE and offset + PAGE_SIZE <= MAX_OFFSET:
            following = self.cursors.make(names[at], offset + PAGE_SIZE)
        else:
            following = self.cursors.make(names[at + 1]) if at + 1 < len(names) else None
        return wire.ListResourcesResult(resources=resources, next_cursor=following)

    async def list_templates(self, ctx: Any, params: wire.PaginatedRequestParams | None
                             ) -> wire.ListResourceTemplatesResult:
        templates = [wire.ResourceTemplate(
            uri_template=MEMORY_TEMPLATE, name="memory", title="A memory", mime_type=JSON,
            description=f"One current memory of a bank agent {self.agent} can read: its value and metadata, as the "
                        "recall tool returns it. bank and key are percent-encoded (UTF-8, '/' as %2F).")]
        _no_cursor(params, "resources/templates/list")
        return wire.ListResourceTemplatesResult(resource_templates=templates if self.recalls else [])

    async def read_resource(self, ctx: Any, params: wire.ReadResourceRequestParams) -> wire.ReadResourceResult:
        uri = params.uri
        try:
            if uri == BANKS_URI:
                data = await self._run(self._banks, data={"uri": uri})
            else:
                bank, key = parse_memory_uri(uri)
                data = await self._run(self._memory, bank, key, data={"uri": uri})
        except NoSuchResource as exc:
            raise not_found(exc, uri, ctx.protocol_version) from None
        return wire.ReadResourceResult(contents=[wire.TextResourceContents(uri=uri, mime_type=JSON,
                                                                           text=json_text(data))])


def _gist(value: str) -> str:
    line = " ".join(value.split())
    return line if len(line) <= GIST else line[:GIST - 3] + "..."


def _lowlevel(server: MCPServer) -> Server[Any]:
    # MCPServer answers every list in one page and has no hook for a cursor, nor for the error an
    # unknown name gets; the SDK's way (its docs/advanced/pagination.md) is a handler on the
    # low-level Server it wraps, whose add_request_handler replaces the one MCPServer registered.
    return server._lowlevel_server


def _no_cursor(params: wire.PaginatedRequestParams | None, method: str) -> None:
    """A list of one page hands out no cursor, so any cursor given is invalid (MCP: -32602)."""
    if params is not None and params.cursor is not None:
        raise MCPError(INVALID_PARAMS, f"{method}: the list has one page and takes no cursor")


def guard_requests(server: MCPServer) -> None:
    """Every bad request is a JSON-RPC error with one line, nothing on stderr. An unknown tool
    or prompt is -32602 naming what there is (MCP's answer for an unknown tool; MCPServer gives
    a tool result, and for a prompt -32603 with a traceback on stderr, or code 0 to a client of
    the handshake protocol); a cursor on a list of one page is -32602; params that fail the
    SDK's request models say which field and why (clear_invalid_params)."""
    low = _lowlevel(server)
    tools_call, prompts_get = low.get_request_handler("tools/call"), low.get_request_handler("prompts/get")
    tools_list, prompts_list = low.get_request_handler("tools/list"), low.get_request_handler("prompts/list")
    assert tools_call and prompts_get and tools_list and prompts_list  # MCPServer registers all four

    async def call_tool(ctx: Any, params: wire.CallToolRequestParams) -> Any:
        names = [t.name for t in await server.list_tools()]
        if params.name not in names:
            raise MCPError(INVALID_PARAMS, one_line(f"unknown tool {params.name!r}; this server has "
                                                    f"{', '.join(names) or 'none'}"))
        return await tools_call.handler(ctx, params)

    async def get_prompt(ctx: Any, params: wire.GetPromptRequestParams) -> Any:
        names = [p.name for p in await server.list_prompts()]
        if params.name not in names:
            raise MCPError(INVALID_PARAMS, one_line(f"unknown prompt {params.name!r}; this server has "
                                                    f"{', '.join(names)}"))
        try:
            return await prompts_get.handler(ctx, params)
        except MCPError:
            raise
        except Exception:  # a bug: its traceback is for the server's log, the client gets one line
            log.exception("prompt %s failed", params.name)
            raise MCPError(INTERNAL_ERROR, f"prompt {params.name} failed; the MCP server's stderr says why") from None

    def one_page(method: str, entry: Any) -> Callable[[Any, wire.PaginatedRequestParams | None], Awaitable[Any]]:
        async def answer(ctx: Any, params: wire.PaginatedRequestParams | None) -> Any:
            _no_cursor(params, method)
            return await entry.handler(ctx, params)
        return answer

    low.add_request_handler("tools/call", wire.CallToolRequestParams, call_tool)
    low.add_request_handler("prompts/get", wire.GetPromptRequestParams, get_prompt)
    low.add_request_handler("tools/list", wire.PaginatedRequestParams, one_page("tools/list", tools_list))
    low.add_request_handler("prompts/list", wire.PaginatedRequestParams, one_page("prompts/list", prompts_list))
    server.middleware.append(clear_invalid_params)


async def clear_invalid_params(ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """Params that fail the SDK's request models get "Invalid request parameters" and nothing
    more; this line says which field and what rule (never the value, which is the caller's)."""
    try:
        return await call_next(ctx)
    except ValidationError as exc:
        # Only the request's own models (GetPromptRequest, ...RequestParams): a handler's bug is not the caller's.
        if ctx.request_id is None or not exc.title.endswith(("Request", "RequestParams")):
            raise
        said = [f"{'.'.join(str(p) for p in e['loc'] if p != 'params') or 'params'}: {e['msg']}"
                for e in exc.errors() if e["loc"] != ("params", "_meta")]  # absent where the protocol needs none
        said = said or [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise MCPError(INVALID_PARAMS, one_line(f"{ctx.method}: {'; '.join(said[:3])}")) from None


def build_server(home: Path, agent: str, allowed: Iterable[str] | None = None) -> MCPServer:
    """The MCP server of ``agent`` in ``home``: its tools (those in ``allowed``, default all)
    and prompt, calling the home's serve."""
    home = Path(home)
    allowed = set(TOOLS if allowed is None else allowed)
    tools: list[Tool] = [
        RegistryTool(fn=_in_thread(partial(_run_tool, home, agent, name)), name=name, title=None,
                     description=spec.description, parameters=spec.args.model_json_schema(),
                     fn_metadata=FuncMetadata(arg_model=ArgModelBase, output_schema=tool_output_schema(name)),
                     is_async=True, context_kwarg=None,
                     annotations=ANNOTATIONS[name])
             for name, spec in TOOLS.items() if name in allowed]
    fields = AutoRecall.model_fields
    prompt = RegistryPrompt(
        name=PROMPT, title="Relevant memories", context_kwarg=None,
        description=f"The '## Relevant Memories' block: what agent {agent} and the banks attached to it remember "
                    "that bears on the last messages (no message when nothing does).",
        arguments=[PromptArgument(name=name, required=fields[name].is_required(),
                                  description=(fields[name].description or "") + LINES.get(name, ""))
                   for name in PROMPT_ARGS],
        fn=_in_thread(partial(_relevant_memories, home, agent)))
    server: MCPServer = MCPServer(
        "memmesh", version=_version(), tools=tools,
        instructions=f"The memory of agent {agent}: remember facts, recall them by words and meaning, "
                     "follow the links between them, and list the memory banks it can use.")
    server.add_prompt(prompt)
    AgentResources(home, agent, allowed).install(server)
    guard_requests(server)
    return server


def _version() -> str:
    try:
        return importlib.metadata.version("memmesh")
    except importlib.metadata.PackageNotFoundError:
        return ""


# ---------------------------------------------------------------------- running it
def prepare(home: Path, agent: str) -> MCPServer:
    """Check the home, make sure its serve runs, check the agent; the server, ready to run."""
    home = Path(home).absolute()  # the detached serve must not depend on our working directory
    if not Home.is_initialised(home):
        raise NotInitialised(f"no memmesh node in {home}; run: memmesh --home {home} init")
    ensure_serve(home)
    # An unknown agent fails here, with the registry's message, rather than on every call. An
    # auto-recall of no messages resolves the agent as every call does, and reads nothing.
    call(home, "autorecall", {"agent": agent, "messages": []})
    return build_server(home, agent, allowed_tools(home, agent))


def allowed_tools(home: Path, agent: str) -> list[str]:
    """The tools config.yaml lets ``agent`` use (all of them when it does not list the agent).
    A client is shown only those; serve checks every call again, so a reload that narrows them
    refuses a listed tool from then on (``tool_not_allowed``)."""
    spec = next((a for a in call(home, "config.show", {}).data.get("agents", []) if a["name"] == agent), None)
    return list(TOOLS) if spec is None else [t for t in TOOLS if t in spec["allowed_tools"]]


def run_stdio(home: Path, agent: str) -> None:
    """Serve MCP on stdin/stdout until the client closes stdin."""
    anyio.run(prepare(home, agent).run_stdio_async)


MCP_MAX_CONNECTIONS = 64  # a local transport for one agent's clients: far fewer than serve's 256


class BearerGuard:
    """The HTTP transport's door: every HTTP request carries ``Authorization: Bearer <the
    content of HOME/api.token>`` (the local HTTP API's token), else 401 and nothing of the
    request reaches the SDK. Anyone who can open a loopback socket could otherwise act as the
    agent: recall its banks, write signed with its key. The SDK's own auth is OAuth, which a
    local node has no server for; this is an ASGI wrapper, so lifespan events pass untouched."""

    def __init__(self, app: Callable[..., Awaitable[None]], token: str) -> None:
        self.app = app
        self._token = token

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Awaitable[Any]],
                       send: Callable[..., Awaitable[None]]) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers") or []
        # The HTTP API's Host rule (node/http_guard.py), before the token: the SDK's own check takes
        # "127.0.0.1:*" as a prefix, so "127.0.0.1:7413@elsewhere" passed it.
        hosts = [v.decode("latin-1") for k, v in headers if k == b"host"]
        server = scope.get("server")
        if len(hosts) != 1 or not host_allowed(hosts[0], tuple(server) if server else None):
            await _refuse(send, 421, "misdirected_request", "the Host header does not name this MCP server; use the "
                                                            "address it listens on (or localhost)")
            return
        given = dict(headers).get(b"authorization", b"").decode("latin-1")
        if bearer_refusal(given, self._token) is None:
            await self.app(scope, receive, send)
            return
        message = ("this MCP server needs the node's token: send Authorization: Bearer <the content of "
                   "HOME/api.token>") if not given else "the bearer token is not this node's (it is in HOME/api.token)"
        await _refuse(send, 401, "unauthorized", message, [(b"www-authenticate", b'Bearer realm="memmesh"')])


async def _refuse(send: Callable[..., Awaitable[None]], status: int, code: str, message: str,
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


def run_http(home: Path, agent: str, listen: str) -> None:
    """Serve MCP over Streamable HTTP on ``listen`` (a loopback address; Mcp checks it)."""
    import uvicorn

    from memmesh.node.binding import bind_listen

    server = prepare(home, agent)
    token = read_token(home)  # serve made it; the agent's tools need it as the HTTP API does
    sock = bind_listen(listen)
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    app = BearerGuard(server.streamable_http_app(host=sock.getsockname()[0]), token)
    print(f"memmesh: MCP for agent {agent} at http://{host}:{port}/mcp (Streamable HTTP)", file=sys.stderr, flush=True)
    # log_config=None: uvicorn's records go to the process's stderr handler; no access log.
    # Bounded like serve's listeners and by the same limits (docs/operations.md, "Connection
    # limits"): at most MCP_MAX_CONNECTIONS connections and tasks at once (503 beyond; a local
    # transport needs few), the keep-alive of serve's listeners; uvicorn times no request head or
    # body, so each is timed as serve's are (node/listeners.py).
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from memmesh.node.conn_limits import Limits
    from memmesh.node.request_timing import timed_protocol

    limits = Limits.from_env()
    config = uvicorn.Config(app, log_config=None, access_log=False, log_level="warning",
                            limit_concurrency=min(MCP_MAX_CONNECTIONS, limits.per_listener or MCP_MAX_CONNECTIONS),
                            timeout_keep_alive=int(limits.keepalive_s),
                            http=timed_protocol(H11Protocol, limits, "mcp"))
    with sock:
        anyio.run(partial(uvicorn.Server(config).serve, sockets=[sock]))
