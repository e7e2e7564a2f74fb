"""Pad at the split: the serving engine's other answer to uneven shards.

Instead of padding around the MoE (the padded communicator: every shard to
``m = max_r n_r`` inside the gather), the engine gives every rank the same
*physical* length before attention, by the rule of the plan's engine
(:mod:`nsa_cp_comm.engines`; both engines there use)::

    P = ceil_align(max_r n_r, align)    align = 2*cp for zigzag splits, cp otherwise

Each rank's ``n_r`` rows are followed by ``P - n_r`` zero rows from the split
on; they pass through every layer (whether attention and the MoE compute or
mask them is the engine's: ``Engine.costs``), and every CP collective is an
even one on ``[P, H]`` chunks. The gathered buffer is rank-major ``[P*cp, H]``
with rank ``r``'s rows at ``r*P`` and zeros after them; the scatter returns
this rank's ``n_r`` real rows. ``P >= m`` always, so this design never moves
fewer bytes than the padded communicator; what it saves is the per-layer local
work (the rows already sit in a padded tensor) and every uneven shape.

The round trip here has the :class:`~nsa_cp_comm.protocol.RoundTripImpl`
contract, so the matrix checks and times it like every implementation.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .collectives import all_gather_into, reduce_scatter_into
from . import engines
from .plan import CPPlan
from .roundtrip import _check


def physical_len(plan: CPPlan) -> int:
    """``P``: the rows every rank holds after the split is padded (``>= max_rank_len``),
    by the rule of the plan's engine."""
    return engines.of(plan).physical_len(plan)


def padding_rows(plan: CPPlan) -> dict[str, int]:
    """The padding rows each design's attention and MoE hold per layer.

    ``attn_*``: rows of padding in one rank's attention input (max over ranks);
    ``moe``: padding rows in the gathered buffer every rank's MoE runs on."""
    c = engines.of(plan).costs(plan)
    return {
        f"{d}_{part}": c[d][f"{part}_pad_processed"] + c[d][f"{part}_pad_masked"]
        for d in ("padded", "pad_at_split") for part in ("attn", "moe")
    }


def pad_local(local: torch.Tensor, plan: CPPlan, rank: int) -> torch.Tensor:
    """This rank's rows as the split leaves them: ``[P, H]``, zero rows after ``n_r``
    (what the engine's attention and MoE see)."""
    out = torch.zeros((physical_len(plan), local.shape[1]), dtype=local.dtype, device=local.device)
    out[: plan.per_rank_tokens[rank]].copy_(local)
    return out


def pad_at_split_gather(
    local: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None, *, check: bool = True
) -> torch.Tensor:
    """``[n_r, H]`` per rank -> ``[P*cp, H]``: the rows padded to ``P`` at the
    split (here: copied into a fresh padded tensor, standing in for the split),
    then one even all-gather."""
    rank = _check("pad_at_split_gather local", local, plan, "local", group)
    block = pad_local(local, plan, rank)
    full = torch.empty((physical_len(plan) * plan.cp_size, local.shape[1]), dtype=local.dtype, device=local.device)
    all_gather_into(full, block, group)
    return full


def pad_at_split_scatter(
    full: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None, *, check: bool = True
) -> torch.Tensor:
    """Sum ``[P*cp, H]`` partials over ranks (one even reduce-scatter, in place)
    and return this rank's ``n_r`` real rows (a view: padding dropped)."""
    rank = _check("pad_at_split_scatter full", full, plan, lambda p, r: physical_len(p) * p.cp_size, group)
    full = full.contiguous()
    chunk = full.tensor_split(plan.cp_size)[rank]
    reduce_scatter_into(chunk, full, group)
    return chunk[: plan.per_rank_tokens[rank]]
