"""One matrix point on real ranks: correctness first, then timings, then the fold.

:func:`point_on_rank` runs inside every rank (a :class:`~.ranks.RankPool`
task, or a torchrun process); :func:`run_point` sends it to a pool and folds
the ranks' reports into one :class:`~.fold.ImplResult` per implementation.
Nothing here knows about Hydra or CSV files.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist

from . import impls as impl_registry
from .checks import ImplReport, check_dispatch, check_full, check_passthrough, checked_group
from .fold import ImplResult, fold_reports, origin_of
from .modes import ScatterMode
from .moe import ReferenceMoE
from .ranks import RankPool, RankResult, rank_device, summarize_failure
from .spec import DTYPES, FAULTS, PointSpec, bitwise_equal, make_shard, shard_seed  # noqa: F401 - re-exported
from .steps import CONTROL, control_steps, dispatch_steps, full_steps
from .timing import CacheFlusher, Clock, timed_loop

# The correctness group's own timeout: a collective one rank skipped fails
# there (or the pool's point timeout ends the point first).
CHECK_TIMEOUT_S = 60.0


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


def reference_moe(spec: PointSpec, device: torch.device) -> ReferenceMoE:
    """The point's reference MoE: built once per point (its weights are the
    largest thing a rank generates), the same on every rank."""
    return ReferenceMoE(
        spec.hidden_size, num_experts=spec.experts, topk=spec.topk, seed=spec.seed, dtype=DTYPES[spec.dtype],
        device=device,
    )


def check_point(
    spec: PointSpec, backend: str, device: torch.device, group, moe: ReferenceMoE | None = None
) -> dict[str, ImplReport]:
    """The correctness phase on this rank: every implementation's checks
    (``moe``: the point's :func:`reference_moe`, built here when not given)."""
    rank = dist.get_rank()
    plan = spec.plan()
    mode = ScatterMode(spec.mode)
    # Every rank's rows, generated once; each implementation gets its own copy
    # of this rank's, so one that writes into its input cannot fail the next.
    shards = [make_shard(spec, plan, r, device) for r in range(plan.cp_size)]
    moe = moe or reference_moe(spec, device)
    _inject(spec, rank)
    reports: dict[str, ImplReport] = {}
    for name in spec.impls:
        impl = impl_registry.get(name)
        local = shards[rank].clone()
        reason = impl_registry.skip_reason(impl, backend)
        if reason:
            reports[name] = ImplReport(status="skipped", reason=reason)
        elif impl.mode == "SCATTERED":
            if mode is not ScatterMode.SCATTERED:
                reports[name] = ImplReport(
                    status="skipped",
                    reason=f"impl={name} is a MoE all-to-all (SCATTERED mode, moe_a2a_backend=deepep), not {mode.value}",
                )
            else:
                reports[name] = check_dispatch(impl, spec, plan, rank, device, local, moe, group, shards)
        elif mode is ScatterMode.SCATTERED:
            reports[name] = check_passthrough(spec, plan, rank, device, local, shards)
        else:
            reports[name] = check_full(impl, spec, plan, rank, device, local, moe, group, shards)
    return reports


def point_on_rank(spec: PointSpec, backend: str) -> dict[str, dict[str, Any]]:
    """Runs on every rank: checks (on the correctness group), then timings of
    the implementations that passed on every rank (on the plain group).

    All ranks receive the same spec, hence the same plan, so they take the
    same branches and issue the same collectives."""
    device = rank_device()
    group = checked_group(CHECK_TIMEOUT_S)
    moe = reference_moe(spec, device)
    reports = check_point(spec, backend, device, group, moe)
    # Agree on what to time: an implementation that failed on one rank is
    # timed on none, or the others would wait forever.
    names = list(reports)
    failed = torch.tensor([float(bool(reports[n].failures)) for n in names], device=device)
    # On the correctness group: a rank that skipped one of the checks'
    # collectives meets its peers' collective here, and the group's
    # consistency check turns the would-be hang into an error on every rank.
    dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=group)
    plan = spec.plan()
    rank = dist.get_rank()
    steps = []
    for name, bad in zip(names, failed.tolist()):
        rep = reports[name]
        if rep.status or bad:
            continue
        impl = impl_registry.get(name)
        if impl.mode == "SCATTERED":
            steps.append(dispatch_steps(impl, spec, plan, rank, device, moe, None))
        else:
            steps.append(full_steps(impl, spec, plan, rank, device, None))
    out: dict[str, dict[str, Any]] = {}
    if steps:
        steps.append(control_steps(spec, plan, rank, device))
        flush = CacheFlusher(device) if spec.flush_l2 else None
        samples = timed_loop(steps, warmup=spec.warmup, iters=spec.iters, clock=Clock(device), flush=flush)
        out[CONTROL] = {"samples": samples.pop(CONTROL)}
        for name, phases in samples.items():
            reports[name].samples = phases
    return {**{name: asdict(rep) for name, rep in reports.items()}, **out}


