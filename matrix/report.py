"""Summarise a results table into ``report.md``, ``report_appendix.md`` and three PNG plots.

    python -m matrix.report RESULTS [--out DIR]

RESULTS is a results directory (its ``results.csv``, or the ``results.csv``
files below it, concatenated) or a CSV file. The files are written next to the
CSV (or into the directory given, when several were concatenated), or into
``--out``; report.md is also printed.

report.md is what a reviewer reads in a minute, in this order: the verdicts
(points per status and impl, each status explained; incorrect and failing
points), the claim check, latency (with padded/legacy ratios on even points and
which of them are noise), bandwidth and padding, the environment, the plots.
Every long list (each failing point, each per-point ratio, each plan, the
sweep's overrides, duplicate rows) is in report_appendix.md, linked at the end.

One row per point is used: when a file holds several (a resumed rerun, a repro
appended to the same file), the last in file order, and the report says so.
Rows are classified by their ``status`` column only.

Bad input is one ``error:`` line on stderr and exit code 2, with nothing written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import command, coverage, designs, nccl_tests, plots, workload
from ._review import (
    BAD,
    POINT_KEY,
    STATUSES,
    InputError,
    Run,
    fmt,
    frame_md,
    load_run,
    one_line,
    point_codes,
    typed,
    world,
)
from .inputs import error_line
from .outputs import check_dir, write_atomic
from .results import CONFIG_COLUMNS
from .words import count

REPORT_FILE = "report.md"
APPENDIX_FILE = "report_appendix.md"
LATENCY_PNG = plots.LATENCY_PNG
PADDING_PNG = plots.PADDING_PNG
BUSBW_PNG = plots.BUSBW_PNG

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

# Per row, or joined from the run each row names (matrix.runs): the same either way.
ENV_FIELDS = ("torch_version", "nccl_version", "python_version", "nsa_cp_comm_version", "host", "device_name",
              "backend", "device", "git_sha", "impl_origin")
# What the appendix lists of each run that wrote the rows.
RUN_FIELDS = ("started", "host", "git_sha", "command")
POINT = ["impl", "policy", "cp_size", "page_size", "seq_lens", "mlp_mode"]
PLAN_KEY = ["policy", "cp_size", "page_size", "seq_lens", "align"]
PAIR = "_pair"  # a point's key without impl: padded and legacy rows of one point share it
HEAD_ROWS = 8  # long tables in report.md stop here; the appendix has them whole
APPENDIX_ROWS = 2000  # and the appendix stops here (a 200k-row run is for tools, not eyes)
SPREAD = "roundtrip_iqr_us"
# What the report reads of a results file (and which of it is numeric); the
# other timing columns are skipped, which halves the load of a big file.
NUMBERS = ("cp_size", "page_size", "total_tokens", "max_rank_len", "padded_total", "padding_frac", "max_rel_err",
           "roundtrip_p50_us", SPREAD, "local_p50_us", "busbw_padded_GBps", "busbw_useful_GBps", "bytes_padded",
           "bytes_useful", "wall_s", "attn_pad_rows", "moe_pad_rows", "collective_p50_us")
READ = (*CONFIG_COLUMNS, *NUMBERS, "policy", "is_even", "claim_holds", "status", "reason", "failed_check", "correct",
        "even_bitwise_equal", *ENV_FIELDS, *RUN_FIELDS, "run_id", "timestamp", "overrides", "repro", "workload",
        "plan_class", "effective_page_size", "bystanders")


@dataclass
class Part:
    """A section's lines for report.md and for the appendix."""

    main: list[str] = field(default_factory=list)
    appendix: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Derived:
    """What several parts of one report read, computed once per report."""

    pairs: pd.DataFrame  # :func:`ratios`: padded vs legacy on even points
    plans: pd.DataFrame  # :func:`_plans`: one row per distinct split plan


Section = Callable[[pd.DataFrame, Derived], Part]


# --- helpers


