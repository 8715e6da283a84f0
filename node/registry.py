"""Peer-local records: which agents and banks this node hosts, node settings, credentials.

Kept in the storage's peer-local tables (never synced). Each record is small JSON. Names are
what users type; database ids are what the signed data refers to.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from memmesh.auth.errors import MemmeshError
from memmesh.crdt.storage import Storage
from memmesh.node.file_check import clean, damaged

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

NS_AGENTS = "agents"
NS_BANKS = "banks"
NS_ARCHIVE = "archived-banks"
NS_CONFIG = "node-config"
NS_CREDENTIALS = "credentials"

EMBEDDER_CONFIG = "embedder"  # node setting: the embedder's provider, model, ...
EMBEDDER_SECRET = "embedder-api-key"  # credential: the embedding service's API key


class NameError_(MemmeshError):  # the builtin NameError means something else
    """A name that is malformed, taken, or unknown."""


# Told apart so that a transport can say which (the HTTP API answers 404 and 409).
class UnknownName(NameError_):
    """No agent or bank of this name (or database id) on this node."""


class NameTaken(NameError_):
    """The name is already an agent's or a bank's on this node."""


def check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        odd = next((c for c in name if not (c.isascii() and (c.isalnum() or c in "._-"))), None) \
            if isinstance(name, str) else None
        raise NameError_(
            f"{what} name {name!r} is not valid: use 1-64 ASCII letters, digits, '.', '_' or '-', "
            "starting with a letter or digit" + (f" ({odd!r} is none of these)" if odd is not None else "")
        )
    return name


@dataclass(frozen=True)
class AgentRecord:
    name: str
    db_id: str
    key_name: str


@dataclass(frozen=True)
class BankRecord:
    name: str
    db_id: str
    key_name: str
    description: str = ""


class Registry:
    def __init__(self, storage: Storage) -> None:
        self._s = storage

    def _decode(self, ns: str, key: str, raw: bytes, record: Any = None) -> Any:
        """A stored record; damaged bytes (JSON that no longer parses) are one line naming the
        storage file, never a traceback."""
        try:
            value = json.loads(raw)
            return record(**value) if record is not None else value
        except (TypeError, ValueError) as exc:
            raise damaged(str(getattr(self._s, "path", "the storage")),
                          f"its peer-local record {clean(ns, 40)}/{clean(key, 80)} cannot be read: {clean(exc, 80)}") from exc

    def _put(self, ns: str, key: str, value: Any) -> None:
        self._s.put_local(ns, key, json.dumps(value, sort_keys=True).encode())

    # ----------------------------------------------------------------- agents
    def agents(self) -> list[AgentRecord]:
        return [self._decode(NS_AGENTS, k, v, AgentRecord) for k, v in self._s.items_local(NS_AGENTS)]

    def agent(self, name: str) -> AgentRecord | None:
        raw = self._s.get_local(NS_AGENTS, name)
        return None if raw is None else self._decode(NS_AGENTS, name, raw, AgentRecord)

    def add_agent(self, rec: AgentRecord) -> None:
        self._put(NS_AGENTS, rec.name, asdict(rec))

    # ----------------------------------------------------------------- banks
    def banks(self) -> list[BankRecord]:
        return [self._decode(NS_BANKS, k, v, BankRecord) for k, v in self._s.items_local(NS_BANKS)]

    def bank(self, name: str) -> BankRecord | None:
        raw = self._s.get_local(NS_BANKS, name)
        return None if raw is None else self._decode(NS_BANKS, name, raw, BankRecord)

    def add_bank(self, rec: BankRecord) -> None:
        self._put(NS_BANKS, rec.name, asdict(rec))

    def archive_bank(self, rec: BankRecord) -> None:
        """Unregister a bank; its database stays in storage, listed as an archive."""
        self._put(NS_ARCHIVE, rec.db_id, asdict(rec))
        self._s.delete_local(NS_BANKS, rec.name)

    def archived_banks(self) -> list[BankRecord]:
        return [self._decode(NS_ARCHIVE, k, v, BankRecord) for k, v in self._s.items_local(NS_ARCHIVE)]

    def name_taken(self, name: str) -> str | None:
        if self.agent(name):
            return "an agent"
        if self.bank(name):
            return "a bank"
        return None

    # ----------------------------------------------------------------- settings and secrets
    def config(self, name: str, default: Any = None) -> Any:
        raw = self._s.get_local(NS_CONFIG, name)
        return default if raw is None else self._decode(NS_CONFIG, name, raw)

    def set_config(self, name: str, value: Any) -> None:
        self._put(NS_CONFIG, name, value)

    def secret(self, name: str) -> str | None:
        raw = self._s.get_local(NS_CREDENTIALS, name)
        if raw is None:
            return None
        try:
            return raw.decode()
        except UnicodeDecodeError:  # never quote a secret's bytes
            raise damaged(str(getattr(self._s, "path", "the storage")),
                          f"its peer-local record {NS_CREDENTIALS}/{clean(name, 80)} cannot be read") from None

    def set_secret(self, name: str, value: str) -> None:
        self._s.put_local(NS_CREDENTIALS, name, value.encode())
