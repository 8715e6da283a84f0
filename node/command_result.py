"""What every command returns: data for machines, text for people, warnings.

Below the commands, so that the control channel's client (node/control.py) rebuilds a Result
from serve's answer without importing the commands package. A plain class rather than a
dataclass: ``dataclasses`` pulls in ``inspect`` and ``ast``, a third of what a command sent to
serve would otherwise import.
"""
from __future__ import annotations

import json
from typing import Any


class Result:
    def __init__(self, data: Any, text: str, warnings: list[str] | None = None, exit_code: int = 0) -> None:
        self.data = data
        self.text = text
        self.warnings: list[str] = [] if warnings is None else warnings
        # The CLI's exit code once the result is printed: 1 for a command that ran and reports a
        # failure it found (check, on damage), so scripts get both the report and the verdict.
        self.exit_code = exit_code

    def _fields(self) -> tuple[Any, str, list[str], int]:
        return self.data, self.text, self.warnings, self.exit_code

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Result) and self._fields() == other._fields()

    def __repr__(self) -> str:
        return (f"Result(data={self.data!r}, text={self.text!r}, warnings={self.warnings!r}, "
                f"exit_code={self.exit_code!r})")


def json_text(data: Any) -> str:
    """The JSON form of a result, as ``--json`` prints it (stable: keys sorted)."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False)
