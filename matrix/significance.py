"""Is NEW's sample really larger than BASE's? The test behind compare's gate.

A regression is a difference the samples support, not two medians apart:
the one-sided Mann-Whitney U test (rank-sum; no assumption on the shape of the
distributions, robust to the long upper tail that timings have) gives a
p-value per row (:func:`p_greater`). The U statistic's null distribution is
exact when no value ties and neither sample holds more than ``EXACT_MAX``
values (the matrix's iters: 8 to a few dozen), else its normal approximation
with tie and continuity corrections.

Over the rows compared, Benjamini-Hochberg's step-up adjustment
(:func:`adjusted`) turns the p-values into ones whose rows below ``alpha``
are discoveries at false discovery rate ``alpha``: of the rows flagged, a
fraction ``alpha`` at most is expected to be false. When nothing changed (an
A/A pair) every discovery is false, so that is also the chance of any false
alarm in one compare. As asv does, a difference must be significant *and*
beyond a threshold.

Samples of two runs are not exchangeable on a shared machine (a run-wide
drift moves all of one run's samples), so significance alone flags drift: a
regression must also be beyond compare's threshold, which the drift measured
between the runs should stay under (compare says when it does not).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# The false discovery rate of one compare over its rows; with nothing changed,
# also the chance of any false alarm.
ALPHA = 0.01


def _ranks(values: np.ndarray) -> tuple[np.ndarray, float]:
    """Mid-ranks (1-based) and the tie correction sum(t^3 - t)."""
    order = np.argsort(values, kind="mergesort")
    sorted_vals = values[order]
    ranks = np.empty(len(values), dtype=float)
    ties = 0.0
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    return ranks, ties


EXACT_MAX = 60  # samples a side up to which the exact distribution is used


def _exact_upper_tail(u: float, n1: int, n2: int) -> float:
    """P(U >= u) under the null, no ties: the coefficients of the Gaussian
    binomial [n1+n2 choose n1]_q count the arrangements with each U."""
    counts = np.zeros(n1 * n2 + 1)
    counts[0] = 1.0
    # prod_{i=1..n1} (1 - q^(n2+i)) / (1 - q^i), as polynomial operations
    for i in range(1, n1 + 1):
        num = counts.copy()
        num[n2 + i :] -= counts[: len(counts) - n2 - i]
        for k in range(i, len(num)):  # divide by (1 - q^i): running sum with stride i
            num[k] += num[k - i]
        counts = num
    total = counts.sum()
    return float(counts[int(math.ceil(u)) :].sum() / total)


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
