"""The collectives the round trips issue: one shim over torch's names, and a counter.

torch 2.13 renamed ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` to
``all_gather_single`` / ``reduce_scatter_single`` and deprecates the old names;
torch 2.11 has only the old ones. The name is picked once at import, so no run
prints deprecation warnings and every caller goes through one function.

:func:`observing` tells whether a piece of code issued any collective at all,
and on which group: the refusal check uses it to prove that an even-only path
declined an uneven plan before entering one (a rank inside a collective its
peers skip hangs or aborts), the ``group`` check that nothing went over the
default group. It reads the process groups' own sequence numbers, which every
collective moves whatever path issued it (``torch.distributed``'s functions,
``distributed_c10d``, a group's methods, the functional and the object
collectives); :func:`counting`, which wraps ``torch.distributed``'s names,
only adds the names of the collectives it saw.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

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
# Collectives issued inside uncounted() blocks, per process group (by id).
_BOOKKEEPING: dict[int, int] = {}


def sequence_number(group: dist.ProcessGroup | None) -> int | None:
    """How many collectives ``group`` (None: the default group) has issued on
    this rank, or None where its backend does not count them."""
    pg = group if group is not None else dist.group.WORLD
    try:
        return int(pg._get_sequence_number_for_group())
    except (AttributeError, RuntimeError):
        return None


def _delta(before: int | None, after: int | None) -> int:
    return after - before if before is not None and after is not None else 0


@contextlib.contextmanager
def uncounted(group: dist.ProcessGroup | None = None) -> Iterator[None]:
    """Collectives in this block (on ``group``) are bookkeeping (the ranks'
    agreement on their inputs, :mod:`.agree`), not the round trip's:
    :func:`counting` and :func:`observing` skip them."""
    _UNCOUNTED[0] += 1
    before = sequence_number(group)
    try:
        yield
    finally:
        _UNCOUNTED[0] -= 1
        pg = group if group is not None else dist.group.WORLD
        _BOOKKEEPING[id(pg)] = _BOOKKEEPING.get(id(pg), 0) + _delta(before, sequence_number(group))


@dataclass
class Observed:
    """What :func:`observing` saw: collectives on the group it watched and on
    the default group (bookkeeping left out), and the names of those issued
    through ``torch.distributed``'s functions."""

    on_group: int = 0
    on_default: int = 0
    names: list[str] = field(default_factory=list)

    @property
    def issued(self) -> bool:
        return bool(self.on_group or self.on_default or self.names)

    def describe(self) -> str:
        where = [f"{n} collective(s) on {g}" for n, g in ((self.on_group, "the CP group"), (self.on_default, "the default group")) if n]
        names = f" ({', '.join(self.names)})" if self.names else ""
        return (" and ".join(where) or "a collective") + names


@contextlib.contextmanager
def observing(group: dist.ProcessGroup | None) -> Iterator[Observed]:
    """Within the block, count the collectives issued on ``group`` and on the
    default group, whatever path issued them (each group's sequence number,
    before and after), less :func:`uncounted` bookkeeping."""
    seen = Observed()
    watched = [group if group is not None else dist.group.WORLD]
    if watched[0] is not dist.group.WORLD:
        watched.append(dist.group.WORLD)
    before = [(sequence_number(g), _BOOKKEEPING.get(id(g), 0)) for g in watched]
    with counting() as names:
        try:
            yield seen
        finally:
            counts = [_delta(s, sequence_number(g)) - (_BOOKKEEPING.get(id(g), 0) - b)
                      for g, (s, b) in zip(watched, before)]
            seen.on_group = counts[0]
            seen.on_default = counts[1] if len(counts) > 1 else 0
            seen.names = list(names)


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
