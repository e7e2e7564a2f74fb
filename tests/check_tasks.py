"""Rank tasks of tests/test_checks.py: run a matrix point's rank side with one
part of an implementation deliberately broken, and return its reports."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

import nsa_cp_comm.harness.checks as checks
import nsa_cp_comm.roundtrip as roundtrip
from nsa_cp_comm import alternatives, impls
from nsa_cp_comm.communicator import CPLayerCommunicator
from nsa_cp_comm.collectives import all_gather_into
from nsa_cp_comm.harness.measure import point_on_rank


def _stage_offset_by_one(full, local, plan, rank):
    m, n = plan.max_rank_len, plan.per_rank_tokens[rank]
    full[rank * m : (rank + 1) * m].zero_()
    if n:
        # one row late (wrapping inside the block): a block at the wrong offset
        full[rank * m : (rank + 1) * m][torch.arange(n).add(1).remainder(m)] = local


def _stage_nonzero_pad(full, local, plan, rank):
    m, n = plan.max_rank_len, plan.per_rank_tokens[rank]
    full[rank * m : rank * m + n].copy_(local)
    full[rank * m + n : (rank + 1) * m].fill_(1.0)


def _scatter_wrong_chunk(full, plan, group=None, check=True):
    rank = dist.get_rank(group)
    full = full.contiguous()
    chunks = full.tensor_split(plan.cp_size)
    roundtrip.reduce_scatter_into(chunks[rank], full, group)
    other = (rank + 1) % plan.cp_size
    return chunks[other][: plan.per_rank_tokens[rank]] if plan.cp_size > 1 else chunks[rank][: plan.per_rank_tokens[rank]] + 1


def _scatter_one_ulp_off(full, plan, group=None, check=True):
    out = roundtrip.padded_scatter(full, plan, group, check=check)
    if out.numel():
        out.view(-1)[0] = torch.nextafter(out.view(-1)[0], torch.tensor(float("inf"), dtype=out.dtype))
    return out


def _scatter_stepwise_sum(full, plan, group=None, check=True):
    """Sums the ranks' partials one by one in the activation dtype, rounding
    after each step, last rank first: within every tolerance, exact on the
    probes (one non-zero term), but not the collective's bits."""
    rank, cp = dist.get_rank(group), plan.cp_size
    parts = torch.empty((cp * full.shape[0], full.shape[1]), dtype=full.dtype, device=full.device)
    all_gather_into(parts, full.contiguous(), group)
    mine = [p.tensor_split(cp)[rank] for p in parts.tensor_split(cp)]
    acc = mine[-1].clone()
    for p in reversed(mine[:-1]):
        acc = acc + p
    return acc[: plan.per_rank_tokens[rank]]


def _gather_mutates_input(local, plan, group=None, check=True):
    full = roundtrip.padded_gather(local, plan, group, check=check)
    local.mul_(2)  # in place on the caller's rows
    return full


def _legacy_accepts_uneven(local, plan, group=None, check=True):
    return roundtrip.padded_gather(local, plan, group, check=check)


def _legacy_refuses_late(local, plan, group=None, check=True):
    t = torch.zeros(plan.cp_size, dtype=torch.float32, device=local.device)
    all_gather_into(t, t[dist.get_rank(group) : dist.get_rank(group) + 1], group)  # a collective first
    raise ValueError(roundtrip.LEGACY_UNEVEN_ERROR)


def _legacy_wrong_text(local, plan, group=None, check=True):
    raise ValueError("uneven shards")


class _CopyingCommunicator(CPLayerCommunicator):
    def prepare_mlp(self, hidden):
        return hidden.clone()  # "moves" rows in SCATTERED mode: not a pass-through


def _dispatch_drops_a_row(local, idx, weight, experts_per_rank, group=None):
    x_recv, handle = alternatives.a2a_dispatch(local, idx, weight, experts_per_rank, group)
    if x_recv.shape[0]:
        x_recv = x_recv.clone()
        x_recv[-1].zero_()
    return x_recv, handle


MUTATIONS = {
    # name: (impl to replace, field, replacement) or (module attribute, replacement)
    "offset_by_one": ("roundtrip", "padded_stage", _stage_offset_by_one),
    "nonzero_pad": ("roundtrip", "padded_stage", _stage_nonzero_pad),
    "wrong_chunk": ("padded", "scatter", _scatter_wrong_chunk),
    "one_ulp_off": ("padded", "scatter", _scatter_one_ulp_off),
    "stepwise_sum": ("padded", "scatter", _scatter_stepwise_sum),
    "mutates_input": ("padded", "gather", _gather_mutates_input),
    "legacy_accepts_uneven": ("legacy", "gather", _legacy_accepts_uneven),
    "legacy_refuses_late": ("legacy", "gather", _legacy_refuses_late),
    "legacy_wrong_text": ("legacy", "gather", _legacy_wrong_text),
    "passthrough_copies": ("checks", "CPLayerCommunicator", _CopyingCommunicator),
    "dispatch_drops_a_row": ("a2a", "dispatch", _dispatch_drops_a_row),
}
MODULES = {"roundtrip": roundtrip, "checks": checks}


def point_with_mutation(spec, backend, mutation):
    """``point_on_rank`` with one mutation applied on this rank, then undone."""
    where, attr, repl = MUTATIONS[mutation] if mutation != "none" else (None, None, None)
    saved = None
    if where in MODULES:
        saved = getattr(MODULES[where], attr)
        setattr(MODULES[where], attr, repl)
    elif where is not None:
        saved = impls.REGISTRY[where]
        impls.REGISTRY[where] = dataclasses.replace(saved, **{attr: repl})
    try:
        return point_on_rank(spec, backend)
    finally:
        if where in MODULES:
            setattr(MODULES[where], attr, saved)
        elif where is not None:
            impls.REGISTRY[where] = saved
