"""`memmesh mcp`: the Model Context Protocol server of one agent (docs/mcp.md).

    memmesh --home HOME mcp --agent alpha                                # stdio, as clients spawn it
    memmesh --home HOME mcp --agent alpha --http --listen 127.0.0.1:7413  # Streamable HTTP, loopback

Over HTTP every request carries the node's API token (``Authorization: Bearer`` and the content
of HOME/api.token, as for the HTTP API; ``BearerGuard``); stdio needs none (the client spawned
this process as the home's user).

It publishes the agent tools of the catalogue (node/catalogue.py: remember, recall,
list_memory_banks, neighbors, forget; their argument models are node/commands/tools.TOOLS) and the
auto-recall block as the prompt ``relevant_memories``, with the official SDK's ``MCPServer``.
It is a transport and nothing more: every call is a registry command (``tool``, ``autorecall``)
run by ``node.dispatch.run_command`` through the home's running serve. MCP clients each spawn
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

import contextlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.to_thread
from mcp.server.mcpserver import MCPServer, UserMessage
from mcp.server.mcpserver.exceptions import UnexpectedToolError
from mcp.server.mcpserver.prompts import Prompt
from mcp.server.mcpserver.prompts.base import Message, PromptArgument
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, INVALID_PARAMS, CallToolResult, TextContent, ToolAnnotations

from memmesh.auth.errors import MemmeshError
from memmesh.node.api_token import read_token
from memmesh.node.catalogue import CATALOGUE, ToolSpec
from memmesh.node.command_result import Result
from memmesh.node.commands.tools import TOOLS, AutoRecall
from memmesh.node.control import POLL_S, remote, route
from memmesh.node.dispatch import run_command
from memmesh.node.home import Home, NotInitialised, flock_within
from memmesh.node.http_guard import bearer_refusal, host_allowed
from memmesh.node.refusal import ParamsError, failure

PROMPT = "relevant_memories"
SERVE_LOG = "serve.log"  # where a serve started here writes (appended: one file per home)
SPAWN_LOCK = "serve.spawn.lock"  # held while one `memmesh mcp` starts serve for the home
START_TIMEOUT_S = 30.0  # a cold interpreter importing memmesh on a loaded machine



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
        line, _ = failure(exc)  # type: ignore[misc]
        raise MCPError(INVALID_PARAMS if isinstance(exc, ParamsError) else INTERNAL_ERROR, line) from None
    return [UserMessage(block)] if block else []  # nothing relevant: nothing to add to the conversation


def _in_thread(fn: Callable[..., Any]) -> Callable[[Any], Awaitable[Any]]:
    """``fn(arg)`` on a worker thread: the control channel's client blocks."""
    async def run(arg: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, arg)
    return run


def build_server(home: Path, agent: str, allowed: Iterable[str] | None = None) -> MCPServer:
    """The MCP server of ``agent`` in ``home``: its tools (those in ``allowed``, default all)
    and prompt, calling the home's serve."""
    home = Path(home)
    allowed = set(TOOLS if allowed is None else allowed)
    tools: list[Tool] = [
        RegistryTool(fn=_in_thread(partial(_run_tool, home, agent, name)), name=name, title=None,
                     description=spec.description, parameters=spec.args.model_json_schema(),
                     fn_metadata=FuncMetadata(arg_model=ArgModelBase), is_async=True, context_kwarg=None,
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
