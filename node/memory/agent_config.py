"""An agent's memory config: the settings it may change, their defaults and rules, and the
fold of its database's ``config`` and ``memory_banks`` stores (node/memory/agents.py has the
rows' shapes)."""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any

from memmesh.auth.errors import MemmeshError
from memmesh.crdt.database import Database

log = logging.getLogger("memmesh.node.memory.agents")  # the agents' one logger: its lines keep their name

BANKS_STORE = "memory_banks"
CONFIG_STORE = "config"

CONFIG_DEFAULTS: dict[str, Any] = {
    "auto_recall_enabled": True,
    "max_entries": 3,
    "auto_recall_banks": [],
    # Age decay per category (days; docs/memory.md, "Age decay"): empty = off, for Chaz parity.
    "half_lives": {},
    # Trust tiers (docs/memory.md, "Trust tiers"): each fused score times its tier's weight.
    # Flagged and quarantined rows are never auto-recalled, whatever their weight.
    # derived (auto-capture, docs/memory.md "Auto-capture"): below owner, since a rule read it.
    "trust_weights": {"owner": 1.0, "derived": 0.8, "peer": 1.0, "ingested": 0.6, "flagged": 0.5},
    # Rows holding a credential are returned by recall only when this is true (never embedded,
    # never auto-recalled either way).
    "include_secrets": False,
    # Auto-recall searches its stores concurrently and waits this long at most; 0: auto-recall off.
    "auto_recall_deadline_ms": 50,
    # Conversation history (docs/memory.md, "History"): whether tool output is recorded too.
    "record_tool_output": False,
    # Auto-capture (docs/memory.md, "Auto-capture"): facts a user states in a turn history records
    # are off (not looked for), proposed (listed by memory proposals to accept or drop), or saved.
    "auto_capture": "propose",
    # The cosine below which a memory found by vectors alone is not a result (docs/memory.md,
    # "Relevance floor"); None: the embedder's calibrated floor (node/memory/relevance.py).
    "min_similarity": None,
}
DEADLINE_ENV = "MEMMESH_AUTO_RECALL_DEADLINE_MS"  # the built-in deadline, for a whole machine
MAX_HALF_LIFE_DAYS = 36_500  # a century: anything longer is "never", which is leaving it out
TRUST_TIERS = ("owner", "derived", "peer", "ingested", "flagged", "quarantined")


def _deadline_from_env() -> None:
    """``MEMMESH_AUTO_RECALL_DEADLINE_MS`` replaces the built-in 50 ms (config.yaml and an agent's
    own config still win): for a machine too loaded for 50 ms, or a test suite that must not
    depend on the machine's speed."""
    raw = os.environ.get(DEADLINE_ENV)
    if raw is None:
        return
    try:
        CONFIG_DEFAULTS["auto_recall_deadline_ms"] = parse_config_value("auto_recall_deadline_ms", raw)
    except ConfigError as exc:
        log.warning("%s ignored: %s", DEADLINE_ENV, exc)

AUTO_CAPTURE_MODES = ("off", "propose", "save")
WEIGHTED_TIERS = ("owner", "derived", "peer", "ingested", "flagged")  # quarantined rows are never recalled
MAX_DEADLINE_MS = 10_000


class ConfigError(MemmeshError):
    """A config key or value that is not allowed."""


