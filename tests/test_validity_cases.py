"""Named cases of the valid-set rule (docs/security.md): one test per concurrent situation.

Every case is checked twice: by ``evaluate`` (the reference) and by an ``Evaluator`` fed in
several causal orders, which must agree.
"""
from __future__ import annotations

import random

from memmesh.auth.ops import GrantOp, RevokeOp
from memmesh.auth.permissions import Admin, Write
from memmesh.crdt import validity
from memmesh.crdt.validity import (
    Evaluator,
    Event,
    Verdict,
    current_settings,
    evaluate,
    merge_vv,
    past_vv,
)
from tests.dagbuilder import DagBuilder
from tests.dbkit import key_str as key

R, A, B, C, S, W, X, Y = (key(n) for n in "RABCSWXY")


def low_id(tag: str) -> str:  # ids chosen to fix the T order among equal heights
    return "sha256:" + "0" * 60 + tag.rjust(4, "0")


def high_id(tag: str) -> str:
    return "sha256:" + "f" * 60 + tag.rjust(4, "0")


def judge(events: list[Event]) -> dict[str, Verdict]:
    """evaluate(), checked against the Evaluator over several causal orders."""
    ref = evaluate(events)
    for seed in range(4):
        rnd = random.Random(seed)
        done: set[tuple[str, int]] = set()
        pending = list(events)
        ev = Evaluator()
        while pending:
            ready = [e for e in pending if all((a, s) in done for a, s in past_vv(e).items())]
            e = rnd.choice(ready)
            pending.remove(e)
            done.add((e.author, e.seq))
            ev.add(e)
        assert ev.verdicts() == ref
    return ref


def final_settings(events, verdicts):
    return current_settings([e for e in events if verdicts[e.id].accepted])


def start(*grants: GrantOp) -> tuple[DagBuilder, Event]:
    d = DagBuilder()
    root = d.root(R, grants)
    for k in (A, B, C, S, W, X, Y):
        d.learn(k, root)
    return d, root


# ------------------------------------------------------------------ concurrent admin changes


def test_equal_admins_revoking_each_other_earlier_in_t_order_wins():
    # A and B are both Admin(1); each revokes the other without having seen the other's
    # revocation. Equal revoker priority -> T order (height, then id): the revocation that
    # comes first wins; the other one is voided, so its author ends revoked.
    for a_first in (True, False):
        d, _ = start(GrantOp(A, "admin", 1), GrantOp(B, "admin", 1))
        ra = d.add(A, [RevokeOp(B)], id=low_id("a") if a_first else high_id("a"))
        rb = d.add(B, [RevokeOp(A)], id=high_id("b") if a_first else low_id("b"))
        assert ra.height == rb.height
        a_later = d.add(A, sees=[rb])
        b_later = d.add(B, sees=[ra])
        v = judge(d.events)
        winner, loser = (ra, rb) if a_first else (rb, ra)
        assert v[winner.id].accepted
        assert v[loser.id].reason == "auth.voided" and v[loser.id].voided_by == winner.id
        s = final_settings(d.events, v)
        assert s.get(loser.author).status == "revoked"
        assert s.get(winner.author).permission == Admin(1)
        assert v[(a_later if a_first else b_later).id].accepted
        assert v[(b_later if a_first else a_later).id].reason == "auth.revoked"


def test_grant_racing_revoke_revocation_wins():
    # The root revokes W while admin A, not having seen it, changes W's grant; W writes
    # under A's grant. The revocation wins: W's concurrent writes are void, W ends revoked;
    # the grant itself stays (A is not revoked) but no longer gives W anything.
    d, _ = start(GrantOp(A, "admin", 1), GrantOp(W, "write", 5))
    w0 = d.add(W)
    revoke = d.add(R, [RevokeOp(W)], sees=[w0])
    regrant = d.add(A, [GrantOp(W, "write", 2)])
    d.learn(W, regrant)
    w1 = d.add(W)
    w2 = d.add(W, sees=[revoke])  # has seen both: revoked
    v = judge(d.events)
    assert v[w0.id].accepted  # in the revocation's causal past
    assert v[revoke.id].accepted and v[regrant.id].accepted
    assert v[w1.id] == Verdict(False, "auth.voided", (regrant.id,), revoke.id)
    assert v[w2.id].reason == "auth.revoked"
    assert final_settings(d.events, v).get(W).status == "revoked"


