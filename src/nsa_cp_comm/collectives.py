"""The one compatibility shim over torch's gather / reduce-scatter names.

torch 2.13 renamed ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` to
``all_gather_single`` / ``reduce_scatter_single`` and deprecates the old names;
torch 2.11 has only the old ones. Detect once at import, so no run prints
deprecation warnings and every caller goes through one name.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

ALL_GATHER_NAME: str = _ALL_GATHER.__name__
REDUCE_SCATTER_NAME: str = _REDUCE_SCATTER.__name__


def all_gather_into(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
    """``output[r*k:(r+1)*k] = input of rank r`` for equal ``k = input.shape[0]`` on
    every rank. ``output`` is the concatenated ``[k*world, ...]`` form (gloo
    accepts no other). ``input`` may be the slot of ``output`` for this rank."""
    _ALL_GATHER(output, input, group=group)


def reduce_scatter_into(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
    """``output = sum over ranks of input[r*k:(r+1)*k]`` for this rank ``r``.
    ``output`` may be this rank's chunk of ``input`` (the serving code's form)."""
    _REDUCE_SCATTER(output, input, group=group)


def group_rank(group: dist.ProcessGroup | None) -> int:
    return dist.get_rank(group)


def group_size(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group)
