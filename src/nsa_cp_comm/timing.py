"""Clocks, statistics and bandwidth: the performance semantics, defined once.

Bandwidth follows nccl-tests: for a collective over ``S`` bytes (the full
gathered buffer) taking ``t`` seconds, ``algbw = S / t`` and
``busbw = algbw * (cp - 1) / cp`` (what each rank's link carries in a ring).
A round trip is two such collectives (all-gather, then reduce-scatter), so its
``algbw = 2 * S / t_roundtrip``. Figures are in GB/s (1e9 bytes per second).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence

import torch

PERCENTILES = (10, 50, 90, 99)


class Clock:
    """Marks points in a device's time line; ``elapsed_us`` after ``sync``.

    CUDA events on GPU (device time, not host launch time); ``perf_counter``
    on CPU, where collectives are synchronous.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> object:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def elapsed_us(self, start: object, end: object) -> float:
        if self.cuda:
            return float(start.elapsed_time(end)) * 1e3  # type: ignore[attr-defined]
        return (end - start) * 1e6  # type: ignore[operator]


class CacheFlusher:
    """Evicts caches between iterations by writing a buffer larger than them
    (H200 L2 is 50 MiB; server CPUs' L3 is tens of MiB)."""

    def __init__(self, device: torch.device, nbytes: int = 256 << 20) -> None:
        self.buf = torch.empty(nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buf.zero_()


def percentile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of already sorted samples."""
    if not sorted_xs:
        return math.nan
    pos = (len(sorted_xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summarize(samples_us: Sequence[float]) -> dict[str, float]:
    """``{"p10", "p50", "p90", "p99", "mean"}`` of per-iteration times (us)."""
    xs = sorted(samples_us)
    out = {f"p{q}": percentile(xs, q) for q in PERCENTILES}
    out["mean"] = statistics.fmean(xs) if xs else math.nan
    return out


def max_over_ranks(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Per iteration, the slowest rank's time: a collective ends for the job
    when it ends on every rank."""
    return [max(vals) for vals in zip(*per_rank)]


def algbw_GBps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else math.nan


def busbw_GBps(nbytes: float, seconds: float, cp_size: int) -> float:
    return algbw_GBps(nbytes, seconds) * (cp_size - 1) / cp_size


def roundtrip_bandwidth(nbytes: int, roundtrip_us: float, cp_size: int) -> tuple[float, float]:
    """``(algbw, busbw)`` in GB/s of a gather + reduce-scatter round trip over a
    buffer of ``nbytes``: two collectives of ``nbytes`` each."""
    seconds = roundtrip_us * 1e-6
    return algbw_GBps(2 * nbytes, seconds), busbw_GBps(2 * nbytes, seconds, cp_size)