def test_grant_racing_revoke_of_a_new_key():
    # B revokes X before X's first grant reached it; the grant and the revocation race.
    d, _ = start(GrantOp(A, "admin", 1), GrantOp(B, "admin", 1))
    g = d.add(A, [GrantOp(X, "write", 3)])
    d.learn(X, g)
    x1 = d.add(X)
    r = d.add(B, [RevokeOp(X)])
    v = judge(d.events)
    assert v[g.id].accepted and v[r.id].accepted
    assert v[x1.id].reason == "auth.voided" and v[x1.id].voided_by == r.id


def test_stronger_admin_revocation_beats_weaker_concurrent_revocation_of_it():
    # S starts as Admin(3), W as Admin(2). The root promotes S to Admin(1). W, not having seen
    # the promotion, revokes S (allowed in its past: S was weaker). S, promoted, revokes W.
    # The stronger revoker (S, priority 1) goes first, even though W's revocation comes first
    # in T order: it voids W's concurrent revocation, which never acts.
    d, _ = start(GrantOp(S, "admin", 3), GrantOp(W, "admin", 2))
    promote = d.add(R, [GrantOp(S, "admin", 1)])
    rw = d.add(W, [RevokeOp(S)], id=low_id("w"))
    rs = d.add(S, [RevokeOp(W)], sees=[promote])
    assert (rw.height, rw.id) < (rs.height, rs.id)
    s_later = d.add(S, [GrantOp(X, "write", 4)], sees=[rw])
    v = judge(d.events)
    assert v[rs.id].accepted
    assert v[rw.id].reason == "auth.voided" and v[rw.id].voided_by == rs.id
    assert v[s_later.id].accepted  # W's revocation of S does not count
    s = final_settings(d.events, v)
    assert s.get(S).permission == Admin(1)
    assert s.get(W).status == "revoked"


def test_voided_revocation_does_not_void_its_victims():
    # A and B are both Admin(1). A revokes C; B concurrently revokes A, and A's revocation
    # comes first in T order so it acts first. B's revocation then voids A's, so A's
    # revocation of C has no effect: C's concurrent writes stay valid.
    d, _ = start(GrantOp(A, "admin", 1), GrantOp(B, "admin", 1), GrantOp(C, "write", 5))
    ra = d.add(A, [RevokeOp(C)], id=low_id("a"))
    rb = d.add(B, [RevokeOp(A)], id=high_id("b"))
    c1 = d.add(C)  # concurrent with A's revocation
    c2 = d.add(C, sees=[ra])  # after it
    v = judge(d.events)
    assert v[rb.id].accepted
    assert v[ra.id].reason == "auth.voided" and v[ra.id].voided_by == rb.id
    assert v[c1.id].accepted and v[c2.id].accepted
    s = final_settings(d.events, v)
    assert s.get(C).permission == Write(5) and s.get(A).status == "revoked"


def test_demotion_voids_concurrent_admin_work_but_keeps_writes():
    # The root demotes A from Admin(1) to Write(4). A, not having seen it, grants Y and
    # writes data. The grant used the admin permission the demotion removed: void (and Y's
    # writes with it); the data write only needed Write, which A still holds: valid.
    d, _ = start(GrantOp(A, "admin", 1))
    demote = d.add(R, [GrantOp(A, "write", 4)])
    g = d.add(A, [GrantOp(Y, "write", 3)])
    data = d.add(A)
    d.learn(Y, g)
    y1 = d.add(Y)
    a_after = d.add(A, [GrantOp(Y, "read")], sees=[demote])
    v = judge(d.events)
    assert v[g.id].reason == "auth.voided" and v[g.id].voided_by == demote.id
    assert v[data.id].accepted
    assert not v[y1.id].accepted
    assert v[a_after.id].reason == "auth.not_admin"
    assert final_settings(d.events, v).get(A).permission == Write(4)


