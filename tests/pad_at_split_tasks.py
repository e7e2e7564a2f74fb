"""Rank tasks of tests/lib/test_pad_at_split.py: a matrix point's rank side with
one part of the pad_at_split implementation deliberately broken."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from nsa_cp_comm import impls, production
from nsa_cp_comm import pad_at_split as pas
from nsa_cp_comm.plan import ceil_align
from nsa_cp_comm.harness.measure import point_on_rank


def _gather_dirty_padding(local, plan, group=None, check=True):
    full = pas.pad_at_split_gather(local, plan, group, check=check)
    p = pas.physical_len(plan)
    for r, n in enumerate(plan.per_rank_tokens):
        full[r * p + n : (r + 1) * p] = 1.0  # padding rows the MoE would sum
    return full


def _gather_at_max_rank_len(local, plan, group=None, check=True):
    # the padded communicator's stride m instead of the engine's P: rows land early
    full = pas.pad_at_split_gather(local, plan, group, check=check)
    m, p = plan.max_rank_len, pas.physical_len(plan)
    out = torch.zeros_like(full)
    for r, n in enumerate(plan.per_rank_tokens):
        out[r * m : r * m + n] = full[r * p : r * p + n]
    return out


def _scatter_keeps_padding(full, plan, group=None, check=True):
    rank = dist.get_rank(group)
    full = full.contiguous()
    chunk = full.tensor_split(plan.cp_size)[rank]
    pas.reduce_scatter_into(chunk, full, group)
    return chunk  # [P, H]: the padding rows handed back as this rank's rows


def _gather_mutates_input(local, plan, group=None, check=True):
    full = pas.pad_at_split_gather(local, plan, group, check=check)
    local.zero_()
    return full


def _p_aligned_to_cp(plan):
    # the alignment cp where the engine's rule has 2*cp (zigzag): P wrong in the
    # gather, the scatter, the declared stride and the production form alike
    return ceil_align(plan.max_rank_len, plan.cp_size)


def _supports_even_only(plan):
    # a plan the implementation's engine would not run: skipped with its reason, not an error
    return "" if plan.is_even else f"uneven plan {list(plan.per_rank_tokens)}: not this engine's"


MUTATIONS = {
    "supports_even_only": ("supports", _supports_even_only),
    # legacy's bits claimed on every even plan, also where P*cp > T (its buffer is not legacy's)
    "bits_always": ("legacy_bits_on_even", True),
    "dirty_padding": ("gather", _gather_dirty_padding),
    "stride_m": ("gather", _gather_at_max_rank_len),
    "keeps_padding": ("scatter", _scatter_keeps_padding),
    "mutates_input": ("gather", _gather_mutates_input),
}


def point_with_mutation(spec, backend, mutation):
    """``point_on_rank`` with pad_at_split's ``gather`` or ``scatter`` replaced on this rank."""
    saved = impls.REGISTRY["pad_at_split"]
    saved_p = pas.physical_len
    if mutation == "wrong_p_everywhere":
        pas.physical_len = production.physical_len = _p_aligned_to_cp
        impls.REGISTRY["pad_at_split"] = dataclasses.replace(saved, row_stride=_p_aligned_to_cp)
    elif mutation != "none":
        attr, repl = MUTATIONS[mutation]
        impls.REGISTRY["pad_at_split"] = dataclasses.replace(saved, **{attr: repl})
    try:
        return point_on_rank(spec, backend)
    finally:
        impls.REGISTRY["pad_at_split"] = saved
        pas.physical_len = production.physical_len = saved_p
