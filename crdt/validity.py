"""The deterministic valid set of a database's entry DAG (docs/security.md, "Authorisation").

The algorithm works on abstract ``Event``s (no crypto) so it can be tested on its own:

- ``past(e)``: x is in e's causal past iff ``x.id != e.id and e.vv.get(x.author, -1) >= x.seq``
  (each author writes one linear feed; equivocating authors are removed by the caller).
- T order: (height, id); every event of past(e) comes before e.
- Settings in past(e): the accepted settings operations on key K whose entries are in past(e);
  keep the causally maximal ones (in one entry, its last operation on K); K is revoked if any
  of them is a revocation, else K holds the weakest of the maximal grants.

Rounds, until one voids nothing:

1. Walk the candidates in T order; accept e iff its author holds what e needs in the settings of
   past(e) (settings operations need Admin and each must pass ``may_change``; data needs
   Write). The well-formed root is always accepted.
2. Removals are the accepted revocations and demotions (a grant that puts K below the
   permission K held in the settings of the grant's past). Take them strongest revoker first,
   then T order, then operation index. A removal whose entry is not already (tentatively)
   voided acts: it voids every accepted entry of its target that is concurrent with it and that
   uses what the removal took away (that entry would fail step 1 with the new permission).
   A removal that acted but whose own entry is voided later in the same round by an effective
   removal is not effective, and the voids only it made are dropped.
3. The entries voided by effective removals leave the candidates for good; walk again.

``evaluate`` is the reference: exactly these rounds over all events. ``Evaluator`` gives the
same answers incrementally: data-only entries never change another entry's verdict (they carry
no operation and are never a removal), so it runs the rounds over settings entries only, keeps
each round's accepted operations and effective removals per key, and judges a data entry
against those in O(rounds x operations on its author).
"""
from __future__ import annotations

from bisect import insort
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from memmesh.auth.ops import GrantOp, RevokeOp
from memmesh.auth.permissions import (
    ACTIVE,
    ADMIN,
    GRANT_EXCEEDS,
    NOT_ADMIN,
    REVOKED,
    TARGET_STRONGER,
    WRITE,
    Admin,
    AuthSettings,
    KeyState,
    Permission,
    holds,
    may_change,
    rank,
)

OK = "ok"
UNKNOWN_KEY = "auth.unknown_key"
REVOKED_KEY = "auth.revoked"
NOT_WRITER = "auth.not_writer"
VOIDED = "auth.voided"
BAD_ROOT = "auth.bad_root"
# NOT_ADMIN, TARGET_STRONGER and GRANT_EXCEEDS come from auth.permissions.

Op = GrantOp | RevokeOp


@dataclass(frozen=True, slots=True)
class Event:
    """One entry as the algorithm sees it."""

    id: str  # "sha256:<hex>"; T order = (height, id)
    author: str  # key string
    seq: int  # the author's feed position (0-based)
    height: int  # 0 for the root, 1 + max(parent heights) otherwise
    vv: Mapping[str, int]  # version vector of the causal past INCLUDING the event itself
    ops: tuple[Op, ...] = ()  # settings operations; empty for a data-only entry
    is_root: bool = False
    # What a data-only entry needs: Write, or Admin for one that erases another author's
    # payload. Entries with settings operations always need Admin.
    needs: str = "write"


@dataclass(frozen=True, slots=True)
class Verdict:
    accepted: bool
    reason: str  # "ok" or a reason code
    authorised_by: tuple[str, ...] = ()  # entry ids of the grants that gave the author its level
    voided_by: str | None = None  # for "auth.voided": the removal's entry id


# ----------------------------------------------------------------------------- causality


def t_key(e: Event) -> tuple[int, str]:
    return (e.height, e.id)


def in_past(x: Event, e: Event) -> bool:
    """Is x in e's causal past?"""
    return x.id != e.id and e.vv.get(x.author, -1) >= x.seq


def concurrent(a: Event, b: Event) -> bool:
    return a.id != b.id and not in_past(a, b) and not in_past(b, a)


