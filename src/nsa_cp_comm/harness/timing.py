"""Clocks, the one timed loop, statistics and bandwidth: performance semantics, defined once.

A phase's time for an iteration is the slowest rank's; ``roundtrip`` and
``collective`` are derived per iteration (:func:`fold_phases`); bandwidths
follow nccl-tests (:func:`roundtrip_bandwidth`). Why, and the clocks:
docs/design.md, section 7.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

# The host clock, bound here at import: a task that replaces ``time.perf_counter``
# (a plug-in's rank) times nothing of the harness with it (.rank_state names the change).
from time import perf_counter as _clock

PERCENTILES = (10, 50, 90, 99)
PHASES: tuple[str, ...] = ("local", "gather", "scatter")
# The A/A control's name in the timed loop (.steps.control_steps): never an
# implementation's (a leading underscore is not a valid registry name).
CONTROL = "_control"


class Clock:
    """Marks points in one device's time line; ``elapsed_us`` after ``sync``.

    Device-explicit: on CUDA the events are recorded on ``device``'s current
    stream and ``sync`` waits for ``device``, whatever the calling thread's
    current device is (it is per thread, and a point may run in a new one).
    """

    # torch is imported where a rank uses it: the statistics below are read
    # by the sweep's own process, which never imports torch.

    def __init__(self, device: torch.device | str) -> None:
        import torch

        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:
            raise ValueError(f"Clock needs an explicit CUDA device index, not {device!r}")

    def mark(self) -> object:
        if self.cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            return ev
        return _clock()

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)

    def elapsed_us(self, start: object, end: object) -> float:
        if self.cuda:
            return float(start.elapsed_time(end)) * 1e3  # type: ignore[attr-defined]
        return (end - start) * 1e6  # type: ignore[operator]


class CacheFlusher:
    """Evicts caches between iterations by writing a buffer larger than them
    (H200 L2 is 50 MiB; server CPUs' L3 is tens of MiB)."""

    def __init__(self, device: torch.device, nbytes: int = 256 << 20) -> None:
        import torch

        self.buf = torch.empty(nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buf.zero_()


@dataclass
class Steps:
    """What the timed loop runs for one implementation, per iteration.

    ``reset(it)`` runs untimed first, given the iteration's number ``it``
    (from 0, warm-up included; e.g. write the iteration's inputs); then each
    ``(phase, fn)`` of ``phases`` in order, timed one by one, each called with
    the input set ``it % n_sets``. Phases are named from :data:`PHASES`; an
    implementation without local work has no ``local`` phase. ``check(phase,
    it, returned)`` runs untimed right after each phase with what the phase
    returned, before anything else runs on this rank: what it does to look at
    the outputs is outside every phase's time. ``timed_check``: what ``check``
    holds its findings in (:class:`~.verify.TimedCheck`,
    :class:`~.verify_dispatch.DispatchCheck`; None when off)."""

    name: str
    phases: list[tuple[str, Callable[[int], object]]]
    reset: Callable[[int], object] | None = None
    n_sets: int = 1
    check: Callable[[str, int, object], object] | None = None
    timed_check: Any = None


def timed_loop(
    steps: Sequence[Steps],
    *,
    warmup: int,
    iters: int,
    clock: Clock,
    group: dist.ProcessGroup | None = None,
    flush: Callable[[], None] | None = None,
    stop: Callable[[dict[str, dict[str, list[float]]]], bool] | None = None,
    turn_group: dist.ProcessGroup | None = None,
) -> dict[str, dict[str, list[float]]]:
    """Run every implementation's steps ``warmup + iters`` times on this rank
    and return ``{name: {phase: [us per timed iteration]}}``.

    ``stop`` (e.g. :class:`.calibrate.Calibrator`), called after every timed
    iteration with the samples so far, ends the loop early when it returns
    True; it must answer the same on every rank (it may run collectives on
    ``group``), and ``iters`` is then the most iterations timed.

    Implementations take turns within every iteration, starting from a rotating
    one, so drift in the machine's state hits them alike. Every rank must call
    it with the same steps (names, phases, counts): each phase starts with a
    barrier. Fold the ranks' samples with :func:`max_over_ranks`.
    ``turn_group`` (same ranks, a group no step issues collectives on): the
    first phase of each turn waits at its barrier instead of ``group``'s, so
    a step that issued a collective more than its peers cannot meet the next
    turn's barrier (it stays in its own turn: :func:`.blame.announce_turns`)."""
    import torch.distributed as dist

    samples = {s.name: {p: [] for p, _ in s.phases} for s in steps}
    n = len(steps)
    for it in range(warmup + iters):
        for k in range(n):
            s = steps[(it + k) % n]
            i = it % s.n_sets
            if s.reset is not None:
                s.reset(it)
            if flush is not None:
                flush()
            for j, (phase, fn) in enumerate(s.phases):
                clock.sync()
                dist.barrier(group=turn_group if j == 0 and turn_group is not None else group)
                t0 = clock.mark()
                out = fn(i)
                t1 = clock.mark()
                clock.sync()
                if it >= warmup:
                    samples[s.name][phase].append(clock.elapsed_us(t0, t1))
                if s.check is not None:
                    s.check(phase, it, out)
                del out  # a fresh output buffer is not held into the next phase
        if it >= warmup and stop is not None and stop(samples):
            break
    return samples


def summarize(samples_us: Sequence[float]) -> dict[str, float]:
    """``{"p10", "p50", "p90", "p99", "mean", "iqr"}`` of per-iteration times (us)."""
    xs = np.asarray(samples_us, dtype=float)
    if not len(xs):
        return {**{f"p{q}": math.nan for q in PERCENTILES}, "mean": math.nan, "iqr": math.nan}
    qs = np.percentile(xs, [*PERCENTILES, 25, 75])
    out = {f"p{q}": float(v) for q, v in zip(PERCENTILES, qs)}
    out["mean"] = float(xs.mean())
    out["iqr"] = float(qs[-1] - qs[-2])
    return out


def max_over_ranks(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Per iteration, the slowest rank's time: a collective ends for the job
    when it ends on every rank."""
    return np.max(np.asarray(per_rank, dtype=float), axis=0).tolist() if len(per_rank) else []


def fold_phases(per_rank: Sequence[dict[str, list[float]]]) -> dict[str, list[float]]:
    """Per-iteration phase times over ranks (slowest rank per phase), plus the
    derived ``collective`` (gather + scatter) and ``roundtrip`` (all phases)."""
    phases = [p for p in PHASES if p in per_rank[0]]
    folded = {p: max_over_ranks([r[p] for r in per_rank]) for p in phases}
    iters = len(folded[phases[0]]) if phases else 0
    folded["collective"] = [sum(folded[p][i] for p in ("gather", "scatter") if p in folded) for i in range(iters)]
    folded["roundtrip"] = [sum(folded[p][i] for p in phases) for i in range(iters)]
    return folded


def algbw_GBps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else math.nan


def busbw_GBps(nbytes: float, seconds: float, cp_size: int) -> float:
    return algbw_GBps(nbytes, seconds) * (cp_size - 1) / cp_size


def roundtrip_bandwidth(nbytes: int, collective_us: float, cp_size: int) -> tuple[float, float]:
    """``(algbw, busbw)`` in GB/s of a gather + reduce-scatter round trip over a
    buffer of ``nbytes``: two collectives of ``nbytes`` each, over the time of
    the two collectives."""
    seconds = collective_us * 1e-6
    return algbw_GBps(2 * nbytes, seconds), busbw_GBps(2 * nbytes, seconds, cp_size)
