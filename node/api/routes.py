"""The API's routes, derived from the command registry when the app is built.

Each command declares its route (``Command.http``, node/commands/registry.py), so a new command
gets its route and OpenAPI entry with no code here. The rule it follows unless it declares
another (docs/api.md):

* What an agent does in a conversation goes under ``/v1/agents/{agent}/``: each tool of the
  catalogue (node/catalogue.py) is ``POST /v1/agents/{agent}/tools/<tool>`` (the body is the
  tool's arguments), ``autorecall`` is ``POST /v1/agents/{agent}/autorecall`` and the chat line
  ``command`` is ``POST /v1/agents/{agent}/command`` (the body is the rest of the parameters).
* Every other command is ``/v1/<name with . as />``: ``GET`` when it is marked read-only and
  takes no parameters (status, peers, memory.list, ...), ``POST`` with a JSON body otherwise.
* Not routed (no route declared): ``serve`` and ``init`` (serve is what runs; the home exists),
  the operator shortcuts ``remember``, ``recall`` and ``forget`` (the tool routes are the one way), and
  standalone commands (transports of their own, such as ``mcp``).

A path value goes into the parameters; a body that names a path parameter is refused (its
schema has none). A path parameter ``{tool}`` stands for each tool: one route per tool, whose
body is that tool's arguments.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memmesh.node.commands.params import Params, ParamsError
from memmesh.node.commands.registry import API_PREFIX, Command, Registry
from memmesh.node.commands.tools import TOOLS

PREFIX = API_PREFIX
OPENAPI_PATH = f"{PREFIX}/openapi.json"
TOOL = "{tool}"  # the path parameter that stands for each tool: one route per tool


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
        # The path gives its parameters and the body the rest, on every route: the body's schema
        # (OpenAPI, and MCP's for a tool) has no path parameter, so one in the body is refused.
        given = [name for name in self.path_params if name in body]
        if given:
            what = self.fixed.get("tool", self.command.name)
            raise ParamsError(f"{what}: the path gives {given[0]}, so leave {given[0]} out of the body")
        if self.wrap is not None:
            params[self.wrap] = body  # a tool's body is its arguments
        else:
            params.update(body)
        params.update({name: path_values[name] for name in self.path_params})
        return params


def build_routes(registry: Registry | None = None) -> list[Route]:
    if registry is None:
        from memmesh.node.commands import load

        registry = load()
    routes: list[Route] = []
    for cmd in registry:
        if cmd.http is not None:
            routes.extend(_routes_of(cmd, *cmd.http))
    seen: set[tuple[str, str]] = set()
    for r in routes:
        if (r.method, r.path) in seen or r.path == OPENAPI_PATH:
            raise ValueError(f"two routes would be {r.method} {r.path}")
        seen.add((r.method, r.path))
    return routes


def _routes_of(cmd: Command, method: str, path: str) -> Iterable[Route]:
    path_params = tuple(p for p in re.findall(r"\{(\w+)\}", path) if p != TOOL[1:-1])
    if TOOL in path:
        for name, tool in TOOLS.items():
            yield Route(method, path.replace(TOOL, name), cmd, tool.args, path_params, {"tool": name}, "args",
                        f"tool_{name}", tool.description)
        return
    body = None if method == "GET" else cmd.params
    yield Route(method, path, cmd, body, path_params, operation_id=_operation_id(cmd.name), summary=cmd.help)


def _operation_id(name: str) -> str:
    return name.replace(".", "_")
