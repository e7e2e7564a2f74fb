"""The compare command (``nsa-cp-matrix-compare``, ``python -m matrix.compare``): its arguments,
reading the two runs, the listing and the exit code. What a row's verdict is, and why, is
:mod:`matrix.review.compare`'s (read here through the module, as a test that patches it sees).

    nsa-cp-matrix-compare BASE NEW [--metric roundtrip_vs_control] [--fail-above 15%]
                                   [--allow-missing] [--allow-unverified] [--all]
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from .. import command
from ..progress import Progress, run_command
from ..review import compare as logic
from ..review._review import SPREAD, InputError, load_run
from ..store.inputs import error_line
from ..store.results import CONFIG_COLUMNS
from ..store.samples import SAMPLES_FILE, missed_target_line
from nsa_cp_comm.harness.significance import POWER_MIN


def _listing(rows: pd.DataFrame, args: argparse.Namespace, threshold: float, columns: list[str],
             everything: bool, what: str) -> list[str]:
    """A table of ``rows`` (cut at LIST_LIMIT unless ``everything``) with a line on what was left out."""
    if rows.empty:
        return []
    shown = rows if everything else rows.head(logic.LIST_LIMIT)
    out = [logic.table(shown, logic.marks(shown, threshold, args.allow_missing, args.allow_unverified), columns)]
    if len(shown) < len(rows):
        out.append(f"... {len(rows) - len(shown)} more {what} not listed (--all lists them)")
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=" ".join(command("compare")),
        description="Compare two results tables row by row (a row: one point and one impl); exit 1 when "
        "nothing was compared, or a row is missing, failing in NEW (failed, error or timeout, whatever BASE had), "
        "lost correctness, regressed beyond the threshold and the noise, or is timed but could not be checked "
        "(unverified).",
    )
    parser.add_argument("base", metavar="BASE", help="baseline results directory or CSV file")
    parser.add_argument("new", metavar="NEW", help="new results directory or CSV file")
    parser.add_argument("--metric", default=logic.DEFAULT_METRIC,
                        help="timing/bandwidth column of the schema to compare (default %(default)s); *_GBps regress "
                        "by dropping")
    parser.add_argument("--fail-above", default=logic.DEFAULT_THRESHOLD, metavar="THRESHOLD",
                        help="regression threshold as a percentage or a fraction, e.g. 5%% or 0.05, at most 100%% "
                        "(default %(default)s)")
    parser.add_argument("--allow-missing", action="store_true",
                        help="rows of BASE absent from NEW are listed but do not fail (e.g. NEW ran a subset)")
    parser.add_argument("--allow-unverified", action="store_true",
                        help="timed rows compare could not check (the paired metric's samples missing on a side and "
                        f"no {logic.ABSOLUTE_FALLBACK} with a spread to fall back on, or too few of them to be significant; "
                        "a metric measured on one side only) are listed but do not fail")
    parser.add_argument("--all", action="store_true", dest="list_all",
                        help=f"list every row (by default, above {logic.LIST_LIMIT} rows only those with a mark are listed)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns 0 (pass), 1 (a gate tripped) or 2 (bad input)."""
    return run_command("compare", _parser(), _compare, argv)


