"""Rank tasks of tests/lib/test_vllm_plugin.py: matrix points of the vLLM 0.33 PCP
plug-in (examples/vllm_pcp_plugin), as it is or broken the way serving code
broke at the boundary."""

from __future__ import annotations

import dataclasses
from pathlib import Path

try:
    import plugin_tasks
except ImportError:  # loaded by reference from a sweep in the repo root: impl=tests.vllm_plugin_tasks:...
    from tests import plugin_tasks

PLUGIN = Path(__file__).resolve().parents[1] / "examples" / "vllm_pcp_plugin"
REF = "vllm_pcp_plugin.adapter:impl"


def _broken(variant: str, impl):
    from vllm_pcp_plugin import adapter, engine

    if variant == "skip_on_empty":
        # vLLM #53573: metadata built on each rank alone; a rank a short prefill
        # left without rows decides it has nothing to gather and skips the collective
        def gather(local, plan, group):
            if plugin_tasks.rank_rows(plan, group) == 0:
                return local.new_zeros((local.shape[0] * plan.cp_size, *local.shape[1:]))
            return adapter.gather(local, plan, group)
        return dataclasses.replace(impl, gather=gather)
    if variant == "replicated_before_rs":
        # SGLang #35535: the shared expert's output, which every rank computed
        # whole, added to the partials before the reduce-scatter, which then
        # sums it over the ranks: counted cp times
        def scatter_replicated(partials, replicated, plan, group):
            return adapter.scatter(partials + replicated, plan, group)
        return dataclasses.replace(impl, scatter_replicated=scatter_replicated)
    if variant == "sglang_alignment":
        # P aligned to cp as SGLang's interleave aligns it, everywhere: the shard padded again, its stride declared
        def wrong_p(plan):
            return -(-adapter.physical_len(plan) // plan.cp_size) * plan.cp_size

        def gather(local, plan, group):
            padded = local.new_zeros((wrong_p(plan), local.shape[1]))
            padded[: local.shape[0]] = local
            return adapter.gather(padded, plan, group)
        return dataclasses.replace(impl, gather=gather, row_stride=wrong_p)
    if variant == "strips_padding":
        # the [n_r, H] protocol inside: the padding removed from the scatter's [P, H]
        def scatter(partials, plan, group):
            return adapter.scatter(partials, plan, group)[: plugin_tasks.rank_rows(plan, group)]
        return dataclasses.replace(impl, scatter=scatter)
    if variant == "unmasked_garbage":
        # the router mask dropped and the padding rows of the output left with what the experts made of them
        def scatter(partials, plan, group):
            out = engine.pcp_reduce_scatter(partials, group)
            out[plugin_tasks.rank_rows(plan, group):] = 1.0
            return out
        return dataclasses.replace(impl, scatter=scatter)
    if variant == "ignores_graphs":
        # P = max n_r everywhere, as if the step ran eager: the split's shard cut back to it
        def eager_p(plan):
            return max(plan.per_rank_tokens)

        def gather(local, plan, group):
            return adapter.gather(local[: eager_p(plan)], plan, group)
        return dataclasses.replace(impl, gather=gather, row_stride=eager_p)
    if variant == "masks_padding":
        # the router's mask applied to every model, as this plug-in did: the partials' padding rows
        # zeroed before the reduce-scatter, where DeepSeek-V3.2's experts process them
        def scatter(partials, plan, group):
            p = partials.shape[0] // plan.cp_size
            for r, n in enumerate(plan.per_rank_tokens):
                partials[r * p + n : (r + 1) * p] = 0
            return adapter.scatter(partials, plan, group)
        return dataclasses.replace(impl, scatter=scatter)
    if variant == "pads_into_a_real_row":
        # the padding rows' output summed into the rank's last real row (a residual or a combine
        # indexed past n_r): zero padding would add nothing
        def scatter(partials, plan, group):
            out = adapter.scatter(partials, plan, group)
            n = plugin_tasks.rank_rows(plan, group)
            if 0 < n < out.shape[0]:
                out[n - 1] += out[n:].sum(dim=0)
            return out
        return dataclasses.replace(impl, scatter=scatter)
    if variant == "packs_side_tensors":
        # vllm-ascend #16834's layout for what is gathered beside the rows (on vLLM 0.34's quantized
        # gather: the fp8 rows, their scales, the logits): packed, while the hidden states are padded
        from examples.field_bugs.bugs import packed_side

        return dataclasses.replace(impl, gather_side=packed_side)
    raise ValueError(variant)


def skip_on_empty():
    """The plug-in broken as vLLM #53573 broke serving code (``impl=tests.vllm_plugin_tasks:skip_on_empty``)."""
    plugin_tasks.on_path(PLUGIN)
    from vllm_pcp_plugin import adapter

    return _broken("skip_on_empty", adapter.impl)


def points(runs, backend):
    """``point_on_rank`` of each ``(spec, variant)``: the plug-in, or a broken copy of it."""
    return plugin_tasks.points(PLUGIN, REF, _broken, runs, backend)
