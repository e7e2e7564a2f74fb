"""The collectives the round trips issue: one shim over torch's names, and a counter.

torch 2.13 renamed ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` to
``all_gather_single`` / ``reduce_scatter_single`` and deprecates the old names;
torch 2.11 has only the old ones. The name is picked once at import, so no run
prints deprecation warnings and every caller goes through one function.

:func:`counting` tells whether a piece of code issued any collective at all:
the refusal check uses it to prove that the legacy path declined an uneven plan
before entering one (a rank inside a collective its peers skip hangs or aborts).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist

ALL_GATHER_NAME: str = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
REDUCE_SCATTER_NAME: str = (
    "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
)

# Every torch.distributed entry point that communicates; :func:`counting` wraps them.
COLLECTIVES: tuple[str, ...] = tuple(
    n
    for n in (
        "all_gather_single", "all_gather_into_tensor", "all_gather", "reduce_scatter_single",
        "reduce_scatter_tensor", "reduce_scatter", "all_reduce", "all_to_all_single", "all_to_all",
        "broadcast", "reduce", "gather", "scatter", "barrier", "send", "recv", "isend", "irecv",
        "batch_isend_irecv",
    )
    if hasattr(dist, n)
)


def all_gather_into(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
    """``output[r*k:(r+1)*k] = input of rank r`` for equal ``k = input.shape[0]`` on
    every rank. ``output`` is the concatenated ``[k*world, ...]`` form (gloo
    accepts no other). ``input`` may be the slot of ``output`` for this rank."""
    getattr(dist, ALL_GATHER_NAME)(output, input, group=group)


def reduce_scatter_into(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
    """``output = sum over ranks of input[r*k:(r+1)*k]`` for this rank ``r``.
    ``output`` may be this rank's chunk of ``input`` (the serving code's form)."""
    getattr(dist, REDUCE_SCATTER_NAME)(output, input, group=group)


def group_rank(group: dist.ProcessGroup | None) -> int:
    return dist.get_rank(group)


def group_size(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group)


_UNCOUNTED = [0]


@contextlib.contextmanager
def uncounted() -> Iterator[None]:
    """Collectives in this block are bookkeeping (the ranks' agreement on their
    inputs, :mod:`.agree`), not the round trip's: :func:`counting` skips them."""
    _UNCOUNTED[0] += 1
    try:
        yield
    finally:
        _UNCOUNTED[0] -= 1


@contextlib.contextmanager
def counting() -> Iterator[list[str]]:
    """Within the block, every torch.distributed collective called (through this
    shim or directly) is appended by name to the yielded list, then run as usual.
    Not thread-safe: it swaps module attributes."""
    calls: list[str] = []
    saved = {name: getattr(dist, name) for name in COLLECTIVES}

    def wrap(name, fn):
        def counted(*args, **kwargs):
            if not _UNCOUNTED[0]:
                calls.append(name)
            return fn(*args, **kwargs)

        return counted

    try:
        for name, fn in saved.items():
            setattr(dist, name, wrap(name, fn))
        yield calls
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
