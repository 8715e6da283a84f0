"""retention.set, show, preview, run: a database's signed retention policy (node/retention.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from memmesh.crdt.clock import now_ms
from memmesh.node.commands.params import Cli, Params, Ref, Time
from memmesh.node.commands.registry import REGISTRY, command
from memmesh.node.commands.result import Result
from memmesh.node.memory.rows import check_time
from memmesh.node.retention import (
    RETENTION_STORE,
    Forget,
    PolicyError,
    plan,
    policy_in_force,
    policy_value,
    run,
    summary,
)

if TYPE_CHECKING:
    from memmesh.node.library import Node

REGISTRY.group("retention", "a database's retention policy: set, show, preview, run")


class RetentionDb(Params):
    db: Annotated[Ref, Cli(positional=True), Field(
        description="an agent name (its own database), a bank name or a database id")]


class RetentionSet(RetentionDb):
    days: Annotated[int, Field(ge=1, le=36_500, description="episodes are forgotten after this many days "
                                                            "(times the multipliers below)")]
    compress_after: Annotated[int | None, Field(ge=1, le=36_500, description=(
        "history turns older than this many days that a level-1 chunk covers keep only its summary"))] = None
    success_gone_x: Annotated[float, Field(ge=0.1, le=100, description="successful episodes go after days x this")] = 1.0
    failure_gone_x: Annotated[float, Field(ge=0.1, le=100, description="failed episodes go after days x this")] = 1.0
    keep_promoted_evidence: Annotated[bool, Field(
        description="keep the successful episodes behind a promoted method")] = False
    erase_retired_memories: Annotated[bool, Field(
        description="also erase memory rows (and their vectors) no longer current for more than days: "
                    "superseded, or past their valid_to; current memories are never erased")] = False


class RetentionRun(RetentionDb):
    now: Annotated[Time | None, Field(description="the clock of the run (ISO 8601); default: this node's")] = None


def _now(p: RetentionRun) -> int:
    return now_ms() if p.now is None else check_time("now", p.now)


@command("retention.set", RetentionSet, "set a database's retention policy (a signed entry; an admin's key)")
def retention_set(node: Node, p: RetentionSet) -> Result:
    ref = node.agents.resolve(p.db)
    policy = policy_value(p.days, p.compress_after, p.success_gone_x, p.failure_gone_x, p.keep_promoted_evidence,
                          p.erase_retired_memories)
    perm = ref.db.permission(str(ref.admin_key.public))
    if perm is None or perm.level != "admin":
        raise PolicyError(f"this node holds no admin key of {ref.name}: only an admin sets its retention policy")
    txn = ref.db.transaction(ref.admin_key)
    txn.append(RETENTION_STORE, policy.value())
    entry = txn.commit()
    return Result({"db": ref.name, "id": ref.db.id, "policy": policy.value(), "entry": entry},
                  f"retention policy of {ref.name} set ({_describe(policy.value())}); preview it with: "
                  f"memmesh retention preview {ref.name}")


@command("retention.show", RetentionDb, "the retention policy in force", read_only=True)
def retention_show(node: Node, p: RetentionDb) -> Result:
    ref = node.agents.resolve(p.db)
    policy = policy_in_force(ref.db)
    data = {"db": ref.name, "id": ref.db.id, "policy": policy.to_dict() if policy else None}
    return Result(data, f"{ref.name}: " + (_describe(policy.value()) if policy else "no retention policy (keeps everything)"))


def _plan_result(ref: Any, found: list[Forget], now: int, entries: list[str] | None) -> Result:
    counts = summary(found)
    data = {"db": ref.name, "id": ref.db.id, "now": now, **counts,
            "erase": [{"entry": f.entry, "store": f.store, "reason": f.reason} for f in found]}
    verb = "would erase" if entries is None else "erased"
    text = f"{ref.name}: {verb} {counts['compressed']} history text payloads and {counts['episodes']} episodes"
    if counts["memories"] or counts["vectors"]:
        text += f", {counts['memories']} retired memory payloads and {counts['vectors']} vector payloads"
    if entries is not None:
        data["entries"] = entries
        text += f" ({len(entries)} signed erase entries)"
    return Result(data, text)


@command("retention.preview", RetentionRun, "count what a retention run would erase; changes nothing", read_only=True)
def retention_preview(node: Node, p: RetentionRun) -> Result:
    ref = node.agents.resolve(p.db)
    now = _now(p)
    return _plan_result(ref, plan(ref.db, now), now, None)


@command("retention.run", RetentionRun, "erase what the retention policy says, with signed erasures")
def retention_run(node: Node, p: RetentionRun) -> Result:
    ref = node.agents.resolve(p.db)
    now = _now(p)
    if policy_in_force(ref.db) is None:
        raise PolicyError(f"{ref.name} has no retention policy; set one with: memmesh retention set {ref.name} --days N")
    found, entries = run(ref.db, ref.admin_key, now)
    if any(f.reason in ("memory", "vector") for f in found):
        node.memory.view(ref.db).load()  # rebuilt now, without the erased rows
    return _plan_result(ref, found, now, entries)


def _describe(v: dict[str, Any]) -> str:
    out = f"episodes after {v['days']} days (successes x{v['success_x']:g}, failures x{v['failure_x']:g})"
    if v["compress_after"] is not None:
        out += f", history text after {v['compress_after']} days once summarised"
    if v["keep_promoted_evidence"]:
        out += ", promoted methods' evidence kept"
    if v.get("erase_retired_memories"):
        out += f", memory rows retired for {v['days']} days erased"
    return out + ", episodes a person checked kept"
