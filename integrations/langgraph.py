"""``MemmeshStore``: a LangGraph store (``langgraph.store.base.BaseStore``) kept in memmesh.

    from langgraph.graph import StateGraph
    from memmesh.integrations.langgraph import MemmeshStore

    store = MemmeshStore("/path/to/home", agent="alpha", bank={"team": "project-notes"})
    graph = builder.compile(checkpointer=checkpointer, store=store)

Every item is a memory written by the tools an agent uses (``remember``, ``recall``, ``forget``,
run through the command registry), signed by the store's agent and replicated like any other:
a peer that imported the bank sees the items through its own store. The store reaches the home
through ``memmesh.node.connect``: through its serve while one runs, else opened in this process.
docs/integrations.md is the user's guide; the decisions:

* **Where an item lives.** ``bank`` says which database holds a namespace: None, the agent's own
  database; a bank name, that bank for every namespace; a mapping, the bank named for the
  namespace's first label (``{"team": "project-notes"}``), the agent's own database for the rest.
  The mapping is fixed when the store is made, never guessed from the banks that exist: a bank
  granted later must not hide what was stored before it.
* **The memory's key** is the namespace's labels and the item's key joined by ``/``, each with
  ``%`` written ``%25`` and ``/`` written ``%2F`` (so ``("users", "u1")`` and ``"prefs"`` is
  ``users/u1/prefs``): readable by other agents and tools, and parsed back exactly.
* **The memory's value** is the item's value as JSON text (``json.dumps``, non-ASCII kept, key
  order kept), so recall's BM25 and vectors search the value's words, and ``json.loads`` gives
  the value back exactly. It carries the tag ``langgraph`` (which items are the store's) and
  entities, recall's exact filters, which never enter BM25's text: ``lg.item:<hash of the
  memory key>`` (the item, for other readers' filters), ``lg.in:<hash of a prefix>`` for each
  prefix of the namespace (``search`` under a prefix) and ``lg.ns:<hash>:<namespace>``
  (``list_namespaces``, through the ``memory.entities`` command, which counts only the rows
  recall shows; a recall of one memory first refuses a bank the agent may not read). Hashes are
  lower-case hex because recall compares entities case-insensitively; the listing entity
  carries a hash of the namespace's exact spelling so that two namespaces differing in case
  stay two.
* **get** (and the current row a ``put`` or a retiring ``delete`` reads first) is the
  ``memory.get`` command: exactly that key, however many memories outrank its words, as recall
  would show it; not counted as a recall in the access counts (``search`` is counted).
* **created_at** is kept in the row's ``valid_from`` (a put reads the current row first),
  **updated_at** is the row's time.
* **delete** is the ``forget`` tool (every version erased on every replica) where the agent may
  forget (it wrote every version, or it is an Admin of the bank); else the item is retired: a
  new row of the key whose ``valid_to`` is now, which recall no longer returns.

Limits (each refused with one line before anything is written): a namespace of at most
:data:`MAX_DEPTH` labels whose joined form has at most :data:`MAX_NAMESPACE_CHARS` characters, a
memory key of at most 512 characters, a value of at most 65,536 characters of JSON; no TTL. A
search pages through recall's ranking (best, or newest, first) down to its 1,000th memory, so
``offset + limit`` beyond that, or a filter that keeps few of them, returns fewer; memmesh's policies apply to items as to any memory
(a value holding a credential is stored but not returned unless the agent's config sets
``include_secrets``; a quarantined writer's items are hidden).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import itertools
import json
import logging
import re
from collections.abc import Iterable, Mapping
from os import PathLike
from typing import Any

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        InvalidNamespaceError,
        Item,
        ListNamespacesOp,
        MatchCondition,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
    )
except ModuleNotFoundError as exc:  # the extra is not installed: say which, in one line
    if (exc.name or "").split(".")[0] not in ("langgraph", "langchain_core"):
        raise
    raise ModuleNotFoundError("memmesh.integrations.langgraph needs the langgraph extra: "
                              "pip install 'memmesh[langgraph]'", name=exc.name) from None

from memmesh.node.client import Client, connect
from memmesh.node.memory.rows import MAX_ENTITIES, MAX_ENTITY_CHARS, MAX_KEY_CHARS, MAX_VALUE_CHARS
from memmesh.node.memory.view import MAX_LIMIT, MAX_PAGE_DEPTH

__all__ = ["MAX_DEPTH", "MAX_NAMESPACE_CHARS", "MemmeshStore"]

log = logging.getLogger(__name__)

TAG = "langgraph"
_ITEM, _IN, _NS = "lg.item:", "lg.in:", "lg.ns:"
_HASH_CHARS = 32
_NS_HASH_CHARS = 16
# A row's entities: its item's, one per prefix, the listing one.
MAX_DEPTH = MAX_ENTITIES - 2
MAX_NAMESPACE_CHARS = MAX_ENTITY_CHARS - len(_NS) - _NS_HASH_CHARS - 1
_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
_ESCAPED = re.compile(r"%(25|2F)")


# ---------------------------------------------------------------------- the mapping
def _escape(label: str) -> str:
    return label.replace("%", "%25").replace("/", "%2F")


def _unescape(text: str) -> str:
    return _ESCAPED.sub(lambda m: "%" if m.group(1) == "25" else "/", text)


def namespace_path(namespace: tuple[str, ...]) -> str:
    """The namespace as the memory key's first part: labels escaped, joined by ``/``."""
    return "/".join(_escape(label) for label in namespace)


