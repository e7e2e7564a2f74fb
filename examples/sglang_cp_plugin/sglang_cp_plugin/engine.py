"""SGLang 0.5.23's prefill-CP functions on the MoE all-gather path, as the engine writes them.

Written from the ``sglang==0.5.23`` wheel (``pip download --no-deps
sglang==0.5.23``; files under ``sglang/srt/``), read and restated, not copied.
The engine reads its CP group, size and rank from ``get_parallel()``; here they
are arguments, which is the only change of shape. Nothing here imports
nsa_cp_comm: this is the engine's side of the plug-in.

- ``layers/cp/padding.py``: ``get_cp_padding_align_size`` (``2*cp`` for
  zigzag, ``cp`` otherwise), ``pad_logical_token_to_physical`` (every rank's
  physical length ``P = ceil_align(max logical, align)``) and
  ``pad_local_rows`` (zero rows appended at the split, whenever the ranks'
  logical lengths are not all ``P``).
- ``layers/cp/interleave.py``: ``InterleaveCPStrategy.build_metadata``
  (``T // cp + (r < T % cp)`` rows on rank ``r``, ``T`` the batch's extend
  tokens), ``InterleaveCPStrategy.can_apply`` and ``attn_cp_interleave_gather``
  (an all-gather of the equal padded shards into ``[P*cp, H]``, sized from the
  shard itself, rank order).
- ``layers/cp/zigzag.py``: ``ZigzagCPStrategy.can_apply`` (every request at
  least ``2*cp`` tokens).
- ``layers/layer_boundary/ops.py``: ``attn_cp_interleave_reduce_scatter``
  (the rank-major ``[P*cp, H]`` output summed onto this rank's ``[P, H]``
  chunk of it, in place).
- ``layers/dp_attention.py``: ``attn_cp_all_gather_into_tensor`` /
  ``attn_cp_reduce_scatter_tensor``, the CP group's tensor collectives.
- ``arg_groups/model_overrides/deepseek_v2.py``: zigzag DSA CP (and MLA CP,
  either strategy) sets ``moe_a2a_backend = "deepep"``, so only interleave
  DSA CP reaches the all-gather MoE these functions serve.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

VERSION = "0.5.23"
STRATEGIES = ("zigzag", "interleave")

# torch renamed the tensor collectives (2.13: *_single); the engine calls torch's.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def get_cp_padding_align_size(cp_size: int, strategy: str) -> int:
    """``layers/cp/padding.py``: the physical length's alignment."""
    return cp_size * 2 if strategy == "zigzag" else cp_size


def interleave_per_rank_actual_token(extend_seqs_len: Sequence[int], cp_size: int) -> list[int]:
    """``InterleaveCPStrategy.build_metadata``: each rank's logical rows."""
    base_len, extra = divmod(sum(int(x) for x in extend_seqs_len), cp_size)
    return [base_len + (rank < extra) for rank in range(cp_size)]


def pad_logical_token_to_physical(logical_tokens: Sequence[int], align_size: int) -> int:
    """``layers/cp/padding.py``: the physical length every rank is padded to."""
    return (max(logical_tokens) + align_size - 1) // align_size * align_size


def pad_local_rows(x: torch.Tensor, logical_tokens: Sequence[int], physical_rank_len: int) -> torch.Tensor:
    """``layers/cp/padding.py``: a rank's rows padded with zero rows to the
    physical length; unchanged when every rank's logical length is already it."""
    if list(logical_tokens) == [physical_rank_len] * len(logical_tokens):
        return x
    pad_size = physical_rank_len - x.shape[0]
    assert pad_size >= 0
    if pad_size == 0:
        return x
    return torch.cat([x, x.new_zeros((pad_size, *x.shape[1:]))], dim=0)


def interleave_can_apply(extend_seqs_len: Sequence[int], cp_size: int) -> bool:
    """``InterleaveCPStrategy.can_apply``: at least ``cp`` tokens, ``cp > 1``."""
    seq_len = sum(extend_seqs_len)
    return seq_len > 0 and seq_len >= cp_size and cp_size > 1


def zigzag_can_apply(extend_seqs_len: Sequence[int], cp_size: int) -> bool:
    """``ZigzagCPStrategy.can_apply``: ``cp > 1``, at least ``2*cp`` tokens,
    and every request at least ``2*cp`` tokens long."""
    if cp_size <= 1 or sum(extend_seqs_len) < cp_size * 2:
        return False
    return all(int(length) >= cp_size * 2 for length in extend_seqs_len)


def attn_cp_interleave_gather(hidden_states: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """``layers/cp/interleave.py``: gather the equal padded shards in rank
    order, ``[P*cp, H]``, sized from the shard."""
    gathered = hidden_states.new_empty((hidden_states.shape[0] * dist.get_world_size(group), *hidden_states.shape[1:]))
    _ALL_GATHER(gathered, hidden_states.contiguous(), group=group)
    return gathered


def attn_cp_interleave_reduce_scatter(hidden_states: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """``layers/layer_boundary/ops.py``: sum the rank-major output onto this
    rank's equal, padded shard (a chunk of the input, reduced in place)."""
    chunk = hidden_states.tensor_split(dist.get_world_size(group))[dist.get_rank(group)]
    _REDUCE_SCATTER(chunk, hidden_states, group=group)
    return chunk