def _is(series: pd.Series, value: bool) -> pd.Series:
    """Plain-bool mask of cells equal to ``value``; empty cells never match."""
    return series.eq(value).fillna(False).astype(bool)


def timed(df: pd.DataFrame, metric: str = "roundtrip_p50_us") -> pd.Series:
    """Rows with a measurement: status ok and a value of ``metric``."""
    return df["status"].eq("ok") & df[metric].notna()


def round_trip(df: pd.DataFrame) -> pd.Series:
    """Rows of the communicator's round trip (all-gather + reduce-scatter, FULL
    mode); the MoE all-to-all (``a2a``, SCATTERED mode) is another operation."""
    return df["mlp_mode"].ne("SCATTERED")


def even_ratio(pairs: pd.DataFrame) -> dict[str, float]:
    """padded/legacy over even points with cp > 1 (at cp=1 nothing moves and
    padded's extra copy is all there is; explained apart): median and quartiles."""
    r = pairs.loc[pairs["cp_size"].gt(1), "ratio"].dropna()
    if r.empty:
        return {"n": 0}
    return {"n": len(r), "median": float(r.median()), "q1": float(r.quantile(0.25)), "q3": float(r.quantile(0.75))}


def verdict_line(df: pd.DataFrame, pairs: pd.DataFrame) -> str:
    """The report's first line: what a reviewer acts on (``pairs``: :func:`ratios` of ``df``)."""
    points = int(df[PAIR].nunique())
    bad, failing = _incorrect(df), _failing(df)
    checked = int(df["status"].ne("skipped").sum())
    state = "FAIL" if len(bad) or len(failing) else ("NOTHING CHECKED" if not checked else "PASS")
    parts = [f"{count(points, 'point')}, {count(len(df), 'row')} (a row: one point and one impl)"]
    parts.append(f"**!!! INCORRECT RESULTS: {_rows_of_points(bad)} !!!**" if len(bad)
                 else "correct everywhere checked")
    parts.append(f"**failed, error or timeout: {_rows_of_points(failing)}**" if len(failing)
                 else "none failed, errored or timed out")
    er = even_ratio(pairs)
    if er["n"]:
        parts.append(f"padded/legacy round trip on even plans (cp > 1): median {er['median']:.2f} "
                     f"(quartiles {er['q1']:.2f}-{er['q3']:.2f} over {count(er['n'], 'point')})")
    else:
        parts.append("no even plan with cp > 1 has both padded and legacy timed")
    return f"**Verdict: {state}**: " + "; ".join(parts) + "."


def _rows_of_points(rows: pd.DataFrame) -> str:
    """``3 rows of 2 points``: rows counted as rows, the points they fall on as points."""
    n, points = len(rows), int(rows[PAIR].nunique())
    return f"{n} row{'s' if n != 1 else ''} of {points} point{'s' if points != 1 else ''}"


def _mixed(df: pd.DataFrame) -> list[str]:
    """backend/device when the rows mix several, so tables keep them apart."""
    return [c for c in ("backend", "device") if df[c].nunique() > 1]


def _label(value: object) -> str:
    text = fmt(value)
    return text if text else "(empty)"


def _cut(frame: pd.DataFrame, rows: int, rest: str, index: bool) -> list[str]:
    """A table cut at ``rows``; ``rest`` says where the other rows are."""
    if frame.empty:
        return ["_(none)_"]
    out = [frame_md(frame.head(rows), index=index)]
    if len(frame) > rows:
        out += ["", f"... {len(frame) - rows} {rest}"]
    return out


def _head(frame: pd.DataFrame, what: str, index: bool = False, rows: int = HEAD_ROWS) -> list[str]:
    """A table cut at ``rows``, saying where the rest is."""
    return _cut(frame, rows, f"more {what}: all in the [appendix]({APPENDIX_FILE})", index)


