"""What every command returns: data for machines, text for people, warnings."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Result:
    data: Any
    text: str
    warnings: list[str] = field(default_factory=list)
    # The CLI's exit code once the result is printed: 1 for a command that ran and reports a
    # failure it found (check, on damage), so scripts get both the report and the verdict.
    exit_code: int = 0


def json_text(data: Any) -> str:
    """The JSON form of a result, as ``--json`` prints it (stable: keys sorted)."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False)
