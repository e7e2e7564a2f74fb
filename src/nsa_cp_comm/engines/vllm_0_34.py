"""vLLM 0.34's prefill context parallelism (PCP), read from its wheel (``vllm==0.34.0``); lines are 0.34.0's.

The split, its padding and the CUDA-graph bucket are 0.33's, byte for byte
(``v1/worker/gpu/pcp_manager.py``: ``_iter_rank_chunks``,
``_get_rank_segments`` ``:306``, ``_build_batch_layout`` ``:330``,
``get_num_tokens_for_dispatch`` ``:414-428``; the graph refusal ``:190-200``;
padding rows as token id 0 at position 0, ``:611-617``); the routers mask as
0.33's do, the mask now inside the kernels and still gated on
``skip_padding`` for the ``GroupedTopKRouter`` DeepSeek-V3.2 and GLM-5 get
(``fused_moe/router/grouped_topk_router.py:344-357``,
``router/base_router.py:132-142``): see :mod:`.vllm_0_33` for every rule
and its drawing. What changed:

- Quantize before the gather (``fused_moe/runner/moe_runner.py:820-842,
  863-876``, ``_quantizes_before_pcp_gather``): where the experts take
  input quantized row by row by a plain monolithic prepare (block fp8 with
  dynamic activation scales, ``quantization/fp8.py:477``
  ``accepts_quantized_input``, on a ``MoEPrepareAndFinalizeNoDPEPMonolithic``
  kernel; or NVFP4), each rank quantizes its rows first and gathers the fp8
  rows ``[P, H]``, their scales ``[P, H/128]`` fp32 and the router logits,
  in that order: four collectives per layer with the bf16 reduce-scatter
  (``:908``). ``moe_quant=fp8_block_monolithic`` is that path; a monolithic
  kernel is given the logits and routes them itself (``:632-640``), so no
  router masks the padding rows, for any model. On a modular block-fp8
  kernel (``fp8_block``) the runner gathers the activations as 0.33 does
  (``_quantizes_before_pcp_gather`` is False: no monolithic prepare) and the
  kernel quantizes the gathered rows (three collectives).
- On data-center Blackwell (SM100) with no legacy size flags, prefill
  batches dispatch over a new capture grid up to 8192 tokens per rank
  (``config/vllm.py:2604-2645``, ``config/compilation.py:76-99``); other
  devices keep 0.33's sizes, which :func:`capture_sizes` gives.
- The DCP group is listed sorted (``distributed/parallel_state.py:2260-2266``);
  0.33 listed it unsorted, so ``rank_in_group`` could disagree with a
  collective's output order. The PCP group was sorted in both.

The quantized gather, DeepSeek-V3.2 on a monolithic block-fp8 kernel, PCP 2,
ranks of 3 and 2 rows (``t0``: token id 0's padding row)::

    each rank first:       its [P, H] rows -> fp8 [P, H] and scales [P, H/128] fp32
    gathered fp8 rows:     | q(a0) q(a1) q(a2) | q(b0) q(b1) q(t0) |
    gathered scales:       | s(a0) s(a1) s(a2) | s(b0) s(b1) s(t0) |   the same layout
    gathered logits:       | la0   la1   la2   | lb0   lb1   lt0   |   the same layout
    experts:               every row, t0 too (the monolithic kernel skips the padding mask)
    reduce-scatter (bf16): rank 0 <- rows 0-2, rank 1 <- rows 3-5
"""

from __future__ import annotations

from .vllm_0_33 import (  # noqa: F401  (the rules this version keeps)
    ATTN_PAD_MASKED,
    GRAPH_MODELS,
    MAX_CAPTURE_SIZE,
    MOE_PAD_MASKED,
    PADDING_AT,
    PADDING_ROWS,
    PADS_BATCH,
    STRATEGIES,
    STRATEGY_NAMES,
    capture_sizes,
    graph_padded_len,
    graph_refusal,
    refusal_reason,
    refuses,
    QUANTS,
    moe_pad_masked,
    side_tensors,
    split_align,
)

TITLE = "vLLM 0.34"
SOURCE = ("vllm==0.34.0 wheel: vllm/v1/worker/gpu/pcp_manager.py, model_executor/layers/fused_moe/runner/"
          "moe_runner.py, fused_moe/router/")


def quantized_gather(quant: str) -> bool:
    """Whether the runner gathers the quantized rows and their scales in place of the
    rows: on a monolithic block-fp8 kernel (``moe_runner.py:820-842, 863-876``)."""
    return quant == "fp8_block_monolithic"
