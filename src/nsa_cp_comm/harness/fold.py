"""Fold every rank's findings for a point into one result per implementation.

A point is correct only if it is correct on every rank; its error is the
largest; its times are per-iteration maxima over ranks (nsa_cp_comm.harness.timing).
Rows and bytes are what the implementation's collectives moved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import engines, origins
from .. import impls as impl_registry
from ..hooks import HookError
from ..plan import CPPlan
from ..protocol import RoundTripImpl
from .calibrate import CALIBRATION
from .spec import DTYPE_BYTES, PointSpec
from .timing import CONTROL, fold_phases, roundtrip_bandwidth, summarize


@dataclass
class ImplResult:
    """One implementation's result for a point, over all ranks."""

    impl: str
    status: str
    reason: str = ""
    failed_check: str = ""
    correct: bool | None = None
    max_rel_err: float | None = None
    even_bitwise_equal: bool | None = None
    stats: dict[str, dict[str, float]] = field(default_factory=dict)
    rows_moved: int | None = None
    bytes_padded: int | None = None
    bytes_useful: int | None = None
    attn_pad_rows: int | None = None
    moe_pad_rows: int | None = None
    attn_pad_masked_rows: int | None = None
    moe_pad_masked_rows: int | None = None
    moe_pad_expert_max_rows: int | None = None
    graph_pad_rows: int | None = None
    algbw_padded_GBps: float | None = None
    busbw_padded_GBps: float | None = None
    algbw_useful_GBps: float | None = None
    busbw_useful_GBps: float | None = None
    origin: str = ""
    # Per timed iteration (slowest rank), in us: every phase (``local`` when
    # timed, ``gather``, ``scatter``, ``collective``, ``roundtrip``) and
    # ``control``, the A/A control's round trip in the same iterations (empty
    # without one). Empty when not timed.
    samples: dict[str, list[float]] = field(default_factory=dict)
    # iters=auto: how the timed loop's length was decided (.calibrate.Calibrator.record).
    calibration: dict[str, Any] = field(default_factory=dict)
    # Where a rank raised: its traceback (rank numbered as in the CP group), for a single-point run's console.
    traceback: str = ""


def origin_of(name: str) -> str:
    try:
        return origins.origin(impl_registry.get(name))
    except ValueError:
        return ""


def agreed_status(statuses: set[str]) -> str | None:
    """The row's status from the outcomes every rank reported (``""``: it ran; ``refused``;
    ``passthrough``), when they are one; None when some ranks refused or passed through and
    others did not (``rank_agreement``)."""
    return {frozenset({"refused"}): "refused", frozenset({"passthrough"}): "passthrough",
            frozenset({""}): "ok"}.get(frozenset(statuses))


def _stride_elsewhere(name: str, plan: CPPlan, reps: list[dict[str, Any]]) -> str:
    """Why a round trip's rows cannot describe what its ranks ran ('' when
    they can): its ``row_stride`` answered this process (where the rows'
    buffer columns come from) otherwise than its ranks (whose checks used
    their own). An answer about the plan alone must be the same wherever it
    is asked."""
    asked = {rep.get("stride") for rep in reps} - {None}
    if not asked:
        return ""
    impl = impl_registry.get(name)
    try:
        here = impl.stride(plan) if isinstance(impl, RoundTripImpl) else None
    except HookError as exc:
        return str(exc)
    if asked == {here}:
        return ""
    return (f"impl {name!r}: row_stride(plan) answered {here} where the rows are folded and "
            f"{', '.join(map(str, sorted(asked)))} on the ranks: an answer about the plan alone must be the same "
            "wherever it is asked (the row's buffer columns would describe a buffer its ranks did not use)")


