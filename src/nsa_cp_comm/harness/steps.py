"""What the timed loop runs for each implementation: the production forms.

A FULL-mode implementation is timed as its production form
(:meth:`~nsa_cp_comm.protocol.RoundTripImpl.production`, :mod:`.production`),
one without it as its ``gather``/``scatter`` calls; a dispatch implementation's
``dispatch`` is the gather phase and its ``combine`` the scatter phase. Every
iteration's inputs are new, written untimed before it, and its outputs are
checked untimed after each phase (:mod:`.verify`, :mod:`.verify_dispatch`).
What each phase holds, and why: docs/design.md, section 7, "What is timed".

No step checks its inputs: the ranks agreed on them in the correctness phase.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..collectives import all_gather_into, reduce_scatter_into
from ..moe import ReferenceMoE
from ..plan import CPPlan
from ..protocol import DispatchImpl, RoundTripImpl
from .spec import DTYPES, PointSpec
from .timing import CONTROL, Steps
from .verify import TimedCheck
from .verify_dispatch import DispatchCheck


def full_steps(impl: RoundTripImpl, spec: PointSpec, plan: CPPlan, rank: int, device,
               group: dist.ProcessGroup | None, shards: list[torch.Tensor], *, verify: bool = True) -> Steps:
    """The timed form of a FULL-mode implementation at this point: its
    production form, whatever the implementation (no branch on its name).
    ``shards``: every rank's rows (the checks'). Each iteration's inputs are
    new (written untimed before it) and, with ``verify`` (off only to measure
    what the checks cost), its outputs are checked untimed after each phase."""
    dtype = DTYPES[spec.dtype]
    # [n_r, H], or a padded shard's [P, H] (its padding rows zero, as the split leaves them)
    local = torch.zeros((impl.shard_rows(plan, rank), spec.hidden_size), dtype=dtype, device=device)
    form = impl.production(plan, spec.hidden_size, dtype, device, group)
    produced = form.stage if form.produced else None
    timed_stage = form.stage if not form.produced else None
    check = TimedCheck(impl, plan, rank, shards, spec.hidden_size, spec.seed, device, spec.warmup)

    def reset(it: int) -> None:
        # New rows and partials (the scatter consumes its input), so no cache can answer.
        check.inputs(it, local, form.partials)
        if produced is not None:
            produced(local)  # the producer writes its rows in place

    def gather(i: int) -> object:
        return form.gather(local)

    def scatter(i: int) -> object:
        return form.scatter()

    def verify_phase(phase: str, it: int, out: object) -> None:
        # Right after the phase, before any later call can write the same buffer.
        if phase == "gather":
            check.gathered(it, out)
        elif phase == "scatter":
            check.scattered(it, out, local)

    phases = [("gather", gather), ("scatter", scatter)]
    if timed_stage is not None:
        phases.insert(0, ("local", lambda i: timed_stage(local)))
    return Steps(impl.name, phases, reset=reset, check=verify_phase if verify else None,
                 timed_check=check if verify else None)


def dispatch_steps(impl: DispatchImpl, spec: PointSpec, plan: CPPlan, rank: int, device,
                   moe: ReferenceMoE, group: dist.ProcessGroup | None, shards: list[torch.Tensor], *,
                   verify: bool = True) -> Steps:
    """The timed form of a dispatch implementation: dispatch, then combine of
    what this rank's experts hand back (routing and the experts untimed).
    Each iteration's rows, routing and combine input are new, written untimed
    before it, and (with ``verify``) checked untimed after each phase."""
    check = DispatchCheck(impl, plan, rank, shards, moe, spec.seed, device, spec.warmup)
    local = torch.empty_like(shards[rank])
    idx, weight = torch.empty_like(check.idx), torch.empty_like(check.weight)
    y = torch.empty((check.n_recv, spec.hidden_size), dtype=DTYPES[spec.dtype], device=device)
    per = moe.num_experts // plan.cp_size
    state: dict[str, object] = {}

    def reset(it: int) -> None:
        check.inputs(it, local, idx, weight, y)

    def dispatch(i: int) -> object:
        state["recv"], state["handle"] = impl.dispatch(local, idx, weight, per, group)
        return state["recv"]

    def combine(i: int) -> object:
        return impl.combine(y, state["handle"], group)

    def verify_phase(phase: str, it: int, out: object) -> None:
        if phase == "gather":
            check.dispatched(it, out, state["handle"])
        else:
            check.combined(it, out, local)

    return Steps(impl.name, [("gather", dispatch), ("scatter", combine)], reset=reset,
                 check=verify_phase if verify else None, timed_check=check if verify else None)


def control_steps(spec: PointSpec, plan: CPPlan, rank: int, device, group: dist.ProcessGroup | None) -> Steps:
    """The A/A control timed in the same loop as the implementations: a bare
    all-gather into the padded ``[max*cp, H]`` buffer and a reduce-scatter of
    it, torch's calls with nothing of this project's around them. An
    implementation's time over the control's in the same iteration moves with
    the implementation's code, hardly with the machine's load, which both share."""
    dtype = DTYPES[spec.dtype]
    m = plan.max_rank_len
    full = torch.zeros((plan.padded_total, spec.hidden_size), dtype=dtype, device=device)
    block = full[rank * m : (rank + 1) * m]
    scratch = torch.zeros_like(full)
    chunk = scratch.tensor_split(plan.cp_size)[rank]
    return Steps(CONTROL, [("gather", lambda i: all_gather_into(full, block, group)),
                           ("scatter", lambda i: reduce_scatter_into(chunk, scratch, group))])
