#!/usr/bin/env python
"""Smoke of the library's ``run_point`` on one device, without Hydra.

    python benchmarks/smoke_run_point.py --device cuda [--cp 1,2,4]

For each cp: even, uneven and empty-rank plans in FULL mode (padded, its
zero-copy form, legacy, sumlen_allreduce, allgatherv) and in SCATTERED mode
(the communicator's passthrough and the a2a); at cp > 1 also vLLM 0.34's
quantized gather (DeepSeek-V3.2 on a monolithic block-fp8 kernel: the fp8
rows, their scales and the logits gathered, the experts on the dequantized
rows) on an uneven DualChunkSwap plan. Backend: NCCL when there is a
GPU per rank (cp=1 on one GPU), else gloo (with CUDA tensors on ``--device
cuda``; NCCL refuses several ranks per GPU). Exit code 1 if any
implementation failed, errored or timed out (``refused``, ``passthrough`` and
``skipped`` are expected outcomes, not failures).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

import torch  # noqa: E402

from nsa_cp_comm.harness.measure import PointSpec, run_point  # noqa: E402
from nsa_cp_comm.harness.pools import close_pools, get_pool  # noqa: E402

FULL_IMPLS = ("padded", "padded_zero_copy", "legacy", "sumlen_allreduce", "allgatherv")
BAD_STATUSES = ("failed", "error", "timeout")


# (label, seq_lens, policy, page_size, mode, impls, PointSpec keywords) of every point at ``cp``
def points(cp: int) -> list[tuple]:
    out = [(label, lens, policy, page, mode, impls, {}) for label, lens, policy, page in plans(cp)
           for mode, impls in (("FULL", FULL_IMPLS), ("SCATTERED", ("padded", "a2a")))]
    if cp > 1:
        out.append(("uneven, vLLM 0.34 fp8 gather", (1001,), "dual_chunk_swap", 1, "FULL", ("padded", "pad_at_split"),
                    dict(engine="vllm_0_34", moe_quant="fp8_block_monolithic")))
    return out


def plans(cp: int) -> list[tuple[str, tuple[int, ...], str, int]]:
    even = ("even", (1024 * cp,), "zigzag", 1)
    if cp == 1:
        return [even]  # one rank: every plan is even
    return [even, ("uneven", (1000,), "zigzag_page", 64), ("uneven+empty", (64,), "zigzag_page", 64)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--cp", default="1,2,4", help="comma list of cp sizes")
    ap.add_argument("--hidden-size", type=int, default=1024)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print(f"torch {torch.__version__}, device {args.device}, GPUs {gpus}"
          + (f" ({torch.cuda.get_device_name(0)})" if gpus else ""), flush=True)
    bad = 0
    workdir = tempfile.mkdtemp(prefix="smoke_run_point_")
    try:
        for cp in (int(x) for x in args.cp.split(",")):
            backend = "nccl" if args.device == "cuda" and gpus >= cp else "gloo"
            for label, seq_lens, policy, page, mode, impls, more in points(cp):
                spec = PointSpec(seq_lens, cp, policy, page_size=page, mode=mode, impls=impls,
                                 hidden_size=args.hidden_size, dtype=args.dtype, warmup=1, iters=3, **more)
                plan = spec.plan()
                t0 = time.perf_counter()
                pool = get_pool(cp, backend=backend, device=args.device, workdir=workdir)
                results = run_point(spec, pool, timeout_s=args.timeout)
                took = time.perf_counter() - t0
                print(f"cp={cp} {backend}/{args.device} {label} {policy}/p{page} {list(seq_lens)} "
                      f"n_r={list(plan.per_rank_tokens)} {mode} ({took:.1f} s)", flush=True)
                for r in results:
                    rt = r.stats.get("roundtrip", {}).get("p50") if r.stats else None
                    flag = "   <-- FAILED" if r.status in BAD_STATUSES else ""
                    print(f"    {r.impl:17s} {r.status:8s} correct={r.correct} err={r.max_rel_err} "
                          f"rt_p50_us={rt if rt is None else round(rt, 1)} rows={r.rows_moved} "
                          f"{r.failed_check} {r.reason[:120]}{flag}", flush=True)
                    bad += bool(flag)
    finally:
        close_pools()
        shutil.rmtree(workdir, ignore_errors=True)  # the ranks' rendezvous files
    print(f"smoke: {'all ok' if not bad else f'{bad} FAILED'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
