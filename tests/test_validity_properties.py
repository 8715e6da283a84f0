"""Properties P1-P5 of docs/security.md ("Authorisation"), over random DAGs of settings and data entries.

A history is built by a root that grants a few keys, then random steps: some author (any of
4-6 keys, plus a fresh key in the planted cascade) writes a data entry, a grant, a change, a revocation or two operations at once,
after optionally syncing with one earlier event (so authors often have not seen each other's
latest entries and branches are concurrent). Unauthorised steps are kept: they must be
rejected.

The checks use their own naive reading of the rules (``before``, ``naive_state``) rather than
the implementation's helpers.
"""
from __future__ import annotations

import random
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memmesh.auth.ops import GrantOp, RevokeOp
from memmesh.auth.permissions import Permission, rank
from memmesh.crdt.validity import (
    Evaluator,
    Event,
    Verdict,
    current_settings,
    evaluate,
    merge_vv,
    past_vv,
    settings_at,
)
from tests.dagbuilder import DagBuilder
from tests.dbkit import key_str as key

NAMES = ["R", "A", "B", "C", "D", "E"]
PERMS = ["admin", "write", "read"]


def grant(k: str, perm: str, priority: int) -> GrantOp:
    return GrantOp(k, perm, None if perm == "read" else priority)


# ------------------------------------------------------------------------------ strategy

_step = st.tuples(
    st.integers(0, 5),  # author (mod number of keys)
    st.one_of(st.none(), st.integers(0, 10_000)),  # sync with this earlier event (mod count)
    st.integers(0, 9),  # kind: 0-3 data, 4-5 grant/change, 6-7 revoke, 8-9 two operations
    st.integers(0, 5), st.sampled_from(PERMS), st.integers(0, 3),  # operation
    st.integers(0, 5), st.sampled_from(PERMS), st.integers(0, 4),  # second operation (4: revoke)
)
_root_grant = st.sampled_from([None, None, "admin", "admin", "write", "read"])


@st.composite
def histories(draw, min_steps: int = 10, max_steps: int = 40, honest: bool = False,
              cascade: bool = False) -> list[Event]:
    """A random history.

    ``honest``: keys[1] is Admin(1) by the root's grant and grants keys[2] Write(4); no other
    operation ever targets keys[0..2] (a chain P5 must keep valid while the other keys fight).
    ``cascade``: keys[1] starts as Admin(2); somewhere in the history it grants a fresh key F
    Write(3), F writes, and the root revokes keys[1] without having seen that grant.
    """
    n = draw(st.integers(5, 6) if honest else st.integers(4, 6))
    keys = [key(name) for name in NAMES[:n]]
    targets = keys[3:] if honest else keys
    d = DagBuilder()
    root_ops = [GrantOp(keys[1], "admin", 1 if honest else 2)] if honest or cascade else []
    for k in targets:
        perm = draw(_root_grant)
        if perm is not None and k != keys[0] and not (cascade and k == keys[1]):
            root_ops.append(grant(k, perm, draw(st.integers(0, 3))))
    root = d.root(keys[0], root_ops)
    for k in keys[1:]:
        d.learn(k, root)
    if honest:
        d.add(keys[1], [GrantOp(keys[2], "write", 4)])
    m = len(targets)
    steps = draw(st.lists(_step, min_size=min_steps, max_size=max_steps))
    plant_at = draw(st.integers(0, len(steps))) if cascade else -1
    for i in range(len(steps) + 1):
        if i == plant_at:
            fresh = key("F")
            g = d.add(keys[1], [GrantOp(fresh, "write", 3)])
            d.learn(fresh, g)
            d.add(fresh)
            d.add(keys[0], [RevokeOp(keys[1])])
            d.add(fresh)
        if i == len(steps):
            break
        a, sync, kind, t, p, pr, t2, p2, pr2 = steps[i]
        sees = [d.events[sync % len(d.events)]] if sync is not None else []
        if kind < 4:
            ops: tuple = ()
        elif kind < 6:
            ops = (grant(targets[t % m], p, pr),)
        elif kind < 8:
            ops = (RevokeOp(targets[t % m]),)
        else:
            second = RevokeOp(targets[t2 % m]) if pr2 == 4 else grant(targets[t2 % m], p2, pr2)
            ops = (grant(targets[t % m], p, pr), second)
        d.add(keys[a % n], ops, sees)
    return d.events


