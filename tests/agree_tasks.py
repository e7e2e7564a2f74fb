"""Rank tasks of tests/lib/test_agree.py: one rank passes a bad input."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from nsa_cp_comm import legacy_gather, padded_buffer, padded_gather, padded_gather_, padded_scatter, plan_split
from nsa_cp_comm.agree import _all_dtypes, agree, agreed
from nsa_cp_comm.harness.checks import checked_group
from nsa_cp_comm.collectives import _BOOKKEEPING, all_gather_into
from nsa_cp_comm.harness.rank_body import rank_device
from rank_tasks import raised

H = 8


def _local(plan, rank, rows=None, h=H, dtype=torch.float32, device=None):
    n = plan.per_rank_tokens[rank] if rows is None else rows
    return torch.ones(n, h, dtype=dtype, device=device or rank_device())


def _cases(rank: int):
    """label -> (function, args) for this rank; rank 1 is the odd one out."""
    plan = plan_split([1000], 2, policy="zigzag_page", page_size=64)
    other = plan_split([1002], 2, policy="zigzag_page", page_size=64)
    odd = rank == 1
    n, m = plan.per_rank_tokens[rank], plan.padded_total

    def buf():  # a usable buffer of its own for each case
        return padded_buffer(plan, H, dtype=torch.float32)[0]

    return {
        "one_row_too_many": (padded_gather, (_local(plan, rank, rows=n + odd), plan)),
        "hidden_size": (padded_gather, (_local(plan, rank, h=H + odd), plan)),
        "dtype_int32": (padded_gather, (_local(plan, rank, dtype=torch.int32 if odd else torch.float32), plan)),
        "plan_differs": (padded_gather, (_local(other if odd else plan, rank), other if odd else plan)),
        "numpy": (padded_gather, (np.ones((n, H), dtype=np.float32) if odd else _local(plan, rank), plan)),
        "list": (padded_gather, ([[1.0] * H] * n if odd else _local(plan, rank), plan)),
        "none": (padded_gather, (None if odd else _local(plan, rank), plan)),
        "meta": (padded_gather, (_local(plan, rank, device=torch.device("meta")) if odd else _local(plan, rank), plan)),
        "scatter_rows": (padded_scatter, (torch.zeros(m + odd, H), plan)),
        # layout: decided on the odd rank, refused on every rank before the collective
        "expanded_full_rank0": (padded_gather_, (torch.ones(1, H).expand(m, H) if rank == 0 else buf(), plan)),
        "strided_full": (padded_gather_, (torch.zeros(H, m).t() if odd else buf(), plan)),
        "overlapping_full": (padded_gather_, (torch.zeros(m + H).as_strided((m, H), (1, 1)) if odd else buf(), plan)),
        "neg_view_full": (padded_gather_, (torch._neg_view(buf()) if odd else buf(), plan)),
        "neg_view_local": (padded_gather, (torch._neg_view(_local(plan, rank)) if odd else _local(plan, rank), plan)),
        # check= differs between the ranks, rank 1's buffer expanded: check is no per-rank choice of a
        # collective (rank 0 exchanging while rank 1 gathered aborted one and gave the other wrong rows)
        "check_differs_per_rank": (lambda full, plan: padded_gather_(full, plan, check=not odd),
                                   (torch.ones(1, H).expand(m, H) if odd else buf(), plan)),
        "requires_grad_full": (padded_gather_, (buf().requires_grad_(odd), plan)),
        "requires_grad_local": (padded_gather, (_local(plan, rank).requires_grad_(odd), plan)),
        "requires_grad_scatter": (padded_scatter, (torch.zeros(m, H, requires_grad=odd), plan)),
        "legacy_rows": (legacy_gather, (_local(plan := plan_split([1000], 2, policy="zigzag"), rank, rows=500 + odd),
                                        plan)),
    }


def check_differs_per_rank() -> list[int]:
    """Rank 0 passes check=True, rank 1 check=False, on good inputs: the rows every rank
    gathered, summed per rank's block (each rank's rows are ones times its rank plus one)."""
    plan = plan_split([1000], 2, policy="zigzag_page", page_size=64)
    rank = dist.get_rank()
    full = padded_gather(_local(plan, rank) * (rank + 1), plan, check=rank == 0)
    m = plan.max_rank_len
    return [int(full[r * m : (r + 1) * m].sum().item()) for r in range(plan.cp_size)]


def grad_off_on_every_rank() -> list[int]:
    """A tensor that requires grad is usable under torch.no_grad() (nothing is
    recorded): the gathered rows, per rank, summed."""
    plan = plan_split([10], 2, policy="zigzag")
    with torch.no_grad():
        full = padded_gather(_local(plan, dist.get_rank()).requires_grad_(True), plan)
    return [int(full.sum().item())]


def bad_input_on_one_rank(label: str) -> dict:
    """Run one case; report this rank's error text and whether a collective
    afterwards still completes (no rank was left inside one)."""
    rank = dist.get_rank()
    fn, args = _cases(rank)[label]
    error = raised(lambda: fn(*args))
    t = torch.ones(1)
    dist.all_reduce(t)
    return {"error": error, "after": int(t.item())}


def mismatched_collective_on_checked_group() -> str:
    """Rank 1 all-gathers one row more than rank 0 on the correctness group:
    torch's consistency wrapper raises instead of gloo aborting the process."""
    group = checked_group(30.0)
    rank = dist.get_rank()
    k = 2 + rank
    try:
        all_gather_into(torch.empty(2 * k, H), torch.ones(k, H), group)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    return ""


