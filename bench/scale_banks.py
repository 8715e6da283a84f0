"""A thousand banks per node (issue 23, item 3): serve's start to its first answered command,
`memmesh status` and serve's memory, with many banks of many memories.

Usage::

    python bench/scale_banks.py [--banks N] [--per-bank N] [--home DIR] [--json PATH]

Defaults: 1,000 banks of 1,000 memories. ``--home DIR`` keeps the home (built once, reused by a
later run with the same DIR when it holds the same shape), so the serve figures can be taken
again without building it again.

The home is real and built as a user's is: ``Node.open``, no embedder, one agent (``alpha``),
``--banks`` banks created with ``memory.new`` and granted to alpha with ``memory.grant``
(write), the first ``ATTACHED`` of them attached to alpha for auto-recall; each bank's
memories written by the bank's own key through ``Database.transaction``, ``ROWS_PER_ENTRY``
memories per signed entry (one entry per memory would take far longer and changes nothing
serve reads at start), values made of words drawn with a fixed seed.

Measured, each in a real `memmesh serve` subprocess (``--no-discovery``, the HTTP API off):

* ``serve_first_command_s_<N>_banks``: from starting the process to the answer of its first
  command, a ``recall`` by alpha in the last bank (one no start-up warms) through the control
  socket (the client is this process: a CLI's own start-up is not counted);
* ``serve_ready_s``: from the start to serve.json (every listener answers);
* ``status_s``: the ``status`` command through the control socket, median of 3 (``status_first_s``:
  the first); ``status_cli_s``: ``memmesh status --json`` as a user runs it (a new process);
* ``rss_mib_*``: serve's resident memory after its first command, after status, and after a
  recall in every bank (``recall_all_s``: how long those took), with the views then open and
  their estimated bytes as serve's status reports them (``memory`` of the node's status).

The ``memory.view_budget_mib`` in force is the default (a share of the machine's memory);
``--budget-mib`` sets it in the home's config.yaml first.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROWS_PER_ENTRY = 1000  # memories per signed entry (well under the 1 MiB payload cap at ~100 bytes a row)
ATTACHED = 3  # banks attached to alpha for auto-recall
AGENT = "alpha"
SHAPE_FILE = "scale-banks.json"  # in the home: the shape it was built with
START_TIMEOUT_S = 300.0
WORDS = ("deploy", "server", "alpha", "beta", "cache", "index", "query", "latency", "budget", "memory", "bank",
         "sync", "peer", "token", "schema", "python", "sqlite", "vector", "release", "review", "meeting", "coffee",
         "garden", "river", "mountain", "invoice", "customer", "ticket", "deadline", "holiday", "train", "music")
CLI = [sys.executable, "-m", "memmesh.node.cli"]


def bank_name(i: int) -> str:
    return f"b{i:04d}"


def build_home(home: Path, banks: int, per_bank: int, *, seed: int = 7) -> dict[str, Any]:
    """A home of ``banks`` banks of ``per_bank`` memories each (see the module docstring)."""
    from memmesh.node import Node
    from memmesh.node.memory.embedders import EmbedderConfig
    from memmesh.node.memory.rows import MEMORY_STORE, memory_value

    rnd = random.Random(seed)
    t0 = time.perf_counter()
    with Node.open(home) as node:
        node.set_embedder_config(EmbedderConfig("none"))
        node.run("agent.new", {"name": AGENT})
        for i in range(banks):
            name = bank_name(i)
            node.run("memory.new", {"name": name})
            node.run("memory.grant", {"bank": name, "agent": AGENT, "perm": "write"})
            if i < ATTACHED:
                node.run("memory.attach", {"agent": AGENT, "bank": name})
            ref = node.agents.resolve(name)
            for start in range(0, per_bank, ROWS_PER_ENTRY):
                txn = ref.db.transaction(ref.admin_key)
                for j in range(start, min(per_bank, start + ROWS_PER_ENTRY)):
                    words = " ".join(rnd.choice(WORDS) for _ in range(8))
                    txn.append(MEMORY_STORE, memory_value(f"{name}-m{j}", f"{words} note {j} of {name}", ()))
                txn.commit()
    shape = {"banks": banks, "per_bank": per_bank, "seed": seed}
    (home / SHAPE_FILE).write_text(json.dumps(shape))
    return {"build_s": time.perf_counter() - t0, "db_file_mib": (home / "node.sqlite").stat().st_size / 2**20}


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _client(home: Path, proc: subprocess.Popen, deadline: float) -> Any:
    """A control client of ``proc`` once its serve.json names it."""
    from memmesh.node.control import SERVE_JSON, remote

    while True:
        if proc.poll() is not None:
            raise SystemExit(f"scale_banks: serve exited with {proc.returncode}")
        try:
            info = json.loads((home / SERVE_JSON).read_text())
        except (FileNotFoundError, ValueError):
            info = {}
        if info.get("pid") == proc.pid:
            client = remote(home)
            if client is not None:
                return client
        if time.monotonic() > deadline:
            raise SystemExit(f"scale_banks: serve did not start in {START_TIMEOUT_S:g} s")
        time.sleep(0.005)


def measure_serve(home: Path, banks: int) -> dict[str, Any]:
    """Start serve for ``home`` and take the figures of the module docstring; serve is stopped after."""
    log = open(home.parent / f"{home.name}-serve.log", "w")  # noqa: SIM115 (closed below)
    t0 = time.monotonic()
    proc = subprocess.Popen([*CLI, "--home", str(home), "serve", "--listen", "127.0.0.1:0", "--no-discovery",
                             "--api-listen", "off"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
    out: dict[str, Any] = {}
    try:
        client = _client(home, proc, t0 + START_TIMEOUT_S)
        out["serve_ready_s"] = time.monotonic() - t0
        with client:
            last = bank_name(banks - 1)
            got = client.run("recall", {"agent": AGENT, "query": "deploy server", "bank": last, "limit": 5})
            out[f"serve_first_command_s_{banks}_banks"] = time.monotonic() - t0
            if not got.data["memories"]:
                raise SystemExit(f"scale_banks: the first recall in {last} found nothing")
            out["rss_mib_first_command"] = _rss_mib(proc.pid)
            times = []
            for _ in range(3):
                t = time.monotonic()
                status = client.run("status", {})
                times.append(time.monotonic() - t)
            out["status_first_s"], out["status_s"] = times[0], statistics.median(times)
            out["status_databases"] = len(status.data["databases"])
            out["memory_after_status"] = status.data["node"].get("memory")
            out["rss_mib_after_status"] = _rss_mib(proc.pid)
        t = time.monotonic()
        cli = subprocess.run([*CLI, "--home", str(home), "status", "--json"], capture_output=True, text=True,
                             check=False)
        out["status_cli_s"] = time.monotonic() - t
        if cli.returncode != 0:
            raise SystemExit(f"scale_banks: memmesh status failed: {cli.stderr.strip()}")
        with _client(home, proc, time.monotonic() + 30) as client:
            t = time.monotonic()
            for i in range(banks):
                client.run("recall", {"agent": AGENT, "query": "garden river", "bank": bank_name(i), "limit": 5})
            out["recall_all_s"] = time.monotonic() - t
            out["rss_mib_after_recall_all"] = _rss_mib(proc.pid)
            out["memory_after_recall_all"] = client.run("status", {}).data["node"].get("memory")
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
    return out


def set_budget(home: Path, mib: float | None) -> None:
    """``memory.view_budget_mib`` in the home's config.yaml (serve reads it as it starts);
    None: no config.yaml, the default."""
    path = home / "config.yaml"
    if mib is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(f"memory:\n  view_budget_mib: {mib:g}\n")


def measure(banks: int = 1000, per_bank: int = 1000, *, home: Path | None = None,
            budget_mib: float | None = None) -> dict[str, Any]:
    """Build (or reuse, with ``home`` holding the same shape) a home of ``banks`` banks of
    ``per_bank`` memories, then measure serve on it. The keys of the module docstring, plus the
    shape and the build's figures. Another bench (bench/scale.py) calls this."""
    tmp = None
    if home is None:
        tmp = Path(tempfile.mkdtemp(prefix="memmesh-scale-banks-"))
        home = tmp / "home"
    try:
        out: dict[str, Any] = {"banks": banks, "per_bank": per_bank}
        shape_file = home / SHAPE_FILE
        built = json.loads(shape_file.read_text()) if shape_file.exists() else None
        if built is None or (built["banks"], built["per_bank"]) != (banks, per_bank):
            if home.exists():
                shutil.rmtree(home)
            out.update(build_home(home, banks, per_bank))
        set_budget(home, budget_mib)
        out.update(measure_serve(home, banks))
        out["serve_first_command_s"] = out[f"serve_first_command_s_{banks}_banks"]
        if banks == 1000:
            out["serve_first_command_s_1000_banks"] = out["serve_first_command_s"]
        out["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
        return out
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--banks", type=int, default=1000)
    ap.add_argument("--per-bank", type=int, default=1000)
    ap.add_argument("--home", type=Path, help="build the home here (kept, and reused by a later run)")
    ap.add_argument("--budget-mib", type=float, help="memory.view_budget_mib for the run (default: the default)")
    ap.add_argument("--json", type=Path, help="write the results here too")
    args = ap.parse_args()
    r = measure(args.banks, args.per_bank, home=args.home, budget_mib=args.budget_mib)
    width = max(len(k) for k in r)
    for k, v in r.items():
        print(f"{k:<{width}}  {v:.3f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    if args.json:
        args.json.write_text(json.dumps(r, indent=2) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    main()
