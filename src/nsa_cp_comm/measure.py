"""One matrix point on real ranks: correctness checks first, then timings.

:func:`point_on_rank` runs inside every rank of a :class:`~.ranks.RankPool`;
:func:`run_point` sends it to the pool and folds the ranks' reports into one
result per implementation (SPEC sections 3 and 4). Nothing here knows about
Hydra or CSV files.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from . import alternatives
from . import impls as impl_registry
from .communicator import CPLayerCommunicator
from .modes import ScatterMode
from .moe import ReferenceMoE, max_rel_err, tolerance
from .plan import CPPlan, plan_split
from .ranks import RankPool, rank_device, summarize_failure
from .roundtrip import LEGACY_UNEVEN_ERROR
from .timing import CacheFlusher, Clock, max_over_ranks, roundtrip_bandwidth, summarize

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
FAULTS: tuple[str, ...] = ("none", "crash_rank", "hang_rank", "raise")
PHASES: tuple[str, ...] = ("gather", "scatter", "roundtrip")


@dataclass(frozen=True)
class PointSpec:
    """Everything a rank needs to run a point; plain values only (pickled to ranks)."""

    seq_lens: tuple[int, ...]
    cp_size: int
    policy: str
    page_size: int = 1
    align: int | None = None
    mode: str = "FULL"
    impls: tuple[str, ...] = ("padded", "legacy")
    hidden_size: int = 7168
    dtype: str = "bfloat16"
    num_experts: int | None = None  # None: two experts per rank
    topk: int = 2
    warmup: int = 5
    iters: int = 20
    seed: int = 0
    flush_l2: bool = False
    fault: str = "none"  # tests only: make the last rank crash, hang or raise

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.fault not in FAULTS:
            raise ValueError(f"fault={self.fault!r} is not one of {', '.join(FAULTS)}")
        ScatterMode(self.mode)
        for name in self.impls:
            impl_registry.get(name)
        for key in ("hidden_size", "topk", "iters"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{key}={v!r} must be a positive int")
        if not isinstance(self.warmup, int) or isinstance(self.warmup, bool) or self.warmup < 0:
            raise ValueError(f"warmup={self.warmup!r} must be a non-negative int")
        if self.experts % self.cp_size:
            raise ValueError(f"num_experts={self.experts} is not a multiple of cp_size={self.cp_size}")
        if not 1 <= self.topk <= self.experts:
            raise ValueError(f"topk={self.topk} must be in [1, num_experts={self.experts}]")

    @property
    def experts(self) -> int:
        return self.num_experts if self.num_experts is not None else 2 * self.cp_size

    def plan(self) -> CPPlan:
        return plan_split(self.seq_lens, self.cp_size, policy=self.policy, page_size=self.page_size, align=self.align)


def shard_seed(seed: int, rank: int) -> int:
    """Seed of rank ``rank``'s hidden states: (seed, rank) names the data, so a
    failing point reproduces from its row alone."""
    return seed * 1_000_003 + rank


def make_shard(spec: PointSpec, plan: CPPlan, rank: int, device: torch.device, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s ``[n_r, H]`` hidden states, generated on the CPU (same bits
    on every device) from :func:`shard_seed`. ``salt`` picks another input set."""
    g = torch.Generator().manual_seed(shard_seed(spec.seed, rank) + 7919 * salt)
    x = torch.randn(plan.per_rank_tokens[rank], spec.hidden_size, generator=g)
    return x.to(device=device, dtype=DTYPES[spec.dtype])


def _bits(t: torch.Tensor) -> torch.Tensor:
    # Byte-exact comparison: NaN == NaN and -0.0 != 0.0 here, unlike torch.equal.
    return t.contiguous().view(torch.uint8)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


@dataclass
class ImplReport:
    """One rank's findings for one implementation."""

    correct: bool | None = None
    max_rel_err: float | None = None
    even_bitwise_equal: bool | None = None
    skipped: str = ""
    note: str = ""
    failures: list[str] = field(default_factory=list)
    samples: dict[str, list[float]] = field(default_factory=dict)
    rows_sent: int | None = None  # a2a (issue 5): rows this rank dispatched


