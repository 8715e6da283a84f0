"""config.yaml: the node's configuration file, its schema, and the config in force.

    HOME/config.yaml   written by people (PyYAML safe loading only); read when `serve` starts,
                       on `memmesh reload` and on SIGHUP; `memmesh config check` validates it.

The config *in force* is the last file that loaded and applied cleanly, kept peer-local in the
registry (``applied(node)``), so a malformed edit never takes a running node down: the error
names the file, the line and what is wrong, and the last good config stays. Commands that run
without serve read the config in force from the registry too (allowed_tools holds everywhere).

Schema (every section optional; unknown keys are refused, so a misspelt key is reported):

    agents:
      - name: alpha
        system_prompt: "You are alpha."
        allowed_tools: [remember, recall, list_memory_banks]   # default: all three
        default_memory_banks: [project-notes]                  # created, Write granted, referenced
    embedding:
      backend: none | hashed | local | remote
      provider: openai | ollama            # with backend remote
      model: ...                           # default: the provider's usual model
      api_base: http://127.0.0.1:11434
      api_key_env: OPENAI_API_KEY          # the *name* of the variable; never the key itself
    sync:
      listen: 127.0.0.1:7411
      advertise: http:192.0.2.10:7411
      peers: [http:192.0.2.11:7411]
      interval_s: 5
      fanout: 3
      discovery: true
    api:
      listen: 127.0.0.1:7412               # the local HTTP API; loopback only unless allow_remote
      allow_remote: false
    auto_recall:
      enabled: true
      max_entries: 3

No telemetry: nothing in this file (or anywhere in memmesh) reports to anyone.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from auth.errors import MemmeshError

if TYPE_CHECKING:
    from node.library import Node

CONFIG_FILE = "config.yaml"
APPLIED = "config-in-force"  # registry setting: the last config applied cleanly (JSON)
DEFAULT_API_PORT = 7412
TOOL_NAMES = ("remember", "recall", "list_memory_banks")


class ConfigFileError(MemmeshError):
    """config.yaml cannot be used: ``FILE:LINE: where: what is wrong``. Nothing was applied."""


class ToolNotAllowed(MemmeshError):
    """The agent's allowed_tools in config.yaml does not include this tool."""


class _Section(BaseModel):
    # Strict on types (YAML's `yes` is a bool, "5" is a string: both are refused where the
    # other is meant) and on keys (a misspelt key is an error, not silently ignored).
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


class AgentSpec(_Section):
    name: Name
    system_prompt: str = ""
    allowed_tools: list[Literal["remember", "recall", "list_memory_banks"]] = list(TOOL_NAMES)
    default_memory_banks: list[Name] = []


class EmbeddingSpec(_Section):
    backend: Literal["none", "hashed", "local", "remote"] = "none"
    provider: Literal["openai", "ollama"] | None = None
    model: str | None = None
    api_base: str | None = None
    api_key_env: Annotated[str | None, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = None
    timeout_s: Annotated[float, Field(gt=0, le=600)] = 10.0


class SyncSpec(_Section):
    listen: str | None = None  # None: serve's built-in default (127.0.0.1:7411)
    advertise: str | None = None
    peers: list[str] = []
    interval_s: Annotated[float, Field(gt=0, le=86400)] = 5.0
    fanout: Annotated[int, Field(ge=1, le=64)] = 3
    discovery: bool = True


class ApiSpec(_Section):
    listen: str = f"127.0.0.1:{DEFAULT_API_PORT}"
    allow_remote: bool = False


class AutoRecallSpec(_Section):
    enabled: bool = True
    max_entries: Annotated[int, Field(ge=1, le=20)] = 3


class NodeConfig(_Section):
    agents: list[AgentSpec] = []
    embedding: EmbeddingSpec | None = None  # None: leave the embedder as `embedder set` made it
    sync: SyncSpec = SyncSpec()
    api: ApiSpec = ApiSpec()
    auto_recall: AutoRecallSpec = AutoRecallSpec()

    def agent(self, name: str) -> AgentSpec | None:
        return next((a for a in self.agents if a.name == name), None)


def applied(node: "Node") -> NodeConfig:
    """The config in force: the last one applied cleanly, or the defaults if none ever was."""
    raw: Any = node.registry.config(APPLIED)
    return NodeConfig() if raw is None else NodeConfig.model_validate(raw)
