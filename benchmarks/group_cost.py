"""What the CP group costs: making it, and a collective on it vs the default group.

A matrix point hands implementations a CP group in reverse world order
(nsa_cp_comm.harness.cpgroup), made once per warm pool (the checked group and the
plain one). This starts ``cp`` gloo ranks, times making the two groups (the
cost of a pool's first point) and a small all-reduce on the plain CP group and
on the default group (the cost, if any, on every later collective), and prints
the slowest rank's figures.

    python benchmarks/group_cost.py [--cp 2] [--bystanders 0] [--iters 200]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time


def _task(cp: int, bystanders: int, iters: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    from nsa_cp_comm.harness.cpgroup import cp_group

    t0 = time.perf_counter()
    cp_group(cp, bystanders=bystanders, checked=True, timeout_s=60.0)
    plain = cp_group(cp, bystanders=bystanders, checked=False)
    made = time.perf_counter() - t0
    out = {"make_ms": made * 1e3}
    if plain is None:
        return out
    x = torch.ones(1024)
    for name, group in (("cp_group", plain), ("default_group", None)):
        if name == "default_group" and bystanders:
            continue
        dist.barrier(group=plain)
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x, group=group)
        out[f"{name}_allreduce_us"] = (time.perf_counter() - t0) / iters * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cp", type=int, default=2)
    ap.add_argument("--bystanders", type=int, default=0)
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    from nsa_cp_comm.harness.ranks import run_on_ranks

    with tempfile.TemporaryDirectory() as workdir:
        results = run_on_ranks(_task, args.cp + args.bystanders, args.cp, args.bystanders, args.iters,
                               workdir=workdir, timeout_s=300)
    bad = [r for r in results if not r.ok]
    if bad:
        raise SystemExit(f"error: rank {bad[0].rank} {bad[0].status}: {bad[0].error}")
    keys = sorted({k for r in results for k in r.value})
    print(f"cp={args.cp} bystanders={args.bystanders} gloo/cpu on {platform.node()} ({os.cpu_count()} cores), "
          f"1-minute load {os.getloadavg()[0]:.1f}; slowest rank:")
    for k in keys:
        print(f"  {k}: {max(r.value[k] for r in results if k in r.value):.1f}")


if __name__ == "__main__":
    main()