def _whole(raw: Any) -> int | None:
    """A whole number given as a number: 40, or 40.0 (JSON Schema's integer, as every strict
    model reads it: node/strict.py); None for anything else."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    return None


def parse_config_value(name: str, raw: Any) -> Any:
    """Validate a config value (strings from the CLI are converted)."""
    if name not in CONFIG_DEFAULTS:
        raise ConfigError(f"unknown config key {name!r}; known keys: {', '.join(CONFIG_DEFAULTS)}")
    if name in ("auto_recall_enabled", "include_secrets", "record_tool_output"):
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("true", "1", "yes", "on"):
            return True
        if text in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{name} is true or false, got {raw!r}")
    if name == "auto_recall_deadline_ms":
        ms: int | None = _whole(raw)
        if ms is None and isinstance(raw, str) and re.fullmatch(r"[0-9]{1,18}", raw.strip()):  # not isdigit(): '²' passes it
            ms = int(raw.strip())
        if ms is None or not 0 <= ms <= MAX_DEADLINE_MS:
            raise ConfigError(f"auto_recall_deadline_ms is a whole number of milliseconds from 0 (auto-recall "
                              f"off) to {MAX_DEADLINE_MS}, got {raw if ms is None else ms!r}")
        return ms
    if name == "trust_weights":
        return _trust_weights(raw)
    if name == "auto_capture":
        mode = "off" if raw is False else str(raw).strip().lower()  # YAML reads a bare `off` as false
        if mode not in AUTO_CAPTURE_MODES:
            raise ConfigError(f"auto_capture is one of {', '.join(AUTO_CAPTURE_MODES)}, got {raw!r}")
        return mode
    if name == "max_entries":
        value: int | None = _whole(raw)
        if value is None and isinstance(raw, str) and re.fullmatch(r"[+-]?[0-9]{1,18}", raw.strip()):  # not isdigit(): '①' passes it
            value = int(raw.strip())
        if value is None or not 1 <= value <= 20:
            raise ConfigError(f"max_entries is a whole number from 1 to 20, got {raw if value is None else value!r}")
        return value
    if name == "half_lives":
        return _half_lives(raw)
    if name == "min_similarity":
        return _min_similarity(raw)
    # auto_recall_banks: a list of bank references, or a comma-separated string
    if isinstance(raw, str):
        items = [p.strip() for p in raw.split(",") if p.strip()]
    elif isinstance(raw, list) and all(isinstance(p, str) for p in raw):
        items = raw
    else:
        raise ConfigError("auto_recall_banks is a list of bank names or ids (comma-separated on the command line)")
    return items


def _min_similarity(raw: Any) -> float | None:
    """A cosine from 0 to 1, or the embedder's own floor (``default``, null)."""
    if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("default", "null", "none", "")):
        return None
    value: float | None = None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        value = float(raw)
    elif isinstance(raw, str) and re.fullmatch(r"[+-]?(?:[0-9]{1,6}(?:\.[0-9]{0,9})?|\.[0-9]{1,9})", raw.strip()):
        value = float(raw.strip())  # not float(): it takes 'nan', 'inf' and '1_0'
    if value is None or not 0.0 <= value <= 1.0:
        raise ConfigError(f"min_similarity is a cosine from 0 to 1 (0: only vectors pointing away are dropped), "
                          f"or default for the embedder's calibrated floor, got {raw!r}")
    return value


def _mapping(raw: Any, rule: str) -> dict[Any, Any]:
    """A dict, its JSON text, or ``a=1,b=2`` on the command line."""
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("{"):
            try:
                raw = json.loads(text)
            except ValueError:
                raise ConfigError(f"{rule}; got {raw!r}, which is not JSON") from None
        else:
            pairs = [p.split("=", 1) for p in text.split(",") if p.strip()]
            if any(len(p) != 2 for p in pairs):
                raise ConfigError(f"{rule}, got {raw!r}")
            raw = {k.strip(): v.strip() for k, v in pairs}
    if not isinstance(raw, dict):
        raise ConfigError(f"{rule}, got {raw!r}")
    return raw


def _trust_weights(raw: Any) -> dict[str, float]:
    """Weights per trust tier, 0 to 1 (0: never recalled); tiers left out keep their default."""
    rule = ('trust_weights maps trust tiers (owner, derived, peer, ingested, flagged) to weights from 0 to 1, as '
            'JSON \'{"ingested": 0.5}\' or ingested=0.5,flagged=0')
    given = _mapping(raw, rule)
    out = dict(CONFIG_DEFAULTS["trust_weights"])
    for tier, weight in given.items():
        if tier not in WEIGHTED_TIERS:
            extra = " (quarantined rows are never recalled)" if tier == "quarantined" else ""
            raise ConfigError(f"{rule}; {tier!r} is not a weighted tier{extra}")
        try:
            value = float(weight) if not isinstance(weight, bool) else None
        except (TypeError, ValueError):
            value = None
        if value is None or not 0 <= value <= 1:
            raise ConfigError(f"trust_weights: the weight of {tier!r} is a number from 0 to 1, got {weight!r}")
        out[tier] = value
    return out


