"""The MCP tools publish what they answer: each tool's outputSchema is the tool command's answer
model for that tool (node/commands/answers), and every structured result validates against it,
as an MCP client checks it. The input schemas carry their limits (lengths, ranges), not only
their descriptions."""
from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from mcp import Client

from memmesh.node.commands.answers import tool_output_schema
from memmesh.node.commands.tools import TOOLS
from memmesh.node.mcp_server import build_server
from tests.procs import Serve
from tests.test_mcp import make_home


async def test_every_tool_publishes_its_output_schema_and_string_limits(tmp_path):
    async with Client(build_server(tmp_path, "alpha")) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert sorted(tools) == sorted(TOOLS)
    for name, tool in tools.items():
        assert tool.output_schema == tool_output_schema(name), name
        jsonschema.Draft202012Validator.check_schema(tool.output_schema)
    remember = tools["remember"].input_schema["properties"]
    assert remember["key"]["maxLength"] and remember["key"]["minLength"] == 1
    assert remember["value"]["maxLength"] == 65536
    assert "maxLength" in str(tools["recall"].input_schema["properties"]["query"])


def _calls() -> list[tuple[str, dict[str, Any]]]:
    return [
        ("remember", {"key": "tea", "value": "alpha drinks green tea", "entities": ["tea"]}),
        ("remember", {"key": "kitchen", "value": "the kitchen is upstairs", "bank": "notes",
                      "edges": [{"type": "about", "to": "tea"}]}),
        ("recall", {"query": "tea"}),
        ("recall", {"query": "kitchen", "bank": "notes"}),
        ("list_memory_banks", {}),
        ("neighbors", {"key": "kitchen", "bank": "notes"}),
        ("forget", {"key": "tea", "preview": True}),
        ("forget", {"key": "tea"}),
    ]


@pytest.mark.slow
async def test_every_tools_structured_result_validates_against_its_output_schema(tmp_path):
    home = make_home(tmp_path / "node")
    serve = Serve(home).start()
    try:
        serve.wait_ready()
        async with Client(build_server(home, "alpha")) as client:
            schemas = {t.name: t.output_schema for t in (await client.list_tools()).tools}
            called = set()
            for name, args in _calls():
                result = await client.call_tool(name, args)
                assert not result.is_error, (name, result.content)
                jsonschema.validate(result.structured_content, schemas[name])
                called.add(name)
            assert called == set(TOOLS)
    finally:
        serve.stop()
