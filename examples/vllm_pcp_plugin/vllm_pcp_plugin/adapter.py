"""vLLM 0.33's PCP all-gather MoE path as an nsa_cp_comm round trip, on the engine's own [P, H] shards.

vLLM pads every rank's rows to ``padded_num_tokens = max(per_rank_num_tokens)``
once, when it partitions the batch (``pcp_manager.py`` ``_build_batch_layout``,
with an ``is_padding`` mask), and keeps ``[P, H]`` through the layer: the MoE's
all-gather takes that shard as it is and the reduce-scatter returns one. So
the round trip declares ``shard="padded"``: the matrix hands ``gather`` the
split's ``[P, H]`` shard (``P`` by the point's engine, ``engine=vllm_0_33``)
and holds the ``[P, H]`` that ``scatter`` returns, padding rows included:
where the step runs in CUDA graphs (the plan's ``max_capture_size``), ``P``
is the capture bucket of the longest rank. The padding rows hold what vLLM
puts there (token id 0's row, every one the same), and the router's padding
mask is the model's and acts before the experts (the matrix's MoE follows it:
DeepSeek-V4 masks them, DeepSeek-V3.2 and GLM-5 route them), so the
reduce-scatter sums the partials as they come. A rank left without rows by a
short prefill still enters both collectives (vLLM gives it an empty
segment). What vLLM would not run on this path is refused with its reason (a
``skipped`` row). The router logits go through the same all-gather as the
hidden states (``moe_runner.py:828-829``: ``gather_side``), and the matrix
routes the experts from what comes back; the padding mask over the gathered
rows (``is_padding``, ``pcp_manager.py:630-635``) is the runner's, built as
vLLM builds it, and a model whose router masks padding masks the rows it names.
vLLM 0.34 on a monolithic block-fp8 kernel (``engine=vllm_0_34
moe_quant=fp8_block_monolithic``) quantizes each rank's rows before the
gather (``moe_runner.py:863-876``): the runner, which the matrix plays, hands
``gather_side`` the fp8 rows (their bytes), their scales and the logits, in
that order, and each goes through the same all-gather.
"""

from __future__ import annotations

from nsa_cp_comm.impls import RoundTripImpl

from vllm_pcp_plugin import engine


def physical_len(plan) -> int:
    """``P`` for this split, as vLLM computes it when it partitions the batch (the
    CUDA-graph bucket of the longest rank where the step runs in graphs)."""
    per_rank = engine.per_rank_num_tokens(plan.seq_lens, plan.cp_size)
    return engine.padded_num_tokens(per_rank, engine.graph_bucket(max(per_rank), getattr(plan, "max_capture_size", 0)))


def supports(plan) -> str:
    """Why vLLM 0.33's PCP all-gather MoE path would not run this plan ('' when it would)."""
    if plan.policy != "dual_chunk_swap":
        return f"vLLM {engine.VERSION} PCP has no {plan.policy} split (pcp_manager.py: DualChunkSwap only)"
    if plan.cp_size <= 1:
        return "maybe_build_pcp_manager builds no PCP manager at prefill_context_parallel_size=1"
    want = engine.per_rank_num_tokens(plan.seq_lens, plan.cp_size)
    if list(plan.per_rank_tokens) != want:
        return (f"not vLLM {engine.VERSION}'s DualChunkSwap split of the raw {sum(plan.seq_lens)} tokens (its ranks "
                f"hold {want}, this plan's {list(plan.per_rank_tokens)}: engine={plan.engine})")
    return ""


def is_padding(plan):
    # the gathered [P*cp] rows' padding mask, rank-major, as the runner builds it for the router
    return engine.moe_is_padding(engine.per_rank_num_tokens(plan.seq_lens, plan.cp_size), physical_len(plan))


def gather(local, plan, group):
    # local: the split's [P, H] shard, padding rows included; the gather is sized from it.
    return engine.pcp_all_gather(local, group)


def scatter(partials, plan, group):
    # [P*cp, H] -> this rank's [P, H], padding rows summed as they are: the router
    # masked them before the experts where the model's router does.
    return engine.pcp_reduce_scatter(partials, group)


impl = RoundTripImpl(
    "vllm_pcp", gather, scatter,
    layout="rank_major_padded",  # rank r's [P, H] shard at r * P
    shard="padded",  # takes and returns the split's [P, H]; the plan's engine owns P
    row_stride=physical_len,  # vLLM's own P, held to the matrix's rule for the engine (physical_len)
    supports=supports,
    gather_side=gather,  # the router logits (and 0.34's fp8 rows and scales), all-gathered as the rows are
    is_padding=is_padding,  # the runner's padding mask over the gathered rows, for the router
    backends=("gloo", "nccl"),
    # P = max n_r: on an even plan no rank is padded, and the buffer is legacy's
    legacy_bits_on_even=lambda plan: physical_len(plan) * plan.cp_size == plan.total_tokens,
    doc=f"vLLM {engine.VERSION}: pcp all_gather(dim=0) / reduce_scatter(dim=0) on [P, H] shards (P: max n_r or "
        "the CUDA-graph bucket)",
)
