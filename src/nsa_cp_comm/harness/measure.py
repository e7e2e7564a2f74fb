"""One matrix point on real ranks: correctness first, then timings, then the fold.

:func:`point_on_rank` runs inside every rank (a :class:`~.ranks.RankPool`
task, or a torchrun process); :func:`run_point` sends it to a pool and folds
the ranks' reports into one :class:`~.fold.ImplResult` per implementation.
Nothing here knows about Hydra or CSV files.
"""

from __future__ import annotations

import re
from dataclasses import asdict, replace
from typing import Any

import torch
import torch.distributed as dist

from .. import impls as impl_registry
from .checks import (
    ImplReport,
    check_dispatch,
    check_full,
    check_light,
    check_passthrough,
    checked_group,
)
from .cpgroup import cp_group, group_rank_of
from .fold import ImplResult, fold_reports, origin_of
from ..modes import ScatterMode
from ..moe import ReferenceMoE
from .rank_result import RankResult, summarize_failure
from .rank_state import begin_point
from .ranks import RankPool, rank_device
from ..roundtrip import LEGACY_UNEVEN_ERROR
from .spec import DTYPES, PointSpec, make_shard
from .steps import CONTROL, control_steps, dispatch_steps, full_steps
from .timing import CacheFlusher, Clock, timed_loop

# The correctness group's own timeout: a collective one rank skipped fails
# there (or the pool's point timeout ends the point first).
CHECK_TIMEOUT_S = 60.0


# How much a point checks before it is timed (run_point's ``checks``).
CHECKS: tuple[str, ...] = ("full", "light")


def reference_moe(spec: PointSpec, device: torch.device) -> ReferenceMoE:
    """The point's reference MoE: built once per point (its weights are the
    largest thing a rank generates), the same on every rank."""
    return ReferenceMoE(
        spec.hidden_size, num_experts=spec.experts, topk=spec.topk, seed=spec.seed, dtype=DTYPES[spec.dtype],
        device=device,
    )


def check_point(
    spec: PointSpec, backend: str, device: torch.device, group, moe: ReferenceMoE | None = None,
    *, checks: str = "full", shards: list[torch.Tensor] | None = None,
) -> dict[str, ImplReport]:
    """The correctness phase on this rank: every implementation's checks
    (``moe``: the point's :func:`reference_moe`, built here when not given;
    none with ``checks="light"``, FULL mode only: :func:`.checks.check_light`;
    ``shards``: every rank's rows, generated here when not given)."""
    rank = dist.get_rank(group)  # the CP group's rank, not the world's
    plan = spec.plan()
    mode = ScatterMode(spec.mode)
    # Every rank's rows, generated once; each implementation gets its own copy
    # of this rank's, so one that writes into its input cannot fail the next.
    if shards is None:
        shards = [make_shard(spec, plan, r, device) for r in range(plan.cp_size)]
    light = checks == "light"
    if light and mode is not ScatterMode.FULL:
        raise ValueError(f"checks='light' covers mode FULL only, not mode={spec.mode}")
    if not light:
        moe = moe or reference_moe(spec, device)
    reports: dict[str, ImplReport] = {}
    for name in spec.impls:
        impl = impl_registry.get(name)
        local = shards[rank].clone()
        reason = impl_registry.skip_reason(impl, backend, plan)
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
        elif light:
            reports[name] = check_light(impl, spec, plan, rank, device, local, group, shards)
        else:
            reports[name] = check_full(impl, spec, plan, rank, device, local, moe, group, shards)
    return reports