# --------------------------------------------------------------------------- naive oracle


def before(x: Event, e: Event) -> bool:
    """x is in e's causal past."""
    return x.id != e.id and e.vv.get(x.author, -1) >= x.seq


def conc(a: Event, b: Event) -> bool:
    return a.id != b.id and not before(a, b) and not before(b, a)


def effective_ops(e: Event) -> dict:
    """The last operation on each key in one entry."""
    out = {}
    for op in e.ops:
        out[op.key] = op
    return out


def naive_state(accepted: list[Event], k: str, scope) -> tuple[str, Permission | None] | None:
    """("active", perm) / ("revoked", None) / None from the accepted entries in scope."""
    cands = [(e, effective_ops(e)[k]) for e in accepted if scope(e) and k in effective_ops(e)]
    maximal = [(e, op) for e, op in cands if not any(before(e, f) for f, _ in cands)]
    if not maximal:
        return None
    if any(isinstance(op, RevokeOp) for _, op in maximal):
        return ("revoked", None)
    return ("active", max((op.permission for _, op in maximal), key=rank))


def perm_in_past(accepted: list[Event], k: str, e: Event) -> Permission | None:
    st_ = naive_state(accepted, k, lambda x: before(x, e))
    return st_[1] if st_ else None


def accepted_of(events: list[Event], verdicts) -> list[Event]:
    return [e for e in events if verdicts[e.id].accepted]


def removals(accepted: list[Event]):
    """(entry, target, new permission or None) of every accepted revocation or demotion."""
    for r in accepted:
        if r.is_root:
            continue
        for k, op in effective_ops(r).items():
            if isinstance(op, RevokeOp):
                yield r, k, None
            else:
                prev = perm_in_past(accepted, k, r)
                if prev is not None and rank(op.permission) > rank(prev):
                    yield r, k, op.permission


def needs(e: Event) -> str:
    return "admin" if e.ops else "write"


def level_holds(p: Permission | None, needed: str) -> bool:
    order = {"admin": 0, "write": 1, "read": 2}
    return p is not None and order[p.level] <= order[needed]


def causal_order(events: list[Event], rnd: random.Random) -> list[Event]:
    done: set[tuple[str, int]] = set()
    pending = list(events)
    out = []
    while pending:
        ready = [e for e in pending if all((a, s) in done for a, s in past_vv(e).items())]
        e = rnd.choice(ready)
        pending.remove(e)
        done.add((e.author, e.seq))
        out.append(e)
    return out


COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---------------------------------------------------------------------------------- P1


@settings(max_examples=150, **COMMON)
@given(st.one_of(histories(), histories(cascade=True)), st.randoms(use_true_random=False))
def test_p1_determinism_order_independent(events, rnd):
    ref = evaluate(events)
    assert set(ref) == {e.id for e in events}
    for _ in range(2):
        shuffled = list(events)
        rnd.shuffle(shuffled)
        assert evaluate(shuffled + shuffled[:3]) == ref  # order and duplicates do not matter

    accepted = accepted_of(events, ref)
    for _ in range(3):
        ev = Evaluator()
        reported: dict = {}
        added: list[Event] = []
        for e in causal_order(events, rnd):
            hopeless = ev.never_valid(e)
            if hopeless is not None:  # sound: nothing added later can make it valid
                assert not ref[e.id].accepted, hopeless
            changes = ev.add(e)
            assert e.id in changes
            reported.update(changes)
            added.append(e)
            if rnd.random() < 0.2:
                assert ev.add(rnd.choice(added)) == {}  # duplicates are ignored
        assert ev.verdicts() == ref
        assert reported == ref  # add() reported every change
        assert ev.settings() == current_settings(accepted)
        for e in rnd.sample(events, min(4, len(events))):
            assert ev.settings_at(past_vv(e)) == settings_at(accepted, past_vv(e))

    batch = Evaluator()
    assert batch.add_many(events + events[:2]) == ref  # one run of the rounds for the lot
    assert batch.full_evaluations == 1 and batch.add_many(events) == {}

    # the settings agree with a naive reading of the rule
    snapshot = current_settings(accepted)
    for k in {op.key for e in events for op in e.ops}:
        expected = naive_state(accepted, k, lambda x: True)
        got = snapshot.get(k)
        assert (None if got is None else (got.status, got.permission)) == expected


