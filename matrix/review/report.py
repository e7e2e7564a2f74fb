"""Summarise a results table into ``report.json``, ``report.md``, ``report_appendix.md`` and three PNG plots
(the command: :mod:`matrix.report.cli`).

RESULTS is a results directory (its ``results.csv``, or the ``results.csv``
files below it, concatenated) or a CSV file. The files are written next to the
CSV (or into the directory given, when several were concatenated), or into
``--out``; report.md is also printed. What report.md says, in which order, and
the like-with-like rule (matrix.review.side_by_side): docs/review.md.

report.json is the source of truth: every table as records with the points
its figures cover; report.md and the appendix are rendered from it
(matrix.review.report_doc). A section is a function of the typed rows and what is
derived from them once (:class:`Derived`) returning a :class:`Part`: lines and
tables (:func:`_head`, :func:`_whole`) for report.md and for the appendix.

The verdict is FAIL for an incorrect, failed, error or timeout row (the exit
code it gives: :mod:`matrix.report.cli`); report.json's ``verdict`` and ``reasons`` say which.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .. import count
from . import coverage, designs, plots, report_doc
from ..scale import workload
from ._review import (
    POINT_KEY, SPREAD, Run, fmt, frame_md, holds, layout_label, m_stride, one_line,
    point_codes, typed, world,
)
from ..store.outputs import write_atomic
from .report_doc import Show, table
from ..store.results import BAD_STATUSES, CONFIG_COLUMNS, STATUS_VALUES
from .side_by_side import (common, group_keys, missing_label, mixed, point_ids, same_origin, to_reference,
                           wall_time)

REPORT_FILE = "report.md"
JSON_FILE = "report.json"
DEFAULT_REFERENCE = "padded"
APPENDIX_FILE = "report_appendix.md"

# One sentence per status, in the order of the verdict table.
STATUS_MEANING: dict[str, str] = {
    "ok": "ran, passed its checks against the reference, and was timed.",
    "failed": "ran, but a check failed (`failed_check` names the first).",
    "error": "a rank raised, crashed or could not start in this implementation's turn (the reason names the place), "
             "or it was not run after another's failure; no verdict.",
    "timeout": "a rank hung past `timeout_s` in this implementation's turn and the point was stopped (the point's "
               "other implementations are rerun on fresh ranks).",
    "skipped": "not run: an `mlp_mode` that contradicts the backend, a backend the implementation lacks, or the "
               "same effective configuration already ran (the reason names it).",
    "refused": "the legacy path on an uneven plan: every rank refused before any collective, as it must (no timings).",
    "passthrough": "SCATTERED mode: the communicator moves nothing; rows checked untouched, nothing timed.",
}

# Per row, or joined from the run each row names (matrix.store.runs): the same either way.
ENV_FIELDS = ("torch_version", "nccl_version", "python_version", "nsa_cp_comm_version", "host", "device_name",
              "backend", "device", "git_sha", "impl_origin")
# What the appendix lists of each run that wrote the rows.
RUN_FIELDS = ("started", "host", "git_sha", "command")
POINT = ["impl", "policy", "cp_size", "page_size", "seq_lens", "mlp_mode"]
PLAN_KEY = ["policy", "cp_size", "page_size", "seq_lens", "align"]
PAIR = "_pair"  # a point's key without impl: padded and legacy rows of one point share it
PID = "_pid"  # the point's id in report.json (side_by_side.point_ids)
COMMON = "_common"  # a timed round-trip row of a point every impl of its cp size was timed at
MISSING = "_missing"  # for the other timed rows: which impls were not timed there, and why
HEAD_ROWS = 8  # long tables in report.md stop here; the appendix has them whole
APPENDIX_ROWS = report_doc.RECORDS_MAX  # and the appendix stops here (a 200k-row run is for tools, not eyes)
# What the report reads of a results file (and which of it is numeric); the
# other timing columns are skipped, which halves the load of a big file.
NUMBERS = ("cp_size", "page_size", "total_tokens", "max_rank_len", "padded_total", "padding_frac", "max_rel_err",
           "roundtrip_p50_us", SPREAD, "local_p50_us", "busbw_padded_GBps", "busbw_useful_GBps", "bytes_padded",
           "bytes_useful", "wall_s", "attn_pad_rows", "moe_pad_rows", "collective_p50_us")
READ = (*CONFIG_COLUMNS, *NUMBERS, "policy", "is_even", "claim_holds", "status", "reason", "failed_check", "correct",
        "even_bitwise_equal", *ENV_FIELDS, *RUN_FIELDS, "run_id", "timestamp", "overrides", "repro", "workload",
        "plan_class", "effective_page_size", "bystanders", "point_id")


@dataclass
class Part:
    """A section's blocks for report.md and for the appendix: lines of
    markdown, and tables shown (report_doc.Show, from :func:`_head` and :func:`_whole`)."""

    main: list = field(default_factory=list)
    appendix: list = field(default_factory=list)


@dataclass(frozen=True)
class Derived:
    """What several parts of one report read, computed once per report."""

    pairs: pd.DataFrame  # :func:`ratios`: each impl over the reference, on the points all impls were timed
    plans: pd.DataFrame  # :func:`_plans`: one row per distinct split plan
    reference: str = DEFAULT_REFERENCE
    timed: pd.DataFrame = field(default_factory=pd.DataFrame)  # :func:`timed_round_trips`


# --- helpers


def timed(df: pd.DataFrame, metric: str = "roundtrip_p50_us") -> pd.Series:
    """Rows with a measurement: status ok and a value of ``metric``."""
    return df["status"].eq("ok") & df[metric].notna()


def round_trip(df: pd.DataFrame) -> pd.Series:
    """Rows of the communicator's round trip (all-gather + reduce-scatter, FULL
    mode); the MoE all-to-all (``a2a``, SCATTERED mode) is another operation."""
    return df["mlp_mode"].ne("SCATTERED")


def timed_round_trips(df: pd.DataFrame) -> pd.DataFrame:
    """The timed round-trip rows, each marked :data:`COMMON` (its point was timed
    by every impl timed at its cp size) or not, and then :data:`MISSING` says
    which impls were not timed there and why."""
    rows = df[timed(df) & round_trip(df)]
    mask = common(rows, PAIR)
    return rows.assign(**{COMMON: mask, MISSING: missing_label(df, rows, ~mask, PAIR)})


def ref_ratio(pairs: pd.DataFrame) -> dict[str, dict]:
    """Per impl, its round trip over the reference's on the points where every
    impl was timed, cp > 1 (at cp=1 nothing moves; explained apart): median and
    quartiles, and how many points."""
    r = pairs[pairs["cp_size"].gt(1)].dropna(subset=["ratio"])
    return {str(impl): {"n": len(s), "median": float(s.median()), "q1": float(s.quantile(0.25)),
                        "q3": float(s.quantile(0.75))} for impl, s in r.groupby("impl")["ratio"]}


def _ratio_words(derived: Derived, failing: frozenset[str] = frozenset()) -> str:
    """What the verdict says of the ratios to the reference, from what was timed; for an impl
    with ``failing`` rows (failed, error or timeout: timed only where it passed) no ratio, but why."""
    ref, rows = derived.reference, derived.timed
    rr = ref_ratio(derived.pairs)
    if rr:
        each = "; ".join(f"{impl}/{ref}: no ratio quoted, it has failing rows (timed only where it passed)"
                         if impl in failing else
                         f"{impl}/{ref} {v['median']:.2f} (quartiles {v['q1']:.2f}-{v['q3']:.2f} over "
                         f"{count(v['n'], 'point')})" for impl, v in rr.items())
        return f"round trip relative to {ref} (cp > 1, on the points every impl was timed): {each}"
    impls = sorted(set(rows["impl"])) if len(rows) else []
    if not impls:
        return "no round trip was timed"
    if ref not in impls:
        return (f"no ratio: the reference {ref} has no timed round trip (timed: {', '.join(impls)}; "
                "`--reference` names another)")
    if impls == [ref]:
        return f"only {ref} was timed: nothing to compare"
    return f"no point with cp > 1 has {ref} and another impl timed"


def verdict(df: pd.DataFrame) -> tuple[str, list[str]]:
    """The report's verdict (``PASS``, ``FAIL`` or ``NOTHING CHECKED``) and
    its reasons, each a whole sentence: what made it FAIL, or why nothing was
    checked; none for PASS. report.json holds both; the exit code follows it."""
    bad, failing = _incorrect(df), _failing(df)
    reasons = []
    if len(bad):
        reasons.append(f"incorrect results: {_rows_of_points(bad)} (`correct` or `even_bitwise_equal` is False)")
    if len(failing):
        statuses = ", ".join(f"{s} {n}" for s, n in failing["status"].value_counts().items())
        reasons.append(f"failed, error or timeout: {_rows_of_points(failing)} ({statuses})")
    if reasons:
        return "FAIL", reasons
    if not int(df["status"].ne("skipped").sum()):
        return "NOTHING CHECKED", [f"every row is skipped ({count(len(df), 'row')}): no point was run"]
    return "PASS", []


def verdict_line(df: pd.DataFrame, derived: Derived) -> str:
    """The report's first line: what a reviewer acts on."""
    points = int(df[PAIR].nunique())
    bad, failing = _incorrect(df), _failing(df)
    parts = [f"{count(points, 'point')}, {count(len(df), 'row')} (a row: one point and one impl)"]
    parts.append(f"**!!! INCORRECT RESULTS: {_rows_of_points(bad)} !!!**" if len(bad)
                 else "correct everywhere checked" if not len(failing)
                 else "no incorrect result among the rows whose checks ran")
    parts.append(f"**failed, error or timeout: {_rows_of_points(failing)}**" if len(failing)
                 else "none failed, errored or timed out")
    parts.append(_ratio_words(derived, frozenset(failing["impl"].astype(str))))
    return f"**Verdict: {verdict(df)[0]}**: " + "; ".join(parts) + "."


