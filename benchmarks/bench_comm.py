#!/usr/bin/env python
"""Benchmark of the padded CP round trip against the legacy path and the alternatives.

    python benchmarks/bench_comm.py [--quick] [--device cpu|cuda] [--out FILE.json] [--no-gate]
    nox -s bench -- [same options]

On real ranks (a RankPool: gloo on CPU; on CUDA, NCCL where every rank has its
own GPU, else gloo with CUDA tensors), correctness first, then timings:

1. ``even``: padded / legacy round trip on even plans, with the in-place
   (zero-copy) form and an A/A control (legacy timed twice), all in one loop;
   the paired ratio is gated against its target (see :data:`GATE_RULE`);
2. ``uneven``: padded vs every alternative (the matrix's own point), legacy
   ``refused``, allgatherv ``skipped`` on gloo, and the a2a (DeepEP stand-in)
   in SCATTERED mode;
3. ``local``: the padded path's local work as a share of its round trip at
   production shape (H=7168, bf16, cp 8, 8k and 16k tokens);
4. ``single`` (default on CUDA only): cp 1 at production shape on the device's
   own backend (NCCL on a GPU).

Every point is the harness's own, :func:`nsa_cp_comm.harness.run_point` (the
matrix's checks, then the one timed loop over the production forms, folded
over ranks); the production shapes of ``local`` run it with
``checks="light"`` (no reference MoE). Semantics, columns and the relation to
nccl-tests' time, algbw and busbw are in PERF.md, which benchmarks/perf_md.py
renders from ``--out``.

``--padded IMPL`` checks and times another implementation in the padded
path's place (a registered name or ``package.module:attribute``): the tests
pass broken ones of tests/broken_impls.py (loaded as ``tests.broken_impls``
from the checkout) to prove that a wrong, failing or slow padded path sets
the exit code.

Exit code 1 when a check failed (a wrong result, a rank that raised, died or
hung) or, with the gate on, when an even-plan ratio FAILs the rule.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import shlex
import shutil
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
if str(REPO) not in sys.path:  # last: for ``--padded tests.broken_impls:NAME``
    sys.path.append(str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import perf_md  # noqa: E402
from nsa_cp_comm import impls as impl_registry  # noqa: E402
from nsa_cp_comm.harness import ImplResult, PointSpec, run_point  # noqa: E402
from nsa_cp_comm.harness.machine import cpu_model, nccl_version  # noqa: E402
from nsa_cp_comm.harness.pools import close_pools, get_pool  # noqa: E402
from nsa_cp_comm.harness.spec import DTYPES  # noqa: E402
from nsa_cp_comm.plugins import ImplError  # noqa: E402

RATIO_TARGET = 1.02
# One rank on a GPU (``single``: NCCL at cp 1, where the collectives are device-local copies and
# anything the padded path adds is the largest share of a round trip): its even-plan target.
SINGLE_TARGET = 1.03
GATE_RULE = (
    "An even-plan row FAILs when its paired ratio (median over iterations of padded rt / legacy rt, "
    f"timed back to back) is above the target {RATIO_TARGET} **and** above the A/A ceiling "
    "(max(p75, 1/p25) of the per-iteration control / legacy ratios, legacy timed twice in the same "
    "loop: the middle half of what identical paths show on this machine). At or below the target it "
    "is PASS; above the target but within the ceiling it is `within noise` (not a failure: the machine "
    "cannot tell that difference from zero). A FAIL sets exit code 1 unless `--no-gate`; `--quick` "
    "runs (tiny shapes, where the staging copy is a larger share than at the hidden size the target "
    "is stated for) are not gated unless `--gate`. On a GPU the one-rank rows at production shape "
    f"(`single`: NCCL at cp 1) are gated the same way at {SINGLE_TARGET}. A wrong result always sets exit code 1."
)

# A published 8-GPU NVLink 4 ring reaches about this all-gather / reduce-scatter
# busbw at large sizes, with about this much fixed cost per collective: the
# inputs of the modelled collective time the one-rank staging is put beside
# (a model, labelled so wherever it is printed; never a measurement).
NVLINK_BUSBW_GBPS = 360.0
NVLINK_LATENCY_US = 20.0

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
    "single": [((8000,), 1, "zigzag_page", 64, 2, 10), ((16000,), 1, "zigzag_page", 64, 2, 10)],
}
QUICK_PARAMS = {
    "hidden_size": 256,
    "dtype": "bfloat16",
    "even": [((512,), 2, "zigzag", 1, 1, 5)],
    "uneven": [((1001, 300), 2, "zigzag", 1, 1, 3), ((1000,), 2, "zigzag_page", 64, 1, 3)],
    "a2a_on": 1,
    "prod": [((1000,), 2, "zigzag_page", 64, 1, 2)],
    "single": [((1000,), 1, "zigzag_page", 64, 1, 3)],
}
# The A/A control of the even-plan ratio: legacy timed a second time in the same
# loop, under a name of its own (a reference, so that the ranks load it too):
# two identical paths show what the machine's noise alone does to a paired ratio.
LEGACY_AGAIN = dataclasses.replace(impl_registry.get("legacy"), doc="legacy again: the A/A control of the even plans")
CONTROL = "bench_comm:LEGACY_AGAIN"
UNEVEN_IMPLS = ("padded", "padded_zero_copy", "legacy", "sumlen_allreduce", "allgatherv")
EVEN_IMPLS = ("legacy", "padded", "padded_zero_copy")
PROD_IMPLS = ("padded", "padded_zero_copy")
SECTIONS = ("even", "uneven", "local", "single")
# Run order: the production-shape figures first, so that a run cut short by a
# time limit (gpu_check.sh's) still holds them; the JSON is written after each.
RUN_ORDER = ("single", "local", "even", "uneven")
BAD_STATUSES = ("failed", "error", "timeout")


# ---------------------------------------------------------------------------
# the gate
# ---------------------------------------------------------------------------


def gate_verdict(ratios: list[float], aa_ratios: list[float], target: float = RATIO_TARGET) -> dict:
    """The even-plan verdict of :data:`GATE_RULE` from per-iteration paired
    ratios (padded/legacy) and A/A ratios (control/legacy), with the paired
    ratio's distribution-free 95% interval (``ratio_lo``, ``ratio_hi``; NaN
    with too few iterations)."""
    from nsa_cp_comm.harness.calibrate import median_ci

    ratio = float(statistics.median(ratios))
    lo, hi = median_ci(ratios)
    aa = float(statistics.median(aa_ratios))
    p25, p75 = (float(x) for x in np.percentile(aa_ratios, [25, 75]))
    ceiling = max(p75, 1 / p25 if p25 > 0 else math.inf)
    if ratio <= target:
        verdict = "PASS"
    elif ratio <= ceiling:
        verdict = "within noise"
    else:
        verdict = "FAIL"
    return {"ratio": ratio, "ratio_lo": lo, "ratio_hi": hi, "aa_ratio": aa, "aa_ceiling": ceiling,
            "verdict": verdict}


def _median_us(fn, device: str, warmup: int, iters: int) -> float:
    """``fn()``'s median time in us: CUDA events on a GPU (the device's own clock), else the wall clock."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e6)
    return float(statistics.median(times))


