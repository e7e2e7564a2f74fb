"""vLLM 0.33's prefill context parallelism (PCP), read from its wheel (``vllm==0.33.0``:
``vllm/v1/worker/gpu/pcp_manager.py``, the MoE runner and routers, the models); lines are 0.33.0's.

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
- CUDA graphs (:func:`capture_sizes`, :func:`graph_refusal`): where the
  step runs in graphs, ``P`` is the capture size the dispatcher picked for
  the largest rank-local batch (``pcp_manager.py:426-440``
  ``get_num_tokens_for_dispatch``: max n_r, not the batch;
  ``model_runner.py:1812-1816``; ``pcp_manager.py:483-484``
  ``padded_num_tokens = batch_desc.num_tokens``): the smallest capture size
  ``>= max n_r`` (``v1/worker/gpu/cudagraph_utils.py:380-394``, ``:135``), an
  exact fit being its own bucket; past the largest the dispatcher returns
  ``CUDAGraphMode.NONE`` (``:547``) and the step runs eager at ``max n_r``
  (``pcp_manager.py:373-374``). A bucket smaller than ``max n_r`` is a
  ``ValueError`` (:func:`graph_padded_len`). Sparse MLA PCP with DCP 1
  refuses graphs except for ``model_type`` ``deepseek_v32`` and
  ``glm_moe_dsa`` (``pcp_manager.py:202-212``: "Set
  -cc.cudagraph_mode=NONE"), so DeepSeek-V3.2 runs its prefill in graphs by
  default and DeepSeek-V4 eager.
- What runs on the padding: attention masks it (``is_padding``; input ids and
  positions zeroed, ``pcp_manager.py:623-629``, so a padding row enters the
  model as token id 0 at position 0, every padding row the same;
  ``gathered_kv_write_mask`` keeps the padding out of the KV cache; the
  sparse-attention output of padding rows is zeroed,
  ``models/deepseek_v32/attention.py:655-656``): masked. The MoE
  (``model_executor/layers/fused_moe/runner/moe_runner.py:824-829, 853-861``):
  with pcp > 1 and no all2all kernels (no expert parallelism,
  ``fused_moe/config.py:1035-1038``; every expert is then sharded over the
  PCP ranks, ``:1106-1114, 1198-1226``), an equal ``all_gather(dim=0)`` of
  the padded shard and of the router logits (``[P, n_routed_experts]``, fp32
  for ``glm_moe_dsa``, ``deepseek_v2.py:139-142``, the activation dtype for
  DeepSeek-V3.2; DeepSeek-V4 asks fp32) before the experts and an equal
  ``reduce_scatter(dim=0)`` after: three collectives per layer. Whether the
  router masks the padding rows is the model's: only ``FusedTopKRouter`` /
  ``FusedTopKBiasRouter`` mask them (``fused_moe/router/fused_topk_router.py:19-23``,
  ``fused_topk_bias_router.py:28-32, 179``; ``VLLM_MOE_SKIP_PADDING``, on by
  default, ``envs.py:1642``), which DeepSeek-V4 gets
  (``models/deepseek_v4/nvidia/model.py:424-447``). DeepSeek-V3.2 and GLM-5
  build ``DeepseekV2MoE`` (``models/deepseek_v32/nvidia/model.py:98``;
  ``model_executor/models/deepseek_v2.py:383`` ``use_grouped_topk=True``,
  no ``skip_padding``) and get a ``GroupedTopKRouter``
  (``router/router_factory.py:166-212``), which masks only with
  ``skip_padding`` (``grouped_topk_router.py:351-360``), set only with
  DeepEP v2 kernels (``fused_moe/layer.py:327``), which need expert
  parallelism and so never take this gather: their experts process every
  padding row. ``all_gatherv`` / ``reduce_scatterv`` serve data parallelism
  only.

  What the MoE sees, DeepSeek-V3.2, PCP 2, ranks of 3 and 2 rows, eager::

    gathered [P*pcp, H]:   | a0 a1 a2 | b0 b1 t0 |      t0: token id 0's row
    router logits:         | la0 la1 la2 | lb0 lb1 lt0 | gathered the same way
    experts:               every row, t0 routed (GroupedTopKRouter, no mask)
    reduce-scatter:        rank 0 <- rows 0-2, rank 1 <- rows 3-5 (t0's dropped)

  The same for DeepSeek-V4, whose router masks the rows the runner marks
  (``is_padding`` over the gathered rows, rank-major, ``pcp_manager.py:630-635``)::

    is_padding [P*pcp]:    | F  F  F  | F  F  T  |
    experts:               rows 0-4; t0 to no expert (topk_ids -1)

- Quantized experts (``moe_quant``): block fp8 (DeepSeek-V3.2's checkpoint)
  changes what is gathered nowhere in 0.33: the runner gathers the
  activations, the kernel's prepare step quantizes the gathered rows (row by
  row, so the experts see each row as it would quantize alone). On a
  monolithic kernel (``fp8_block_monolithic``) the router logits go to the
  kernel as they are (``moe_runner.py:620-625``) and no router masks the
  padding rows, DeepSeek-V4's included.
- Refusals: ``maybe_build_pcp_manager`` builds no manager for pcp <= 1 (the
  batch runs without CP); every batch runs at pcp > 1.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from . import SideTensor
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
    for name, value in (("bucket", bucket), *((f"buckets[{i}]", b) for i, b in enumerate(buckets))):
        if value is not None and (not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name}={value!r} must be a positive int (a CUDA-graph capture size)")
    if bucket is not None:
        if bucket < need:
            raise ValueError(f"padded_num_tokens={bucket} is smaller than max(per_rank_num_tokens)={need}")
        return int(bucket)
    fits = [b for b in buckets if b >= need]
    return int(min(fits)) if fits else int(need)


# config/vllm.py:2463-2470, 2552: min(max_num_seqs * decode_query_len * 2, 512, max_num_batched_tokens):
# 512 with the defaults (max_num_seqs 1024 on a GPU of 70 GiB or more, engine/arg_utils.py:2979-2996);
# 1024 on data-center Blackwell (is_device_capability_family(100)), set max_capture_size=1024 there.
MAX_CAPTURE_SIZE = 512
# pcp_manager.py:202-212: the sparse MLA models whose PCP prefill may run in CUDA graphs (with DCP 1).
GRAPH_MODELS = ("deepseek_v32", "glm_moe_dsa")


def capture_sizes(most: int) -> tuple[int, ...]:
    """The default CUDA-graph capture sizes up to ``most`` (``config/vllm.py:2579-2590``):
    1, 2, 4, then every 8 below 256, then every 16 from 256 to ``most``."""
    head = [i for i in (1, 2, 4) if i <= most]
    return tuple(head + list(range(8, min(most + 1, 256), 8)) + list(range(256, most + 1, 16)))


def graph_refusal(model: str) -> str:
    if model in GRAPH_MODELS:
        return ""
    return ("MRV2 sparse MLA PCP supports CUDA graphs only for DeepSeek-V3.2 and GLM-5.2/5.3 "
            "(pcp_manager.py:202-212, 'Set -cc.cudagraph_mode=NONE')")


def side_tensors(model: str) -> tuple[SideTensor, ...]:
    """The router logits, gathered beside the hidden states (``moe_runner.py:829``):
    fp32 for GLM-5 and DeepSeek-V4, the activation dtype for DeepSeek-V3.2."""
    return (SideTensor("router_logits", "experts", 0 if model == "deepseek_v32" else 4),)


TITLE = "vLLM 0.33"
SOURCE = ("vllm==0.33.0 wheel: vllm/v1/worker/gpu/pcp_manager.py, model_executor/layers/fused_moe/runner/"
          "moe_runner.py, fused_moe/router/")
STRATEGIES = ("dual_chunk_swap",)
PADS_BATCH = False
ATTN_PAD_MASKED = True
# pcp_manager.py:623-629: padding slots take input id 0 and position 0, so every padding row is the same
# non-zero row (token 0's hidden state), not zeros.
PADDING_ROWS = "first_token"
# Only a FusedTopK(Bias)Router masks padding rows (see above): DeepSeek-V4's, not V3.2's or GLM-5's.
MOE_PAD_MASKED = {"deepseek_v32": False, "glm_moe_dsa": False, "deepseek_v4": True}
# The experts' quantizations modelled: bf16, and block fp8 on a modular or a monolithic kernel.
QUANTS = ("none", "fp8_block", "fp8_block_monolithic")


def moe_pad_masked(model: str, quant: str) -> bool:
    """Whether the router keeps the padding rows from the experts: the model's router
    (:data:`MOE_PAD_MASKED`), on a modular kernel only. A monolithic kernel is given the
    router logits and routes them itself (``moe_runner.py:620-625``): ``select_experts``,
    where the routers' padding mask is applied, never runs, for any model."""
    return MOE_PAD_MASKED[model] and quant != "fp8_block_monolithic"


def quantized_gather(quant: str) -> bool:
    """Whether the runner gathers quantized rows: never in 0.33 (``moe_runner.py:824-829``
    gathers the activations; the kernel's prepare step quantizes the gathered rows)."""
    return False