def _half_lives(raw: Any) -> dict[str, float]:
    """A mapping category -> half-life in days ("*": any other category, or none): a dict, its
    JSON text, or ``fact=30,decision=365`` on the command line; ``{}`` or ``off``: no decay."""
    rule = ('half_lives maps categories ("*": every other row) to half-lives in days, as JSON '
            '\'{"fact": 30, "decision": 365}\' or fact=30,decision=365 (off: no decay)')
    if raw is False or (isinstance(raw, str) and raw.strip().lower() in ("", "off", "none")):
        return {}  # False: YAML reads a bare `off` as false
    raw = _mapping(raw, rule)
    out: dict[str, float] = {}
    for category, days in raw.items():
        if not isinstance(category, str) or not (category == "*" or _is_slug(category)):
            raise ConfigError(f"{rule}; {category!r} is not a category name")
        try:
            value = float(days) if not isinstance(days, bool) else None
        except (TypeError, ValueError):
            value = None
        if value is None or not 0 < value <= MAX_HALF_LIFE_DAYS:
            raise ConfigError(f"half_lives: the half-life of {category!r} is a number of days above 0 and "
                              f"at most {MAX_HALF_LIFE_DAYS}, got {days!r}")
        out[category] = value
    return dict(sorted(out.items()))


_deadline_from_env()


def _is_slug(text: str) -> bool:
    from memmesh.node.memory.rows import MemoryInputError, check_slug
    try:
        check_slug("category", text)
    except MemoryInputError:
        return False
    return True


@dataclass
class AgentState:
    """The folds of an agent database's config and memory_banks stores."""

    config: dict[str, Any] = field(default_factory=lambda: dict(CONFIG_DEFAULTS))
    refs: dict[str, dict[str, str]] = field(default_factory=dict)  # db_id -> {"name", "perm"}
    attached: dict[str | None, list[str]] = field(default_factory=dict)  # session -> db ids


def agent_state(db: Database, defaults: dict[str, Any] | None = None) -> AgentState:
    """``defaults``: the config before the agent's own rows (and after a reset); the node's
    (settings.memory_defaults: config.yaml's auto_recall over CONFIG_DEFAULTS), or the built-in ones."""
    base = CONFIG_DEFAULTS if defaults is None else defaults
    st = AgentState(config=dict(base))
    for row in db.small_rows(CONFIG_STORE):
        v = row.value
        if not isinstance(v, dict):
            continue
        if v.get("reset") is True:
            st.config = dict(base)
        elif isinstance(v.get("set"), str) and v["set"] in CONFIG_DEFAULTS:
            try:
                st.config[v["set"]] = parse_config_value(v["set"], v.get("value"))
            except ConfigError:
                continue  # a malformed remote row is ignored
        elif isinstance(v.get("attach"), str):
            lst = st.attached.setdefault(v.get("session"), [])
            if v["attach"] not in lst:
                lst.append(v["attach"])
        elif isinstance(v.get("detach"), str):
            lst = st.attached.get(v.get("session"), [])
            if v["detach"] in lst:
                lst.remove(v["detach"])
    for row in db.small_rows(BANKS_STORE):
        v = row.value
        if not isinstance(v, dict) or not isinstance(v.get("bank"), str):
            continue
        if v.get("op") == "add":
            st.refs[v["bank"]] = {"name": str(v.get("name", "")), "perm": str(v.get("perm", ""))}
        elif v.get("op") == "remove":
            st.refs.pop(v["bank"], None)
    return st
