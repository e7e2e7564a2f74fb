"""Alternatives to the padded round trip, measured side by side with it.

FULL mode (the all-gather MoE path), same contract as :mod:`.roundtrip`
(``(tensor, plan, group=None)``, every size from the shared plan):

- ``sumlen_allreduce``: each rank writes its rows at ``plan.rank_offset(rank)``
  of a zero-filled ``[T, H]`` buffer and all-reduces it (the gather); the way
  back all-reduces the ``[T, H]`` partials and slices this rank's rows. No
  padding rows, but an all-reduce moves about twice an all-gather's bytes.
- ``allgatherv``: list ``all_gather`` / list ``reduce_scatter`` with per-rank
  sizes into / out of a packed ``[T, H]`` buffer. torch's NCCL backend turns
  uneven lists into coalesced broadcasts / reduces; gloo refuses uneven
  all-gathers, so this one is NCCL-only.

SCATTERED mode (the MoE a2a path, ``moe_a2a_backend=deepep``):

- ``a2a``: a **stand-in for DeepEP**: dispatch each token to the ranks owning
  its top-k experts and combine the weighted expert outputs back, with
  ``dist.all_to_all_single`` and per-rank split sizes, under the reference
  MoE's routing. DeepEP proper (NVLink/RDMA buffers, one GPU per rank) is used
  by serving code; it is not installed here: the figures are the stand-in's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .plan import CPPlan
from .roundtrip import _check


# ---------------------------------------------------------------------------
# sumlen_allreduce
# ---------------------------------------------------------------------------


def sumlen_gather(
    local: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None, *, check: bool = True
) -> torch.Tensor:
    """``[n_r, H]`` per rank -> packed ``[T, H]``: zero-filled buffer, this
    rank's rows at ``plan.rank_offset(rank)``, all-reduce (sum). Exact: every
    element is one rank's value plus zeros."""
    rank = _check("sumlen_gather local", local, plan, "local", group)
    n = plan.per_rank_tokens[rank]
    full = torch.zeros((plan.total_tokens, local.shape[1]), dtype=local.dtype, device=local.device)
    off = plan.rank_offset(rank)
    full[off : off + n].copy_(local)
    dist.all_reduce(full, group=group)
    return full


def sumlen_scatter(
    full: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None, *, check: bool = True
) -> torch.Tensor:
    """Sum packed ``[T, H]`` partials over ranks (all-reduce, in place) and
    return this rank's ``[n_r, H]`` rows (a view)."""
    rank = _check("sumlen_scatter full", full, plan, "legacy_full", group)
    full = full.contiguous()
    dist.all_reduce(full, group=group)
    off = plan.rank_offset(rank)
    return full[off : off + plan.per_rank_tokens[rank]]


# ---------------------------------------------------------------------------
# allgatherv (NCCL only)
# ---------------------------------------------------------------------------


def allgatherv_gather(
    local: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None, *, check: bool = True
) -> torch.Tensor:
    """``[n_r, H]`` per rank -> packed ``[T, H]`` with one list ``all_gather``
    whose outputs are the per-rank row ranges of the buffer (views)."""
    _check("allgatherv_gather local", local, plan, "local", group)
    full = torch.empty((plan.total_tokens, local.shape[1]), dtype=local.dtype, device=local.device)
    dist.all_gather(list(full.split(list(plan.per_rank_tokens))), local.contiguous(), group=group)
    return full


def allgatherv_scatter(
    full: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None, *, check: bool = True
) -> torch.Tensor:
    """Sum packed ``[T, H]`` partials over ranks with one list
    ``reduce_scatter`` of per-rank sizes; returns a fresh ``[n_r, H]``."""
    rank = _check("allgatherv_scatter full", full, plan, "legacy_full", group)
    full = full.contiguous()
    out = torch.empty((plan.per_rank_tokens[rank], full.shape[1]), dtype=full.dtype, device=full.device)
    dist.reduce_scatter(out, list(full.split(list(plan.per_rank_tokens))), group=group)
    return out


# ---------------------------------------------------------------------------
# a2a: dispatch / combine (stand-in for DeepEP)
# ---------------------------------------------------------------------------


@dataclass
class A2AHandle:
    """What the combine needs from the dispatch (DeepEP's "handle").

    ``send_token[j]`` is the local row sent as the ``j``-th dispatched row
    (grouped by destination rank, ascending rank); ``send_splits[d]`` rows went
    to rank ``d``, ``recv_splits[s]`` rows came from rank ``s``. ``recv_idx`` /
    ``recv_weight`` are the received rows' top-k expert ids and weights."""

    n_local: int
    send_token: torch.Tensor
    send_splits: list[int]
    recv_splits: list[int]
    recv_idx: torch.Tensor
    recv_weight: torch.Tensor

    @property
    def rows_sent(self) -> int:
        return sum(self.send_splits)

    @property
    def rows_received(self) -> int:
        return sum(self.recv_splits)