@settings(max_examples=60, **COMMON)
@given(histories(), st.randoms(use_true_random=False))
def test_p1_evaluator_matches_reference_on_every_prefix(events, rnd):
    ev = Evaluator()
    added: list[Event] = []
    for e in causal_order(events, rnd):
        ev.add(e)
        added.append(e)
        assert ev.verdicts() == evaluate(added)


# ---------------------------------------------------------------------------------- P2


def test_p2_no_backdating():
    stats = Counter()

    @settings(max_examples=200, **COMMON)
    @given(histories())
    def check(events):
        verdicts = evaluate(events)
        accepted = accepted_of(events, verdicts)
        for r, k, new in removals(accepted):
            regrants = [g for g in accepted if before(r, g)
                        and isinstance(effective_ops(g).get(k), GrantOp)]
            for x in accepted:
                if x.author != k or x.id == r.id or level_holds(new, needs(x)):
                    continue  # not an entry using what r took away
                ok = before(x, r) or any(
                    before(g, x) and level_holds(effective_ops(g)[k].permission, needs(x))
                    for g in regrants)
                assert ok, f"{x.id} by a revoked key is accepted outside {r.id}'s past"
                stats["checked"] += 1
            stats["removals"] += 1
        stats["voided"] += sum(v.reason == "auth.voided" for v in verdicts.values())

    check()
    assert stats["removals"] > 50 and stats["checked"] > 50 and stats["voided"] > 20, stats


# ---------------------------------------------------------------------------------- P3


def test_p3_priority():
    stats = Counter()

    @settings(max_examples=200, **COMMON)
    @given(histories())
    def check(events):
        verdicts = evaluate(events)
        accepted = accepted_of(events, verdicts)
        for e in accepted:
            if e.is_root or not e.ops:
                continue
            actor = perm_in_past(accepted, e.author, e)
            assert actor is not None and actor.level == "admin"
            for op in e.ops:
                target = perm_in_past(accepted, op.key, e)
                if target is not None and target.priority is not None:
                    assert target.priority >= actor.priority, "changed a stronger key"
                if isinstance(op, GrantOp) and op.priority is not None:
                    assert op.priority >= actor.priority, "granted more than it holds"
                stats["ops"] += 1
        stats["rejected_priority"] += sum(
            v.reason in ("auth.target_stronger", "auth.grant_exceeds") for v in verdicts.values())

    check()
    assert stats["ops"] > 100 and stats["rejected_priority"] > 20, stats


# ---------------------------------------------------------------------------------- P4


def test_p4_cascade():
    stats = Counter()

    @settings(max_examples=200, **COMMON)
    @given(st.one_of(histories(), histories(cascade=True)))
    def check(events):
        verdicts = evaluate(events)
        accepted = accepted_of(events, verdicts)
        fallen: set[str] = set()  # settings entries of K concurrent with K losing admin
        for r, k, new in removals(accepted):
            if level_holds(new, "admin"):
                continue
            for g in events:
                if g.author == k and g.ops and conc(g, r):
                    assert not verdicts[g.id].accepted, f"{g.id} made concurrently with {r.id}"
                    fallen.add(g.id)
                    stats["fallen"] += 1
        for x in events:
            if x.is_root:
                continue
            sources = [g for g in events if before(g, x)
                       and any(isinstance(op, GrantOp) and op.key == x.author for op in g.ops)]
            if sources and all(g.id in fallen for g in sources):
                assert not verdicts[x.id].accepted, f"{x.id} kept authority from fallen grants"
                stats["dependants"] += 1

    check()
    assert stats["fallen"] > 50 and stats["dependants"] > 50, stats


# ---------------------------------------------------------------------------------- P5