def fold_reports(spec: PointSpec, plan: CPPlan, per_rank: list[dict[str, dict[str, Any]]]) -> list[ImplResult]:
    """Combine every rank's reports (``asdict`` of checks.ImplReport) per implementation."""
    itemsize = DTYPE_BYTES[spec.dtype]
    control = per_rank[0].get(CONTROL)
    control_rt = fold_phases([r[CONTROL]["samples"] for r in per_rank])["roundtrip"] if control else []
    results = []
    for name in spec.impls:
        reps = [r[name] for r in per_rank]
        statuses = {rep["status"] for rep in reps}
        if statuses == {"skipped"}:
            results.append(ImplResult(name, "skipped", reason=reps[0]["reason"], origin=origin_of(name)))
            continue
        failures = [(check, f"rank {rank}: {msg}") for rank, rep in enumerate(reps) for check, msg in rep["failures"]]
        errs = [rep["max_rel_err"] for rep in reps if rep["max_rel_err"] is not None]
        evens = [rep["even_bitwise_equal"] for rep in reps if rep["even_bitwise_equal"] is not None]
        agreed = agreed_status(statuses)
        # a row whose checks failed says why; one that passed must describe the buffer its ranks used
        moved = "" if failures else _stride_elsewhere(name, plan, reps)
        if moved:
            results.append(ImplResult(name, "error", reason=moved, origin=origin_of(name)))
            continue
        if failures:
            status = "failed"
        elif agreed is not None:
            status = agreed
        else:
            status = "failed"
            failures = [("rank_agreement", f"ranks disagree on the outcome: {sorted(statuses)}")]
        res = ImplResult(
            name,
            status,
            reason="; ".join(msg for _, msg in failures[:3]) or reps[0]["reason"],
            failed_check=failures[0][0] if failures else "",
            correct=all(rep["correct"] for rep in reps) and not failures,
            max_rel_err=max(errs) if errs else None,
            even_bitwise_equal=all(evens) if len(evens) == len(reps) else None,
            origin=origin_of(name),
        )
        if status == "ok" and reps[0]["samples"]:
            folded = fold_phases([rep["samples"] for rep in reps])
            res.stats = {phase: summarize(xs) for phase, xs in folded.items()}
            res.samples = {**folded, "control": control_rt}
            res.calibration = dict(per_rank[0].get(CALIBRATION) or {})
            try:
                _bandwidth(res, reps, spec, plan, itemsize)
            except HookError as exc:  # an answer that changed since the point began
                res = ImplResult(name, "error", reason=str(exc), origin=origin_of(name))
        results.append(res)
    return results


def _bandwidth(res: ImplResult, reps: list[dict[str, Any]], spec: PointSpec, plan: CPPlan, itemsize: int) -> None:
    """Rows, bytes and nccl-tests bandwidths over the collectives' time."""
    impl = impl_registry.get(res.impl)
    coll_us = res.stats["collective"]["p50"]
    cp = plan.cp_size
    scattered = impl.mode == "SCATTERED"
    # A dispatch sends each token once per destination rank (itself included); the combine returns as many.
    res.rows_moved = sum(rep["rows_sent"] or 0 for rep in reps) if scattered else impl.buffer_rows(plan)
    res.bytes_padded = res.rows_moved * spec.hidden_size * itemsize
    res.bytes_useful = plan.total_tokens * spec.hidden_size * itemsize
    if scattered or cp > 1:  # with one rank a gather moves nothing: no bandwidth
        # alltoall semantics: S = bytes per rank (total / cp), so busbw compares with the gather's
        share = cp if scattered else 1
        res.algbw_padded_GBps, res.busbw_padded_GBps = roundtrip_bandwidth(res.bytes_padded // share, coll_us, cp)
        res.algbw_useful_GBps, res.busbw_useful_GBps = roundtrip_bandwidth(res.bytes_useful // share, coll_us, cp)
    if scattered:
        return
    # every gathered row that is not one of the batch's raw tokens (an engine that pads the batch to a
    # multiple of cp splits its alignment tokens as rows too)
    res.moe_pad_rows = res.rows_moved - sum(plan.seq_lens)
    res.attn_pad_rows = impl.stride(plan) - min(plan.per_rank_tokens) if impl.pads_split else 0
    # whether attention computes those rows or zeroes their output is the engine's; whether the
    # MoE's router masks them is the engine's for the model it serves
    rule = engines.of(plan)
    res.attn_pad_masked_rows = res.attn_pad_rows if rule.attn_pad_masked else 0
    # what the checks' MoE did with the padding rows of the buffer the implementation returned
    # (the engine's router for its model), where it ran; the rule's count where it did not
    res.moe_pad_masked_rows = (reps[0].get("pad_rows_masked") if reps[0].get("pad_rows_masked") is not None
                               else res.moe_pad_rows if rule.moe_pad_masked else 0)
    res.moe_pad_expert_max_rows = reps[0].get("pad_expert_max")
    # the rows past the split's own padded length, where the step runs in a CUDA-graph bucket
    eager = rule.split_len(plan.max_rank_len, plan.policy, cp)
    res.graph_pad_rows = (impl.stride(plan) - eager) * cp if impl.pads_split and impl.stride(plan) > eager else 0
