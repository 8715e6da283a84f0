"""The `memmesh` command line: parse, call a handler in node.commands, render.

Human output by default, ``--json`` for scripts. Any error is one line on stderr and a
non-zero exit code (1 for a refused operation, 2 for a usage error).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from auth.errors import MemmeshError
from node import commands
from node.home import Node, default_home


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memmesh", description="A peer-to-peer replicated memory node for AI agents.")
    p.add_argument("--home", type=Path, default=None,
                   help="node home directory (default: $MEMMESH_HOME or the per-user data directory)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("init", help="create the node: peer key and data directory")
    st = sub.add_parser("status", help="peer key and hosted databases")
    st.add_argument("--json", action="store_true", dest="json_sub", help="print JSON")
    return p


def _render(result: commands.Result, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result.data, indent=2, sort_keys=True, ensure_ascii=False))
    else:
        print(result.text)
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    home = args.home or default_home()
    as_json = args.json or getattr(args, "json_sub", False)
    try:
        if args.command == "init":
            result = commands.init(home)
        else:
            with Node.open(home) as node:
                result = commands.status(node)
    except MemmeshError as exc:
        print(f"memmesh: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the file system refused: say which file and why
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"memmesh: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    _render(result, as_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
