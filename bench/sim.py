"""Many peers syncing one bank, in one process: rounds to converge and messages per peer.

    python bench/sim.py [--quick] [--json PATH] [--seed N] [--peers N ...] [--share K]

Runs the seeded simulator (tests/sim.py) at 10, 100 and 1,000 peers (``--quick``: 10 and
100): real databases, keys, SyncServer and Client per peer; a lossy network (5 % of requests
and of replies lost, 5 % of requests duplicated), interleaved exchanges, a partition into 2-3
groups for rounds 1-4, 5 writers writing during rounds 0-2, fan-out 3. Each peer first knows
2-3 others; peer exchange spreads the rest.

Reported per size: rounds to converge after the last write and after the heal, requests
(messages) per peer per round (mean and max), the largest number of exchanges one peer ran in
a round (never above the fan-out: the simulator asserts it), and wall seconds.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import machine  # noqa: E402

from tests.sim import SimConfig, simulate  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 and 100 peers only")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--peers", type=int, nargs="+", help="sizes to run (default 10 100 1000)")
    ap.add_argument("--share", type=int, default=32, help="peers told per peer exchange (0: all known)")
    ap.add_argument("--fanout", type=int, default=3)
    args = ap.parse_args()
    sizes = args.peers or ([10, 100] if args.quick else [10, 100, 1000])
    runs = []
    print(f"memmesh sync simulator  seed {args.seed}  fan-out {args.fanout}  "
          f"{machine()['cpu']} x{machine()['cores']}")
    header = (f"{'peers':>6} {'conv':>5} {'rounds':>6} {'after write':>11} {'after heal':>10} "
              f"{'req/peer/round':>15} {'max':>4} {'ex max':>6} {'entries':>7} {'setup s':>8} {'wall s':>7}")
    print(header)
    for n in sizes:
        cfg = SimConfig(peers=n, seed=args.seed, fanout=args.fanout, share=args.share or None)
        r = simulate(cfg)
        d = r.to_dict()
        runs.append(d)
        print(f"{n:>6} {'yes' if r.converged else 'NO':>5} {r.rounds:>6} {str(r.rounds_after_last_write):>11} "
              f"{str(r.rounds_after_heal):>10} {r.requests_per_peer_round_mean:>15.2f} "
              f"{r.requests_per_peer_round_max:>4} {r.exchanges_per_peer_round_max:>6} {r.entries:>7} "
              f"{r.setup_s:>8.1f} {r.wall_s:>7.1f}", flush=True)
    results = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": machine(),
        "quick": args.quick,
        "seed": args.seed,
        "runs": runs,
        "summary": [{"peers": d["config"]["peers"], "log2_peers": round(math.log2(d["config"]["peers"]), 2),
                     "converged": d["converged"], "rounds_after_last_write": d["rounds_after_last_write"],
                     "rounds_after_heal": d["rounds_after_heal"],
                     "requests_per_peer_round_mean": round(d["requests_per_peer_round_mean"], 3),
                     "requests_per_peer_round_max": d["requests_per_peer_round_max"],
                     "exchanges_per_peer_round_max": d["exchanges_per_peer_round_max"],
                     "wall_s": round(d["wall_s"], 1)} for d in runs],
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0 if all(d["converged"] for d in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
