"""Agents and banks: creating them, resolving references, granting, and the agent-DB folds.

An agent has its own key and its own database (kind "agent"); a bank is a database (kind
"bank") whose root key is held by this node. Whether an agent may open a bank is decided by
one thing only: the bank's AuthSettings for the agent's key.

The agent database keeps, as append-only rows folded in T order (newest wins):
* ``memory_banks``: {"op": "add", "bank": db_id, "name": str, "perm": str} and
  {"op": "remove", "bank": db_id}: the MemoryBankRefs the agent knows about;
* ``config``: {"set": name, "value": v}, {"reset": true}, and per-session attachments
  {"attach": db_id, "session": s | null}, {"detach": db_id, "session": s | null}.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from auth.errors import AuthError, MemmeshError
from auth.keys import SigningKey
from auth.ops import GrantOp, RevokeOp
from auth.permissions import Permission, holds
from crdt.database import Database
from node.home import Home
from node.registry import AgentRecord, BankRecord, NameError_, NameTaken, UnknownName, check_name

log = logging.getLogger(__name__)

BANKS_STORE = "memory_banks"
CONFIG_STORE = "config"
WRITE_PRIORITY = 10  # agents write at Write(10); bank and agent root keys hold Admin(0)

CONFIG_DEFAULTS: dict[str, Any] = {
    "auto_recall_enabled": True,
    "max_entries": 3,
    "auto_recall_banks": [],
    # Age decay per category (days; docs/memory.md, "Age decay"): empty = off, for Chaz parity.
    "half_lives": {},
    # Trust tiers (docs/memory.md, "Trust tiers"): each fused score times its tier's weight.
    # Flagged and quarantined rows are never auto-recalled, whatever their weight.
    "trust_weights": {"owner": 1.0, "peer": 1.0, "ingested": 0.6, "flagged": 0.5},
    # Rows holding a credential are returned by recall only when this is true (never embedded,
    # never auto-recalled either way).
    "include_secrets": False,
    # Auto-recall searches its stores concurrently and waits this long at most; 0: auto-recall off.
    "auto_recall_deadline_ms": 50,
    # Conversation history (docs/memory.md, "History"): whether tool output is recorded too.
    "record_tool_output": False,
}
DEADLINE_ENV = "MEMMESH_AUTO_RECALL_DEADLINE_MS"  # the built-in deadline, for a whole machine
MAX_HALF_LIFE_DAYS = 36_500  # a century: anything longer is "never", which is leaving it out
TRUST_TIERS = ("owner", "peer", "ingested", "flagged", "quarantined")


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

WEIGHTED_TIERS = ("owner", "peer", "ingested", "flagged")  # quarantined rows are never recalled
MAX_DEADLINE_MS = 10_000


class ConfigError(MemmeshError):
    """A config key or value that is not allowed."""


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
        ms: int | None = None
        if isinstance(raw, int) and not isinstance(raw, bool):
            ms = raw
        elif isinstance(raw, str) and raw.strip().isdigit():
            ms = int(raw.strip())
        if ms is None or not 0 <= ms <= MAX_DEADLINE_MS:
            raise ConfigError(f"auto_recall_deadline_ms is a whole number of milliseconds from 0 (auto-recall "
                              f"off) to {MAX_DEADLINE_MS}, got {raw!r}")
        return ms
    if name == "trust_weights":
        return _trust_weights(raw)
    if name == "max_entries":
        value: int | None = None
        if isinstance(raw, int) and not isinstance(raw, bool):
            value = raw
        elif isinstance(raw, str) and raw.strip().lstrip("+-").isdigit():
            value = int(raw.strip())
        if value is None or not 1 <= value <= 20:
            raise ConfigError(f"max_entries is a whole number from 1 to 20, got {raw!r}")
        return value
    if name == "half_lives":
        return _half_lives(raw)
    # auto_recall_banks: a list of bank references, or a comma-separated string
    if isinstance(raw, str):
        items = [p.strip() for p in raw.split(",") if p.strip()]
    elif isinstance(raw, list) and all(isinstance(p, str) for p in raw):
        items = raw
    else:
        raise ConfigError("auto_recall_banks is a list of bank names or ids (comma-separated on the command line)")
    return items


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
    rule = ('trust_weights maps trust tiers (owner, peer, ingested, flagged) to weights from 0 to 1, as '
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
    from node.memory.rows import MemoryInputError, check_slug
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


@dataclass(frozen=True)
class Agent:
    name: str
    key: SigningKey
    db: Database


@dataclass(frozen=True)
class BankRef:
    """A database an agent may use as a bank: a registered bank or another agent's own DB."""

    name: str
    db: Database
    admin_key: SigningKey
    kind: str  # "bank" | "agent"