def test_priority_lowering_voids_concurrent_changes_beyond_the_new_priority():
    # A goes from Admin(1) to Admin(3); concurrently A granted X Write(2) (fine for Admin(1),
    # too much for Admin(3)) and Y Write(5) (fine for both).
    d, _ = start(GrantOp(A, "admin", 1))
    lower = d.add(R, [GrantOp(A, "admin", 3)])
    gx = d.add(A, [GrantOp(X, "write", 2)])
    gy = d.add(A, [GrantOp(Y, "write", 5)])
    v = judge(d.events)
    assert v[lower.id].accepted
    assert v[gx.id].reason == "auth.voided" and v[gx.id].voided_by == lower.id
    assert v[gy.id].accepted


def test_concurrent_grants_weakest_wins():
    # A makes X Admin(2) while B, concurrently, makes X Write(3): after both, X holds the
    # weakest, Write(3). What X did with Admin(2) before seeing B's grant stays valid.
    d, _ = start(GrantOp(A, "admin", 1), GrantOp(B, "admin", 1))
    ga = d.add(A, [GrantOp(X, "admin", 2)])
    gb = d.add(B, [GrantOp(X, "write", 3)])
    d.learn(X, ga)
    x_admin = d.add(X, [GrantOp(Y, "write", 4)])
    x_after = d.add(X, [GrantOp(Y, "read")], sees=[gb])
    v = judge(d.events)
    assert v[ga.id].accepted and v[gb.id].accepted and v[x_admin.id].accepted
    assert v[x_after.id].reason == "auth.not_admin"
    assert final_settings(d.events, v).get(X).permission == Write(3)


# ------------------------------------------------------------------------ plain rejections


def test_weaker_admin_cannot_revoke_or_demote_stronger():
    d, _ = start(GrantOp(A, "admin", 5), GrantOp(B, "admin", 0), GrantOp(W, "write", 2))
    revoke_root = d.add(A, [RevokeOp(R)])
    demote_root = d.add(A, [GrantOp(R, "write", 7)])
    revoke_b = d.add(A, [RevokeOp(B)])
    revoke_w = d.add(A, [RevokeOp(W)])  # Write(2) carries a stronger priority than 5
    v = judge(d.events)
    for e in (revoke_root, demote_root, revoke_b, revoke_w):
        assert v[e.id].reason == "auth.target_stronger", e


def test_grant_beyond_own_permission_rejected_whole_entry():
    d, _ = start(GrantOp(A, "admin", 2))
    both = d.add(A, [GrantOp(X, "write", 3), GrantOp(Y, "admin", 1)])
    d.learn(X, both)
    x1 = d.add(X)
    v = judge(d.events)
    assert v[both.id].reason == "auth.grant_exceeds"  # all operations or none
    assert v[x1.id].reason == "auth.unknown_key"


def test_write_key_changing_settings_rejected():
    d, _ = start(GrantOp(W, "write", 1))
    e = d.add(W, [GrantOp(X, "read")])
    v = judge(d.events)
    assert v[e.id].reason == "auth.not_admin"


def test_read_key_writing_rejected():
    d, _ = start(GrantOp(X, "read"))
    e = d.add(X)
    assert judge(d.events)[e.id].reason == "auth.not_writer"


def test_key_not_in_settings_rejected():
    d, _ = start()
    e = d.add(X)
    assert judge(d.events)[e.id].reason == "auth.unknown_key"


