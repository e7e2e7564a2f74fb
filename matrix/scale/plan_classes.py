"""Plan classes: what kind of split a point's plan is, and batches that make each kind.

A plug-in's bug shows only on a plan that exposes it (an empty shard, a short
rank before a long one, page-aligned blocks, a graph bucket's edge), and
which plan a batch gives depends on ``cp_size`` and on the engine's split:
the same ``seq_lens`` is even at one cp and uneven at another, even in
zigzag and uneven in vLLM's DualChunkSwap. So a sweep's coverage is said in
plan classes, read off each plan itself (:func:`classify`; the
``plan_class`` column), and the conformance preset (``+matrix=conformance``)
picks its batches per cp and engine from the class (:func:`batch` and
:func:`class_split`, through the ``plan_class`` config group), so every class
is real at every cp it runs, in the split the point's engine makes.

The classes (a plan may be in several; :func:`label` joins them with ``+``)
are :func:`classes`' rules; what each plan is and what it exposes, the table
of docs/plugins.md, "Plan classes". ``uneven_by_one`` is the mildest
unevenness there is: ``T`` is a multiple of cp, so ranks cannot differ by
one row alone (one rank holds one more, another one fewer).

Pure Python: the report classifies rows without importing torch.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

CLASSES: tuple[str, ...] = ("even", "uneven_by_one", "empty_rank", "paged_uneven", "many_short", "longest_not_first",
                            "bucket_edge")
# The classes of an uneven plan (a bucket's edge may be even).
UNEVEN: tuple[str, ...] = ("uneven_by_one", "empty_rank", "paged_uneven", "many_short", "longest_not_first")
SEPARATOR = "+"
# The conformance preset's page size: pages of more than one token, several per rank.
PAGE_SIZE = 16
# The largest cp the conformance preset runs (where the machine holds its ranks).
LARGEST_CP = 8
# The longest shards at vLLM's capture-size edges (nsa_cp_comm.engines.vllm_0_33.capture_sizes:
# every 8 rows below 256, every 16 from 256 to MAX_CAPTURE_SIZE, 512), one row either side.
BUCKET_EDGES: tuple[int, ...] = (255, 256, 257, 511, 512, 513)
# The split each class's batch is made in where the engine has it (every
# class exists in zigzag at every cp from 2; the page-aligned class in
# zigzag_page, which a config asks for as split=zigzag with shared_kv=true).
CLASS_SPLIT = "zigzag"


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
        "bucket_edge": top in BUCKET_EDGES,
    }
    return tuple(c for c in CLASSES if found[c])


def classify(plan: Any) -> tuple[str, ...]:
    """The classes of a :class:`nsa_cp_comm.plan.CPPlan`."""
    return classes(plan.per_rank_tokens, policy=plan.policy, page_size=plan.page_size, seq_lens=plan.seq_lens)


def label(plan: Any) -> str:
    """A plan's ``plan_class`` cell: its classes joined with ``+``."""
    return SEPARATOR.join(classify(plan))


def bucket_edge(cp_size: int, bystanders: int = 0) -> int:
    """The longest shard of the ``bucket_edge`` batch at this cp and
    bystander count: the conformance preset's eight (cp, bystanders) cells
    (cp 2, 3, 4 and the largest, 7 or 8; 0 or 1 bystander) take the six
    :data:`BUCKET_EDGES` in turn, so one class crosses them all."""
    return BUCKET_EDGES[(2 * (cp_size - 2) + bystanders) % len(BUCKET_EDGES)]


