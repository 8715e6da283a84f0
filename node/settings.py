"""config.yaml: the node's configuration file, its schema, how it is read, and the config in force.

    HOME/config.yaml   written by people (PyYAML safe loading only); read when `serve` starts,
                       on `memmesh reload` and on SIGHUP; `memmesh config check` validates it.

The config *in force* is the last file that loaded and applied cleanly, kept peer-local in the
registry (``applied(node)``), so a malformed edit never takes a running node down: the error
names the file, the line and what is wrong, and the last good config stays. Commands that run
without serve read the config in force from the registry too (allowed_tools holds everywhere).
Applying a config (agents, banks, grants, the embedder) is node/config_apply.py.

Schema (every section optional; unknown keys are refused, so a misspelt key is reported; a key
or section left empty, e.g. with everything under it commented out, means its default):

    agents:
      - name: alpha
        system_prompt: "You are alpha."
        allowed_tools: [remember, recall, list_memory_banks, neighbors, forget]   # default: all five
        default_memory_banks: [project-notes]                  # created, Write granted, referenced, attached
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
    auto_recall:                           # node-wide defaults of every agent's memory config
      enabled: true
      max_entries: 3
      half_lives: {fact: 30, "*": 90}      # days per category; default {}: no decay
      trust_weights: {ingested: 0.5}       # tiers left out keep their built-in weight
      include_secrets: false
      deadline_ms: 50                      # the agents' auto_recall_deadline_ms
    memory:
      view_budget_mib: 2048                # open recall indexes; default: a quarter of RAM

No telemetry: nothing in this file (or anywhere in memmesh) reports to anyone.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from memmesh.auth.errors import MemmeshError
from memmesh.node import catalogue
from memmesh.node.listen import check_listen
from memmesh.node.registry import NAME_RE
from memmesh.node.strict import StrictModel
from memmesh.node.validation_text import PATTERN_WORDS, shown, what_is_wrong, worded

if TYPE_CHECKING:
    from memmesh.node.home import Home

CONFIG_FILE = "config.yaml"
APPLIED = "config-in-force"  # registry setting: the last config applied cleanly (JSON)
DEFAULT_API_PORT = 7412
TOOL_NAMES = catalogue.TOOL_NAMES  # the tools an agent may be allowed (node/catalogue.py)
MAX_CONFIG_BYTES = 1 << 20  # a config is a page of text; anything near this is a mistake
# The deepest key of a config is a few levels down (agents[0].auto_recall.trust_weights.peer);
# 32 leaves room and stays far below what recursion (YAML's composer, this module) can take.
MAX_YAML_DEPTH = 32
# Values the config expands to, aliases counted each time they are used: 1 MiB of YAML spells at
# most about half a million values without aliases, so no real config comes near this, while
# nine nested aliases of nine (a "billion laughs") would expand to 387 million and hold the
# process (and every message that quotes the value) for minutes and gigabytes.
MAX_YAML_VALUES = 1 << 20

Loc = tuple[Any, ...]


class ConfigFileError(MemmeshError):
    """config.yaml cannot be used: ``FILE:LINE: where: what is wrong``. Nothing was applied.

    ``file``, ``line`` and ``problem`` are the parts of the message (serve logs them as fields);
    built from the message alone (as a client rebuilds it from serve's answer) they are unset."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 problem: str | None = None) -> None:
        super().__init__(message)
        self.file = file
        self.line = line
        self.problem = message if problem is None else problem

    @classmethod
    def at(cls, file: str | os.PathLike[str], line: int | None, problem: str) -> ConfigFileError:
        where = f"{file}:{line}" if line else str(file)
        return cls(f"{where}: {problem}", file=str(file), line=line, problem=problem)


class ToolNotAllowed(MemmeshError):
    """The agent's allowed_tools in config.yaml does not include this tool."""


# ---------------------------------------------------------------------- the schema
class _Section(StrictModel):
    """A section of config.yaml (node/strict.py: strict types and keys; an empty value is the
    key's default)."""


NAME_PATTERN = NAME_RE.pattern  # the names agents and banks take everywhere
ENV_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
# What a pattern means, for people (a regular expression in an error message helps nobody).
worded(NAME_PATTERN, "should be 1-64 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit")
worded(ENV_PATTERN, "should be the name of an environment variable (ASCII letters, digits and '_'), not its value")
SECRET_KEYS = ("api_key_env",)  # a value there may be a key pasted by mistake: never echoed


def _check_address(value: str) -> str:
    from memmesh.tickets import parse_address  # the form tickets and peer exchange use

    try:
        parse_address(value)
    except MemmeshError:
        raise ValueError("should be an address http:HOST:PORT") from None
    return value


Address = Annotated[str, AfterValidator(_check_address)]


class AgentSpec(_Section):
    name: Name
    system_prompt: Annotated[str, Field(max_length=65536)] = ""
    allowed_tools: list[Literal[TOOL_NAMES]] = list(TOOL_NAMES)  # type: ignore[valid-type]
    default_memory_banks: list[Name] = []


class EmbeddingSpec(_Section):
    backend: Literal["none", "hashed", "local", "remote"] = "none"
    provider: Literal["openai", "ollama"] | None = None
    model: str | None = None
    api_base: str | None = None
    api_key_env: Annotated[str | None, Field(pattern=ENV_PATTERN)] = None
    timeout_s: Annotated[float, Field(gt=0, le=600)] = 10.0

    @property
    def provider_name(self) -> str:
        """The embedder provider this section means (node.memory.embedders.PROVIDERS)."""
        if self.backend == "remote":
            return self.provider or "openai"
        return self.backend


class SyncSpec(_Section):
    listen: str | None = None  # None: serve's built-in default (127.0.0.1:7411)
    advertise: Address | None = None
    peers: Annotated[list[Address], Field(max_length=64)] = []
    interval_s: Annotated[float, Field(gt=0, le=86400)] = 5.0
    fanout: Annotated[int, Field(ge=1, le=64)] = 3
    discovery: bool = True
    # a bank is shown stale when a peer has not completed an exchange for this long
    stale_after_s: Annotated[float, Field(gt=0, le=30 * 86400)] = 300.0

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        return check_listen(value)


class ApiSpec(_Section):
    listen: str = f"127.0.0.1:{DEFAULT_API_PORT}"
    allow_remote: bool = False

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        check_listen(value)
        return value


# auto_recall key -> the agent memory config key it is the node's default of (node/memory/agents.py)
AUTO_RECALL_KEYS = {"enabled": "auto_recall_enabled", "max_entries": "max_entries", "half_lives": "half_lives",
                    "trust_weights": "trust_weights", "include_secrets": "include_secrets",
                    "deadline_ms": "auto_recall_deadline_ms", "min_similarity": "min_similarity"}
MEMORY_RULE = "memory_config_rule"  # the error type of a value parse_config_value refused


def _memory_value(key: str, raw: Any) -> Any:
    """``raw`` as the agent memory config takes it: parse_config_value is the one rule, so
    config.yaml and `memory config set` accept and refuse the same values with the same words."""
    # imported here: node.memory.agents imports half the node, which imports this module
    from memmesh.node.memory.agent_config import ConfigError, parse_config_value

    try:
        return parse_config_value(AUTO_RECALL_KEYS[key], raw)
    except ConfigError as exc:
        raise PydanticCustomError(MEMORY_RULE, str(exc)) from None


def _memory_default(key: str) -> Any:
    from memmesh.node.memory.agent_config import CONFIG_DEFAULTS

    return _memory_value(key, CONFIG_DEFAULTS[AUTO_RECALL_KEYS[key]])  # a copy, never the shared dict


class AutoRecallSpec(_Section):
    enabled: bool = True
    max_entries: Annotated[int, Field(ge=1, le=20)] = 3
    half_lives: dict[str, float] = Field(default_factory=lambda: _memory_default("half_lives"))
    trust_weights: dict[str, float] = Field(default_factory=lambda: _memory_default("trust_weights"))
    include_secrets: bool = Field(default_factory=lambda: _memory_default("include_secrets"))
    deadline_ms: int = Field(default_factory=lambda: _memory_default("deadline_ms"))
    min_similarity: float | None = None  # None: the embedder's calibrated floor

    @field_validator("half_lives", "trust_weights", "include_secrets", "deadline_ms", "min_similarity",
                     mode="before")
    @classmethod
    def _memory_rule(cls, raw: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None  # a field validator is always given its field
        return _memory_value(info.field_name, raw)

    def memory_config(self) -> dict[str, Any]:
        """The section as agent memory config keys and values."""
        return {AUTO_RECALL_KEYS[k]: v for k, v in self.model_dump().items()}


class MemorySpec(_Section):
    # The bytes open recall indexes (memory views) may take before the least recently used
    # idle ones are closed (node/memory/open_views.py); None: a quarter of physical memory.
    view_budget_mib: Annotated[float | None, Field(gt=0, le=2**30)] = None


@dataclass(frozen=True)
class Source:
    """Where a loaded config came from: its file and the line of each value (by location)."""

    file: str
    lines: dict[Loc, int] = field(default_factory=dict)

    def line(self, loc: Loc) -> int | None:
        """The line of the deepest value of ``loc`` that exists in the file."""
        for n in range(len(loc), -1, -1):
            if tuple(loc[:n]) in self.lines:
                return self.lines[tuple(loc[:n])]
        return None


class NodeConfig(_Section):
    agents: list[AgentSpec] = []
    embedding: EmbeddingSpec | None = None  # None: leave the embedder as `embedder set` made it
    sync: SyncSpec = SyncSpec()
    api: ApiSpec = ApiSpec()
    auto_recall: AutoRecallSpec = AutoRecallSpec()
    memory: MemorySpec = MemorySpec()

    # Set by load_config; not part of the config (compare configs with ``same_as``).
    _source: Source | None = PrivateAttr(default=None)

    def agent(self, name: str) -> AgentSpec | None:
        return next((a for a in self.agents if a.name == name), None)

    def same_as(self, other: NodeConfig) -> bool:
        return self.model_dump() == other.model_dump()

    @property
    def file(self) -> str:
        return self._source.file if self._source is not None else "the config in force"

    def error(self, loc: Loc, problem: str) -> ConfigFileError:
        """A ConfigFileError about the value at ``loc``, with its file and line when known."""
        where = _where(loc)
        text = f"{where}: {problem}" if where else problem
        return ConfigFileError.at(self.file, self._source.line(loc) if self._source else None, text)


SECTIONS = tuple(NodeConfig.model_fields)


# ---------------------------------------------------------------------- loading
def load_config(path: Path | str) -> NodeConfig:
    """Read and validate a config file; ConfigFileError ``FILE:LINE: what is wrong`` otherwise.

    An empty file (or one whose every line is a comment) is the defaults. A missing or
    unreadable file raises the OSError (callers decide what a missing file means)."""
    path = Path(path)
    with open(path, "rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigFileError.at(path, None, f"is larger than {MAX_CONFIG_BYTES >> 20} MiB; a config is a page of text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigFileError.at(path, raw[:exc.start].count(b"\n") + 1, "is not UTF-8 text") from None
    return parse_config(text, str(path))


def parse_config(text: str, file: str) -> NodeConfig:
    """Validate config text; ``file`` names it in errors."""
    data, lines = _read_yaml(text, file)
    source = Source(file, lines)
    try:
        cfg = NodeConfig.model_validate({} if data is None else data)
    except ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda e: source.line(_value_loc(e)) or 0)
        problem = _problem(errors[0])
        if len(errors) > 1:
            problem += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
        raise ConfigFileError.at(file, source.line(_value_loc(errors[0])), problem) from None
    cfg._source = source
    for loc, problem in _file_problems(cfg):
        raise cfg.error(loc, problem)
    return cfg


def _value_loc(e: Any) -> Loc:
    """Where the value an error is about sits: for a mapping the memory rule refused, the
    entry it refused (its own line), found by asking the rule about each entry alone."""
    loc = tuple(e["loc"])
    if e["type"] == MEMORY_RULE and isinstance(e["input"], dict) and loc and loc[-1] in AUTO_RECALL_KEYS:
        for key, value in e["input"].items():
            try:
                _memory_value(loc[-1], {key: value})
            except PydanticCustomError:
                return (*loc, key)
    return loc


def _file_problems(cfg: NodeConfig) -> list[tuple[Loc, str]]:
    """What the schema alone cannot say: names that clash within the file, sections whose keys
    contradict each other."""
    out: list[tuple[Loc, str]] = []
    agents: dict[str, int] = {}
    for i, a in enumerate(cfg.agents):
        if a.name in agents:
            out.append((("agents", i, "name"), f"agent {a.name!r} is listed twice (first as agents[{agents[a.name]}])"))
        agents.setdefault(a.name, i)
    for i, a in enumerate(cfg.agents):
        seen: set[str] = set()
        for j, bank in enumerate(a.default_memory_banks):
            loc = ("agents", i, "default_memory_banks", j)
            if bank in agents:
                out.append((loc, f"{bank!r} is an agent's name, not a bank"))
            elif bank in seen:
                out.append((loc, f"bank {bank!r} is listed twice"))
            seen.add(bank)
    e = cfg.embedding
    if e is not None:
        if e.backend == "remote" and e.provider is None:
            out.append((("embedding", "backend"), "backend remote needs provider: openai or ollama"))
        out.extend((("embedding", key), f"{key} is for backend remote (backend is {e.backend})")
                   for key in ("provider", "api_base", "api_key_env")
                   if e.backend != "remote" and getattr(e, key) is not None)
    return out


class _Tree:
    """A composed YAML node tree as plain data, with the line of every value, refusing what
    safe loading would let through silently (a repeated key) or what a config never needs
    (merge keys, custom tags)."""

    MAP, SEQ = "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"

    def __init__(self, file: str) -> None:
        self.file = file
        self.lines: dict[Loc, int] = {}
        self._built: dict[int, Any] = {}  # an alias is the same node: built once
        self._building: set[int] = set()
        self._sizes: dict[int, int] = {}  # values a built node expands to
        self.expanded = 0  # values of the whole tree so far, aliases expanded
        self._scalars = yaml.constructor.SafeConstructor()

    def error(self, node: yaml.Node, problem: str) -> ConfigFileError:
        return ConfigFileError.at(self.file, node.start_mark.line + 1, problem)

    def located(self, node: yaml.Node, path: Loc, problem: str) -> ConfigFileError:
        where = _where(path)
        return self.error(node, f"{where}: {problem}" if where else problem)

    def tag_refused(self, node: yaml.Node, path: Loc) -> ConfigFileError:
        tag = node.tag.replace("tag:yaml.org,2002:", "!!")
        return self.located(node, path, f"the tag {tag} is not allowed (config.yaml is read with safe loading only)")

    def _scalar(self, node: yaml.Node, path: Loc) -> Any:
        try:
            return self._scalars.construct_object(node)
        except yaml.MarkedYAMLError as exc:
            if "could not determine a constructor" in (exc.problem or ""):
                raise self.tag_refused(node, path) from None
            raise self.located(node, path, exc.problem or "a value that safe loading refuses") from None

    def value(self, node: yaml.Node, path: Loc) -> Any:
        if len(path) > MAX_YAML_DEPTH:
            raise self.error(node, f"{_where(path[:3])}...: nests deeper than {MAX_YAML_DEPTH} levels; a config "
                                   "needs a handful")
        self.lines.setdefault(path, node.start_mark.line + 1)
        if id(node) in self._built:
            self._count(node, self._sizes[id(node)])
            return self._built[id(node)]
        if id(node) in self._building:
            raise self.error(node, "an alias refers to the value that contains it")
        if isinstance(node, yaml.ScalarNode):
            self._count(node, 1)
            return self._scalar(node, path)
        before = self.expanded
        if node.tag not in (self.MAP, self.SEQ):
            raise self.tag_refused(node, path)
        self._building.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            out: Any = [self.value(item, (*path, i)) for i, item in enumerate(node.value)]
        else:
            out = {}
            first: dict[Any, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise self.error(key_node, "merge keys (<<) are not supported in a config")
                if not isinstance(key_node, yaml.ScalarNode):
                    raise self.error(key_node, "a key is a plain word, not a list or a mapping")
                key = self._scalar(key_node, path)
                line = key_node.start_mark.line + 1
                if key in first:
                    where = f"{_where(path)}: " if path else ""
                    raise self.error(key_node, f"{where}key {_shown(key)} appears twice (first at line {first[key]})")
                first[key] = line
                self.lines[(*path, key)] = line
                out[key] = self.value(value_node, (*path, key))
        self._building.discard(id(node))
        self._count(node, 1)
        self._sizes[id(node)] = self.expanded - before
        self._built[id(node)] = out
        return out

    def _count(self, node: yaml.Node, values: int) -> None:
        self.expanded += values
        if self.expanded > MAX_YAML_VALUES:
            raise self.error(node, f"its aliases expand to more than {MAX_YAML_VALUES:,} values; a config needs "
                                   "a few hundred")


def _read_yaml(text: str, file: str) -> tuple[Any, dict[Loc, int]]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:  # the composer recurses once per level: "[" * 5000 exhausts the stack
        raise ConfigFileError.at(file, None, f"not valid YAML for a config: it nests deeper than {MAX_YAML_DEPTH} "
                                             "levels") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = "; ".join(p for p in (exc.context, exc.problem) if p) or "not valid YAML"
        raise ConfigFileError.at(file, mark.line + 1 if mark else None, f"not valid YAML: {problem}") from None
    except yaml.reader.ReaderError as exc:
        line = text[:exc.position].count("\n") + 1
        raise ConfigFileError.at(file, line, f"not valid YAML: {exc.reason}") from None
    except yaml.YAMLError as exc:
        raise ConfigFileError.at(file, None, f"not valid YAML: {exc}") from None
    if root is None:
        return None, {}
    tree = _Tree(file)
    return tree.value(root, ()), tree.lines


def _where(loc: Loc) -> str:
    """``agents[0].allowed_tools[1]``: a location as people read it."""
    out = ""
    for part in loc:
        if not isinstance(part, int):  # a key from the text: the offending token, bounded like a value
            part = str(part) if len(str(part)) <= 40 else str(part)[:37] + "..."
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _section_model(loc: Loc) -> type[BaseModel] | None:
    """The model of the mapping at ``loc`` (to list the keys it takes)."""
    model: Any = NodeConfig
    for part in loc:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if info is None:
            return None
        ann = info.annotation
        for _ in range(2):  # list[X] and X | None: the model inside
            args = [a for a in getattr(ann, "__args__", ()) if a is not type(None)]
            if args and not (isinstance(ann, type) and issubclass(ann, BaseModel)):
                ann = args[0]
        model = ann
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _shown(value: Any) -> str:
    return shown(value, mapping="a mapping", sequence="a list")  # YAML's words


def _problem(e: Any) -> str:
    """One pydantic error as ``where: what (got value)``, the wording of params.describe."""
    loc, kind = tuple(e["loc"]), e["type"]
    where = _where(loc)
    if kind == "missing":
        parent = _where(loc[:-1])
        return f"{parent}: needs {loc[-1]}" if parent else f"needs {loc[-1]}"
    if kind == MEMORY_RULE:
        # the rule's own words (they show the value already); the key once, in the location
        return f"{where}: {e['msg'].removeprefix(f'{loc[-1]}: ')}"
    if kind == "extra_forbidden":
        model = _section_model(loc[:-1])
        takes = ", ".join(model.model_fields) if model is not None else "other keys"
        return f"{where}: unknown key; {_where(loc[:-1]) or 'the file'} takes {takes}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        message = "should be a mapping (key: value lines)"
        if not loc:
            message += f" of the sections {', '.join(SECTIONS)}"
    elif kind == "list_type":
        message = "should be a list"
    elif kind == "string_pattern_mismatch" and e.get("ctx", {}).get("pattern") in PATTERN_WORDS:
        message = PATTERN_WORDS[e["ctx"]["pattern"]]
    else:
        message = what_is_wrong(e)
    # The offending value, bounded (_shown); never for the whole document (loc empty): a file
    # that is not a mapping at all is not config text, and its start is nobody's business.
    if loc and not any(part in SECRET_KEYS for part in loc):
        message += f" (got {_shown(e['input'])})"
    return f"{where}: {message}" if where else message


# ---------------------------------------------------------------------- the config in force
def applied(node: Home) -> NodeConfig:
    """The config in force: the last one applied cleanly, or the defaults if none ever was."""
    raw: Any = node.registry.config(APPLIED)
    return NodeConfig() if raw is None else NodeConfig.model_validate(raw)


def check_tool(node: Home, agent: str, tool: str) -> None:
    """ToolNotAllowed unless the config in force lets ``agent`` use ``tool`` (an agent that
    config.yaml does not name may use every tool)."""
    spec = applied(node).agent(agent)
    if spec is None or tool in spec.allowed_tools:
        return
    allowed = f"are {', '.join(spec.allowed_tools)}" if spec.allowed_tools else "are empty"
    raise ToolNotAllowed(f"agent {agent} may not use {tool}: its allowed_tools in config.yaml {allowed}")


def memory_defaults(node: Home) -> dict[str, Any]:
    """An agent's memory config before its own `memory config set` rows: the built-in defaults
    with config.yaml's auto_recall section over them."""
    from memmesh.node.memory.agent_config import CONFIG_DEFAULTS

    return {**CONFIG_DEFAULTS, **applied(node).auto_recall.memory_config()}


# ---------------------------------------------------------------------- the template
TEMPLATE = """\
# memmesh config.yaml: read when `memmesh serve` starts, on `memmesh reload` and on SIGHUP.
# `memmesh config check` validates it without applying it; `memmesh config show` prints the
# config in force. Every key is optional: as written here (all commented out) it is the
# defaults. docs/operations.md, "Configuration (config.yaml)", describes every key.
# Nothing in memmesh reports to anyone (no telemetry).

# agents:                             # each created if missing; one left out is not deleted
#   - name: alpha
#     system_prompt: "You are alpha, the ops assistant."
#     allowed_tools: [remember, recall, list_memory_banks, neighbors, forget]   # default: all five
#     default_memory_banks: [project-notes]   # created if missing, Write granted, referenced, attached

# embedding:                          # left out: the embedder `memmesh embedder set` chose
#   backend: hashed                   # none | hashed | local | remote
#   provider: openai                  # backend remote only: openai | ollama
#   model: text-embedding-3-small     # default: the provider's usual model
#   api_base: https://api.openai.com/v1
#   api_key_env: OPENAI_API_KEY       # the NAME of the variable holding the key, never the key
#   timeout_s: 10

# sync:                               # serve's flags win over these
#   listen: 127.0.0.1:7411            # where the sync API listens (restart serve to change)
#   advertise: http:192.0.2.10:7411   # the address peers and tickets use (restart to change)
#   peers: [http:192.0.2.11:7411]     # synced with every shared database, every round
#   interval_s: 5                     # seconds between sweeps (node/sync/service.py)
#   fanout: 3                         # peers per database per round
#   discovery: true                   # LAN discovery (restart to change)
#   stale_after_s: 300                # `memmesh status` calls a bank stale past this

# api:                                # the local HTTP API (restart serve to change)
#   listen: 127.0.0.1:7412
#   allow_remote: false

# auto_recall:                        # node-wide defaults; `memmesh memory config set` wins
#   enabled: true
#   max_entries: 3                    # 1-20 memories per store
#   half_lives: {}                    # age decay: days per category, "*" for the rest, e.g.
#                                     #   {fact: 30, decision: 365, "*": 90}; {}: no decay
#   trust_weights: {owner: 1.0, derived: 0.8, peer: 1.0, ingested: 0.6, flagged: 0.5}   # 0-1; tiers
#                                     #   left out keep these weights (derived: auto-capture)
#   include_secrets: false            # recall returns rows holding a credential only when true
#   deadline_ms: 50                   # auto-recall waits at most this long (0-10000; 0: off)
#   min_similarity: default           # vector-only matches below this cosine are not results;
#                                     #   default: the embedder's calibrated floor (0-1)

# memory:
#   view_budget_mib: 2048             # MiB open recall indexes may take; past it the least
#                                     #   recently used idle ones close (default: 1/4 of RAM)
"""


def write_template(home: Path) -> bool:
    """Write the commented template as HOME/config.yaml unless a config is there already."""
    try:
        fd = os.open(Path(home) / CONFIG_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(TEMPLATE)
    return True