def _compare(args: argparse.Namespace, progress: Progress) -> int:
    try:
        if args.metric not in logic.METRICS:
            raise InputError(f"--metric={args.metric}: unknown metric; one of {', '.join(logic.METRICS)}")
        threshold = logic.parse_threshold(args.fail_above)
        metric = args.metric
        # the CSV column the gate may read: the metric, or the paired metric's fallback
        column = logic.ABSOLUTE_FALLBACK if metric == logic.PAIRED else metric
        # the schema columns compare reads (the rest of a file is skipped)
        wanted = (*CONFIG_COLUMNS, "status", "correct", column, SPREAD, "roundtrip_p50_us", "point_id", "timestamp",
                  "load_1m", "overrides", "impl_origin", *logic.ENV_COLUMNS)
        progress.stage(f"reading BASE={args.base} and NEW={args.new}")
        base, new = load_run("BASE", args.base, wanted), load_run("NEW", args.new, wanted)
        logic.check_metric(base, column), logic.check_metric(new, column)
        sb, sn = logic.run_samples(base), logic.run_samples(new)
    except InputError as exc:
        print(f"error: {error_line(exc)}", file=sys.stderr)
        return 2

    for col in logic.ENV_COLUMNS:
        b, n = (sorted({str(v).strip() for v in run.latest[col].unique()} - {""}) for run in (base, new))
        if b != n:
            print(f"warning: environments differ: {col}: BASE {', '.join(b) or '(empty)'} vs NEW "
                  f"{', '.join(n) or '(empty)'}", file=sys.stderr)
    notes = [f"note: {run.arg}={run.value}: {smp.skipped_lines} unreadable line(s) of {SAMPLES_FILE} skipped"
             for run, smp in ((base, sb), (new, sn)) if smp.skipped_lines]
    if metric == logic.PAIRED:
        notes += [logic._no_samples_note(run) for run, smp in ((base, sb), (new, sn)) if not smp.found]
    # a calibration that stopped at its cap is named, per run, whatever the gate makes of its rows
    notes += [line for run, smp in ((base, sb), (new, sn)) if (line := missed_target_line(
        f"note: {run.arg}={run.value}", smp, zip(logic._column(run.latest, "point_id"), logic._column(run.latest, "impl"))))]
    progress.stage(f"joining and gating {len(base.latest)} and {len(new.latest)} rows")
    j = logic.compare(logic.keyed(base, metric, sb), logic.keyed(new, metric, sn), metric, threshold, samples_kept=sb.found or sn.found)
    gate = logic.gating(j, args.allow_missing, args.allow_unverified)
    empty = logic.nothing_compared(j)

    lines = [*base.notes(), *new.notes(), *notes, logic.rule_line(metric, threshold, j),
             *logic.noise_lines(j, metric, threshold)]
    same = [f"{c}={j[c].iloc[0]}" for c in CONFIG_COLUMNS if j[c].nunique(dropna=False) == 1]
    lines += [f"common to all rows: {', '.join(same)}"] if same else []
    cols = [c for c in CONFIG_COLUMNS if j[c].nunique(dropna=False) > 1]
    if len(j) <= logic.LIST_LIMIT or args.list_all:
        lines += ["", *_listing(j, args, threshold, cols, True, "rows")]
    else:
        marked = j[logic.remarkable(j)]
        lines += ["", f"{len(j) - len(marked)} of {len(j)} rows show no change (same status, within the "
                  f"threshold or not timed; --all lists them); {len(marked)} with a mark:"]
        lines += ["", *_listing(marked, args, threshold, cols, False, "marked rows")]

    counts = {"points": logic.points(j), "rows": len(j), "joined": int(j["_merge"].eq("both").sum())}
    for g in logic.GATE_TABLE:
        counts[g.name] = int(j[g.column].sum())
        if g.name == "missing":  # the join's other side beside it
            counts["only-in-new"] = int(j["only_new"].sum())
    counts.setdefault("only-in-new", int(j["only_new"].sum()))
    counts |= {
        # of those, tested but without the power to have flagged a regression
        "underpowered": int((j["unverified"] & j["power"].lt(POWER_MIN)).sum()),
        "within-noise": int(j["within_noise"].sum()),
        "improved": int(j["improved"].sum()),
    }
    smoke = int(j["smoke_untimed"].sum())
    if smoke:  # only then: the summary of every other compare stays as it was
        counts["smoke-untimed"] = smoke
        lines += ["", logic.smoke_note(smoke)]
    allowed = {g.name: bool(getattr(args, g.allowed_by)) for g in logic.GATE_TABLE if g.allowed_by}
    fail = bool(gate.any()) or bool(empty)
    if empty:
        lines += ["", f"FAIL: {empty}"]
    if gate.any():
        tripped = ", ".join(f"{name} {counts[name]}" for name in logic.GATES if counts[name] and not allowed.get(name))
        lines += ["", f"FAIL: {int(gate.sum())} row(s) of {logic.points(j[gate])} point(s) trip a gate ({tripped}):", ""]
        lines += _listing(j[gate], args, threshold, cols, args.list_all, "failing rows")
    summary = " ".join(f"{k}={v}" + (" (allowed)" if allowed.get(k) and v else "") for k, v in counts.items())
    lines += ["", f"summary: {summary} -> {'FAIL' if fail else 'PASS'}"]
    print("\n".join(lines))
    return 1 if fail else 0
