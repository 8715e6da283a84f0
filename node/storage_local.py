"""Peer-local records in the storage file: namespaced keys and values this node keeps for
itself (agents, banks, peers, fences ...), never synced."""
from __future__ import annotations

from collections.abc import Iterable

from memmesh.crdt.storage import check_bytes, check_local_items, check_name
from memmesh.node.storage_connection import SqliteConnection


class LocalRecords(SqliteConnection):
    """The ``local`` table: (ns, key) -> value."""

    def get_local(self, ns: str, key: str) -> bytes | None:
        with self._reading() as conn:
            check_name(ns, "namespace")
            check_name(key, "key")
            row = conn.execute("SELECT value FROM local WHERE ns = ? AND key = ?", (ns, key)).fetchone()
            return None if row is None else row[0]

    def put_local(self, ns: str, key: str, value: bytes) -> None:
        with self._lock:
            self._connection()
            check_name(ns, "namespace")
            check_name(key, "key")
            data = check_bytes(value, "value")
            with self._transaction() as cur:
                cur.execute(
                    "INSERT INTO local (ns, key, value) VALUES (?, ?, ?) "
                    "ON CONFLICT (ns, key) DO UPDATE SET value = excluded.value",
                    (ns, key, data),
                )

    def put_local_many(self, ns: str, items: Iterable[tuple[str, bytes]]) -> None:
        with self._lock:
            self._connection()
            check_name(ns, "namespace")
            batch = check_local_items(items)  # all validated before the transaction begins
            if not batch:
                return
            with self._transaction() as cur:
                cur.executemany(
                    "INSERT INTO local (ns, key, value) VALUES (?, ?, ?) "
                    "ON CONFLICT (ns, key) DO UPDATE SET value = excluded.value",
                    ((ns, key, value) for key, value in batch),
                )

    def delete_local(self, ns: str, key: str) -> bool:
        with self._lock:
            self._connection()
            check_name(ns, "namespace")
            check_name(key, "key")
            with self._transaction() as cur:
                cur.execute("DELETE FROM local WHERE ns = ? AND key = ?", (ns, key))
                return cur.rowcount > 0

    def items_local(self, ns: str) -> list[tuple[str, bytes]]:
        with self._reading() as conn:
            check_name(ns, "namespace")
            # BINARY collation compares UTF-8 bytes, which orders like Python's str comparison.
            return [tuple(r) for r in conn.execute("SELECT key, value FROM local WHERE ns = ? ORDER BY key", (ns,))]
