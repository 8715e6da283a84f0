"""The `/memory ...` chat command line: its public name.

The parser lives in node/commands/chat_grammar.py, beside the ``command`` command that runs a
line (the commands import no transport); this module is where callers and docs find it.
"""
from __future__ import annotations

from typing import Any

from memmesh.node.commands import chat_grammar
from memmesh.node.commands.chat_grammar import (
    ChatUsageError,
    Grammar,
    Slot,
    check,
    grammar,
    grammars,
    help_text,
    parse,
    usage,
)


def __getattr__(name: str) -> Any:
    if name == "FROM_CALLER":  # derived from the registry when first asked for
        return chat_grammar.FROM_CALLER
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ChatUsageError", "Grammar", "Slot", "check", "grammar", "grammars", "help_text", "parse",
           "usage"]
