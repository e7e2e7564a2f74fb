"""SGLang 0.5.23's prefill context parallelism, read from its wheel (``sglang==0.5.23``, ``sglang/srt/``).

- Strategies (``layers/cp/base.py``, ``ContextParallelStrategyKind``): ``zigzag``
  (``layers/cp/zigzag.py``, ``ZigzagCPStrategy.build_metadata``: each request
  cut into ``2*cp`` blocks, ``q + (i < rem)`` tokens in block ``i``, rank ``k``
  owns blocks ``k`` and ``2*cp-1-k``) and ``interleave``
  (``layers/cp/interleave.py``, ``InterleaveCPStrategy.build_metadata``: token
  ``t`` of the concatenated batch on rank ``t % cp``, so ``T//cp + (r < T % cp)``
  rows on rank ``r``; the split this project calls ``round_robin``). There is
  no page-aligned split in ``layers/cp/``.
- No batch padding: ``layers/cp/utils.py`` ``prepare_cp_forward`` builds the
  metadata from ``num_tokens = sum(extend_seq_lens)``, the raw extend lengths.
- Pad at the split: ``layers/cp/padding.py`` ``pad_logical_token_to_physical``
  sets every rank's physical length to ``ceil_align(max_r n_r, align)``,
  ``align`` from ``get_cp_padding_align_size`` (``2*cp`` for zigzag, ``cp`` for
  interleave); ``pad_local_rows`` appends the zero rows at the split whenever a
  rank's logical length differs from it, on even plans too.
- Refusals (the batch then runs without CP and without padding):
  ``ZigzagCPStrategy.can_apply`` needs ``cp > 1`` and every request (and the
  batch) at least ``2*cp`` tokens long; ``InterleaveCPStrategy.can_apply`` needs
  ``cp > 1`` and at least ``cp`` tokens in the batch.
- What runs on the padding: attention zeroes the padded output rows
  (``layers/cp/padding.py`` ``attention_output_tokens``, applied in
  ``layers/radix_attention.py``; zigzag's ``run_attention`` attends only the
  logical rows and appends zeros): masked. On the MoE all-gather path the MoE
  gets no padding mask (``model_executor/forward_batch_info.py``
  ``ForwardBatch.moe_num_token_non_padded`` returns None for a CP-gathered MoE
  input), so the zero rows run through the experts: processed. The gather is
  ``[P*cp, H]`` (``layers/cp/interleave.py`` ``attn_cp_interleave_gather``) and
  the reduce-scatter returns ``[P, H]`` (``layers/layer_boundary/ops.py``
  ``attn_cp_interleave_reduce_scatter``): one all-gather and one
  reduce-scatter per layer.
- The padding rows are zeros (``layers/cp/padding.py:46-62`` ``pad_local_rows``,
  through ``zigzag.py:301-306`` / ``interleave.py:204-212``
  ``shard_hidden_states``), and every gathered row is routed: for
  DeepSeek-V3.2 ``forward_batch_info.py:1436-1437`` gives the MoE no count
  of real rows, for DeepSeek-V4 ``models/deepseek_common/moe_transport.py:47-63``
  ``_every_row_routed`` counts them all.
- CUDA graphs: the CP prefill's breakable graphs run only for zigzag with
  ``trtllm_mha`` and for interleave with DSA on
  ``Glm5NextForConditionalGeneration`` (``layers/cp/bcg/__init__.py:21-26``,
  ``bcg/interleave_bcg.py:85-94``); otherwise they are switched off
  (``arg_groups/cuda_graph_hook.py:203-211``), so the models here run their
  CP prefill eager (:func:`graph_refusal`).
- Which strategy reaches the all-gather MoE: zigzag DSA CP forces DeepEP
  (``arg_groups/model_overrides/deepseek_v2.py``), and DeepSeek V3.2 prefill CP
  refuses zigzag ("use interleave", ``arg_groups/parallel_hook.py``).

``interleave`` (``round_robin``) at cp 2, one request of 7 tokens ``A..G``, eager::

    rank 0: tokens 0, 2, 4, 6:  A C E G          n_0 = 4
    rank 1: tokens 1, 3, 5:     B D F            n_1 = 3
    at the split:               P = ceil_align(4, cp) = 4: rank 1 gets one zero row
    gathered [P*cp, H]:         [A C E G | B D F 0]
    attention:                  its output of the zero row zeroed (masked)
    experts:                    every row, the zero row routed (no mask on this path)
    reduce-scatter:             rank 0 <- rows 0-3, rank 1 <- rows 4-7 ([P, H], the zero row kept)
"""

from __future__ import annotations

from typing import Any


STRATEGY_NAMES = {"zigzag": "zigzag", "round_robin": "interleave"}


def split_align(policy: str, cp: int) -> int:
    return 2 * cp if policy == "zigzag" else cp


def refuses(min_len: Any, total: Any, cp: int, policy: str) -> Any:
    if cp <= 1:
        return min_len >= 0  # always (True, or an all-True array)
    if policy == "zigzag":
        return (min_len < 2 * cp) | (total < 2 * cp)
    return total < cp


def refusal_reason(min_len: int, total: int, cp: int, policy: str) -> str:
    if cp <= 1:
        return f"{STRATEGY_NAMES[policy]} CP needs cp_size > 1 (can_apply): the batch runs without CP"
    if policy == "zigzag":
        return (f"ZigzagCPStrategy.can_apply refuses a request of {min_len} tokens, shorter than 2*cp = {2 * cp}: "
                "the batch runs without CP and without padding")
    return (f"InterleaveCPStrategy.can_apply refuses a batch of {total} tokens, fewer than cp = {cp}: "
            "the batch runs without CP and without padding")


def graph_refusal(model: str) -> str:
    return ("prefill CP graphs run only for zigzag with trtllm_mha or interleave with DSA on "
            "Glm5NextForConditionalGeneration (layers/cp/bcg/__init__.py:21-26, arg_groups/cuda_graph_hook.py:203-211)")


TITLE = "SGLang 0.5.23"
SOURCE = "sglang==0.5.23 wheel: sglang/srt/layers/cp/ (padding.py, utils.py, zigzag.py, interleave.py)"
STRATEGIES = ("zigzag", "round_robin")
PADS_BATCH = False
ATTN_PAD_MASKED = True
MOE_PAD_MASKED = False
