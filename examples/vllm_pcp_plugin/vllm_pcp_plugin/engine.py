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
  or the CUDA-graph bucket, which must hold it; ``graph_bucket``: the bucket
  the dispatcher picks for the largest rank (``cudagraph_utils.py:380-394``:
  the smallest capture size at least it; past the largest, eager), over
  ``capture_sizes`` (``config/vllm.py:2579-2590``).
- ``pcp_all_gather`` / ``pcp_reduce_scatter``: the MoE runner with pcp > 1 and
  no all2all kernels: ``get_pcp_group().all_gather(x, dim=0)`` of the padded
  shard before the experts and ``reduce_scatter(x, dim=0)`` after, equal
  chunks, rank order.
- ``moe_is_padding``: the padding mask over the gathered rows (rank-major,
  ``rows >= per_rank_num_tokens[r]`` in rank ``r``'s block of ``P``), which the
  router of a model that masks padding reads.
- ``router_masks_padding``: whether the model's router masks the padding rows
  (``VLLM_MOE_SKIP_PADDING``): DeepSeek-V4's ``FusedTopKBiasRouter`` does
  (``topk_ids = -1``, before the experts); DeepSeek-V3.2's and GLM-5's
  ``GroupedTopKRouter`` only with ``skip_padding``, which this path never sets,
  so their experts process every padding row. The mask acts in the router,
  before the experts, never on the reduce-scatter's input.
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


def capture_sizes(max_capture_size: int) -> list[int]:
    """The default capture sizes up to ``max_capture_size``: 1, 2, 4, every 8 below 256, every 16 from 256."""
    sizes = [i for i in (1, 2, 4) if i <= max_capture_size]
    sizes += list(range(8, min(max_capture_size + 1, 256), 8))
    return sizes + list(range(256, max_capture_size + 1, 16))


def graph_bucket(num_tokens: int, max_capture_size: int) -> int | None:
    """The captured size a step of ``num_tokens`` rows per rank runs in, None where it runs eager."""
    return next((s for s in capture_sizes(max_capture_size) if s >= num_tokens), None) if max_capture_size else None


def router_masks_padding(model_type: str) -> bool:
    """Whether the model's router keeps the padding rows from the experts on this path."""
    return model_type == "deepseek_v4"


def moe_is_padding(per_rank: Sequence[int], num_local_tokens_padded: int) -> torch.Tensor:
    """``PCPManager``'s padding mask over the gathered rows the MoE routes (``pcp_manager.py:630-635``):
    rank-major, row ``i`` of rank ``r``'s block is padding when ``i >= per_rank[r]``; the router of a model
    that masks padding sends those rows to no expert."""
    rows = torch.arange(num_local_tokens_padded)
    return (rows >= torch.tensor(list(per_rank))[:, None]).flatten()


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