def chain(e: Event, events: list[Event], verdicts) -> tuple[set[str], set[str]] | None:
    """The entries and keys e's authority rests on; None if one of them does not count."""
    def depends_on(g: Event) -> set[str]:  # the keys whose states g's verdict reads
        return set() if g.is_root else {g.author} | {op.key for op in g.ops}

    entries = {e.id}
    keys = depends_on(e)
    members = [e]
    changed = True
    while changed:
        changed = False
        for g in events:
            if g.id in entries or not any(op.key in keys for op in g.ops):
                continue
            if any(before(g, m) for m in members):
                if not verdicts[g.id].accepted:
                    return None  # a cancelled grant (or rejected change) in the chain
                entries.add(g.id)
                keys |= depends_on(g)
                members.append(g)
                changed = True
    return entries, keys


def test_p5_stability_honest_writers():
    stats = Counter()

    @settings(max_examples=200, **COMMON)
    @given(st.one_of(histories(), histories(honest=True)), st.data())
    def check(events, data):
        picks = data.draw(st.lists(st.integers(0, len(events) - 1), min_size=1, max_size=3))
        vv = merge_vv(*(events[i].vv for i in picks))
        sub = [e for e in events if vv.get(e.author, -1) >= e.seq]  # causally closed
        v_sub = evaluate(sub)
        v_all = evaluate(events)
        added = [e for e in events if e.id not in {s.id for s in sub}]
        for e in sub:
            if not v_sub[e.id].accepted:
                continue
            found = chain(e, sub, v_sub)
            if found is None:
                continue
            entries, keys = found
            # honest: nothing anywhere touches a key of the chain but the chain itself
            if any(op.key in keys and g.id not in entries for g in events for op in g.ops):
                continue
            assert v_all[e.id].accepted, f"honest {e.id} lost its validity"
            stats["honest"] += 1
            if any(v_all[g.id].reason == "auth.voided" for g in added):
                stats["honest_amid_voids"] += 1
            if any(v_all[g.id].accepted and any(isinstance(op, RevokeOp) for op in g.ops)
                   for g in added):
                stats["honest_amid_revocations"] += 1

    check()
    assert stats["honest"] > 200 and stats["honest_amid_revocations"] > 10, stats


# ---------------------------------------------------------------------- named scenario


def test_revoked_admin_backdates():
    R, B, W, X = key("R"), key("B"), key("W"), key("X")
    d = DagBuilder()
    root = d.root(R, [GrantOp(B, "admin", 1), GrantOp(W, "write", 5)])
    d.learn(B, root)
    d.learn(W, root)
    w_before = d.add(W)
    revoke_b = d.add(R, [RevokeOp(B)], sees=[w_before])
    # B, revoked, writes with parents that predate its revocation.
    backdated = d.add(B, [RevokeOp(W), GrantOp(X, "write", 3)])
    d.learn(X, backdated)
    x_writes = [d.add(X), d.add(X)]
    w_saw_revocation = d.add(W, sees=[revoke_b])
    w_saw_backdated = d.add(W, sees=[backdated])
    w_saw_both = d.add(W, sees=[revoke_b, backdated])
    b_after = d.add(B, sees=[revoke_b])
    events = d.events

    verdicts = evaluate(events)
    assert verdicts[root.id].accepted and verdicts[revoke_b.id].accepted
    assert verdicts[backdated.id] == Verdict(False, "auth.voided", (root.id,), revoke_b.id)
    for x in x_writes:
        assert not verdicts[x.id].accepted  # its only authority was the voided grant
    for w in (w_before, w_saw_revocation, w_saw_backdated, w_saw_both):
        assert verdicts[w.id].accepted, w
    assert verdicts[b_after.id].reason == "auth.revoked"

    final = current_settings(accepted_of(events, verdicts))
    assert final.get(B).status == "revoked"
    assert final.get(W).status == "active"
    assert final.get(X) is None

    for seed in range(5):  # every arrival order gives the same answer
        ev = Evaluator()
        for e in causal_order(events, random.Random(seed)):
            ev.add(e)
        assert ev.verdicts() == verdicts