class Agents:
    """Creates and finds agents and banks on one node."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.registry = home.registry

    # ---------------------------------------------------------------- agents
    def create_agent(self, name: str) -> Agent:
        check_name(name, "agent")
        taken = self.registry.name_taken(name)
        if taken:
            raise NameTaken(f"{name!r} is already {taken} on this node")
        key_name = f"agent-{name}"
        # A key file without a registered agent is left by a creation that failed after the
        # key was saved: reuse it rather than refuse the name for good.
        key = self.home.load_key(key_name) if self.home.key_path(key_name).exists() else self.home.new_key(key_name)
        db = self.home.create_database(key, {"kind": "agent", "display_name": name})
        self.registry.add_agent(AgentRecord(name, db.id, key_name))
        return Agent(name, key, db)

    def agent(self, name: str) -> Agent:
        rec = self.registry.agent(name) if name else None
        if rec is None:
            known = ", ".join(r.name for r in self.registry.agents()) or "none yet"
            raise UnknownName(f"no agent named {name!r} (agents: {known}); create one with: memmesh agent new {name}")
        db = self.home.database(rec.db_id)
        return Agent(rec.name, self.home.load_creator_key(rec.key_name, db), db)

    def agents(self) -> list[AgentRecord]:
        return self.registry.agents()

    # ---------------------------------------------------------------- banks
    def create_bank(self, name: str, description: str = "") -> BankRef:
        check_name(name, "bank")
        taken = self.registry.name_taken(name)
        if taken:
            raise NameTaken(f"{name!r} is already {taken} on this node")
        key = SigningKey.generate()
        db = self.home.create_database(key, {"kind": "bank", "display_name": name, "description": description})
        key_name = f"bank-{db.id[7:23]}"
        self.home.save_key(key_name, key)
        self.registry.add_bank(BankRecord(name, db.id, key_name, description))
        return BankRef(name, db, key, "bank")

    def resolve(self, ref: str) -> BankRef:
        """A bank reference: a bank name, an agent name (its own DB), or a database id."""
        if not isinstance(ref, str) or not ref:
            raise NameError_("a bank reference is a bank name, an agent name or a database id")
        rec = self.registry.bank(ref)
        if rec is not None:
            return BankRef(rec.name, self.home.database(rec.db_id), self.home.load_key(rec.key_name), "bank")
        arec = self.registry.agent(ref)
        if arec is not None:
            return BankRef(arec.name, self.home.database(arec.db_id), self.home.load_key(arec.key_name), "agent")
        named = self._name_by_id(ref)
        if named is not None:
            return self.resolve(named)
        known = [b.name for b in self.registry.banks()]
        raise UnknownName(f"no bank {ref!r} on this node (banks: {', '.join(known) or 'none yet'}); "
                          "create one with: memmesh memory new NAME")

    def _name_by_id(self, db_id: str) -> str | None:
        """The registered bank or agent whose database is ``db_id``."""
        for rec in [*self.registry.banks(), *self.registry.agents()]:
            if rec.db_id == db_id:
                return rec.name
        return None

    def name_of(self, db_id: str) -> str:
        """A database's name for people: registered name, else its display name, else its id."""
        named = self._name_by_id(db_id)
        if named is not None:
            return named
        if db_id in self.home.database_ids():
            meta = self.home.database(db_id).meta()
            if isinstance(meta.get("display_name"), str):
                return meta["display_name"]
        return db_id

    def delete_bank(self, ref: str) -> BankRecord:
        rec = self.registry.bank(ref) or next((b for b in self.registry.banks() if b.db_id == ref), None)
        if rec is None:
            raise UnknownName(f"no registered bank {ref!r}; `memmesh memory list` shows them")
        self.registry.archive_bank(rec)
        return rec

    # ---------------------------------------------------------------- grants
    def grant(self, bank_ref: str, agent_name: str, perm: str) -> tuple[BankRef, Agent]:
        """Bank AuthSettings first, then the ref in the agent DB; undo the grant if the ref fails."""
        if perm not in ("read", "write"):
            raise AuthError("auth.bad_op", f"a bank grant is read or write, got {perm!r}")
        bank = self.resolve(bank_ref)
        agent = self.agent(agent_name)
        if bank.db.id == agent.db.id:
            raise AuthError("auth.bad_op", f"{agent_name} always opens its own database; nothing to grant")
        target = str(agent.key.public)
        before = bank.db.permission(target)
        self._check_admin(bank)
        bank.db.change_settings(bank.admin_key, [GrantOp(target, perm, None if perm == "read" else WRITE_PRIORITY)])
        try:
            self.write_ref(agent, {"op": "add", "bank": bank.db.id, "name": bank.name, "perm": perm})
        except Exception:
            # The ref could not be written: put the bank's settings back as they were.
            undo: GrantOp | RevokeOp = RevokeOp(target) if before is None else GrantOp(target, before.level, before.priority)
            bank.db.change_settings(bank.admin_key, [undo])
            raise
        return bank, agent

    def revoke(self, bank_ref: str, agent_name: str) -> tuple[BankRef, Agent, str | None]:
        """Revoke in the bank's AuthSettings first; then remove the ref, best effort."""
        bank = self.resolve(bank_ref)
        agent = self.agent(agent_name)
        target = str(agent.key.public)
        if bank.db.permission(target) is None:
            raise AuthError("auth.not_granted", f"{agent_name} holds no permission on {bank.name}")
        self._check_admin(bank)
        bank.db.change_settings(bank.admin_key, [RevokeOp(target)])
        warning = None
        try:
            self.write_ref(agent, {"op": "remove", "bank": bank.db.id})
        except Exception as exc:  # the revocation stands; a stale ref only lists a bank it cannot open
            warning = f"revoked, but the reference in {agent_name}'s database was not removed: {exc}"
        return bank, agent, warning

    def _check_admin(self, bank: BankRef) -> None:
        """Granting needs Admin on the bank: say what to do when this node does not hold it
        (a bank imported with write or read)."""
        held = bank.db.permission(str(bank.admin_key.public))
        if held is None or held.level != "admin":
            have = "no permission" if held is None else held.level
            raise AuthError("auth.not_admin",
                            f"this node holds {have} on {bank.name}, and granting its agents needs admin on "
                            "the bank: import a ticket shared with --perm admin (memmesh memory share "
                            f"{bank.name} --perm admin on a node that administers it), or ask an admin of the "
                            "bank to grant the agent's key")

    def write_ref(self, agent: Agent, value: dict[str, Any]) -> str:
        return self._append(agent, BANKS_STORE, value)

    def write_config(self, agent: Agent, value: dict[str, Any]) -> str:
        """One row of the agent's config: a setting, a reset, an attachment."""
        return self._append(agent, CONFIG_STORE, value)

    def _append(self, agent: Agent, store: str, value: dict[str, Any]) -> str:
        with agent.db.transaction(agent.key) as txn:
            txn.append(store, value)
        return txn.entry_id or ""

    # ---------------------------------------------------------------- access
    def permission(self, agent: Agent, db: Database) -> Permission | None:
        return db.permission(str(agent.key.public))

    def open_for(self, agent: Agent, ref: str | None, needed: str) -> BankRef:
        """The database ``agent`` may use for ``needed`` ("read" or "write"); else AuthError."""
        if ref is None or ref == agent.name or ref == agent.db.id:
            return BankRef(agent.name, agent.db, agent.key, "self")
        bank = self.resolve(ref)
        if bank.db.id == agent.db.id:
            return BankRef(agent.name, agent.db, agent.key, "self")
        perm = self.permission(agent, bank.db)
        if not holds(perm, needed):
            have = "no permission" if perm is None else f"{perm.level} permission"
            verb = "read from" if needed == "read" else "write to"
            raise AuthError(f"auth.not_{'reader' if needed == 'read' else 'writer'}",
                            f"agent {agent.name} may not {verb} bank {bank.name} (its key holds {have})")
        return bank
