"""An imported bank is held as staging built it (``Database.adopt``), not read back from the log.

The bank is copied into a database in memory, where every entry passes the whole pipeline;
its entries are then appended to the node's storage and the node takes the staged database's
log index instead of opening the copy again (which hashes and indexes every entry anew). The
adopted database must be exactly what an open of the same storage gives, whatever the history
(grants, revocations, erasures, forks, entries still waiting), and stay so as it grows.
"""
from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.auth.errors import AuthError
from memmesh.auth.ops import GrantOp, RevokeOp
from memmesh.crdt.database import Database
from memmesh.crdt.entry import client_id_for
from memmesh.crdt.errors import MemmeshError
from memmesh.crdt.open_marks import read_marks
from memmesh.crdt.storage import MemoryStorage
from memmesh.crdt.yjs import encode_rows
from memmesh.node.home import Home
from memmesh.node.storage import SqliteStorage
from tests.dbkit import craft, feed, key, new_db, next_clock, replica, rows_update, write
from tests.sim import db_state

KEYS = [key(n) for n in range(60, 64)]  # KEYS[0] creates the bank


def observed(db: Database) -> dict[str, Any]:
    """What a reader of the database can see: everything ``Database.open`` derives."""
    ids = sorted(db._nodes)
    stores = db.stores()
    return {
        **db_state(db),
        "len": len(db),
        "heads": db.heads,
        "feeds": db.feeds(),
        "equivocators": db.equivocators,
        "evidence": db.evidence(),
        "verdicts": {i: db.verdict(i) for i in ids},
        "payloads": {(i, s): db.payload_state(i, s) for i in ids for s in stores},
        "shown": {s: sorted(db.shown_entries(s)) for s in stores},
        "meta": db.meta(),
        "pending": db.pending_ids(),
        "wanted": db.wanted(),
        "next_clocks": dict(db._next_clock),
        "permissions": {str(k.public): db.permission(str(k.public)) for k in KEYS},
        "missing_for_none": db.missing_for({}),
    }


def _clock() -> int:
    return 1_700_000_000_000  # entries' ts: with the nonce below, the same history signs the same ids


def _bank() -> Database:
    return Database.create(MemoryStorage(), KEYS[0], meta={"kind": "bank", "display_name": "t"},
                           nonce=bytes(16), clock=_clock)


def _replica(db: Database) -> Database:
    storage = MemoryStorage()
    storage.add_database(db.id)
    other = Database(storage, db.id, clock=_clock)
    feed(other, db)
    return other


def _grant(rnd: random.Random, who: Any) -> GrantOp:
    perm = rnd.choice(["admin", "write", "read"])
    return GrantOp(str(who.public), perm, None if perm == "read" else rnd.randint(1, 3))


def _history(rnd: random.Random, steps: int) -> list[Database]:
    """Replicas of one bank after a random history: grants, revocations, writes on stale views,
    erasures, and (sometimes) a fork signed by one key."""
    root = _bank()
    for k in KEYS[1:]:
        root.change_settings(KEYS[0], [_grant(rnd, k)])
    replicas = [root] + [_replica(root) for _ in KEYS[1:]]
    for n in range(steps):
        who = rnd.randrange(len(KEYS))
        db, k = replicas[who], KEYS[who]
        r = rnd.random()
        try:
            if r < 0.5:
                write(db, k, {"key": f"k{n % 4}", "value": f"v{n}"})
            elif r < 0.6:
                db.change_settings(k, [_grant(rnd, KEYS[rnd.randrange(1, len(KEYS))])])
            elif r < 0.67:
                db.change_settings(k, [RevokeOp(str(KEYS[rnd.randrange(1, len(KEYS))].public))])
            elif r < 0.75:
                mine = [i for i in db.accepted_ids() if db.payload_state(i, "memory") == "present"]
                if mine:
                    db.erase(k, rnd.choice(sorted(mine)), "memory")
            else:
                feed(replicas[rnd.randrange(len(KEYS))], db)
        except AuthError:
            pass  # refused on that replica: nothing stored
    if rnd.random() < 0.5:  # rows repeating a key their author showed: stored, never shown
        db, k = replicas[0], KEYS[0]
        client = client_id_for(k.public.raw)
        clock = next_clock(db, k, "memory")
        repeat = craft(db, k, {"memory": (encode_rows(client, clock, "memory", [(f"{client}/0", "again")]), clock, 1)})
        db.ingest([(repeat.header, dict(repeat.payloads))])
        write(db, k, {"key": "after the repeat", "value": 0})
    if rnd.random() < 0.4:  # a fork: a second entry at a seq where the writer wrote a memory
        db, k = replicas[0], KEYS[0]
        written = [db.entry(i) for i in sorted(db._nodes)]
        prior = next((e for e in written if e is not None and e.author_key == str(k.public)
                      and "memory" in e.stores), None)
        if prior is not None:
            clock = prior.stores["memory"].clock
            fork = craft(db, k, {"memory": rows_update(k, "memory", clock, ["forked"])}, seq=prior.seq,
                         prev=prior.prev, parents=list(prior.parents))
            db.ingest([(fork.header, dict(fork.payloads))])
    return replicas