def memory_key(namespace: tuple[str, ...], key: str) -> str:
    """The memory key of an item (``users/u1/prefs``)."""
    return "/".join([*(_escape(label) for label in namespace), _escape(key)])


def parse_memory_key(text: str) -> tuple[tuple[str, ...], str]:
    """(namespace, key) from a memory key written by :func:`memory_key`."""
    *labels, key = text.split("/")
    return tuple(_unescape(label) for label in labels), _unescape(key)


def _hash(text: str, n: int = _HASH_CHARS) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def _item_entity(mkey: str) -> str:
    return _ITEM + _hash(mkey)


def _in_entity(prefix: tuple[str, ...]) -> str:
    return _IN + _hash(namespace_path(prefix))


def _ns_entity(namespace: tuple[str, ...]) -> str:
    path = namespace_path(namespace)
    return f"{_NS}{_hash(path, _NS_HASH_CHARS)}:{path}"


def _ns_of_entity(entity: str) -> tuple[str, ...] | None:
    """The namespace a listing entity names, None for any other entity (or one whose hash is not
    its namespace's: the entity index may spell it in another case)."""
    if entity[:len(_NS)].casefold() != _NS:
        return None
    digest, sep, path = entity[len(_NS):].partition(":")
    if not sep or not path or digest.casefold() != _hash(path, _NS_HASH_CHARS):
        return None
    return tuple(_unescape(label) for label in path.split("/"))


