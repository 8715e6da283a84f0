"""The `memmesh` command line: parse, call a handler in node.commands, render.

Human output by default, ``--json`` for scripts. Any error is one line on stderr and a
non-zero exit code (1 for a refused operation, 2 for a usage error).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from auth.errors import MemmeshError


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print machine-readable JSON")

    p = argparse.ArgumentParser(prog="memmesh", description="A peer-to-peer replicated memory node for AI agents.",
                                parents=[common])
    p.add_argument("--home", type=Path, default=None,
                   help="node home directory (default: $MEMMESH_HOME or the per-user data directory)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(parent: Any, name: str, help: str) -> argparse.ArgumentParser:
        return parent.add_parser(name, help=help, parents=[common], description=help)

    add(sub, "init", "create the node: peer key and data directory")
    add(sub, "status", "peer key and hosted databases")

    agent = add(sub, "agent", "create and list agents").add_subparsers(dest="action", required=True, metavar="ACTION")
    add(agent, "new", "create an agent with its own key and database").add_argument("name")
    add(agent, "list", "list the agents of this node")

    t = add(sub, "tool", "run an agent tool: remember, recall or list_memory_banks")
    t.add_argument("agent")
    t.add_argument("tool", choices=["remember", "recall", "list_memory_banks"])
    t.add_argument("args", nargs="?", default="{}", help="the tool's arguments as a JSON object")

    r = add(sub, "remember", "store a memory (shortcut for the remember tool)")
    r.add_argument("agent")
    r.add_argument("key")
    r.add_argument("value")
    r.add_argument("--tag", action="append", default=[], dest="tags")
    r.add_argument("--bank")

    q = add(sub, "recall", "search memories (shortcut for the recall tool)")
    q.add_argument("agent")
    q.add_argument("query", nargs="?", default="")
    q.add_argument("--tag", action="append", default=[], dest="tags")
    q.add_argument("--limit", type=int, default=10)
    q.add_argument("--bank")
    q.add_argument("--all", action="store_true", dest="include_superseded",
                   help="also list rows superseded by a newer row for the same key")

    a = add(sub, "autorecall", "print the Relevant Memories block for the last messages")
    a.add_argument("agent")
    a.add_argument("messages", nargs="+", metavar="MESSAGE")
    a.add_argument("--session")

    e = add(sub, "embedder", "choose the embedder used for semantic recall").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    es = add(e, "set", "set the node's embedder")
    es.add_argument("provider", choices=["none", "hashed", "local", "openai", "ollama"])
    es.add_argument("--model")
    es.add_argument("--api-base", dest="api_base")
    es.add_argument("--api-key-env", dest="api_key_env", metavar="VAR",
                    help="read the API key from this environment variable (stored peer-local, never synced)")
    es.add_argument("--timeout", type=float, dest="timeout_s")
    es.add_argument("--dim", type=int)
    add(e, "show", "show the node's embedder")

    m = add(sub, "memory", "memory banks: new, list, delete, grant, revoke, attach, detach, config, reindex")
    ms = m.add_subparsers(dest="action", required=True, metavar="ACTION")
    mn = add(ms, "new", "create a bank")
    mn.add_argument("name")
    mn.add_argument("description", nargs="?", default="")
    add(ms, "list", "list banks")
    add(ms, "delete", "unregister a bank (its data is kept as an archive)").add_argument("ref")
    mg = add(ms, "grant", "let an agent read or write a bank (or another agent's database)")
    mg.add_argument("bank")
    mg.add_argument("agent")
    mg.add_argument("perm", choices=["read", "write"])
    mr = add(ms, "revoke", "revoke an agent's access to a bank")
    mr.add_argument("bank")
    mr.add_argument("agent")
    for verb in ("attach", "detach"):
        mx = add(ms, verb, f"{verb} a bank for an agent's auto-recall")
        mx.add_argument("bank")
        mx.add_argument("--agent", required=True)
        mx.add_argument("--session")
    mc = add(ms, "config", "show, set or reset an agent's memory config")
    mc.add_argument("agent")
    mc.add_argument("config_action", choices=["show", "set", "reset"])
    mc.add_argument("key", nargs="?")
    mc.add_argument("value", nargs="?")
    add(ms, "reindex", "backfill vectors for the active embedder").add_argument("bank", nargs="?")
    return p


def _run(args: argparse.Namespace, home: Path):
    from node import commands
    from node.library import Node

    if args.command == "init":
        return commands.init(home)
    node = Node.open(home, create=False)
    try:
        return _dispatch(commands, node, args)
    finally:
        node.close()


def _dispatch(commands: Any, node: Any, args: argparse.Namespace):
    cmd, action = args.command, getattr(args, "action", None)
    if cmd == "status":
        return commands.status(node)
    if cmd == "agent":
        return commands.agent_new(node, args.name) if action == "new" else commands.agent_list(node)
    if cmd == "tool":
        try:
            tool_args = json.loads(args.args)
        except json.JSONDecodeError as exc:
            raise MemmeshError(f"tool arguments are not valid JSON: {exc.msg} at position {exc.pos}") from None
        result = commands.tool(node, args.agent, args.tool, tool_args)
        args.json = True  # a tool's result is JSON
        return result
    if cmd == "remember":
        return commands.tool(node, args.agent, "remember",
                             {"key": args.key, "value": args.value, "tags": args.tags, "bank": args.bank})
    if cmd == "recall":
        return commands.recall(node, args.agent, args.query, args.tags, args.limit, args.bank,
                               include_superseded=args.include_superseded)
    if cmd == "autorecall":
        return commands.autorecall(node, args.agent, args.messages, args.session)
    if cmd == "embedder":
        if action == "show":
            return commands.embedder_show(node)
        api_key = None
        if args.api_key_env:
            api_key = os.environ.get(args.api_key_env)
            if api_key is None:
                raise MemmeshError(f"environment variable {args.api_key_env} is not set")
        return commands.embedder_set(node, args.provider, args.model, args.api_base, api_key, args.timeout_s, args.dim)
    # memory ...
    if action == "new":
        return commands.memory_new(node, args.name, args.description)
    if action == "list":
        return commands.memory_list(node)
    if action == "delete":
        return commands.memory_delete(node, args.ref)
    if action == "grant":
        return commands.memory_grant(node, args.bank, args.agent, args.perm)
    if action == "revoke":
        return commands.memory_revoke(node, args.bank, args.agent)
    if action in ("attach", "detach"):
        return commands.memory_attach(node, args.bank, args.agent, args.session, attach=action == "attach")
    if action == "config":
        return commands.memory_config(node, args.agent, args.config_action, args.key, args.value)
    return commands.memory_reindex(node, args.bank, progress=_progress_bar())


def _progress_bar():
    """A progress bar on stderr for long work (tqdm); silent when stderr is not a terminal."""
    from tqdm import tqdm

    bar: dict[str, Any] = {}

    def update(done: int, total: int) -> None:
        if "bar" not in bar:
            bar["bar"] = tqdm(total=total, unit="memory", file=sys.stderr, disable=None)
        b = bar["bar"]
        b.update(done - b.n)
        if done >= total:
            b.close()

    return update


def _render(result: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result.data, indent=2, sort_keys=True, ensure_ascii=False))
    elif result.text:
        print(result.text)
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="memmesh: %(message)s")
    from node.home import default_home

    home = args.home or default_home()
    try:
        result = _run(args, home)
    except MemmeshError as exc:
        print(f"memmesh: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the file system refused: say which file and why
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"memmesh: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    try:
        _render(result, getattr(args, "json", False))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (e.g. `| grep -q`): not an error of ours. Point stdout at
        # /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
