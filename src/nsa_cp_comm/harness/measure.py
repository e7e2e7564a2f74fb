"""One matrix point on real ranks: correctness first, then timings.

:func:`point_on_rank` runs inside every rank (a :class:`~.ranks.RankPool`
task, or a torchrun process); :func:`.on_pool.run_point` (also importable
from here) sends it to a pool and folds the ranks' reports into one
:class:`~.fold.ImplResult` per implementation. Nothing here knows about
Hydra or CSV files.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist

from .. import engines
from .. import impls as impl_registry
from ..agree import agreed
from ..hooks import skip_reason
from ..protocol import RoundTripImpl
from .checks import (
    ImplReport,
    check_dispatch,
    check_full,
    check_light,
    check_passthrough,
    checked_group,
    shard_input,
)
from .blame import AT_AGREEMENT, AT_CHECKS, AT_PREPARE, AT_SETUP, announce_place, announce_turns
from .cpgroup import GROUP_RANK_KEY, cp_group, group_rank_of
from .machine import load_factor
from ..modes import ScatterMode
from ..moe import ReferenceMoE
from .rank_state import STATE_KEY, Watch, begin_point
from .phases import PHASES_KEY, PhaseClock
from .rank_body import rank_device
from .spec import DTYPES, PointSpec, make_shard
from .calibrate import CALIBRATION, Calibrator, is_auto
from .steps import CONTROL, control_steps, dispatch_steps, full_steps
from .timing import CacheFlusher, Clock, timed_loop
from .on_pool import CHECKS, run_point  # noqa: F401 - the names' old home, kept

# The correctness group's own timeout: a collective one rank skipped fails
# there (or the pool's point timeout ends the point first).
CHECK_TIMEOUT_S = 60.0


def reference_moe(spec: PointSpec, device: torch.device) -> ReferenceMoE:
    """The point's reference MoE: built once per point (its weights are the
    largest thing a rank generates), the same on every rank."""
    return ReferenceMoE(
        spec.hidden_size, num_experts=spec.experts, topk=spec.topk, seed=spec.seed, dtype=DTYPES[spec.dtype],
        device=device, shared_expert=spec.shared_expert, logits_dtype=logits_dtype(spec), moe_quant=spec.moe_quant,
    )


def logits_dtype(spec: PointSpec) -> torch.dtype | None:
    """The dtype the point's engine gathers the router logits in (a side tensor), None where it gathers none."""
    rule = engines.get(spec.engine, spec.engine_model, spec.moe_quant)
    side = next((t for t in rule.side_tensors if t.name == "router_logits"), None)
    if side is None:
        return None
    return torch.float32 if side.itemsize == 4 else DTYPES[spec.dtype]


def check_point(
    spec: PointSpec, backend: str, device: torch.device, group, moe: ReferenceMoE | None = None,
    *, checks: str = "full", shards: list[torch.Tensor] | None = None, watch: Watch | None = None,
) -> dict[str, ImplReport]:
    """The correctness phase on this rank: every implementation's checks
    (``moe``: the point's :func:`reference_moe`, built here when not given;
    none with ``checks="light"``, FULL mode only: :func:`.checks.check_light`;
    ``shards``: every rank's rows, generated here when not given; ``watch``:
    told after each implementation's checks)."""
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
    # One agreement on the plan, width, dtype and device for every checked
    # round trip of the point (each would otherwise exchange its own, a
    # collective on the consistency-checked group); SCATTERED mode has none.
    scope = (agreed(plan, spec.hidden_size, DTYPES[spec.dtype], device, group) if mode is ScatterMode.FULL
             else contextlib.nullcontext())
    with scope:
        for i, name in enumerate(spec.impls):
            announce_place((AT_CHECKS, i), name)
            impl = impl_registry.get(name)
            # its own copy; a padded-shard implementation gets the split's [P, H]
            local = shard_input(impl, plan, shards[rank], spec) if impl.mode == "FULL" else shards[rank].clone()
            reason = skip_reason(impl, backend, plan)
            if reason:
                reports[name] = ImplReport(status="skipped", reason=reason)
            elif impl.mode == "SCATTERED":
                if mode is not ScatterMode.SCATTERED:
                    reports[name] = ImplReport(
                        status="skipped",
                        reason=f"impl={name} is a MoE all-to-all (SCATTERED mode, moe_a2a_backend=deepep), "
                               f"not {mode.value}",
                    )
                else:
                    reports[name] = check_dispatch(impl, spec, plan, rank, local, moe, group, shards)
            elif mode is ScatterMode.SCATTERED:
                reports[name] = check_passthrough(plan, rank, local, shards)
            elif light:
                reports[name] = check_light(impl, spec, plan, rank, device, local, group, shards)
            else:
                reports[name] = check_full(impl, spec, plan, rank, device, local, moe, group, shards)
            if isinstance(impl, RoundTripImpl) and not reports[name].status:
                reports[name].stride = impl.stride(plan)  # what the rows' buffer columns must describe
            if watch is not None:
                watch.after(name, "its checks")
    return reports


