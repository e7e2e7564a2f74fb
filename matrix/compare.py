"""Compare two results tables point by point and gate on regressions.

    python -m matrix.compare BASE NEW [--metric roundtrip_p50_us] [--fail-above 5%]

BASE and NEW are results directories or CSV files (resolved as by
``matrix.report``). Rows are joined on the configuration columns
(``matrix.results.CONFIG_COLUMNS``, ``impl`` included). For each point the two
values of ``--metric`` and the change in percent are printed, and points found
in only one run are marked.

Exit status: 1 when a joined point regresses beyond ``--fail-above`` (a rise for
times, a drop for ``*_GBps`` bandwidths) or loses correctness (``correct`` True
in BASE but not in NEW, or status ok in BASE and failed/error/timeout in NEW);
0 otherwise; 2 on bad input. Points without a metric value in either run are
shown but never gate on the metric; points in only one run never gate.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
import pandas as pd

from matrix._review import InputError, Run, canonical, fmt, load_run, md_table, parse_bool
from matrix.results import CONFIG_COLUMNS, TIMING_COLUMNS

DEFAULT_METRIC = "roundtrip_p50_us"
DEFAULT_THRESHOLD = "5%"
METRICS: tuple[str, ...] = TIMING_COLUMNS
FAILED_STATUSES = ("failed", "error", "timeout")
# Timings from different machines or stacks are not comparable; say so, don't refuse.
ENV_COLUMNS = ("host", "torch_version", "nccl_version", "device", "device_name")

_KEYS = [f"k_{c}" for c in CONFIG_COLUMNS]


def higher_is_better(metric: str) -> bool:
    """Bandwidths (``*_GBps``) regress by dropping; times and sizes by rising."""
    return metric.endswith("_GBps")


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


def _keyed(run: Run, metric: str) -> tuple[pd.DataFrame, int]:
    """One row per point: canonical config keys, the metric, status and correct.

    Returns the frame and how many duplicate rows were dropped (a point run twice,
    e.g. several results.csv concatenated: the last row, the latest append, wins)."""
    raw = run.raw
    frame = pd.DataFrame({k: raw[c].map(canonical) for c, k in zip(CONFIG_COLUMNS, _KEYS)})
    frame["value"] = pd.to_numeric(raw[metric], errors="coerce")
    frame["status"] = raw["status"].str.strip()
    frame["correct"] = parse_bool(raw["correct"])
    unique = frame.drop_duplicates(subset=_KEYS, keep="last")
    return unique, len(frame) - len(unique)


def _env_warnings(base: Run, new: Run) -> list[str]:
    lines = []
    for col in ENV_COLUMNS:
        b = sorted({v.strip() for v in base.raw[col] if v.strip()})
        n = sorted({v.strip() for v in new.raw[col] if v.strip()})
        if b != n:
            was, now = ", ".join(b) or "(empty)", ", ".join(n) or "(empty)"
            lines.append(f"warning: environments differ: {col}: BASE {was} vs NEW {now}")
    return lines


def _cell(value: str) -> object:
    """A canonical key shown as a number when it is one (right-aligned in the table)."""
    kind, number, _ = _sort_key(value)
    return value if kind else (int(number) if number == int(number) else number)


def _sort_key(value: str) -> tuple[int, float, str]:
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def compare(base: pd.DataFrame, new: pd.DataFrame, metric: str, threshold: float) -> pd.DataFrame:
    """The outer join of two keyed runs with per-point verdict columns."""
    joined = base.merge(new, on=_KEYS, how="outer", suffixes=("_base", "_new"), indicator=True)
    both = joined["_merge"].eq("both")
    b, n = joined["value_base"], joined["value_new"]
    valued = both & b.notna() & n.notna()
    up, down = n > b * (1 + threshold), n < b * (1 - threshold)
    worse, better = (down, up) if higher_is_better(metric) else (up, down)
    joined["regressed"] = valued & worse
    joined["improved"] = valued & better
    lost = joined["correct_base"].eq(True).fillna(False) & ~joined["correct_new"].eq(True).fillna(False)
    failed = joined["status_base"].eq("ok") & joined["status_new"].isin(FAILED_STATUSES)
    joined["incorrect"] = both & (lost | failed)
    with np.errstate(divide="ignore", invalid="ignore"):
        # a zero base (possible only for sizes) gives +-inf for any change, 0 for none
        change = np.where(b.eq(0) & n.eq(0), 0.0, (n - b) / b * 100)
    joined["change_pct"] = pd.Series(change, index=joined.index).where(valued)
    order = sorted(range(len(joined)), key=lambda i: [_sort_key(joined.at[i, k]) for k in _KEYS])
    return joined.loc[order].reset_index(drop=True)


def _mark(row: pd.Series) -> str:
    side = row["_merge"]
    if side == "left_only":
        return "only-in-base"
    if side == "right_only":
        return "only-in-new"
    marks = []
    if row["incorrect"]:
        marks.append(
            f"NOW INCORRECT (status {row['status_base'] or '-'}->{row['status_new'] or '-'}, "
            f"correct {fmt(row['correct_base']) or '-'}->{fmt(row['correct_new']) or '-'})"
        )
    if row["regressed"]:
        marks.append("REGRESSED")
    elif row["improved"]:
        marks.append("improved")
    if pd.isna(row["value_base"]) or pd.isna(row["value_new"]):
        marks.append("no value")
    return "; ".join(marks)


def _change(value: float) -> str:
    if pd.isna(value):
        return ""
    if math.isinf(value):
        return "+inf%" if value > 0 else "-inf%"
    return f"{value:+.1f}%"


def render(joined: pd.DataFrame) -> tuple[list[str], str, str]:
    """(lines naming the config shared by every point, the table, gating rows' table)."""
    varying = [c for c, k in zip(CONFIG_COLUMNS, _KEYS) if joined[k].nunique() > 1]
    common = [f"{c}={joined[k].iloc[0]}" for c, k in zip(CONFIG_COLUMNS, _KEYS) if c not in varying]
    columns = varying + ["base", "new", "change", "mark"]

    def rows(frame: pd.DataFrame) -> list[list[object]]:
        return [
            [_cell(r[f"k_{c}"]) for c in varying]
            + [r["value_base"], r["value_new"], _change(r["change_pct"]), _mark(r)]
            for _, r in frame.iterrows()
        ]

    gating = joined[joined["regressed"] | joined["incorrect"]]
    header = [f"common to all points: {', '.join(common)}"] if common else []
    return header, md_table(columns, rows(joined)), md_table(columns, rows(gating)) if len(gating) else ""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m matrix.compare",
        description="Compare two results tables point by point; exit 1 on a regression or a correctness loss.",
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
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns 0 (pass), 1 (a point regressed or lost correctness) or 2 (bad input)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # usage error (2, already printed) or --help (0): return, don't raise
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.metric not in METRICS:
            raise InputError(f"--metric={args.metric}: unknown metric; one of {', '.join(METRICS)}")
        threshold = parse_threshold(args.fail_above)
        base, new = load_run("BASE", args.base), load_run("NEW", args.new)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    for warning in _env_warnings(base, new):
        print(warning, file=sys.stderr)
    notes = base.notes() + new.notes()
    keyed = []
    for run in (base, new):
        frame, dups = _keyed(run, args.metric)
        keyed.append(frame)
        if dups:
            notes.append(
                f"note: {run.arg}={run.value}: {dups} duplicate row(s) of the same point; the last of each is used"
            )
    joined = compare(keyed[0], keyed[1], args.metric, threshold)

    direction = "higher" if higher_is_better(args.metric) else "lower"
    pct = f"{threshold * 100:g}%"
    header, table, gating = render(joined)
    lines = [*notes, f"metric: {args.metric} ({direction} is better); fail above {pct} worse", *header, "", table]
    print("\n".join(lines))
    counts = {
        "joined": int(joined["_merge"].eq("both").sum()),
        "regressed": int(joined["regressed"].sum()),
        "improved": int(joined["improved"].sum()),
        "only-in-base": int(joined["_merge"].eq("left_only").sum()),
        "only-in-new": int(joined["_merge"].eq("right_only").sum()),
        "now-incorrect": int(joined["incorrect"].sum()),
    }
    fail = counts["regressed"] > 0 or counts["now-incorrect"] > 0
    if fail:
        print(f"\nFAIL: these points regressed beyond {pct} or lost correctness:\n\n{gating}")
    summary = " ".join(f"{k}={v}" for k, v in counts.items())
    print(f"\nsummary: {summary} -> {'FAIL' if fail else 'PASS'}")
    return 1 if fail else 0


if __name__ == "__main__":
    raise SystemExit(main())
