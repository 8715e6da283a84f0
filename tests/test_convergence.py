"""Convergence: replicas that receive the same entries, in any order, end identical.

A random history is made by real databases, one replica per key, that write, grant, revoke
and sync partially (so keys act on stale views: writes concurrent with their own revocation,
admins racing each other). Every entry any replica stored is then delivered to several fresh
replicas in random orders, in random batches, with duplicates; all must end with the same
accepted set, the same settings and the same store contents.
"""
from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.auth.errors import AuthError
from memmesh.auth.ops import GrantOp, RevokeOp
from memmesh.crdt.database import Database
from memmesh.crdt.storage import MemoryStorage
from tests.dbkit import feed, key, new_db, replica, state

KEYS = [key(n) for n in range(10, 15)]  # KEYS[0] creates the database

def _history(rnd: random.Random, steps: int) -> list[tuple]:
    """A random history that reliably has sub-admins, revocations and stale-view writes.

    The root first grants every other key something (admin with various priorities or write)
    and spreads that view; then keys act on their own, possibly stale, replicas.
    """
    acts: list[tuple] = []
    for k in range(1, 5):
        perm = rnd.choice(["admin", "write", "write", "read"])
        acts.append(("grant", 0, k, perm, rnd.randint(0, 3)))
    acts += [("sync", 0, k) for k in range(1, 5)]
    for _ in range(steps):
        r = rnd.random()
        if r < 0.45:
            acts.append(("write", rnd.randint(0, 4)))
        elif r < 0.6:
            acts.append(("grant", rnd.choice([0, 0, 1, 2, 3, 4]), rnd.randint(1, 4),
                         rnd.choice(["admin", "write", "read"]), rnd.randint(0, 3)))
        elif r < 0.72:
            acts.append(("revoke", rnd.choice([0, 0, 1, 2, 3, 4]), rnd.randint(1, 4)))
        else:
            acts.append(("sync", rnd.randint(0, 4), rnd.randint(0, 4)))
    return acts


def _run_history(actions) -> list[Database]:
    root = new_db(KEYS[0])
    replicas = [root] + [replica(root) for _ in KEYS[1:]]
    for n, act in enumerate(actions):
        kind = act[0]
        try:
            if kind == "write":
                db = replicas[act[1]]
                txn = db.transaction(KEYS[act[1]])
                txn.append("memory", {"key": f"k{n % 3}", "value": f"v{n}"})
                txn.commit()
            elif kind == "grant":
                _, who, target, perm, prio = act
                op = GrantOp(str(KEYS[target].public), perm, None if perm == "read" else prio)
                replicas[who].change_settings(KEYS[who], [op])
            elif kind == "revoke":
                _, who, target = act
                replicas[who].change_settings(KEYS[who], [RevokeOp(str(KEYS[target].public))])
            else:
                _, a, b = act
                feed(replicas[b], replicas[a])
        except AuthError:
            pass  # the local replica refused: nothing was stored
    return replicas


def _all_entries(replicas: list[Database]):
    seen = {}
    for db in replicas:
        for s in db.storage.entries(db.id):
            seen.setdefault(s.id, (s.header, dict(s.payloads)))
    return list(seen.values())


def _fresh(db_id: str) -> Database:
    storage = MemoryStorage()
    storage.add_database(db_id)
    return Database(storage, db_id)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False), st.integers(5, 60))
def test_replicas_converge_whatever_the_delivery_order(rnd: random.Random, steps: int):
    replicas = _run_history(_history(rnd, steps))
    entries = _all_entries(replicas)
    db_id = replicas[0].id
    states = []
    for _ in range(3):
        target = _fresh(db_id)
        delivery = entries + rnd.sample(entries, k=min(len(entries), rnd.randint(0, 5)))  # duplicates
        # Some entries also arrive first from a relay that strips their data payloads: they
        # wait as payload-pending and the full copy fills them in.
        delivery += [(h, {k: (None if k not in ("_settings", "_erase") else v) for k, v in p.items()})
                     for h, p in rnd.sample(entries, k=len(entries) // 3)]
        rnd.shuffle(delivery)
        i = 0
        while i < len(delivery):  # random batch sizes: delays between arrivals
            size = rnd.randint(1, 6)
            target.ingest(delivery[i:i + size])
            i += size
        assert target.storage.pending(db_id) == [], "every parent was delivered"
        assert target.wanted()["payloads"] == [], "every stripped payload was filled in"
        states.append(state(target))
        # Reopening from storage rebuilds exactly the same state.
        assert state(Database.open(target.storage, db_id)) == states[-1]
    assert states[0] == states[1] == states[2]
    # The replicas that made the history converge too once fully synced: the first takes what
    # every other stored, then every other takes what the first has (each replica exchanging
    # with every other one adds nothing to that, only duplicates).
    hub, others = replicas[0], replicas[1:]
    for db in others:
        feed(hub, db)
    for db in others:
        feed(db, hub)
    assert all(state(db) == states[0] for db in replicas)
