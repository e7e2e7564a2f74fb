"""The CP group a matrix point hands to implementations: never the default group.

In a serving engine the CP group is a subgroup (CP inside TP/DP) whose rank
order differs from the world's, and talking on the default group, or using
``dist.get_rank()`` where the group's rank is meant, is a common mistake
there. A point therefore runs its CP group over the world's ranks in reverse
order (group rank ``r`` is global rank ``world - 1 - r``), after ``bystanders``
ranks that belong to the world but not to the group (global ranks
``0 .. bystanders-1``). With the reversed order, an implementation on the
default group or the global rank puts rows in the wrong places and moves the
default group's sequence number (the ``group`` check); with bystanders, a
collective on the default group waits for ranks that never enter it.

torch's ``new_group`` sorts its ranks, so the group is made with
``_new_group_with_tag(sort_ranks=False)``, the form DeviceMesh uses; where a
torch lacks it the group keeps the world's order (:func:`permuted` is False).
Groups are made once per process and world (all ranks call, in the same order).

Each rank reports its group rank beside its point's results
(:data:`GROUP_RANK_KEY`): the sweep's own process orders the reports by it
without importing torch (only a failure's diagnosis maps ranks here).
"""

from __future__ import annotations

import functools
import inspect
from datetime import timedelta
from typing import Any

# The key of a rank's point report that holds its CP group rank (a leading
# underscore: never an implementation's name).
GROUP_RANK_KEY = "_group_rank"


@functools.cache
def permuted() -> bool:
    """Whether this torch makes a group in the order given (the CP group is then the world reversed)."""
    from torch.distributed import distributed_c10d

    make = getattr(distributed_c10d, "_new_group_with_tag", None)
    return make is not None and "sort_ranks" in inspect.signature(make).parameters


_GROUPS: dict[tuple[Any, ...], Any] = {}


def cp_ranks(cp_size: int, bystanders: int = 0) -> list[int]:
    """Global ranks of the CP group, in group-rank order."""
    world = cp_size + bystanders
    return list(range(world - 1, bystanders - 1, -1)) if permuted() else list(range(bystanders, world))


def group_rank_of(global_rank: int, cp_size: int, bystanders: int = 0) -> int | None:
    """The CP group rank of a global rank; None for a bystander."""
    ranks = cp_ranks(cp_size, bystanders)
    return ranks.index(global_rank) if global_rank in ranks else None


def _make(ranks: list[int], timeout_s: float | None, detail: bool):
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    kwargs: dict[str, Any] = {"ranks": ranks, "backend": dist.get_backend()}
    if timeout_s is not None:
        kwargs["timeout"] = timedelta(seconds=max(1.0, timeout_s))
    if permuted():
        kwargs["sort_ranks"] = False
    if not detail:
        return distributed_c10d._new_group_with_tag(**kwargs) if permuted() else dist.new_group(**kwargs)
    from torch._C._distributed_c10d import DebugLevel, get_debug_level, set_debug_level

    before = get_debug_level()
    set_debug_level(DebugLevel.DETAIL)
    try:
        return distributed_c10d._new_group_with_tag(**kwargs) if permuted() else dist.new_group(**kwargs)
    finally:
        set_debug_level(before)


def cp_group(cp_size: int, *, bystanders: int = 0, checked: bool, timeout_s: float | None = None):
    """This rank's CP group (``checked``: with torch's collective-consistency
    checking, TORCH_DISTRIBUTED_DEBUG=DETAIL's wrapper, which compares every
    collective's op, shapes and dtypes across ranks first), or None on a
    bystander. A collective over the whole world: every rank calls it."""
    import torch.distributed as dist

    key = (dist.get_world_size(), cp_size, bystanders, checked, timeout_s)
    if key not in _GROUPS:
        g = _make(cp_ranks(cp_size, bystanders), timeout_s, checked)
        _GROUPS[key] = None if g is None or g == dist.GroupMember.NON_GROUP_MEMBER else g
    return _GROUPS[key]
