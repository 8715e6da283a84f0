"""The OpenAPI 3.1 document of the local HTTP API (``GET /v1/openapi.json``).

Built from the route table (node/api/routes.py) and the commands' parameter models, so the
schema a client reads is the schema the node enforces: each request body is the model's JSON
Schema (pydantic's ``$defs`` hoisted into ``components/schemas``), each answer the success
envelope or the error envelope with its code enum (node/api/errors.py).
"""
from __future__ import annotations

import copy
import re
from importlib import metadata
from typing import Any

from pydantic import TypeAdapter, ValidationError

from memmesh.node.api.errors import BODY_TOO_LARGE, CODES, INVALID_JSON, KINDS, UNSUPPORTED_MEDIA_TYPE, Kind
from memmesh.node.api.routes import OPENAPI_PATH, Route
from memmesh.node.commands.answers import TOOL_ANSWERS
from memmesh.node.commands.params import Params

REF = "#/components/schemas/{model}"
BODYLESS = {INVALID_JSON, BODY_TOO_LARGE, UNSUPPORTED_MEDIA_TYPE}  # what a GET without a body cannot get

RESULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "what every command answers: data for programs, text for people, warnings",
    "required": ["data", "text", "warnings"],
    "additionalProperties": False,
    "properties": {
        "data": {"description": "the command's result as JSON (what `memmesh --json` prints)"},
        "text": {"type": "string", "description": "the same result as the CLI prints it"},
        "warnings": {"type": "array", "items": {"type": "string"}},
    },
}
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {"error": {
        "type": "object",
        "required": ["code", "message"],
        "additionalProperties": False,
        "properties": {
            "code": {"type": "string", "enum": list(CODES), "description": "stable: what a program branches on"},
            "message": {"type": "string", "description": "one line for people, as the CLI prints it"},
        },
    }},
}


def document(routes: list[Route]) -> dict[str, Any]:
    schemas: dict[str, Any] = {"Result": RESULT_SCHEMA, "Error": ERROR_SCHEMA}
    paths: dict[str, Any] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, schemas)
    paths[OPENAPI_PATH] = {"get": {
        "operationId": "openapi",
        "summary": "this document (no token needed)",
        "tags": ["api"],
        "security": [],
        "responses": {"200": {"description": "the OpenAPI document",
                              "content": {"application/json": {"schema": {"type": "object"}}}}},
    }}
    return {
        "openapi": "3.1.0",
        "info": {"title": "memmesh local HTTP API", "version": _version(),
                 "description": "Every command of a memmesh node, for agents and operators (docs/api.md)."},
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "the token in the node's home, HOME/api.token"}},
        },
    }


def _operation(route: Route, schemas: dict[str, Any]) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": route.operation_id,
        "summary": route.summary,
        "tags": ["agents"] if route.path_params else [route.command.name.partition(".")[0]],
    }
    fields = route.command.params.model_fields
    if route.path_params:
        # A path value is validated by the command's model like a body's: its schema is the field's.
        props = route.command.params.model_json_schema().get("properties", {})
        op["parameters"] = [{"name": name, "in": "path", "required": True, "schema": _path_schema(props[name]),
                             "description": fields[name].description or name} for name in route.path_params]
    if route.body is not None:
        name, schema = _body_schema(route)
        _add_schema(schemas, name, schema)
        op["requestBody"] = {"required": not _takes_nothing(route),
                             "content": {"application/json": {"schema": {"$ref": REF.format(model=name)}}}}
    responses: dict[str, Any] = {"200": {"description": "done", "content": _answer(route, schemas)}}
    by_status: dict[int, list[Kind]] = {}
    for kind in KINDS:
        if route.body is None and kind in BODYLESS:
            continue
        by_status.setdefault(kind.status, []).append(kind)
    for status, kinds in sorted(by_status.items()):
        responses[str(status)] = {"description": "; ".join(f"{k.code}: {k.description}" for k in kinds),
                                  "content": _json("Error")}
    op["responses"] = responses
    return op


def _takes_nothing(route: Route) -> bool:
    """Whether the body may be left out (read as ``{}``): the model takes it with the path's
    values alone (a rule across fields, such as neighbors' key or entity, may need one)."""
    model: type[Params] = route.body  # type: ignore[assignment]
    path = {} if route.wrap is not None else dict.fromkeys(route.path_params, "a")  # "a": any valid name
    try:
        model.model_validate(path)
    except ValidationError:
        return False
    return True


def _path_schema(prop: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in prop.items() if k not in ("title", "description", "default")}


def _body_schema(route: Route) -> tuple[str, dict[str, Any]]:
    """The body's schema and its name in components: the model's, and for a route whose path
    gives some parameters, the model's without them (a body that names one is refused)."""
    model: type[Params] = route.body  # type: ignore[assignment]
    schema = copy.deepcopy(model.model_json_schema(ref_template=REF))
    name = model.__name__
    relaxed = [p for p in route.path_params if route.wrap is None and p in schema.get("properties", {})]
    if relaxed:
        name += "Body"
        schema["title"] = name
        schema["required"] = [r for r in schema.get("required", []) if r not in relaxed]
        if not schema["required"]:
            del schema["required"]
        for p in relaxed:
            del schema["properties"][p]
    return name, schema


def _answer(route: Route, schemas: dict[str, Any]) -> dict[str, Any]:
    """The 200 answer: the Result envelope whose ``data`` is the command's answer model
    (node/commands/answers), hoisted into components like a request model; a tool route's is
    that tool's."""
    tool = route.fixed.get("tool")
    model = TOOL_ANSWERS[tool] if tool is not None else route.command.answer
    envelope = copy.deepcopy(RESULT_SCHEMA)
    if model is not None:
        schema = copy.deepcopy(TypeAdapter(model).json_schema(ref_template=REF))
        name = getattr(model, "__name__", None)
        if name is None or not isinstance(model, type):  # a union (the command command): named after the command
            name = "".join(w.capitalize() for w in re.split(r"[.\-]", route.command.name)) + "Answer"
            schema.setdefault("description", f"what {route.command.name} answers: one of these")
        _add_schema(schemas, name, schema)
        envelope["properties"]["data"] = {"$ref": REF.format(model=name),
                                          "description": RESULT_SCHEMA["properties"]["data"]["description"]}
    return {"application/json": {"schema": envelope}}


def _add_schema(schemas: dict[str, Any], name: str, schema: dict[str, Any]) -> None:
    for sub, subschema in schema.pop("$defs", {}).items():
        _add_schema(schemas, sub, subschema)
    if name in schemas and schemas[name] != schema:
        raise ValueError(f"two different schemas would both be components/schemas/{name}")
    schemas[name] = schema


def _json(name: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": REF.format(model=name)}}}


def _version() -> str:
    try:
        return metadata.version("memmesh")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0"
