"""SGLang 0.5.23's CP all-gather MoE path as an nsa_cp_comm round trip, on the engine's own [P, H] shards.

The engine pads each rank's rows to the physical length ``P`` once, at the
split (``layers/cp/padding.py`` ``pad_local_rows``), and keeps ``[P, H]``
through every layer: the MoE's all-gather takes that shard as it is and the
reduce-scatter returns one. So the round trip declares ``shard="padded"``: the
matrix hands ``gather`` the split's ``[P, H]`` shard (``P`` by the point's
engine, ``engine=sglang_0_5_23``) and holds the ``[P, H]`` that ``scatter``
returns to the engine's contract, padding rows included; nothing here adds or
removes a padding row. What the engine would not run on this path is refused
with the engine's reason (a ``skipped`` row).
"""

from __future__ import annotations

from nsa_cp_comm.impls import RoundTripImpl

from sglang_cp_plugin import engine

# The matrix's split policy -> the engine's strategy (layers/cp/base.py, ContextParallelStrategyKind).
STRATEGY = {"round_robin": "interleave", "zigzag": "zigzag"}


def physical_len(plan) -> int:
    """``P`` for this split, as the engine computes it when it builds the batch's metadata."""
    align = engine.get_cp_padding_align_size(plan.cp_size, STRATEGY.get(plan.policy, plan.policy))
    return engine.pad_logical_token_to_physical(plan.per_rank_tokens, align)


def supports(plan) -> str:
    """Why SGLang 0.5.23's all-gather MoE path would not run this plan ('' when it would)."""
    strategy, cp, lens = STRATEGY.get(plan.policy), plan.cp_size, list(plan.seq_lens)
    if strategy is None:
        return f"SGLang {engine.VERSION} has no {plan.policy} split (layers/cp/: zigzag, interleave)"
    if strategy == "zigzag" and not engine.zigzag_can_apply(lens, cp):
        return (f"ZigzagCPStrategy.can_apply refuses a request shorter than 2*cp = {2 * cp} (shortest {min(lens)}): "
                "the batch runs without CP")
    if strategy == "interleave" and not engine.interleave_can_apply(lens, cp):
        return f"InterleaveCPStrategy.can_apply refuses {sum(lens)} tokens at cp = {cp}: the batch runs without CP"
    if strategy == "zigzag":
        return ("zigzag DSA CP runs its MoE through DeepEP (arg_groups/model_overrides/deepseek_v2.py sets "
                "moe_a2a_backend=deepep): the all-gather MoE path is interleave's")
    want = engine.interleave_per_rank_actual_token(lens, cp)
    if list(plan.per_rank_tokens) != want:
        return (f"not SGLang {engine.VERSION}'s interleave split of the raw {sum(lens)} tokens (its ranks hold {want}, "
                f"this plan's {list(plan.per_rank_tokens)}: engine={plan.engine})")
    return ""


def gather(local, plan, group):
    # local: the split's [P, H] shard; the engine sizes the gather from it.
    return engine.attn_cp_interleave_gather(local, group)


def scatter(partials, plan, group):
    # [P*cp, H] -> this rank's [P, H], the padding rows summed like the rest.
    return engine.attn_cp_interleave_reduce_scatter(partials, group)


impl = RoundTripImpl(
    "sglang_cp", gather, scatter,
    layout="rank_major_padded",  # rank r's [P, H] shard at r * P
    shard="padded",  # takes and returns the split's [P, H]; the plan's engine owns P
    row_stride=physical_len,  # the engine's own P, held to the matrix's rule for the engine (physical_len)
    supports=supports,
    backends=("gloo", "nccl"),
    # pad_local_rows leaves a shard as it is where every rank's rows are already P: legacy's buffer
    legacy_bits_on_even=lambda plan: physical_len(plan) * plan.cp_size == plan.total_tokens,
    doc=f"SGLang {engine.VERSION}: attn_cp_interleave_gather / attn_cp_interleave_reduce_scatter on [P, H] shards",
)
