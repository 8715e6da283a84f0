"""Auto-recall against its deadline (issue 11): many banks, p99 within the deadline, a slow bank named.

Usage::

    python bench/autorecall.py [--banks N] [--rows N] [--calls N] [--deadline-ms MS]
                               [--embedders hashed,none] [--seed S] [--json PATH]

A quick run: ``--rows 2000``. Bench-only dependency: the ``bench`` extra (chitchat-dataset).

The node is real: ``Node.open`` of a home in a temporary directory (one SQLite file), the
``embedder.set``, ``agent.new``, ``memory.new``, ``memory.grant``, ``memory.attach`` and
``memory.config`` commands, one agent (``alpha``, its own memory empty) and ``--banks`` banks
(default 5) of ``--rows`` memories each (default 20,000), every bank attached to alpha for
auto-recall in every session, alpha's ``auto_recall_deadline_ms`` set to ``--deadline-ms``
(default 50, the shipped default). Rows are written by alpha (granted write) through
``Database.transaction``, ``ROWS_PER_ENTRY`` memories per signed entry with each row's
hashed-embedder vector of ``key + " " + value`` in the same entry, as ``remember`` writes them
(no vector for a row holding a credential); one entry per memory would take far longer and
would not change what auto-recall reads.

Corpus and queries as bench/recall.py (bench/_common.py): Chit-Chat messages after a seeded
shuffle, those longer than a memory value may be (64 KiB) left out, bank b holding the
messages ``b * rows .. (b + 1) * rows - 1`` with keys from
``make_memories``; each auto-recall message is a query of 2-6 tokens sampled (``make_queries``)
from the non-stopword tokens of a held-out message (never stored), joined by spaces, so every
call has words to search for.

Per embedder in ``--embedders`` (default ``hashed,none``; the same home, the embedder switched
with ``set_embedder_config``, which builds the views again):

* ``warm_call_s``: the first auto-recall, which builds every store's index (in a one-shot
  process ``_search_all`` builds them before the deadline starts), then 20 untimed calls;
* ``normal``: ``--calls`` calls (default 300) of ``node.memory.auto_recall_result(agent,
  [message], count=False)``, each timed whole (the agent's state and config read, the banks
  opened, the query embedded once, every store searched on the search threads, the block
  framed): p50, p95, p99, max, and the calls that named a store in ``not_searched``; and apart,
  the time inside ``MemoryService._search_all`` (from where the deadline clock starts to the
  last store's answer or the deadline; the rest of a call is reading the agent's config,
  opening its banks and framing the block);
* ``slow``: the same calls while another thread holds the view of one bank (``view.held``)
  for the whole run, so that bank's search can never start: every call must name it (in
  ``not_searched`` and in the block's "Not searched this turn" line), and its wall time is
  compared with the deadline: p50, p99, max and ``margin_ms`` = max minus the deadline (and
  ``search_margin_ms``, the same for the time inside ``_search_all``).

``gc.collect(); gc.freeze()`` before each timed loop (as the other benches);
``OPENBLAS_NUM_THREADS=1`` before numpy loads. The load average before and after each loop is
recorded: the machine may be shared. Prints a table; writes JSON (default
``bench/results/autorecall.json``).
"""
from __future__ import annotations

import os

# Before numpy (imported below, directly and by every project module): one BLAS thread.
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from _common import HELD_OUT, load_messages, machine, make_queries, pct  # noqa: E402
from recall import ROWS_PER_ENTRY, git_state, log, make_memories  # noqa: E402
from tqdm import tqdm  # noqa: E402

from memmesh.node import Node  # noqa: E402
from memmesh.node.memory.agents import Agent  # noqa: E402
from memmesh.node.memory.embedders import EmbedderConfig  # noqa: E402
from memmesh.node.memory.framing import missing_line  # noqa: E402
from memmesh.node.memory.labels import labels_of  # noqa: E402
from memmesh.node.memory.rows import MAX_VALUE_CHARS, MEMORY_STORE, embedding_value, memory_value  # noqa: E402
from memmesh.node.memory.service import SEARCH_THREADS, MemoryService  # noqa: E402
from memmesh.node.memory.tokens import autorecall_query_tokens  # noqa: E402
from memmesh.node.memory.view import MemoryView  # noqa: E402

AGENT = "alpha"
WARMUP = 20
HOLD_S = 3600.0  # how long the holder thread may wait for the view's lock (it gets it at once)


def bank_name(i: int) -> str:
    return f"bank-{i + 1}"


