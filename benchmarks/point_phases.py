"""Where the default sweep's time goes: per point, the seconds and collectives of each phase.

Runs the default preset's points (cp 1, 2, 4 and 8; its five layouts; its
four request-length sets; all-gather and DeepEP) the way a sweep does: warm
gloo ranks per world, each point's ranks running ``point_on_rank``, then the
after-point state check and the rows written to a scratch results folder.
Prints, per point, each phase's seconds (the slowest rank's) and the
collectives it issued (rank 0's, on the checked, plain and fence groups and
the default group): start-up (a world's ranks, once per world), set-up,
checks, agreement, prepare (building the timed forms), the timed loop (of
which the check of every iteration's outputs and the A/A control's timed
iterations), the state check and writing the rows; then the totals.

    python benchmarks/point_phases.py [--cp 1,2,4,8] [--json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SEQ_LENS = ([1000], [1001, 300], [3], [37, 512, 129, 900, 64, 3, 700, 250, 1, 333, 96, 180])
LAYOUTS = {
    "zigzag": {"shared_kv": False, "split": "zigzag", "page_size": 1},
    "round_robin": {"shared_kv": False, "split": "round_robin", "page_size": 1},
    "shared_page1": {"shared_kv": True, "split": "zigzag", "page_size": 1},
    "shared_page16": {"shared_kv": True, "split": "zigzag", "page_size": 16},
    "shared_page64": {"shared_kv": True, "split": "zigzag", "page_size": 64},
}
ORDER = ("start-up", "setup", "checks", "agreement", "prepare", "timed loop", "of which verification",
         "of which A/A control", "state check", "writing")


def main() -> int:
    sys.path[:0] = [str(REPO / "src"), str(REPO)]
    from matrix.app.config import MatrixConfig
    from matrix.app.point import build_rows, resolve, write_point
    from nsa_cp_comm.harness.fold import fold_reports
    from nsa_cp_comm.harness.measure import point_on_rank
    from nsa_cp_comm.harness.phases import PHASES_KEY
    from nsa_cp_comm.harness.rank_state import check_pool
    from nsa_cp_comm.harness.ranks import RankPool
    from nsa_cp_comm.harness.cpgroup import group_rank_of

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cp", default="1,2,4,8")
    ap.add_argument("--json", type=Path, help="also write every point's phases here")
    args = ap.parse_args()
    base = {**dataclasses.asdict(MatrixConfig()), "hidden_size": 256, "dtype": "bfloat16", "warmup": 2, "iters": 8,
            "timeout_s": 120.0}
    out_dir = Path(tempfile.mkdtemp(prefix="point-phases-"))
    print(f"host: {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(f"{'point':<58} " + " ".join(f"{p[:10]:>10}" for p in ORDER))
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    points = []
    for cp in (int(x) for x in args.cp.split(",")):
        t0 = time.perf_counter()
        pool = RankPool(cp, backend="gloo", device="cpu", workdir=tempfile.mkdtemp())
        started = time.perf_counter() - t0
        try:
            for layout, keys in LAYOUTS.items():
                for lens in SEQ_LENS:
                    for a2a in ("none", "deepep"):
                        cfg = {**base, **keys, "cp_size": cp, "seq_lens": lens, "moe_a2a_backend": a2a,
                               "results_dir": str(out_dir)}
                        res = resolve(cfg)
                        if res.skip:
                            continue
                        phases: dict[str, list[float]] = {}
                        if started:
                            phases["start-up"] = [started, 0]
                            started = 0.0
                        t0 = time.perf_counter()
                        ranks = pool.run(point_on_rank, res.spec, "gloo", timeout_s=300)
                        wall = time.perf_counter() - t0
                        if not all(r.ok for r in ranks):
                            sys.exit(f"cp={cp} {layout} {lens} {a2a}: {ranks}")
                        for r in ranks:
                            for name, v in r.value[PHASES_KEY].items():
                                got = phases.setdefault(name, [0.0, 0])
                                got[0] = max(got[0], v["s"])  # the slowest rank's
                                if r.rank == 0:
                                    got[1] = v["collectives"]
                        t0 = time.perf_counter()
                        check_pool(pool, 60.0)
                        phases["state check"] = [time.perf_counter() - t0, 1]
                        by_group = {group_rank_of(r.rank, cp, 0): r.value for r in ranks}
                        results = fold_reports(res.spec, res.plan(), [by_group[g] for g in range(cp)])
                        t0 = time.perf_counter()
                        write_point(out_dir, build_rows(cfg, res, results, "", wall), results)
                        phases["writing"] = [time.perf_counter() - t0, 0]
                        label = f"cp={cp} {layout} {lens if len(lens) < 3 else f'[{len(lens)} requests]'} {a2a}"
                        print(f"{label:<58} " + " ".join(
                            f"{phases[p][0]:>6.2f}/{int(phases[p][1]):<3}" if p in phases else f"{'':>10}"
                            for p in ORDER), flush=True)
                        for p, (s, n) in phases.items():
                            totals[p][0] += s
                            totals[p][1] += n
                        points.append({"cp": cp, "layout": layout, "seq_lens": lens, "a2a": a2a, "phases": phases})
        finally:
            pool.close()
    print(f"{'total over ' + str(len(points)) + ' points (s/collectives)':<58} " + " ".join(
        f"{totals[p][0]:>6.1f}/{int(totals[p][1]):<3}" for p in ORDER))
    if args.json:
        args.json.write_text(json.dumps({"load": os.getloadavg()[0], "points": points, "totals": totals}, indent=1)
                             + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