def _check_gather(rt: impl_registry.RoundTrip, full: torch.Tensor, spec: PointSpec, plan: CPPlan, device) -> list[str]:
    """SPEC 3.1: every rank's block holds that rank's rows, then zeros."""
    bad = []
    if full.shape != (rt.buffer_rows(plan), spec.hidden_size):
        return [f"gathered shape {tuple(full.shape)} != ({rt.buffer_rows(plan)}, {spec.hidden_size})"]
    starts = rt.starts(plan)
    for r in range(plan.cp_size):
        n, s = plan.per_rank_tokens[r], starts[r]
        if not bitwise_equal(full[s : s + n], make_shard(spec, plan, r, device)):
            bad.append(f"gathered rows of rank {r} differ")
    if rt.layout == "rank_major_padded":
        m = plan.max_rank_len
        for r in range(plan.cp_size):
            pad = full[r * m + plan.per_rank_tokens[r] : (r + 1) * m]
            if pad.numel() and bool(pad.ne(0).any()):
                bad.append(f"padding rows of rank {r} are not zero")
    return bad


def _compare_to_reference(
    rep: ImplReport, out: torch.Tensor, local: torch.Tensor, moe: ReferenceMoE, spec: PointSpec, plan: CPPlan, what: str
) -> None:
    """SPEC 3.2: this rank's output vs the single-process reference MoE on its
    own rows; records the error and settles ``rep.correct``."""
    ref = moe.reference(local)
    rep.max_rel_err = max_rel_err(out, ref) if out.shape == ref.shape else math.inf
    tol = tolerance(DTYPES[spec.dtype], plan.cp_size)
    if not rep.max_rel_err <= tol:
        rep.failures.append(f"{what} vs reference MoE: max_rel_err {rep.max_rel_err:.3g} > {tol:.3g}")
    rep.correct = not rep.failures


