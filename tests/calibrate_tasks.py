"""Rank task of tests/lib/test_calibrate.py: a timed loop with ``iters=auto``
whose times differ between the ranks (a scripted clock: no wall-time noise)."""

from __future__ import annotations

import time

import numpy as np
import torch.distributed as dist

from nsa_cp_comm.harness import calibrate
from nsa_cp_comm.harness.calibrate import Calibrator
from nsa_cp_comm.harness.timing import Clock, Steps, timed_loop


class ScriptedClock(Clock):
    """Every phase takes the next value of ``times[name]`` (us), whatever ran."""

    def __init__(self, times: dict[str, list[float]]) -> None:
        super().__init__("cpu")
        self.times = {k: iter(v) for k, v in times.items()}
        self.current = ""

    def elapsed_us(self, start: object, end: object) -> float:
        return next(self.times[self.current])


def calibrated_loop(noisy_ranks: tuple[int, ...], max_iters: int) -> dict[str, object]:
    """Ranks in ``noisy_ranks`` see the implementation's time spread 100x
    iteration to iteration, the others a constant ratio to the control; the
    loop runs until the calibrator stops it. Returns what this rank ran."""
    rank = dist.get_rank()
    rng = np.random.default_rng(rank)
    n = 2 * max_iters + 10
    impl = rng.uniform(100, 10_000, n) if rank in noisy_ranks else np.full(n, 50.0)
    clock = ScriptedClock({"impl": list(impl), "control": [40.0] * n})

    def phase(name: str):
        def fn(i: int) -> None:
            clock.current = name
        return fn

    steps = [Steps("impl", [("gather", phase("impl"))]), Steps("_control", [("gather", phase("control"))])]
    calib = Calibrator(control="_control", group=None, device="cpu", target=0.2, min_iters=6,
                       max_iters=max_iters, time_cap_s=600.0, check_every=5)
    samples = timed_loop(steps, warmup=1, iters=max_iters, clock=clock, stop=calib)
    return {"iters": len(samples["impl"]["gather"]), **calib.record()}


def slow_loop(sleep_s: float, cap_s: float) -> dict[str, object]:
    """Iterations of ``sleep_s`` each (rank 1 twice as slow) under a hard cap
    of ``cap_s``: the loop must end on both ranks together, before the floor."""
    rank = dist.get_rank()

    def fn(i: int) -> None:
        time.sleep(sleep_s * (1 + rank))

    steps = [Steps("impl", [("gather", fn)])]
    calib = Calibrator(control=None, group=None, device="cpu", min_iters=calibrate.MIN_ITERS,
                       max_iters=calibrate.MAX_ITERS, time_cap_s=cap_s / 2, hard_cap_s=cap_s)
    samples = timed_loop(steps, warmup=0, iters=calibrate.MAX_ITERS, clock=Clock("cpu"), stop=calib)
    return {"iters": len(samples["impl"]["gather"]), **calib.record()}
