"""The context-parallel bugs the serving engines shipped this year, replayed: a catalog users can run.

Each entry of :data:`BUGS` is one tracker's bug, written as a correct padded
round trip (:mod:`.bugs` ``twin``) broken the way that bug broke its engine;
``python -m matrix +matrix=field_bugs`` runs every one beside the twin on the
plan classes at cp 2, 3 and 4, and ``python -m examples.field_bugs.table``
renders docs/field_bugs.md from that sweep's results. For each bug,
``shows(plan)`` says on which plans its mechanism changes what the round trip
returns (there the matrix must name ``check``); everywhere else the row must
be ``ok``, as the twin's must be everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nsa_cp_comm.plan import CPPlan


@dataclass(frozen=True)
class FieldBug:
    """One tracker bug: where it was filed, the engine it broke, what went wrong, the
    matrix check that names it, and the plans its mechanism shows on."""

    name: str
    trackers: str
    engine: str
    mechanism: str
    check: str
    shows: Callable[[CPPlan], bool]


def _uneven(plan: CPPlan) -> bool:
    return not plan.is_even


def _short_with_rows(plan: CPPlan) -> bool:
    # a rank with rows, fewer than the longest: its padding follows real rows
    return any(0 < n < plan.max_rank_len for n in plan.per_rank_tokens)


def _empty_rank(plan: CPPlan) -> bool:
    return min(plan.per_rank_tokens) == 0


def _stride_differs(plan: CPPlan) -> bool:
    # a rank past the first, with rows, whose own length is not the stride m
    return any(0 < n != plan.max_rank_len for r, n in enumerate(plan.per_rank_tokens) if r > 0)


def _longest_over_ceil(plan: CPPlan) -> bool:
    # the pad target ceil(T/cp) is short of the longest rank
    return plan.max_rank_len > -(-plan.total_tokens // plan.cp_size)


def _listed_rank_differs(plan: CPPlan) -> bool:
    # ranks listed TP-major ([0, 2, 1, 3]) from cp 3 on: a rank whose listed index names a rank of another length
    listed = unsorted_listing(plan.cp_size)
    return any(plan.per_rank_tokens[r] != plan.per_rank_tokens[listed.index(r)] for r in range(plan.cp_size))


def unsorted_listing(cp: int) -> list[int]:
    """The group's ranks listed as vLLM 0.33 listed its DCP group (``dcp_ranks.transpose``, e.g.
    ``[0, 2, 1, 3]`` for 4 ranks): even ranks first, then odd."""
    return list(range(0, cp, 2)) + list(range(1, cp, 2))


def _always(plan: CPPlan) -> bool:
    return plan.cp_size > 1


def _side_misplaced(plan: CPPlan) -> bool:
    # the engine gathers a side tensor (vLLM's router logits), and a rank with rows has a short rank
    # before it: its rows packed start at sum(n_<r), padded at r*m
    from nsa_cp_comm import engines

    if not engines.of(plan).side_tensors:
        return False
    per_rank, m = plan.per_rank_tokens, plan.max_rank_len
    return any(n > 0 and sum(per_rank[:r]) != r * m for r, n in enumerate(per_rank))


def _padding_routed(plan: CPPlan) -> bool:
    # the point's model's router masks the padding rows it is told of (vLLM's DeepSeek-V4), and the
    # gathered buffer has some
    from nsa_cp_comm import engines

    return engines.of(plan).moe_pad_masked and _uneven(plan)


# The check column of a bug the implementation's own code trips over: the row is an ``error`` whose
# reason carries the exception, raised inside the round trip before any check could judge it.
RAISED = "raised"

BUGS: tuple[FieldBug, ...] = (
    FieldBug("wrong_group", "SGLang #24560", "SGLang",
             "the round trip's collectives on the default (world) group instead of the CP group",
             "group", _always),
    FieldBug("empty_rank_returns", "SGLang #18280, vLLM #53573, vllm-ascend #12009, SGLang #22003", "SGLang, vLLM",
             "a rank with no rows returns before the gather: its peers wait in the collective",
             "collective_skipped", _empty_rank),
    FieldBug("shared_before_rs", "SGLang #35535", "SGLang",
             "a replicated shared expert added before the reduce-scatter, which sums it cp times",
             "reference_moe", _always),
    FieldBug("ceil_pad", "SGLang #23269", "SGLang",
             "the pad target is ceil(T/cp), not the longest rank: a longer rank's pad is a no-op and the "
             "gather's sizes disagree", "collective_shapes", _longest_over_ceil),
    FieldBug("own_stride_scatter", "SGLang #20360", "SGLang",
             "the scatter takes this rank's rows at rank * n_r of the summed buffer, not rank * m: "
             "garbage rows, no error", "scatter_chunk", _stride_differs),
    FieldBug("residual_gathered_rows", "SGLang #21170", "SGLang",
             "a residual sized by the gathered rows where the local rows were meant (885 vs 7080)",
             RAISED, _always),
    FieldBug("nonzero_padding", "SGLang #30895", "SGLang",
             "padding rows left non-zero (a copy of the last real row) going into the collective",
             "padding_zero", _short_with_rows),
    FieldBug("unsorted_group", "vLLM 0.33 parallel_state.py:2257 (sorted in 0.34.0, :2260-2266)", "vLLM",
             "the group's ranks listed unsorted: the rank taken from the listing disagrees with the "
             "collective's output order", "scatter_chunk", _listed_rank_differs),
    FieldBug("padded_length_returned", "TE #3331, SGLang #23415", "TransformerEngine, SGLang",
             "padded and unpadded lengths confused: the scatter returns the padded m rows, not n_r",
             "scatter_chunk", _uneven),
    FieldBug("all_zero_output", "TE #3536", "TransformerEngine",
             "an all-zero output (the kernel never ran) that a parity check against the same backend's "
             "non-CP run passed", "scatter_chunk", _always),
    FieldBug("side_layout", "vllm-ascend #16834", "vllm-ascend",
             "a side tensor (the router logits) gathered packed, rank r's rows at sum(n_<r), while the hidden "
             "states are gathered padded, at r*m: the experts route rows by other rows' logits",
             "side_tensors", _side_misplaced),
    FieldBug("padding_unmarked", "SGLang #31838, vLLM #38128", "SGLang, vLLM",
             "the gathered buffer's padding rows left unmarked for a router that masks what it is told: every "
             "padding row routed, the identical ones all to the same experts (one expert's load and its "
             "statistics skewed)", "padding_routing", _padding_routed),
)

# Filed, and not yet caught (tracker, mechanism, where it stands): none today.
NOT_YET: tuple[tuple[str, str, str], ...] = ()

BY_NAME = {b.name: b for b in BUGS}