def _whole(frame: pd.DataFrame, index: bool = False) -> list[str]:
    """A table for the appendix (cut at APPENDIX_ROWS, saying so)."""
    return _cut(frame, APPENDIX_ROWS, "more rows not listed: see the results CSV", index)


def _incorrect(df: pd.DataFrame) -> pd.DataFrame:
    return df[_is(df["correct"], False) | _is(df["even_bitwise_equal"], False)]


def _failing(df: pd.DataFrame) -> pd.DataFrame:
    """failed/error/timeout rows, and rows whose status the schema does not know."""
    return df[df["status"].isin(BAD) | ~df["status"].isin(STATUSES)]


# --- sections


def verdicts(df: pd.DataFrame, derived: Derived) -> Part:
    part = Part()
    status = df["status"]
    order = list(STATUSES) + sorted(set(status) - set(STATUSES))
    counts = pd.crosstab(status, df["impl"]).reindex(index=order, fill_value=0)
    counts = counts.rename(index=_label, columns=_label)
    counts["all"] = counts.sum(axis=1)
    counts.index.name, counts.columns.name = "status", None
    counts["meaning"] = [STATUS_MEANING.get(s, "not a status of the schema; counted as failing.") for s in order]
    part.main += [f"Rows per status and impl ({count(len(df), 'row')} of {count(df[PAIR].nunique(), 'point')}; a row is one point "
                  "and one impl):", ""]
    part.main += [frame_md(counts, index=True), ""]

    unchecked = df[status.eq("ok") & df["correct"].isna()]
    if len(unchecked):
        part.main += [f"**warning:** ok without a correctness verdict (`correct` is empty): "
                      f"{_rows_of_points(unchecked)}.", ""]

    bad = _incorrect(df)
    cols = POINT + ["status", "correct", "even_bitwise_equal", "failed_check", "max_rel_err"]
    if len(bad):
        part.main += [
            f"### !!! INCORRECT RESULTS: {_rows_of_points(bad)} !!!",
            "",
            "`correct` is False (the output differs from the reference) or `even_bitwise_equal` is False "
            "(an even plan where the padded algorithm's bytes differ from legacy's):",
            "",
            *_head(bad[cols], "incorrect points"),
            "",
        ]
        part.appendix += ["## Incorrect points", "", *_whole(bad[cols + ["reason"]]), ""]
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
        why = failing["failed_check"].where(failing["failed_check"].str.strip().ne(""), failing["reason"])
        groups = (
            failing.assign(why=why.map(lambda r: one_line(r, 90) or "(no reason)"))
            .groupby(["status", "impl", "why"]).size().rename("points").reset_index()
            .sort_values("points", ascending=False, kind="stable")
        )
        part.main += ["By status, impl and first failed check (or reason):", "", *_head(groups, "groups", rows=5), ""]
        detail = failing[["status"] + POINT + ["backend", "device", "failed_check", "reason", "repro"]]
        part.appendix += ["## Failed, error and timeout points", "", *_whole(detail), ""]

    skipped = df[status.eq("skipped")]
    if len(skipped):
        reasons = skipped["reason"].map(lambda r: one_line(r, 100) or "(no reason)").value_counts()
        frame = reasons.rename_axis("reason").reset_index(name="points")
        part.main += [f"### Skipped: {_rows_of_points(skipped)}, by reason", "", *_head(frame, "reasons", rows=3), ""]
        part.appendix += ["## Skipped points", "", *_whole(skipped[POINT + ["reason"]]), ""]
    return part