def test_revoked_key_writing_after_revocation_rejected():
    d, _ = start(GrantOp(W, "write", 5))
    r = d.add(R, [RevokeOp(W)])
    e = d.add(W, sees=[r])
    assert judge(d.events)[e.id].reason == "auth.revoked"


def test_revoked_key_writing_with_old_parents_voided():
    d, _ = start(GrantOp(W, "write", 5))
    w0 = d.add(W)
    r = d.add(R, [RevokeOp(W)], sees=[w0])
    w1 = d.add(W)  # parents predate the revocation
    v = judge(d.events)
    assert v[w0.id].accepted  # in the revocation's causal past: stays
    assert v[w1.id].reason == "auth.voided" and v[w1.id].voided_by == r.id


def test_regrant_after_revocation_restores_authority():
    d, _ = start(GrantOp(W, "write", 5))
    r = d.add(R, [RevokeOp(W)])
    g = d.add(R, [GrantOp(W, "write", 6)])
    d.learn(W, g)
    w = d.add(W)
    v = judge(d.events)
    assert v[w.id] == Verdict(True, "ok", (g.id,))
    assert final_settings(d.events, v).get(W).permission == Write(6)
    assert r.id != g.id


def test_bad_root_authorises_nobody():
    root = Event("sha256:" + "a" * 64, R, 0, 0, {R: 0}, (GrantOp(R, "admin", 1),), True)  # not Admin(0)
    grant_w = Event("sha256:" + "b" * 64, R, 1, 1, {R: 1}, (GrantOp(W, "write", 3),))
    w = Event("sha256:" + "c" * 64, W, 0, 2, {R: 1, W: 0})
    v = judge([root, grant_w, w])
    assert v[root.id].reason == "auth.bad_root"
    assert v[grant_w.id].reason == "auth.unknown_key" and v[w.id].reason == "auth.unknown_key"
    two = DagBuilder()
    r1 = two.root(R)
    r2 = two.root(A)
    v2 = evaluate(two.events)
    assert v2[r1.id].reason == v2[r2.id].reason == "auth.bad_root"


# ----------------------------------------------------------------------- evaluator, explain


def test_late_revocation_changes_applied_verdicts():
    d, _ = start(GrantOp(W, "write", 5))
    writes = [d.add(W) for _ in range(3)]
    r = d.add(R, [RevokeOp(W)])
    ev = Evaluator()
    for e in d.events[:-1]:
        ev.add(e)
    assert all(ev.verdict(w.id).accepted for w in writes)
    changed = ev.add(r)
    assert set(changed) == {r.id} | {w.id for w in writes}
    assert all(changed[w.id].voided_by == r.id for w in writes)
    assert ev.settings().get(W).status == "revoked"


