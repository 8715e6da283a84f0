"""Local writes: rows staged in a transaction, and the signed entry they become.

A transaction hands out row keys as rows are staged (``client/clock``), so the entry it signs
must start at the clocks it saw then; ``sign_local`` refuses to sign when another write of the
same author moved them meanwhile. Validation, storage and application are the ingest
pipeline's, as for any entry.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from memmesh.auth.keys import SigningKey
from memmesh.crdt.entry import Entry, sign_entry
from memmesh.crdt.errors import MemmeshError, RejectedError
from memmesh.crdt.log_index import LogIndex
from memmesh.crdt.records import _client, valid_store_name
from memmesh.crdt.yjs import encode_rows

# Signs, validates, stores and applies staged rows (store -> values) from the clocks the
# transaction saw (store -> next clock); returns the new entry's id.
Commit = Callable[[SigningKey, Mapping[str, list[Any]], Mapping[str, int]], str]


class Transaction:
    """Rows staged for one signed entry; commit() signs, validates, stores and applies it."""

    def __init__(self, key: SigningKey, *, next_clock: Callable[[str, str], int], commit: Commit) -> None:
        """``next_clock(author, store)``: the author's next Yjs clock in the store, as of now."""
        self._key = key
        self._next_clock = next_clock
        self._commit = commit
        self._staged: dict[str, list[Any]] = {}
        self._base: dict[str, int] = {}  # per store, the author's next clock at the first append
        self.entry_id: str | None = None

    def append(self, store: str, value: Any) -> str:
        """Stage a new row; returns the row key it will have once committed."""
        rows = self._staged.setdefault(store, [])
        rows.append(value)
        base = self._base.setdefault(store, self._next_clock(str(self._key.public), store))
        return f"{_client(self._key)}/{base + len(rows) - 1}"

    def commit(self) -> str:
        if self.entry_id is not None:
            raise MemmeshError("transaction already committed")
        if not self._staged:
            raise MemmeshError("nothing to commit")
        self.entry_id = self._commit(self._key, self._staged, self._base)
        return self.entry_id

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None and self._staged and self.entry_id is None:
            self.commit()


def sign_local(key: SigningKey, staged: Mapping[str, list[Any]], base: Mapping[str, int] | None,
               index: LogIndex, db_id: str, clock: Callable[[], int]) -> Entry:
    """The entry of ``key``'s next write: the staged rows, after the author's latest entry, on
    the current heads. ``base``: the clocks the transaction handed row keys out from."""
    author = str(key.public)
    client = _client(key)
    payloads: dict[str, tuple[bytes, int, int]] = {}
    for store, values in staged.items():
        if not valid_store_name(store):
            raise RejectedError("entry.store_name", f"invalid store name {store!r}")
        next_clock = index.next_clock(author, store)
        if base is not None and base.get(store, next_clock) != next_clock:
            raise MemmeshError(
                f"another write by {author} to {store!r} committed while this transaction was "
                "open, so the row keys it handed out changed; run the transaction again"
            )
        rows = [(f"{client}/{next_clock + i}", v) for i, v in enumerate(values)]
        try:
            update = encode_rows(client, next_clock, store, rows)
        except (TypeError, ValueError) as exc:  # a value Yjs cannot hold (or nests too deep)
            raise RejectedError("entry.value", f"a row for store {store!r} cannot be stored: {exc}") from None
        payloads[store] = (update, next_clock, len(rows))
    last = index.feed_top(author)
    return sign_entry(
        key, db=db_id, seq=0 if last is None else last[0] + 1,
        prev=None if last is None else last[1], parents=sorted(index.heads),
        ts=clock(), payloads=payloads,
    )
