"""serve: run the node in the foreground (sync API, daemon, control channel) until a signal.

A command whose handler is a transport: its model and policy are declared here like every
other command's (so the CLI derives it from one model), and the runner, which hands the open
node to node/serve.py, is the CLI's (node/cli.py), the transport floor that may import serve.
This package never imports a transport.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from memmesh.node.commands.params import Cli, Params
from memmesh.node.commands.registry import HERE, REGISTRY
from memmesh.node.listen import DEFAULT_HOST, DEFAULT_PORT, check_listen, check_listen_or_off


class Serve(Params):
    # Not given (None): config.yaml's sync section says, else the built-in default (node/serve_config.py).
    listen: Annotated[str | None, Cli(metavar="HOST:PORT"), Field(
        description="where the sync API listens (port 0: any free port); default: sync.listen in config.yaml, "
                    f"else {DEFAULT_HOST}:{DEFAULT_PORT}")] = None
    advertise: Annotated[str | None, Cli(metavar="http:HOST:PORT"), Field(
        description="the address peers are told to reach this node at (default: the listen address); "
                    "needed when listening on 0.0.0.0 or behind a proxy")] = None
    no_discovery: Annotated[bool, Field(description="do not announce this node or look for peers on the LAN "
                                                    "(default: sync.discovery in config.yaml, else on)")] = False
    log_json: Annotated[bool, Field(description="log one JSON object per line instead of text")] = False
    interval_s: Annotated[float | None, Cli(flag="--interval", metavar="SECONDS"), Field(
        gt=0, le=86400, description="how often each shared database is pulled from its peers, in seconds "
                                    "(default: sync.interval_s in config.yaml, else 5)")] = None
    fanout: Annotated[int | None, Cli(metavar="N"), Field(
        ge=1, le=64, description="how many peers each database syncs with per round "
                                 "(default: sync.fanout in config.yaml, else 3)")] = None
    api_listen: Annotated[str | None, Cli(metavar="HOST:PORT"), Field(
        description="where the local HTTP API listens (loopback only unless config.yaml's api.allow_remote), "
                    "or off; default: api.listen in config.yaml, else 127.0.0.1:7412")] = None

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        return check_listen(value)

    @field_validator("api_listen")
    @classmethod
    def _api_listen(cls, value: str | None) -> str | None:
        return check_listen_or_off(value)

    @field_validator("advertise")
    @classmethod
    def _advertise(cls, value: str | None) -> str | None:
        if value is not None:
            from memmesh.tickets import parse_address

            try:
                parse_address(value)
            except Exception:
                raise ValueError(f"an address looks like http:HOST:PORT, got {value!r}") from None
        return value


# Never sent to serve (it is serve; it refuses to start when one runs), never routed (it is what runs).
REGISTRY.declare("serve", Serve, "run the node: the sync API for peers, the sync daemon, and the channel other "
                 "commands use", runs=HERE, http=None)
