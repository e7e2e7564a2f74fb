"""Compare two results tables point by point and gate on what got worse.

    python -m matrix.compare BASE NEW [--metric roundtrip_p50_us] [--fail-above 5%]
                                      [--allow-missing] [--all]

BASE and NEW are results directories or CSV files (resolved as by
``matrix.report``). A point is a configuration (``matrix.results.CONFIG_COLUMNS``,
``impl`` included); when a file holds several rows of one point, the last in
file order (the latest run) is used and a note says how many were dropped.

Exit status 1 when any gate trips, else 0; 2 on bad input (one line):
- missing: a point of BASE has no row in NEW (``--allow-missing`` lets it pass);
- status worse: BASE ok/refused/passthrough, NEW failed/error/timeout (or a
  status the schema does not know); ``skipped`` is neutral either side;
- correctness lost: ``correct`` True in BASE and not True in NEW (unless NEW
  skipped the point);
- regressed: both rows are timed (status ok and a ``--metric`` value) and the
  metric got worse (a rise for times, a drop for ``*_GBps``) by more than
  ``--fail-above`` of BASE **and** by more than the rows' spread. The spread is
  the mean ``roundtrip_iqr_us`` of the two rows for ``roundtrip_*_us`` metrics;
  for other times and bandwidths that spread relative to ``roundtrip_p50_us``,
  applied to BASE's value; sizes have none. Rows without a spread gate on the
  threshold alone. A change beyond the threshold but within the spread is marked
  ``within noise`` and does not gate.
Refused, passthrough and skipped rows carry no timings and never gate on the metric.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
import pandas as pd

from matrix._review import (
    GOOD,
    NEUTRAL,
    InputError,
    Run,
    fmt,
    frame_md,
    load_run,
    parse_bool,
    point_codes,
)
from matrix.results import CONFIG_COLUMNS, TIMING_COLUMNS

DEFAULT_METRIC = "roundtrip_p50_us"
DEFAULT_THRESHOLD = "5%"
METRICS: tuple[str, ...] = TIMING_COLUMNS
SPREAD = "roundtrip_iqr_us"
# Timings from different machines or stacks are not comparable; say so, don't refuse.
ENV_COLUMNS = ("host", "torch_version", "nccl_version", "device", "device_name")
# Up to this many points, every one is listed; above, only points with a mark
# (the rest are unchanged within the threshold), and each list is cut here too.
LIST_LIMIT = 200

# The gates, as the summary line names them.
GATES = ("missing", "status-worse", "correctness-lost", "regressed")


def higher_is_better(metric: str) -> bool:
    """Bandwidths (``*_GBps``) regress by dropping; times and sizes by rising."""
    return metric.endswith("_GBps")


def spread_rule(metric: str) -> str:
    """How the noise margin of ``metric`` is computed: "absolute", "relative" or "none"."""
    if metric.startswith("roundtrip_") and metric.endswith("_us"):
        return "absolute"
    if metric.endswith("_us") or metric.endswith("_GBps"):
        return "relative"
    return "none"  # sizes and counts are exact, not measured


def parse_threshold(text: str) -> float:
    """``5%`` or ``0.05`` -> 0.05. A bare number must be a fraction below 1, so a
    forgotten ``%`` (``5``) is an error rather than a 500 % threshold."""
    s = text.strip()
    try:
        value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise InputError(f"--fail-above={text}: not a percentage (5%) or a fraction (0.05)") from None
    if not math.isfinite(value) or value < 0:
        raise InputError(f"--fail-above={text}: must be a finite, non-negative percentage (5%) or fraction (0.05)")
    if not s.endswith("%") and value >= 1:
        raise InputError(
            f"--fail-above={text}: a bare number must be a fraction below 1 (0.05); write {s}% for a percentage"
        )
    return value


def keyed(run: Run, metric: str) -> pd.DataFrame:
    """One row per point (the run's latest rows): its canonical config, the
    metric, status, correctness and the round trip's spread and median."""
    lat = run.latest
    frame = run.latest_config.copy()
    frame["value"] = pd.to_numeric(lat[metric], errors="coerce")
    frame["status"] = lat["status"].str.strip().astype(object)
    frame["correct"] = parse_bool(lat["correct"])
    frame["iqr"] = pd.to_numeric(lat[SPREAD], errors="coerce")
    frame["p50"] = pd.to_numeric(lat["roundtrip_p50_us"], errors="coerce")
    return frame.reset_index(drop=True)


def check_metric(run: Run, metric: str) -> None:
    """InputError (one line) when a point's metric is text but not a finite,
    non-negative number: a NaN compares as neither better nor worse and a
    negative latency as a gain, so either would pass unmarked. Empty cells
    (an untimed row) are not data, and are left alone."""
    text = run.latest[metric].astype(str).str.strip()
    value = pd.to_numeric(text, errors="coerce")
    bad = text.ne("") & ~(np.isfinite(value) & value.ge(0))
    if bad.any():
        first = run.latest_config.loc[bad[bad].index[0]]
        where = f"cp_size={first['cp_size']} seq_lens={first['seq_lens']} impl={first['impl']}"
        raise InputError(f"{run.arg}={run.value}: bad data: {metric}={text[bad].iloc[0]} in {int(bad.sum())} "
                         f"point(s) (first: {where}); a time or size is a finite number >= 0")


def columns_read(metric: str) -> tuple[str, ...]:
    """The schema columns compare reads (the rest of a file is skipped)."""
    return (*CONFIG_COLUMNS, "status", "correct", metric, SPREAD, "roundtrip_p50_us", *ENV_COLUMNS)


def _env_warnings(base: Run, new: Run) -> list[str]:
    lines = []
    for col in ENV_COLUMNS:
        b = sorted({str(v).strip() for v in base.latest[col].unique()} - {""})
        n = sorted({str(v).strip() for v in new.latest[col].unique()} - {""})
        if b != n:
            was, now = ", ".join(b) or "(empty)", ", ".join(n) or "(empty)"
            lines.append(f"warning: environments differ: {col}: BASE {was} vs NEW {now}")
    return lines


def _true(series: pd.Series) -> pd.Series:
    return series.eq(True).fillna(False).astype(bool)


def _spread(j: pd.DataFrame, metric: str) -> pd.Series:
    """The noise margin of each joined point in the metric's unit (NaN: none known).

    Mean of the two rows' spreads, or the one that exists (a BASE written before
    the spread column still gets NEW's)."""
    rule = spread_rule(metric)
    if rule == "absolute":
        return pd.concat([j["iqr_base"], j["iqr_new"]], axis=1).mean(axis=1)
    if rule == "relative":
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = pd.concat([j["iqr_base"] / j["p50_base"], j["iqr_new"] / j["p50_new"]], axis=1)
        rel = rel.replace([np.inf, -np.inf], np.nan).mean(axis=1)
        return rel * j["value_base"].abs()
    return pd.Series(np.nan, index=j.index)


def compare(base: pd.DataFrame, new: pd.DataFrame, metric: str, threshold: float) -> pd.DataFrame:
    """The outer join of two keyed runs, sorted by configuration, with one boolean
    column per verdict (see the module docstring) and ``change_pct``/``spread``."""
    # one integer per configuration, numbered over both runs at once, to join on
    config = pd.concat([base[list(CONFIG_COLUMNS)], new[list(CONFIG_COLUMNS)]], ignore_index=True)
    codes = point_codes(config)
    base = base.assign(key=codes[: len(base)])
    new = new.assign(key=codes[len(base):])
    values = ["key", "value", "status", "correct", "iqr", "p50"]
    j = base[values].merge(new[values], on="key", how="outer", suffixes=("_base", "_new"), indicator=True)
    config = config.assign(key=codes).drop_duplicates("key")
    j = j.merge(config, on="key", how="left")
    both = j["_merge"].eq("both")
    j["missing"] = j["_merge"].eq("left_only")
    j["only_new"] = j["_merge"].eq("right_only")

    sb, sn = j["status_base"].fillna(""), j["status_new"].fillna("")
    new_skipped = sn.isin(NEUTRAL)
    j["status_worse"] = both & sb.isin(GOOD) & ~sn.isin(GOOD) & ~new_skipped
    j["status_changed"] = both & sb.ne(sn)
    j["correctness_lost"] = both & _true(j["correct_base"]) & ~_true(j["correct_new"]) & ~new_skipped

    b, n = j["value_base"], j["value_new"]
    timed = both & sb.eq("ok") & sn.eq("ok") & b.notna() & n.notna()
    worse_by = (b - n) if higher_is_better(metric) else (n - b)
    spread = _spread(j, metric).where(timed)
    beyond_threshold = worse_by.abs() > threshold * b.abs()
    beyond_spread = spread.isna() | (worse_by.abs() > spread)
    j["timed"] = timed
    j["spread"] = spread
    j["regressed"] = timed & (worse_by > 0) & beyond_threshold & beyond_spread
    j["improved"] = timed & (worse_by < 0) & beyond_threshold & beyond_spread
    j["within_noise"] = timed & beyond_threshold & ~beyond_spread
    with np.errstate(divide="ignore", invalid="ignore"):
        # a zero base (possible only for sizes) gives +-inf for any change, 0 for none
        change = np.where(b.eq(0) & n.eq(0), 0.0, (n - b) / b * 100)
    j["change_pct"] = pd.Series(change, index=j.index).where(timed | (both & b.notna() & n.notna()))
    return _sorted(j)


def _sorted(j: pd.DataFrame) -> pd.DataFrame:
    """Rows in configuration order, numbers numerically (2 before 10), then text.

    Each column's few distinct values are ranked once; the rows sort on the ranks."""
    ranks = []
    for col in CONFIG_COLUMNS:
        codes, uniques = pd.factorize(j[col], use_na_sentinel=False)
        order = sorted(range(len(uniques)), key=lambda i: _sort_key(uniques[i]))
        rank = np.empty(len(uniques), dtype=np.int64)
        rank[order] = np.arange(len(uniques))
        ranks.append(rank[codes])
    order = np.lexsort(ranks[::-1]) if ranks else np.arange(len(j))
    return j.iloc[order].reset_index(drop=True)


def _sort_key(value: object) -> tuple[int, float, str]:
    try:
        return (0, float(str(value)), "")
    except ValueError:
        return (1, 0.0, str(value))


def gating(j: pd.DataFrame, allow_missing: bool) -> pd.Series:
    """Rows that make the exit status 1."""
    gate = j["status_worse"] | j["correctness_lost"] | j["regressed"]
    return gate | (j["missing"] & (not allow_missing))


def remarkable(j: pd.DataFrame) -> pd.Series:
    """Rows that get a mark other than "no timing": something changed."""
    flags = ["missing", "only_new", "status_changed", "correctness_lost", "regressed", "within_noise", "improved"]
    return j[flags].any(axis=1)


def _join_marks(parts: list[pd.Series]) -> pd.Series:
    """Non-empty parts of each row joined with "; " (column-wise, no row loop)."""
    out = parts[0]
    for p in parts[1:]:
        out = pd.Series(np.where(out.eq(""), p, np.where(p.eq(""), out, out + "; " + p)), index=out.index)
    return out


def marks(j: pd.DataFrame, threshold: float, allow_missing: bool) -> pd.Series:
    """The mark column: what happened to each point, and which rule applied."""
    pct = f"{threshold * 100:g}%"
    blank = pd.Series("", index=j.index, dtype=object)

    def when(mask: pd.Series, text: pd.Series | str) -> pd.Series:
        return pd.Series(np.where(mask, text, ""), index=j.index, dtype=object)

    sb, sn = j["status_base"].fillna("-"), j["status_new"].fillna("-")
    cb = j["correct_base"].astype(object).map(fmt).replace("", "-")
    cn = j["correct_new"].astype(object).map(fmt).replace("", "-")
    spread = j["spread"].map(fmt)
    no_timing = j["_merge"].eq("both") & ~j["timed"]
    parts = [
        when(j["missing"], "MISSING in NEW (allowed)" if allow_missing else "MISSING in NEW"),
        when(j["only_new"], "only in NEW"),
        when(j["status_worse"], "STATUS WORSE " + sb + "->" + sn),
        when(j["status_changed"] & ~j["status_worse"], "status " + sb + "->" + sn),
        when(j["correctness_lost"], "CORRECTNESS LOST (correct " + cb + "->" + cn + ")"),
        when(j["regressed"] & j["spread"].notna(), f"REGRESSED (beyond {pct} and the spread)"),
        when(j["regressed"] & j["spread"].isna(), f"REGRESSED (beyond {pct}; no spread)"),
        when(j["within_noise"], "within noise (beyond " + pct + " but not the spread " + spread + ")"),
        when(j["improved"], "improved"),
        when(no_timing, "no timing"),
    ]
    return _join_marks([blank, *parts])


def _change(values: pd.Series) -> pd.Series:
    def one(v: float) -> str:
        if pd.isna(v):
            return ""
        if math.isinf(v):
            return "+inf%" if v > 0 else "-inf%"
        return f"{v:+.1f}%"

    return values.map(one)


def _cells(col: pd.Series) -> pd.Series:
    """A canonical key column shown as numbers when every cell is one (right-aligned)."""
    num = pd.to_numeric(col, errors="coerce")
    if num.notna().all():
        return num.astype("int64") if (num == num.round()).all() else num
    return col


def varying(j: pd.DataFrame) -> list[str]:
    """Configuration columns with more than one value (the others are named once)."""
    return [c for c in CONFIG_COLUMNS if j[c].nunique(dropna=False) > 1]


def table(j: pd.DataFrame, mark: pd.Series, columns: list[str]) -> str:
    """The markdown table of ``j``'s rows: the configuration ``columns``, base,
    new, change, spread, mark."""
    shown = pd.DataFrame({c: _cells(j[c]) for c in columns}, index=j.index)
    shown["base"] = j["value_base"]
    shown["new"] = j["value_new"]
    shown["change"] = _change(j["change_pct"])
    shown["spread"] = j["spread"]
    shown["mark"] = mark
    return frame_md(shown)


def common_config(j: pd.DataFrame) -> str:
    same = [f"{c}={j[c].iloc[0]}" for c in CONFIG_COLUMNS if j[c].nunique(dropna=False) == 1]
    return f"common to all points: {', '.join(same)}" if same else ""


def _listing(rows: pd.DataFrame, args: argparse.Namespace, threshold: float, columns: list[str],
             everything: bool, what: str) -> list[str]:
    """A table of ``rows`` (cut at LIST_LIMIT unless ``everything``) with a line on what was left out."""
    if rows.empty:
        return []
    shown = rows if everything else rows.head(LIST_LIMIT)
    out = [table(shown, marks(shown, threshold, args.allow_missing), columns)]
    if len(shown) < len(rows):
        out.append(f"... {len(rows) - len(shown)} more {what} not listed (--all lists them)")
    return out


def rule_line(metric: str, threshold: float) -> str:
    direction = "higher" if higher_is_better(metric) else "lower"
    pct = f"{threshold * 100:g}%"
    head = (f"metric: {metric} ({direction} is better); a point regresses when both rows are timed "
            f"and it is worse by more than {pct}")
    rule = spread_rule(metric)
    if rule == "absolute":
        return (head + f" AND by more than its spread (mean {SPREAD} of the two rows);"
                f" rows without a spread: {pct} alone")
    if rule == "relative":
        return (head + f" AND by more than its spread ({SPREAD} / roundtrip_p50_us of the two rows, times BASE);"
                f" rows without a spread: {pct} alone")
    return head + " (a size: exact, no spread)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m matrix.compare",
        description="Compare two results tables point by point; exit 1 when a point is missing, "
        "got a worse status, lost correctness or regressed beyond the threshold and its spread.",
    )
    parser.add_argument("base", metavar="BASE", help="baseline results directory or CSV file")
    parser.add_argument("new", metavar="NEW", help="new results directory or CSV file")
    parser.add_argument(
        "--metric", default=DEFAULT_METRIC,
        help="timing/bandwidth column of the schema to compare (default %(default)s); *_GBps regress by dropping",
    )
    parser.add_argument(
        "--fail-above", default=DEFAULT_THRESHOLD, metavar="THRESHOLD",
        help="regression threshold as a percentage or a fraction, e.g. 5%% or 0.05 (default %(default)s)",
    )
    parser.add_argument(
        "--allow-missing", action="store_true",
        help="points of BASE absent from NEW are listed but do not fail (e.g. NEW ran a subset)",
    )
    parser.add_argument(
        "--all", action="store_true", dest="list_all",
        help=f"list every point (by default, above {LIST_LIMIT} points only those with a mark are listed)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns 0 (pass), 1 (a gate tripped) or 2 (bad input)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # usage error (2, already printed) or --help (0): return, don't raise
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.metric not in METRICS:
            raise InputError(f"--metric={args.metric}: unknown metric; one of {', '.join(METRICS)}")
        threshold = parse_threshold(args.fail_above)
        wanted = columns_read(args.metric)
        base, new = load_run("BASE", args.base, wanted), load_run("NEW", args.new, wanted)
        check_metric(base, args.metric), check_metric(new, args.metric)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    for warning in _env_warnings(base, new):
        print(warning, file=sys.stderr)
    j = compare(keyed(base, args.metric), keyed(new, args.metric), args.metric, threshold)
    gate = gating(j, args.allow_missing)

    lines = [*base.notes(), *new.notes(), rule_line(args.metric, threshold)]
    common, cols = common_config(j), varying(j)
    lines += [common] if common else []
    if len(j) <= LIST_LIMIT or args.list_all:
        lines += ["", *_listing(j, args, threshold, cols, True, "points")]
    else:
        marked = j[remarkable(j)]
        lines += ["", f"{len(j) - len(marked)} of {len(j)} points show no change (same status, within the "
                  f"threshold or not timed; --all lists them); {len(marked)} with a mark:"]
        lines += ["", *_listing(marked, args, threshold, cols, False, "marked points")]

    counts = {
        "points": len(j),
        "joined": int(j["_merge"].eq("both").sum()),
        "missing": int(j["missing"].sum()),
        "only-in-new": int(j["only_new"].sum()),
        "status-worse": int(j["status_worse"].sum()),
        "correctness-lost": int(j["correctness_lost"].sum()),
        "regressed": int(j["regressed"].sum()),
        "within-noise": int(j["within_noise"].sum()),
        "improved": int(j["improved"].sum()),
    }
    fail = bool(gate.any())
    if fail:
        tripped = ", ".join(f"{name} {counts[name]}" for name in GATES
                            if counts[name] and (name != "missing" or not args.allow_missing))
        lines += ["", f"FAIL: {int(gate.sum())} point(s) trip a gate ({tripped}):", ""]
        lines += _listing(j[gate], args, threshold, cols, args.list_all, "failing points")
    allowed = " (allowed)" if args.allow_missing and counts["missing"] else ""
    summary = " ".join(f"{k}={v}" + (allowed if k == "missing" else "") for k, v in counts.items())
    lines += ["", f"summary: {summary} -> {'FAIL' if fail else 'PASS'}"]
    print("\n".join(lines))
    return 1 if fail else 0


if __name__ == "__main__":
    raise SystemExit(main())