def _staged(rnd: random.Random, replicas: list[Database]) -> Database:
    """A staging database as the import makes one: in memory, fed in pages (duplicates, and
    some entries whose parents or payloads never arrive, which wait in its pending area)."""
    seen: dict[str, tuple[bytes, dict[str, bytes | None]]] = {}
    for db in replicas:
        for s in db.storage.entries(db.id):
            seen.setdefault(s.id, (s.header, dict(s.payloads)))
    items = list(seen.values())
    withheld = set(rnd.sample(range(1, len(items)), k=min(2, len(items) - 1))) if rnd.random() < 0.3 else set()
    delivery = [it for n, it in enumerate(items) if n not in withheld]
    if rnd.random() < 0.3:  # one arrives without its memory payload (a relay stripped it): it waits
        n = rnd.randrange(1, len(delivery))
        header, payloads = delivery[n]
        delivery[n] = header, {s: (None if s == "memory" else p) for s, p in payloads.items()}
    delivery += rnd.sample(delivery, k=min(len(delivery), 3))
    rnd.shuffle(delivery)
    storage = MemoryStorage()
    storage.add_database(replicas[0].id)
    staged = Database.open(storage, replicas[0].id)
    for at in range(0, len(delivery), 7):
        staged.ingest(delivery[at:at + 7], source="peer:issuer")
    return staged


def _stored_here(staged: Database, path: Path) -> SqliteStorage:
    """The staged entries appended to a node's storage, as the import stores them."""
    storage = SqliteStorage(path)
    storage.add_database(staged.id)
    storage.append(staged.id, staged.storage.entries(staged.id))
    return storage


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False), st.integers(3, 40))
def test_the_adopted_database_is_what_an_open_gives(rnd: random.Random, steps: int) -> None:
    replicas = _history(rnd, steps)
    staged = _staged(rnd, replicas)
    marks = read_marks(staged.storage, staged.id)
    with tempfile.TemporaryDirectory() as tmp:
        storage = _stored_here(staged, Path(tmp) / "node.sqlite")
        try:
            adopted = Database.adopt(storage, staged)
            # Adoption records the checked marks staging made, as an open records those it makes.
            assert read_marks(storage, staged.id) == marks
            opened = Database.open(storage, staged.id)
            assert observed(adopted) == observed(opened)
            # Adopted, it grows as an opened database does: a write, then an open again.
            admins = [k for k in KEYS if str(k.public) not in adopted.equivocators
                      and getattr(adopted.permission(str(k.public)), "level", None) == "admin"]
            if admins:
                adopted.set_meta(admins[0], description="after the import")
                assert observed(adopted) == observed(Database.open(storage, staged.id))
        finally:
            storage.close()


def test_adopting_storage_that_holds_other_entries_is_refused(tmp_path: Path) -> None:
    bank = new_db(KEYS[0])
    for i in range(3):
        write(bank, KEYS[0], {"key": f"k{i}", "value": i})
    staged = replica(bank)
    storage = SqliteStorage(tmp_path / "node.sqlite")
    storage.add_database(staged.id)
    storage.append(staged.id, list(staged.storage.entries(staged.id))[:2])
    with pytest.raises(MemmeshError, match="holds 2 entries here, not the 4"):
        Database.adopt(storage, staged)
    unknown = replica(new_db(KEYS[1]))
    with pytest.raises(MemmeshError, match="no database"):
        Database.adopt(storage, unknown)
    storage.close()


def test_the_node_holds_the_adopted_database_and_tells_its_listeners(tmp_path: Path) -> None:
    bank = new_db(KEYS[0])
    write(bank, KEYS[0], {"key": "a", "value": 1})
    staged = replica(bank)
    with Home.open(tmp_path / "home") as home:
        seen: list[Database] = []
        home.on_open(seen.append)
        home.storage.add_database(staged.id)
        home.storage.append(staged.id, staged.storage.entries(staged.id))
        adopted = home.adopt(staged)
        assert home.database(staged.id) is adopted and seen == [adopted]
        assert db_state(adopted) == db_state(bank)
        with pytest.raises(MemmeshError, match="open on this node already"):
            home.adopt(replica(bank))
    with Home.open(tmp_path / "home") as home:  # and a restart reads the same bank
        assert db_state(home.database(staged.id)) == db_state(bank)
