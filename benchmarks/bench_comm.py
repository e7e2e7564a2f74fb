#!/usr/bin/env python
"""Benchmark of the padded CP round trip against the legacy path and the alternatives.

    python benchmarks/bench_comm.py [--quick] [--device cpu|cuda] [--out FILE.json]
    nox -s bench -- [same options]

One run measures, side by side, on real ranks (a RankPool: gloo on CPU; on CUDA
NCCL where there is one GPU per rank, else gloo with CUDA tensors):

1. even plans: the padded / legacy round-trip ratio (target <= 1.02; PASS/WARN),
   padded and legacy interleaved so drift hits both alike;
2. uneven plans: padded vs every alternative (the matrix's own ``run_point``:
   checks, then timings), plus the a2a (DeepEP stand-in) in SCATTERED mode;
3. the padded path's local work (buffer allocation, zeroing the padding, the copy
   into the slot, the split and the slice: everything but the two collectives)
   as a share of the round trip, at production shape (H=7168, bf16, cp 8).

Timing semantics are the library's (nsa_cp_comm.timing): warm-up, per-iteration
max over ranks, p50/p90/mean, CUDA events on GPU; bandwidth as in nccl-tests
(algbw = S/t, busbw = algbw*(cp-1)/cp, a round trip = two collectives of S).
Correctness is always checked first, as in nccl-tests; the exit code is 1 if any
check failed. Not a test: numbers depend on the machine (see PERF.md).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# Run from a checkout without installing: the rank processes inherit sys.path.
for p in (str(HERE), str(REPO / "src")):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402

import bench_tasks  # noqa: E402
from nsa_cp_comm.machine import cpu_model, nccl_version  # noqa: E402
from nsa_cp_comm.measure import DTYPES, PointSpec, run_point  # noqa: E402
from nsa_cp_comm.ranks import close_pools, get_pool  # noqa: E402
from nsa_cp_comm.timing import max_over_ranks, roundtrip_bandwidth, summarize  # noqa: E402

RATIO_TARGET = 1.02
NVLINK_BUSBW_GBPS = 360.0  # SPEC 4: ring all-gather / reduce-scatter ceiling, 8 GPUs on NVLink 4
NVLINK_LATENCY_US = 20.0  # SPEC 4: ~10-30 us per collective

# (seq_lens, cp, policy, page_size, warmup, iters)
FULL_PARAMS = {
    "hidden_size": 7168,
    "dtype": "bfloat16",
    "even": [((4096,), 2, "zigzag", 1, 3, 20), ((2048,), 4, "round_robin", 1, 3, 16)],
    "uneven": [
        ((1001, 297, 2793), 4, "zigzag", 1, 2, 5),
        ((4000,), 4, "zigzag_page", 64, 2, 5),
        ((1000, 3000), 4, "zigzag_page", 256, 2, 5),
    ],
    "a2a_on": 1,  # index into "uneven": the plan the SCATTERED (a2a) point uses
    "prod": [((8000,), 8, "zigzag_page", 64, 1, 3), ((16000,), 8, "zigzag_page", 64, 1, 2)],
}
QUICK_PARAMS = {
    "hidden_size": 256,
    "dtype": "bfloat16",
    "even": [((512,), 2, "zigzag", 1, 1, 5)],
    "uneven": [((1001, 300), 2, "zigzag", 1, 1, 3), ((1000,), 2, "zigzag_page", 64, 1, 3)],
    "a2a_on": 1,
    "prod": [((1000,), 2, "zigzag_page", 64, 1, 2)],
}


# ---------------------------------------------------------------------------
# machine, versions
# ---------------------------------------------------------------------------


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return ""


def environment(device: str) -> dict:
    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "gpu": "",
        "gpu_count": 0,
        "nccl": nccl_version(),
        "device": device,
        "loadavg_start": _loadavg(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_count"] = torch.cuda.device_count()
    return env


def backend_for(device: str, cp: int) -> str:
    # NCCL refuses several ranks on one GPU ("Duplicate GPU detected").
    if device == "cuda" and torch.cuda.device_count() >= cp:
        return "nccl"
    return "gloo"


# ---------------------------------------------------------------------------
# formatting
# ---------------------------------------------------------------------------


def ms(us: float | None) -> str:
    return "-" if us is None or (isinstance(us, float) and math.isnan(us)) else f"{us / 1e3:.2f}"


def gbps(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def table(headers: list[str], rows: list[list[object]]) -> str:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in cells]
    return "\n".join(out)


def plan_label(seq_lens, policy, page) -> str:
    lens = ",".join(map(str, seq_lens))
    return f"{policy}{'/p' + str(page) if policy == 'zigzag_page' else ''} [{lens}]"


def fold(per_rank: list[dict[str, list[float]]], key: str) -> dict[str, float]:
    return summarize(max_over_ranks([r[key] for r in per_rank]))


# ---------------------------------------------------------------------------
# sections
# ---------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.params = QUICK_PARAMS if args.quick else FULL_PARAMS
        self.hidden = self.params["hidden_size"]
        self.dtype = self.params["dtype"]
        self.itemsize = DTYPES[self.dtype].itemsize
        self.workdir = tempfile.mkdtemp(prefix="bench_comm_")
        self.failures: list[str] = []
        self.results: dict = {}

    def pool(self, cp: int):
        return get_pool(cp, backend=backend_for(self.args.device, cp), device=self.args.device, workdir=self.workdir)

    def spec(self, seq_lens, cp, policy, page, warmup, iters, **kw) -> PointSpec:
        return PointSpec(tuple(seq_lens), cp, policy, page_size=page, hidden_size=self.hidden, dtype=self.dtype,
                         warmup=warmup, iters=iters, flush_l2=self.args.flush_l2, **kw)

    def run_task(self, fn, spec: PointSpec, what: str) -> list[dict] | None:
        pool = self.pool(spec.cp_size)
        res = pool.run(fn, spec, timeout_s=self.args.timeout)
        if not all(r.ok for r in res):
            bad = next(r for r in res if not r.ok)
            self.failures.append(f"{what}: rank {bad.rank} {bad.status}: {bad.error}")
            return None
        vals = [r.value for r in res]
        for v in vals:
            self.failures += [f"{what}: {f}" for f in v["failures"]]
        return vals

    # 1 ---------------------------------------------------------------------
    def even(self) -> None:
        print(f"\n== even plans: padded / legacy round trip (target ratio <= {RATIO_TARGET}) ==", flush=True)
        rows, out = [], []
        for seq_lens, cp, policy, page, warmup, iters in self.params["even"]:
            spec = self.spec(seq_lens, cp, policy, page, warmup, iters)
            plan = spec.plan()
            vals = self.run_task(bench_tasks.even_ratio_task, spec, f"even {plan_label(seq_lens, policy, page)} cp={cp}")
            if vals is None:
                continue
            samples = [v["samples"] for v in vals]
            st = {k: fold(samples, k) for k in samples[0]}
            leg, pad = st["legacy_roundtrip"], st["padded_roundtrip"]
            per_it = {k: max_over_ranks([s[k] for s in samples]) for k in samples[0]}
            # The ratio: median over iterations of padded/legacy measured back to back
            # (paired, so slow drift cancels); "A/A" is the same for legacy/legacy.
            ratio = statistics.median(p / q for p, q in zip(per_it["padded_roundtrip"], per_it["legacy_roundtrip"]))
            aa = statistics.median(p / q for p, q in zip(per_it["control_roundtrip"], per_it["legacy_roundtrip"]))
            if ratio <= RATIO_TARGET:
                verdict = "PASS"
            elif ratio <= max(aa, 1 / aa) * RATIO_TARGET:
                verdict = "WARN (within A/A noise)"
            else:
                verdict = "WARN"
            nbytes = plan.total_tokens * self.hidden * self.itemsize
            alg, bus = roundtrip_bandwidth(nbytes, pad["p50"], cp)
            rows.append([plan_label(seq_lens, policy, page), cp, plan.total_tokens, f"{nbytes / 1e6:.1f}", iters,
                         ms(leg["p50"]), ms(pad["p50"]), ms(leg["p90"]), ms(pad["p90"]), ms(leg["mean"]),
                         ms(pad["mean"]), f"{pad['p50'] / leg['p50']:.3f}", f"{ratio:.3f}", f"{aa:.3f}",
                         gbps(alg), gbps(bus), verdict])
            out.append(dict(seq_lens=list(seq_lens), cp=cp, policy=policy, page_size=page, tokens=plan.total_tokens,
                            bytes=nbytes, warmup=warmup, iters=iters, stats=st, ratio_paired=ratio,
                            ratio_of_p50=pad["p50"] / leg["p50"], aa_control_ratio=aa, algbw_GBps=alg,
                            busbw_GBps=bus, verdict=verdict))
        print(table(["plan", "cp", "T", "S MB", "iters", "legacy p50 ms", "padded p50 ms", "legacy p90",
                     "padded p90", "legacy mean", "padded mean", "p50 ratio", "paired ratio", "A/A ratio",
                     "algbw GB/s", "busbw GB/s", "verdict"], rows), flush=True)
        print("  verdict: paired ratio (median of per-iteration padded/legacy) against the target; the A/A ratio "
              "(legacy against itself, same loop) is this machine's noise floor. algbw/busbw of the padded round trip.")
        self.results["even"] = out

    # 2 ---------------------------------------------------------------------
    def uneven(self) -> None:
        print("\n== uneven plans: padded vs alternatives (matrix run_point: checks, then timings) ==", flush=True)
        rows, out = [], []
        points = []
        for i, (seq_lens, cp, policy, page, warmup, iters) in enumerate(self.params["uneven"]):
            points.append((self.spec(seq_lens, cp, policy, page, warmup, iters,
                                     impls=("padded", "legacy", "sumlen_allreduce", "allgatherv")), "FULL"))
            if i == self.params["a2a_on"]:
                points.append((self.spec(seq_lens, cp, policy, page, warmup, iters, mode="SCATTERED",
                                         impls=("padded", "a2a")), "SCATTERED"))
        for spec, mode in points:
            plan = spec.plan()
            label = plan_label(spec.seq_lens, spec.policy, spec.page_size)
            results = run_point(spec, self.pool(spec.cp_size), timeout_s=self.args.timeout)
            base = next((r.stats["roundtrip"]["p50"] for r in results if r.impl == "padded" and r.stats), None)
            for r in results:
                if r.status not in ("ok", "skipped"):
                    self.failures.append(f"uneven {label} cp={spec.cp_size} {mode} {r.impl}: {r.status}: {r.reason}")
                st = r.stats or {}
                rt = st.get("roundtrip", {}).get("p50")
                vs = f"{rt / base:.2f}x" if rt and base and mode == "FULL" else "-"
                if r.impl == "legacy" and mode == "FULL" and r.status == "ok" and not plan.is_even:
                    status = "refused"
                elif r.status == "ok" and mode == "SCATTERED" and r.impl != "a2a":
                    status = "pass-thru"
                else:
                    status = r.status
                mb = f"{r.bytes_padded / 1e6:.1f}" if r.bytes_padded is not None else "-"
                rows.append([label if r is results[0] else "", spec.cp_size, mode, f"{plan.padding_frac:.3f}",
                             r.impl, status, ms(st.get("gather", {}).get("p50")),
                             ms(st.get("scatter", {}).get("p50")), ms(rt), ms(st.get("roundtrip", {}).get("p90")),
                             ms(st.get("roundtrip", {}).get("mean")), r.rows_moved if r.rows_moved is not None else "-",
                             mb, gbps(r.algbw_padded_GBps), gbps(r.busbw_padded_GBps), gbps(r.busbw_useful_GBps), vs])
                out.append(dict(seq_lens=list(spec.seq_lens), cp=spec.cp_size, policy=spec.policy,
                                page_size=spec.page_size, mode=mode, tokens=plan.total_tokens,
                                padded_total=plan.padded_total, padding_frac=plan.padding_frac, impl=r.impl,
                                status=r.status, reason=r.reason, correct=r.correct, max_rel_err=r.max_rel_err,
                                stats=st, rows_moved=r.rows_moved, bytes_moved=r.bytes_padded,
                                bytes_useful=r.bytes_useful, algbw_GBps=r.algbw_padded_GBps,
                                busbw_GBps=r.busbw_padded_GBps, busbw_useful_GBps=r.busbw_useful_GBps,
                                warmup=spec.warmup, iters=spec.iters))
        print(table(["plan", "cp", "mode", "pad frac", "impl", "status", "gather p50 ms", "scatter p50 ms",
                     "rt p50 ms", "rt p90 ms", "rt mean ms", "rows moved", "MB moved", "algbw GB/s", "busbw GB/s",
                     "busbw useful", "rt vs padded"], rows), flush=True)
        skipped = sorted({f"{d['impl']}: {d['reason']}" for d in out if d["status"] == "skipped"})
        for s in skipped:
            print(f"  skipped {s}")
        print("  a2a = stand-in for DeepEP (all_to_all_single dispatch/combine); rows moved = rows dispatched, "
              "its algbw/busbw use S = bytes per rank (nccl-tests alltoall).")
        self.results["uneven"] = out

    # 3 ---------------------------------------------------------------------
    def local_work(self) -> None:
        dev = self.args.device
        print(f"\n== local work of the padded path, share of the round trip ({dev}) ==", flush=True)
        prod = self.params["prod"]
        if self.args.prod_tokens:
            base = prod[-1]
            prod = [((t,), self.args.prod_cp or base[1], base[2], base[3], base[4], base[5])
                    for t in self.args.prod_tokens]
        out = []
        for seq_lens, cp, policy, page, warmup, iters in prod:
            cp = self.args.prod_cp or cp
            iters = self.args.prod_iters or iters
            spec = self.spec(seq_lens, cp, policy, page, warmup, iters)
            plan = spec.plan()
            label = plan_label(seq_lens, policy, page)
            backend = backend_for(dev, cp)
            nbytes = plan.padded_total * self.hidden * self.itemsize
            print(f"-- {label} cp={cp} H={self.hidden} {self.dtype} {backend}/{dev}: T={plan.total_tokens} "
                  f"m={plan.max_rank_len} buffer {plan.padded_total} rows = {nbytes / 1e6:.1f} MB, "
                  f"padding_frac={plan.padding_frac:.3f}, warmup={warmup} iters={iters}", flush=True)
            t0 = time.perf_counter()
            vals = self.run_task(bench_tasks.local_work_task, spec, f"local work {label} cp={cp}")
            if vals is None:
                continue
            samples = [v["samples"] for v in vals]
            for s in samples:
                s["local"] = [sum(s[k][i] for k in bench_tasks.LOCAL_STEPS if k not in bench_tasks.COLLECTIVE_STEPS)
                              for i in range(len(s["roundtrip"]))]
            st = {k: fold(samples, k) for k in (*bench_tasks.LOCAL_STEPS, "local", "roundtrip")}
            rt = st["roundtrip"]["p50"]
            rows = []
            for k in (*bench_tasks.LOCAL_STEPS, "local", "roundtrip"):
                kind = "collective" if k in bench_tasks.COLLECTIVE_STEPS else ("" if k == "roundtrip" else "local")
                rows.append([k if k != "local" else "local total", kind, f"{st[k]['p50']:.1f}", f"{st[k]['p90']:.1f}", f"{st[k]['mean']:.1f}",
                             f"{100 * st[k]['p50'] / rt:.2f}%"])
            print(table(["step", "kind", "p50 us", "p90 us", "mean us", "share of rt p50"], rows))
            if dev == "cuda":
                print("   (CUDA events: device time; the allocation is host-side, asynchronous, and shows as ~0)")
            share = st["local"]["p50"] / rt
            alg, bus = roundtrip_bandwidth(nbytes, rt, cp)
            print(f"   local work = {100 * share:.2f}% of the round trip (p50 {st['local']['p50'] / 1e3:.2f} ms of "
                  f"{rt / 1e3:.2f} ms); round trip algbw {alg:.3f} GB/s, busbw {bus:.3f} GB/s; "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
            entry = dict(seq_lens=list(seq_lens), cp=cp, policy=policy, page_size=page, backend=backend, device=dev,
                         tokens=plan.total_tokens, padded_total=plan.padded_total, bytes=nbytes, warmup=warmup,
                         iters=iters, stats=st, local_share=share, algbw_GBps=alg, busbw_GBps=bus)
            if dev == "cuda":
                # Collectives here are host-staged gloo (one GPU); estimate an 8-GPU NVLink node instead.
                coll_us = 2 * (nbytes * (cp - 1) / cp / (NVLINK_BUSBW_GBPS * 1e9) * 1e6 + NVLINK_LATENCY_US)
                est = st["local"]["p50"] / (st["local"]["p50"] + coll_us)
                entry["nvlink_estimate"] = dict(collectives_us=coll_us, local_share=est)
                print(f"   estimate on {cp} GPUs over NVLink ({NVLINK_BUSBW_GBPS:.0f} GB/s busbw, "
                      f"{NVLINK_LATENCY_US:.0f} us/collective): collectives {coll_us:.0f} us -> local work "
                      f"{100 * est:.2f}% of the round trip", flush=True)
            out.append(entry)
        self.results["local_work"] = out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes, for a smoke test")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--out", help="write all numbers to this JSON file")
    ap.add_argument("--sections", default="even,uneven,local", help="comma list of even, uneven, local")
    ap.add_argument("--prod-tokens", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="local-work section: token counts (one request each), e.g. 8000,16000")
    ap.add_argument("--prod-cp", type=int, default=None, help="local-work section: cp size (default 8)")
    ap.add_argument("--prod-iters", type=int, default=None, help="local-work section: timed iterations")
    ap.add_argument("--flush-l2", action="store_true", help="evict caches before every iteration")
    ap.add_argument("--timeout", type=float, default=600.0, help="per task, seconds")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    env = environment(args.device)
    t0 = time.perf_counter()
    print(f"bench_comm: {shlex.join([Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)])}")
    print(f"machine: {env['nproc']} CPUs ({env['cpu_model']}), host {env['host']}"
          + (f", GPU {env['gpu']} x{env['gpu_count']}" if env["gpu"] else ", no GPU"))
    print(f"versions: python {env['python']}, torch {env['torch']}" + (f", NCCL {env['nccl']}" if env["nccl"] else "")
          + f"; date {env['date']}; load average {env['loadavg_start']}")
    print(f"params: {'quick' if args.quick else 'full'}, H={bench.hidden} {bench.dtype}, device={args.device}, "
          f"flush_l2={args.flush_l2}; times are per-iteration max over ranks; 1 MB = 1e6 B, GB/s = 1e9 B/s; "
          f"round-trip algbw = 2*S/t, busbw = algbw*(cp-1)/cp (nccl-tests), S = gathered bytes")
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    try:
        if "even" in sections:
            bench.even()
        if "uneven" in sections:
            bench.uneven()
        if "local" in sections:
            bench.local_work()
    finally:
        close_pools()
    wall = time.perf_counter() - t0
    env["loadavg_end"] = _loadavg()
    print(f"\ncorrectness: {'all checks passed' if not bench.failures else f'{len(bench.failures)} FAILED'}; "
          f"wall {wall:.0f} s; load average {env['loadavg_end']}")
    for f in bench.failures:
        print(f"  FAILED {f}")
    if args.out:
        data = dict(env=env, params=dict(mode="quick" if args.quick else "full", hidden_size=bench.hidden,
                                          dtype=bench.dtype, device=args.device, flush_l2=args.flush_l2,
                                          argv=sys.argv[1:] if argv is None else argv),
                    even=bench.results.get("even", []), uneven=bench.results.get("uneven", []),
                    local_work=bench.results.get("local_work", []), failures=bench.failures, wall_s=wall)
        Path(args.out).write_text(json.dumps(data, indent=1, default=str))
        print(f"numbers: {args.out}")
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
