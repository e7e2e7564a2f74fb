"""Rank-side tasks of ``bench_comm.py``: correctness first, then the one timed loop.

A module of its own because the ranks of a :class:`nsa_cp_comm.harness.ranks.RankPool`
must import a task by name (a function of ``__main__`` does not pickle to them).
Every task runs on every rank and times nothing by itself: the checks are the
matrix's (``nsa_cp_comm.harness.measure`` / ``nsa_cp_comm.harness.checks``) and the timings go
through :func:`nsa_cp_comm.harness.timing.timed_loop` over the production forms of
:mod:`nsa_cp_comm.harness.steps` (pre-sized, reused buffers; the padded path's local
work a phase of its own). The driver folds the ranks' reports with
:func:`nsa_cp_comm.harness.fold.fold_reports` (slowest rank per iteration).

``fault`` (tests only) breaks the padded implementation inside the rank
processes for the duration of one task, so a test can prove that the
benchmark's correctness phase catches a wrong padded path and exits 1, and
that its ratio gate catches a slow one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from typing import Any

import torch
import torch.distributed as dist

from nsa_cp_comm import impls as impl_registry
from nsa_cp_comm import roundtrip
from nsa_cp_comm.harness.checks import ImplReport, check_gather, checked_group
from nsa_cp_comm.harness.cpgroup import cp_group
from nsa_cp_comm.harness.measure import CHECK_TIMEOUT_S, check_point, point_on_rank
from nsa_cp_comm.harness.ranks import rank_device
from nsa_cp_comm.roundtrip import padded_gather, padded_scatter
from nsa_cp_comm.harness.spec import PointSpec, bitwise_equal, make_shard
from nsa_cp_comm.harness.steps import full_steps
from nsa_cp_comm.harness.timing import CacheFlusher, Clock, timed_loop

# The implementation timed a second time as the A/A control of the even-plan
# ratio: two identical paths in the same loop show what the machine's noise
# alone does to a paired ratio.
CONTROL_OF = "legacy"
CONTROL = "control"

# How the padded path can be broken for a test, and what a correct benchmark
# must then report: a failed check (exit 1) or, for ``slow_local``, a ratio
# above the gate (exit 1 when the gate is on).
FAULTS: tuple[str, ...] = ("none", "wrong_offset", "nonzero_pad", "wrong_chunk", "slow_local", "raise_rank")
# Faults of the ranks rather than of the padded path: the matrix's own
# (``PointSpec.fault``), which the correctness phase fires on the last rank.
SPEC_FAULTS = {"raise_rank": "raise"}
SLOW_LOCAL_S = 0.25


def _gather_wrong_offset(local, plan, group=None, *, check=True):
    # Every block one row late: a slot computed off by one.
    return padded_gather(local, plan, group, check=check).roll(1, dims=0)


def _gather_nonzero_pad(local, plan, group=None, *, check=True):
    full = padded_gather(local, plan, group, check=check)
    m = plan.max_rank_len
    for r, n in enumerate(plan.per_rank_tokens):
        full[r * m + n : (r + 1) * m] = 1
    return full


def _scatter_wrong_chunk(full, plan, group=None, *, check=True):
    # Reduce-scatter as usual, then hand back the neighbour's chunk.
    rank, cp = dist.get_rank(group), plan.cp_size
    padded_scatter(full, plan, group, check=check)
    return full.contiguous().tensor_split(cp)[(rank + 1) % cp][: plan.per_rank_tokens[rank]]


@contextlib.contextmanager
def injected(fault: str) -> Iterator[None]:
    """Break the padded implementation (or its timed local work) in this
    process while the block runs; restore it afterwards (the ranks stay warm
    for the next task)."""
    if fault not in FAULTS:
        raise ValueError(f"fault={fault!r} is not one of {', '.join(FAULTS)}")
    if fault == "none" or fault in SPEC_FAULTS:
        yield
        return
    saved_impl = impl_registry.REGISTRY["padded"]
    saved_stage = roundtrip.padded_stage
    if fault == "wrong_offset":
        impl_registry.REGISTRY["padded"] = replace(saved_impl, gather=_gather_wrong_offset)
    elif fault == "nonzero_pad":
        impl_registry.REGISTRY["padded"] = replace(saved_impl, gather=_gather_nonzero_pad)
    elif fault == "wrong_chunk":
        impl_registry.REGISTRY["padded"] = replace(saved_impl, scatter=_scatter_wrong_chunk)
    else:  # slow_local: right results, a slow staging copy (the timed loop's padded form calls it too)

        def slow_stage(*args, **kwargs):
            time.sleep(SLOW_LOCAL_S)
            return saved_stage(*args, **kwargs)

        roundtrip.padded_stage = slow_stage
    try:
        yield
    finally:
        impl_registry.REGISTRY["padded"] = saved_impl
        roundtrip.padded_stage = saved_stage


def _agreed_failures(reports: dict[str, ImplReport], device, group) -> list[bool]:
    """Per implementation, whether it failed or did not run on any rank: what
    one rank skips timing, every rank must skip (or the others wait forever).
    On the correctness group, so that a rank which skipped one of the checks'
    collectives meets an error here, not a hang."""
    names = list(reports)
    bad = torch.tensor([float(bool(reports[n].failures or reports[n].status)) for n in names], device=device)
    dist.all_reduce(bad, op=dist.ReduceOp.MAX, group=group)
    return [bool(b) for b in bad.tolist()]


def point_task(spec: PointSpec, backend: str, fault: str = "none") -> dict[str, dict[str, Any]]:
    """The matrix's own point on this rank (checks, then the timed loop)."""
    with injected(fault):
        return point_on_rank(spec, backend)