def past_vv(e: Event) -> dict[str, int]:
    """The version vector of past(e) (e's own vector without e itself)."""
    vv = dict(e.vv)
    if e.seq == 0:
        vv.pop(e.author, None)
    else:
        vv[e.author] = e.seq - 1
    return vv


def merge_vv(*vvs: Mapping[str, int]) -> dict[str, int]:
    """Pointwise maximum: the version vector of the union of several causal pasts."""
    out: dict[str, int] = {}
    for vv in vvs:
        for a, s in vv.items():
            if out.get(a, -1) < s:
                out[a] = s
    return out


def _in_vv(x: Event, vv: Mapping[str, int]) -> bool:
    return vv.get(x.author, -1) >= x.seq


# ------------------------------------------------------------------------------ settings

_Ref = tuple[Event, int, Op]  # (entry, index of the operation in entry.ops, operation)


def _key_state(refs: Iterable[_Ref]) -> KeyState | None:
    """The state of one key from the accepted operations on it in some causal past."""
    last: dict[str, _Ref] = {}
    for ref in refs:
        cur = last.get(ref[0].id)
        if cur is None or ref[1] > cur[1]:
            last[ref[0].id] = ref  # in one entry, the last operation on the key wins
    if not last:
        return None
    maximal: list[_Ref] = []
    # Highest T first: an entry can only be in the past of a higher one, and if it is in the
    # past of any candidate it is in the past of a maximal one.
    for ref in sorted(last.values(), key=lambda r: t_key(r[0]), reverse=True):
        if not any(in_past(ref[0], m[0]) for m in maximal):
            maximal.append(ref)
    maximal.reverse()
    revokes = tuple(r[0].id for r in maximal if isinstance(r[2], RevokeOp))
    if revokes:
        return KeyState(None, REVOKED, revokes)
    perm = max((r[2].permission for r in maximal), key=rank)  # the weakest
    return KeyState(perm, ACTIVE, tuple(r[0].id for r in maximal if r[2].permission == perm))


def _settings_from(ops_by_key: Mapping[str, Sequence[_Ref]], vv: Mapping[str, int] | None) -> AuthSettings:
    states: dict[str, KeyState] = {}
    for key, refs in ops_by_key.items():
        st = _key_state(refs if vv is None else (r for r in refs if _in_vv(r[0], vv)))
        if st is not None:
            states[key] = st
    return AuthSettings(states)


def _index_ops(events: Iterable[Event]) -> dict[str, list[_Ref]]:
    ops_by_key: dict[str, list[_Ref]] = {}
    for e in events:
        for i, op in enumerate(e.ops):
            ops_by_key.setdefault(op.key, []).append((e, i, op))
    return ops_by_key


def settings_at(accepted: Iterable[Event], vv: Mapping[str, int]) -> AuthSettings:
    """The settings in the causal past described by ``vv``, from the ACCEPTED events given.

    For a new local entry, ``vv`` is ``merge_vv(*(p.vv for p in parents))``; for an existing
    event e, ``past_vv(e)``.
    """
    return _settings_from(_index_ops(accepted), vv)


def current_settings(accepted: Iterable[Event]) -> AuthSettings:
    """The settings of the whole accepted set."""
    return _settings_from(_index_ops(accepted), None)


# ------------------------------------------------------------------------------- step 1


def root_problem(e: Event) -> str | None:
    """None if ``e`` is a well-formed root, else what is wrong with it."""
    if not e.is_root:
        return "not a root entry"
    if e.seq != 0 or e.height != 0 or dict(e.vv) != {e.author: 0}:
        return "a root entry has seq 0, height 0 and no parents"
    first = e.ops[0] if e.ops else None
    if not (isinstance(first, GrantOp) and first.key == e.author and first.perm == ADMIN
            and first.priority == 0):
        return "a root entry's first settings operation grants Admin(0) to its own author"
    if any(op.key == e.author for op in e.ops[1:]):
        return "a root entry may not change its author's own grant"
    return None


def _designated_root(roots: Sequence[Event]) -> str | None:
    """The root's id: the only is_root event, if well-formed (several roots: none counts)."""
    if len(roots) == 1 and root_problem(roots[0]) is None:
        return roots[0].id
    return None


