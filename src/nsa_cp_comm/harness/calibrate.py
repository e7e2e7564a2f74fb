"""``iters=auto``: how many timed iterations a point needs, decided as it runs.

As pyperf and Google Benchmark calibrate a benchmark's repetitions, a point
with ``iters=auto`` samples until what compare's gate reads is known well
enough (:func:`decide`): each implementation's median paired ratio (its round
trip over the A/A control's in the same iteration; the round trip itself
where no control runs) has a 95% interval within :data:`CI_WIDTH` of it,
after :data:`MIN_ITERS` and up to :data:`MAX_ITERS` iterations or
:data:`TIME_CAP_S`, and past that cap, to :data:`EXTENDED_CAP_S`, while the
gate lacks :data:`POWER_TARGET` of power for :data:`GATE_CHANGE`
(:data:`TIME_CAP_ENV`: one hard cap instead). Why these, and what a loaded
machine needs: docs/design.md, section 8, item 2. Every rank stops at the
same iteration: :class:`Calibrator` decides on the slowest rank's times.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter as _clock  # bound at import, as .timing's clock

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

AUTO = "auto"
# Its record's key in a rank's report: never an implementation's name (a
# leading underscore is not a valid registry name).
CALIBRATION = "_calibration"
# The 95% interval of a median, relative to it. Two runs of a point differ by
# the sampling error of both medians: on the 2-core review flow an unchanged
# point moved 0.88x-1.16x between two runs at 15%, up to compare's 15%
# threshold, and 0.90x-1.11x at 10% (benchmarks/compare_power.py, 10 pairs each).
CI_WIDTH = 0.10
CONFIDENCE = 0.95
MIN_ITERS = 20
MAX_ITERS = 2000
TIME_CAP_S = 30.0
# The most the loop may run past TIME_CAP_S while the gate lacks power. At a
# held load of 20 on 2 cores a point at the cap had 100-160 samples and one in
# ten A/A compares found a row too noisy (P 0.74, 0.78 < 0.8 with 110 a side:
# benchmarks/data/compare_power_load20.json); that noise needs about 1.4x the
# samples for 0.9, so twice the cap leaves room (with it, 0 of 10 pairs at that
# load; the same file, remeasured).
EXTENDED_CAP_S = 2 * TIME_CAP_S
# The change the gate must be able to flag (significance.resolved_change of
# compare's default 15% threshold), and the power the loop asks for it, above
# compare's POWER_MIN: the other run's samples may be noisier.
GATE_CHANGE = 0.30
POWER_TARGET = 0.9
# Seconds in (0, TIME_CAP_S]: one hard, shorter cap, for a quick run of a
# calibrated sweep, with less power (compare may then find its rows too noisy);
# read by every process of the sweep, so set it in the environment the sweep
# starts from.
TIME_CAP_ENV = "NSA_CP_AUTO_MAX_S"
CHECK_EVERY = 10  # timed iterations between two checks (each is one small collective)


def is_auto(iters: object) -> bool:
    return iters == AUTO


def time_cap(environ: Mapping[str, str] = os.environ) -> float:
    """The timed loop's time cap: :func:`time_caps`' soft one."""
    return time_caps(environ)[0]


def time_caps(environ: Mapping[str, str] = os.environ) -> tuple[float, float]:
    """The loop's caps: ``(soft, hard)``: (:data:`TIME_CAP_S`,
    :data:`EXTENDED_CAP_S`), or :data:`TIME_CAP_ENV`'s seconds as both where
    set; ValueError naming it when it is not in (0, TIME_CAP_S]."""
    raw = environ.get(TIME_CAP_ENV, "")
    if not raw:
        return TIME_CAP_S, EXTENDED_CAP_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= TIME_CAP_S:
        raise ValueError(f"{TIME_CAP_ENV}={raw!r}: must be seconds in (0, {TIME_CAP_S:g}]")
    return value, value


def median_ci(xs: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Distribution-free interval for the median: the order statistics
    ``x_(k)`` and ``x_(n+1-k)`` with the largest ``k`` whose binomial(n, 1/2)
    coverage is at least ``confidence``; ``(nan, nan)`` when ``n`` is too
    small for any."""
    x = np.sort(np.asarray(xs, dtype=float))
    n = len(x)
    best = 0
    tail = 0.0  # P(B <= k - 1), B ~ binomial(n, 1/2)
    log_total = n * math.log(2)
    for k in range(1, n // 2 + 1):
        j = k - 1
        tail += math.exp(math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) - log_total)
        if 1 - 2 * tail < confidence:
            break
        best = k
    if not best:
        return math.nan, math.nan
    return float(x[best - 1]), float(x[n - best])


def relative_width(xs: Sequence[float]) -> float:
    """The median's confidence interval over the median (inf when unknown)."""
    lo, hi = median_ci(xs)
    med = float(np.median(xs)) if len(xs) else math.nan
    if math.isnan(lo) or not med > 0:
        return math.inf
    return (hi - lo) / med


@dataclass(frozen=True)
class Decision:
    stop: bool
    reached: bool  # every implementation's interval within the target
    width: float  # the widest relative interval
    power: float | None = None  # the least power for GATE_CHANGE, where the soft cap asked for it


def gate_power(metric: Mapping[str, Sequence[float]]) -> float:
    """The least, over implementations, power of compare's test to flag
    :data:`GATE_CHANGE` on two samples like this one (0 with none)."""
    from .significance import power

    return min((power(v, v, GATE_CHANGE) for v in metric.values()), default=0.0)


