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
import re
from dataclasses import dataclass, field
from typing import Any

from memmesh.auth.errors import AuthError, MemmeshError
from memmesh.auth.keys import SigningKey
from memmesh.auth.ops import GrantOp, RevokeOp
from memmesh.auth.permissions import Permission, holds
from memmesh.crdt.database import Database
from memmesh.node.home import Home
from memmesh.node.file_check import clean
from memmesh.node.registry import NAME_RE, AgentRecord, BankRecord, NameError_, NameTaken, UnknownName, check_name

log = logging.getLogger(__name__)

BANKS_STORE = "memory_banks"
CONFIG_STORE = "config"
WRITE_PRIORITY = 10  # agents write at Write(10); bank and agent root keys hold Admin(0)
DB_ID_RE = re.compile(r"^sha256:[0-9a-f]{64}$")  # a database id is its root entry's id (use fullmatch: "$" lets "\n" through)

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
        elif isinstance(raw, str) and re.fullmatch(r"[0-9]{1,18}", raw.strip()):  # not isdigit(): '²' passes it
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
        elif isinstance(raw, str) and re.fullmatch(r"[+-]?[0-9]{1,18}", raw.strip()):  # not isdigit(): '①' passes it
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


class NotGranted(UnknownName):
    """A key that a bank's settings do not mention: there is nothing of it to revoke."""


@dataclass(frozen=True)
class Grantee:
    """Whom a grant or revocation is for: a key, and the local agent it belongs to, if any
    (whose database then also gets, or loses, the bank's reference)."""

    key: str
    agent: Agent | None = None
    label: str = ""  # how the operator named it (an agent's name, a key, a label of memory grants)

    @property
    def shown(self) -> str:
        return self.label or self.key