# ---------------------------------------------------------------------------------- the home
def build(node: Node, banks: int, rows: int, mems: list, deadline_ms: int) -> dict[str, Any]:
    """The agent and its banks, each attached for auto-recall and filled with ``rows`` memories."""
    t0 = time.perf_counter()
    node.run("embedder.set", {"provider": "hashed"})
    hashed = node.memory.embedder
    assert hashed is not None
    node.run("agent.new", {"name": AGENT})
    node.run("memory.config", {"agent": AGENT, "action": "set", "key": "auto_recall_deadline_ms",
                               "value": deadline_ms})
    agent = node.agents.agent(AGENT)
    entries = 0
    with tqdm(total=banks * rows, unit="memory", desc="building banks", file=sys.stderr) as bar:
        for b in range(banks):
            name = bank_name(b)
            node.run("memory.new", {"name": name, "description": f"auto-recall benchmark bank {b + 1}"})
            node.run("memory.grant", {"bank": name, "agent": AGENT, "perm": "write"})
            node.run("memory.attach", {"bank": name, "agent": AGENT})
            db = node.agents.open_for(agent, name, "write").db
            own = mems[b * rows:(b + 1) * rows]
            for start in range(0, rows, ROWS_PER_ENTRY):
                values = [memory_value(k, v, tags) for k, v, tags in own[start:start + ROWS_PER_ENTRY]]
                embeddable = [labels_of(r["key"], r["value"], r["tags"], None).secret is None for r in values]
                vectors = iter(hashed.embed([f"{r['key']} {r['value']}" for r, e in zip(values, embeddable) if e]))
                txn = db.transaction(agent.key)
                for row, e in zip(values, embeddable):
                    row_key = txn.append(MEMORY_STORE, row)
                    if e:
                        txn.append(hashed.store_name, embedding_value(row_key, next(vectors)))
                txn.commit()
                entries += 1
                bar.update(len(values))
    build_s = time.perf_counter() - t0
    return {"entries": entries, "build_s": round(build_s, 2), "memories_per_s": round(banks * rows / build_s),
            "db_file_mb": round((node.home / "node.sqlite").stat().st_size / 2**20, 1)}


# ---------------------------------------------------------------------------------- timing
def stats(samples_ns: list[int]) -> dict[str, float]:
    a = np.asarray(samples_ns, dtype=np.float64) / 1e6
    return {**pct(samples_ns), "p95_ms": float(np.percentile(a, 95)), "n": len(samples_ns)}


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


@contextmanager
def timing_search_all(service: MemoryService, samples: list[int]) -> Iterator[None]:
    """Time each ``_search_all`` of ``service`` into ``samples`` (the deadline's own window)."""
    inner = service._search_all

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return inner(*args, **kwargs)
        finally:
            samples.append(time.perf_counter_ns() - t0)

    service._search_all = timed  # type: ignore[method-assign]
    try:
        yield
    finally:
        del service._search_all  # the class's method again


def calls(node: Node, agent: Agent, messages: list[str]) -> dict[str, Any]:
    """Time one auto-recall per message; latencies, what each call left out, and its blocks."""
    gc.collect()
    gc.freeze()
    samples: list[int] = []
    searching: list[int] = []
    missing: list[list[str]] = []
    blocks: list[str] = []
    lines = 0
    load_before = loadavg()
    try:
        with timing_search_all(node.memory, searching):
            for m in tqdm(messages, unit="call", desc="auto-recall", file=sys.stderr, leave=False):
                t0 = time.perf_counter_ns()
                block, shown, _left_out, not_searched = node.memory.auto_recall_result(agent, [m], count=False)
                samples.append(time.perf_counter_ns() - t0)
                missing.append(not_searched)
                blocks.append(block)
                lines += len(shown)
    finally:
        gc.unfreeze()
    named = Counter(name for names in missing for name in names)
    if len(searching) != len(samples):
        raise SystemExit(f"autorecall bench: {len(samples)} calls, {len(searching)} searches (a call did not search)")
    return {"latency": stats(samples), "search_all": stats(searching),
            "calls_with_not_searched": sum(1 for names in missing if names),
            "not_searched_by_store": dict(named.most_common()), "mean_lines": round(lines / len(messages), 2),
            "empty_blocks": sum(1 for b in blocks if not b), "loadavg_before": load_before,
            "loadavg_after": loadavg(), "_missing": missing, "_blocks": blocks}


def named_in_block(block: str) -> list[str]:
    """The stores a block's "Not searched this turn" line names."""
    prefix = missing_line([]).rstrip("_")
    for line in block.splitlines():
        if line.startswith(prefix):
            return line[len(prefix):].rstrip("_").split(", ")
    return []