def _rows_of_points(rows: pd.DataFrame) -> str:
    """``3 rows of 2 points``: rows counted as rows, the points they fall on as points."""
    return f"{count(len(rows), 'row')} of {count(int(rows[PAIR].nunique()), 'point')}"


def _label(value: object) -> str:
    return fmt(value) or "(empty)"


# What each table of report.json holds, by name.
TITLES = {
    "statuses": "rows per status and impl",
    "incorrect_points": "incorrect rows (correct or even_bitwise_equal False)",
    "incorrect_points_detail": "incorrect rows, with their reason",
    "failing_groups": "failed, error and timeout rows by status, impl and first failed check (or reason)",
    "failing_points": "failed, error and timeout rows",
    "skipped_reasons": "skipped rows by reason",
    "skipped_points": "skipped rows",
    "claim": "split plans per policy: how many, where the claim holds and fails",
    "claim_fails": "plans where the claim fails, most padded first",
    "latency": "round-trip p50 (us) by impl, median over the points every impl of the cp size was timed; "
               "X/reference: the median per-point ratio",
    "latency_only_some": "round-trip p50 (us) on the points timed by only some impls, by which were not timed and why",
    "latency_by_policy": "round-trip p50 (us) by cp size, impl and policy over the points every impl was timed",
    "ratios": "each impl's round-trip p50 over the reference's, on the points every impl of the cp size was timed",
    "ratios_by_policy": "the ratios to the reference by cp size, impl and policy",
    "ratios_per_point": "the ratio to the reference at each point",
    "bandwidth": "bus bandwidth (GB/s) by impl, median over the points with cp > 1 every impl was timed; "
                 "mean padding_frac over them",
    "bandwidth_by_page": "bus bandwidth (GB/s) by cp size, impl and page size over the same points",
    "padding": "mean padding fraction over the batches by cp size and layout",
    "runs": "the runs (processes) that wrote the rows, from runs.jsonl",
}


def _head(frame: pd.DataFrame, what: str, name: str, index: bool = False, rows: int = HEAD_ROWS, **points) -> list:
    """A table cut at ``rows``, saying where the rest is (``name``: its name in
    report.json, a key of TITLES; ``points``: see report_doc.Table)."""
    t = table(name, frame, index=index, title=TITLES[name], **points)
    return [Show(t, rows, f"more {what}: all in the [appendix]({APPENDIX_FILE})")]


def _whole(frame: pd.DataFrame, name: str, index: bool = False, **points) -> list:
    """A table for the appendix (cut at APPENDIX_ROWS, saying so)."""
    return [Show(table(name, frame, index=index, title=TITLES[name], **points))]


