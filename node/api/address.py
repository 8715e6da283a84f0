"""Where the local HTTP API listens: ``serve --api-listen`` if given, else config.yaml's
``api.listen`` (default 127.0.0.1:7412); ``off`` serves no API.

Loopback only unless config.yaml says ``api.allow_remote: true``: the token is the only guard,
and it travels in clear over plain HTTP, so reaching the API from another machine is a choice
made in the node's own config file, never by a flag alone.
"""
from __future__ import annotations

import ipaddress

from memmesh.node.control import ServeError
from memmesh.node.listen import OFF, parse_listen
from memmesh.node.settings import ApiSpec


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: where it points is not ours to know
        return False


def api_listen(flag: str | None, spec: ApiSpec) -> str | None:
    """The API's ``HOST:PORT``, or None when it is off."""
    listen, source = (flag, "--api-listen") if flag is not None else (spec.listen, "api.listen in config.yaml")
    if listen == OFF:
        return None
    try:
        host, _ = parse_listen(listen)
    except ValueError as exc:
        raise ServeError(f"serve: {source} {exc} (got {listen!r})") from None
    if not spec.allow_remote and not is_loopback(host):
        raise ServeError(f"serve: the HTTP API would listen on {listen}, which is not a loopback address; "
                         "set api.allow_remote: true in config.yaml to allow it, or use --api-listen 127.0.0.1:PORT")
    return listen