def a2a_layout(idx: torch.Tensor, experts_per_rank: int, cp_size: int) -> tuple[torch.Tensor, list[int]]:
    """``(send_token, send_splits)`` for top-k expert ids ``idx`` ``[n, k]``: a
    token goes **once** to every rank owning at least one of its experts
    (DeepEP's dispatch layout), rows grouped by destination rank."""
    n = idx.shape[0]
    mask = torch.zeros((cp_size, n), dtype=torch.bool, device=idx.device)
    if n:
        mask.scatter_(0, (idx // experts_per_rank).t().contiguous(), True)
    _, send_token = mask.nonzero(as_tuple=True)  # row-major: grouped by rank, tokens ascending
    return send_token, mask.sum(dim=1).tolist()


def a2a_dispatch(
    local: torch.Tensor,
    idx: torch.Tensor,
    weight: torch.Tensor,
    experts_per_rank: int,
    group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, A2AHandle]:
    """Send each of this rank's ``[n_r, H]`` rows to the ranks that own its
    experts. Three ``all_to_all_single``: the counts (DeepEP's notify), the
    rows, and their routing (expert ids and weights, packed in one float32
    tensor; ids < 2**24 are exact). Returns the received ``[R, H]`` rows,
    source-rank-major, and the handle for :func:`a2a_combine`."""
    cp = dist.get_world_size(group)
    device = local.device
    send_token, send_splits = a2a_layout(idx, experts_per_rank, cp)
    counts = torch.tensor(send_splits, dtype=torch.int64, device=device)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)
    recv_splits = recv_counts.tolist()
    rows = sum(recv_splits)
    x_recv = torch.empty((rows, local.shape[1]), dtype=local.dtype, device=device)
    dist.all_to_all_single(x_recv, local.index_select(0, send_token), recv_splits, send_splits, group=group)
    k = idx.shape[1]
    meta = torch.cat([idx.index_select(0, send_token).to(torch.float32), weight.index_select(0, send_token)], dim=1)
    meta_recv = torch.empty((rows, 2 * k), dtype=torch.float32, device=device)
    dist.all_to_all_single(meta_recv, meta.contiguous(), recv_splits, send_splits, group=group)
    handle = A2AHandle(
        n_local=local.shape[0],
        send_token=send_token,
        send_splits=send_splits,
        recv_splits=recv_splits,
        recv_idx=meta_recv[:, :k].to(torch.int64),
        recv_weight=meta_recv[:, k:].contiguous(),
    )
    return x_recv, handle


def a2a_experts(moe, x_recv: torch.Tensor, handle: A2AHandle, experts: range) -> torch.Tensor:
    """This rank's experts on the received rows, weighted by the dispatched
    routing, summed per row in float32, returned in ``x_recv.dtype`` (DeepEP
    combines in the activation dtype). Rows routed to none of ``experts``
    (impossible after a correct dispatch) stay zero."""
    seen = moe.expert_input(x_recv)  # what the experts compute on (quantized, where the point says)
    return moe.experts_on(seen, handle.recv_idx, handle.recv_weight, experts).to(x_recv.dtype)


def a2a_combine(y_recv: torch.Tensor, handle: A2AHandle, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Send the received rows' expert outputs back to their source ranks (the
    dispatch's splits reversed) and sum each token's contributions (float32
    accumulation). Returns this rank's ``[n_r, H]`` in ``y_recv.dtype``."""
    back = torch.empty((handle.rows_sent, y_recv.shape[1]), dtype=y_recv.dtype, device=y_recv.device)
    dist.all_to_all_single(back, y_recv.contiguous(), handle.send_splits, handle.recv_splits, group=group)
    out = torch.zeros((handle.n_local, y_recv.shape[1]), dtype=torch.float32, device=y_recv.device)
    out.index_add_(0, handle.send_token, back.to(torch.float32))
    return out.to(y_recv.dtype)


def a2a_expected_recv(shards: list[torch.Tensor], moe, rank: int) -> torch.Tensor:
    """The rows ``rank`` must receive from a correct dispatch, computed from
    every rank's shard without communication (routing is per row, hence the
    same everywhere): source-rank-major, tokens ascending, once per token."""
    cp = len(shards)
    per = moe.num_experts // cp
    parts = []
    for shard in shards:
        if shard.shape[0] == 0:
            continue
        idx, _ = moe.route(shard)
        hit = ((idx // per) == rank).any(dim=1)
        parts.append(shard[hit])
    if not parts:
        return shards[0].new_empty((0, shards[0].shape[1]))
    return torch.cat(parts)
