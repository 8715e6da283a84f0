"""A minimal agent loop on memmesh's local HTTP API (docs/api.md), runnable offline.

Before each model call it fetches the agent's ``## Relevant Memories`` block for the
conversation so far and puts it in the system prompt; it offers the model every agent tool
the API publishes (remember, recall, list_memory_banks, neighbors and forget), with the input
schemas of its OpenAPI document, and runs the tool calls the model makes. The model here is a stand-in
(``stand_in_model``): a few rules instead of a language model, so the loop runs without a
network or an API key. Replace it with a call to a real model; nothing else changes.

    memmesh serve &                      # the API listens on 127.0.0.1:7412 by default
    python examples/agent_loop.py --home ~/.local/share/memmesh --agent alpha \
        "remember: the deploy key lives in the ops vault" "where does the deploy key live?"

Only the standard library is used, so the file can be copied into any harness.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

TOOL_PATH = re.compile(r"^/v1/agents/\{agent\}/tools/(\w+)$")  # one route per agent tool


class Api:
    """The few calls a harness needs: the token and address come from the node's home."""

    def __init__(self, base_url: str, token: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token

    @classmethod
    def from_home(cls, home: Path) -> "Api":
        info = json.loads((home / "serve.json").read_text())  # written by a running `memmesh serve`
        token = (home / "api.token").read_text().strip()
        return cls(f"http://{info['api']}", token)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            error = json.loads(exc.read() or b"{}").get("error", {})
            raise RuntimeError(f"{method} {path}: {exc.code} {error.get('code')}: {error.get('message')}") from None

    def tool_schemas(self) -> dict[str, dict[str, Any]]:
        """Each tool's input schema, as the API's OpenAPI document publishes it: every tool the
        node has, so a tool added to memmesh reaches the model without a change here."""
        doc = self._call("GET", "/v1/openapi.json")
        schemas = doc.get("components", {}).get("schemas", {})
        out = {}
        for path, item in doc["paths"].items():
            match = TOOL_PATH.match(path)
            if match is None:
                continue
            tool, op = match.group(1), item["post"]
            schema = op["requestBody"]["content"]["application/json"]["schema"]
            ref = schema.get("$ref", "")
            out[tool] = schemas[ref.rsplit("/", 1)[-1]] if ref else schema
        return out

    def relevant_memories(self, agent: str, messages: list[str], session: str) -> str:
        return self._call("POST", f"/v1/agents/{agent}/autorecall",
                          {"messages": messages, "session": session})["data"]["block"]

    def tool(self, agent: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", f"/v1/agents/{agent}/tools/{name}", args)["data"]


# A model takes (system prompt, conversation, tool schemas) and returns either
# {"tool": name, "args": {...}} or {"text": "..."}.
Model = Callable[[str, list[dict[str, Any]], dict[str, dict[str, Any]]], dict[str, Any]]


def stand_in_model(system: str, conversation: list[dict[str, Any]], tools: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Rules in place of a language model: 'remember: X' stores X; a question is answered from
    the Relevant Memories block in the system prompt, else by calling recall."""
    last = conversation[-1]
    if last["role"] == "tool":
        result = last["content"]
        if last["name"] == "remember":
            return {"text": f"Noted (entry {result['entry']})."}
        if last["name"] == "recall":
            found = result.get("memories", [])
            return {"text": f"From memory: {found[0]['value']}" if found else "I don't remember that."}
        return {"text": json.dumps(result)}
    text = last["content"]
    m = re.match(r"remember:\s*(.+)", text, re.I)
    if m and "remember" in tools:
        fact = m.group(1).strip()
        return {"tool": "remember", "args": {"key": " ".join(fact.split()[:4]), "value": fact}}
    memories = [line[2:] for line in system.splitlines() if line.startswith("- ")]
    words = {w for w in re.findall(r"[a-z0-9]{3,}", text.lower())} - {"where", "what", "does", "the"}
    for line in memories:
        if words & set(re.findall(r"[a-z0-9]{3,}", line.lower())):
            return {"text": f"From memory: {line}"}
    if "recall" in tools:
        return {"tool": "recall", "args": {"query": text}}
    return {"text": "I don't know."}


def run(api: Api, agent: str, user_messages: list[str], model: Model = stand_in_model,
        session: str = "example", system_prompt: str = "You are a helpful agent with a memory.",
        max_steps: int = 4) -> list[str]:
    """Run the loop over ``user_messages``; returns the agent's replies, one per message."""
    tools = api.tool_schemas()
    conversation: list[dict[str, Any]] = []
    replies = []
    for text in user_messages:
        conversation.append({"role": "user", "content": text})
        for _ in range(max_steps):
            said = [m["content"] for m in conversation if m["role"] in ("user", "assistant")]
            block = api.relevant_memories(agent, said, session)  # before every model call
            reply = model(f"{system_prompt}\n\n{block}".rstrip(), conversation, tools)
            if "tool" not in reply:
                conversation.append({"role": "assistant", "content": reply["text"]})
                replies.append(reply["text"])
                break
            result = api.tool(agent, reply["tool"], reply["args"])
            conversation.append({"role": "tool", "name": reply["tool"], "content": result})
        else:
            replies.append("(gave up after too many tool calls)")
    return replies


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--home", type=Path, required=True, help="the node's home (where serve runs)")
    p.add_argument("--agent", required=True)
    p.add_argument("messages", nargs="+", help="what the user says, one argument per turn")
    args = p.parse_args(argv)
    for text, reply in zip(args.messages, run(Api.from_home(args.home), args.agent, args.messages)):
        print(f"user:  {text}\nagent: {reply}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