def _rotation(set_bytes: int) -> int:
    """How many input sets to rotate through: enough to outgrow a 64 MiB
    cache, at most 4 (memory)."""
    return max(1, min(4, -(-(64 << 20) // max(set_bytes, 1))))


def _inject(spec: PointSpec, rank: int) -> None:
    if spec.fault == "none" or rank != spec.cp_size - 1:
        return
    time.sleep(0.2)  # let the healthy ranks enter the collective first
    if spec.fault == "crash_rank":
        os._exit(17)
    if spec.fault == "hang_rank":
        while True:
            time.sleep(3600)
    raise RuntimeError(f"injected fault on rank {rank}")


def _check_impl(rt, spec, plan, rank, device, local, moe, mode) -> tuple[ImplReport, torch.Tensor | None, torch.Tensor | None]:
    rep = ImplReport()
    comm = CPLayerCommunicator(plan, mode, impl=rt.name) if rt.name in ("padded", "legacy") else None
    if mode is ScatterMode.SCATTERED:
        # SPEC 3.5: DeepEP keeps tokens scattered; the communicator moves nothing.
        comm = comm or CPLayerCommunicator(plan, mode)
        moe_in = comm.prepare_mlp(local)
        out = comm.postprocess(moe_in)
        rep.correct = moe_in is local and out is local and bitwise_equal(out, make_shard(spec, plan, rank, device))
        if not rep.correct:
            rep.failures.append("SCATTERED mode changed the rows")
        rep.note = "SCATTERED: rows pass through, no collective"
        return rep, None, None
    if rt.needs_even and not plan.is_even:
        # SPEC 3.4: the legacy path must refuse, on every rank, before any collective.
        t0 = time.perf_counter()
        try:
            rt.gather(local, plan)
        except ValueError as exc:
            raised = str(exc)
        else:
            raised = ""
        took = time.perf_counter() - t0
        rep.correct = raised.startswith(LEGACY_UNEVEN_ERROR) and took < 5.0
        rep.note = raised or "legacy gather accepted an uneven plan"
        if not rep.correct:
            rep.failures.append(f"legacy on uneven plan: {rep.note} after {took:.2f}s")
        return rep, None, None
    gather = comm.prepare_mlp if comm else (lambda x: rt.gather(x, plan))
    scatter = comm.postprocess if comm else (lambda x: rt.scatter(x, plan))
    full = gather(local)
    rep.failures += _check_gather(rt, full, spec, plan, device)
    partial = moe.partial(full, rank, plan.cp_size)
    out = scatter(partial.clone())
    _compare_to_reference(rep, out, local, moe, spec, plan, "round trip")
    return rep, full, out


def _time_impls(
    rts: list[impl_registry.RoundTrip], spec: PointSpec, plan: CPPlan, rank: int, device: torch.device
) -> dict[str, dict[str, list[float]]]:
    """Warm-up, then ``iters`` timed iterations of each implementation's gather
    and scatter, each started together on all ranks (barrier) and
    device-synchronised. Implementations take turns within every iteration,
    so drift in the machine's state hits them alike; input sets rotate so a
    small point does not time a warm cache."""
    clock = Clock(device)
    flush = CacheFlusher(device) if spec.flush_l2 else None
    dtype = DTYPES[spec.dtype]
    rows = max(rt.buffer_rows(plan) for rt in rts)
    set_bytes = (plan.per_rank_tokens[rank] + rows) * spec.hidden_size * dtype.itemsize
    n_sets = _rotation(set_bytes)
    locals_ = [make_shard(spec, plan, rank, device, salt=i) for i in range(n_sets)]
    partials = {
        rt.name: [torch.randn(rt.buffer_rows(plan), spec.hidden_size, device=device).to(dtype) for _ in range(n_sets)]
        for rt in rts
    }
    scratch = {rt.name: torch.empty_like(partials[rt.name][0]) for rt in rts}
    samples = {rt.name: {p: [] for p in PHASES} for rt in rts}
    for it in range(spec.warmup + spec.iters):
        i = it % n_sets
        for rt in rts:
            scratch[rt.name].copy_(partials[rt.name][i])  # the scatter consumes its input
            if flush:
                flush()
            clock.sync()
            dist.barrier()
            g0 = clock.mark()
            rt.gather(locals_[i], plan)
            g1 = clock.mark()
            clock.sync()
            dist.barrier()
            s0 = clock.mark()
            rt.scatter(scratch[rt.name], plan)
            s1 = clock.mark()
            clock.sync()
            if it >= spec.warmup:
                g, s = clock.elapsed_us(g0, g1), clock.elapsed_us(s0, s1)
                out = samples[rt.name]
                out["gather"].append(g)
                out["scatter"].append(s)
                out["roundtrip"].append(g + s)
    return samples


def _time_passthrough(spec: PointSpec, plan: CPPlan, local: torch.Tensor, device: torch.device) -> dict[str, list[float]]:
    clock = Clock(device)
    comm = CPLayerCommunicator(plan, ScatterMode.SCATTERED)
    samples: dict[str, list[float]] = {p: [] for p in PHASES}
    for it in range(spec.warmup + spec.iters):
        t0 = clock.mark()
        x = comm.prepare_mlp(local)
        t1 = clock.mark()
        comm.postprocess(x)
        t2 = clock.mark()
        clock.sync()
        if it >= spec.warmup:
            samples["gather"].append(clock.elapsed_us(t0, t1))
            samples["scatter"].append(clock.elapsed_us(t1, t2))
            samples["roundtrip"].append(clock.elapsed_us(t0, t2))
    return samples


# --- a2a (issue 5): the SCATTERED path's MoE dispatch/combine, a stand-in for DeepEP ---


def _check_a2a(spec: PointSpec, plan: CPPlan, rank: int, device, local: torch.Tensor, moe: ReferenceMoE) -> ImplReport:
    """Dispatch -> local experts with the routing weights -> combine; the
    dispatched rows must be exactly the rows routed here, and the combined
    ``[n_r, H]`` must match the single-process reference MoE."""
    rep = ImplReport(note=alternatives.A2A_NOTE)
    experts = moe.experts_of(rank, plan.cp_size)
    idx, weight = moe.route(local)
    x_recv, handle = alternatives.a2a_dispatch(local, idx, weight, len(experts))
    rep.rows_sent = handle.rows_sent
    shards = [make_shard(spec, plan, r, device) for r in range(plan.cp_size)]
    if not bitwise_equal(x_recv, alternatives.a2a_expected_recv(shards, moe, rank)):
        rep.failures.append(f"dispatched rows differ from the rows routed to rank {rank}")
    out = alternatives.a2a_combine(alternatives.a2a_experts(moe, x_recv, handle, experts), handle)
    _compare_to_reference(rep, out, local, moe, spec, plan, "a2a round trip")
    return rep


def _time_a2a(spec: PointSpec, plan: CPPlan, rank: int, device: torch.device, moe: ReferenceMoE) -> dict[str, list[float]]:
    """Like :func:`_time_impl`: dispatch is the "gather" phase, combine the
    "scatter" phase (routing, the gate's job, and the experts are not timed)."""
    clock = Clock(device)
    flush = CacheFlusher(device) if spec.flush_l2 else None
    per = moe.num_experts // plan.cp_size
    set_bytes = 2 * plan.per_rank_tokens[rank] * spec.hidden_size * DTYPES[spec.dtype].itemsize
    n_sets = _rotation(set_bytes)
    sets = []
    for i in range(n_sets):
        x = make_shard(spec, plan, rank, device, salt=i)
        sets.append((x, *moe.route(x)))
    samples: dict[str, list[float]] = {p: [] for p in PHASES}
    for it in range(spec.warmup + spec.iters):
        x, idx, weight = sets[it % n_sets]
        if flush:
            flush()
        clock.sync()
        dist.barrier()
        g0 = clock.mark()
        x_recv, handle = alternatives.a2a_dispatch(x, idx, weight, per)
        g1 = clock.mark()
        clock.sync()
        dist.barrier()
        s0 = clock.mark()
        alternatives.a2a_combine(x_recv, handle)
        s1 = clock.mark()
        clock.sync()
        if it >= spec.warmup:
            g, s = clock.elapsed_us(g0, g1), clock.elapsed_us(s0, s1)
            samples["gather"].append(g)
            samples["scatter"].append(s)
            samples["roundtrip"].append(g + s)
    return samples


# --- end a2a (issue 5) ---


def point_on_rank(spec: PointSpec, backend: str) -> dict[str, dict[str, Any]]:
    """Runs on every rank of the pool: checks, then timings, per implementation.

    All ranks receive the same spec, hence the same plan, so they take the
    same branches and issue the same collectives."""
    rank = dist.get_rank()
    device = rank_device()
    plan = spec.plan()
    mode = ScatterMode(spec.mode)
    local = make_shard(spec, plan, rank, device)
    moe = ReferenceMoE(
        spec.hidden_size, num_experts=spec.experts, topk=spec.topk, seed=spec.seed, dtype=DTYPES[spec.dtype], device=device
    )
    _inject(spec, rank)
    reports: dict[str, ImplReport] = {}
    outputs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name in spec.impls:
        rt = impl_registry.get(name)
        reason = rt.skip_reason(backend) or alternatives.a2a_mode_skip(name, mode.value)
        if reason:
            reports[name] = ImplReport(skipped=reason)
            continue
        if name in alternatives.A2A_IMPLS:  # issue 5: a2a checks itself
            reports[name] = _check_a2a(spec, plan, rank, device, local, moe)
            continue
        rep, full, out = _check_impl(rt, spec, plan, rank, device, local, moe, mode)
        reports[name] = rep
        if full is not None:
            outputs[name] = (full, out)
    if plan.is_even and mode is ScatterMode.FULL:
        # SPEC 3.3: on even plans the fix is the old behaviour, bit for bit, and
        # allocates no padding rows.
        if "padded" in outputs and "legacy" in outputs:
            (pf, po), (lf, lo) = outputs["padded"], outputs["legacy"]
            eq = pf.shape[0] == plan.total_tokens and bitwise_equal(pf, lf) and bitwise_equal(po, lo)
            for name in ("padded", "legacy"):
                reports[name].even_bitwise_equal = eq
                if not eq:
                    reports[name].failures.append("even plan: padded and legacy results differ")
    # Agree on what to time: a check that failed on one rank must stop the
    # timing of that impl on all of them, or the others would wait forever.
    names = list(reports)
    failed = torch.tensor([float(bool(reports[n].failures)) for n in names], device=device)
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    timed = []
    for name, bad in zip(names, failed.tolist()):
        rep = reports[name]
        if rep.skipped or bad or (not plan.is_even and impl_registry.get(name).needs_even and mode is ScatterMode.FULL):
            continue
        if name in alternatives.A2A_IMPLS:  # issue 5
            rep.samples = _time_a2a(spec, plan, rank, device, moe)
        elif mode is ScatterMode.SCATTERED:
            rep.samples = _time_passthrough(spec, plan, local, device)
        else:
            timed.append(impl_registry.get(name))
    if timed:
        for name, samples in _time_impls(timed, spec, plan, rank, device).items():
            reports[name].samples = samples
    return {name: asdict(rep) for name, rep in reports.items()}


@dataclass
class ImplResult:
    """One implementation's result for a point, over all ranks."""

    impl: str
    status: str
    reason: str = ""
    correct: bool | None = None
    max_rel_err: float | None = None
    even_bitwise_equal: bool | None = None
    stats: dict[str, dict[str, float]] = field(default_factory=dict)
    rows_moved: int | None = None
    bytes_padded: int | None = None
    bytes_useful: int | None = None
    algbw_padded_GBps: float | None = None
    busbw_padded_GBps: float | None = None
    algbw_useful_GBps: float | None = None
    busbw_useful_GBps: float | None = None


def fold_reports(spec: PointSpec, plan: CPPlan, per_rank: list[dict[str, dict[str, Any]]]) -> list[ImplResult]:
    """Combine every rank's reports: correct only if correct on every rank,
    the largest error, per-iteration max over ranks for times."""
    itemsize = DTYPES[spec.dtype].itemsize
    moves = spec.mode == ScatterMode.FULL.value
    results = []
    for name in spec.impls:
        reps = [r[name] for r in per_rank]
        if reps[0]["skipped"]:
            results.append(ImplResult(name, "skipped", reason=reps[0]["skipped"]))
            continue
        failures = [f"rank {rank}: {f}" for rank, rep in enumerate(reps) for f in rep["failures"]]
        errs = [rep["max_rel_err"] for rep in reps if rep["max_rel_err"] is not None]
        evens = [rep["even_bitwise_equal"] for rep in reps if rep["even_bitwise_equal"] is not None]
        res = ImplResult(
            name,
            "failed" if failures else "ok",
            reason="; ".join(failures[:3]) or reps[0]["note"],
            correct=all(rep["correct"] for rep in reps),
            max_rel_err=max(errs) if errs else None,
            even_bitwise_equal=all(evens) if evens else None,
        )
        if reps[0]["samples"]:
            res.stats = {p: summarize(max_over_ranks([rep["samples"][p] for rep in reps])) for p in PHASES}
        if reps[0]["samples"] and name in alternatives.A2A_IMPLS:  # issue 5
            _fold_a2a(res, reps, spec, plan, itemsize)
        elif reps[0]["samples"]:
            rt = impl_registry.get(name)
            rows = rt.buffer_rows(plan) if moves else 0
            res.rows_moved = rows
            res.bytes_padded = rows * spec.hidden_size * itemsize
            res.bytes_useful = (plan.total_tokens if moves else 0) * spec.hidden_size * itemsize
            if moves:
                rt_us = res.stats["roundtrip"]["p50"]
                res.algbw_padded_GBps, res.busbw_padded_GBps = roundtrip_bandwidth(res.bytes_padded, rt_us, plan.cp_size)
                res.algbw_useful_GBps, res.busbw_useful_GBps = roundtrip_bandwidth(res.bytes_useful, rt_us, plan.cp_size)
        results.append(res)
    return results


def _fold_a2a(res: ImplResult, reps: list[dict[str, Any]], spec: PointSpec, plan: CPPlan, itemsize: int) -> None:
    """a2a (issue 5): rows/bytes are what the dispatch actually sent (each
    token once per destination rank, itself included; the combine returns as
    many); bandwidth has nccl-tests alltoall semantics, ``S`` = bytes per rank
    (total / cp), so busbw compares with the gather's."""
    rows = sum(rep["rows_sent"] or 0 for rep in reps)
    res.rows_moved = rows
    res.bytes_padded = rows * spec.hidden_size * itemsize
    res.bytes_useful = plan.total_tokens * spec.hidden_size * itemsize
    rt_us = res.stats["roundtrip"]["p50"]
    cp = plan.cp_size
    res.algbw_padded_GBps, res.busbw_padded_GBps = roundtrip_bandwidth(res.bytes_padded // cp, rt_us, cp)
    res.algbw_useful_GBps, res.busbw_useful_GBps = roundtrip_bandwidth(res.bytes_useful // cp, rt_us, cp)


def run_point(spec: PointSpec, pool: RankPool, *, timeout_s: float) -> list[ImplResult]:
    """Run one point on a warm pool. A rank that raises, dies or hangs yields
    ``error``/``timeout`` results (the pool is then closed); never raises for
    what happens on the ranks."""
    if pool.world_size != spec.cp_size:
        raise ValueError(f"pool has {pool.world_size} ranks, cp_size={spec.cp_size}")
    plan = spec.plan()
    results = pool.run(point_on_rank, spec, pool.backend, timeout_s=timeout_s)
    if not all(r.ok for r in results):
        status, reason = summarize_failure(results)
        return [ImplResult(name, status, reason=reason) for name in spec.impls]
    return fold_reports(spec, plan, [r.value for r in results])
