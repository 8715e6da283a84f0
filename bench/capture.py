"""Auto-capture benchmark: precision and recall of node.memory.capture.extract.

Usage::

    python bench/capture.py [--json PATH] [--seed N] [--show N]

The turns are bench/capture_data.py's generated set (seeded): facts stated in the supported
forms, facts in other phrasings, and many turns that state no fact (questions, hypotheticals,
negations, reported speech, instructions, past and future, credentials, chit-chat, pasted data).

A proposal is a true positive when the turn states exactly that (key, value); anything else it
proposes is a false positive (a wrong key or value, or any proposal on a turn that states no
fact). Precision = true / proposed over every turn (target >= 0.9); recall = true / stated,
shown per group, and overall over the supported forms only (``other_phrasing`` is shown apart:
the rules do not read those forms, on purpose). Time per turn is shown, never checked.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.capture_data import turns  # noqa: E402
from memmesh.node.memory.capture import extract  # noqa: E402

TARGET_PRECISION = 0.9


def _ratio(a: int, b: int) -> float | None:
    return None if b == 0 else a / b


def run(seed: int, show: int) -> dict:
    rows: dict[str, dict[str, int]] = defaultdict(lambda: {"turns": 0, "stated": 0, "proposed": 0, "true": 0})
    wrong: list[dict] = []
    missed: list[dict] = []
    data = turns(seed)
    started = time.perf_counter()
    found_all = [extract(t.text) for t in data]
    seconds = time.perf_counter() - started
    for t, found in zip(data, found_all, strict=True):
        r = rows[t.group]
        r["turns"] += 1
        r["stated"] += len(t.expected)
        expected = set(t.expected)
        for p in found:
            r["proposed"] += 1
            if (p.key, p.value) in expected:
                r["true"] += 1
            else:
                wrong.append({"group": t.group, "text": t.text, "key": p.key, "value": p.value, "rule": p.rule})
        got = {(p.key, p.value) for p in found}
        if t.group != "other_phrasing":
            missed.extend({"group": t.group, "text": t.text, "key": k, "value": v}
                          for k, v in t.expected if (k, v) not in got)
    total = {k: sum(r[k] for r in rows.values()) for k in ("turns", "stated", "proposed", "true")}
    supported = {k: sum(r[k] for g, r in rows.items() if g != "other_phrasing") for k in ("stated", "true")}
    precision = _ratio(total["true"], total["proposed"])
    return {
        "seed": seed,
        "groups": {g: {**r, "precision": _ratio(r["true"], r["proposed"]), "recall": _ratio(r["true"], r["stated"])}
                   for g, r in sorted(rows.items())},
        "total": {**total, "precision": precision, "recall_supported_forms": _ratio(supported["true"],
                                                                                     supported["stated"])},
        "target_precision": TARGET_PRECISION,
        "meets_target": precision is not None and precision >= TARGET_PRECISION,
        "us_per_turn": seconds / len(data) * 1e6,
        "false_positives": wrong[:show],
        "missed": missed[:show],
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine()},
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--show", type=int, default=10, help="false positives and misses listed")
    args = ap.parse_args()
    out = run(args.seed, args.show)
    print(f"{'group':<16}{'turns':>7}{'stated':>8}{'proposed':>10}{'true':>6}{'precision':>11}{'recall':>8}")
    for g, r in out["groups"].items():
        print(f"{g:<16}{r['turns']:>7}{r['stated']:>8}{r['proposed']:>10}{r['true']:>6}"
              f"{_pct(r['precision']):>11}{_pct(r['recall']):>8}")
    t = out["total"]
    print(f"{'all':<16}{t['turns']:>7}{t['stated']:>8}{t['proposed']:>10}{t['true']:>6}{_pct(t['precision']):>11}")
    print(f"precision {_pct(t['precision'])} (target >= {TARGET_PRECISION}: "
          f"{'met' if out['meets_target'] else 'NOT met'}); recall over the supported forms "
          f"{_pct(t['recall_supported_forms'])}; {out['us_per_turn']:.1f} us per turn")
    for title, items in (("false positives", out["false_positives"]), ("missed", out["missed"])):
        if items:
            print(f"\n{title}:")
            for i in items:
                print(f"  [{i['group']}] {i['text']!r} -> {i['key']} = {i['value']!r}")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
