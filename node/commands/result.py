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


def json_text(data: Any) -> str:
    """The JSON form of a result, as ``--json`` prints it (stable: keys sorted)."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False)