def _zigzag_batch(plan_class: str, cp: int) -> list[int]:
    """The batches in zigzag (the batch padded to a multiple of cp, as the
    default engine pads it). Why each is in its class (request length
    ``L = 2*cp*q + r`` gives every rank ``2q`` rows, plus one to each of
    blocks ``0..r-1``; rank ``k`` owns blocks ``k`` and ``2*cp-1-k``):

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
    - ``paged_uneven``: whole pages split in 2*cp blocks, the last page partial."""
    n = 2 * cp
    return {
        "even": [16 * n],
        "uneven_by_one": [4 * n + 1, 4 * n + cp - 1],
        "empty_rank": [1, cp - 2] if cp > 2 else [1, 1],
        "longest_not_first": [4 * n + n - 1, 4 * n + cp + 1],
        "many_short": [*range(1, cp + 1)] * 2,
        "paged_uneven": [PAGE_SIZE * (2 * n + 1) + PAGE_SIZE // 2, PAGE_SIZE * n + 3],
    }[plan_class]


def _candidates(plan_class: str, cp: int) -> Iterator[list[int]]:
    """Batches to try in a split whose arithmetic has no closed form here:
    the zigzag batch first, then one request of every length (several rows
    per rank first, then fewer), then two."""
    n = 2 * cp
    yield _zigzag_batch(plan_class, cp)
    if plan_class == "many_short":
        # a contiguous split of 1..cp twice is even (cp+1 rows each); one more request is not
        yield [*range(1, cp + 1)] * 2 + [1]
        yield [1] * (n + 1)
        return
    for length in (*range(8 * n, 32 * n), *range(1, 8 * n)):
        yield [length]
    for first in range(1, 4 * n):
        yield [first, 4 * n + 1]


def batch(plan_class: str, cp_size: int, policy: str = "zigzag", *, engine: str = "seed_fix",
          bystanders: int = 0) -> list[int]:
    """``seq_lens`` whose plan at ``cp_size``, split by ``engine`` with
    ``policy`` (``zigzag_page`` with :data:`PAGE_SIZE`), is in ``plan_class``
    (and not ``even``, but for the ``even`` class and ``bucket_edge``).
    Small on purpose, a few rows per rank, so a point runs in a second; the
    ``bucket_edge`` batch's longest shard is :func:`bucket_edge` rows.
    zigzag's batches have a closed form (:func:`_zigzag_batch`); another
    split's are the first of a fixed list of candidates that makes the class,
    one the engine runs with CP where there is one (SGLang's zigzag refuses
    every request under ``2*cp`` tokens: its ``empty_rank`` and
    ``many_short`` points are skipped with that reason). An engine without
    ``policy`` is planned by the default engine's rules, as a point is (the
    point is then skipped with the engine's reason).

    Raises ValueError (one line) where the class cannot exist: every class
    but ``even`` and ``bucket_edge`` needs two ranks, and some splits never
    make some classes (vllm-ascend's contiguous slices never leave rank 0
    short: :func:`class_split` then asks for zigzag)."""
    if plan_class not in CLASSES:
        raise ValueError(f"plan_class={plan_class}: must be one of {', '.join(CLASSES)}")
    if not isinstance(cp_size, int) or isinstance(cp_size, bool) or cp_size < 1:
        raise ValueError(f"cp_size={cp_size!r}: must be a positive integer")
    return list(_made(plan_class, cp_size, str(policy), str(engine), int(bystanders)))


# A point's config resolves its batch each time it is read: the search runs once per argument set.
@functools.lru_cache(maxsize=4096)
def _made(plan_class: str, cp: int, policy: str, engine: str, bystanders: int) -> tuple[int, ...]:
    """:func:`batch`'s search, for arguments it checked."""
    if cp == 1 and plan_class not in ("even", "bucket_edge"):
        raise ValueError(f"plan_class={plan_class}: needs cp_size of at least 2 (one rank is always even)")
    if plan_class == "paged_uneven" and policy == "zigzag":  # the class's split: zigzag with shared_kv
        policy = "zigzag_page"
    from nsa_cp_comm import engines

    rules = engines.get(engine)
    if rules.strategy_refusal(policy):
        rules = engines.get(engines.DEFAULT)
    page = PAGE_SIZE if policy == "zigzag_page" else 1
    if plan_class == "bucket_edge":
        edge = bucket_edge(cp, bystanders)
        # one request; or (DualChunkSwap's chunks are not near-equal) one of whole chunks, 2*m rows a
        # rank, and a short one adding a row to the first ranks
        tries: Iterable[list[int]] = [[cp * edge - k] for k in range(2 * cp)] + [
            [2 * cp * m] + ([r] if r else []) for m in (edge // 2, (edge - 1) // 2) for r in range(2 * cp)]
    elif policy in ("zigzag", "zigzag_page") and rules.pads_batch:
        tries = [_zigzag_batch(plan_class, cp)]
    else:
        tries = _candidates(plan_class, cp)
    refused = None
    for seq_lens in tries:
        plan = rules.plan(seq_lens, cp, policy=policy, page_size=page)
        found = classify(plan)
        if plan_class == "bucket_edge":
            made = plan.max_rank_len == edge
        else:
            made = plan_class in found and ("even" in found) == (plan_class == "even")
        if made and not rules.refusal(seq_lens, cp, policy):
            return tuple(seq_lens)
        refused = refused or (seq_lens if made else None)
    if refused:
        return tuple(refused)
    name = rules.strategy_names(policy)
    raise ValueError(f"plan_class={plan_class}: engine={engine}'s {name} split makes no such plan at cp_size={cp}")


def class_split(plan_class: str, cp_size: int, *, engine: str = "seed_fix", bystanders: int = 0) -> str:
    """The split a class's batch is made in for ``engine``: :data:`CLASS_SPLIT`
    where the engine has it, else the engine's own split where that makes the
    class at ``cp_size``, else :data:`CLASS_SPLIT` (the point is then skipped
    with the engine's reason: the engine cannot make that plan)."""
    from nsa_cp_comm import engines

    own = engines.get(engine).strategies
    if CLASS_SPLIT in own:
        return CLASS_SPLIT
    try:
        batch(plan_class, cp_size, own[0], engine=engine, bystanders=bystanders)
    except ValueError:
        return CLASS_SPLIT
    return own[0]


def largest_cp(bystanders: int = 0) -> int:
    """The largest cp up to :data:`LARGEST_CP` whose world (cp plus
    ``bystanders``) this machine may start (matrix.app.budget's rank limit)."""
    from nsa_cp_comm.harness.machine import this_machine

    return max(1, min(LARGEST_CP, this_machine().max_ranks - int(bystanders)))


def _largest_cp(*, _root_: Any) -> int:
    return largest_cp(_bystanders(_root_))


def _bystanders(root: Any) -> int:
    return int(root.get("bystanders", 0) or 0)


def _plan_lens(plan_class: Any, cp: Any, *, _root_: Any) -> list[int]:
    policy = "zigzag_page" if _root_.get("shared_kv", False) else str(_root_.get("split", CLASS_SPLIT))
    return batch(str(plan_class), int(cp), policy, engine=str(_root_.get("engine", "seed_fix")),
                 bystanders=_bystanders(_root_))


def _class_split(plan_class: Any, cp: Any, *, _root_: Any) -> str:
    return class_split(str(plan_class), int(cp), engine=str(_root_.get("engine", "seed_fix")),
                       bystanders=_bystanders(_root_))


# The config's resolvers of plan classes (matrix.app.config.register_resolvers registers them):
# ``${matrix.plan_lens:CLASS,CP}`` and ``${matrix.class_split:CLASS,CP}`` (conf/plan_class/*.yaml: the
# batch, in the split the point's engine makes it in) and ``${matrix.largest_cp:}``
# (conf/conformance_cp/largest.yaml). Each reads the point's own engine, split, shared_kv and
# bystanders from its config: config values, not sweep parameters, so they are resolved per point.
RESOLVERS = {"matrix.plan_lens": _plan_lens, "matrix.class_split": _class_split, "matrix.largest_cp": _largest_cp}