def paired_task(spec: PointSpec, backend: str, fault: str = "none") -> dict[str, Any]:
    """The matrix's checks of every implementation of ``spec``, then one timed
    loop over all of them plus an A/A control (:data:`CONTROL_OF` timed again
    under the name :data:`CONTROL`), so the driver can form per-iteration
    paired ratios. Returns ``{"reports": {impl: ImplReport as dict},
    "control": {phase: [us]}}``."""
    device = rank_device()
    with injected(fault):
        group = checked_group(CHECK_TIMEOUT_S)
        plain = cp_group(spec.cp_size, checked=False)
        reports = check_point(spec, backend, device, group)
        bad = _agreed_failures(reports, device, group)
        control: dict[str, list[float]] = {}
        if not any(bad):
            plan, rank = spec.plan(), dist.get_rank(plain)
            steps = [full_steps(impl_registry.get(n), spec, plan, rank, device, plain) for n in reports]
            steps.append(replace(full_steps(impl_registry.get(CONTROL_OF), spec, plan, rank, device, plain),
                                 name=CONTROL))
            flush = CacheFlusher(device) if spec.flush_l2 else None
            samples = timed_loop(steps, warmup=spec.warmup, iters=spec.iters, clock=Clock(device), group=plain,
                                 flush=flush)
            for name in reports:
                reports[name].samples = samples[name]
            control = samples[CONTROL]
    return {"reports": {n: asdict(r) for n, r in reports.items()}, "control": control}


def _light_check(impl, spec: PointSpec, plan, rank: int, device, local: torch.Tensor, group) -> ImplReport:
    """The gather's layout, rows and zero padding, and the scatter's chunk,
    byte-exact: the matrix's checks without the reference MoE, whose float64
    routing of the whole gathered buffer on every rank does not fit 8 ranks of
    a production-shape point in a small machine's memory."""
    rep = ImplReport()
    full = impl.gather(local, plan, group)
    if not check_gather(impl, full, spec, plan, device, rep):
        full = torch.zeros((impl.buffer_rows(plan), spec.hidden_size), dtype=local.dtype, device=device)
    probe = full.clone() if rank == 0 else torch.zeros_like(full)
    out = impl.scatter(probe, plan, group)
    if not (isinstance(out, torch.Tensor) and bitwise_equal(out, local)):
        rep.fail("scatter_chunk", "scattering rank 0's copy of the gathered buffer did not return this rank's rows")
    rep.correct = not rep.failures
    return rep


def production_task(spec: PointSpec, backend: str, fault: str = "none") -> dict[str, Any]:
    """A production-shape point: light checks of every implementation of
    ``spec`` (:func:`_light_check`), then one timed loop over those that
    passed everywhere. Returns ``{"reports": {impl: ImplReport as dict}}``."""
    device = rank_device()
    plan = spec.plan()
    with injected(fault):
        group = checked_group(CHECK_TIMEOUT_S)
        plain = cp_group(spec.cp_size, checked=False)
        rank = dist.get_rank(group)
        if spec.fault == "raise" and rank == spec.cp_size - 1:
            raise RuntimeError(f"injected fault on rank {rank}")
        local = make_shard(spec, plan, rank, device)
        reports = {n: _light_check(impl_registry.get(n), spec, plan, rank, device, local, group) for n in spec.impls}
        bad = _agreed_failures(reports, device, group)
        steps = [full_steps(impl_registry.get(n), spec, plan, rank, device, plain)
                 for n, b in zip(reports, bad) if not b]
        if steps:
            flush = CacheFlusher(device) if spec.flush_l2 else None
            samples = timed_loop(steps, warmup=spec.warmup, iters=spec.iters, clock=Clock(device), group=plain,
                                 flush=flush)
            for name, phases in samples.items():
                reports[name].samples = phases
    return {"reports": {n: asdict(r) for n, r in reports.items()}}