def test_data_entries_never_rerun_the_full_evaluation(monkeypatch):
    """~20k data entries cost linear work: each is judged once, by itself, with the same number
    of steps whether it is the first or the 20,000th (work counted, not timed)."""
    d, root = start(GrantOp(W, "write", 5), GrantOp(A, "admin", 1))
    ev = Evaluator()
    ev.add(root)
    before = ev.full_evaluations
    steps = {"judged": 0, "work": 0}

    def counting(name: str, fn):
        def wrapper(*args, **kwargs):
            steps[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    # What judging a data entry does: one _judge_data, whose inner work is in_past over the
    # operations on its author, and a key state and verdict per round.
    monkeypatch.setattr(validity, "_judge_data", counting("judged", validity._judge_data))
    for inner in ("in_past", "concurrent", "_full_state", "_key_state", "_data_verdict"):
        monkeypatch.setattr(validity, inner, counting("work", getattr(validity, inner)))
    per_add: list[tuple[int, int]] = []
    prev = root
    for i in range(20_000):
        prev = d.add(W if i % 2 else A, sees=[prev])
        judged, work = steps["judged"], steps["work"]
        ev.add(prev)
        per_add.append((steps["judged"] - judged, steps["work"] - work))
    assert ev.full_evaluations == before
    assert ev.verdict(prev.id).accepted
    assert all(judged == 1 for judged, _ in per_add)  # the new entry alone, never the earlier ones
    # linear, not quadratic: no entry costs more steps than the first ones did, so the
    # 20,000th costs what the 100th did (the number of entries before it does not count)
    work = [w for _, w in per_add]
    assert max(work) == max(work[:100]) and work[-100:] == work[100:200]
    assert all(w > 0 for _, w in per_add)  # the counters do see the work
    # a settings entry does re-run it
    ev.add(d.add(R, [GrantOp(X, "read")]))
    assert ev.full_evaluations == before + 1


def test_settings_at_is_what_a_new_entry_would_see():
    d, root = start(GrantOp(W, "write", 5))
    r = d.add(R, [RevokeOp(W)])
    w_old = d.add(W)
    ev = Evaluator()
    for e in d.events:
        ev.add(e)
    assert ev.settings_at(merge_vv(w_old.vv)).get(W).permission == Write(5)
    assert ev.settings_at(merge_vv(w_old.vv, r.vv)).get(W).status == "revoked"
    assert ev.settings_at(root.vv).admins() == [(R, Admin(0))]


def test_never_valid_only_for_hopeless_entries():
    d, _ = start(GrantOp(X, "read"), GrantOp(W, "write", 5), GrantOp(A, "admin", 1))
    ev = Evaluator()
    for e in d.events:
        ev.add(e)
    nobody = Event("sha256:" + "1" * 64, Y, 0, 1, {R: 0, Y: 0})
    assert ev.never_valid(nobody)[0] == "auth.unknown_key"
    reader = Event("sha256:" + "2" * 64, X, 0, 1, {R: 0, X: 0})
    assert ev.never_valid(reader)[0] == "auth.not_writer"
    writer_ops = Event("sha256:" + "3" * 64, W, 0, 1, {R: 0, W: 0}, (RevokeOp(X),))
    assert ev.never_valid(writer_ops)[0] == "auth.not_admin"
    too_much = Event("sha256:" + "4" * 64, A, 0, 1, {R: 0, A: 0}, (GrantOp(Y, "write", 0),))
    assert ev.never_valid(too_much)[0] == "auth.grant_exceeds"
    enough = Event("sha256:" + "5" * 64, A, 0, 1, {R: 0, A: 0}, (GrantOp(Y, "admin", 1),))
    assert ev.never_valid(enough) is None
    # a revoked writer may become valid again if the revocation is voided later
    r = d.add(A, [RevokeOp(W)])
    ev.add(r)
    w = d.add(W, sees=[r])
    assert ev.never_valid(w) is None
    ev.add(w)
    assert ev.verdict(w.id).reason == "auth.revoked"
    ev.add(d.add(R, [RevokeOp(A)], id=low_id("r")))  # concurrent with A's revocation of W
    assert ev.verdict(r.id).reason == "auth.voided" and ev.verdict(w.id).accepted


def test_explain_names_signing_key_and_authorising_grant():
    d, root = start(GrantOp(A, "admin", 1))
    g = d.add(A, [GrantOp(W, "write", 4)])
    d.learn(W, g)
    w1 = d.add(W)
    r = d.add(R, [RevokeOp(W)], sees=[w1])
    w2 = d.add(W)  # has not seen the revocation
    ev = Evaluator()
    for e in d.events:
        ev.add(e)
    text = ev.explain(w1.id)
    assert W in text and g.id in text and A in text and "Write(4)" in text and "Accepted" in text
    text = ev.explain(w2.id)
    assert "auth.voided" in text and r.id in text and R in text and W in text
    assert "root" in ev.explain(root.id)
    w3 = d.add(W, sees=[r])
    ev.add(w3)
    text = ev.explain(w3.id)
    assert "auth.revoked" in text and r.id in text
