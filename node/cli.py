"""The `memmesh` command line: parse, run the command through the registry, render.

Human output by default, ``--json`` for scripts. Any error is one line on stderr and a
non-zero exit code (1 for a refused operation, 2 for a usage error).

Where a command runs: while ``memmesh serve`` runs for the home, every other command goes
through serve's control channel (node/control.py) and is rendered here exactly as if it had
run in this process; otherwise the command opens the home itself (``run_in_home``).
"""
from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from memmesh.auth.errors import MemmeshError
from memmesh.node.cli_args import build_parser, command_of
from memmesh.node.commands import Result, json_text
from memmesh.node.commands.registry import Event
from memmesh.node.refusal import failure


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


SERVE = "serve"  # the one command that never goes through serve


def run_command(home: Path, name: str, params: dict[str, Any], events: Any = None) -> Result:
    """Run one command for ``home``: through serve when it runs there, else in this process.

    The parameters are checked first, so a refused command never waits for the home."""
    from memmesh.node.commands import REGISTRY
    from memmesh.node.control import refuse_if_serving, route

    cmd = REGISTRY.get(name)
    parsed = cmd.parse(params)
    if cmd.standalone:  # a transport of its own on the home's path (mcp): never sent to serve
        return cmd.handler(home, parsed)
    client = None
    if name == SERVE:
        refuse_if_serving(home, log_json=bool(getattr(parsed, "log_json", False)))
    else:
        client = route(home)
    if client is None:
        from memmesh.node.library import run_in_home

        return run_in_home(home, name, params, events=events)
    with client:
        return client.run(name, params, events=events)


def main(argv: Sequence[str] | None = None) -> int:
    # Whatever memmesh creates (a home's files, SQLite's -wal and -shm, logs, backups) is its
    # user's alone, whatever the shell's umask; files that must be shared are none.
    os.umask(0o077)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="memmesh: %(message)s")
    from memmesh.node.home import default_home

    home = getattr(args, "home", None) or default_home()
    bars = ProgressBars()
    try:
        name, params = command_of(args)
        result = run_command(home, name, params, events=bars)
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
