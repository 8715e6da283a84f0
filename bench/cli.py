"""How long the `memmesh` command takes to answer: start-up and a command through a running serve.

    python bench/cli.py [--runs N] [--json PATH]

Each row is the median (and min, max) wall time of N runs (default 20) of one command, each a new
process as a user's shell starts it:

* ``python -c pass``: the interpreter alone, the floor everything else stands on;
* ``memmesh --help``: parsing only;
* ``memmesh status`` and ``memmesh recall alpha deploy`` sent to a running ``memmesh serve`` of a
  small home (one agent, one bank, 50 memories): the command goes through serve's control
  socket, so what it costs beyond the floor is what the CLI imports and the round trip.

Targets (issue "a CLI that answers at once"): each at most 0.25 s, and at most 3x the floor.
The serve process is started on 127.0.0.1 with any free port and stopped at the end, whatever
happens.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEMMESH = [sys.executable, "-m", "memmesh.node.cli"]
TARGET_S = 0.25
TARGET_RATIO = 3.0


def _time(argv: list[str], runs: int, env: dict[str, str]) -> dict[str, float]:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
        samples.append(time.perf_counter() - t0)
        if done.returncode != 0:
            sys.exit(f"bench/cli.py: {' '.join(argv)} failed: {done.stderr.decode(errors='replace')}")
    return {"median_s": statistics.median(samples), "min_s": min(samples), "max_s": max(samples)}


def _make_home(home: Path, env: dict[str, str]) -> None:
    """One agent, one bank, 50 memories, made with the library (not timed)."""
    code = (
        "import sys\n"
        "from memmesh.node.library import Node\n"
        "with Node.open(sys.argv[1]) as node:\n"
        "    node.run('embedder.set', {'provider': 'none'})\n"
        "    node.run('agent.new', {'name': 'alpha'})\n"
        "    node.run('memory.new', {'name': 'notes'})\n"
        "    node.run('memory.grant', {'bank': 'notes', 'agent': 'alpha', 'perm': 'write'})\n"
        "    for i in range(50):\n"
        "        node.call_tool('alpha', 'remember', {'key': f'k{i}', 'value': f'deploy note {i}', 'bank': 'notes'})\n"
    )
    subprocess.run([sys.executable, "-c", code, str(home)], check=True, env=env, cwd=ROOT)


def _wait_for_serve(home: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"bench/cli.py: serve exited with {proc.returncode}")
        try:
            if json.loads((home / "serve.json").read_text()).get("pid") == proc.pid:
                return
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.05)
    sys.exit("bench/cli.py: serve did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="runs per command (default 20)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    tmp = Path(tempfile.mkdtemp(prefix="memmesh-bench-cli-"))
    home = tmp / "home"
    serve = None
    try:
        _make_home(home, env)
        rows = {"python -c pass": _time([sys.executable, "-c", "pass"], args.runs, env),
                "memmesh --help": _time([*MEMMESH, "--help"], args.runs, env)}
        serve = subprocess.Popen([*MEMMESH, "--home", str(home), "serve", "--listen", "127.0.0.1:0",
                                  "--api-listen", "127.0.0.1:0", "--no-discovery"],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 env=env, cwd=ROOT)
        _wait_for_serve(home, serve)
        rows["memmesh status (through serve)"] = _time([*MEMMESH, "--home", str(home), "status"], args.runs, env)
        rows["memmesh recall (through serve)"] = _time([*MEMMESH, "--home", str(home), "recall", "alpha", "deploy"],
                                                       args.runs, env)
    finally:
        if serve is not None and serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            try:
                serve.wait(30)
            except subprocess.TimeoutExpired:
                serve.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    floor = rows["python -c pass"]["median_s"]
    print(f"{'command':34} {'median s':>9} {'min s':>7} {'max s':>7} {'x floor':>8}  target")
    for name, r in rows.items():
        ratio = r["median_s"] / floor
        ok = "" if name == "python -c pass" else (
            "ok" if r["median_s"] <= TARGET_S and ratio <= TARGET_RATIO else "missed")
        print(f"{name:34} {r['median_s']:9.3f} {r['min_s']:7.3f} {r['max_s']:7.3f} {ratio:8.1f}  {ok}")
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {os.cpu_count()} cores",
              "python": platform.python_version(), "runs": args.runs, "rows": rows,
              "target_s": TARGET_S, "target_ratio": TARGET_RATIO}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