@dataclass(slots=True)
class _Ctx:
    """What step 1 saw for one event: its author's state, its targets' states, the failing op."""

    author: KeyState | None
    targets: dict[str, KeyState | None] | None = None
    bad_op: int | None = None


def _data_verdict(st: KeyState | None, needs: str = WRITE) -> Verdict:
    if st is None:
        return Verdict(False, UNKNOWN_KEY)
    if not st.active:
        return Verdict(False, REVOKED_KEY)
    if not holds(st.permission, needs):
        return Verdict(False, NOT_ADMIN if needs == ADMIN else NOT_WRITER)
    return Verdict(True, OK, st.granted_by)


def _step1(e: Event, root_id: str | None, ops_by_key: Mapping[str, Sequence[_Ref]]) -> tuple[Verdict, _Ctx]:
    if e.is_root:
        if e.id != root_id:
            return Verdict(False, BAD_ROOT), _Ctx(None)
        root_state = KeyState(Admin(0), ACTIVE, (e.id,))
        return Verdict(True, OK, (e.id,)), _Ctx(root_state, {op.key: None for op in e.ops})

    def state(key: str) -> KeyState | None:
        return _key_state(r for r in ops_by_key.get(key, ()) if in_past(r[0], e))

    st = state(e.author)
    if not e.ops:
        return _data_verdict(st, e.needs), _Ctx(st)
    if st is None:
        return Verdict(False, UNKNOWN_KEY), _Ctx(st)
    if not st.active:
        return Verdict(False, REVOKED_KEY), _Ctx(st)
    if not holds(st.permission, ADMIN):
        return Verdict(False, NOT_ADMIN), _Ctx(st)
    targets: dict[str, KeyState | None] = {}
    for i, op in enumerate(e.ops):
        if op.key not in targets:
            targets[op.key] = state(op.key)
        tst = targets[op.key]
        reason = may_change(st.permission, tst.permission if tst else None, op.permission)
        if reason is not None:
            return Verdict(False, reason), _Ctx(st, targets, i)
    return Verdict(True, OK, st.granted_by), _Ctx(st, targets)


# ------------------------------------------------------------------------------- step 2


@dataclass(frozen=True, slots=True)
class _Removal:
    """An accepted revocation (new None) or demotion of ``target`` by ``entry``."""

    entry: Event
    index: int
    target: str
    new: Permission | None
    revoker_priority: int

    @property
    def order(self) -> tuple[int, int, str, int]:
        return (self.revoker_priority, self.entry.height, self.entry.id, self.index)

    @property
    def ref(self) -> tuple[str, int]:
        return (self.entry.id, self.index)


def _removals(e: Event, ctx: _Ctx) -> list[_Removal]:
    assert ctx.author is not None and ctx.author.permission is not None and ctx.targets is not None
    prio = ctx.author.permission.priority
    assert prio is not None
    last: dict[str, tuple[int, Op]] = {}
    for i, op in enumerate(e.ops):
        last[op.key] = (i, op)
    out = []
    for target, (i, op) in last.items():
        new = op.permission
        if new is not None:
            prev = ctx.targets[target]
            prev_perm = prev.permission if prev is not None else None
            if prev_perm is None or rank(new) <= rank(prev_perm):
                continue  # not a demotion
        out.append(_Removal(e, i, target, new, prio))
    return out


def _uses_removed(x: Event, ctx: _Ctx, new: Permission | None) -> bool:
    """Would x fail step 1 if its author held ``new`` instead of what it held?"""
    if x.is_root:
        return False
    if not x.ops:
        return not holds(new, x.needs)
    if not holds(new, ADMIN):
        return True
    assert ctx.targets is not None
    for op in x.ops:
        tst = ctx.targets.get(op.key)
        if may_change(new, tst.permission if tst else None, op.permission) is not None:
            return True
    return False


@dataclass(slots=True)
class _Round:
    ops: dict[str, list[_Ref]]  # accepted operations (step 1) by target key
    removals: dict[str, list[_Removal]]  # effective removals by target key, in order


