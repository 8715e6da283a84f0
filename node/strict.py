"""The base of every schema people or programs write to memmesh: command parameters
(node/commands/params.py) and config.yaml (node/settings.py).

Strict on types (a JSON or YAML string is never read as a number or a boolean: "10" is not 10,
YAML's `yes` is a bool) and on keys (a misspelt key is an error, not silently ignored). A null
given for a field whose default is not null is the field's default, not a wrong type: tool
callers (language models above all) send null for an optional argument they leave out, and a
YAML key whose items are all commented out (`peers:`) is null.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class StrictModel(BaseModel):
    # NaN and the infinities are no setting's value (JSON has no spelling for them; 1e999 and
    # YAML's .inf decode to one); every float field refuses them here, once.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items()
                if v is not None or k not in fields or fields[k].is_required() or fields[k].default is None}