@functools.lru_cache(maxsize=1)
def check_bound() -> float:
    """How long the checks' collectives wait: :data:`CHECK_TIMEOUT_S` idle,
    longer on a loaded machine (as a rank's start is given longer). Read once
    per rank process: its groups are made once, by every rank, with it (a
    bound that changed between points would make a rank ask for a new group,
    a collective its peers do not enter)."""
    return CHECK_TIMEOUT_S * load_factor()[0]


def point_on_rank(spec: PointSpec, backend: str, checks: str = "full",
                  verify: bool = True) -> dict[str, dict[str, Any]]:
    """Runs on every rank: checks (on the correctness group), then timings of
    the implementations that passed on every rank (on the plain group), every
    timed iteration's outputs checked (:mod:`.verify`; ``verify=False`` only
    to measure what that costs); ``checks``: see :func:`run_point`.

    All ranks receive the same spec, hence the same plan, so they take the
    same branches and issue the same collectives."""
    clock = PhaseClock()
    clock.lap("setup")
    announce_place((AT_SETUP,))
    begin_point(spec.seed, group_rank_of(dist.get_rank(), spec.cp_size, spec.bystanders))
    device = rank_device()
    bound = check_bound()
    group = checked_group(bound, spec.bystanders)
    plain = cp_group(spec.cp_size, bystanders=spec.bystanders, checked=False)
    fence = cp_group(spec.cp_size, bystanders=spec.bystanders, checked=False, timeout_s=bound)
    if group is None:
        return {}  # a bystander: in the world, not in the CP group
    light = checks == "light"
    moe = None if light else reference_moe(spec, device)
    plan = spec.plan()
    shards = [make_shard(spec, plan, r, device) for r in range(plan.cp_size)]
    clock.watch(group, plain, fence)
    clock.lap("checks")
    watch = Watch(outside={name for name in spec.impls if impl_registry.get(name).origin})
    reports = check_point(spec, backend, device, group, moe, checks=checks, shards=shards, watch=watch)
    # Agree on what to time: an implementation that failed on one rank is
    # timed on none, or the others would wait forever.
    names = list(reports)
    announce_place((AT_AGREEMENT,))
    clock.lap("agreement")
    failed = torch.tensor([float(bool(reports[n].failures)) for n in names], device=device)
    # On the correctness group: a rank that skipped one of the checks'
    # collectives meets its peers' collective here, and the group's
    # consistency check turns the would-be hang into an error on every rank.
    dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=group)
    rank = dist.get_rank(plain)
    clock.lap("prepare")
    steps = []
    for name, bad in zip(names, failed.tolist()):
        if reports[name].status or bad:
            continue
        impl = impl_registry.get(name)
        announce_place((AT_PREPARE, names.index(name)), name)
        if impl.mode == "SCATTERED":
            steps.append(dispatch_steps(impl, spec, plan, rank, device, moe, plain, shards, verify=verify))
        else:
            steps.append(full_steps(impl, spec, plan, rank, device, plain, shards, verify=verify))
        watch.after(name, "building its timed form")
    for s in steps:
        s.check = _watched(s.check, watch, s.name, s.phases[-1][0])
    out: dict[str, dict[str, Any]] = {}
    if steps:
        if not light:
            steps.append(control_steps(spec, plan, rank, device, plain))
        flush = CacheFlusher(device) if spec.flush_l2 else None
        announce_turns(steps, spec.warmup)
        clock.lap("timed loop")
        calib = (Calibrator(control=None if light else CONTROL, group=plain, device=device)
                 if is_auto(spec.iters) else None)
        samples = timed_loop(steps, warmup=spec.warmup, iters=spec.max_iters, clock=Clock(device), group=plain,
                             flush=flush, stop=calib, turn_group=fence)
        timed = len(next(iter(next(iter(samples.values())).values())))
        if calib is not None:
            out[CALIBRATION] = calib.record()
        if CONTROL in samples:
            out[CONTROL] = {"samples": samples.pop(CONTROL)}
            clock.add("of which A/A control", sum(map(sum, out[CONTROL]["samples"].values())) / 1e6)
        for name, phases in samples.items():
            reports[name].samples = phases
        for s in steps:
            check = s.timed_check
            if check is not None:
                clock.add("of which verification", check.seconds)
                wrong = check.reason(spec.warmup + timed)
                if wrong:
                    reports[s.name].fail("production_form", wrong)
                    reports[s.name].correct = False
    out[PHASES_KEY] = clock.report()
    out[GROUP_RANK_KEY] = rank
    if watch.found is not None:
        out[STATE_KEY] = watch.found
    return {**{name: asdict(rep) for name, rep in reports.items()}, **out}


def _watched(check: Callable[[str, int, object], object] | None, watch: Watch, name: str, last: str):
    """``check`` (a step's after-phase hook, or none), then, after the turn's
    ``last`` phase, ``watch`` told whose turn it was (once a turn: the turn
    names the implementation, and each look costs ~0.1 ms)."""
    def run(phase: str, it: int, out: object) -> None:
        if check is not None:
            check(phase, it, out)
        if phase == last:
            watch.after(name, f"its turn in iteration {it} of the timed loop")

    return run
