"""Is NEW's sample really larger than BASE's? The test behind compare's gate.

The one-sided Mann-Whitney U test gives a p-value per row (:func:`p_greater`),
its null distribution exact when no value ties and neither sample holds more
than ``EXACT_MAX`` values, else its normal approximation with tie and
continuity corrections. Over the rows compared, Benjamini-Hochberg's step-up
adjustment (:func:`adjusted`) turns the p-values into ones whose rows below
``alpha`` are discoveries at false discovery rate ``alpha``. Why this test,
what that rate means with nothing changed, and why a regression must also be
beyond compare's threshold: docs/design.md, section 8.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

# The false discovery rate of one compare over its rows; with nothing changed,
# also the chance of any false alarm.
ALPHA = 0.01


def _ranks(values: np.ndarray) -> tuple[np.ndarray, float]:
    """Mid-ranks (1-based) and the tie correction sum(t^3 - t)."""
    order = np.argsort(values, kind="mergesort")
    s = values[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])  # each run of equal values (a NaN equals none)
    counts = np.diff(np.r_[starts, len(s)])
    ranks = np.empty(len(s))
    ranks[order] = np.repeat(starts + (counts + 1) / 2, counts)
    return ranks, float((counts**3 - counts).sum())


EXACT_MAX = 60  # samples a side up to which the exact distribution is used


@functools.lru_cache(maxsize=64)
def _exact_tails(n1: int, n2: int) -> np.ndarray:
    """``tails[u]`` = P(U >= u) under the null, no ties, for u = 0..n1*n2: the
    coefficients of the Gaussian binomial [n1+n2 choose n1]_q count the
    arrangements with each U."""
    counts = np.zeros(n1 * n2 + 1)
    counts[0] = 1.0
    # prod_{i=1..n1} (1 - q^(n2+i)) / (1 - q^i), as polynomial operations
    for i in range(1, n1 + 1):
        num = counts.copy()
        num[n2 + i :] -= counts[: len(counts) - n2 - i]
        for k in range(i, len(num)):  # divide by (1 - q^i): running sum with stride i
            num[k] += num[k - i]
        counts = num
    tails = np.cumsum(counts[::-1])[::-1] / counts.sum()
    tails.flags.writeable = False
    return tails


def _exact_upper_tail(u: float, n1: int, n2: int) -> float:
    """P(U >= u) under the null, no ties."""
    tails = _exact_tails(n1, n2)
    k = int(math.ceil(u))
    return float(tails[k]) if k < len(tails) else 0.0


def p_greater(base: Sequence[float], new: Sequence[float]) -> float:
    """One-sided p-value that ``new`` tends to be larger than ``base``
    (Mann-Whitney U); 1.0 when either is empty."""
    x = np.asarray(base, dtype=float)
    y = np.asarray(new, dtype=float)
    n1, n2 = len(x), len(y)
    if not n1 or not n2:
        return 1.0
    ranks, ties = _ranks(np.concatenate([x, y]))
    u = ranks[n1:].sum() - n2 * (n2 + 1) / 2  # pairs (b, n) with n > b, ties counting half
    if not ties and max(n1, n2) <= EXACT_MAX:
        return _exact_upper_tail(u, n1, n2)
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0  # every value equal: no evidence either way
    z = (u - n1 * n2 / 2 - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2))


def adjusted(pvalues: Sequence[float]) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (same order): the points whose
    adjusted value is below alpha are discoveries at false discovery rate
    alpha. NaN stays NaN and does not count."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(len(p), np.nan)
    idx = np.flatnonzero(~np.isnan(p))
    if not len(idx):
        return out
    m = len(idx)
    order = idx[np.argsort(p[idx], kind="mergesort")]
    scaled = p[order] * m / np.arange(1, m + 1)
    out[order] = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
    return out


def smallest_p(n: int) -> float:
    """The smallest one-sided p-value two samples of ``n`` each can give (no
    ties: every new value above every base value)."""
    if n <= 0:
        return 1.0
    # in logs: C(2n, n) outgrows a float from n = 515 (iters=auto runs up to 2000)
    return math.exp(-(math.lgamma(2 * n + 1) - 2 * math.lgamma(n + 1)))


def min_samples(alpha: float = ALPHA) -> int:
    """The fewest samples a side with which a difference can be significant at ``alpha``."""
    n = 1
    while smallest_p(n) >= alpha:
        n += 1
    return n


MIN_SAMPLES = min_samples()


# The power a row's samples must give the test to see a change the gate is
# said to resolve (:func:`resolved_change`); a row with less could not have
# failed, and is not a pass.
POWER_MIN = 0.8


def resolved_change(threshold: float) -> float:
    """The change a pass must have been able to flag: twice the threshold.

    A row is flagged only when its observed change is beyond the threshold,
    so a true change of exactly the threshold is observed beyond it about
    half the time, whatever the samples: no gate resolves its own threshold.
    Twice it is the first change the threshold no longer hides, and at
    compare's 15% it is the 1.3x slowdown whose detection
    benchmarks/compare_power.py measures."""
    return 2 * threshold


def _critical_u(n1: int, n2: int, alpha: float, exact: bool) -> float:
    """The smallest U that :func:`p_greater` finds significant at ``alpha``
    (``inf`` where none is)."""
    if exact:
        tails = _exact_tails(n1, n2)
        hits = np.flatnonzero(tails < alpha)
        return float(hits[0]) if len(hits) else math.inf
    n = n1 + n2
    sd = math.sqrt(n1 * n2 * (n + 1) / 12)
    return n1 * n2 / 2 + 0.5 + NormalDist().inv_cdf(1 - alpha) * sd


def power(base: Sequence[float], new: Sequence[float], change: float, alpha: float = ALPHA) -> float:
    """The chance that :func:`p_greater` finds NEW larger at ``alpha`` were NEW
    ``1 + change`` times BASE, with these two samples' sizes and noise.

    The noise is the two samples' own, each scaled to its median and pooled
    (so a change between them is not taken for noise). Under the shifted
    alternative U's mean and variance follow from P(Y > X) and the two
    covariance terms of Lehmann's formula, estimated on that noise; the
    critical U is the test's own (exact or normal, as :func:`p_greater`
    decides) and U is taken as normal around its mean."""
    x = np.asarray(base, dtype=float)
    y = np.asarray(new, dtype=float)
    n1, n2 = len(x), len(y)
    if not n1 or not n2 or not (np.median(x) > 0 and np.median(y) > 0):
        return 0.0
    noise = np.sort(np.concatenate([x / np.median(x), y / np.median(y)]))
    shifted = noise * (1 + change)

    def above(values: np.ndarray, than: np.ndarray) -> np.ndarray:
        """P(V > t) + P(V = t) / 2 for each t of ``than``, V drawn from ``values`` (sorted)."""
        lo = np.searchsorted(values, than, side="left")
        hi = np.searchsorted(values, than, side="right")
        return (len(values) - hi + (hi - lo) / 2) / len(values)

    g = above(shifted, noise)  # for each X, P(Y > X)
    h = 1 - above(noise, shifted)  # for each Y, P(X < Y)
    theta = float(g.mean())
    var = n1 * n2 * (theta * (1 - theta) + (n2 - 1) * (float((g**2).mean()) - theta**2)
                     + (n1 - 1) * (float((h**2).mean()) - theta**2))
    ties = len(np.unique(np.concatenate([x, y]))) < n1 + n2  # as p_greater decides on the samples themselves
    crit = _critical_u(n1, n2, alpha, exact=not ties and max(n1, n2) <= EXACT_MAX)
    if math.isinf(crit):
        return 0.0
    mean = n1 * n2 * theta
    if var <= 1e-12:
        return 1.0 if mean >= crit else 0.0
    return float(1 - NormalDist().cdf((crit - 0.5 - mean) / math.sqrt(var)))