def _run_rounds(
    events: Sequence[Event], root_id: str | None
) -> tuple[dict[str, Verdict], dict[str, _Ctx], list[_Round]]:
    """Steps 1-3 over ``events`` (sorted in T order)."""
    candidates = list(events)
    final: dict[str, Verdict] = {}
    ctxs: dict[str, _Ctx] = {}
    rounds: list[_Round] = []
    while True:
        ops_by_key: dict[str, list[_Ref]] = {}
        accepted_by_author: dict[str, list[Event]] = {}
        verdicts: dict[str, Verdict] = {}
        round_ctx: dict[str, _Ctx] = {}
        items: list[_Removal] = []
        for e in candidates:
            v, c = _step1(e, root_id, ops_by_key)
            verdicts[e.id] = v
            round_ctx[e.id] = c
            if v.accepted:
                accepted_by_author.setdefault(e.author, []).append(e)
                for i, op in enumerate(e.ops):
                    ops_by_key.setdefault(op.key, []).append((e, i, op))
                if e.ops:
                    items.extend(_removals(e, c))
        items.sort(key=lambda it: it.order)

        acting: list[_Removal] = []
        tentative: dict[str, list[int]] = {}  # entry id -> indices (into acting) voiding it
        for it in items:
            if it.entry.id in tentative:
                continue  # already voided: it does not act
            j = len(acting)
            acting.append(it)
            for x in accepted_by_author.get(it.target, ()):
                if concurrent(x, it.entry) and _uses_removed(x, round_ctx[x.id], it.new):
                    tentative.setdefault(x.id, []).append(j)
        # A removal is effective unless an effective removal voids its entry; those come
        # later in the order (an earlier one would have stopped it from acting).
        effective = [False] * len(acting)
        for j in range(len(acting) - 1, -1, -1):
            effective[j] = not any(effective[k] for k in tentative.get(acting[j].entry.id, ()))
        voided: dict[str, str] = {}
        for xid, js in tentative.items():
            for j in js:
                if effective[j]:
                    voided[xid] = acting[j].entry.id
                    break
        removals: dict[str, list[_Removal]] = {}
        for j, it in enumerate(acting):
            if effective[j]:
                removals.setdefault(it.target, []).append(it)
        rounds.append(_Round(ops_by_key, removals))

        if not voided:
            final.update(verdicts)
            ctxs.update(round_ctx)
            return final, ctxs, rounds
        for xid, by in voided.items():
            final[xid] = Verdict(False, VOIDED, verdicts[xid].authorised_by, by)
            ctxs[xid] = round_ctx[xid]
        candidates = [e for e in candidates if e.id not in voided]


def _check_events(events: Iterable[Event]) -> list[Event]:
    by_id: dict[str, Event] = {}
    positions: dict[tuple[str, int], str] = {}
    for e in events:
        _check_event(e)
        old = by_id.get(e.id)
        if old is not None:
            if old != e:
                raise ValueError(f"two different events share the id {e.id}")
            continue
        other = positions.setdefault((e.author, e.seq), e.id)
        if other != e.id:
            raise ValueError(f"equivocation by {e.author} at seq {e.seq}: remove it before evaluating")
        by_id[e.id] = e
    return sorted(by_id.values(), key=t_key)


def _check_event(e: Event) -> None:
    if not isinstance(e, Event):
        raise TypeError(f"expected an Event, got {type(e).__name__}")
    if e.seq < 0 or e.vv.get(e.author) != e.seq:
        raise ValueError(f"event {e.id}: its version vector must hold its own seq")


def evaluate(events: Iterable[Event]) -> dict[str, Verdict]:
    """The reference: the verdict of every event, by the rounds of steps 1-3.

    A function of the set of events (duplicates are ignored; two events at the same
    (author, seq) raise ValueError: the caller removes equivocation first).
    """
    ordered = _check_events(events)
    root_id = _designated_root([e for e in ordered if e.is_root])
    verdicts, _ctx, _rounds = _run_rounds(ordered, root_id)
    return verdicts


# ------------------------------------------------------------------------------ incremental

