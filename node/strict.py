"""The base of every schema people or programs write to memmesh: command parameters
(node/commands/params.py) and config.yaml (node/settings.py).

Strict on types (a JSON or YAML string is never read as a number or a boolean: "10" is not 10,
YAML's `yes` is a bool) and on keys (a misspelt key is an error, not silently ignored). A null
given for a field whose default is not null is the field's default, not a wrong type: tool
callers (language models above all) send null for an optional argument they leave out, and a
YAML key whose items are all commented out (`peers:`) is null. The published JSON Schema says
so: such a field is ``anyOf: [its type, null]``.

A whole number written with a fraction (``153.0``) is an integer: JSON Schema's ``integer``
is any number whose fraction is zero, so a field the schema calls integer takes it, as 153.
"""
from __future__ import annotations

import types
from functools import cache
from typing import Any, ClassVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, model_validator


def _published(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """The model's JSON Schema as validation judges: null for each field with a non-null default
    (what ``_null_means_default`` accepts), and the model's ``schema_rules``."""
    props = schema.get("properties", {})
    for name, field in model.model_fields.items():
        prop = props.get(field.alias or name)
        if prop is None or field.is_required() or field.default is None or _allows_null(prop):
            continue
        outer = {k: prop.pop(k) for k in ("title", "description", "default", "examples") if k in prop}
        props[field.alias or name] = {"anyOf": [prop, {"type": "null"}], **outer}
    schema.update(getattr(model, "schema_rules", {}))


def _allows_null(prop: dict[str, Any]) -> bool:
    return prop.get("type") == "null" or any(p.get("type") == "null" for p in prop.get("anyOf", ()))


class StrictModel(BaseModel):
    # NaN and the infinities are no setting's value (JSON has no spelling for them; 1e999 and
    # YAML's .inf decode to one); every float field refuses them here, once.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False,
                              json_schema_extra=_published)
    # What a model validator checks across fields, said in JSON Schema (oneOf, if/then), so the
    # published schema judges as the model does; the validator stays the one that words errors.
    schema_rules: ClassVar[dict[str, Any]] = {}

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        whole = _integer_fields(cls)
        return {k: int(v) if k in whole and type(v) is float and v.is_integer() else v
                for k, v in data.items()
                if v is not None or k not in fields or fields[k].is_required() or fields[k].default is None}


@cache
def _integer_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields (by the name input uses) that take an integer and not a float."""
    out = set()
    for name, field in model.model_fields.items():
        kinds = _kinds(field.annotation)
        if int in kinds and float not in kinds:
            out.add(name)
            if field.alias:
                out.add(field.alias)
    return frozenset(out)


def _kinds(annotation: Any) -> tuple[Any, ...]:
    if get_origin(annotation) in (Union, types.UnionType):
        return get_args(annotation)
    return (annotation,)