def _plans(df: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct split plan (the claim is a property of the plan)."""
    plans = df[df["claim_holds"].notna()].drop_duplicates(subset=PLAN_KEY)
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
    summary = plans.groupby("policy").agg(
        plans=("claim_holds", "size"),
        holds=("claim_holds", lambda s: int(_is(s, True).sum())),
        fails=("claim_holds", lambda s: int(_is(s, False).sum())),
    )
    fails = plans[_is(plans["claim_holds"], False)].sort_values(
        ["padding_frac", "policy", "cp_size", "page_size"], ascending=[False, True, True, True]
    )
    summary["max_padding_frac_when_failing"] = fails.groupby("policy")["padding_frac"].max()
    part.main += [frame_md(summary, index=True), ""]
    cols = ["policy", "cp_size", "page_size", "seq_lens", "total_tokens", "max_rank_len", "padded_total",
            "padding_rows", "padding_frac"]
    if len(fails):
        part.main += [f"Plans where the claim fails: {len(fails)}; the most padded:", "",
                      *_head(fails[cols], "plans", rows=3)]
        part.appendix += [f"## Plans where the claim fails ({len(fails)})", "", *_whole(fails[cols]), ""]
    return part


def ratios(df: pd.DataFrame) -> pd.DataFrame:
    """padded and legacy round-trip p50 of each even point where both were timed,
    their ratio, the spread (mean roundtrip_iqr_us of the two rows, NaN when
    neither has one) and ``noise``: the difference is within the spread."""
    rows = df[timed(df) & _is(df["is_even"], True)]
    keep = [PAIR, "roundtrip_p50_us", SPREAD]
    padded = rows.loc[rows["impl"].eq("padded"), [*keep, "local_p50_us"]]
    legacy = rows.loc[rows["impl"].eq("legacy"), keep]
    info = rows.loc[rows["impl"].eq("padded"), [PAIR, *_mixed(df), "cp_size", "policy", "page_size", "seq_lens"]]
    pairs = padded.merge(legacy, on=PAIR, suffixes=("_padded", "_legacy")).merge(info, on=PAIR)
    pairs = pairs.rename(columns={"roundtrip_p50_us_padded": "padded", "roundtrip_p50_us_legacy": "legacy"})
    pairs["ratio"] = pairs["padded"] / pairs["legacy"]
    # the padded path's round trip without its local phase, over legacy's
    pairs["ratio_without_local"] = (pairs["padded"] - pairs["local_p50_us"].fillna(0.0)) / pairs["legacy"]
    pairs["spread"] = pairs[[f"{SPREAD}_padded", f"{SPREAD}_legacy"]].mean(axis=1)
    pairs["noise"] = pairs["spread"].notna() & ((pairs["padded"] - pairs["legacy"]).abs() <= pairs["spread"])
    return pairs


def latency(df: pd.DataFrame, derived: Derived) -> Part:
    part = Part()
    rows = df[timed(df) & round_trip(df)]
    part.main += a2a_lines(df)
    if rows.empty:
        part.main.append("_(no ok point has a round-trip time)_")
        return part
    mixed = _mixed(rows)
    by_impl = rows.groupby(mixed + ["cp_size", "impl"])["roundtrip_p50_us"].median().unstack("impl")
    by_impl.columns.name = None
    part.main += [
        f"Round-trip (gather + reduce-scatter) p50 in us by impl, median over the {len(rows)} timed ok points "
        "(all policies and batches; by policy in the appendix):",
        "",
        frame_md(by_impl, index=True),
        "",
    ]
    by_policy = (
        rows.assign(policy=rows["policy"].map(_label))
        .groupby(mixed + ["cp_size", "impl", "policy"])["roundtrip_p50_us"]
        .median()
        .unstack("policy")
    )
    by_policy.columns.name = None
    part.appendix += ["## Round-trip p50 (us) by cp size, impl and policy (median over points)", "",
                      *_whole(by_policy, index=True), ""]
    local = rows[rows["impl"].eq("padded") & rows["local_p50_us"].notna()]
    if len(local):
        share = (local["local_p50_us"] / local["roundtrip_p50_us"]).median()
        part.main += [
            f"The padded path's local work (zeroing pad rows, copying the shard into its slot) is a median "
            f"{share:.0%} of its round trip ({count(len(local), 'point')}; `local_p50_us` / `roundtrip_p50_us`).",
            "",
        ]

    pairs = derived.pairs
    part.main += ["### Padded vs legacy on even points (ratio = padded / legacy round-trip p50)", ""]
    if pairs.empty:
        part.main.append("_(no even point has both padded and legacy timings)_")
        return part
    one = pairs[pairs["cp_size"].eq(1)]
    if len(one):
        part.main += [
            f"At cp=1 nothing moves between ranks. The padded path still copies its shard into its slot of the "
            f"gather buffer and zeroes the padding (its `local` phase), then gathers the buffer; legacy gathers "
            f"straight from the shard. That copy is the padded path's extra cost there: ratio "
            f"{one['ratio'].median():.2f} with it, {one['ratio_without_local'].median():.2f} without "
            f"(median over {count(len(one), 'point')}). The verdict's ratio counts cp > 1 only.",
            "",
        ]
    aggregates = dict(
        points=("ratio", "size"),
        padded_us=("padded", "median"),
        legacy_us=("legacy", "median"),
        ratio_median=("ratio", "median"),
        ratio_min=("ratio", "min"),
        ratio_max=("ratio", "max"),
        within_noise=("noise", "sum"),
    )
    part.main += [frame_md(pairs.groupby(_mixed(df) + ["cp_size"]).agg(**aggregates), index=True), ""]
    part.appendix += ["## Padded vs legacy on even points by cp size and policy", "",
                      *_whole(pairs.groupby(_mixed(df) + ["cp_size", "policy"]).agg(**aggregates), index=True), ""]
    with_spread = pairs["spread"].notna()
    noise = int(pairs["noise"].sum())
    if with_spread.any():
        part.main.append(
            f"A ratio is noise when |padded - legacy| is within the spread (mean `{SPREAD}` of the two rows): "
            f"{noise} of {int(with_spread.sum())} ratios are ({'all' if noise == with_spread.sum() else 'see'} "
            "`within_noise`); read those as no difference, not as a speed-up or a slow-down."
        )
        if not with_spread.all():
            part.main.append(f"{int((~with_spread).sum())} pair(s) carry no spread: noise cannot be told apart there.")
    else:
        part.main.append(
            f"No row carries a spread (`{SPREAD}`): ratios near 1 cannot be told apart from noise "
            "(CPU runs with few iterations vary by tens of percent)."
        )
    shown = pairs[[*_mixed(df), "cp_size", "policy", "page_size", "seq_lens", "padded", "legacy", "ratio", "spread",
                   "noise"]]
    part.main[-1] += f" Per-point ratios: [appendix]({APPENDIX_FILE})."
    part.appendix += ["## Padded vs legacy per even point", "", *_whole(shown), ""]
    return part


def a2a_lines(df: pd.DataFrame) -> list[str]:
    """The MoE all-to-all apart from the round trips: it is another operation
    (dispatch + combine of routed tokens at SCATTERED points), not a way to
    gather and scatter."""
    rows = df[timed(df) & ~round_trip(df)]
    if rows.empty:
        return []
    med = rows.groupby(_mixed(rows) + ["impl", "cp_size"])["roundtrip_p50_us"].median()
    listed = ", ".join(f"{' '.join(map(fmt, k)) if isinstance(k, tuple) else fmt(k)}: {v:.0f} us"
                       for k, v in med.items())
    return [f"MoE all-to-all at SCATTERED points, another operation than the round trips below and not "
            f"comparable with them (dispatch + combine p50, median over points; by impl and cp size): {listed}.", ""]


def _layout(plans: pd.DataFrame) -> pd.Series:
    """A plan's split layout as one label: the policy, and the page size where it matters."""
    paged = plans["policy"].eq("zigzag_page")
    return plans["policy"].map(_label).where(~paged, plans["policy"] + " p" + plans["page_size"].map(fmt))


def bandwidth(df: pd.DataFrame, derived: Derived) -> Part:
    part = Part()
    # cp=1 moves nothing: its bus bandwidth is 0 by definition, not a measurement
    rows = df[timed(df, "busbw_padded_GBps") & df["cp_size"].gt(1) & round_trip(df)]
    if rows.empty:
        part.main += ["_(no ok point with cp > 1 has a bus bandwidth)_", ""]
    else:
        mixed = _mixed(rows)
        bw = rows.groupby(mixed + ["cp_size", "impl"])["busbw_padded_GBps"].median().unstack("impl")
        bw.columns.name = None
        padded = rows[rows["impl"].eq("padded")].groupby(mixed + ["cp_size"])
        if len(bw) and "padded" in bw.columns:
            bw["padded: useful bytes"] = padded["busbw_useful_GBps"].median()
            bw["padded: padding_frac"] = padded["padding_frac"].median()
        part.main += ["Bus bandwidth in GB/s by impl, median over the timed points with cp > 1 (the bytes each "
                      "impl moves; for padded also counting only the tokens' bytes):", "",
                      frame_md(bw, index=True), ""]
        full = rows.groupby(mixed + ["cp_size", "impl", "page_size"]).agg(
            points=("busbw_padded_GBps", "size"),
            busbw_padded_GBps=("busbw_padded_GBps", "median"),
            busbw_useful_GBps=("busbw_useful_GBps", "median"),
            padding_frac=("padding_frac", "median"),
        )
        part.appendix += ["## Bus bandwidth (GB/s) by cp size, impl and page size (median over points)", "",
                          *_whole(full, index=True), ""]
    plans = df[df["padding_frac"].notna()].drop_duplicates(subset=PLAN_KEY)
    if not plans.empty:
        pad = plans.assign(layout=_layout(plans)).pivot_table(
            index="cp_size", columns="layout", values="padding_frac", aggfunc="mean"
        )
        pad.columns.name = None
        part.main += ["Mean padding fraction `1 - total_tokens / padded_total` over the batches, by cp size "
                      "and layout:", "", frame_md(pad, index=True)]
    return part


def wall_times(df: pd.DataFrame) -> list[str]:
    """The sweep's wall time: from the first point's start (its end timestamp
    less its ``wall_s``) to the last point's end; and the time inside points,
    each point once (``wall_s`` repeats on every impl row of a point)."""
    per_point = df.drop_duplicates(PAIR)
    walls = per_point["wall_s"]
    out = []
    ends = pd.to_datetime(per_point["timestamp"].str.strip(), errors="coerce", utc=True, format="ISO8601")
    ok = ends.notna() & walls.notna()
    if ok.any():
        starts = ends[ok] - pd.to_timedelta(walls[ok], unit="s")
        span = (ends[ok].max() - starts.min()).total_seconds()
        out.append(f"sweep wall time {span:.0f} s (first point's start to last point's end)")
    if walls.notna().any():
        out.append(f"{walls.sum():.0f} s inside {count(int(walls.notna().sum()), 'point')} (each point once)")
    return out


def runs_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per run (``run_id``) the rows name, oldest first and those
    without a line in runs.jsonl last: how many of the rows it wrote, and
    where and how it ran. Empty for rows of a layout without run_id."""
    known = df[df["run_id"].astype(str).str.strip().ne("")]
    if known.empty:
        return pd.DataFrame()
    agg = {"rows": ("run_id", "size"), **{f: (f, "first") for f in RUN_FIELDS}}
    runs = known.groupby("run_id", sort=False).agg(**agg)
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
                          *_whole(runs, index=True), ""]
    part.appendix += [f"## Sweep overrides ({len(overrides)} distinct; points, then the override string)", "", "```"]
    part.appendix += [f"{n:>6}  {o if o.strip() else '(empty)'}" for o, n in overrides.head(APPENDIX_ROWS).items()]
    part.appendix += ["```", ""]
    return part


SECTIONS: tuple[tuple[str, Section], ...] = (
    ("Verdicts", verdicts),
    ("Claim check", claim),
    ("Latency", latency),
    ("Bandwidth and padding", bandwidth),
    ("Environment", environment),
)


def plot_takeaways(df: pd.DataFrame, derived: Derived) -> dict[str, str]:
    """One line per plot: what to read off it, from the same rows it draws."""
    out: dict[str, str] = {}
    er = even_ratio(derived.pairs)
    uneven = df[timed(df) & round_trip(df) & df["impl"].eq("padded") & _is(df["is_even"], False)]
    text = (f"Takeaway: on even plans (cp > 1) padded's round trip is a median {er['median']:.2f}x legacy's "
            f"({count(er['n'], 'point')})" if er["n"] else "Takeaway: no even plan with cp > 1 has both impls timed")
    text += (f"; on {len(uneven)} uneven points only the padded path runs (legacy refuses them)." if len(uneven)
             else ".")
    out[plots.LATENCY_PNG] = text
    plans = derived.plans
    if plans.empty or not plans["padding_frac"].gt(0).any():
        out[plots.PADDING_PNG] = "Takeaway: no plan pads: every rank's shard has the same length."
    else:
        worst = plans.sort_values("padding_frac", ascending=False, kind="stable").iloc[0]
        zero = plans.groupby(_layout(plans))["padding_frac"].max()
        zero = sorted(k for k, v in zero.items() if v == 0)
        out[plots.PADDING_PNG] = (
            f"Takeaway: the most padded plan is {_layout(worst.to_frame().T).iloc[0]} at cp={fmt(worst['cp_size'])} "
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
    grouped = dup.groupby(POINT_KEY, sort=False).agg(
        rows=("status", "size"), statuses=("status", " -> ".join),
        **{c: (c, "last") for c in POINT},
    )
    grouped["used"] = "the last"
    more = keys[keys.duplicated(keep=False)].nunique() - len(grouped)
    tail = ["", f"... {more} more points with duplicates not listed"] if more > 0 else []
    return ["## Points with duplicate rows (statuses in file order; the last row is used)", "",
            frame_md(grouped[POINT + ["rows", "statuses", "used"]]), *tail, ""]


def prepare(run: Run) -> pd.DataFrame:
    """The run's latest row per point, typed, with the padded/legacy pairing key."""
    pair_cols = [c for c in CONFIG_COLUMNS if c != "impl"]
    df = typed(run.latest, NUMBERS).reset_index(drop=True)
    df[PAIR] = point_codes(run.latest_config[pair_cols].assign(_world=world(run.latest)))
    return df


def render(run: Run, df: pd.DataFrame, model=None) -> tuple[str, str]:
    """(report.md, report_appendix.md) as markdown."""
    counted = (f"{count(len(run.raw), 'row')} read; the latest of each point and impl: {count(len(df), 'row')} of "
               f"{count(df[PAIR].nunique(), 'point')}")
    if len(run.files) == 1:
        source = f"Source: `{run.files[0]}` ({counted})."
    else:
        source = f"Source: {len(run.files)} files under `{run.value}` ({counted})."
    derived = Derived(pairs=ratios(df), plans=_plans(df))
    lines = ["# nsa-cp-comm matrix report", "", verdict_line(df, derived.pairs), "", source]
    if run.duplicates:
        lines.append(f"Duplicates: {run.duplicate_note()} ([appendix]({APPENDIX_FILE})).")
    if run.upgraded:
        parts = ", ".join(f"{n} ok row(s) read as {s}" for s, n in sorted(run.upgraded.items()))
        lines.append(f"Written before the refused/passthrough statuses: {parts}.")
    if run.unknown_runs:
        lines.append(f"**Unknown environment:** {run.unknown_runs_note()}.")
    for warning in coverage.warnings(df):
        lines += ["", warning]
    lines.append("")
    appendix = ["# nsa-cp-comm matrix report: appendix", "", f"Back to the [report]({REPORT_FILE}). {source}", ""]
    appendix += duplicates(run)
    for title, section in SECTIONS:
        part = section(df, derived)
        while part.main and not part.main[-1]:
            part.main.pop()
        lines += [f"## {title}", "", *part.main, ""]
        appendix += part.appendix
    # Only where the run has them: outside implementations, pad_at_split rows, an nccl-tests model.
    covered, listed = coverage.section(df, APPENDIX_FILE)
    if covered:
        lines += ["## Plan classes covered", "", *covered, ""]
    appendix += listed
    compared = designs.section(df, PAIR)
    if compared:
        lines += ["## Designs: padded vs pad_at_split", "", *compared, ""]
    spread = workload.report_lines(df)
    if spread:
        lines += ["## Workloads: over each workload's batches", "", *spread, ""]
    if model is not None:
        lines += ["## Collectives predicted from nccl-tests (a model)", "", *designs.model_section(df, model), ""]
    lines += ["## Plots", ""]
    for name, takeaway in plot_takeaways(df, derived).items():
        lines += [f"![{name}]({name})", takeaway, ""]  # one paragraph: the plot, then what it shows
    lines += [f"Long lists (each failing point, per-point ratios, plans, overrides, duplicates): "
              f"[{APPENDIX_FILE}]({APPENDIX_FILE})", ""]
    if len(run.files) > 1:
        appendix += ["## Files read", "", *(f"- `{f}`" for f in run.files), ""]
    return "\n".join(lines), "\n".join(appendix)


def build(run: Run, model=None) -> tuple[str, str, dict[str, bytes]]:
    """(report.md text, appendix text, PNG bytes by file name), all in memory.
    ``model``: a matrix.nccl_tests.Model, for the predicted-beside-measured section."""
    df = prepare(run)
    markdown, appendix = render(run, df, model)
    return markdown, appendix, plots.render_all(df)


def write(out: Path, markdown: str, appendix: str, pngs: dict[str, bytes]) -> list[Path]:
    """Every file through a temporary name and a rename: a full disk leaves
    the files as they were (or none), never a truncated one."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in pngs.items():
        written.append(write_atomic(out / name, data))
    write_atomic(out / APPENDIX_FILE, appendix)
    write_atomic(out / REPORT_FILE, markdown)
    return [out / REPORT_FILE, out / APPENDIX_FILE, *written]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=" ".join(command("report")),
        description="Summarise a results table: verdicts, claim check, latency, bandwidth, environment.",
    )
    parser.add_argument("results", metavar="RESULTS", help="results directory or results CSV file")
    parser.add_argument(
        "--out", metavar="DIR", help="directory for report.md, its appendix and the PNGs (default: next to the CSV)"
    )
    parser.add_argument(
        "--nccl-tests", metavar="JSON", action="append", default=[],
        help="nccl-tests -J output of all_gather_perf / reduce_scatter_perf (repeatable): predicted collective "
        "times beside the measured ones, as a model",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns 0, or 2 on bad input (one line on stderr, nothing written)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # usage error (2, already printed) or --help (0): return, don't raise
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
            raise InputError(f"--out={args.out}: exists and is not a directory")
        model = None
        if args.nccl_tests:
            try:
                model = nccl_tests.load_model(args.nccl_tests)
            except nccl_tests.NcclTestsError as exc:
                raise InputError(str(exc)) from None
        run = load_run("RESULTS", args.results, READ)
        out = Path(args.out) if args.out is not None else run.home
        where = f"--out={args.out}" if args.out is not None else f"RESULTS={args.results}"
        check_dir(out, where, InputError)  # before the report is built
        markdown, appendix, pngs = build(run, model)
        try:
            written = write(out, markdown, appendix, pngs)
        except OSError as exc:
            raise InputError(f"{where}: cannot write the report to {out}: {one_line(exc, 200)}") from None
    except InputError as exc:
        print(f"error: {error_line(exc)}", file=sys.stderr)
        return 2
    for note in run.notes():
        print(note)
    print(markdown)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
