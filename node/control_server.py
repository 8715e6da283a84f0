"""The serve side of the control channel (the client and the protocol are in node/control.py,
its socket in node/binding.py): the routes that run each command on the database thread and
stream its events as NDJSON lines, then its Result. The HTTP API runs commands through the
same CommandRunner.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from memmesh.auth.errors import MemmeshError
from memmesh.node.commands import REGISTRY, Result
from memmesh.node.commands.registry import Event, Registry
from memmesh.node.control import AlreadyServing
from memmesh.node.refusal import failure
from memmesh.node.serve_log import ACCESS_BURST, event, log
from memmesh.node.sync.messages import MAX_BODY_BYTES
from memmesh.node.worker import DbThread

if TYPE_CHECKING:
    from memmesh.node.library import Node

__all__ = ["CommandRunner", "ControlChannel", "error_line"]


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
    cls = type(exc)
    line: dict[str, Any] = {"ok": False, "error": cls.__name__, "type": f"{cls.__module__}.{cls.__qualname__}"}
    mapped = failure(exc)
    if mapped is None:
        event("control.error", logging.ERROR, exc_info=(cls, exc, exc.__traceback__), op=name)
        line.update(message=f"serve failed running {name}: {cls.__name__}: {exc} (serve's log has the details)",
                    exit=1)
        return line
    line["message"], line["exit"] = mapped
    if isinstance(exc, OSError) and not isinstance(exc, MemmeshError):
        line.update(errno=exc.errno, strerror=exc.strerror, filename=exc.filename)
    return line