def stage_alone(plan, hidden: int, dtype: torch.dtype, device: str, warmup: int = 3, iters: int = 20) -> dict | None:
    """The padded gather's local work timed on one rank alone on the device (no other rank
    sharing it, no collective): the rank of ``plan`` that stages the most rows
    (:func:`nsa_cp_comm.roundtrip.stages_rows`) copies them into a reused ``[m, H]`` send block,
    as the gather does; beside it the device's copy bandwidth, from a plain copy of the whole
    gathered buffer's bytes, and the stage that bandwidth predicts. None where no rank stages
    (an even plan)."""
    from nsa_cp_comm.roundtrip import SendBlock, padded_stage, stages_rows

    staging = [r for r in range(plan.cp_size) if stages_rows(plan, r)]
    if not staging:
        return None
    rank = max(staging, key=lambda r: plan.per_rank_tokens[r])
    n = plan.per_rank_tokens[rank]
    local = torch.randn(n, hidden, generator=torch.Generator().manual_seed(rank)).to(device=device, dtype=dtype)
    send = SendBlock(plan.max_rank_len, hidden, dtype=dtype, device=device, zero_from=n)  # as the rank makes it
    stage_us = _median_us(lambda: padded_stage(send, local, plan, rank), device, warmup, iters)
    src = torch.empty((plan.padded_total, hidden), dtype=dtype, device=device)
    dst = torch.empty_like(src)
    copy_us = _median_us(lambda: dst.copy_(src), device, warmup, iters)
    staged, copied = local.numel() * local.element_size(), src.numel() * src.element_size()
    copy_gbps = copied / copy_us / 1e3
    return dict(rank=rank, rows=n, bytes=staged, stage_us=stage_us, copy_bytes=copied, copy_us=copy_us,
                copy_GBps=copy_gbps, predicted_us=staged / copy_gbps / 1e3, iters=iters)