# The correctness group's consistency check, as each rank reports itself.
_MISMATCH = "Detected mismatch between collectives on ranks"
_OWN_FINGERPRINT = re.compile(
    r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=\d+, OpType=(\w+)"
)


def _mismatch(results: list[RankResult]) -> str:
    """The ranks' collectives when the correctness group found they differ,
    naming the ranks that never entered the collective most ranks are in
    (with a tie, every rank and its collective), else ''."""
    ops: dict[int, str] = {}
    for r in results:
        m = _OWN_FINGERPRINT.search(r.error) if _MISMATCH in r.error else None
        if m:
            ops[int(m.group(1))] = m.group(2)
    if not ops:
        return ""
    by_op: dict[str, list[int]] = {}
    for rank, op in sorted(ops.items()):
        by_op.setdefault(op, []).append(rank)
    where = "; ".join(f"rank {','.join(map(str, rs))} in {op}" for op, rs in by_op.items())
    counts = sorted((len(rs) for rs in by_op.values()), reverse=True)
    if len(counts) > 1 and counts[0] > counts[1]:
        common = max(by_op, key=lambda op: len(by_op[op]))
        never = [rank for rank, op in sorted(ops.items()) if op != common]
        head = f"rank {','.join(map(str, never))} never entered {common}"
    else:
        head = "ranks issued different collectives"
    return f"{head} ({where}): a decision taken from local state, not the shared plan"


def failed_run(spec: PointSpec, results: list[RankResult]) -> list[ImplResult]:
    """Rows for a point whose ranks raised, died or hung. Ranks that answered
    while others timed out skipped a collective their peers wait in; ranks
    the correctness group found in different collectives skipped one too."""
    status, reason = summarize_failure(results)
    check = ""
    done = [r.rank for r in results if r.ok]
    stuck = [r.rank for r in results if r.status == "timeout"]
    mismatch = _mismatch(results)
    if mismatch:
        check = "collective_skipped"
        # Each rank's text repeats the fingerprints just summarised.
        reason = f"{mismatch}; {reason.split(_MISMATCH)[0]}{_MISMATCH}"
    elif done and stuck:
        check = "collective_skipped"
        reason = (
            f"rank {','.join(map(str, stuck))} still waiting in a collective that rank "
            f"{','.join(map(str, done))} never entered (they returned); {reason}"
        )
    return [ImplResult(name, status, reason=reason, failed_check=check, origin=origin_of(name)) for name in spec.impls]


def run_point(spec: PointSpec, pool: RankPool, *, timeout_s: float) -> list[ImplResult]:
    """Run one point on a warm pool. A rank that raises, dies or hangs yields
    ``error``/``timeout`` results (the pool is then closed); never raises for
    what happens on the ranks."""
    if pool.world_size != spec.cp_size:
        raise ValueError(f"pool has {pool.world_size} ranks, cp_size={spec.cp_size}")
    plan = spec.plan()
    results = pool.run(point_on_rank, spec, pool.backend, timeout_s=timeout_s)
    if not all(r.ok for r in results):
        return failed_run(spec, results)
    return fold_reports(spec, plan, [r.value for r in results])