def point_on_rank(spec: PointSpec, backend: str, checks: str = "full",
                  verify: bool = True) -> dict[str, dict[str, Any]]:
    """Runs on every rank: checks (on the correctness group), then timings of
    the implementations that passed on every rank (on the plain group), every
    timed iteration's outputs checked (:mod:`.verify`; ``verify=False`` only
    to measure what that costs); ``checks``: see :func:`run_point`.

    All ranks receive the same spec, hence the same plan, so they take the
    same branches and issue the same collectives."""
    begin_point(spec.seed, group_rank_of(dist.get_rank(), spec.cp_size, spec.bystanders))
    device = rank_device()
    group = checked_group(CHECK_TIMEOUT_S, spec.bystanders)
    plain = cp_group(spec.cp_size, bystanders=spec.bystanders, checked=False)
    if group is None:
        return {}  # a bystander: in the world, not in the CP group
    light = checks == "light"
    moe = None if light else reference_moe(spec, device)
    plan = spec.plan()
    shards = [make_shard(spec, plan, r, device) for r in range(plan.cp_size)]
    reports = check_point(spec, backend, device, group, moe, checks=checks, shards=shards)
    # Agree on what to time: an implementation that failed on one rank is
    # timed on none, or the others would wait forever.
    names = list(reports)
    failed = torch.tensor([float(bool(reports[n].failures)) for n in names], device=device)
    # On the correctness group: a rank that skipped one of the checks'
    # collectives meets its peers' collective here, and the group's
    # consistency check turns the would-be hang into an error on every rank.
    dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=group)
    rank = dist.get_rank(plain)
    steps = []
    for name, bad in zip(names, failed.tolist()):
        rep = reports[name]
        if rep.status or bad:
            continue
        impl = impl_registry.get(name)
        if impl.mode == "SCATTERED":
            steps.append(dispatch_steps(impl, spec, plan, rank, device, moe, plain))
        else:
            steps.append(full_steps(impl, spec, plan, rank, device, plain, shards, verify=verify))
    out: dict[str, dict[str, Any]] = {}
    if steps:
        if not light:
            steps.append(control_steps(spec, plan, rank, device, plain))
        flush = CacheFlusher(device) if spec.flush_l2 else None
        samples = timed_loop(steps, warmup=spec.warmup, iters=spec.iters, clock=Clock(device), group=plain,
                             flush=flush)
        if CONTROL in samples:
            out[CONTROL] = {"samples": samples.pop(CONTROL)}
        for name, phases in samples.items():
            reports[name].samples = phases
        for s in steps:
            check = getattr(s, "timed_check", None)
            if check is not None:
                reports[s.name].verify_s = check.seconds
                wrong = check.reason(spec.warmup + spec.iters)
                if wrong:
                    reports[s.name].fail("production_form", wrong)
                    reports[s.name].correct = False
    return {**{name: asdict(rep) for name, rep in reports.items()}, **out}


# The correctness group's consistency check, as each rank reports itself (its
# text holds its own fingerprint and one peer's).
_MISMATCH = "Detected mismatch between collectives on ranks"
_FINGERPRINT = re.compile(
    r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=\d+, OpType=(\w+)"
    r"(?:, TensorShape=\[(.*?)\], TensorDtypes=([^,]+), TensorDeviceTypes=TensorOptions\(.*?device=(\w+))?"
)
# What a collective whose ranks pass different sizes does when nothing compares
# them first (each rank checks only its own sizes), as seen on gloo here and
# by torch's NCCL size checks.
_MISMATCHED_COUNTS = "ranks whose sizes agree with themselves but not with their peers' exchange mismatched counts: " \
    "a hang or wrong rows"
_UNCHECKED = {
    "gather": (
        "without the consistency check: on gloo a rank whose output is not world_size x its input raises 'invalid "
        "tensor size' while its peers wait in the all-gather forever; on NCCL such a rank raises torch's "
        f"'{LEGACY_UNEVEN_ERROR}' while its peers hang, and {_MISMATCHED_COUNTS}"
    ),
    "scatter": (
        "without the consistency check: on gloo a rank aborts its process (SIGABRT, 'Received data size doesn't "
        "match expected size') and its peers fail with a connection reset; on NCCL a rank whose input is not "
        f"world_size x its output raises torch's size error while its peers hang, and {_MISMATCHED_COUNTS}"
    ),
    "other": (
        "without the consistency check: on gloo a rank aborts its process (SIGABRT) or waits forever; on NCCL "
        f"{_MISMATCHED_COUNTS}"
    ),
}


def _fingerprints(results: list[RankResult]) -> dict[int, tuple[str, str, str, str]]:
    """``{rank: (op, shape, dtype, device)}`` of every rank some rank's
    consistency-check text names."""
    seen: dict[int, tuple[str, str, str, str]] = {}
    for r in results:
        if _MISMATCH in r.error:
            for m in _FINGERPRINT.finditer(r.error):
                fp = (m.group(2), m.group(3) or "", (m.group(4) or "").strip(), m.group(5) or "")
                seen.setdefault(int(m.group(1)), fp)
    return seen


