"""What checking every timed iteration costs: the default preset's FULL-mode points with it and without.

The timed loop writes new inputs before every iteration and checks every
iteration's outputs, untimed (nsa_cp_comm.harness.verify). This runs the
default preset's all-gather points (cp 2, 4 and 8; zigzag, round_robin and
zigzag_page with 64-token pages; its four request-length sets; padded and
legacy; H=256 bf16, 2 warm-up and 8 timed iterations) through ``run_point``
on warm gloo ranks, each point with the check and without it, alternating,
``--reps`` times, and prints the seconds per cp and in all (the median of a
point's repetitions, summed), and the growth the check causes.

    python benchmarks/verify_cost.py [--reps 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SEQ_LENS = ((1000,), (1001, 300), (17,), (37, 512, 129, 900, 64, 3, 700, 250, 1, 333, 96, 180))
LAYOUTS = (("zigzag", 1), ("round_robin", 1), ("zigzag_page", 64))


def main() -> int:
    sys.path.insert(0, str(REPO / "src"))
    from nsa_cp_comm.harness import PointSpec, RankPool, run_point

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cp", default="2,4,8")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    print(f"host: {platform.node()}, {os.cpu_count()} cores, load {load:.1f}")
    print(f"{'cp':>3} {'points':>6} {'checked_s':>10} {'unchecked_s':>12} {'growth':>7}")
    rows = []
    for cp in (int(x) for x in args.cp.split(",")):
        secs = {True: 0.0, False: 0.0}
        n = 0
        with RankPool(cp, backend="gloo", device="cpu", workdir=tempfile.mkdtemp()) as pool:
            for policy, page in LAYOUTS:
                for lens in SEQ_LENS:
                    spec = PointSpec(lens, cp, policy=policy, page_size=page, impls=("padded", "legacy"),
                                     hidden_size=256, dtype="bfloat16", warmup=2, iters=8)
                    times: dict[bool, list[float]] = {True: [], False: []}
                    for _ in range(args.reps):
                        for verify in (True, False):
                            t0 = time.perf_counter()
                            out = run_point(spec, pool, timeout_s=300, verify=verify)
                            times[verify].append(time.perf_counter() - t0)
                            bad = [r for r in out if r.status not in ("ok", "refused")]
                            if bad:
                                sys.exit(f"cp={cp} {policy} {lens}: {bad[0].impl} {bad[0].status} {bad[0].reason}")
                    for verify in (True, False):
                        secs[verify] += statistics.median(times[verify])
                    n += 1
        growth = secs[True] / secs[False] - 1
        rows.append({"cp": cp, "points": n, "checked_s": secs[True], "unchecked_s": secs[False], "growth": growth})
        print(f"{cp:>3} {n:>6} {secs[True]:>10.2f} {secs[False]:>12.2f} {growth:>+7.1%}")
    checked = sum(r["checked_s"] for r in rows)
    unchecked = sum(r["unchecked_s"] for r in rows)
    print(f"all {sum(r['points'] for r in rows):>6} {checked:>10.2f} {unchecked:>12.2f} {checked / unchecked - 1:>+7.1%}")
    if args.json:
        args.json.write_text(json.dumps({
            "host_cores": os.cpu_count(), "load_before": round(load, 2), "reps": args.reps, "per_cp": rows,
            "growth": checked / unchecked - 1,
        }, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
