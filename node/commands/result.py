"""Result and json_text, where the handlers have always imported them from.

They are defined in node/command_result.py, below the commands, so that the control channel's
client (node/control.py) can rebuild a Result without importing the commands package.
"""
from __future__ import annotations

from memmesh.node.command_result import Result, json_text

__all__ = ["Result", "json_text"]
