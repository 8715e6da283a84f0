"""Who holds what in a bank: every key of its settings, what it is as far as this node knows,
and the label an operator names it by (``memory grants``, ``grant``, ``revoke``).

A key is, in this order: this node's peer key (``node:self``); a local agent (its name); the
bank's own root key (``bank:root``); an invite this node issued for the bank
(``invite:<16 hex>``); a peer, known from the peer book, the LAN, the sync links, or as the
key that redeemed one of this bank's invites (``peer:mm-<16 hex>``, the name LAN discovery
announces it by); an agent of another node whose database this node holds, by the display name
in that database's signed meta (``agent:<name>``, ``agent:<name>@<16 hex>`` when two share the
name); else unknown (``key:<16 hex>``). The hex is the start of sha256 of the key's text, so a
label stays the same however the rest of the settings change, and ``key:<16 hex>`` names any
key whatever it is. Local agent names never hold a ``:``, so no label is an agent's name.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memmesh.auth.errors import KeyFormatError
from memmesh.auth.keys import PublicKey
from memmesh.auth.permissions import KeyState
from memmesh.crdt.database import Database
from memmesh.crdt.records import SETTINGS
from memmesh.node.memory.agents import Agent, BankRef, Grantee
from memmesh.node.refusal import ParamsError
from memmesh.node.registry import NAME_RE, UnknownName

if TYPE_CHECKING:
    from memmesh.node.library import Node
    from memmesh.node.sync.state import Invite

SELF_LABEL = "node:self"
ROOT_LABEL = "bank:root"
KEY_PREFIX = "ed25519:"
HOW = {"ticket": "learnt from a ticket", "exchange": "learnt by peer exchange", "lan": "seen on the LAN",
       "manual": "added by the operator"}


def tag(key: str) -> str:
    """16 hex digits of sha256 of the key's text (LAN discovery names a node by the same)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Known:
    """What one key is, as far as this node knows."""

    kind: str  # node | agent | bank | invite | peer | remote_agent | unknown
    label: str
    detail: str
    name: str | None = None
    invite: dict[str, Any] | None = None


