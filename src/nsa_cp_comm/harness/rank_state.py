"""A warm rank's state after a point: what the next point on it relies on.

Ranks are reused across points, so a point that leaves a rank changed (its
process group destroyed, another default dtype or device) would fail, or
silently change, the next, unrelated point. :func:`remember` records the
state a rank starts with; after every point :func:`check_pool` asks each rank
for its differences, and a pool with any is closed so the next point starts
fresh ranks, while the point that changed them gets the error.
"""

from __future__ import annotations

from typing import Any

from .rank_result import summarize_failure

_START: dict[str, Any] = {}


def _now() -> dict[str, Any]:
    import torch

    state = {"default dtype": torch.get_default_dtype()}
    get_device = getattr(torch, "get_default_device", None)
    if get_device is not None:
        state["default device"] = get_device()
    return state


def remember() -> None:
    """Record this rank's state as it starts (once its group is up)."""
    _START.update(_now())


def changes() -> str:
    """Rank task: how this rank differs from its start ("" when it does not);
    its group alive is proven by one all-reduce over every rank."""
    import torch
    import torch.distributed as dist

    found = [f"{key} is {value} (was {_START[key]})" for key, value in _now().items()
             if key in _START and value != _START[key]]
    if not dist.is_initialized():
        return "; ".join(["its default process group was destroyed", *found])
    # dtype and device said: a rank whose defaults changed must still send what its peers expect
    # (gloo aborts the process on a size mismatch)
    t = torch.ones(1, dtype=torch.float32, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t)
    if int(t.item()) != dist.get_world_size():
        found.append(f"an all-reduce of ones gave {int(t.item())}, not {dist.get_world_size()}")
    return "; ".join(found)


def check_pool(pool: Any, timeout_s: float) -> str:
    """"" when every rank of ``pool`` is as it started; else the problem in
    one line (naming the ranks), and the pool is closed."""
    results = pool.run(changes, timeout_s=timeout_s)
    if not all(r.ok for r in results):
        _, reason = summarize_failure(results)
        return f"the ranks did not answer a state check after the point ({reason})"
    bad = [f"rank {r.rank}: {r.value}" for r in results if r.value]
    if not bad:
        return ""
    pool.close(graceful=False)
    return "the point left its ranks changed: " + "; ".join(bad)
