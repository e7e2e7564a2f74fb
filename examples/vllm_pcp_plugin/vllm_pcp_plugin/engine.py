"""vLLM 0.33's prefill-CP functions on the MoE all-gather path, as the engine writes them.

Written from ``vllm/v1/worker/gpu/pcp_manager.py`` (vllm-project/vllm at commit
0036d38d) and ``model_executor/layers/fused_moe/runner/moe_runner.py``, read and
restated, not copied. The engine reads its PCP group from ``get_pcp_group()``;
here it is an argument, the only change of shape. Nothing here imports
nsa_cp_comm: this is the engine's side of the plug-in.

PCP=2, one prefill ``A..G`` (7 tokens, chunks of ``ceil(7/4) = 2``)::

    rank 0: chunks 0, 3 -> [A B G]      rank 1: chunks 1, 2 -> [C D E F]
    padded_num_tokens = max(3, 4) = 4:  [A B G _ | C D E F]   (is_padding: row 3 of rank 0)
    MoE: all_gather(dim=0) -> [8, H]; experts (padding rows: topk_ids = -1); reduce_scatter(dim=0) -> [4, H]

- ``rank_segments``: ``PCPManager._get_rank_segments`` for fresh prefills: each
  prefill in ``2*pcp`` chunks of ``ceil(q / (2*pcp))``, rank ``r`` chunks ``r``
  and ``2*pcp-1-r``, a chunk of length ``<= 0`` skipped.
- ``padded_num_tokens``: ``_build_batch_layout``: ``max(per_rank_num_tokens)``,
  or the CUDA-graph bucket, which must hold it.
- ``pcp_all_gather`` / ``pcp_reduce_scatter``: the MoE runner with pcp > 1 and
  no all2all kernels: ``get_pcp_group().all_gather(x, dim=0)`` of the padded
  shard before the experts and ``reduce_scatter(x, dim=0)`` after, equal
  chunks, rank order.
- ``mask_padding``: the router's padding mask (``VLLM_MOE_SKIP_PADDING``, on by
  default): a padding row routes to no expert (``topk_ids = -1``), so its
  output row is zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

VERSION = "0.33"

# torch renamed the tensor collectives (2.13: *_single); the engine calls torch's.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def rank_segments(num_scheduled_tokens: Sequence[int], pcp_world_size: int, rank: int) -> list[tuple[int, int]]:
    """``_get_rank_segments`` for a batch of fresh prefills: ``(global start, length)``
    of every chunk ``rank`` takes, request by request."""
    segments, start, num_chunks = [], 0, 2 * pcp_world_size
    for num_tokens in num_scheduled_tokens:
        query_len = int(num_tokens)
        chunk_size = (query_len + num_chunks - 1) // num_chunks
        for chunk_idx in (rank, num_chunks - 1 - rank):
            chunk_offset = chunk_idx * chunk_size
            chunk_len = min(chunk_size, query_len - chunk_offset)
            if chunk_len <= 0:
                continue
            segments.append((start + chunk_offset, chunk_len))
        start += query_len
    return segments


def per_rank_num_tokens(num_scheduled_tokens: Sequence[int], pcp_world_size: int) -> list[int]:
    """``_build_batch_layout``: each rank's rows before padding."""
    return [sum(n for _, n in rank_segments(num_scheduled_tokens, pcp_world_size, r)) for r in range(pcp_world_size)]


def padded_num_tokens(per_rank: Sequence[int], bucket: int | None = None) -> int:
    """``_build_batch_layout``: the rows every rank is padded to."""
    need = max(per_rank)
    if bucket is not None and bucket < need:
        raise ValueError(f"padded_num_tokens={bucket} is smaller than max(per_rank_num_tokens)={need}")
    return need if bucket is None else bucket


def mask_padding(hidden_states: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """What the router's padding mask makes of a rank's MoE rows: rows at or past
    ``num_tokens`` route to no expert and come back zero."""
    hidden_states[num_tokens:] = 0
    return hidden_states


def pcp_all_gather(hidden_states: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """``GroupCoordinator.all_gather(x, dim=0)``: the equal padded shards in rank order, ``[P*pcp, H]``."""
    world = dist.get_world_size(group)
    out = hidden_states.new_empty((hidden_states.shape[0] * world, *hidden_states.shape[1:]))
    _ALL_GATHER(out, hidden_states.contiguous(), group=group)
    return out


def pcp_reduce_scatter(hidden_states: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """``GroupCoordinator.reduce_scatter(x, dim=0)``: sums over the ranks, this rank's equal chunk."""
    world = dist.get_world_size(group)
    out = hidden_states.new_empty((hidden_states.shape[0] // world, *hidden_states.shape[1:]))
    _REDUCE_SCATTER(out, hidden_states.contiguous(), group=group)
    return out