class _RoundOps(tuple[_Ref, ...]):
    """One round's accepted operations on one key (a tuple of ``_Ref``), carrying its own memo of
    their full key state. The memo lives on the object, not in a module-level cache keyed by
    ``id()``: it goes away with the timeline that holds it, and no other object can ever be
    mistaken for it (tuples take no weak references, hence an attribute, not a WeakKeyDictionary)."""

    _full: KeyState | None
    _verdicts: dict[str, Verdict]


_KeyRound = tuple[_RoundOps, tuple[_Removal, ...]]
# What a key's timeline depends on: per round, its operations' and removals' (entry id, index).
_Signature = tuple[tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]], ...]


def _signature(timeline: Sequence[_KeyRound] | None) -> _Signature:
    if not timeline:
        return ()
    return tuple((tuple((r[0].id, r[1]) for r in ops), tuple(it.ref for it in rem)) for ops, rem in timeline)


def _timelines(rounds: Sequence[_Round]) -> dict[str, list[_KeyRound]]:
    """Per key, the rounds' (accepted operations on it, effective removals of it), with
    consecutive identical rounds merged (a data entry fares the same in both)."""
    keys: set[str] = set()
    for rd in rounds:
        keys.update(rd.ops)
        keys.update(rd.removals)
    out: dict[str, list[_KeyRound]] = {}
    for key in keys:
        tl: list[_KeyRound] = []
        sig = None
        for rd in rounds:
            state = (_RoundOps(rd.ops.get(key, ())), tuple(rd.removals.get(key, ())))
            s = _signature([state])
            if s != sig:
                tl.append(state)
                sig = s
        out[key] = tl
    return out


def _full_state(ops: _RoundOps) -> KeyState | None:
    """_key_state(ops), computed once per round's ops and kept on them."""
    try:
        return ops._full
    except AttributeError:
        ops._full = _key_state(ops)
        return ops._full


def _full_verdict(ops: _RoundOps, needs: str) -> Verdict:
    """_data_verdict(_full_state(ops), needs), computed once per round's ops and level (a
    Verdict is immutable: every entry judged by the same state shares it)."""
    try:
        memo = ops._verdicts
    except AttributeError:
        memo = ops._verdicts = {}
    verdict = memo.get(needs)
    if verdict is None:
        verdict = memo[needs] = _data_verdict(_full_state(ops), needs)
    return verdict


def _judge_data(x: Event, timeline: Sequence[_KeyRound] | None) -> tuple[Verdict, KeyState | None]:
    """A data-only event's verdict, round by round, exactly as the full rounds decide it."""
    if not timeline:
        return Verdict(False, UNKNOWN_KEY), None
    last = len(timeline) - 1
    vv, xid = x.vv, x.id
    for i, (ops, removals) in enumerate(timeline):
        past = [r for r in ops if r[0].id != xid and vv.get(r[0].author, -1) >= r[0].seq]  # in_past(r[0], x)
        # The common case: the entry has seen every operation on its author, so its key state
        # (and the verdict it gives) is the round's full state, computed once per round rather
        # than once per entry.
        if len(past) == len(ops):
            st, v = _full_state(ops), _full_verdict(ops, x.needs)
        else:
            st = _key_state(past)
            v = _data_verdict(st, x.needs)
        if v.accepted:
            for it in removals:
                if not holds(it.new, x.needs) and concurrent(it.entry, x):
                    return Verdict(False, VOIDED, v.authorised_by, it.entry.id), st
        if i == last:
            return v, st
    raise AssertionError("unreachable")