def every_dtype_on_every_rank() -> dict[str, str]:
    """Every rank passes the same tensor of each torch dtype to the agreement
    check: ``{dtype: error text}`` for the dtypes it refused (none should be)."""
    plan = plan_split([10], 2, policy="zigzag")
    n = plan.per_rank_tokens[dist.get_rank()]
    refused = {}
    for dtype in _all_dtypes():
        try:
            tensor = torch.empty((n, H), dtype=dtype)
        except (RuntimeError, TypeError):  # quantized and other dtypes without plain storage
            continue
        try:
            agree("local", tensor, plan, n)
        except ValueError as exc:
            refused[str(dtype)] = str(exc)
    return refused


def inside_agreed(label: str) -> dict:
    """One :func:`agreed` block, then round trips inside it: ``{"error": this
    rank's error text, "exchanges": the agreement's collectives inside the
    block (bookkeeping), "after": the all-reduce after it}``. Rank 1 is the
    odd one out where the label says so."""
    rank = dist.get_rank()
    odd = rank == 1
    plan = plan_split([1000], 2, policy="zigzag_page", page_size=64)
    other = plan_split([1002], 2, policy="zigzag_page", page_size=64)
    n = plan.per_rank_tokens[rank]
    error, exchanges = "", 0
    try:
        with agreed(other if (odd and label == "entry_plan_differs") else plan,
                    H + (1 if odd and label == "entry_width_differs" else 0), torch.float32, "cpu"):
            before = _BOOKKEEPING.get(id(dist.group.WORLD), 0)
            if label in ("covered", "entry_plan_differs", "entry_width_differs"):
                full = padded_gather(_local(plan, rank), plan)
                padded_scatter(full, plan)
            elif label == "other_plan":  # every rank alike: exchanged as outside the block
                padded_gather(_local(other, rank), other)
            elif label == "one_row_too_many":
                padded_gather(_local(plan, rank, rows=n + (1 if odd else 0)), plan) if odd else None
            elif label == "dtype_int32":  # every rank alike: exchanged as outside the block
                padded_gather(_local(plan, rank, dtype=torch.int32), plan)
            elif label == "none":
                padded_gather(None if odd else _local(plan, rank), plan) if odd else None
            exchanges = _BOOKKEEPING.get(id(dist.group.WORLD), 0) - before
    except Exception as exc:  # noqa: BLE001 - reported to the test
        error = f"{type(exc).__name__}: {exc}"
    t = torch.ones(1)
    dist.all_reduce(t)
    return {"error": error, "exchanges": exchanges, "after": int(t.item())}
