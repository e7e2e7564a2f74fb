"""Plan classes: what kind of split a point's plan is, and batches that make each kind.

A plug-in's bug shows only on a plan that exposes it (an empty shard, a short
rank before a long one, page-aligned blocks), and which plan a batch gives
depends on ``cp_size``: the same ``seq_lens`` is even at one cp and uneven at
another. So a sweep's coverage is said in plan classes, read off each plan
itself (:func:`classify`; the ``plan_class`` column), and the conformance
preset (``+matrix=conformance``) picks its batches per cp from the class
(:func:`batch`, through the ``plan_class`` config group), so every class is
real at every cp it runs.

The classes (a plan may be in several; :func:`label` joins them with ``+``):

- ``even``: every rank holds the same number of rows.
- ``uneven_by_one``: uneven, and no rank more than one row from the even share
  ``T/cp`` (the mildest unevenness there is: ``T`` is a multiple of cp, so
  ranks cannot differ by one row alone; one rank holds one more, another one
  fewer).
- ``empty_rank``: a rank holds no rows.
- ``paged_uneven``: the page-aligned shared-KV split (``zigzag_page``) with
  pages of more than one token, uneven.
- ``many_short``: at least ``2*cp`` requests, each shorter than ``2*cp``
  tokens (fewer than one row per zigzag block).
- ``longest_not_first``: rank 0 holds fewer rows than the longest shard.

Pure Python: the report classifies rows without importing torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CLASSES: tuple[str, ...] = ("even", "uneven_by_one", "empty_rank", "paged_uneven", "many_short", "longest_not_first")
UNEVEN: tuple[str, ...] = CLASSES[1:]
SEPARATOR = "+"
# The conformance preset's page size: pages of more than one token, several per rank.
PAGE_SIZE = 16
# The largest cp the conformance preset runs (where the machine holds its ranks).
LARGEST_CP = 8


def classes(per_rank: Sequence[int], *, policy: str, page_size: int, seq_lens: Sequence[int]) -> tuple[str, ...]:
    """The classes of a plan with ``per_rank`` rows per rank (in :data:`CLASSES` order)."""
    cp, total = len(per_rank), sum(per_rank)
    top, even = max(per_rank), len(set(per_rank)) == 1
    share = total / cp
    found = {
        "even": even,
        "uneven_by_one": not even and all(abs(n - share) <= 1 for n in per_rank),
        "empty_rank": min(per_rank) == 0,
        "paged_uneven": not even and policy == "zigzag_page" and page_size > 1,
        "many_short": len(seq_lens) >= 2 * cp and max(seq_lens) < 2 * cp,
        "longest_not_first": per_rank[0] < top,
    }
    return tuple(c for c in CLASSES if found[c])


def classify(plan: Any) -> tuple[str, ...]:
    """The classes of a :class:`nsa_cp_comm.plan.CPPlan`."""
    return classes(plan.per_rank_tokens, policy=plan.policy, page_size=plan.page_size, seq_lens=plan.seq_lens)


def label(plan: Any) -> str:
    """A plan's ``plan_class`` cell: its classes joined with ``+``."""
    return SEPARATOR.join(classify(plan))


def batch(plan_class: str, cp_size: int) -> list[int]:
    """``seq_lens`` whose plan at ``cp_size`` is in ``plan_class`` (zigzag; the
    ``paged_uneven`` batch with the page-aligned split and :data:`PAGE_SIZE`).
    Small on purpose: a few rows per rank, so a point runs in a second.

    Why each is in its class (zigzag: request length ``L = 2*cp*q + r`` gives
    every rank ``2q`` rows, plus one to each of blocks ``0..r-1``; rank ``k``
    owns blocks ``k`` and ``2*cp-1-k``):

    - ``even``: one request of ``32*cp`` rows, ``r = 0``.
    - ``uneven_by_one``: ``r = 1`` (rank 0 one more), then ``r = cp-1`` (ranks
      ``0..cp-2`` one more): rank 0 at share+1, rank cp-1 at share-1.
    - ``empty_rank``: ``[1, cp-2]`` (``[1, 1]`` at cp 2): fewer tokens than
      ranks; the batch padded to ``cp`` lengthens the last request to
      ``cp-1``, one token on each of ranks ``0..cp-2``, the first request's on
      rank 0, none on rank cp-1.
    - ``longest_not_first``: ``r = 2*cp-1`` (every rank two more but rank 0),
      then ``r = cp+1`` (rank cp-1 two more): ranks grow from 0 to cp-1.
    - ``many_short``: lengths ``1..cp`` twice: rank ``k`` gets ``2*(cp-k)`` rows.
    - ``paged_uneven``: whole pages split in 2*cp blocks, the last page partial.

    Raises ValueError (one line) where the class cannot exist: every class
    but ``even`` needs two ranks."""
    if plan_class not in CLASSES:
        raise ValueError(f"plan_class={plan_class}: must be one of {', '.join(CLASSES)}")
    if not isinstance(cp_size, int) or isinstance(cp_size, bool) or cp_size < 1:
        raise ValueError(f"cp_size={cp_size!r}: must be a positive integer")
    cp, n = cp_size, 2 * cp_size
    if plan_class == "even":
        return [16 * n]
    if cp == 1:
        raise ValueError(f"plan_class={plan_class}: needs cp_size of at least 2 (one rank is always even)")
    if plan_class == "uneven_by_one":
        return [4 * n + 1, 4 * n + cp - 1]
    if plan_class == "empty_rank":
        return [1, cp - 2] if cp > 2 else [1, 1]
    if plan_class == "longest_not_first":
        return [4 * n + n - 1, 4 * n + cp + 1]
    if plan_class == "many_short":
        return [*range(1, cp + 1)] * 2
    # paged_uneven
    return [PAGE_SIZE * (2 * n + 1) + PAGE_SIZE // 2, PAGE_SIZE * n + 3]


def largest_cp(bystanders: int = 0) -> int:
    """The largest cp up to :data:`LARGEST_CP` whose world (cp plus
    ``bystanders``) this machine may start (matrix.budget's rank limit)."""
    from nsa_cp_comm.harness.machine import this_machine

    return max(1, min(LARGEST_CP, this_machine().max_ranks - int(bystanders)))


def _largest_cp(*, _root_: Any) -> int:
    return largest_cp(int(_root_.get("bystanders", 0) or 0))


# The config's resolvers of plan classes (matrix.config.register_resolvers registers them):
# ``${matrix.plan_lens:CLASS,CP}`` (conf/plan_class/*.yaml) and ``${matrix.largest_cp:}``
# (conf/conformance_cp/largest.yaml: the largest cp for the point's own ``bystanders``, which the
# resolver reads from the point's config: a config value, not a sweep parameter, so it is resolved per point).
RESOLVERS = {"matrix.plan_lens": lambda c, cp: batch(str(c), int(cp)), "matrix.largest_cp": _largest_cp}
