"""An agent's memory config: memory.config show | set KEY VALUE | reset."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from memmesh.node.commands.params import AgentParams, Cli
from memmesh.node.commands.registry import command
from memmesh.node.commands.result import Result
from memmesh.node.memory.agents import CONFIG_DEFAULTS, agent_state, parse_config_value
from memmesh.node.settings import memory_defaults

if TYPE_CHECKING:
    from memmesh.node.library import Node


class MemoryConfig(AgentParams):
    action: Annotated[Literal["show", "set", "reset"], Cli(positional=True), Field(
        description="show the config, set one key, or reset every key to its default")]
    key: Annotated[str | None, Cli(positional=True), Field(
        description=f"with set: {', '.join(CONFIG_DEFAULTS)}")] = None
    # The value's rule depends on the key (parse_config_value, shared with the config fold);
    # command-line values arrive as text and are converted there.
    value: Annotated[str | int | bool | list[str] | None, Cli(positional=True), Field(
        description="with set: the new value (auto_recall_banks: bank names or ids, comma-separated)")] = None

    schema_rules: ClassVar[dict[str, Any]] = {
        "if": {"properties": {"action": {"const": "set"}}},
        "then": {"required": ["key", "value"], "properties": {"key": {"type": "string"}, "value": {"not": {"type": "null"}}}},
    }

    @model_validator(mode="after")
    def _set_needs_key_and_value(self) -> MemoryConfig:
        if self.action == "set" and (self.key is None or self.value is None):
            raise ValueError("set needs a key and a value")
        return self


# A chat line's caller is the agent whose config it shows or changes.
@command("memory.config", MemoryConfig, "show, set or reset an agent's memory config", from_caller=("agent",))
def memory_config(node: Node, p: MemoryConfig) -> Result:
    ag = node.agents.agent(p.agent)
    if p.action == "set":
        assert p.key is not None  # the model's rule
        parsed = parse_config_value(p.key, p.value)
        if p.key == "auto_recall_banks":  # every reference must name a bank; stored as ids
            parsed = [node.agents.resolve(ref).db.id for ref in parsed]
        node.agents.write_config(ag, {"set": p.key, "value": parsed})
    elif p.action == "reset":
        node.agents.write_config(ag, {"reset": True})
    state = agent_state(ag.db, memory_defaults(node))  # the effective values: config.yaml's below the agent's
    config = dict(state.config)
    config["auto_recall_banks"] = [node.agents.name_of(i) for i in config["auto_recall_banks"]]
    attached = {("*" if s is None else s): [node.agents.name_of(i) for i in ids] for s, ids in state.attached.items() if ids}
    text = "\n".join(f"{k} = {json.dumps(config[k])}" for k in CONFIG_DEFAULTS)
    if attached:
        text += "\nattached banks: " + "; ".join(f"{s}: {', '.join(n)}" for s, n in attached.items())
    return Result({"agent": ag.name, "config": config, "attached": attached}, text)