def _records(name: str) -> Callable[[pd.DataFrame], Show]:
    """For a section made elsewhere (designs, workloads, the nccl-tests model):
    its table as a table of report.json named ``name`` (its rows count their points)."""
    return lambda frame: Show(table(name, frame))


def _ids(rows: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(rows[PID]))


def _incorrect(df: pd.DataFrame) -> pd.DataFrame:
    return df[holds(df["correct"], False) | holds(df["even_bitwise_equal"], False)]


# A failing group's key and its example, in characters: room for an error's type, text and the site
# the implementation raised at (nsa_cp_comm.harness.sites).
WHY_CHARS = 200
EXAMPLE_CHARS = 400
EXAMPLES = 3


def reason_kind(reason: object) -> str:
    """A reason with its numbers as ``N`` (sizes, ranks, line numbers apart): rows that one mistake
    failed at different sizes share it."""
    return re.sub(r"\d+", "N", " ".join(str(reason or "").split()))


def _failing(df: pd.DataFrame) -> pd.DataFrame:
    """failed/error/timeout rows, and rows whose status the schema does not know."""
    return df[df["status"].isin(BAD_STATUSES) | ~df["status"].isin(STATUS_VALUES)]


# --- sections


def verdicts(df: pd.DataFrame, derived: Derived) -> Part:
    part = Part()
    status = df["status"]
    order = list(STATUS_VALUES) + sorted(set(status) - set(STATUS_VALUES))
    counts = pd.crosstab(status, df["impl"]).reindex(index=order, fill_value=0)
    counts = counts.rename(index=_label, columns=_label)
    counts["all"] = counts.sum(axis=1)
    counts.index.name, counts.columns.name = "status", None
    counts["meaning"] = [STATUS_MEANING.get(s, "not a status of the schema; counted as failing.") for s in order]
    part.main += [f"Rows per status and impl ({count(len(df), 'row')} of {count(df[PAIR].nunique(), 'point')}; a row is one point "
                  "and one impl):", ""]
    part.main += [*_whole(counts, index=True, name="statuses", points=int(df[PAIR].nunique())), ""]

    unchecked = df[status.eq("ok") & df["correct"].isna()]
    if len(unchecked):
        part.main += [f"**warning:** ok without a correctness verdict (`correct` is empty): "
                      f"{_rows_of_points(unchecked)}.", ""]

    bad = _incorrect(df)
    cols = POINT + ["status", "correct", "even_bitwise_equal", "failed_check", "max_rel_err"]
    if len(bad):
        part.main += [f"### !!! INCORRECT RESULTS: {_rows_of_points(bad)} !!!", "",
                      "`correct` is False (the output differs from the reference) or `even_bitwise_equal` is False "
                      "(an even plan where the padded algorithm's bytes differ from legacy's):", "",
                      *_head(bad[cols], "incorrect points", "incorrect_points", points=int(bad[PAIR].nunique())), ""]
        part.appendix += ["## Incorrect points", "", *_whole(bad[cols + ["reason"]], name="incorrect_points_detail"),
                          ""]
        repros = [r for r in bad["repro"].head(APPENDIX_ROWS) if r.strip()]
        if repros:
            part.appendix += ["Reproduce with:", "", "```", *repros, "```", ""]
    else:
        part.main += ["No incorrect results: no point has `correct` False or a failed even-plan bitwise check.", ""]

    failing = _failing(df)
    if failing.empty:
        part.main += ["No failed, error or timeout point.", ""]
    else:
        part.main += [f"### Failed, error and timeout: {_rows_of_points(failing)}", ""]
        why = failing["failed_check"].where(failing["failed_check"].str.strip().ne(""),
                                            failing["reason"].map(reason_kind))
        grouped = failing.assign(why=why.map(lambda r: one_line(r, WHY_CHARS) or "(no reason)"))
        groups = (grouped.groupby(["status", "impl", "why"], sort=False).size().rename("points").reset_index()
                  .sort_values("points", ascending=False, kind="stable"))
        part.main += ["By status, impl and first failed check (or the reason, its numbers as N: one mistake is one "
                      "group whatever sizes it met):", "", *_head(groups, "groups", rows=5, name="failing_groups")]
        # a group keyed by its reason's words alone: one row's whole reason, its numbers and where a
        # plug-in raised (a row of the appendix's list has them all)
        firsts = grouped.drop_duplicates(["status", "impl", "why"]).set_index(["status", "impl", "why"])["reason"]
        examples = [f"`{impl}` {status}: {one_line(firsts[(status, impl, w)], EXAMPLE_CHARS)}"
                    for status, impl, w in zip(*(groups[c].head(5) for c in ("status", "impl", "why")))
                    if one_line(firsts[(status, impl, w)], WHY_CHARS) != w][:EXAMPLES]
        part.main += ["", "One row's reason as written, for each group read with its numbers as N: "
                      + "; ".join(examples) + ".", ""] if examples else [""]
        detail = failing[["status"] + POINT + ["backend", "device", "failed_check", "reason", "repro"]]
        part.appendix += ["## Failed, error and timeout points", "", *_whole(detail, name="failing_points"), ""]

    skipped = df[status.eq("skipped")]
    if len(skipped):
        reasons = skipped["reason"].map(lambda r: one_line(r, 100) or "(no reason)").value_counts()
        frame = reasons.rename_axis("reason").reset_index(name="points")
        part.main += [f"### Skipped: {_rows_of_points(skipped)}, by reason", "", *_head(frame, "reasons", rows=3, name="skipped_reasons"), ""]
        part.appendix += ["## Skipped points", "", *_whole(skipped[POINT + ["reason"]], name="skipped_points"), ""]
    return part