class Directory:
    """The keys of one bank's world on this node, with their labels (built per command: it
    reads peer-local records that change as the node syncs)."""

    def __init__(self, node: Node, bank: BankRef) -> None:
        self.node, self.bank = node, bank
        db = bank.db
        self.peer = str(node.peer_key.public)
        self.root = _root_key(db)
        self.agents: dict[str, str] = {}  # key -> local agent name
        for agent in node.registry.agents():
            agent_root = _root_key(node.database(agent.db_id))
            if agent_root is not None:
                self.agents[agent_root] = agent.name
        self.invites: dict[str, Invite] = {}
        self.redeemed: dict[str, str] = {}  # importer key -> the invite key it redeemed
        for key, invite in node.sync.invites(db.id, skip_damaged=True):
            self.invites[key] = invite
            if invite.used_by:
                self.redeemed[invite.used_by] = key
        self.peers: dict[str, str] = {}  # key -> how this node learnt it
        book = node.sync.peers
        for db_id in [db.id, *(d for d in book.databases() if d != db.id)]:
            for rec in book.peers(db_id):
                self.peers.setdefault(rec.key, rec.how)
        for link in node.sync.links(db.id):
            self.peers.setdefault(link.peer, "exchange")
        try:
            lan = node.network.discovered()
        except Exception:  # a serve shutting down; the LAN only adds names
            lan = []
        for d in lan:
            if isinstance(d, dict) and isinstance(d.get("key"), str):
                self.peers.setdefault(d["key"], "lan")
        self._remote: dict[str, str] | None = None
        self._shared_names: set[str] = set()  # display names two remote agents share

    @property
    def remote_agents(self) -> dict[str, str]:
        """Key -> display name in its database's signed meta, for every agent database of
        another node that this node holds (registered as a bank). Read only when a key is
        none of the above: it opens those databases."""
        if self._remote is None:
            self._remote = {}
            ids = set(self.node.database_ids())
            for rec in [*self.node.registry.banks(), *self.node.registry.archived_banks()]:
                if rec.db_id not in ids:
                    continue
                rdb = self.node.database(rec.db_id)
                meta = rdb.meta()
                rroot = _root_key(rdb)
                if meta.get("kind") == "agent" and rroot is not None and isinstance(meta.get("display_name"), str):
                    self._remote.setdefault(rroot, meta["display_name"])
            names = [n for k, n in self._remote.items() if k not in self.agents]
            self._shared_names = {n for n in names if names.count(n) > 1}
        return self._remote

    # ------------------------------------------------------------------ naming
    def known(self, key: str) -> Known:
        if key == self.peer:
            return Known("node", SELF_LABEL, "this node's peer key (it signs tickets and syncs the bank)")
        if key in self.agents:
            name = self.agents[key]
            return Known("agent", name, f"local agent {name}", name)
        if key == self.root:
            held = " (held by this node)" if str(self.bank.admin_key.public) == key else ""
            return Known("bank", ROOT_LABEL, f"the bank's own key{held}")
        if key in self.invites:
            return self._invite(key, self.invites[key])
        if key in self.peers or key in self.redeemed:
            label = f"peer:mm-{tag(key)}"
            ways = []
            if key in self.peers:
                ways.append(HOW.get(self.peers[key], f"learnt by {self.peers[key]}"))
            if key in self.redeemed:
                ways.append(f"redeemed invite invite:{tag(self.redeemed[key])}")
            return Known("peer", label, f"peer mm-{tag(key)}, " + ", ".join(ways), f"mm-{tag(key)}")
        remote = self.remote_agents
        if key in remote:
            name = remote[key]
            label = f"agent:{name}@{tag(key)}" if name in self._shared_names else f"agent:{name}"
            return Known("remote_agent", label, f"agent {name} of another node (the name its database's signed "
                                                "meta gives)", name)
        return Known("unknown", f"key:{tag(key)}", "not known to this node")

    def _invite(self, key: str, invite: Invite) -> Known:
        now = int(time.time())
        ended = getattr(invite, "ended", None)
        if invite.used_by:
            state = "redeemed"
            detail = f"invite ({invite.perm}), redeemed by {self.known(invite.used_by).label}"
        elif ended:
            state = "ended"
            detail = f"invite ({invite.perm}), ended unredeemed ({ended})"
        elif now >= invite.expires:
            state = "expired"
            detail = f"invite ({invite.perm}), expired {_when(invite.expires)} without being redeemed"
        else:
            state = "outstanding"
            detail = f"invite ({invite.perm}), not redeemed yet, expires {_when(invite.expires)}"
        info = {"state": state, "perm": invite.perm, "expires": invite.expires, "redeemed_by": invite.used_by}
        return Known("invite", f"invite:{tag(key)}", detail, invite=info)

    def label(self, key: str) -> str:
        return self.known(key).label

    def candidates(self) -> set[str]:
        """Every key a label may name here: the settings' and every key this node knows."""
        keys = set(self.bank.db.settings().keys())
        keys |= {self.peer, *self.agents, *self.invites, *self.redeemed, *self.peers, *self.remote_agents}
        if self.root is not None:
            keys.add(self.root)
        return keys

    def find(self, label: str) -> str | None:
        """The key a label names; ``key:<16 hex>`` names any candidate by its hash."""
        found = None
        for key in sorted(self.candidates()):
            if label in (self.label(key), f"key:{tag(key)}"):
                if found is not None and found != key:
                    return None  # two keys: the label does not say which (never for a hash in practice)
                found = key
        return found

    def local_agent(self, key: str) -> Agent | None:
        name = self.agents.get(key)
        return self.node.agents.agent(name) if name is not None else None

    def grantee(self, key: str) -> Grantee:
        """``key`` as a grant or revocation takes it: the local agent it is, if any, and its label."""
        return Grantee(key, self.local_agent(key), self.label(key))

    # ------------------------------------------------------------------ listing
    def holders(self) -> list[dict[str, Any]]:
        db = self.bank.db
        last_grant: dict[str, list[str]] = {}  # key -> ids of the entries of its latest grant
        for row in db.rows(SETTINGS):
            v = row.value
            if isinstance(v, dict) and v.get("op") == "grant" and isinstance(v.get("key"), str):
                last_grant[v["key"]] = [row.entry_id]
        out: list[dict[str, Any]] = []
        for key, state in db.settings().items():
            known = self.known(key)
            granted = list(state.granted_by) if state.active else last_grant.get(key, [])
            holder: dict[str, Any] = {
                "key": key, "label": known.label, "permission": _level(state), "priority": _priority(state),
                "status": state.status, "is": {"kind": known.kind, "name": known.name, "detail": known.detail},
                "granted_by": self._authors(granted), "revoked_by": [] if state.active else self._authors(state.granted_by),
            }
            if known.invite is not None:
                holder["invite"] = known.invite
            out.append(holder)
        # An invite holds nothing in the settings until it is redeemed, yet it lets its holder
        # in: every one still redeemable is listed, so that it can be seen and revoked.
        settings = db.settings()
        for key in sorted(self.invites):
            known = self.known(key)
            if key in settings or known.invite is None or known.invite["state"] != "outstanding":
                continue
            out.append({"key": key, "label": known.label, "permission": None, "priority": None,
                        "status": "outstanding", "is": {"kind": known.kind, "name": None, "detail": known.detail},
                        "granted_by": [_author(self.peer, SELF_LABEL, None)], "revoked_by": [],
                        "invite": known.invite})
        # Active first, strongest first; then outstanding invites; then revoked; by label within each.
        order = {"admin": 0, "write": 1, "read": 2}
        status = {"active": 0, "outstanding": 1}
        out.sort(key=lambda r: (status.get(r["status"], 2), order.get(r["permission"] or "", 3),
                                r["priority"] if r["priority"] is not None else 0, r["label"]))
        return out

    def _authors(self, entry_ids: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        seen = set()
        for entry_id in entry_ids:
            entry = self.bank.db.entry(entry_id)
            if entry is None or entry.author_key in seen:
                continue
            seen.add(entry.author_key)
            out.append(_author(entry.author_key, self.label(entry.author_key), entry_id))
        return out


def _author(key: str, label: str, entry_id: str | None) -> dict[str, Any]:
    """One signer of a grant, as ``memory grants`` lists it (no entry: this node's invite)."""
    return {"key": key, "label": label, "entry": entry_id}


def _root_key(db: Database) -> str | None:
    """The key that created ``db`` (its agent's or bank's own key), if its root is stored."""
    root = db.entry(db.id)
    return root.author_key if root is not None else None


def _level(state: KeyState) -> str | None:
    return state.permission.level if state.permission is not None else None


def _priority(state: KeyState) -> int | None:
    return state.permission.priority if state.permission is not None else None


def _when(epoch_s: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(epoch_s))


# ---------------------------------------------------------------------- naming a key
def grantee(node: Node, bank: BankRef, who: str) -> Grantee:
    """The key ``who`` names for a grant or revocation on ``bank``: a key (``ed25519:...``), a
    label of ``memory grants``, or a local agent's name."""
    hint = f"name a local agent, a key (ed25519:...) or a label that memmesh memory grants {bank.name} shows"
    if not isinstance(who, str) or not who:
        raise ParamsError(f"who is empty: {hint}")
    if who.startswith(KEY_PREFIX):
        try:
            key = str(PublicKey.parse(who))
        except KeyFormatError:
            raise ParamsError(f"{_shown(who)} is not a public key (ed25519: and 43 base64url characters)") from None
        return Directory(node, bank).grantee(key)
    if ":" in who:
        directory = Directory(node, bank)
        labelled = directory.find(who)
        if labelled is None:
            raise UnknownName(f"no key labelled {_shown(who)} in {bank.name}: {hint}")
        return directory.grantee(labelled)
    if not NAME_RE.match(who) or node.registry.agent(who) is None:
        known = ", ".join(r.name for r in node.registry.agents()) or "none yet"
        raise UnknownName(f"no agent named {_shown(who)} on this node (agents: {known}): {hint}")
    agent = node.agents.agent(who)
    return Grantee(str(agent.key.public), agent, agent.name)


def _shown(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."


__all__ = ["Directory", "Known", "grantee", "tag"]