@contextmanager
def held_by_another_thread(view: MemoryView) -> Iterator[None]:
    """Hold ``view``'s lock on a thread of our own until the block ends (a search or an index
    build that never finishes, as far as auto-recall can tell)."""
    got, release = threading.Event(), threading.Event()

    def hold() -> None:
        with view.held(HOLD_S) as ok:
            if ok:
                got.set()
                release.wait()

    t = threading.Thread(target=hold, name="bench-holder", daemon=True)
    t.start()
    if not got.wait(60):
        raise SystemExit("autorecall bench: could not take the view's lock for the slow case")
    try:
        yield
    finally:
        release.set()
        t.join()


def bench_embedder(node: Node, provider: str, messages: list[str], slow_bank: str,
                   deadline_ms: int) -> dict[str, Any]:
    if node.embedder_config().provider != provider:
        node.set_embedder_config(EmbedderConfig(provider))
    agent = node.agents.agent(AGENT)
    t = time.perf_counter()
    node.memory.auto_recall_result(agent, [messages[0]], count=False)
    warm_s = time.perf_counter() - t
    for m in messages[1:WARMUP + 1]:
        node.memory.auto_recall_result(agent, [m], count=False)
    log(f"{provider}: indexes built by the first call in {warm_s:.1f}s")

    normal = calls(node, agent, messages)
    normal.pop("_missing"), normal.pop("_blocks")
    log(f"{provider}: normal p50 {normal['latency']['p50_ms']:.1f} ms, p99 {normal['latency']['p99_ms']:.1f} ms, "
        f"{normal['calls_with_not_searched']} calls missed a store")

    view = node.memory.view(node.agents.resolve(slow_bank).db)
    with held_by_another_thread(view):
        slow = calls(node, agent, messages)
    missing, blocks = slow.pop("_missing"), slow.pop("_blocks")
    slow["slow_bank"] = slow_bank
    slow["calls_naming_slow_bank"] = sum(1 for names in missing if slow_bank in names)
    slow["blocks_naming_slow_bank"] = sum(1 for b in blocks if slow_bank in named_in_block(b))
    slow["other_stores_not_searched"] = {k: v for k, v in slow["not_searched_by_store"].items() if k != slow_bank}
    lat = slow["latency"]
    slow["deadline_ms"] = deadline_ms
    slow["margin_ms"] = lat["max_ms"] - deadline_ms
    slow["p99_over_deadline_ms"] = lat["p99_ms"] - deadline_ms
    slow["search_margin_ms"] = slow["search_all"]["max_ms"] - deadline_ms
    log(f"{provider}: slow bank p50 {lat['p50_ms']:.1f} ms, max {lat['max_ms']:.1f} ms "
        f"(margin {slow['margin_ms']:.1f} ms); named in {slow['calls_naming_slow_bank']}/{len(messages)} calls")
    return {"embedder": node.embedder_config().provider, "warm_call_s": round(warm_s, 3), "normal": normal,
            "slow": slow}


