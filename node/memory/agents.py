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

import logging
import re
from dataclasses import dataclass
from typing import Any

from memmesh.auth.errors import AuthError
from memmesh.auth.keys import SigningKey
from memmesh.auth.ops import GrantOp, RevokeOp
from memmesh.auth.permissions import Permission, holds
from memmesh.crdt.database import Database
from memmesh.node.file_check import clean
from memmesh.node.home import Home
from memmesh.node.registry import NAME_RE, AgentRecord, BankRecord, NameError_, NameTaken, UnknownName, check_name

from .agent_config import (
    BANKS_STORE,
    CONFIG_DEFAULTS,
    CONFIG_STORE,
    DEADLINE_ENV,
    MAX_DEADLINE_MS,
    MAX_HALF_LIFE_DAYS,
    TRUST_TIERS,
    WEIGHTED_TIERS,
    AgentState,
    ConfigError,
    agent_state,
    parse_config_value,
)

# An agent's config (agent_config.py) is named from here too, where its users always found it.
__all__ = ["BANKS_STORE", "CONFIG_DEFAULTS", "CONFIG_STORE", "DB_ID_RE", "DEADLINE_ENV", "MAX_DEADLINE_MS",
           "MAX_HALF_LIFE_DAYS", "TRUST_TIERS", "WEIGHTED_TIERS", "WRITE_PRIORITY", "Agent", "AgentState", "Agents",
           "BankRef", "Change", "ConfigError", "Grantee", "NotGranted", "agent_state", "parse_config_value"]

log = logging.getLogger(__name__)

WRITE_PRIORITY = 10  # agents write at Write(10); bank and agent root keys hold Admin(0)
DB_ID_RE = re.compile(r"^sha256:[0-9a-f]{64}$")  # a database id is its root entry's id (use fullmatch: "$" lets "\n" through)

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
        records: list[BankRecord | AgentRecord] = [*self.registry.banks(), *self.registry.agents()]
        for rec in records:
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
