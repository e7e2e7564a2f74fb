"""Rank tasks of tests/lib/test_sglang_plugin.py: matrix points of the SGLang 0.5.23
plug-in (examples/sglang_cp_plugin), as it is or with one part broken the way
an adapter gets it wrong."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

import plugin_tasks

PLUGIN = Path(__file__).resolve().parents[1] / "examples" / "sglang_cp_plugin"
REF = "sglang_cp_plugin.adapter:impl"


def _broken(variant: str, impl):
    import torch.distributed as dist

    from sglang_cp_plugin import adapter, engine

    if variant == "strips_padding":
        # the [n_r, H] protocol inside: the split's padding removed from the scatter's shard
        def scatter(partials, plan, group):
            return adapter.scatter(partials, plan, group)[: plugin_tasks.rank_rows(plan, group)]
        return dataclasses.replace(impl, scatter=scatter)
    if variant == "wrong_p":
        # zigzag's 2*cp alignment on interleave, everywhere: the shard padded again to its P, its stride declared
        def wrong_p(plan):
            return engine.pad_logical_token_to_physical(plan.per_rank_tokens, 2 * plan.cp_size)

        def gather(local, plan, group):
            return adapter.gather(engine.pad_local_rows(local, plan.per_rank_tokens, wrong_p(plan)), plan, group)
        return dataclasses.replace(impl, gather=gather, row_stride=wrong_p)
    if variant == "garbage_padding":
        # the rows right, the [P, H] shard's padding rows left with something else
        def scatter(partials, plan, group):
            out = adapter.scatter(partials, plan, group).clone()
            out[plugin_tasks.rank_rows(plan, group):] = 1.0
            return out
        return dataclasses.replace(impl, scatter=scatter)
    if variant == "dirty_input_padding":
        # writes into the caller's shard: its padding rows
        def gather(local, plan, group):
            full = adapter.gather(local, plan, group)
            local[plugin_tasks.rank_rows(plan, group):] = 1.0
            return full
        return dataclasses.replace(impl, gather=gather)
    if variant in ("garbage_later", "garbage_in_round_trip"):
        # garbage in the padding from the third scatter on (the timed loop; the checked calls are right),
        # or in the second only (the checked round trip through the MoE; the probe before it is right)
        calls = [0]

        def scatter(partials, plan, group):
            out = adapter.scatter(partials, plan, group)
            calls[0] += 1
            if calls[0] > 2 if variant == "garbage_later" else calls[0] == 2:
                out[plugin_tasks.rank_rows(plan, group):] = 1e-6
            return out
        return dataclasses.replace(impl, scatter=scatter)
    if variant == "global_rank":
        # every rank's sums, then "my shard" picked with the global rank where the CP group's is meant
        def scatter(partials, plan, group):
            dist.all_reduce(partials, group=group)
            return partials.tensor_split(plan.cp_size)[dist.get_rank()]
        return dataclasses.replace(impl, scatter=scatter)
    if variant == "bits_always":
        # legacy's bits claimed on every even plan, also where P*cp > T
        return dataclasses.replace(impl, legacy_bits_on_even=True)
    if variant == "no_refusal":
        # runs zigzag (DeepEP's on the engine) instead of saying so
        return dataclasses.replace(impl, supports=None)
    raise ValueError(variant)


def points(runs, backend):
    """``point_on_rank`` of each ``(spec, variant)``: the plug-in, or a broken copy of it."""
    return plugin_tasks.points(PLUGIN, REF, _broken, runs, backend)


def shard_rows(rows: torch.Tensor, plan) -> torch.Tensor:
    """The engine's own padded shard of ``rows`` (``pad_local_rows``), for comparison."""
    plugin_tasks.on_path(PLUGIN)
    from sglang_cp_plugin import adapter, engine

    return engine.pad_local_rows(rows, plan.per_rank_tokens, adapter.physical_len(plan))