def decide(metric: Mapping[str, Sequence[float]], *, elapsed_s: float, target: float = CI_WIDTH,
           min_iters: int = MIN_ITERS, max_iters: int = MAX_ITERS, time_cap_s: float = TIME_CAP_S,
           hard_cap_s: float | None = None, power_target: float = POWER_TARGET) -> Decision:
    """Whether to stop, from ``metric`` (per implementation, its per-iteration
    values so far: all the same length) and the timed loop's ``elapsed_s``.

    ``time_cap_s`` is the soft cap, past which the loop goes on only while
    :func:`gate_power` is under ``power_target``; ``hard_cap_s`` (default: the
    soft one) ends it whatever the samples, before ``min_iters`` too."""
    hard = time_cap_s if hard_cap_s is None else max(hard_cap_s, time_cap_s)
    n = min((len(v) for v in metric.values()), default=0)
    width = max((relative_width(v) for v in metric.values()), default=math.inf)
    reached = width <= target
    if elapsed_s >= hard:
        return Decision(True, reached, width)
    if n < min_iters:
        return Decision(False, reached, width)
    if reached or n >= max_iters:
        return Decision(True, reached, width)
    if elapsed_s < time_cap_s:
        return Decision(False, reached, width)
    if hard <= time_cap_s:
        return Decision(True, reached, width)
    least = gate_power(metric)
    return Decision(least >= power_target, reached, width, least)


def paired_metric(folded: Mapping[str, Sequence[float]], control: str | None) -> dict[str, np.ndarray]:
    """Per implementation, its round trip over the control's per iteration
    (its round trip alone without a control): what compare's gate reads."""
    ctl = np.asarray(folded[control], dtype=float) if control in folded else None
    out = {}
    for name, rt in folded.items():
        if name == control:
            continue
        rt = np.asarray(rt, dtype=float)
        if ctl is None:
            out[name] = rt
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                r = rt / ctl
            out[name] = np.where(np.isfinite(r), r, np.inf)
    return out


class Calibrator:
    """The timed loop's ``stop``: checks every :data:`CHECK_EVERY` timed
    iterations, on the slowest rank's times all-reduced over ``group`` (every
    rank of it must use one, as every rank runs the loop)."""

    def __init__(self, *, control: str | None, group: dist.ProcessGroup | None, device: torch.device | str,
                 target: float = CI_WIDTH, min_iters: int = MIN_ITERS, max_iters: int = MAX_ITERS,
                 time_cap_s: float | None = None, hard_cap_s: float | None = None,
                 check_every: int = CHECK_EVERY) -> None:
        import torch  # here, not at the top: the app's --help reads this module's limits without torch

        self.control, self.group, self.device = control, group, torch.device(device)
        self.target, self.min_iters, self.max_iters = target, min_iters, max_iters
        # every rank reads the same environment (the pool starts them with the sweep's)
        soft, hard = time_caps()
        self.time_cap_s = time_cap_s if time_cap_s is not None else soft
        self.hard_cap_s = hard_cap_s if hard_cap_s is not None else (hard if time_cap_s is None else time_cap_s)
        self.check_every = check_every
        self.t0: float | None = None
        self.last = Decision(False, False, math.inf)
        self.iters = 0

    def __call__(self, samples: Mapping[str, Mapping[str, list[float]]]) -> bool:
        if self.t0 is None:
            self.t0 = _clock()  # the first timed iteration's end
        names = sorted(samples)
        n = len(next(iter(samples[names[0]].values()))) if names else 0
        self.iters = n
        # every iteration below the floor too (one small collective each), so
        # that iterations of seconds meet the hard cap before the floor
        due = n >= self.max_iters or n < self.min_iters or (n - self.min_iters) % self.check_every == 0
        if not due:
            return False
        import torch
        import torch.distributed as dist

        from .timing import PHASES

        # [steps, phases, n] of this rank's times (0 for a phase a step lacks), and the elapsed time
        times = torch.zeros(len(names) * len(PHASES) * n + 1, dtype=torch.float64)
        grid = times[:-1].view(len(names), len(PHASES), n)
        for i, name in enumerate(names):
            for j, phase in enumerate(PHASES):
                if phase in samples[name]:
                    grid[i, j] = torch.tensor(samples[name][phase], dtype=torch.float64)
        times[-1] = _clock() - self.t0
        times = times.to(self.device)
        dist.all_reduce(times, op=dist.ReduceOp.MAX, group=self.group)
        times = times.cpu()
        folded = {name: times[:-1].view(len(names), len(PHASES), n)[i].sum(0).numpy() for i, name in enumerate(names)}
        self.last = decide(paired_metric(folded, self.control), elapsed_s=float(times[-1]), target=self.target,
                           min_iters=self.min_iters, max_iters=self.max_iters, time_cap_s=self.time_cap_s,
                           hard_cap_s=self.hard_cap_s)
        return self.last.stop

    def record(self) -> dict[str, object]:
        """What the samples keep of the calibration."""
        width = self.last.width
        out = {"iters": self.iters, "ci_width": round(width, 4) if math.isfinite(width) else None,
               "target": self.target, "reached": self.last.reached}
        if self.last.power is not None:  # the loop ran past its soft cap for the gate's power
            out["gate_power"] = round(self.last.power, 3)
        return out
