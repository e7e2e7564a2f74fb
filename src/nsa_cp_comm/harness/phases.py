"""Where a point's time goes on one rank: seconds and collectives per phase.

:func:`~.measure.point_on_rank` runs in phases (set-up, checks, agreement,
building the timed forms, the timed loop); a :class:`PhaseClock` is a lap
timer over them: each :meth:`~PhaseClock.lap` ends the running phase, adding
its wall seconds and the collectives it issued on the groups watched (each
group's sequence number, before and after), and starts the next. The point's
report carries the sums under :data:`PHASES_KEY`; ``benchmarks/point_phases.py``
prints them per point: what to shrink to make a sweep faster.
"""

from __future__ import annotations

import time

import torch.distributed as dist

from ..collectives import sequence_number

# The key of a point's per-rank report that holds its phases (never an implementation's name).
PHASES_KEY = "_phases"


class PhaseClock:
    """Seconds and collectives of consecutive named phases on this rank."""

    def __init__(self) -> None:
        self.groups: list[dist.ProcessGroup | None] = []
        self.phases: dict[str, dict[str, float]] = {}
        self._name: str | None = None
        self._t = 0.0
        self._n = 0

    def watch(self, *groups: dist.ProcessGroup | None) -> None:
        """Count collectives on ``groups`` (and the default group) from now on."""
        self.groups = list({id(g): g for g in (*groups, None)}.values())
        self._n = self._count()

    def _count(self) -> int:
        return sum(sequence_number(g) or 0 for g in self.groups)

    def lap(self, name: str | None) -> None:
        """End the running phase and start ``name`` (None: start none)."""
        now, n = time.perf_counter(), self._count()
        if self._name is not None:
            self.add(self._name, now - self._t, n - self._n)
        self._name, self._t, self._n = name, now, n

    def add(self, name: str, seconds: float, collectives: int = 0) -> None:
        got = self.phases.setdefault(name, {"s": 0.0, "collectives": 0})
        got["s"] += seconds
        got["collectives"] += collectives

    def report(self) -> dict[str, dict[str, float]]:
        self.lap(None)
        return {name: dict(v) for name, v in self.phases.items()}
