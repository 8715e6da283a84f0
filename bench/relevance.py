"""Does recall stay silent when nothing is relevant, and still find what is?

Usage::

    python bench/relevance.py [--json PATH] [--off-topic N] [--seed S] [--providers local,hashed,none]

One store, three rankings (each in its own home, through the library's commands exactly as
the CLI runs them): the local neural embedder (``local``, when the ``embed`` extra is
installed), the hashed embedder (``hashed``) and BM25 only (``none``). The data is generated
by bench/relevance_data.py: a software team's working memory (~140 facts in one agent's own
memory), one or two questions per fact worded differently from it, and messages from other
domains (cooking, travel, sport, films, small talk) that share no topic with the store.

Measured per ranking, with the embedder's calibrated floor and again without one
(``min_similarity`` 0, the spec's rule) on the same store:

* ``off_topic_injected_frac``: the share of off-topic messages for which auto-recall injects
  at least one memory (target <= 0.05);
* ``on_topic_recall_at_10``: the share of on-topic questions whose fact is among the top 10 of
  the recall tool (limit 10);
* ``on_topic_injected_hit_frac``: the share of on-topic questions whose fact auto-recall
  injects (its default ``max_entries``);
* ``on_topic_injected_any_frac``: the share for which it injects anything;
* ``recall_at_10_drop_vs_no_floor``: what the floor costs recall@10 (target <= 0.01).

Auto-recall runs with its longest deadline (``auto_recall_deadline_ms`` 10,000): this measures what is
relevant, not what is fast (bench/autorecall.py measures that).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import machine  # noqa: E402
from recall import git_state, log  # noqa: E402
from relevance_data import memories, off_topic  # noqa: E402

from memmesh.node import Node  # noqa: E402

AGENT = "alpha"
TARGET_OFF_TOPIC = 0.05
MAX_RECALL_DROP = 0.01  # on-topic recall@10 may fall by at most this against no floor
PROVIDERS = ("local", "hashed", "none")


def _available(provider: str) -> bool:
    if provider != "local":
        return True
    try:
        import onnxruntime  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError:
        return False
    return True


def _keys_of_lines(lines: list[Any]) -> list[str]:
    return [line["key"] if isinstance(line, dict) else str(line) for line in lines]


def measure(node: Node, questions: list[tuple[str, str]], noise: list[str]) -> dict[str, float]:
    def injected(message: str) -> list[str]:
        data = node.run("autorecall", {"agent": AGENT, "messages": [message]}).data
        return _keys_of_lines(data["lines"])

    off = [bool(injected(m)) for m in noise]
    at10 = hit = anything = 0
    for q, key in questions:
        found = node.call_tool(AGENT, "recall", {"query": q, "limit": 10})["memories"]
        at10 += key in [m["key"] for m in found]
        keys = injected(q)
        hit += key in keys
        anything += bool(keys)
    n = len(questions)
    return {"off_topic_injected_frac": round(sum(off) / len(noise), 4),
            "on_topic_recall_at_10": round(at10 / n, 4),
            "on_topic_injected_hit_frac": round(hit / n, 4),
            "on_topic_injected_any_frac": round(anything / n, 4)}


def run_provider(provider: str, facts: list, questions: list[tuple[str, str]], noise: list[str]) -> dict[str, Any]:
    """The store built once; measured with the embedder's floor, then with none (``min_similarity``
    0: only cosines <= 0 dropped, the spec's rule), so the two differ by the floor alone."""
    with tempfile.TemporaryDirectory(prefix=f"memmesh-bench-relevance-{provider}-") as tmp, \
            Node.open(Path(tmp) / "home") as node:
        node.run("embedder.set", {"provider": provider})
        node.run("agent.new", {"name": AGENT})
        node.run("memory.config", {"agent": AGENT, "action": "set", "key": "auto_recall_deadline_ms", "value": "10000"})
        t0 = time.perf_counter()
        for f in facts:
            node.call_tool(AGENT, "remember", {"key": f.key, "value": f.value})
        build_s = time.perf_counter() - t0
        floor = measure(node, questions, noise)
        node.run("memory.config", {"agent": AGENT, "action": "set", "key": "min_similarity", "value": "0"})
        none = measure(node, questions, noise)
        return {"provider": provider, "memories": len(facts), "on_topic_questions": len(questions),
                "off_topic_messages": len(noise), **floor, "no_floor": none,
                "recall_at_10_drop_vs_no_floor": round(none["on_topic_recall_at_10"] - floor["on_topic_recall_at_10"],
                                                       4),
                "build_s": round(build_s, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=HERE / "results" / "relevance.json")
    ap.add_argument("--off-topic", type=int, default=None,
                    help="off-topic messages (default: every one the templates make, 375)")
    ap.add_argument("--seed", type=int, default=20261203)
    ap.add_argument("--providers", default=",".join(PROVIDERS))
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    facts = memories(rnd)
    questions = [(q, f.key) for f in facts for q in f.questions]
    noise = off_topic(rnd, args.off_topic)
    report: dict[str, Any] = {"bench": "relevance", "machine": machine(), "git": git_state(),
                              "parameters": {"seed": args.seed, "off_topic": args.off_topic}, "results": []}
    for provider in args.providers.split(","):
        if not _available(provider):
            log(f"{provider}: skipped (the embed extra is not installed)")
            continue
        log(f"{provider}: {len(facts)} memories, {len(questions)} questions, {len(noise)} off-topic messages")
        report["results"].append(run_provider(provider, facts, questions, noise))
    cols = ["off_topic_injected_frac", "on_topic_recall_at_10", "on_topic_injected_hit_frac",
            "on_topic_injected_any_frac"]
    print("provider | floor | " + " | ".join(cols))
    for r in report["results"]:
        for label, row in (("calibrated", r), ("none", r["no_floor"])):
            print(f"{r['provider']} | {label} | " + " | ".join(str(row[c]) for c in cols))
    report["targets"] = {}
    for r in report["results"]:
        report["targets"][f"off_topic_injected_frac_{r['provider']}"] = {
            "max": TARGET_OFF_TOPIC, "value": r["off_topic_injected_frac"],
            "met": r["off_topic_injected_frac"] <= TARGET_OFF_TOPIC}
        report["targets"][f"recall_at_10_drop_{r['provider']}"] = {
            "max": MAX_RECALL_DROP, "value": r["recall_at_10_drop_vs_no_floor"],
            "met": r["recall_at_10_drop_vs_no_floor"] <= MAX_RECALL_DROP}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