# ---------------------------------------------------------------------------
# machine, versions
# ---------------------------------------------------------------------------


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return ""


def ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def environment(device: str, command: str) -> dict:
    env = {
        "date": now(),
        "host": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "ram_gib": ram_gib(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "",
        "nccl": nccl_version(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "",
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "device": device,
        "command": command,
        "loadavg_start": loadavg(),
    }
    return env


def backend_for(device: str, cp: int) -> str:
    # NCCL refuses several ranks on one GPU ("Duplicate GPU detected").
    if device == "cuda" and torch.cuda.device_count() >= cp:
        return "nccl"
    return "gloo"


# ---------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------


def impl_entry(r: ImplResult) -> dict:
    return dict(status=r.status, reason=r.reason, failed_check=r.failed_check, correct=r.correct,
                max_rel_err=r.max_rel_err, even_bitwise_equal=r.even_bitwise_equal, stats=r.stats,
                rows_moved=r.rows_moved, bytes_moved=r.bytes_padded, bytes_useful=r.bytes_useful,
                algbw_GBps=r.algbw_padded_GBps, busbw_GBps=r.busbw_padded_GBps,
                algbw_useful_GBps=r.algbw_useful_GBps, busbw_useful_GBps=r.busbw_useful_GBps)


def plan_entry(spec: PointSpec) -> dict:
    plan = spec.plan()
    return dict(seq_lens=list(spec.seq_lens), cp=spec.cp_size, policy=spec.policy, page_size=spec.page_size,
                tokens=plan.total_tokens, padded_total=plan.padded_total, max_rank_len=plan.max_rank_len,
                per_rank_tokens=list(plan.per_rank_tokens), padding_frac=plan.padding_frac,
                bytes=plan.padded_total * spec.hidden_size * DTYPES[spec.dtype].itemsize)


class Bench:
    def __init__(self, args: argparse.Namespace, env: dict) -> None:
        self.args = args
        self.params = QUICK_PARAMS if args.quick else FULL_PARAMS
        self.hidden = self.params["hidden_size"]
        self.dtype = self.params["dtype"]
        self.workdir = tempfile.mkdtemp(prefix="bench_comm_")
        self.gate_on = (not args.quick) if args.gate is None else args.gate
        self.failures: list[str] = []
        self.data: dict = dict(
            schema=1, env=env, complete=False,
            params=dict(mode="quick" if args.quick else "full", hidden_size=self.hidden, dtype=self.dtype,
                        device=args.device, flush_l2=args.flush_l2, sections=args.sections, padded=args.padded),
            gate=dict(on=self.gate_on, target=RATIO_TARGET, single_target=SINGLE_TARGET, rule=GATE_RULE),
            sections={}, even=[], single=[], uneven=[], local_work=[], failures=self.failures,
        )
        self.t0 = time.perf_counter()

    # -- plumbing -------------------------------------------------------------
    def spec(self, seq_lens, cp, policy, page, warmup, iters, impls, **kw) -> PointSpec:
        impls = tuple(self.args.padded if name == "padded" else name for name in impls)
        return PointSpec(tuple(seq_lens), cp, policy, page_size=page, hidden_size=self.hidden, dtype=self.dtype,
                         warmup=warmup, iters=iters, flush_l2=self.args.flush_l2, impls=impls, **kw)

    def run(self, spec: PointSpec, what: str, checks: str = "full") -> dict[str, ImplResult] | None:
        """The harness's point on a warm pool, its results by implementation
        (``--padded``'s under ``padded``); a bad status is a correctness
        failure, and a rank that raised, died or hung gives None."""
        backend = backend_for(self.args.device, spec.cp_size)
        pool = get_pool(spec.cp_size, backend=backend, device=self.args.device, workdir=self.workdir)
        results = run_point(spec, pool, timeout_s=self.args.timeout, checks=checks)
        for r in results:
            if r.status in BAD_STATUSES:
                check = f" [{r.failed_check}]" if r.failed_check else ""
                self.failures.append(f"{what} {r.impl}: {r.status}{check}: {r.reason}")
        if any(r.status in ("error", "timeout") for r in results):
            return None
        return {"padded" if r.impl == self.args.padded else r.impl: r for r in results}

    def begin(self, key: str, title: str) -> None:
        self.data["sections"][key] = {"start": now(), "loadavg": loadavg()}
        print(f"\n== {title} (load average {loadavg()}) ==", flush=True)

    def save(self) -> None:
        if self.args.out:
            self.data["wall_s"] = time.perf_counter() - self.t0
            self.data["env"]["loadavg_end"] = loadavg()
            Path(self.args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(self.args.out).write_text(json.dumps(self.data, indent=1, default=str) + "\n")

    def show(self, section: str, entries: list[dict]) -> None:
        if entries:
            print(perf_md.section_markdown(section, entries), flush=True)

    # -- sections -------------------------------------------------------------
    def paired(self, key: str, points: list[tuple], gate: bool, target: float = RATIO_TARGET) -> None:
        """Even plans (or cp 1): checks, then legacy, padded, the in-place form
        and the A/A control in one loop; paired ratios per iteration."""
        out = self.data[key]
        for seq_lens, cp, policy, page, warmup, iters in points:
            spec = self.spec(seq_lens, cp, policy, page, warmup, iters, impls=(*EVEN_IMPLS, CONTROL))
            what = f"{key} {perf_md.plan_label(plan_entry(spec))} cp={cp}"
            if not spec.plan().is_even:
                self.failures.append(f"{what}: plan {spec.plan().per_rank_tokens} is not even")
                continue
            res = self.run(spec, what)
            if res is None:
                continue
            # Per timed iteration (slowest rank), every round trip of the same loop.
            per_it = {n: res[n].samples.get("roundtrip", []) for n in (*EVEN_IMPLS, CONTROL)}
            control = per_it.pop(CONTROL)
            entry = dict(plan=plan_entry(spec), backend=backend_for(self.args.device, cp), device=self.args.device,
                         warmup=warmup, iters=iters, impls={n: impl_entry(res[n]) for n in EVEN_IMPLS},
                         verdict="not timed")
            if control and all(per_it.values()):
                entry["control"] = {"roundtrip_p50_us": float(np.median(control))}
                leg = per_it["legacy"]
                ratios = [p / q for p, q in zip(per_it["padded"], leg)]
                aa = [c / q for c, q in zip(control, leg)]
                entry.update(gate_verdict(ratios, aa, target), target=target)
                entry["ratio_in_place"] = float(statistics.median(
                    z / q for z, q in zip(per_it["padded_zero_copy"], leg)))
                if not gate:
                    entry["verdict"] = f"{entry['verdict']} (not gated)"
            out.append(entry)
            self.save()
        self.show("even", out)

    def even(self) -> None:
        self.begin("even", f"even plans: padded / legacy round trip (target paired ratio <= {RATIO_TARGET})")
        self.paired("even", self.params["even"], gate=True)
        print(f"  gate {'on' if self.gate_on else 'off'}: {GATE_RULE}")

    def single(self) -> None:
        # one rank on a GPU: NCCL's own copies, no host in the way; elsewhere only with --gate
        gated = self.gate_on and (self.args.device == "cuda" or self.args.gate is True)
        self.begin("single", f"one rank at production shape: padded / legacy on {backend_for(self.args.device, 1)}"
                   + (f" (target paired ratio <= {SINGLE_TARGET})" if gated else " (reported, not gated)"))
        self.paired("single", self.params["single"], gate=gated, target=SINGLE_TARGET)

    def uneven(self) -> None:
        self.begin("uneven", "uneven plans: padded vs alternatives (the matrix's point: checks, then timings)")
        out = self.data["uneven"]
        for i, (seq_lens, cp, policy, page, warmup, iters) in enumerate(self.params["uneven"]):
            points = [("FULL", UNEVEN_IMPLS)]
            if i == self.params["a2a_on"]:
                points.append(("SCATTERED", ("padded", "a2a")))
            for mode, impls in points:
                spec = self.spec(seq_lens, cp, policy, page, warmup, iters, mode=mode, impls=impls)
                what = f"uneven {perf_md.plan_label(plan_entry(spec))} cp={cp} {mode}"
                res = self.run(spec, what)
                if res is None:
                    continue
                out.append(dict(plan=plan_entry(spec), mode=mode, backend=backend_for(self.args.device, cp),
                                device=self.args.device, warmup=warmup, iters=iters,
                                impls={n: impl_entry(r) for n, r in res.items()}))
                self.save()
        self.show("uneven", out)
        skipped = sorted({f"{n}: {r['reason']}" for e in out for n, r in e["impls"].items()
                          if r["status"] == "skipped"})
        for s in skipped:
            print(f"  skipped {s}")

    def local(self) -> None:
        dev = self.args.device
        self.begin("local_work", f"the padded path's local work at production shape ({dev})")
        prod = self.params["prod"]
        if self.args.prod_tokens:
            base = prod[-1]
            prod = [((t,), *base[1:]) for t in self.args.prod_tokens]
        out = self.data["local_work"]
        for seq_lens, cp, policy, page, warmup, iters in prod:
            cp = self.args.prod_cp or cp
            iters = self.args.prod_iters or iters
            spec = self.spec(seq_lens, cp, policy, page, warmup, iters, impls=PROD_IMPLS)
            pe = plan_entry(spec)
            what = f"local {perf_md.plan_label(pe)} cp={cp}"
            print(f"-- {what}: H={self.hidden} {self.dtype} {backend_for(dev, cp)}/{dev}, buffer "
                  f"{pe['padded_total']} rows = {pe['bytes'] / 1e6:.1f} MB, padding_frac={pe['padding_frac']:.3f}, "
                  f"warmup={warmup} iters={iters}", flush=True)
            res = self.run(spec, what, checks="light")
            if res is None:
                continue
            impls = {n: impl_entry(r) for n, r in res.items()}
            entry = dict(plan=pe, backend=backend_for(dev, cp), device=dev, warmup=warmup, iters=iters, impls=impls)
            pad = res["padded"].samples
            if pad.get("local"):
                # with the point's cp ranks sharing this machine's device (and CPUs): contended
                entry["local_share"] = float(np.median([a / b for a, b in zip(pad["local"], pad["roundtrip"])]))
            alone = stage_alone(spec.plan(), self.hidden, DTYPES[self.dtype], dev)
            if alone is not None:
                entry["alone"] = alone
                if dev == "cuda" and cp > 1:
                    # One GPU cannot time cp > 1 NCCL: the one-rank stage, measured, beside the
                    # collectives of an NVLink node, modelled from the inputs named in the entry.
                    coll_us = 2 * (pe["bytes"] * (cp - 1) / cp / (NVLINK_BUSBW_GBPS * 1e9) * 1e6 + NVLINK_LATENCY_US)
                    entry["model"] = dict(busbw_GBps=NVLINK_BUSBW_GBPS, latency_us=NVLINK_LATENCY_US,
                                          collectives_us=coll_us,
                                          local_share=alone["stage_us"] / (alone["stage_us"] + coll_us))
            out.append(entry)
            self.save()
        self.show("local", out)
        for e in out:
            if "local_share" in e:
                print(f"  {perf_md.plan_label(e['plan'])} cp={e['plan']['cp']}: local work = "
                      f"{perf_md.pct(e['local_share'])} of the padded round trip (median over iterations, "
                      f"{e['plan']['cp']} ranks sharing this machine)")
        if any("alone" in e for e in out):
            print(perf_md.alone_markdown(out), flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes, for a smoke test (not gated unless --gate)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--out", help="write every number, the machine and the command to this JSON file")
    ap.add_argument("--sections", default=None,
                    help=f"comma list of {', '.join(SECTIONS)} (default: even,uneven,local; plus single on cuda)")
    ap.add_argument("--prod-tokens", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="local-work section: token counts (one request each), e.g. 8000,16000")
    ap.add_argument("--prod-cp", type=int, default=None, help="local-work section: cp size (default 8)")
    ap.add_argument("--prod-iters", type=int, default=None, help="local-work section: timed iterations")
    ap.add_argument("--flush-l2", action="store_true", help="evict caches before every iteration")
    ap.add_argument("--timeout", type=float, default=600.0, help="per point, seconds")
    ap.add_argument("--gate", action=argparse.BooleanOptionalAction, default=None,
                    help="whether the even-plan ratio target sets the exit code (default: on, off for --quick)")
    ap.add_argument("--padded", default="padded", metavar="IMPL",
                    help="the FULL-mode implementation checked and timed in the padded path's place: a registered "
                    "name or package.module:attribute (the tests pass broken ones, tests.broken_impls:NAME)")
    args = ap.parse_args(argv)
    try:
        impl = impl_registry.get(args.padded)
    except ImplError as exc:
        ap.error(f"--padded {args.padded}: {exc}")
    if impl.mode != "FULL":
        ap.error(f"--padded {args.padded}: a {impl.mode}-mode implementation, not a FULL-mode round trip")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available")
    if args.sections is None:
        args.sections = "even,uneven,local" + (",single" if args.device == "cuda" else "")
    unknown = {s.strip() for s in args.sections.split(",") if s.strip()} - set(SECTIONS)
    if unknown:
        ap.error(f"--sections: {', '.join(sorted(unknown))} not in {', '.join(SECTIONS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join([sys.executable, sys.argv[0] if argv is None else __file__,
                          *(sys.argv[1:] if argv is None else argv)])
    env = environment(args.device, command)
    bench = Bench(args, env)
    print(f"bench_comm: {command}")
    print(f"machine: {env['cpu_model']}, {env['nproc']} CPUs, {env['ram_gib'] or 0:.1f} GiB"
          + (f", GPU {env['gpu']} x{env['gpu_count']}" if env["gpu"] else ", no GPU") + f", {env['os']}")
    print(f"versions: python {env['python']}, torch {env['torch']}" + (f", NCCL {env['nccl']}" if env["nccl"] else "")
          + f"; date {env['date']}; load average {env['loadavg_start']}")
    print(f"params: {bench.data['params']['mode']}, H={bench.hidden} {bench.dtype}, device={args.device}, "
          f"flush_l2={args.flush_l2}, gate {'on' if bench.gate_on else 'off'}"
          + (f", padded path: {args.padded}" if args.padded != "padded" else "")
          + ". Columns: see PERF.md (times = per-iteration max over ranks, p50 over iterations; "
          "rt = local + gather + scatter; busbw = nccl-tests')")
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    try:
        for s in RUN_ORDER:
            if s in sections:
                getattr(bench, s)()
    finally:
        close_pools()
        shutil.rmtree(bench.workdir, ignore_errors=True)  # the ranks' rendezvous files
    # gated rows: the even plans, and the one-rank rows on a GPU (their verdict says "not gated" elsewhere)
    fails = [e for key in ("even", "single") for e in bench.data[key] if e.get("verdict") == "FAIL"]
    verdicts = [e.get("verdict", "") for key in ("even", "single") for e in bench.data[key]]
    summary = ", ".join(f"{v} {verdicts.count(v)}" for v in dict.fromkeys(verdicts)) or "no even-plan rows"
    code = 1 if bench.failures or (bench.gate_on and fails) else 0
    bench.data.update(complete=True, exit_code=code,
                      summary=f"correctness {'ok' if not bench.failures else f'{len(bench.failures)} FAILED'}; "
                              f"even-plan ratio: {summary}")
    bench.save()
    print(f"\ncorrectness: {'all checks passed' if not bench.failures else f'{len(bench.failures)} FAILED'}; "
          f"even-plan ratio: {summary} (gate {'on' if bench.gate_on else 'off'}); "
          f"wall {time.perf_counter() - bench.t0:.0f} s; load average {loadavg()}")
    for f in bench.failures:
        print(f"  FAILED {f}")
    for e in fails:
        print(f"  RATIO FAIL {perf_md.plan_label(e['plan'])} cp={e['plan']['cp']}: paired ratio {e['ratio']:.3f} > "
              f"target {e.get('target', RATIO_TARGET)} and > A/A ceiling {e['aa_ceiling']:.3f}"
              + ("" if bench.gate_on else " (gate off: exit code unaffected)"))
    if args.out:
        print(f"numbers: {args.out}")
    print(f"exit {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
