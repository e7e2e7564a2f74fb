"""Production forms: a round trip as serving code runs it at every layer.

Serving code sizes its buffers once and reuses them at every layer: it
gathers into a pre-sized buffer and reduce-scatters into a chunk of a
pre-sized one. A :class:`~nsa_cp_comm.protocol.RoundTripImpl` may give that form
with ``prepare(plan, hidden, dtype, device, group) -> Production``; the timed
loop runs it (:mod:`.harness.steps`) on new inputs every iteration and checks
every iteration's outputs against what the plan says every rank contributed
(the ``production_form`` check, :mod:`.harness.verify`), so the form that is
timed is held to the same contract as the checked calls. An
implementation without ``prepare`` is timed as its checked calls
(:func:`calls_form`), allocation included.

The built-in implementations give theirs here, through the same interface.
The padded form's local work goes through ``roundtrip.padded_stage``, and its
rule (which ranks copy) through ``roundtrip.stages_rows``, both looked up at
each use, so whoever replaces either changes the timed path too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from . import roundtrip
from .collectives import all_gather_into, group_rank, reduce_scatter_into
from .pad_at_split import physical_len
from .plan import CPPlan


@dataclass
class Production:
    """One implementation's production form at one point, on one rank.

    Per round trip: ``stage(local)`` (optional) puts this rank's ``[n_r, H]``
    rows (a padded shard's ``[P, H]``: ``shard="padded"``) where the gather reads them: the ``local`` phase of the timed loop,
    or, with ``produced``, untimed (in serving code the rows' producer writes
    them there, like nccl-tests' in-place column). ``gather(local)`` runs the
    gather and returns the gathered buffer in the implementation's layout.
    The caller fills ``partials`` (the scatter's input, in that layout; it
    must not alias the gathered buffer) before ``scatter()``, which may
    consume it and returns this rank's ``[n_r, H]`` (or ``[P, H]``). Buffers are allocated
    once, by ``prepare``; what a call returns may be a view of them, valid
    until the next call.
    """

    gather: Callable[[torch.Tensor], Any]
    scatter: Callable[[], Any]
    partials: torch.Tensor
    stage: Callable[[torch.Tensor], object] | None = None
    produced: bool = False


def calls_form(impl: Any, plan: CPPlan, hidden: int, dtype: torch.dtype, device: torch.device | str,
               group: dist.ProcessGroup | None) -> Production:
    """The form of an implementation without ``prepare``: its checked
    ``gather`` / ``scatter`` calls, allocation included."""
    partials = torch.empty((impl.buffer_rows(plan), hidden), dtype=dtype, device=device)
    return Production(gather=lambda local: impl.gather(local, plan, group),
                      scatter=lambda: impl.scatter(partials, plan, group), partials=partials)


def _in_place_scatter(rows: int, n: int, plan: CPPlan, rank: int, hidden: int, dtype: torch.dtype, device,
                      group: dist.ProcessGroup | None) -> tuple[torch.Tensor, Callable[[], torch.Tensor]]:
    """The partials buffer and a reduce-scatter into this rank's chunk of it,
    returning its first ``n`` rows (a view: padding dropped, nothing copied)."""
    partials = torch.empty((rows, hidden), dtype=dtype, device=device)
    chunk = partials.tensor_split(plan.cp_size)[rank]

    def scatter() -> torch.Tensor:
        reduce_scatter_into(chunk, partials, group)
        return chunk[:n]

    return partials, scatter


def _in_place_gather(full: torch.Tensor, stride: int, rank: int,
                     group: dist.ProcessGroup | None) -> Callable[[torch.Tensor], torch.Tensor]:
    block = full[rank * stride : (rank + 1) * stride]

    def gather(local: torch.Tensor) -> torch.Tensor:
        all_gather_into(full, block, group)
        return full

    return gather


def padded_form(plan: CPPlan, hidden: int, dtype: torch.dtype, device, group: dist.ProcessGroup | None) -> Production:
    """``padded``: the all-gather out of place into a reused ``[m*cp, H]``
    buffer (every row of it written by each gather, so never zeroed), the
    reduce-scatter into this rank's chunk of the partials.

    The all-gather's input follows :func:`~nsa_cp_comm.roundtrip.stages_rows`:
    a rank with ``m`` rows gathers straight from the caller's shard, so on an
    even plan this is legacy's form (its call, its ``[T, H]``) with no local
    phase at all (``stage`` None on every rank). On an uneven plan every rank
    has a ``stage`` (the timed ``local`` phase: each phase starts with a
    barrier, so all ranks must have the same phases), which copies a short
    rank's rows into its reused send block
    (:func:`~nsa_cp_comm.roundtrip.padded_stage`), whose padding tail was
    zeroed once, here, and is written by nothing else; on a rank with ``m``
    rows it copies nothing. All ranks must pass the same plan."""
    rank = group_rank(group)
    full = torch.empty((plan.padded_total, hidden), dtype=dtype, device=device)
    send = roundtrip.padded_send_block(plan, hidden, dtype=dtype, device=device, group=group)
    partials, scatter = _in_place_scatter(plan.padded_total, plan.per_rank_tokens[rank], plan, rank, hidden, dtype,
                                          device, group)
    # The collective's input: the staged block where this rank stages, else
    # the shard the caller hands the gather.
    block = send.block[: plan.max_rank_len] if send is not None else None

    def gather(local: torch.Tensor) -> torch.Tensor:
        all_gather_into(full, block if block is not None else local.contiguous(), group)
        return full

    any_stages = any(roundtrip.stages_rows(plan, r) for r in range(plan.cp_size))
    stage = (lambda local: roundtrip.padded_stage(send, local, plan, rank)) if any_stages else None
    return Production(gather, scatter, partials, stage=stage)


def padded_zero_copy_form(plan: CPPlan, hidden: int, dtype: torch.dtype, device,
                          group: dist.ProcessGroup | None) -> Production:
    """``padded_zero_copy``: the rows are produced in their slot of a
    :func:`~nsa_cp_comm.roundtrip.padded_buffer` (untimed), then gathered in place."""
    rank = group_rank(group)
    full, slot = roundtrip.padded_buffer(plan, hidden, dtype=dtype, device=device, group=group)
    partials, scatter = _in_place_scatter(plan.padded_total, plan.per_rank_tokens[rank], plan, rank, hidden, dtype,
                                          device, group)
    return Production(_in_place_gather(full, plan.max_rank_len, rank, group), scatter, partials,
                      stage=slot.copy_, produced=True)


def legacy_form(plan: CPPlan, hidden: int, dtype: torch.dtype, device, group: dist.ProcessGroup | None) -> Production:
    """``legacy``: the all-gather out of place into a reused ``[T, H]``, the
    reduce-scatter into this rank's ``T/cp`` chunk of the partials."""
    rank = group_rank(group)
    out = torch.empty((plan.total_tokens, hidden), dtype=dtype, device=device)
    partials, scatter = _in_place_scatter(plan.total_tokens, plan.total_tokens // plan.cp_size, plan, rank, hidden,
                                          dtype, device, group)
    return Production(lambda local: roundtrip.legacy_gather_into(out, local, plan, group), scatter, partials)


def pad_at_split_form(plan: CPPlan, hidden: int, dtype: torch.dtype, device,
                      group: dist.ProcessGroup | None) -> Production:
    """``pad_at_split``: the rows were padded to ``P`` at the split, before
    attention, so each layer gathers its ``[P, H]`` block as it is (the rows
    written into it untimed, standing in for the split; no local phase)."""
    rank, p = group_rank(group), physical_len(plan)
    n = plan.per_rank_tokens[rank]
    full = torch.zeros((p * plan.cp_size, hidden), dtype=dtype, device=device)
    partials, scatter = _in_place_scatter(p * plan.cp_size, n, plan, rank, hidden, dtype, device, group)
    return Production(_in_place_gather(full, p, rank, group), scatter, partials,
                      stage=full[rank * p : rank * p + n].copy_, produced=True)
