"""mcp: serve one agent's tools to an MCP client, over stdio (or Streamable HTTP on loopback,
where every request needs the node's API token, HOME/api.token, as a bearer token).

A *standalone* command: a transport that runs in the caller's process on the home's path. It
never opens the node and is never sent to serve; every call it makes goes through the home's
running serve (node/mcp_server.py starts one when none runs). Its handler takes the home, not
a node. Its runner is the CLI's (node/cli.py), which imports node/mcp_server.py and the MCP SDK
only when it runs, so no other command pays for them and this package imports no transport.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from memmesh.auth.errors import MemmeshError
from memmesh.node.commands.params import Cli, Params
from memmesh.node.commands.registry import REGISTRY
from memmesh.node.listen import parse_listen

DEFAULT_HTTP_PORT = 7413  # beside the sync API (7411) and the local HTTP API (7412)
# The hosts for which the SDK turns on its DNS-rebinding protection (allowed Host/Origin).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class McpNotInstalled(MemmeshError):
    """The optional MCP SDK is not installed."""


class Mcp(Params):
    agent: Annotated[str, Cli(flag="--agent"), Field(description="the agent whose tools the MCP client gets")]
    http: Annotated[bool, Field(
        description="serve the Streamable HTTP transport on --listen instead of stdio")] = False
    listen: Annotated[str | None, Cli(metavar="HOST:PORT"), Field(
        description=f"with --http: where to listen, loopback only (port 0: any free port); "
                    f"default 127.0.0.1:{DEFAULT_HTTP_PORT}")] = None

    @field_validator("listen")
    @classmethod
    def _loopback(cls, value: str | None) -> str | None:
        if value is not None:
            host, _ = parse_listen(value)
            if host not in LOOPBACK_HOSTS:
                # Its bearer token travels in clear over plain HTTP: never off this machine.
                raise ValueError("should be a loopback address (127.0.0.1, localhost or [::1]): "
                                 "the MCP transport's token travels in clear over plain HTTP")
        return value

    @model_validator(mode="after")
    def _listen_needs_http(self) -> Mcp:
        if self.listen is not None and not self.http:
            raise ValueError("listen is for the HTTP transport: add --http (stdio needs no address)")
        return self


REGISTRY.declare("mcp", Mcp, "serve an agent's tools and auto-recall prompt to an MCP client (stdio, or --http)",
                 standalone=True)
