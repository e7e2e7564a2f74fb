"""vLLM 0.33's prefill context parallelism (PCP), read from ``vllm/v1/worker/gpu/pcp_manager.py``
(vllm-project/vllm at commit 0036d38d) and the MoE runner the issue tracker cites.

The split (``PCPManager._get_rank_segments``, "DualChunkSwap"), PCP=2, one
prefill of 7 tokens ``A..G`` cut into ``2*pcp = 4`` chunks of
``ceil(7 / 4) = 2`` tokens::

    full:    | A B | C D | E F | G |
    rank 0:    A B               G        chunks 0 and 3
    rank 1:          C D   E F            chunks 1 and 2
    padded:  [A B G _ | C D E F]          every rank to max(per_rank_num_tokens) = 4

- Strategy: ``dual_chunk_swap`` only. Each prefill in ``2*pcp`` chunks of
  ``ceil(q / (2*pcp))`` tokens, rank ``r`` takes chunks ``r`` and
  ``2*pcp-1-r``, request by request; a chunk of length ``<= 0`` is skipped, so
  a prefill shorter than ``2*pcp`` leaves ranks with no rows (1 token at PCP 2:
  ``[1, 0]``). A rank with no rows still takes part (``partition_batch`` gives
  it an empty segment). With DCP > 1, ``replicated_requests`` replicates such
  prefills on every rank instead: not modelled (the matrix has no DCP).
- No batch padding: the raw scheduled tokens are split.
- Pad at the split (``_build_batch_layout``): every rank to
  ``padded_num_tokens = max(per_rank_num_tokens)`` (``P = max n_r``, no
  alignment), with an ``is_padding`` mask over the rows past the rank's own.
  Where CUDA graphs run, the padded length is a capture bucket, which must be
  at least ``max n_r`` (:func:`graph_padded_len`; a smaller one is a
  ``ValueError``); sparse MLA PCP (DeepSeek-V3.2) refuses CUDA graphs
  (``validate_config``: "Set -cc.cudagraph_mode=NONE"), so its ``P`` is
  ``max n_r``.
- What runs on the padding: attention masks it (``is_padding``; input ids and
  positions zeroed, ``gathered_kv_write_mask`` keeps the padding out of the
  KV cache). The MoE (``model_executor/layers/fused_moe/runner/moe_runner.py``):
  with pcp > 1 and no all2all kernels, an equal ``all_gather(dim=0)`` of the
  padded shard (and of the router logits) before the experts and an equal
  ``reduce_scatter(dim=0)`` after; the router masks the padding rows
  (``topk_ids = -1``, zero weight; ``VLLM_MOE_SKIP_PADDING``, on by default):
  masked. ``all_gatherv`` / ``reduce_scatterv`` serve data parallelism only.
- Refusals: ``maybe_build_pcp_manager`` builds no manager for pcp <= 1 (the
  batch runs without CP); every batch runs at pcp > 1.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._rules import only_one_rank, unaligned

STRATEGY_NAMES = {"dual_chunk_swap": "DualChunkSwap"}
PADDING_AT = "the end of every rank shorter than the longest (is_padding)"


# P = max n_r; only pcp = 1 runs without CP
split_align, refuses = unaligned, only_one_rank


def refusal_reason(min_len: int, total: int, cp: int, policy: str) -> str:
    return "PCP needs prefill_context_parallel_size > 1 (maybe_build_pcp_manager): the batch runs without CP"


def graph_padded_len(per_rank_num_tokens: Sequence[int], bucket: int | None = None,
                     buckets: Sequence[int] = ()) -> int:
    """The rows every rank is padded to: ``max(per_rank_num_tokens)``, or the
    CUDA-graph bucket that holds it (``bucket`` given, or the smallest of
    ``buckets`` that is at least it; past the largest the batch runs eager at
    ``max``). A ``bucket`` smaller than ``max`` cannot hold the longest rank:
    ValueError, as vLLM raises."""
    need = max(per_rank_num_tokens)
    if bucket is not None:
        if bucket < need:
            raise ValueError(f"padded_num_tokens={bucket} is smaller than max(per_rank_num_tokens)={need}")
        return int(bucket)
    fits = [b for b in buckets if b >= need]
    return int(min(fits)) if fits else int(need)


TITLE = "vLLM 0.33"
SOURCE = "vllm==0.33: vllm/v1/worker/gpu/pcp_manager.py, model_executor/layers/fused_moe/runner/moe_runner.py"
STRATEGIES = ("dual_chunk_swap",)
PADS_BATCH = False
ATTN_PAD_MASKED = True
MOE_PAD_MASKED = True
