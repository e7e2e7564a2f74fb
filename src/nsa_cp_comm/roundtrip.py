"""The CP gather / reduce-scatter round trips: the legacy one and the padded fix.

Every function takes ``(tensor, plan, group=None)``; the rank is the caller's
rank in ``group``. Contract: **all ranks of the group must pass the same plan**;
every size, and whether the legacy path may run at all, is decided from the
plan, never from a local shape, so all ranks take the same branch and no rank
enters a collective its peers skip.

Legacy (SPEC 1.1) assumes equal shards. The padded path (SPEC 1.2) pads each
shard to ``m = plan.max_rank_len`` rows inside a ``[m*cp, H]`` buffer, so that
every collective sees equal chunks; rank ``r``'s rows sit at
``[r*m, r*m + n_r)``. On even plans ``m*cp == T`` and the padded path issues
exactly the legacy collectives on the same tensors.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .collectives import all_gather_into, group_rank, group_size, reduce_scatter_into
from .plan import CPPlan

# The text torch's NCCL backend raises for mismatched all-gather sizes.
LEGACY_UNEVEN_ERROR = "output tensor size must be equal to world_size times input tensor size"


def _rank(plan: CPPlan, group: dist.ProcessGroup | None) -> int:
    world = group_size(group)
    if world != plan.cp_size:
        raise ValueError(f"group size {world} != plan.cp_size={plan.cp_size}: all ranks must pass the group's plan")
    return group_rank(group)


def _check_rows(name: str, t: torch.Tensor, rows: int) -> None:
    if t.dim() != 2 or t.shape[0] != rows:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, the plan expects [{rows}, H]")


def _refuse_uneven(plan: CPPlan) -> None:
    # Decided from the shared plan, so every rank raises; none is left inside
    # a collective (NCCL would hang, gloo would abort the process).
    if not plan.is_even:
        raise ValueError(
            f"{LEGACY_UNEVEN_ERROR} (legacy CP gather/scatter needs even shards; "
            f"per_rank_tokens={list(plan.per_rank_tokens)})"
        )


def legacy_gather(local: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Old gather: ``[n, H]`` per rank -> ``[T, H]`` rank-major. Even plans only;
    raises ValueError (torch's NCCL text) on every rank of an uneven plan."""
    rank = _rank(plan, group)
    _refuse_uneven(plan)
    _check_rows("local", local, plan.per_rank_tokens[rank])
    out = torch.empty((plan.total_tokens, local.shape[1]), dtype=local.dtype, device=local.device)
    all_gather_into(out, local.contiguous(), group)
    return out


def legacy_scatter(full: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Old scatter: sum ``[T, H]`` partials over ranks, return this rank's
    ``[T/cp, H]`` chunk. In place: ``full`` is consumed and the result is a
    view of it. Even plans only (same error as :func:`legacy_gather`)."""
    rank = _rank(plan, group)
    _refuse_uneven(plan)
    _check_rows("full", full, plan.total_tokens)
    full = full.contiguous()
    chunk = full.tensor_split(plan.cp_size)[rank]
    reduce_scatter_into(chunk, full, group)
    return chunk


def padded_buffer(
    plan: CPPlan,
    hidden_size: int,
    *,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A fresh ``[m*cp, H]`` gather buffer and this rank's ``[n_r, H]`` slot in it.

    The zero-copy form of the gather: the producer of the rows writes them
    into ``slot`` and then calls :func:`padded_gather_`; the shard is never
    copied into a padded tensor. Only this rank's padding rows are zeroed:
    the other blocks are overwritten by the gather.
    """
    rank = _rank(plan, group)
    m, n = plan.max_rank_len, plan.per_rank_tokens[rank]
    full = torch.empty((plan.padded_total, hidden_size), dtype=dtype, device=device)
    full[rank * m + n : (rank + 1) * m].zero_()
    return full, full[rank * m : rank * m + n]


def padded_gather_(full: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """In-place gather over a :func:`padded_buffer`: this rank's ``[m, H]`` block
    of ``full`` is the collective's input. Returns ``full``."""
    rank = _rank(plan, group)
    _check_rows("full", full, plan.padded_total)
    m = plan.max_rank_len
    all_gather_into(full, full[rank * m : (rank + 1) * m], group)
    return full


def padded_gather(local: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Gather every rank's ``[n_r, H]`` rows into a fresh ``[m*cp, H]`` buffer,
    rank-major, each block zero-padded to ``m`` rows. Works for any plan,
    including ranks with zero rows. On even plans it is exactly
    :func:`legacy_gather` (no padding rows, same collective)."""
    rank = _rank(plan, group)
    _check_rows("local", local, plan.per_rank_tokens[rank])
    if plan.is_even:
        return legacy_gather(local, plan, group)
    full, slot = padded_buffer(plan, local.shape[1], dtype=local.dtype, device=local.device, group=group)
    slot.copy_(local)
    return padded_gather_(full, plan, group)


def padded_scatter(full: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum ``[m*cp, H]`` partials over ranks and return this rank's ``[n_r, H]``
    rows (a view of its chunk: padding dropped, nothing copied). In place:
    ``full`` is consumed. On even plans it is exactly :func:`legacy_scatter`."""
    rank = _rank(plan, group)
    _check_rows("full", full, plan.padded_total)
    full = full.contiguous()
    chunk = full.tensor_split(plan.cp_size)[rank]
    reduce_scatter_into(chunk, full, group)
    return chunk[: plan.per_rank_tokens[rank]]