# ---------------------------------------------------------------------------------- report
def print_table(report: dict[str, Any]) -> None:
    m, p = report["machine"], report["parameters"]
    print(f"memmesh auto-recall deadline benchmark  {report['date']}  {m['cpu']} x{m['cores']}  python {m['python']}")
    print(f"{p['banks']} banks x {p['rows']:,} memories attached to one agent, {p['calls']} calls, "
          f"deadline {p['deadline_ms']} ms, {p['search_threads']} search threads; build {report['build']['build_s']} s "
          f"({report['build']['memories_per_s']:,} memories/s, {report['build']['db_file_mb']} MiB)")
    fmt = lambda d: f"{d['p50_ms']:.1f} / {d['p95_ms']:.1f} / {d['p99_ms']:.1f} / {d['max_ms']:.1f}"  # noqa: E731
    rows = [
        ("first call (builds indexes) s", lambda r: f"{r['warm_call_s']:.2f}"),
        ("normal p50 / p95 / p99 / max ms", lambda r: fmt(r["normal"]["latency"])),
        ("  of which searching (_search_all)", lambda r: fmt(r["normal"]["search_all"])),
        ("  calls with a store not searched", lambda r: f"{r['normal']['calls_with_not_searched']} of {p['calls']}"),
        ("  mean lines shown / empty blocks", lambda r: f"{r['normal']['mean_lines']} / {r['normal']['empty_blocks']}"),
        ("slow bank p50 / p95 / p99 / max ms", lambda r: fmt(r["slow"]["latency"])),
        ("  margin: max - deadline ms", lambda r: f"{r['slow']['margin_ms']:.1f}"),
        ("  of which searching (_search_all)", lambda r: fmt(r["slow"]["search_all"])),
        ("  searching: max - deadline ms", lambda r: f"{r['slow']['search_margin_ms']:.1f}"),
        ("  calls naming the slow bank", lambda r: f"{r['slow']['calls_naming_slow_bank']} of {p['calls']}"),
        ("  blocks naming the slow bank", lambda r: f"{r['slow']['blocks_naming_slow_bank']} of {p['calls']}"),
        ("  other stores not searched", lambda r: f"{sum(r['slow']['other_stores_not_searched'].values())}"),
    ]
    cols = list(report["embedders"])
    w = max(len(name) for name, _ in rows)
    cw = 28
    print()
    print(f"{'embedder':{w}}  " + "".join(f"{c:>{cw}}" for c in cols))
    for name, f in rows:
        print(f"{name:{w}}  " + "".join(f"{f(report['embedders'][c]):>{cw}}" for c in cols))
    print()
    for name, t in report["targets"].items():
        print(f"target {name}: {t['value']:.1f} <= {t['max']:g}: {'MET' if t['met'] else 'MISSED'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--banks", type=int, default=5, help="banks attached to the agent (default 5)")
    ap.add_argument("--rows", type=int, default=20_000, help="memories per bank (default 20,000)")
    ap.add_argument("--calls", type=int, default=300, help="timed auto-recall calls per case (default 300)")
    ap.add_argument("--deadline-ms", type=int, default=50, help="the agent's auto_recall_deadline_ms (default 50)")
    ap.add_argument("--embedders", default="hashed,none", help="comma-separated: hashed, none (default both)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", type=Path, default=HERE / "results" / "autorecall.json", help="write the results here")
    args = ap.parse_args()
    providers = [p.strip() for p in args.embedders.split(",") if p.strip()]
    if not providers or any(p not in ("hashed", "none") for p in providers):
        ap.error("--embedders takes hashed and/or none")
    if args.banks < 1 or args.rows < 1 or args.calls < 1 or not 1 <= args.deadline_ms <= 10_000:
        ap.error("--banks, --rows and --calls are at least 1; --deadline-ms is 1 to 10000")

    msgs = load_messages(args.seed)
    need = args.banks * args.rows
    storable = [m for m in msgs[:-HELD_OUT] if len(m) <= MAX_VALUE_CHARS]  # a few messages are longer
    if need > len(storable):
        ap.error(f"the corpus has {len(storable):,} messages to store; --banks x --rows asks for {need:,}")
    mems = make_memories(storable[:need], args.seed + 1)
    # Stopwords out first: a message of stopwords only is no query at all (auto-recall returns
    # before searching), which would time nothing.
    held_out = [autorecall_query_tokens([m]) for m in msgs[-HELD_OUT:]]
    rnd = random.Random(args.seed + 2)
    messages = [" ".join(q) for q in make_queries(held_out, args.calls, rnd)]
    slow_bank = bank_name(args.banks // 2)
    log(f"corpus: {need:,} memories in {args.banks} banks, {len(messages)} queries")

    report: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": machine(),
        "git": git_state(),
        "parameters": {"banks": args.banks, "rows": args.rows, "calls": args.calls, "deadline_ms": args.deadline_ms,
                       "embedders": providers, "seed": args.seed, "rows_per_entry": ROWS_PER_ENTRY,
                       "warmup_calls": WARMUP, "search_threads": SEARCH_THREADS, "slow_bank": slow_bank,
                       "own_memories": 0, "max_entries": 3},
    }
    with (tempfile.TemporaryDirectory(prefix="memmesh-bench-autorecall-") as tmp,
          Node.open(Path(tmp) / "home") as node):
        report["build"] = build(node, args.banks, args.rows, mems, args.deadline_ms)
        log(f"built {args.banks} banks in {report['build']['build_s']} s")
        report["embedders"] = {p: bench_embedder(node, p, messages, slow_bank, args.deadline_ms)
                               for p in providers}
    report["targets"] = {}
    for p, r in report["embedders"].items():
        p99 = r["normal"]["latency"]["p99_ms"]
        report["targets"][f"p99_ms_within_deadline_{p}"] = {"max": args.deadline_ms, "value": p99,
                                                             "met": p99 <= args.deadline_ms}
    print_table(report)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    slow_ok = all(r["slow"]["calls_naming_slow_bank"] == args.calls for r in report["embedders"].values())
    return 0 if slow_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
