"""A process that runs one command imports that command's handler module, not all of them, and
the registry still answers every reader that needs all of them (node/commands' load_command)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memmesh.node.commands.params import NoParams
from memmesh.node.commands.registry import Registry, UnknownCommand
from memmesh.node.commands.result import Result

# Run in a fresh interpreter: this one has imported every handler module already.
ONE_COMMAND = """
import json, sys
from memmesh.node.cli import main
code = main(["--home", sys.argv[1], "--json", "memory", "list"])
loaded = sorted(m for m in sys.modules if m.startswith("memmesh.node.commands."))
from memmesh.node.commands.registry import REGISTRY
before = "memmesh.node.commands.sync" in sys.modules
names = REGISTRY.names()
print(json.dumps({"code": code, "loaded": loaded, "sync_before_names": before, "names": names,
                  "aiohttp": "aiohttp" in sys.modules}))
"""


def test_a_local_command_imports_its_handler_module_alone(home: Path):
    out = subprocess.run([sys.executable, "-c", ONE_COMMAND, str(home)], capture_output=True, text=True,
                         check=True).stdout
    seen = json.loads(out.splitlines()[-1])
    assert seen["code"] == 0
    from memmesh.node.commands import HANDLER_MODULES

    handlers = {f"memmesh.node.commands.{name}" for name in HANDLER_MODULES} & set(seen["loaded"])
    assert handlers == {"memmesh.node.commands.banks"}
    assert not seen["sync_before_names"] and not seen["aiohttp"]
    # Listing the names completes the registry: every command, as the CLI's description has them.
    from memmesh.node.commands.cli_table import TABLE

    assert sorted(seen["names"]) == sorted(c["name"] for c in TABLE["commands"])


def _registry_completed_by(extra: str) -> tuple[Registry, list[int]]:
    calls: list[int] = []
    reg: Registry

    def complete() -> None:
        calls.append(1)
        reg.command(extra, NoParams, "registered by the completion")(lambda node, p: Result({}, ""))

    reg = Registry(complete=complete)
    reg.command("first", NoParams, "registered at once")(lambda node, p: Result({}, ""))
    return reg, calls


def test_a_registered_command_is_found_without_completing():
    reg, calls = _registry_completed_by("later")
    assert reg.get("first").name == "first"
    assert calls == []


def test_a_miss_completes_the_registry_once():
    reg, calls = _registry_completed_by("later")
    assert reg.get("later").name == "later"
    with pytest.raises(UnknownCommand, match="commands: first, later"):
        reg.get("nothing")
    assert calls == [1]


def test_listing_completes_the_registry():
    reg, calls = _registry_completed_by("later")
    assert [c.name for c in reg] == ["first", "later"]
    reg2, _ = _registry_completed_by("later")
    assert reg2.names() == ["first", "later"]
    assert calls == [1]


def test_a_failed_completion_is_tried_again():
    attempts: list[int] = []

    def complete() -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise ImportError("a handler module failed to import")

    reg = Registry(complete=complete)
    with pytest.raises(ImportError):
        reg.names()
    assert reg.names() == []
    assert attempts == [1, 1]