def _mismatch(results: list[RankResult]) -> tuple[str, str]:
    """``(failed_check, reason)`` when the correctness group found the ranks'
    collectives differ, else ``("", "")``. The same collective with other
    shapes, dtypes or devices is ``collective_shapes``, naming each rank's;
    different collectives are ``collective_skipped``, naming the ranks that
    never entered the collective most ranks are in (with a tie, every rank
    and its collective)."""
    prints = _fingerprints(results)
    if not prints:
        return "", ""
    ops = {rank: fp[0] for rank, fp in sorted(prints.items())}
    if len(set(ops.values())) == 1:
        op = next(iter(ops.values()))
        differ = [what for i, what in ((1, "shapes"), (2, "dtypes"), (3, "devices"))
                  if len({fp[i] for fp in prints.values()}) > 1] or ["shapes"]
        each = "; ".join(
            f"rank {rank} [{fp[1]}] {fp[2]} on {fp[3]}" if fp[1] else f"rank {rank}" for rank, fp in sorted(prints.items())
        )
        kind = "gather" if "ALLGATHER" in op else "scatter" if "REDUCE_SCATTER" in op else "other"
        return "collective_shapes", (
            f"every rank issued the same collective ({op}) with different {' and '.join(differ)}: {each}; "
            f"{_UNCHECKED[kind]}"
        )
    by_op: dict[str, list[int]] = {}
    for rank, op in ops.items():
        by_op.setdefault(op, []).append(rank)
    where = "; ".join(f"rank {','.join(map(str, rs))} in {op}" for op, rs in by_op.items())
    counts = sorted((len(rs) for rs in by_op.values()), reverse=True)
    if len(counts) > 1 and counts[0] > counts[1]:
        common = max(by_op, key=lambda op: len(by_op[op]))
        never = [rank for rank, op in ops.items() if op != common]
        head = f"rank {','.join(map(str, never))} never entered {common}"
    else:
        head = "ranks issued different collectives"
    return "collective_skipped", f"{head} ({where}): a decision taken from local state, not the shared plan"


def failed_run(spec: PointSpec, results: list[RankResult]) -> list[ImplResult]:
    """Rows for a point whose ranks raised, died or hung. Ranks that answered
    while others timed out skipped a collective their peers wait in; ranks
    the correctness group found in different collectives skipped one too."""
    # The failure itself names processes (world ranks); the diagnoses name
    # ranks as the CP group numbers them, as its fingerprints do.
    status, reason = summarize_failure(results)
    ours = {r.rank: group_rank_of(r.rank, spec.cp_size, spec.bystanders) for r in results}
    cp_results = sorted((replace(r, rank=ours[r.rank]) for r in results if ours[r.rank] is not None),
                        key=lambda r: r.rank)
    check = ""
    done = [r.rank for r in cp_results if r.ok]
    stuck = [r.rank for r in cp_results if r.status == "timeout"]
    mismatch_check, mismatch = _mismatch(cp_results)
    if spec.bystanders and stuck and not done and all(r.ok for r in results if ours[r.rank] is None):
        check = "group"
        reason = (
            f"every CP rank still waiting in a collective that only the {spec.bystanders} bystander rank(s), in the "
            f"world but outside the CP group, could complete: a collective on the default group; {reason}"
        )
    elif mismatch:
        check = mismatch_check
        # Each rank's text repeats the fingerprints just summarised.
        reason = f"{mismatch}; {reason.split(_MISMATCH)[0]}{_MISMATCH}"
    elif done and stuck:
        check = "collective_skipped"
        reason = (
            f"rank {','.join(map(str, stuck))} still waiting in a collective that rank "
            f"{','.join(map(str, done))} never entered (they returned); {reason}"
        )
    return [ImplResult(name, status, reason=reason, failed_check=check, origin=origin_of(name)) for name in spec.impls]


def run_point(spec: PointSpec, pool: RankPool, *, timeout_s: float, checks: str = "full",
              verify: bool = True) -> list[ImplResult]:
    """Run one point on a warm pool. A rank that raises, dies or hangs yields
    ``error``/``timeout`` results (the pool is then closed); never raises for
    what happens on the ranks.

    ``checks="full"`` (the matrix's): every check of :mod:`.checks`, then the
    timed loop with the A/A control, every iteration's outputs checked
    (``production_form``). ``checks="light"`` (FULL mode only; the
    benchmark's production shapes): the layout, rows, padding, chunk, refusal
    and group checks byte-exact, and every timed iteration's, but no
    reference MoE (``reference_moe``, ``even_bitwise``) and no A/A control,
    so that a point holds only
    its implementations' buffers: rows of a failed check are ``failed`` as
    with full checks, and ``samples`` has no ``control``."""
    if checks not in CHECKS:
        raise ValueError(f"checks={checks!r} is not one of {', '.join(CHECKS)}")
    if checks == "light" and spec.mode != ScatterMode.FULL.value:
        raise ValueError(f"checks='light' covers mode FULL only, not mode={spec.mode}")
    if pool.world_size != spec.world_size:
        raise ValueError(f"pool has {pool.world_size} ranks, cp_size={spec.cp_size} + bystanders={spec.bystanders}")
    plan = spec.plan()
    results = pool.run(point_on_rank, spec, pool.backend, checks, verify, timeout_s=timeout_s)
    if not all(r.ok for r in results):
        return failed_run(spec, results)
    # In the CP group's rank order, bystanders left out.
    by_group = {group_rank_of(r.rank, spec.cp_size, spec.bystanders): r.value for r in results}
    return fold_reports(spec, plan, [by_group[r] for r in range(spec.cp_size)])