def _plans(df: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct split plan (the claim is a property of the plan and
    the padded communicator's ``max_rank_len * cp`` buffer)."""
    plans = m_stride(df[df["claim_holds"].notna()]).drop_duplicates(subset=PLAN_KEY)
    return plans.assign(padding_rows=plans["padded_total"] - plans["total_tokens"])


def claim(df: pd.DataFrame, derived: Derived) -> Part:
    part = Part(main=[
        "Claim: the padded gather buffer `max_rank_len * cp` equals `ceil_align(sum(seq_lens), cp)`, "
        "the size the existing cp alignment already gives the batch. Where it holds, every rank's shard "
        "has the same length and padding costs nothing; where it fails, each gather and reduce-scatter "
        "moves `padded_total - total_tokens` extra rows and the legacy path, which sizes its buffer as if "
        "it held, must refuse the plan.",
        "",
    ])
    plans = derived.plans
    if plans.empty:
        part.main.append("_(no row has a claim verdict)_")
        return part
    summary = plans.groupby("policy").agg(plans=("claim_holds", "size"),
                                          holds=("claim_holds", lambda s: int(holds(s, True).sum())),
                                          fails=("claim_holds", lambda s: int(holds(s, False).sum())))
    fails = plans[holds(plans["claim_holds"], False)].sort_values(["padding_frac", "policy", "cp_size", "page_size"],
                                                                  ascending=[False, True, True, True])
    summary["max_padding_frac_when_failing"] = fails.groupby("policy")["padding_frac"].max()
    part.main += [*_whole(summary, index=True, name="claim", points=int(plans[PAIR].nunique())), ""]
    cols = ["policy", "cp_size", "page_size", "seq_lens", "total_tokens", "max_rank_len", "padded_total",
            "padding_rows", "padding_frac"]
    if len(fails):
        shown = _head(fails[cols], "plans", rows=3, name="claim_fails", points=int(fails[PAIR].nunique()))
        part.main += [f"Plans where the claim fails: {len(fails)}; the most padded:", "", *shown]
        part.appendix += [f"## Plans where the claim fails ({len(fails)})", "", Show(shown[0].table), ""]
    return part


def ratios(rows: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Each impl's round-trip p50 over the ``reference`` impl's, per point, on the :func:`timed_round_trips`
    ``rows`` of points every impl of the cp size was timed at, in the columns of :func:`.side_by_side.to_reference`."""
    same = rows[rows[COMMON]]
    info = ["backend", "device", "cp_size", "policy", "page_size", "seq_lens", "is_even", PID]
    return to_reference(same, reference, PAIR, "roundtrip_p50_us", SPREAD, info)


def by_impl(rows: pd.DataFrame, keys: list[str], metric: str) -> pd.DataFrame:
    """Each impl's median ``metric`` by ``keys`` (a column per impl), after a
    ``points`` column: how many points each group holds."""
    out = rows.groupby(keys + ["impl"])[metric].median().unstack("impl")
    out.columns.name = None
    out.insert(0, "points", rows.groupby(keys)[PAIR].nunique())
    return out


def _missing_words(rows: pd.DataFrame) -> str:
    """``legacy refused 17, pad_at_split error 1``: points per impl and status not timed."""
    per_point = rows.drop_duplicates(PAIR)[MISSING].str.split(", ").explode()
    tally = per_point[per_point.astype(str).str.strip().ne("")].value_counts()
    return ", ".join(f"{what} {n}" for what, n in tally.items())


def latency(df: pd.DataFrame, derived: Derived) -> Part:
    part = Part()
    rows = derived.timed
    part.main += a2a_lines(df)
    if rows.empty:
        part.main.append("_(no ok point has a round-trip time)_")
        return part
    keys = group_keys(rows)
    same, apart = rows[rows[COMMON]], rows[~rows[COMMON]]
    medians = by_impl(same, keys, "roundtrip_p50_us")
    pairs, ref = derived.pairs, derived.reference
    for impl, r in pairs.groupby("impl"):
        medians[f"{impl}/{ref}"] = r.groupby(keys)["ratio"].median()
    n_same = int(same[PAIR].nunique())
    ratio = (f"; `X/{ref}`: the median over the same points of each point's ratio of X's round trip to {ref}'s "
             f"(the reference, `--reference`)" if len(pairs) else "")
    part.main += [f"Round-trip (gather + reduce-scatter) p50 in us by impl, median over the {count(n_same, 'point')} "
                  "where every impl of the cp size was timed (like with like: all policies and batches; by policy in "
                  f"the appendix){ratio}:", "",
                  *_whole(medians, index=True, name="latency", points=n_same, point_ids=_ids(same)), ""]
    if len(apart):
        n_apart = int(apart[PAIR].nunique())
        some = by_impl(apart.rename(columns={MISSING: "not timed there"}), keys + ["not timed there"],
                       "roundtrip_p50_us")
        part.main += [f"Timed by only some impls, so in no comparison: {count(n_apart, 'point')} "
                      f"({_missing_words(apart)}); each impl's median there:", "",
                      *_head(some, "groups", index=True, name="latency_only_some", points=n_apart,
                             point_ids=_ids(apart)), ""]
    by_policy = (same.assign(policy=same["policy"].map(_label)).groupby(keys + ["impl", "policy"])["roundtrip_p50_us"]
                 .median().unstack("policy"))
    by_policy.columns.name = None
    part.appendix += ["## Round-trip p50 (us) by cp size, impl and policy (median over the points every impl of "
                      "the cp size was timed)", "",
                      *_whole(by_policy, index=True, name="latency_by_policy", points=n_same), ""]
    local = rows[rows["impl"].eq("padded") & rows["local_p50_us"].notna()]
    if len(local):
        share = (local["local_p50_us"] / local["roundtrip_p50_us"]).median()
        part.main += [f"The padded path's local work (zeroing pad rows, copying the shard into its slot) is a median "
                      f"{share:.0%} of its round trip ({count(len(local), 'point')}; `local_p50_us` / "
                      "`roundtrip_p50_us`).", ""]
    part.main += ratio_lines(df, derived, part)
    return part


def _cp1_lines(same: pd.DataFrame) -> list[str]:
    """At cp=1, padded vs legacy, and without padded's local phase where its results have one (its only
    extra cost there; the padded path stages nothing on an even plan, and a plan of one rank is even)."""
    one = same[same["cp_size"].eq(1)]
    wide = one.pivot_table(index=PAIR, columns="impl", values=["roundtrip_p50_us", "local_p50_us"], aggfunc="last")
    if not {("roundtrip_p50_us", "padded"), ("roundtrip_p50_us", "legacy")} <= set(wide.columns):
        return []
    padded, legacy = wide[("roundtrip_p50_us", "padded")], wide[("roundtrip_p50_us", "legacy")]
    local = wide[("local_p50_us", "padded")].fillna(0.0) if ("local_p50_us", "padded") in wide else None
    ok = padded.notna() & legacy.notna()
    if not ok.any():
        return []
    if local is None or not bool(local[ok].gt(0).any()):
        return [f"At cp=1 nothing moves between ranks, and the padded path issues legacy's call (it gathers "
                f"straight from the shard: no copy, no local phase): padded/legacy "
                f"{(padded / legacy)[ok].median():.2f} (median over {count(int(ok.sum()), 'point')}). The "
                f"verdict's ratio counts cp > 1 only.", ""]
    return [f"At cp=1 nothing moves between ranks. The padded path still copies its shard into its slot of the "
            f"gather buffer and zeroes the padding (its `local` phase), then gathers the buffer; legacy gathers "
            f"straight from the shard. That copy is the padded path's extra cost there: padded/legacy "
            f"{(padded / legacy)[ok].median():.2f} with it, {((padded - local) / legacy)[ok].median():.2f} without "
            f"(median over {count(int(ok.sum()), 'point')}). The verdict's ratio counts cp > 1 only.", ""]


def ratio_lines(df: pd.DataFrame, derived: Derived, part: Part) -> list:
    """The ratio of each impl to the reference on the same points (appendix entries go into ``part``)."""
    pairs, ref = derived.pairs, derived.reference
    if pairs.empty:
        words = _ratio_words(derived)
        return [f"{words[0].upper()}{words[1:]}.", ""]
    lines: list = _cp1_lines(derived.timed[derived.timed[COMMON]])
    aggregates = dict(points=("ratio", "size"), impl_us=("value", "median"), reference_us=("reference", "median"),
                      ratio_median=("ratio", "median"), ratio_min=("ratio", "min"), ratio_max=("ratio", "max"),
                      within_noise=("noise", "sum"))
    keys = group_keys(pairs)
    names = {"reference_us": f"{ref}_us"}
    summary = pairs.groupby(keys + ["impl"]).agg(**aggregates).rename(columns=names)
    part.appendix += [f"## Each impl relative to {ref} (ratio = impl / {ref} round-trip p50, on the points every "
                      "impl of the cp size was timed)", "",
                      *_whole(summary, index=True, name="ratios", points=int(pairs[PAIR].nunique()),
                              point_ids=_ids(pairs), extra={"reference": ref}), ""]
    by_policy = pairs.groupby(keys + ["impl", "policy"]).agg(**aggregates).rename(columns=names)
    part.appendix += [f"## Each impl relative to {ref} by cp size and policy", "",
                      *_whole(by_policy, index=True, name="ratios_by_policy", points=int(pairs[PAIR].nunique())),
                      ""]
    with_spread = pairs["spread"].notna()
    noise = int(pairs["noise"].sum())
    if with_spread.any():
        lines.append(f"A ratio is noise when |impl - {ref}| is within the spread (mean `{SPREAD}` of the two rows): "
                     f"{noise} of {int(with_spread.sum())} ratios are "
                     f"({'all' if noise == with_spread.sum() else 'see'} `within_noise` in the appendix); read those "
                     "as no difference, not as a speed-up or a slow-down.")
        if not with_spread.all():
            lines.append(f"{int((~with_spread).sum())} pair(s) carry no spread: noise cannot be told apart there.")
    else:
        lines.append(f"No row carries a spread (`{SPREAD}`): ratios near 1 cannot be told apart from noise "
                     "(CPU runs with few iterations vary by tens of percent).")
    shown = pairs[[*keys[:-1], "cp_size", "impl", "policy", "page_size", "seq_lens", PID, "value", "reference",
                   "ratio", "spread", "noise"]].rename(columns={"value": "impl_us", "reference": f"{ref}_us",
                                                            PID: "point"})
    lines[-1] += f" Ratios by cp size and impl, with their range, and per point: [appendix]({APPENDIX_FILE})."
    part.appendix += [f"## Each impl relative to {ref} per point", "",
                      *_whole(shown, name="ratios_per_point", points=int(pairs[PAIR].nunique())), ""]
    return lines


def a2a_lines(df: pd.DataFrame) -> list[str]:
    """The MoE all-to-all apart from the round trips: it is another operation
    (dispatch + combine of routed tokens at SCATTERED points), not a way to
    gather and scatter."""
    rows = df[timed(df) & ~round_trip(df)]
    if rows.empty:
        return []
    med = rows.groupby(mixed(rows) + ["impl", "cp_size"])["roundtrip_p50_us"].median()
    listed = ", ".join(f"{' '.join(map(fmt, k))}: {v:.0f} us" for k, v in med.items())
    return [f"MoE all-to-all at SCATTERED points, another operation than the round trips below and not "
            f"comparable with them (dispatch + combine p50, median over points; by impl and cp size): {listed}.", ""]


def bandwidth(df: pd.DataFrame, derived: Derived) -> Part:
    part = Part()
    # cp=1 moves nothing: its bus bandwidth is 0 by definition, not a measurement
    rows = df[timed(df, "busbw_padded_GBps") & df["cp_size"].gt(1) & round_trip(df)]
    same = rows[common(rows, PAIR)]
    if same.empty:
        part.main += ["_(no point with cp > 1 has a bus bandwidth from every impl timed at its cp size)_", ""]
    else:
        keys = group_keys(same)
        bw = by_impl(same, keys, "busbw_padded_GBps")
        padded = same[same["impl"].eq("padded")].groupby(keys)
        if "padded" in bw.columns:
            bw["padded: useful bytes"] = padded["busbw_useful_GBps"].median()
        # the mean, as in the padding table below: a median of mostly even plans reads 0
        bw["mean padding_frac"] = same.drop_duplicates(PAIR).groupby(keys)["padding_frac"].mean()
        n_same, left = int(same[PAIR].nunique()), int(rows[PAIR].nunique()) - int(same[PAIR].nunique())
        aside = f"; {count(left, 'point')} timed by only some impls left out, as in Latency" if left else ""
        part.main += [f"Bus bandwidth in GB/s by impl, median over the {count(n_same, 'point')} with cp > 1 where "
                      "every impl of the cp size was timed (the bytes each impl moves; for padded also counting "
                      f"only the tokens' bytes; `mean padding_frac` over the same points){aside}:", "",
                      *_whole(bw, index=True, name="bandwidth", points=n_same, point_ids=_ids(same)), ""]
        full = same.groupby(keys + ["impl", "page_size"]).agg(
            points=("busbw_padded_GBps", "size"), busbw_padded_GBps=("busbw_padded_GBps", "median"),
            busbw_useful_GBps=("busbw_useful_GBps", "median"), padding_frac=("padding_frac", "mean"))
        part.appendix += ["## Bus bandwidth (GB/s) by cp size, impl and page size (median over the points every "
                          "impl of the cp size was timed; padding_frac: mean)", "",
                          *_whole(full, index=True, name="bandwidth_by_page", points=n_same), ""]
    plans = m_stride(df[df["padding_frac"].notna()]).drop_duplicates(subset=PLAN_KEY)
    if not plans.empty:
        pad = plans.assign(layout=layout_label(plans)).pivot_table(index="cp_size", columns="layout",
                                                                   values="padding_frac", aggfunc="mean")
        pad.columns.name = None
        part.main += ["Mean padding fraction `1 - total_tokens / padded_total` over the batches, by cp size "
                      "and layout:", "", *_whole(pad, index=True, name="padding", points=len(plans))]
    return part


def wall_times(df: pd.DataFrame) -> list[str]:
    """How long the runs took (side_by_side.wall_time: from each run's start in
    runs.jsonl to its last row), and the time inside points, each point once
    (``wall_s`` repeats on every impl row of a point)."""
    out = []
    w = wall_time(df)
    if w["runs"]:
        how = ("from its start in runs.jsonl" if w["from_runs_jsonl"] == w["runs"]
               else "from its start in runs.jsonl, or its first point's start where it has none")
        text = (f"wall time {w['seconds']:.0f} s ({count(w['runs'], 'run')}, each {how} to its last row's "
                "timestamp")
        text += f"; {w['span']:.0f} s from the first start to the last row)" if w["span"] > w["seconds"] + 0.5 else ")"
        out.append(text)
    # one wall time per job: a point's impl rows of one job repeat it, and a
    # sweep over impls (`impl=mine,padded` under -m) runs a job per impl
    jobs = df.drop_duplicates([PAIR, "repro"] if "repro" in df else [PAIR])
    walls = jobs["wall_s"]
    if walls.notna().any():
        points = int(jobs.loc[walls.notna(), PAIR].nunique())
        out.append(f"{walls.sum():.0f} s inside {count(points, 'point')} (each point's runs once)")
    return out


def runs_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per run (``run_id``) the rows name, oldest first and those
    without a line in runs.jsonl last: how many of the rows it wrote, and
    where and how it ran. Empty for rows of a layout without run_id."""
    known = df[df["run_id"].astype(str).str.strip().ne("")]
    if known.empty:
        return pd.DataFrame()
    runs = known.groupby("run_id", sort=False).agg(rows=("run_id", "size"), **{f: (f, "first") for f in RUN_FIELDS})
    unknown = runs["started"].astype(str).str.strip().eq("")  # no line in runs.jsonl: last
    return runs.assign(_unknown=unknown).sort_values(["_unknown", "started"], kind="stable").drop(columns="_unknown")


def environment(df: pd.DataFrame, derived: Derived) -> Part:
    """One line per field would be a screen; the fields run on in one paragraph."""
    fields = []
    for col in ENV_FIELDS:
        counts = df[col].value_counts()
        counts = counts.groupby(counts.index.str.strip()).sum().drop("", errors="ignore").sort_values(ascending=False)
        if len(counts) <= 1:
            value = f"`{counts.index[0]}`" if len(counts) else "(empty)"
        else:
            value = ", ".join(f"`{v}` ({count(n, 'point')})" for v, n in counts.head(4).items())
            value += f", ... {len(counts) - 4} more" if len(counts) > 4 else ""
        fields.append(f"{col} {value}")
    stamps = df["timestamp"].str.strip()
    stamps = stamps[stamps.ne("")]
    if len(stamps):
        fields.append(f"timestamps {stamps.min()} .. {stamps.max()}")
    fields += wall_times(df)
    runs = runs_table(df)
    if len(runs):
        fields.append(f"{len(runs)} run(s) wrote these rows (each in the [appendix]({APPENDIX_FILE}))")
    overrides = df["overrides"].value_counts(sort=False)
    fields.append(f"sweep overrides: {len(overrides)} distinct, in the [appendix]({APPENDIX_FILE})")
    part = Part(main=["; ".join(fields) + "."])
    if len(runs):
        part.appendix += [f"## Runs ({len(runs)}: the processes that wrote the rows, from runs.jsonl)", "",
                          *_whole(runs, index=True, name="runs"), ""]
    part.appendix += [f"## Sweep overrides ({len(overrides)} distinct; points, then the override string)", "", "```",
                      *(f"{n:>6}  {o if o.strip() else '(empty)'}" for o, n in overrides.head(APPENDIX_ROWS).items()),
                      "```", ""]
    return part


SECTIONS: tuple[tuple[str, Callable[[pd.DataFrame, Derived], Part]], ...] = (
    ("Verdicts", verdicts),
    ("Claim check", claim),
    ("Latency", latency),
    ("Bandwidth and padding", bandwidth),
    ("Environment", environment),
)


def plot_takeaways(df: pd.DataFrame, derived: Derived) -> dict[str, str]:
    """One line per plot: what to read off it, from the same rows it draws."""
    out: dict[str, str] = {}
    ref, rows = derived.reference, derived.timed
    rr = ref_ratio(derived.pairs)
    if rr:
        each = ", ".join(f"{impl}'s a median {v['median']:.2f}x ({count(v['n'], 'point')})" for impl, v in rr.items())
        text = f"Takeaway: on the points every impl was timed (cp > 1), relative to {ref}'s round trip: {each}"
    else:
        text = f"Takeaway: {_ratio_words(derived)}"
    apart = rows[~rows[COMMON]] if len(rows) else rows
    out[plots.LATENCY_PNG] = text + (f"; {count(int(apart[PAIR].nunique()), 'point')} timed by only some impls "
                                     f"({_missing_words(apart)}) are hollow markers without a line." if len(apart)
                                     else ".")
    plans = derived.plans
    if plans.empty or not plans["padding_frac"].gt(0).any():
        out[plots.PADDING_PNG] = "Takeaway: no plan pads: every rank's shard has the same length."
    else:
        worst = plans.sort_values("padding_frac", ascending=False, kind="stable").iloc[0]
        zero = plans.groupby(layout_label(plans))["padding_frac"].max()
        zero = sorted(k for k, v in zero.items() if v == 0)
        out[plots.PADDING_PNG] = (
            f"Takeaway: the most padded plan is {layout_label(worst.to_frame().T).iloc[0]} at cp={fmt(worst['cp_size'])} "
            f"with seq_lens {worst['seq_lens']}: {worst['padding_frac']:.0%} of the gather buffer is padding"
            + (f"; never padded: {', '.join(zero)}." if zero else "."))
    bw = df[timed(df, "busbw_padded_GBps") & df["cp_size"].gt(1) & round_trip(df) & df["impl"].eq("padded")
            & df["busbw_useful_GBps"].notna() & df["padding_frac"].gt(0)]
    if bw.empty:
        out[plots.BUSBW_PNG] = "Takeaway: no padded point with cp > 1 and padding has a bandwidth."
    else:
        lost = 1 - (bw["busbw_useful_GBps"] / bw["busbw_padded_GBps"]).median()
        out[plots.BUSBW_PNG] = (
            f"Takeaway: where the padded path pads ({count(len(bw), 'point')}, cp > 1), a median {lost:.0%} of the bus "
            f"bandwidth it achieves carries padding rather than tokens (hollow markers below filled ones).")
        apart = bw[PAIR].isin(rows.loc[~rows[COMMON], PAIR]) if len(rows) else bw[PAIR].isna()
        if apart.any():
            out[plots.BUSBW_PNG] += (f" Of those, {count(int(apart.sum()), 'point')} timed by only some impls "
                                     "are faded: no other impl is beside them.")
    return out


# --- assembly


def duplicates(run: Run) -> list[str]:
    """Appendix lines listing each point that has several rows, and which is used."""
    keys = run.raw[POINT_KEY]
    dup = run.raw[keys.duplicated(keep=False)]
    if dup.empty:
        return []
    first = dup[POINT_KEY].drop_duplicates().head(APPENDIX_ROWS)
    dup = dup[dup[POINT_KEY].isin(first)]
    dup = dup.assign(status=dup["status"].str.strip().astype(object))
    grouped = dup.groupby(POINT_KEY, sort=False).agg(rows=("status", "size"), statuses=("status", " -> ".join),
                                                     **{c: (c, "last") for c in POINT})
    grouped["used"] = "the last"
    more = keys[keys.duplicated(keep=False)].nunique() - len(grouped)
    tail = ["", f"... {more} more points with duplicates not listed"] if more > 0 else []
    return ["## Points with duplicate rows (statuses in file order; the last row is used)", "",
            frame_md(grouped[POINT + ["rows", "statuses", "used"]]), *tail, ""]


def prepare(run: Run) -> pd.DataFrame:
    """The run's latest row per point, typed, with the pairing key and the point
    id; one implementation run under several names (side_by_side.same_origin)
    under one name, its latest row per point kept, the names in
    ``attrs["merged"]``."""
    pair_cols = [c for c in CONFIG_COLUMNS if c != "impl"]
    df = typed(run.latest, NUMBERS).reset_index(drop=True)
    # bystanders make another point (a larger world), as point_id says
    config = run.latest_config[pair_cols].assign(_world=world(run.latest))
    df[PAIR] = point_codes(config)
    df[PID] = point_ids(config).to_numpy()
    merged = same_origin(df)
    if merged:
        names = {n: kept for kept, ns in merged.items() for n in ns}
        df["impl"] = df["impl"].map(lambda n: names.get(n, n))
        df = df[~df[[PAIR, "impl"]].duplicated(keep="last")].reset_index(drop=True)
    df.attrs["merged"] = merged
    return df


def merged_lines(df: pd.DataFrame) -> list[str]:
    """One line per implementation that ran under several names."""
    out = []
    for kept, names in df.attrs.get("merged", {}).items():
        origin = df.loc[df["impl"].eq(kept), "impl_origin"].astype(str).iloc[0]
        listed = ", ".join(f"`{n}`" for n in names)
        out.append(f"One implementation under {len(names)} names, {listed} (one `impl_origin`: `{origin}`): "
                   f"reported as `{kept}`.")
    return out


def sections(run: Run, df: pd.DataFrame, derived: Derived, model=None) -> tuple[list, list]:
    """The report's and the appendix's blocks after the header, section by section."""
    lines: list = []
    appendix: list = duplicates(run)
    for title, section in SECTIONS:
        part = section(df, derived)
        while part.main and not part.main[-1]:
            part.main.pop()
        lines += [f"## {title}", "", *part.main, ""]
        appendix += part.appendix
    covered, listed = coverage.section(df, APPENDIX_FILE)
    appendix += listed
    # impls side by side here too: a batch timed by only some impls is left out, and said
    rows = derived.timed
    apart = rows.loc[~rows[COMMON] & rows["workload"].astype(str).str.strip().ne("")] if len(rows) else rows
    spread = workload.report_lines(df.drop(index=apart.index), table=_records("workloads"))
    if spread and len(apart):
        spread += ["", f"Left out: {count(int(apart[PAIR].nunique()), 'batch', 'batches')} timed by only some "
                   f"impls ({_missing_words(apart)})."]
    # Only where the run has them: outside implementations, engines, pad_at_split rows, workloads, an nccl-tests model.
    for title, body in (
            ("Plan classes covered", covered),
            ("Engines: each engine's plans and the implementations run under them",
             designs.engines_section(df, table=_records("engines"))),
            ("Designs: padded vs pad_at_split", designs.section(df, PAIR, table=_records("designs"))),
            ("Workloads: over each workload's batches", spread),
            ("Collectives predicted from nccl-tests (a model)",
             [] if model is None else designs.model_section(df, model, table=_records("nccl_tests_model")))):
        if body:
            lines += [f"## {title}", "", *body, ""]
    lines += ["## Plots", ""]
    for name, takeaway in plot_takeaways(df, derived).items():
        lines += [f"![{name}]({name})", takeaway, ""]  # one paragraph: the plot, then what it shows
    lines += [f"Long lists (each failing point, per-point ratios, plans, overrides, duplicates): "
              f"[{APPENDIX_FILE}]({APPENDIX_FILE})", ""]
    return lines, appendix


def render(run: Run, df: pd.DataFrame, model=None, reference: str = DEFAULT_REFERENCE) -> dict:
    """The report as a document (report_doc): what report.json holds and report.md is rendered from."""
    counted = (f"{count(len(run.raw), 'row')} read; the latest of each point and impl: {count(len(df), 'row')} of "
               f"{count(df[PAIR].nunique(), 'point')}")
    source = (f"Source: `{run.files[0]}` ({counted})." if len(run.files) == 1
              else f"Source: {len(run.files)} files under `{run.value}` ({counted}).")
    rows = timed_round_trips(df)
    derived = Derived(pairs=ratios(rows, reference), plans=_plans(df), reference=reference, timed=rows)
    lines = ["# nsa-cp-comm matrix report", "", verdict_line(df, derived), "", source]
    lines += merged_lines(df)
    if run.duplicates:
        lines.append(f"Duplicates: {run.duplicate_note()} ([appendix]({APPENDIX_FILE})).")
    if run.upgraded:
        parts = ", ".join(f"{n} ok row(s) read as {s}" for s, n in sorted(run.upgraded.items()))
        lines.append(f"Written before the refused/passthrough statuses: {parts}.")
    if run.unknown_runs:
        lines.append(f"**Unknown environment:** {run.unknown_runs_note()}.")
    even = even_paired(run, df)
    for paragraph in (*coverage.warnings(df), _missed_targets(run), even.get("line", "")):
        if paragraph:
            lines += ["", paragraph]
    lines.append("")
    appendix = ["# nsa-cp-comm matrix report: appendix", "", f"Back to the [report]({REPORT_FILE}). {source}", ""]
    body, more = sections(run, df, derived, model)
    lines += body
    appendix += more
    if len(run.files) > 1:
        appendix += ["## Files read", "", *(f"- `{f}`" for f in run.files), ""]
    doc = report_doc.document(lines, appendix)
    state, reasons = verdict(df)
    doc["verdict"], doc["reasons"] = state, reasons
    doc["summary"] = {
        "reference": reference,
        "points": int(df[PAIR].nunique()),
        "rows": len(df),
        "timed_points": int(rows[PAIR].nunique()) if len(rows) else 0,
        "compared_points": int(rows.loc[rows[COMMON], PAIR].nunique()) if len(rows) else 0,
        "ratio_to_reference": ref_ratio(derived.pairs),
        "merged_impls": df.attrs.get("merged", {}),
        "wall_time": wall_time(df),
        "even_padded_over_legacy": {k: v for k, v in even.items() if k != "line"} if even else None,
    }
    return doc


def even_paired(run: Run, df: pd.DataFrame) -> dict:
    """On even plans the padded path issues legacy's call: padded over legacy as
    the paired ratio of the same timed iterations (both timed in turns in each
    iteration: the machine's load moves both alike), pooled over every even
    point where both were timed, its median with a distribution-free 95%
    interval (``median``, ``lo``, ``hi``, ``points``, ``iterations``, and the
    report's ``line``); empty where no such point has both samples."""
    from nsa_cp_comm.harness.calibrate import median_ci

    from ..store.samples import read_beside

    even = df[df["is_even"].astype(str).str.lower().eq("true") & df["status"].astype(str).eq("ok")]
    pids = sorted(set(even.loc[even["impl"].eq("padded"), "point_id"].astype(str))
                  & set(even.loc[even["impl"].eq("legacy"), "point_id"].astype(str)))
    if not pids:
        return {}
    samples = read_beside(run.files, skip_bad=True)
    ratios, points = [], 0
    for pid in pids:
        a, b = samples.roundtrip(pid, "padded"), samples.roundtrip(pid, "legacy")
        if a is None or b is None or len(a) != len(b) or not len(a):
            continue
        ratios.extend((np.asarray(a, dtype=float) / np.asarray(b, dtype=float)).tolist())
        points += 1
    if not ratios:
        return {}
    med = float(np.median(ratios))
    lo, hi = median_ci(ratios)
    known = lo == lo and hi == hi  # NaN: too few iterations for any interval
    interval = f" (95% interval {lo:.3f}-{hi:.3f})" if known else " (too few iterations for an interval)"
    line = (f"**Even plans, padded over legacy:** {med:.3f}{interval}, the paired ratio of the same timed "
            f"iterations over {count(points, 'even point')} ({len(ratios)} iterations): on an even plan the padded "
            "path issues legacy's call.")
    return {"median": round(med, 4), "lo": round(float(lo), 4) if known else None,
            "hi": round(float(hi), 4) if known else None, "points": points, "iterations": len(ratios), "line": line}


def _missed_targets(run: Run) -> str:
    """The line on rows whose ``iters=auto`` calibration stopped at its cap
    short of its target (the samples beside the results say), or ``''``. The
    report does not gate on samples: an unreadable samples file is skipped."""
    from ..store.samples import missed_target_line, read_beside

    lat = run.latest
    rows = zip(lat["point_id"].astype(str).str.strip(), lat["impl"].astype(str).str.strip())
    line = missed_target_line("**Calibration**", read_beside(run.files, skip_bad=True), rows)
    return f"{line}." if line else ""


def build(run: Run, model=None, reference: str = DEFAULT_REFERENCE) -> tuple[dict, dict[str, bytes]]:
    """(the report's document, PNG bytes by file name), all in memory.
    ``model``: a matrix.scale.nccl_tests.Model, for the predicted-beside-measured section."""
    df = prepare(run)
    reference = next((kept for kept, names in df.attrs["merged"].items() if reference in names), reference)
    doc = render(run, df, model, reference)
    return doc, plots.render_all(mark_common(df))


def mark_common(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with :data:`COMMON` (what the plots read to set impls side by side on the same points only)."""
    mask = timed_round_trips(df)[COMMON]
    return df.assign(**{COMMON: mask.reindex(df.index, fill_value=False).astype(bool)})


def write(out: Path, doc: dict, pngs: dict[str, bytes]) -> list[Path]:
    """Every file through a temporary name and a rename: a full disk leaves
    the files as they were (or none), never a truncated one. report.md and
    the appendix are rendered from the document report.json holds."""
    out.mkdir(parents=True, exist_ok=True)
    markdown, appendix = report_doc.markdown(doc)
    written = [write_atomic(out / name, data) for name, data in pngs.items()]
    write_atomic(out / JSON_FILE, json.dumps(doc, indent=1, allow_nan=False) + "\n")
    write_atomic(out / APPENDIX_FILE, appendix)
    write_atomic(out / REPORT_FILE, markdown)
    return [out / REPORT_FILE, out / APPENDIX_FILE, out / JSON_FILE, *written]
