"""A context-parallel layer communicator written the way a serving engine
writes one, knowing nothing of nsa_cp_comm.

The engine builds it once per batch from how many tokens each CP rank holds
and the CP process group. Around the MoE layer, ``prepare_mlp`` turns this
rank's ``[n_r, H]`` hidden states into the MoE input (every rank's rows), and
``postprocess`` turns the MoE's partial output back into this rank's ``[n_r, H]``
(summed over ranks). Uneven shards are padded to the longest so that every
rank's collective moves equal-sized chunks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

# torch 2.13 renamed the tensor forms of the collectives and deprecates the old names.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class ContextParallelCommunicator:
    def __init__(self, tokens_per_rank: Sequence[int], group: dist.ProcessGroup | None = None) -> None:
        self.tokens_per_rank = tuple(int(n) for n in tokens_per_rank)
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        if len(self.tokens_per_rank) != self.world:
            raise ValueError(f"{len(self.tokens_per_rank)} token counts for a group of {self.world} ranks")
        # Every size comes from the shared counts, never from a local tensor,
        # so all ranks issue the same collectives with the same shapes.
        self.block = max(self.tokens_per_rank)
        self.mine = self.tokens_per_rank[self.rank]

    def prepare_mlp(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[n_r, H]`` -> ``[block * world, H]``: rank r's rows at ``r * block``,
        zeros after them."""
        buf = hidden.new_zeros((self.block * self.world, hidden.shape[1]))
        slot = buf[self.rank * self.block : (self.rank + 1) * self.block]
        slot[: self.mine].copy_(hidden)
        _all_gather(buf, slot, group=self.group)
        return buf

    def postprocess(self, moe_out: torch.Tensor) -> torch.Tensor:
        """``[block * world, H]`` partial outputs -> this rank's ``[n_r, H]``, summed over ranks."""
        moe_out = moe_out.contiguous()
        out = moe_out.new_empty((self.block, moe_out.shape[1]))
        _reduce_scatter(out, moe_out, group=self.group)
        return out[: self.mine]
