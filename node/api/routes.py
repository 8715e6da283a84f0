"""The API's routes, derived from the command registry when the app is built.

The rule (docs/api.md), so a new command gets its route and OpenAPI entry with no code here:

* What an agent does in a conversation goes under ``/v1/agents/{agent}/``: each tool of
  node/commands/tools.TOOLS is ``POST /v1/agents/{agent}/tools/<tool>`` (the body is the tool's
  arguments), ``autorecall`` is ``POST /v1/agents/{agent}/autorecall`` and the chat line
  ``command`` is ``POST /v1/agents/{agent}/command`` (the body is the rest of the parameters).
* Every other command is ``/v1/<name with . as />``: ``GET`` when it is marked read-only and
  takes no parameters (status, peers, memory.list, ...), ``POST`` with a JSON body otherwise.
* Not routed: ``serve`` and ``init`` (serve is what runs; the home exists), the operator
  shortcuts ``remember`` and ``recall`` (the tool routes are the one way), and standalone
  commands (transports of their own, such as ``mcp``).

A path value goes into the parameters; a body that names the same parameter with another
value is refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from memmesh.node.commands import REGISTRY
from memmesh.node.commands.params import Params, ParamsError
from memmesh.node.commands.registry import Command, Registry
from memmesh.node.commands.tools import TOOLS

PREFIX = "/v1"
OPENAPI_PATH = f"{PREFIX}/openapi.json"
NOT_ROUTED = frozenset({"serve", "init", "remember", "recall"})
# Commands an agent runs in a conversation: their path under /v1/agents/{agent}/.
AGENT_PATHS = {"autorecall": "autorecall", "command": "command"}
TOOL_COMMAND = "tool"


@dataclass(frozen=True)
class Route:
    method: str  # "GET" or "POST"
    path: str  # an aiohttp and OpenAPI path template: /v1/agents/{agent}/tools/recall
    command: Command
    body: type[Params] | None  # the model a POST body is validated by (None: GET, no body)
    path_params: tuple[str, ...] = ()
    fixed: Mapping[str, Any] = field(default_factory=dict)  # parameters the route itself gives
    wrap: str | None = None  # the body goes into this one parameter (a tool's ``args``)
    operation_id: str = ""
    summary: str = ""

    def params(self, path_values: Mapping[str, str], body: dict[str, Any]) -> dict[str, Any]:
        """The command's parameters: what the route fixes, the path's values, the body."""
        params: dict[str, Any] = dict(self.fixed)
        if self.wrap is not None:
            params[self.wrap] = body
        else:
            for name in self.path_params:
                if name in body and body[name] != path_values[name]:
                    raise ParamsError(f"{self.command.name}: the path names {name} {path_values[name]!r} and the "
                                      f"body {body[name]!r}; leave {name} out of the body")
            params.update(body)
        params.update({name: path_values[name] for name in self.path_params})
        return params


def build_routes(registry: Registry = REGISTRY) -> list[Route]:
    routes: list[Route] = []
    for cmd in registry:
        if cmd.name in NOT_ROUTED or getattr(cmd, "standalone", False):
            continue
        routes.extend(_routes_of(cmd))
    seen: set[tuple[str, str]] = set()
    for r in routes:
        if (r.method, r.path) in seen or r.path == OPENAPI_PATH:
            raise ValueError(f"two routes would be {r.method} {r.path}")
        seen.add((r.method, r.path))
    return routes


def _routes_of(cmd: Command) -> Iterable[Route]:
    agent_base = f"{PREFIX}/agents/{{agent}}"
    if cmd.name == TOOL_COMMAND:
        for name, tool in TOOLS.items():
            yield Route("POST", f"{agent_base}/tools/{name}", cmd, tool.args, ("agent",), {"tool": name}, "args",
                        f"tool_{name}", tool.description)
        return
    if cmd.name in AGENT_PATHS:
        yield Route("POST", f"{agent_base}/{AGENT_PATHS[cmd.name]}", cmd, cmd.params, ("agent",),
                    operation_id=_operation_id(cmd.name), summary=cmd.help)
        return
    path = f"{PREFIX}/{cmd.name.replace('.', '/')}"
    if getattr(cmd, "read_only", False) and not cmd.params.model_fields:
        yield Route("GET", path, cmd, None, operation_id=_operation_id(cmd.name), summary=cmd.help)
    else:
        yield Route("POST", path, cmd, cmd.params, operation_id=_operation_id(cmd.name), summary=cmd.help)


def _operation_id(name: str) -> str:
    return name.replace(".", "_")
