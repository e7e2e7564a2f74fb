"""The catalog's implementations: ``twin``, a correct padded round trip written on
torch.distributed, and each tracker bug of :data:`examples.field_bugs.BUGS` as that
round trip with the one mistake the engine made (its name is the entry's).

Run by reference: ``python -m matrix impl=examples.field_bugs.bugs:ceil_pad`` from
the checkout (``+matrix=field_bugs`` runs them all).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from nsa_cp_comm.collectives import all_gather_into, reduce_scatter_into
from nsa_cp_comm.impls import RoundTripImpl

from . import unsorted_listing


# --- the twin: right ------------------------------------------------------------------

def _block(local: torch.Tensor, rows: int) -> torch.Tensor:
    """``local`` padded with zero rows to ``rows``."""
    block = local.new_zeros((rows, local.shape[1]))
    block[: local.shape[0]].copy_(local)
    return block


def _gather(local, plan, group):
    # every shard padded to the longest rank m, gathered rank-major into [m*cp, H]
    m = plan.max_rank_len
    full = local.new_empty((m * plan.cp_size, local.shape[1]))
    all_gather_into(full, _block(local, m), group)
    return full


def _scatter(full, plan, group):
    # the partials summed over the ranks, m rows each, this rank's n_r of them kept
    rank, m = dist.get_rank(group), plan.max_rank_len
    out = full.new_empty((m, full.shape[1]))
    reduce_scatter_into(out, full.contiguous(), group)
    return out[: plan.per_rank_tokens[rank]]


def _padding_rows(plan):
    # the gathered buffer's padding rows, rank-major (rows >= n_r in each rank's block of m), as vLLM
    # marks them for a router that masks what it is told (DeepSeek-V4's)
    return (torch.arange(plan.max_rank_len) >= torch.tensor(plan.per_rank_tokens)[:, None]).flatten()


def _own_rows(replicated, plan, group):
    rank, m = dist.get_rank(group), plan.max_rank_len
    return replicated[rank * m : rank * m + plan.per_rank_tokens[rank]]


def then_replicated(scatter):
    """``scatter``'s result with this rank's rows of the replicated shared expert added once, after the
    sum: the right place, whatever ``scatter`` itself gets wrong."""
    def scatter_replicated(partials, replicated, plan, group):
        return scatter(partials, plan, group) + _own_rows(replicated, plan, group)
    return scatter_replicated


twin = RoundTripImpl("field_bugs_twin", _gather, _scatter, scatter_replicated=then_replicated(_scatter),
                     is_padding=_padding_rows,
                     doc="the catalog's correct padded round trip: each bug is this with one mistake")


def _bug(name: str, doc: str, **parts) -> RoundTripImpl:
    """The twin with ``parts`` replaced; a replaced ``scatter`` is also the replicated step's (the term
    added after it, :func:`then_replicated`) unless ``parts`` replaces that too."""
    if "scatter" in parts:
        parts.setdefault("scatter_replicated", then_replicated(parts["scatter"]))
    return dataclasses.replace(twin, name=f"field_bugs_{name}", doc=doc, **parts)


# --- SGLang #24560: the wrong process group ------------------------------------------------

def _world_gather(local, plan, group):
    # Mistake: group=None, the default group, where the CP group was meant.
    m = plan.max_rank_len
    full = local.new_empty((m * plan.cp_size, local.shape[1]))
    all_gather_into(full, _block(local, m), None)
    return full


wrong_group = _bug("wrong_group", "the gather on the default group (SGLang #24560)", gather=_world_gather)


# --- SGLang #18280, vLLM #53573, vllm-ascend #12009, SGLang #22003: an empty rank returns early -----

def _early_gather(local, plan, group):
    # Mistake: "nothing to gather" on a rank without rows; its peers wait for it in the all-gather.
    if local.shape[0] == 0:
        return local.new_zeros((plan.max_rank_len * plan.cp_size, local.shape[1]))
    return _gather(local, plan, group)


empty_rank_returns = _bug("empty_rank_returns", "a rank with no rows skips the gather (SGLang #18280)",
                          gather=_early_gather)


# --- SGLang #35535: a replicated shared expert summed cp times -----------------------------------

def _shared_before(partials, replicated, plan, group):
    # Mistake: the replicated term added to the partials, so the reduce-scatter sums it on every rank.
    return _scatter(partials + replicated, plan, group)


shared_before_rs = _bug("shared_before_rs", "the replicated shared expert added before the reduce-scatter "
                        "(SGLang #35535)", scatter_replicated=_shared_before)


# --- SGLang #23269: the pad target is ceil(T/cp) ---------------------------------------------------

def _ceil_target(plan) -> int:
    return -(-plan.total_tokens // plan.cp_size)


def _ceil_gather(local, plan, group):
    # Mistake: pad to ceil(T/cp); a rank longer than that is not padded (the pad is a no-op) and
    # sends more rows than its peers.
    target = _ceil_target(plan)
    full = local.new_empty((target * plan.cp_size, local.shape[1]))
    block = _block(local, target) if local.shape[0] <= target else local
    all_gather_into(full, block, group)
    return full


def _ceil_scatter(full, plan, group):
    rank, target = dist.get_rank(group), _ceil_target(plan)
    out = full.new_empty((target, full.shape[1]))
    reduce_scatter_into(out, full.contiguous(), group)
    return out[: plan.per_rank_tokens[rank]]


ceil_pad = _bug("ceil_pad", "shards padded to ceil(T/cp) rows (SGLang #23269)", gather=_ceil_gather,
                scatter=_ceil_scatter)


# --- SGLang #20360: a wrong reduce-scatter ---------------------------------------------------------

def _own_stride_scatter(full, plan, group):
    # Mistake: the summed buffer read at rank * n_r, the rank's unpadded stride, not rank * m.
    rank = dist.get_rank(group)
    summed = full.contiguous().clone()
    dist.all_reduce(summed, group=group)
    n = plan.per_rank_tokens[rank]
    return summed[rank * n : rank * n + n]


own_stride_scatter = _bug("own_stride_scatter", "the scatter's rows read at rank * n_r (SGLang #20360)",
                          scatter=_own_stride_scatter)


# --- SGLang #21170: a residual sized by the gathered rows ------------------------------------------

def _residual_scatter(full, plan, group):
    # Mistake: the residual kept for the layer's add is sized by the gathered rows (m*cp), not the
    # rank's n_r: the add fails on every rank of a CP group.
    residual = full.new_zeros((full.shape[0], full.shape[1]))
    return _scatter(full, plan, group) + residual


residual_gathered_rows = _bug("residual_gathered_rows", "a residual of the gathered rows added to the "
                              "rank's rows (SGLang #21170)", scatter=_residual_scatter)


# --- SGLang #30895: padding rows left non-zero -------------------------------------------------------

def _copy_pad_gather(local, plan, group):
    # Mistake: the tail padded with copies of the last real row (what the buffer held after the
    # shared-expert merge), not zeros: the MoE and the reduce-scatter see them.
    m = plan.max_rank_len
    block = _block(local, m)
    if 0 < local.shape[0] < m:
        block[local.shape[0]:] = local[-1]
    full = local.new_empty((m * plan.cp_size, local.shape[1]))
    all_gather_into(full, block, group)
    return full


nonzero_padding = _bug("nonzero_padding", "padding rows copies of the last real row (SGLang #30895)",
                       gather=_copy_pad_gather)


# --- vLLM 0.33 parallel_state.py:2257: a group listed unsorted ---------------------------------------

def _listed_rank(group) -> int:
    # Mistake: this rank's index in the group as listed ([0, 2, 1, 3]), where the collectives order
    # the members by rank (dist.get_rank(group)).
    return unsorted_listing(dist.get_world_size(group)).index(dist.get_rank(group))


def _listed_scatter(full, plan, group):
    m = plan.max_rank_len
    out = full.new_empty((m, full.shape[1]))
    reduce_scatter_into(out, full.contiguous(), group)
    return out[: plan.per_rank_tokens[_listed_rank(group)]]


def _listed_replicated(partials, replicated, plan, group):
    rank, m = dist.get_rank(group), plan.max_rank_len
    n = plan.per_rank_tokens[_listed_rank(group)]
    return _listed_scatter(partials, plan, group) + replicated[rank * m : rank * m + n]


unsorted_group = _bug("unsorted_group", "the rank's row count read at its index in an unsorted listing of "
                      "the group (vLLM 0.33)", scatter=_listed_scatter, scatter_replicated=_listed_replicated)


# --- TE #3331, SGLang #23415: padded and unpadded lengths confused -----------------------------------

def _padded_length_scatter(full, plan, group):
    # Mistake: the padded length m returned where the rank's n_r rows were meant.
    m = plan.max_rank_len
    out = full.new_empty((m, full.shape[1]))
    reduce_scatter_into(out, full.contiguous(), group)
    return out


def _padded_length_replicated(partials, replicated, plan, group):
    rank, m = dist.get_rank(group), plan.max_rank_len
    return _padded_length_scatter(partials, plan, group) + replicated[rank * m : (rank + 1) * m]


padded_length_returned = _bug("padded_length_returned", "the scatter returns m rows, not n_r (TE #3331)",
                              scatter=_padded_length_scatter, scatter_replicated=_padded_length_replicated)


# --- TE #3536: an all-zero output ------------------------------------------------------------------

def _zero_scatter(full, plan, group):
    # Mistake: the collective's output buffer returned before anything was written to it (zeroed),
    # the kernel never run; a check against the same backend's own output cannot see it.
    rank = dist.get_rank(group)
    return full.new_zeros((plan.per_rank_tokens[rank], full.shape[1]))


# --- vllm-ascend #16834: a side tensor gathered in another layout ----------------------------------

def packed_side(tensor, plan, group):
    """The side tensor gathered packed (rank r's rows at sum(n_<r)) while the hidden states are gathered
    rank-major padded (rank r at r*m): the same on plans where no rank with rows follows a short one."""
    cp, m = plan.cp_size, plan.max_rank_len
    received = tensor.new_empty((m * cp, tensor.shape[1]))
    all_gather_into(received, _block(tensor, m), group)
    out = tensor.new_zeros((m * cp, tensor.shape[1]))
    at = 0
    for r, n in enumerate(plan.per_rank_tokens):
        out[at : at + n] = received[r * m : r * m + n]
        at += n
    return out


side_layout = _bug("side_layout", "the router logits gathered packed, the rows padded (vllm-ascend #16834)",
                   gather_side=packed_side)


# --- SGLang #31838, vLLM #38128: padding rows routed to the same experts ----------------------------

def _no_padding_marked(plan):
    # Mistake: the padding mask left unset (all False): the router routes every padding row, and
    # identical rows all go to the same experts.
    return torch.zeros(plan.max_rank_len * plan.cp_size, dtype=torch.bool)


padding_unmarked = _bug("padding_unmarked", "the gathered padding rows left unmarked for the router "
                        "(SGLang #31838)", is_padding=_no_padding_marked)


all_zero_output = _bug("all_zero_output", "the scatter returns zeros (TE #3536)", scatter=_zero_scatter,
                       scatter_replicated=lambda p, r, plan, g: _zero_scatter(p, plan, g))
