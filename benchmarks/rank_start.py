"""What starting ranks costs, forked or exec'd, and what binding them to CPUs changes.

For each world size: the seconds a ``RankPool`` takes to start with its ranks
forked from the fork server (the first start pays the server's own torch
import once, shown apart) and exec'd (``NSA_CP_COMM_FORK_RANKS=0``); then,
with the ranks bound where they outnumber the CPUs (the default) and unbound
(``NSA_CP_COMM_BIND_RANKS=0``), the median milliseconds of a barrier, an
all-gather of 64 KiB per rank (128 rows of bf16, H=256) and an all-reduce of
the gathered buffer (what gloo's reduce-scatter does) on the plain CP group.
The numbers behind docs/design.md's "Starting ranks".

    python benchmarks/rank_start.py [--cp 1,2,4,8] [--reps 100]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def collective_ms(reps: int) -> dict[str, float]:
    """Rank task: median ms of each collective over ``reps`` (after one of each)."""
    import torch
    import torch.distributed as dist

    from nsa_cp_comm.collectives import all_gather_into
    from nsa_cp_comm.harness.cpgroup import cp_group

    world = dist.get_world_size()
    group = cp_group(world, checked=False)
    block = torch.ones(128, 256, dtype=torch.bfloat16)
    full = torch.zeros(128 * world, 256, dtype=torch.bfloat16)
    calls = {
        "barrier": lambda: dist.barrier(group=group),
        "all-gather": lambda: all_gather_into(full, block, group),
        "all-reduce": lambda: dist.all_reduce(full, group=group),
    }
    out = {}
    for name, call in calls.items():
        call()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times) * 1e3
    return out


def main() -> int:
    sys.path[:0] = [str(REPO / "src"), str(REPO)]
    from nsa_cp_comm.harness import forkserver
    from nsa_cp_comm.harness.machine import BIND_ENV
    from nsa_cp_comm.harness.ranks import RankPool, rank_env, WORKER_PATH

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cp", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=100)
    args = ap.parse_args()
    worlds = [int(x) for x in args.cp.split(",")]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"host: {platform.node()}, {cpus} CPUs, load {os.getloadavg()[0]:.1f}")
    # The variables set as the forked starts below have them: the same server serves them.
    os.environ[forkserver.FORK_ENV] = "1"
    os.environ[BIND_ENV] = "1"
    t0 = time.perf_counter()
    server = forkserver.server_for(rank_env(), WORKER_PATH, time.monotonic() + 300)
    print(f"fork server ready (its one torch import): {time.perf_counter() - t0:.2f} s"
          + ("" if server else " (not used here)"))
    print(f"{'cp':>3} {'forked start s':>15} {'exec start s':>13}   "
          f"{'barrier ms':>17} {'all-gather ms':>17} {'all-reduce ms':>17}   (bound / unbound)")
    for cp in worlds:
        starts = {}
        for fork in ("1", "0"):
            os.environ[forkserver.FORK_ENV] = fork
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="rank-start-") as workdir:
                RankPool(cp, workdir=workdir).close()
            starts[fork] = time.perf_counter() - t0
        os.environ[forkserver.FORK_ENV] = "1"
        ms = {}
        for bind in ("1", "0"):
            os.environ[BIND_ENV] = bind
            with tempfile.TemporaryDirectory(prefix="rank-start-") as workdir, RankPool(cp, workdir=workdir) as pool:
                got = pool.run(collective_ms, args.reps, timeout_s=600)
            if not all(r.ok for r in got):
                sys.exit(f"cp={cp}: {got}")
            ms[bind] = {k: max(r.value[k] for r in got) for k in got[0].value}  # the slowest rank's
        os.environ[BIND_ENV] = "1"
        cells = " ".join(f"{ms['1'][k]:>8.2f}/{ms['0'][k]:<8.2f}" for k in ("barrier", "all-gather", "all-reduce"))
        print(f"{cp:>3} {starts['1']:>15.2f} {starts['0']:>13.2f}   {cells}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