class Evaluator:
    """Incremental ``evaluate``: feed events one by one, read verdicts and settings.

    Adding a data-only event costs O(rounds x operations on its author). Adding a settings
    event (or a root) re-runs the rounds over the settings events and re-judges the data events
    of every key whose per-round operations or removals changed.
    """

    def __init__(self) -> None:
        self._events: dict[str, Event] = {}
        self._positions: dict[tuple[str, int], str] = {}
        self._settings_events: list[Event] = []  # T order
        self._roots: list[Event] = []
        self._data_by_author: dict[str, list[Event]] = {}
        self._all_ops: dict[str, list[_Ref]] = {}  # every operation of every settings event
        self._verdicts: dict[str, Verdict] = {}
        self._ctx: dict[str, _Ctx] = {}  # settings events: what step 1 saw in the deciding round
        self._rounds: list[_Round] = []
        self._timelines: dict[str, list[_KeyRound]] = {}
        self._sigs: dict[str, _Signature] = {}
        self.full_evaluations = 0  # how many times the rounds were re-run (observability, tests)
        self._never_memo: dict[tuple[str, str, int], tuple[str, str] | None] = {}  # see never_valid

    # --------------------------------------------------------------------------- feeding
    def add(self, event: Event) -> dict[str, Verdict]:
        """Add one event; returns the verdicts that are new or changed (the event's included).

        Adding an event already present is a no-op (returns {}). Parents are normally added
        before children; the result does not depend on the order.
        """
        if not self._index(event):
            return {}
        if event.ops or event.is_root:
            return self._reevaluate()
        verdict, _st = _judge_data(event, self._timelines.get(event.author))
        self._verdicts[event.id] = verdict
        return {event.id: verdict}

    def add_many(self, events: Iterable[Event]) -> dict[str, Verdict]:
        """Add several events at once (e.g. on load): at most one run of the rounds."""
        new = [e for e in events if self._index(e)]
        changed = self._reevaluate() if any(e.ops or e.is_root for e in new) else {}
        for e in new:
            if e.id not in self._verdicts:  # data events of keys the run did not re-judge
                self._verdicts[e.id] = changed[e.id] = _judge_data(e, self._timelines.get(e.author))[0]
        return changed

    def _index(self, event: Event) -> bool:
        """Record the event; False if it was already there."""
        _check_event(event)
        old = self._events.get(event.id)
        if old is not None:
            if old != event:
                raise ValueError(f"two different events share the id {event.id}")
            return False
        if (event.author, event.seq) in self._positions:
            raise ValueError(f"equivocation by {event.author} at seq {event.seq}: remove it before evaluating")
        self._events[event.id] = event
        self._positions[(event.author, event.seq)] = event.id
        if not event.ops and not event.is_root:
            self._data_by_author.setdefault(event.author, []).append(event)
        else:
            insort(self._settings_events, event, key=t_key)
            if event.is_root:
                self._roots.append(event)
            for i, op in enumerate(event.ops):
                self._all_ops.setdefault(op.key, []).append((event, i, op))
        return True

    def _reevaluate(self) -> dict[str, Verdict]:
        self.full_evaluations += 1
        verdicts, ctxs, rounds = _run_rounds(self._settings_events, _designated_root(self._roots))
        changed = {i: v for i, v in verdicts.items() if self._verdicts.get(i) != v}
        self._verdicts.update(verdicts)
        self._ctx = ctxs
        self._rounds = rounds
        timelines = _timelines(rounds)
        sigs = {k: _signature(tl) for k, tl in timelines.items()}
        for key in set(sigs) | set(self._sigs):
            if sigs.get(key, ()) == self._sigs.get(key, ()):
                continue
            for x in self._data_by_author.get(key, ()):
                v, _st = _judge_data(x, timelines.get(key))
                if self._verdicts.get(x.id) != v:
                    self._verdicts[x.id] = changed[x.id] = v
        self._timelines = timelines
        self._sigs = sigs
        return changed

    # --------------------------------------------------------------------------- reading
    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._events

    def __len__(self) -> int:
        return len(self._events)

    def verdict(self, entry_id: str) -> Verdict:
        """The current verdict of an added event (KeyError if unknown)."""
        return self._verdicts[entry_id]

    def verdicts(self) -> dict[str, Verdict]:
        return dict(self._verdicts)

    def settings(self) -> AuthSettings:
        """The settings of the whole accepted set."""
        return _settings_from(self._rounds[-1].ops, None) if self._rounds else AuthSettings()

    def settings_at(self, vv: Mapping[str, int]) -> AuthSettings:
        """The settings a new entry whose causal past is ``vv`` would be judged by."""
        return _settings_from(self._rounds[-1].ops, vv) if self._rounds else AuthSettings()

    def preview(self, event: Event) -> Verdict:
        """The verdict ``event`` would get if it were added now, without adding it.

        Cheap for a data-only event; a settings event costs one run of the rounds.
        """
        if event.id in self._events:
            return self._verdicts[event.id]
        if not event.ops and not event.is_root:
            return _judge_data(event, self._timelines.get(event.author))[0]
        events = list(self._settings_events)
        insort(events, event, key=t_key)
        roots = self._roots + [event] if event.is_root else self._roots
        verdicts, _ctx, _rounds = _run_rounds(events, _designated_root(roots))
        return verdicts[event.id]

    def never_valid(self, event: Event) -> tuple[str, str] | None:
        """(reason, detail) if no later event could make ``event`` valid, else None.

        Later events are never in its causal past, and rounds only drop operations, so an entry
        whose past holds no grant to its author at the level it needs stays invalid forever.
        Call it before ``add`` and only once every event of its causal past was added.
        """
        if event.is_root:
            problem = root_problem(event)
            return (BAD_ROOT, problem) if problem else None
        known = self._all_ops.get(event.author, ())
        refs = [r for r in known if in_past(r[0], event)]
        if not refs:
            return (UNKNOWN_KEY, f"no grant to {event.author} in the entry's causal past")
        if not event.ops and len(refs) == len(known):
            # A data entry that has seen every operation on its author (the common case) is
            # judged by that list alone, which only grows: one answer per author, level and
            # length of the list, rather than one per entry.
            memo_key = (event.author, event.needs, len(known))
            if memo_key not in self._never_memo:
                self._never_memo[memo_key] = self._never_valid_by(event, refs)
            return self._never_memo[memo_key]
        return self._never_valid_by(event, refs)

    def _never_valid_by(self, event: Event, refs: Sequence[_Ref]) -> tuple[str, str] | None:
        """never_valid, given the operations on its author in its causal past (not empty)."""
        needed = ADMIN if event.ops else event.needs
        grants = [r[2].permission for r in refs if isinstance(r[2], GrantOp)]
        if not any(holds(p, needed) for p in grants):
            reason = NOT_ADMIN if needed == ADMIN else NOT_WRITER
            return (reason, f"no grant of {needed} to {event.author} in the entry's causal past")
        # The author's priority is that of one of these grants at best.
        best = min(p.priority for p in grants if p.level == ADMIN and p.priority is not None) if event.ops else 0
        for op in event.ops:
            if isinstance(op, GrantOp) and op.priority is not None and op.priority < best:
                return (GRANT_EXCEEDS, f"{op}: no grant in the entry's causal past gives "
                                       f"{event.author} an admin priority of {op.priority} or stronger")
        return None

    # --------------------------------------------------------------------------- explaining
    def explain(self, entry_id: str) -> str:
        """Which key signed the entry, which grant(s) authorised it or which rule rejected it."""
        e = self._events[entry_id]
        v = self._verdicts[entry_id]
        if e.ops or e.is_root:
            ctx = self._ctx.get(entry_id) or _Ctx(None)
        else:
            ctx = _Ctx(_judge_data(e, self._timelines.get(e.author))[1])
        if e.is_root:
            what = "the root entry"
        elif e.ops:
            what = f"a settings change ({'; '.join(str(op) for op in e.ops)}), which needs Admin"
        elif e.needs == ADMIN:
            what = "a data entry that erases another author's payload, which needs Admin"
        else:
            what = "a data entry, which needs Write"
        lines = [f"Entry {e.id} (seq {e.seq}, height {e.height}) is signed by {e.author}: {what}."]
        held = self._held(e.author, ctx.author)
        if v.accepted:
            if e.is_root:
                lines.append("Accepted: the root's Admin(0) grant to its own author is the origin "
                             "of all authority in this database.")
            else:
                lines.append(f"Accepted: in the settings of its causal past {e.author} {held}.")
        elif v.reason == VOIDED:
            lines.append(f"Rejected ({VOIDED}): {self._describe_removal(v.voided_by, e.author)} "
                         f"concurrently with this entry (neither had seen the other), which takes "
                         f"away what this entry used. Entries of {e.author} in that change's causal "
                         f"past stay valid.")
        elif v.reason == BAD_ROOT:
            problem = root_problem(e) or "a database has exactly one root entry"
            lines.append(f"Rejected ({BAD_ROOT}): {problem}.")
        elif v.reason == UNKNOWN_KEY:
            lines.append(f"Rejected ({UNKNOWN_KEY}): no accepted grant to {e.author} in its causal past.")
        elif v.reason == REVOKED_KEY:
            lines.append(f"Rejected ({REVOKED_KEY}): {e.author} {held}; no re-grant follows that "
                         f"revocation in the entry's causal past.")
        elif v.reason == NOT_ADMIN:
            need = "changing _settings" if e.ops else "erasing another author's payload"
            lines.append(f"Rejected ({NOT_ADMIN}): {need} needs Admin; {e.author} {held}.")
        elif v.reason == NOT_WRITER:
            lines.append(f"Rejected ({NOT_WRITER}): writing needs Write; {e.author} {held}.")
        elif v.reason in (TARGET_STRONGER, GRANT_EXCEEDS) and ctx.bad_op is not None:
            op = e.ops[ctx.bad_op]
            actor = ctx.author.permission if ctx.author else None
            if v.reason == TARGET_STRONGER:
                tst = (ctx.targets or {}).get(op.key)
                lines.append(f"Rejected ({TARGET_STRONGER}): operation #{ctx.bad_op} ({op}) targets "
                             f"{op.key}, which held {tst.permission if tst else None}, stronger than "
                             f"the signer's {actor}.")
            else:
                lines.append(f"Rejected ({GRANT_EXCEEDS}): operation #{ctx.bad_op} ({op}) gives more "
                             f"than the signer's {actor}.")
        else:
            lines.append(f"Rejected ({v.reason}).")
        if not v.accepted and v.reason != BAD_ROOT:
            cancelled = [r for r in self._all_ops.get(e.author, ())
                         if in_past(r[0], e) and not self._verdicts[r[0].id].accepted]
            for r in cancelled:
                rv = self._verdicts[r[0].id]
                by = f" by {rv.voided_by}" if rv.voided_by else ""
                lines.append(f"In its causal past, {r[2]} in entry {r[0].id} (signed by {r[0].author}) "
                             f"does not count: {rv.reason}{by}.")
        return "\n".join(lines)

    def _op_on(self, entry_id: str, key: str) -> Op | None:
        ev = self._events.get(entry_id)
        ops = [op for op in ev.ops if op.key == key] if ev else []
        return ops[-1] if ops else None

    def _held(self, author: str, st: KeyState | None) -> str:
        if st is None:
            return "held no permission"
        sources = []
        for gid in st.granted_by:
            op = self._op_on(gid, author)
            signer = self._events[gid].author if gid in self._events else "?"
            sources.append(f"{op} in entry {gid} signed by {signer}")
        if not st.active:
            return "was revoked (" + "; ".join(sources) + ")"
        return f"held {st.permission}, from " + "; ".join(sources)

    def _describe_removal(self, entry_id: str | None, target: str) -> str:
        ev = self._events.get(entry_id or "")
        if ev is None:
            return f"entry {entry_id} removed the permission of {target}"
        op = self._op_on(ev.id, target)
        change = f"revoked {target}" if isinstance(op, RevokeOp) else f"demoted {target} to {op.permission if op else '?'}"
        return f"entry {ev.id} signed by {ev.author} {change}"


__all__ = [
    "OK", "UNKNOWN_KEY", "REVOKED_KEY", "NOT_ADMIN", "NOT_WRITER", "TARGET_STRONGER",
    "GRANT_EXCEEDS", "VOIDED", "BAD_ROOT", "Event", "Verdict", "AuthSettings", "KeyState",
    "Evaluator", "evaluate", "settings_at", "current_settings", "in_past",
    "concurrent", "past_vv", "merge_vv", "t_key", "root_problem",
]