@dataclass(frozen=True)
class Change:
    """What a grant or revocation wrote: a signed settings entry, the agent's reference, both,
    or neither (the key already held what was asked)."""

    settings: bool = False
    ref: bool = False
    warning: str | None = None

    @property
    def wrote(self) -> bool:
        return self.settings or self.ref


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
        # A malformed name (NUL, control characters) names no agent: storage would refuse it.
        rec = self.registry.agent(name) if isinstance(name, str) and NAME_RE.fullmatch(name) else None
        if rec is None:
            known = ", ".join(r.name for r in self.registry.agents()) or "none yet"
            shown = name if isinstance(name, str) and NAME_RE.fullmatch(name) else "NAME"
            raise UnknownName(f"no agent named {clean(repr(name), 80)} (agents: {known}); "
                              f"create one with: memmesh agent new {shown}")
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
        if not (NAME_RE.fullmatch(ref) or DB_ID_RE.fullmatch(ref)):
            raise UnknownName(f"no bank {clean(repr(ref), 80)} on this node: a bank reference is a name (letters, "
                              "digits, '.', '_', '-') or a database id (sha256: and 64 hex digits)")
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
        if not isinstance(ref, str) or not ref:
            raise NameError_("memory delete needs a bank: its name or its database id (memmesh memory list shows them)")
        rec = None
        if NAME_RE.fullmatch(ref) or DB_ID_RE.fullmatch(ref):  # anything else names no bank (and storage refuses NUL)
            rec = self.registry.bank(ref) or next((b for b in self.registry.banks() if b.db_id == ref), None)
        if rec is None:
            raise UnknownName(f"no registered bank {clean(repr(ref), 80)}; `memmesh memory list` shows them")
        self.registry.archive_bank(rec)
        return rec

    # ---------------------------------------------------------------- grants
    def grant(self, bank_ref: str, agent_name: str, perm: str) -> tuple[BankRef, Agent]:
        """Grant a local agent ``perm`` on a bank (see :meth:`grant_to`)."""
        bank = self.resolve(bank_ref)
        agent = self.agent(agent_name)
        self.grant_to(bank, Grantee(str(agent.key.public), agent, agent.name), perm)
        return bank, agent

    def grant_to(self, bank: BankRef, who: Grantee, perm: str) -> Change:
        """Bank AuthSettings first, then the ref in a local agent's DB; undo the grant if the
        ref fails. What the key already holds is not written again: a grant appends signed
        entries that every replica keeps for good, so a repeated command must not add any."""
        if perm not in ("read", "write"):
            raise AuthError("auth.bad_op", f"a bank grant is read or write, got {perm!r}")
        agent = who.agent
        if agent is not None and bank.db.id == agent.db.id:
            raise AuthError("auth.bad_op", f"{agent.name} always opens its own database; nothing to grant")
        self._check_own_key(bank, who, "grant")
        before = bank.db.permission(who.key)
        # Held at the same level is held: a stronger Write (a lower priority number) given by
        # another admin is not lowered to the default Write(10) by a repeated grant.
        settings = before is None or before.level != perm
        ref_value = {"op": "add", "bank": bank.db.id, "name": bank.name, "perm": perm}
        ref = agent is not None and agent_state(agent.db).refs.get(bank.db.id) != {"name": bank.name, "perm": perm}
        if not settings and not ref:
            return Change()
        if settings:
            self._check_admin(bank)
            bank.db.change_settings(bank.admin_key, [GrantOp(who.key, perm, None if perm == "read" else WRITE_PRIORITY)])
        if ref:
            assert agent is not None
            try:
                self.write_ref(agent, ref_value)
            except Exception:
                if settings:  # the ref could not be written: put the bank's settings back as they were
                    undo: GrantOp | RevokeOp = (RevokeOp(who.key) if before is None
                                                else GrantOp(who.key, before.level, before.priority))
                    bank.db.change_settings(bank.admin_key, [undo])
                raise
        return Change(settings=settings, ref=ref)

    def revoke(self, bank_ref: str, agent_name: str) -> tuple[BankRef, Agent, str | None]:
        """Revoke a local agent's access to a bank (see :meth:`revoke_from`)."""
        bank = self.resolve(bank_ref)
        agent = self.agent(agent_name)
        change = self.revoke_from(bank, Grantee(str(agent.key.public), agent, agent.name))
        return bank, agent, change.warning

    def revoke_from(self, bank: BankRef, who: Grantee) -> Change:
        """Revoke in the bank's AuthSettings first; then remove a local agent's ref, best
        effort. A key already revoked is not revoked again (nothing is written)."""
        self._check_own_key(bank, who, "revoke")
        state = bank.db.settings().get(who.key)
        if state is None:
            raise NotGranted(f"{who.shown} is not in the settings of {bank.name}, so there is nothing to revoke "
                             f"(memmesh memory grants {bank.name} lists every key it holds)")
        agent = who.agent
        settings = state.active
        ref = agent is not None and bank.db.id in agent_state(agent.db).refs
        if not settings and not ref:
            return Change()
        if settings:
            self._check_admin(bank)
            bank.db.change_settings(bank.admin_key, [RevokeOp(who.key)])
        warning = None
        if ref:
            assert agent is not None
            try:
                self.write_ref(agent, {"op": "remove", "bank": bank.db.id})
            except Exception as exc:  # the revocation stands; a stale ref only lists a bank it cannot open
                warning = f"revoked, but the reference in {agent.name}'s database was not removed: {exc}"
                ref = False
        return Change(settings=settings, ref=ref, warning=warning)

    def _check_own_key(self, bank: BankRef, who: Grantee, verb: str) -> None:
        """This node's own keys are not granted or revoked by hand: the key it administers the
        bank with would lock it out of the bank's settings; its peer key signs tickets and
        redemptions and is the key peers serve the bank to, so losing it cuts the node off from
        sharing (``memory unshare`` is how to stop serving a bank)."""
        peer = getattr(self.home, "peer_key", None)
        if peer is not None and who.key == str(peer.public):
            why = ("revoking it would cut this node off from sharing the bank (it signs its tickets and is the key "
                   f"its peers sync with); to stop serving the bank run: memmesh memory unshare {bank.name}"
                   if verb == "revoke" else
                   "its permission is set by memmesh memory share, and a grant by hand could lower it and cut this "
                   "node off from sharing the bank")
            raise AuthError("auth.own_key", f"{who.shown} is this node's peer key on {bank.name}: {why}; nothing was written")
        if who.key == str(bank.admin_key.public):
            raise AuthError("auth.own_key",
                            f"{who.shown} is the key this node administers {bank.name} with: to {verb} it could "
                            "lock this node out of the bank's settings; nothing was written")

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
