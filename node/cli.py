"""The `memmesh` command line: parse, run the command through the registry, render.

Human output by default, ``--json`` for scripts. Any error is one line on stderr and a
non-zero exit code (1 for a refused operation, 2 for a usage error).

Where a command runs: while ``memmesh serve`` runs for the home, every other command goes
through serve's control channel (node/control.py) and is rendered here exactly as if it had
run in this process; otherwise the command opens the home itself (node/dispatch.py).

It answers at once: parsing needs only the commands' generated description
(node/commands/cli_table.py), and a command that serve runs is sent as parsed, serve validating
it, so neither imports pydantic, the handlers or the node. They load when the command runs here.
The runners of the commands whose handler is a transport (serve, mcp) are this module's: it is
the floor that may import the transports.
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memmesh.auth.errors import MemmeshError
from memmesh.node.cli_args import build_parser, command_of, commands
from memmesh.node.command_result import Result, json_text
from memmesh.node.home_dir import default_home
from memmesh.node.refusal import failure

if TYPE_CHECKING:
    from memmesh.node.commands.mcp import Mcp
    from memmesh.node.commands.registry import Event, EventSink
    from memmesh.node.commands.serving import Serve
    from memmesh.node.library import Node

EITHER = "either"  # node.commands.registry.EITHER: may go through serve (not imported: this stays light)


class ProgressBars:
    """Progress events drawn as tqdm bars on stderr, one per bank; nothing when stderr is not a
    terminal (tqdm's ``disable=None``)."""

    def __init__(self) -> None:
        self._bar: Any = None
        self._label: Any = None

    def __call__(self, event: Event) -> None:
        if event.get("event") != "progress":
            return
        from tqdm import tqdm  # only a command that reports progress pays for the import

        label = event.get("bank")
        if self._bar is None or label != self._label:
            self.close()
            self._bar = tqdm(total=event["total"], unit=event.get("unit", "memory"), desc=label, file=sys.stderr,
                             disable=None)
            self._label = label
        self._bar.update(event["done"] - self._bar.n)
        if event["done"] >= event["total"]:
            self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


# Control characters but line break and tab (C0, DEL, C1): what a memory's key or value holds
# is text anyone with Write on a shared bank chose, and ESC, CSI or OSC sequences printed raw
# would drive the reader's terminal (move the cursor, rewrite lines, set its title).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """``text`` with every control character but line break and tab shown as its escape."""
    return _CONTROL.sub(lambda m: repr(m.group(0))[1:-1], text)


def _json_safe(text: str) -> str:
    # JSON escapes C0 itself; DEL and C1 pass raw with ensure_ascii=False. They occur in strings only.
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


def _render(result: Result, as_json: bool) -> None:
    if as_json:
        print(_json_safe(json_text(result.data)))
    elif result.text:
        print(terminal_safe(result.text))
    for w in result.warnings:
        print(f"warning: {terminal_safe(w)}", file=sys.stderr)


def _serve(node: Node, p: Serve) -> Result:
    from memmesh.node.serve import serve_node  # the transport, imported only by the command that is one

    return serve_node(node, listen=p.listen, discovery=False if p.no_discovery else None, log_json=p.log_json,
                      interval_s=p.interval_s, fanout=p.fanout, advertise=p.advertise, api_listen=p.api_listen)


def _mcp(home: Path, p: Mcp) -> Result:
    from memmesh.node.commands.mcp import DEFAULT_HTTP_PORT, McpNotInstalled

    try:
        from memmesh.node import mcp_server
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "mcp":
            raise
        raise McpNotInstalled("memmesh mcp needs the mcp extra: pip install 'memmesh[mcp]'") from None
    if p.http:
        mcp_server.run_http(home, p.agent, p.listen or f"127.0.0.1:{DEFAULT_HTTP_PORT}")
    else:
        mcp_server.run_stdio(home, p.agent)
    return Result({"agent": p.agent}, "")


# The commands whose handler is a transport, declared without one in node/commands.
RUNNERS: dict[str, Callable[..., Result]] = {"serve": _serve, "mcp": _mcp}


def run_command(home: Path, name: str, params: dict[str, Any], events: EventSink | None = None) -> Result:
    """Run one command for ``home``: through serve when it runs there, else in this process
    (node/dispatch.py), with this module's runners for the transports."""
    import logging

    from memmesh.node.dispatch import run_command as dispatch

    # Only a command that runs here logs (a command sent to serve logs nothing of its own).
    logging.basicConfig(level=logging.ERROR, format="memmesh: %(message)s")
    return dispatch(home, name, params, events, RUNNERS)


def _run(home: Path, name: str, params: dict[str, Any], events: EventSink) -> Result:
    """node/dispatch.py's first step, before it imports the models: a command that may go
    through serve is sent as it is when serve answers (serve validates it, and refuses it in the
    words this process would); otherwise dispatch validates it and runs it."""
    if commands()[name]["runs"] == EITHER:
        from memmesh.node.control import remote

        client = remote(home)
        if client is not None:
            with client:
                return client.run(name, params, events=events)
    return run_command(home, name, params, events)


def main(argv: Sequence[str] | None = None) -> int:
    # Whatever memmesh creates (a home's files, SQLite's -wal and -shm, logs, backups) is its
    # user's alone, whatever the shell's umask; files that must be shared are none.
    os.umask(0o077)
    args = build_parser(lazy=True).parse_args(argv)
    home = getattr(args, "home", None) or default_home()
    bars = ProgressBars()
    try:
        name, params = command_of(args)
        result = _run(home, name, params, bars)
    except (MemmeshError, OSError) as exc:
        line, code = failure(exc)  # type: ignore[misc]
        if getattr(args, "log_json", False):  # serve --log-json: its log stays one JSON object a line
            from memmesh.node.control import json_log_line

            print(json_log_line("error", "error", message=line, exit=code), file=sys.stderr)
        else:
            print(f"memmesh: error: {line}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return 130
    finally:
        bars.close()
    try:
        _render(result, getattr(args, "json", False))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (e.g. `| grep -q`): not an error of ours. Point stdout at
        # /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
