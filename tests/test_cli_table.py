"""The CLI answers at once: its description of the commands cannot drift from the models, and
parsing, `--help` and the control channel's client import neither pydantic nor the node."""
from __future__ import annotations

import json
import subprocess
import sys

from memmesh.node.cli_args import build_parser, command_of
from memmesh.node.commands import REGISTRY
from memmesh.node.commands.describe import TABLE_FILE, describe, table_source
from memmesh.node.commands.registry import EITHER, HERE

HEAVY = ("pydantic", "aiohttp", "numpy", "memmesh.node.commands.registry", "memmesh.node.home")


def test_the_generated_description_is_the_models_description():
    # If this fails, a command or a parameter changed: run python -m memmesh.node.commands.describe
    assert TABLE_FILE.read_text() == table_source(REGISTRY)


def test_the_parser_from_the_description_is_the_parser_from_the_models():
    generated, derived = build_parser(), build_parser(REGISTRY)
    assert generated.format_help() == derived.format_help()
    argv = ["remember", "alpha", "k", "v", "--tag", "a", "--edge", '{"type": "about", "to": "x"}']
    assert command_of(generated.parse_args(argv)) == command_of(derived.parse_args(argv), REGISTRY)


def test_the_description_carries_each_commands_policy():
    spec = describe(REGISTRY)
    runs = {c["name"]: c["runs"] for c in spec["commands"]}
    assert runs["serve"] == runs["mcp"] == runs["restore"] == HERE
    assert runs["status"] == runs["recall"] == runs["check"] == EITHER


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_the_control_client_imports_only_the_standard_library_and_light_modules():
    loaded = _modules_after("import memmesh.node.control")
    assert not [m for m in HEAVY if m in loaded]


def test_help_imports_neither_pydantic_nor_the_node():
    code = ("import contextlib, io\nfrom memmesh.node.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(['--help'])\n    except SystemExit:\n        pass")
    loaded = _modules_after(code)
    assert not [m for m in HEAVY if m in loaded]


def test_a_command_that_would_go_to_serve_is_parsed_without_the_models(tmp_path):
    # No serve runs, so the command then loads the registry; up to the routing decision nothing heavy.
    code = ("from memmesh.node.cli_args import build_parser, command_of, commands\n"
            "args = build_parser().parse_args(['recall', 'alpha', 'deploy', '--tag', 'x'])\n"
            "name, params = command_of(args)\nassert commands()[name]['runs'] == 'either'\n"
            "import memmesh.node.control")
    loaded = _modules_after(code)
    assert not [m for m in HEAVY if m in loaded]