def _now_iso() -> str:
    now = dt.datetime.now(dt.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def _when(text: str) -> dt.datetime:
    when = dt.datetime.fromisoformat(text)
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


# ---------------------------------------------------------------------- filters
def _matches(value: Any, want: Any) -> bool:
    """LangGraph's filter rule (its in-memory store's): a nested object matches field by field,
    ``{"$op": x}`` applies the operators, anything else is equality. A comparison between values
    that do not compare (a number and a string) is no match."""
    if isinstance(want, dict):
        ops = [k for k in want if isinstance(k, str) and k.startswith("$")]
        if ops:
            return all(_apply(value, op, arg) for op, arg in want.items())
        return isinstance(value, dict) and all(_matches(value.get(k), v) for k, v in want.items())
    if isinstance(want, (list, tuple)):
        return (isinstance(value, list) and len(value) == len(want)
                and all(_matches(v, w) for v, w in zip(value, want)))
    return bool(value == want)


def _apply(value: Any, op: str, arg: Any) -> bool:
    if op == "$eq":
        return bool(value == arg)
    if op == "$ne":
        return bool(value != arg)
    if op not in _OPERATORS:
        raise ValueError(f"search filter: unknown operator {op!r} (the operators are {', '.join(_OPERATORS)})")
    if isinstance(value, bool) or isinstance(arg, bool) or value is None:
        return False
    try:
        if op == "$gt":
            return bool(value > arg)
        if op == "$gte":
            return bool(value >= arg)
        if op == "$lt":
            return bool(value < arg)
        return bool(value <= arg)
    except TypeError:
        return False


def _check_filter(want: Any) -> None:
    """Unknown operators are refused before anything is searched, even when nothing would match."""
    if isinstance(want, dict):
        for k, v in want.items():
            if isinstance(k, str) and k.startswith("$") and k not in _OPERATORS:
                raise ValueError(f"search filter: unknown operator {k!r} (the operators are {', '.join(_OPERATORS)})")
            _check_filter(v)
    elif isinstance(want, (list, tuple)):
        for v in want:
            _check_filter(v)


def _check_labels(labels: Iterable[Any], what: str) -> None:
    """LangGraph's rule for namespace labels (its stores check it in their methods; ops given to
    ``batch`` directly skip them): non-empty strings without '.' or NUL."""
    for label in labels:
        if not isinstance(label, str) or not label or "." in label or "\x00" in label:
            raise InvalidNamespaceError(f"{what}: a namespace label is a non-empty string without '.' or NUL, "
                                        f"got {label!r}")


def _validate(op: Op) -> None:
    if isinstance(op, (GetOp, PutOp)):
        _check_labels(op.namespace, "namespace")
    elif isinstance(op, SearchOp):
        _check_labels(op.namespace_prefix, "namespace_prefix")
    elif isinstance(op, ListNamespacesOp):
        for condition in op.match_conditions or ():
            _check_labels(condition.path, f"list_namespaces {condition.match_type}")


def _error_name(exc: BaseException) -> str:
    """The refusal's type name, in-process or as serve named it (node/control.py's RemoteError)."""
    return str(getattr(exc, "name", "")) if type(exc).__name__ == "RemoteError" else type(exc).__name__


# ---------------------------------------------------------------------- the store
class MemmeshStore(BaseStore):
    """A LangGraph store whose items are memories of one memmesh agent (see the module doc).

    ``home``: a node's home (reached with ``memmesh.node.connect``: through its serve while one
    runs, else opened here) or a client ``connect`` returned (shared, left open by ``close``).
    ``agent``: the agent whose key signs every write and whose permissions apply. ``bank``:
    where namespaces live (None: the agent's own database; a bank name; or a mapping from a
    namespace's first label to a bank)."""

    supports_ttl = False

    def __init__(self, home: str | PathLike[str] | Client, *, agent: str,
                 bank: str | Mapping[str, str] | None = None) -> None:
        if not isinstance(agent, str) or not agent:
            raise ValueError("MemmeshStore: agent is the name of an agent of the node")
        if bank is not None and not isinstance(bank, (str, Mapping)):
            raise ValueError("MemmeshStore: bank is None, a bank name or a mapping from a namespace's first "
                             "label to a bank name")
        if isinstance(bank, Mapping) and not all(isinstance(k, str) and k and isinstance(v, str) and v
                                                  for k, v in bank.items()):
            raise ValueError("MemmeshStore: bank maps namespace labels to bank names (non-empty strings)")
        self.agent = agent
        self.bank: str | dict[str, str] | None = dict(bank) if isinstance(bank, Mapping) else bank
        self._owns = not isinstance(home, Client)
        self.client: Client = connect(home) if not isinstance(home, Client) else home

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the connection the store opened (not a client it was given)."""
        if self._owns:
            self.client.close()

    def __enter__(self) -> MemmeshStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ where
    def bank_of(self, namespace: tuple[str, ...]) -> str | None:
        """The bank holding ``namespace`` (None: the agent's own database)."""
        if isinstance(self.bank, dict):
            return self.bank.get(namespace[0]) if namespace else None
        return self.bank

    def _banks(self, prefix: tuple[str, ...]) -> list[str | None]:
        """The databases a search or listing under ``prefix`` reads."""
        if prefix or not isinstance(self.bank, dict):
            return [self.bank_of(prefix)]
        return [None, *dict.fromkeys(self.bank.values())]

    # ------------------------------------------------------------------ batch
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return [self._one(op) for op in ops]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        # The client's calls block (a socket or the home's SQLite): a thread keeps the loop free.
        ops = list(ops)
        return await asyncio.to_thread(self.batch, ops)

    def _one(self, op: Op) -> Result:
        _validate(op)
        if isinstance(op, GetOp):
            return self._get(op.namespace, str(op.key))
        if isinstance(op, PutOp):
            if op.value is None:
                self._delete(op.namespace, str(op.key))
            else:
                self._put(op)
            return None
        if isinstance(op, SearchOp):
            return self._search(op)
        if isinstance(op, ListNamespacesOp):
            return self._list(op)
        raise ValueError(f"MemmeshStore: unknown operation {type(op).__name__}")

    # ------------------------------------------------------------------ rows
    def _recall(self, bank: str | None, *, query: str = "", entities: list[str], limit: int,
                count: bool, offset: int = 0) -> list[dict[str, Any]]:
        data = self.client.run("recall", {"agent": self.agent, "query": query, "tags": [TAG], "entities": entities,
                                          "limit": limit, "offset": offset, "bank": bank,
                                          "no_count": not count}).data
        memories: list[dict[str, Any]] = data["memories"]
        return memories

    def _current(self, bank: str | None, mkey: str) -> dict[str, Any] | None:
        """The current memory of the key as recall would show it, read by ``memory.get`` (one
        lookup, however many memories outrank the key's words), None when there is none or it
        is not one of the store's (no ``langgraph`` tag: another tool's memory of that key)."""
        try:
            m: dict[str, Any] = self.client.run("memory.get", {"agent": self.agent, "key": mkey, "bank": bank}).data
        except Exception as exc:
            if _error_name(exc) == "UnknownMemory":
                return None
            raise
        return m if any(t.casefold() == TAG for t in m["tags"]) else None

    def _item(self, m: dict[str, Any], bank: str | None, cls: type[Item] = Item) -> Item | None:
        """The item a memory holds; None for a memory that is not one of this store's (another
        writer's row under the tag, or a namespace this store maps to another database)."""
        namespace, key = parse_memory_key(m["key"])
        if not namespace or self.bank_of(namespace) != bank:
            return None
        try:
            value = json.loads(m["value"])
        except ValueError:
            return None
        if not isinstance(value, dict):
            return None
        updated = _when(m["time"])
        created = _when(m["valid_from"]) if m.get("valid_from") else updated
        return cls(namespace=namespace, key=key, value=value, created_at=created, updated_at=updated)

    # ------------------------------------------------------------------ get, put, delete
    def _get(self, namespace: tuple[str, ...], key: str) -> Item | None:
        if not namespace:
            return None
        bank = self.bank_of(namespace)
        m = self._current(bank, memory_key(namespace, key))
        return None if m is None else self._item(m, bank)

    def _checked_key(self, namespace: tuple[str, ...], key: str) -> str:
        if not namespace:
            raise InvalidNamespaceError("MemmeshStore: an item's namespace has at least one label")
        if len(namespace) > MAX_DEPTH:
            raise InvalidNamespaceError(f"MemmeshStore: a namespace has at most {MAX_DEPTH} labels "
                                        f"(got {len(namespace)})")
        path = namespace_path(namespace)
        if len(path) > MAX_NAMESPACE_CHARS:
            raise InvalidNamespaceError(f"MemmeshStore: a namespace's labels joined by '/' have at most "
                                        f"{MAX_NAMESPACE_CHARS} characters (got {len(path)})")
        mkey = memory_key(namespace, key)
        if len(mkey) > MAX_KEY_CHARS:
            raise ValueError(f"MemmeshStore: namespace and key joined by '/' have at most {MAX_KEY_CHARS} "
                             f"characters (got {len(mkey)})")
        return mkey

    def _put(self, op: PutOp) -> None:
        if op.ttl is not None:
            raise NotImplementedError("MemmeshStore does not support TTL: put with ttl=None")
        namespace, key = tuple(op.namespace), str(op.key)
        mkey = self._checked_key(namespace, key)
        if not isinstance(op.value, Mapping):
            raise ValueError(f"MemmeshStore: a value is a JSON object (a dict), got {type(op.value).__name__}")
        try:
            text = json.dumps(dict(op.value), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"MemmeshStore: the value is not JSON ({exc})") from None
        if len(text) > MAX_VALUE_CHARS:
            raise ValueError(f"MemmeshStore: a value's JSON text has at most {MAX_VALUE_CHARS} characters "
                             f"(got {len(text)})")
        bank = self.bank_of(namespace)
        before = self._current(bank, mkey)
        created = (before.get("valid_from") or before["time"]) if before is not None else _now_iso()
        entities = [_item_entity(mkey), *(_in_entity(namespace[:i]) for i in range(1, len(namespace) + 1)),
                    _ns_entity(namespace)]
        # create: the same value under another key is another item, never a merge.
        out = self.client.call_tool(self.agent, "remember", {
            "key": mkey, "value": text, "tags": [TAG], "bank": bank, "entities": entities, "valid_from": created,
            "on_duplicate": "create"})
        for warning in out.get("warnings", []):
            log.warning("memmesh: %s: %s", mkey, warning)

    def _delete(self, namespace: tuple[str, ...], key: str) -> None:
        if not namespace:
            return
        bank = self.bank_of(namespace)
        mkey = memory_key(namespace, key)
        try:
            self.client.call_tool(self.agent, "forget", {"key": mkey, "bank": bank})
            return
        except Exception as exc:
            name = _error_name(exc)
            if name == "UnknownMemory":
                return  # nothing stored under the key: deleting it is done
            if name not in ("ForgetRefused", "ToolNotAllowed"):
                raise
        # The agent may not erase what others wrote (or may not forget at all): retire the item
        # for everyone instead, by a row that ended now (a refusal to write says so in one line).
        m = self._current(bank, mkey)
        if m is None:
            return
        self.client.call_tool(self.agent, "remember", {
            "key": mkey, "value": m["value"], "tags": [TAG], "bank": bank, "entities": [_item_entity(mkey)],
            "valid_to": _now_iso(), "on_duplicate": "create"})

    # ------------------------------------------------------------------ search, list
    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        if op.filter is not None:
            if not isinstance(op.filter, dict):
                raise ValueError("search filter: a filter is a dict of value fields")
            _check_filter(op.filter)
        if op.limit <= 0 or op.offset < 0 or len(prefix) > MAX_DEPTH:
            return []
        query = op.query or ""
        want = op.offset + op.limit
        entities = [_in_entity(prefix)] if prefix else []
        found: list[list[SearchItem]] = []
        for bank in self._banks(prefix):
            items: list[SearchItem] = []
            # recall's pages, until enough items pass the filter or the ranking ends (or reaches
            # the depth recall pages to)
            for start in range(0, MAX_PAGE_DEPTH, MAX_LIMIT):
                page = self._recall(bank, query=query, entities=entities, limit=MAX_LIMIT, offset=start, count=True)
                for m in page:
                    item = self._item(m, bank, SearchItem)
                    if item is not None and (not op.filter or _matches(item.value, op.filter)):
                        assert isinstance(item, SearchItem)
                        items.append(item)
                if len(page) < MAX_LIMIT or len(items) >= want:
                    break
            found.append(items)
        if len(found) == 1:
            merged = found[0]
        elif query.strip():
            # Recall's scores are not published and do not compare across databases: take the
            # databases' results in turn, each in its own order.
            merged = [it for rank in itertools.zip_longest(*found) for it in rank if it is not None]
        else:
            merged = sorted((it for f in found for it in f), key=lambda it: it.updated_at, reverse=True)
        return merged[op.offset:want]

    def _list(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        namespaces: set[tuple[str, ...]] = set()
        for bank in self._banks(()):
            # memory.entities is an operator's listing, asked with no agent: a recall first refuses
            # a bank this agent may not read (or an agent that may not recall), as search would.
            self._recall(bank, entities=[], limit=1, count=False)
            data = self.client.run("memory.entities", {"bank": self.agent if bank is None else bank}).data
            for e in data["entities"]:
                ns = _ns_of_entity(e["entity"])
                if ns is not None and self.bank_of(ns) == bank:
                    namespaces.add(ns)
        kept = [ns for ns in namespaces if all(_does_match(c, ns) for c in op.match_conditions or ())]
        if op.max_depth is not None:
            kept = list({ns[:op.max_depth] for ns in kept})
        return sorted(kept)[op.offset:op.offset + op.limit]


def _does_match(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    part = namespace[:len(path)] if condition.match_type == "prefix" else namespace[len(namespace) - len(path):]
    return all(p == "*" or p == n for p, n in zip(path, part))
