"""The CP gather / reduce-scatter round trips: the legacy one and the padded fix.

Every function takes ``(tensor, plan, group=None)``; the rank is the caller's
rank in ``group``. Contract: **all ranks of the group must pass the same plan**;
every size, and whether the legacy path may run at all, is decided from the
plan, never from a local shape, so all ranks take the same branch and no rank
enters a collective its peers skip. The ranks first agree on their inputs
(:mod:`.agree`; once for many calls inside an :func:`~.agree.agreed` block): a
bad input on one rank is a ValueError on every rank, never a hang or an abort.
Whether they exchange is never a per-rank argument (``check`` no longer
decides it: ranks passing different values entered different collectives).

Legacy assumes equal shards: it all-gathers into a ``[T, H]`` buffer and
reduce-scatters ``T/cp``-row chunks. The padded path pads each shard to
``m = plan.max_rank_len`` rows inside a ``[m*cp, H]`` buffer, so that every
collective sees equal chunks; rank ``r``'s rows sit at ``[r*m, r*m + n_r)``,
zeros after them. There is one padded algorithm for every plan: on an even plan
``m*cp == T``, no row is padding, and the result is legacy's, bit for bit
(the matrix checks this on every even point, see docs/design.md).

The padded round trip at cp 3, shards of 4, 2 and 3 rows (``m = 4``)::

    shards:                 rank 0 [a0 a1 a2 a3]   rank 1 [b0 b1]   rank 2 [c0 c1 c2]
    gathered [m*cp, H]:     | a0 a1 a2 a3 | b0 b1 0  0  | c0 c1 c2 0  |   rank r at r*m
    the MoE:                each rank's partial outputs, [m*cp, H] in the same layout
    reduce-scatter:         the partials summed, equal chunks of m rows: rank r <- rows r*m .. r*m+m-1
    sliced back:            rank 0 [4, H], rank 1 [2, H], rank 2 [3, H]

What the gather copies (:func:`stages_rows`): a rank whose shard already has
``m`` rows, every rank of an even plan, gathers straight from its shard, out
of place, as legacy does: no copy, no zeroing, and on an even plan the very
call legacy issues into a buffer of legacy's size. Only a rank shorter than
``m`` copies its rows into an ``[m, H]`` send block (:class:`SendBlock`) whose
tail ``[n_r, m)`` is the padding, zeroed when the block is made.

The pre-sized forms (:func:`padded_buffer`, :func:`padded_send_block`,
:func:`padded_stage`, :func:`padded_gather_`, :func:`legacy_gather_into`) are
what serving code runs with a reused buffer; the timed loop measures them,
local work apart from the collectives.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from .agree import agree
from .collectives import all_gather_into, group_rank, group_size, reduce_scatter_into
from .errors import LEGACY_UNEVEN_ERROR
from .plan import CPPlan


def _rank(plan: CPPlan, group: dist.ProcessGroup | None) -> int:
    world = group_size(group)
    if not isinstance(plan, CPPlan):
        raise ValueError(f"plan={plan!r} is not a CPPlan")
    if world != plan.cp_size:
        raise ValueError(f"group size {world} != plan.cp_size={plan.cp_size}: all ranks must pass the group's plan")
    return group_rank(group)


def _expected(plan: object, rank: int, rows: str | Callable[[CPPlan, int], int]) -> int:
    if not isinstance(plan, CPPlan) or rank >= plan.cp_size:
        return -2
    if callable(rows):
        return rows(plan, rank)
    return {"local": plan.per_rank_tokens[rank], "legacy_full": plan.total_tokens, "full": plan.padded_total}[rows]


def _check(
    what: str, tensor: object, plan: object, rows: str | Callable[[CPPlan, int], int],
    group: dist.ProcessGroup | None, *, even_only: bool = False, in_place: bool = False,
) -> int:
    """Agree on the inputs, refuse an uneven plan (``even_only``), then this
    rank's index in the group. ``rows``: the rows the plan says ``tensor``
    has on a rank (``local``, ``legacy_full``, ``full``, or a function of the
    plan and the rank). ``in_place``: the collective writes into ``tensor``,
    so its layout is part of the agreement.

    The public functions' ``check`` never decides whether the ranks exchange
    (the module's docstring says why); it is accepted for the callers
    written when it chose."""
    want = _expected(plan, group_rank(group), rows)
    if even_only and isinstance(plan, CPPlan) and not plan.is_even and isinstance(tensor, torch.Tensor):
        # The refusal comes first: decided from the plan the ranks agree on,
        # whatever rows they hold.
        want = int(tensor.shape[0]) if tensor.dim() else want
    agree(what, tensor, plan, want, group, in_place=in_place)
    rank = _rank(plan, group)  # type: ignore[arg-type]
    if even_only and not plan.is_even:  # type: ignore[attr-defined]
        # The legacy path's refusal: torch's text, then the plan's shard sizes.
        # Decided from the shared plan, so every rank raises; none is left inside
        # a collective. torch itself raises only on the ranks whose size disagrees
        # and leaves the others waiting in it (docs/design.md, "What torch does").
        raise ValueError(f"{LEGACY_UNEVEN_ERROR} (legacy CP gather/scatter needs even shards; "
                         f"per_rank_tokens={list(plan.per_rank_tokens)})")
    return rank


def legacy_gather(
    local: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None, *, check: bool = True
) -> torch.Tensor:
    """Old gather: ``[n, H]`` per rank -> ``[T, H]`` rank-major. Even plans only;
    raises ValueError (torch's NCCL text) on every rank of an uneven plan,
    before any collective."""
    _check("legacy_gather local", local, plan, "local", group, even_only=True)
    out = torch.empty((plan.total_tokens, local.shape[1]), dtype=local.dtype, device=local.device)
    return legacy_gather_into(out, local, plan, group)


def legacy_gather_into(
    out: torch.Tensor, local: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """The legacy collective into a pre-sized ``[T, H]`` buffer (unchecked: the
    caller validated once). Returns ``out``."""
    all_gather_into(out, local.contiguous(), group)
    return out


def legacy_scatter(
    full: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None, *, check: bool = True
) -> torch.Tensor:
    """Old scatter: sum ``[T, H]`` partials over ranks, return this rank's
    ``[T/cp, H]`` chunk. In place: ``full`` is consumed and the result is a
    view of it. Even plans only (same error as :func:`legacy_gather`)."""
    rank = _check("legacy_scatter full", full, plan, "legacy_full", group, even_only=True)
    full = full.contiguous()
    chunk = full.tensor_split(plan.cp_size)[rank]
    reduce_scatter_into(chunk, full, group)
    return chunk


def padded_buffer(
    plan: CPPlan,
    hidden_size: int,
    *,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A fresh ``[m*cp, H]`` gather buffer and this rank's ``[n_r, H]`` slot in it.

    The zero-copy form of the gather: the producer of the rows writes them
    into ``slot`` and then calls :func:`padded_gather_`; the shard is never
    copied into a padded tensor. Only this rank's padding rows are zeroed:
    the other blocks are overwritten by the gather, and this rank's padding
    rows are never written by anyone, so a reused buffer stays valid.
    """
    rank = _rank(plan, group)
    m, n = plan.max_rank_len, plan.per_rank_tokens[rank]
    full = torch.empty((plan.padded_total, hidden_size), dtype=dtype, device=device)
    full[rank * m + n : (rank + 1) * m].zero_()
    return full, full[rank * m : rank * m + n]


def stages_rows(plan: CPPlan, rank: int) -> bool:
    """Whether ``rank`` copies its rows before the padded all-gather: only where
    its shard is shorter than ``m = plan.max_rank_len``. A rank with ``m`` rows
    (every rank of an even plan) hands its shard itself to the collective.
    Decided from the plan alone, which all ranks pass the same, so every rank
    knows which ranks stage without a collective."""
    return plan.per_rank_tokens[rank] < plan.max_rank_len


class SendBlock:
    """A short rank's ``[rows, H]`` send block, reusable across calls: the
    padded all-gather's input is its first ``m`` rows, this rank's ``n`` rows
    and then zeros (the padding).

    Made by :func:`padded_send_block` (or for a fresh call); only
    :meth:`stage` ever writes it: the gather reads it and nothing returns it
    to a caller, so the padding, zeroed when the block is made, stays zero on
    every later call with the same length, at no cost.

    A length that changes between calls (a reused block across plans) is the
    one way a row of the tail can hold data: a call with ``n`` rows after one
    with ``k > n`` left rows ``[n, k)`` holding the earlier call's rows, which
    the collective would send as padding. The block keeps the high-water mark
    of the rows written since they were last zero (``dirty``) and a shorter
    call zeroes exactly ``[n, dirty)``; a call as long or longer zeroes nothing.
    """

    def __init__(self, rows: int, hidden: int, *, dtype: torch.dtype, device: torch.device | str = "cpu",
                 zero_from: int = 0) -> None:
        if not 0 <= zero_from <= rows:
            raise ValueError(f"zero_from={zero_from} is not in [0, {rows}]")
        self.block = torch.empty((rows, hidden), dtype=dtype, device=device)
        # Zeroed once, here: the rows the first stage() will not write.
        self.block[zero_from:].zero_()
        # Rows [dirty, rows) are zero; rows below may hold rows a call wrote
        # (or, below zero_from, nothing yet: the first call writes them).
        self.dirty = zero_from

    def stage(self, local: torch.Tensor, m: int) -> torch.Tensor:
        """Copy ``local``'s ``n`` rows to the block's top and return the
        ``[m, H]`` send block (a view): rows ``[n, m)`` zero. Zeroes only rows
        a longer earlier call wrote (see the class)."""
        n, rows = local.shape[0], self.block.shape[0]
        if not n <= m <= rows:
            raise ValueError(f"a [{n}, H] shard and m={m} do not fit a send block of {rows} rows (n <= m <= rows)")
        self.block[:n].copy_(local)
        if self.dirty > n:
            self.block[n : self.dirty].zero_()
        self.dirty = n
        return self.block[:m]


def padded_send_block(plan: CPPlan, hidden_size: int, *, dtype: torch.dtype, device: torch.device | str = "cpu",
                      group: dist.ProcessGroup | None = None) -> SendBlock | None:
    """This rank's reusable send block for ``plan``: ``[m, H]``, its tail
    ``[n_r, m)`` zeroed now, once; None where the rank gathers straight from its
    shard (:func:`stages_rows`: always on an even plan). The arguments are
    :func:`padded_buffer`'s. All ranks must pass the same plan."""
    return _send_block(plan, _rank(plan, group), hidden_size, dtype, device)


def _send_block(plan: CPPlan, rank: int, hidden: int, dtype: torch.dtype, device) -> SendBlock | None:
    if not stages_rows(plan, rank):
        return None
    return SendBlock(plan.max_rank_len, hidden, dtype=dtype, device=device, zero_from=plan.per_rank_tokens[rank])


def padded_stage(send: SendBlock | None, local: torch.Tensor, plan: CPPlan, rank: int) -> torch.Tensor:
    """The padded gather's local work, on a (possibly reused) send block:
    returns this rank's input to the all-gather. A rank with ``m`` rows
    (:func:`stages_rows` false; every rank of an even plan): ``local`` itself,
    nothing copied or zeroed (``send`` unused, may be None; a non-contiguous
    ``local`` is made contiguous, as legacy's gather does). A shorter rank:
    its rows copied into ``send`` (:meth:`SendBlock.stage`), which is returned
    as ``[m, H]``, the padding zero."""
    if not stages_rows(plan, rank):
        return local.contiguous()
    if send is None:
        raise ValueError(f"rank {rank} has {plan.per_rank_tokens[rank]} < m={plan.max_rank_len} rows: "
                         "it stages them into a send block (padded_send_block), and none was given")
    return send.stage(local, plan.max_rank_len)


def padded_gather_(
    full: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None, *, check: bool = True
) -> torch.Tensor:
    """In-place gather over a :func:`padded_buffer`: this rank's ``[m, H]`` block
    of ``full`` is the collective's input. Returns ``full``. ``full`` must own
    its memory row by row: an expanded (stride-0), overlapping or strided
    buffer, or one that requires grad, is the same ValueError on every rank
    before any collective."""
    return _gather_in_place(full, plan, _check("padded_gather_ full", full, plan, "full", group,
                                                in_place=True), group)


def _gather_in_place(full: torch.Tensor, plan: CPPlan, rank: int, group: dist.ProcessGroup | None) -> torch.Tensor:
    m = plan.max_rank_len
    all_gather_into(full, full[rank * m : (rank + 1) * m], group)
    return full


def padded_gather(
    local: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None, *, check: bool = True
) -> torch.Tensor:
    """Gather every rank's ``[n_r, H]`` rows into a fresh ``[m*cp, H]`` buffer,
    rank-major, each block zero-padded to ``m`` rows. Works for any plan,
    including ranks with zero rows; on an even plan the buffer has exactly
    ``T`` rows and holds legacy's bytes.

    The collective is out of place into the fresh buffer. Its input: where
    this rank has ``m`` rows (every rank of an even plan), ``local`` itself,
    so an even plan issues legacy's call (:func:`legacy_gather`) with nothing
    copied or zeroed; where it has fewer, a fresh ``[m, H]`` send block, its
    rows copied in and only its ``m - n_r`` padding rows zeroed. All ranks
    must pass the same plan."""
    rank = _check("padded_gather local", local, plan, "local", group)
    full = torch.empty((plan.padded_total, local.shape[1]), dtype=local.dtype, device=local.device)
    send = _send_block(plan, rank, local.shape[1], local.dtype, local.device)
    all_gather_into(full, padded_stage(send, local, plan, rank), group)
    return full


def padded_gather_zero_copy(
    local: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None, *, check: bool = True
) -> torch.Tensor:
    """The zero-copy gather as a producer uses it: the rows are written into the
    slot of a :func:`padded_buffer` (here: copied, standing in for the
    producer), then gathered in place. Same result as :func:`padded_gather`."""
    rank = _check("padded_gather_zero_copy local", local, plan, "local", group)
    full, slot = padded_buffer(plan, local.shape[1], dtype=local.dtype, device=local.device, group=group)
    slot.copy_(local)
    return _gather_in_place(full, plan, rank, group)  # agreed on local above: the buffer is this function's own


def padded_scatter(
    full: torch.Tensor, plan: CPPlan, group: dist.ProcessGroup | None = None, *, check: bool = True
) -> torch.Tensor:
    """Sum ``[m*cp, H]`` partials over ranks and return this rank's ``[n_r, H]``
    rows (a view of its chunk: padding dropped, nothing copied). In place:
    ``full`` is consumed."""
    rank = _check("padded_scatter full", full, plan, "full", group)
    full = full.contiguous()
    chunk = full.tensor_split(plan.cp_size)[rank]
    reduce_scatter_into(chunk, full, group)
    return chunk[: plan.per_rank_tokens[rank]]
