"""The report command (``nsa-cp-matrix-report``, ``python -m matrix.report``): its arguments,
reading the run, writing the files and the exit code. What the report says is
:mod:`matrix.review.report`'s, read here through the module (as a test that patches it
sees, whenever this module was first imported).

    nsa-cp-matrix-report RESULTS [--out DIR] [--reference NAME] [--nccl-tests JSON] [--exit-zero]

Exit code: 0, or 1 when the verdict is FAIL (``--exit-zero`` exits 0 there too), with the files
written either way; bad input is one ``error:`` line on stderr and exit code 2, nothing written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .. import command
from ..progress import Progress, run_command
from ..review import report as logic
from ..review import report_doc
from ..review._review import InputError, load_run, one_line
from ..scale import nccl_tests
from ..store.inputs import error_line
from ..store.outputs import check_dir


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=" ".join(command("report")),
        description="Summarise a results table: verdicts, claim check, latency, bandwidth, environment.",
    )
    parser.add_argument("results", metavar="RESULTS", help="results directory or results CSV file")
    parser.add_argument("--out", metavar="DIR",
                        help="directory for report.md, its appendix and the PNGs (default: next to the CSV)")
    parser.add_argument("--nccl-tests", metavar="JSON", action="append", default=[],
                        help="nccl-tests -J output of all_gather_perf / reduce_scatter_perf (repeatable): predicted "
                        "collective times beside the measured ones, as a model")
    parser.add_argument("--reference", metavar="NAME",
                        help="the impl every other impl's round trip is divided by, on the same points (default: "
                        f"{logic.DEFAULT_REFERENCE})")
    parser.add_argument("--exit-zero", action="store_true",
                        help="exit 0 when the verdict is FAIL too (the files are written either way; default: exit 1 "
                        "on FAIL)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code the module's docstring gives (0, 1 on FAIL, 2 on bad input)."""
    return run_command("report", _parser(), _report, argv)


def _report(args: argparse.Namespace, progress: Progress) -> int:
    try:
        if args.out is not None and os.path.exists(args.out) and not Path(args.out).is_dir():
            raise InputError(f"--out={args.out}: exists and is not a directory")
        model = None
        if args.nccl_tests:
            try:
                model = nccl_tests.load_model(args.nccl_tests)
            except nccl_tests.NcclTestsError as exc:
                raise InputError(str(exc)) from None
        progress.stage(f"reading RESULTS={args.results}")
        run = load_run("RESULTS", args.results, logic.READ)
        out = Path(args.out) if args.out is not None else run.home
        where = f"--out={args.out}" if args.out is not None else f"RESULTS={args.results}"
        check_dir(out, where, InputError)  # before the report is built
        if args.reference is not None:  # an impl of the run (by any of its names)
            impls = sorted(set(run.latest["impl"].astype(str).str.strip()))
            if args.reference not in impls:
                shown = ", ".join(impls[:8]) + (", ..." if len(impls) > 8 else "")
                raise InputError(f"--reference={args.reference}: no row of RESULTS has this impl (impls: {shown})")
        progress.stage(f"building the report of {len(run.raw)} rows (tables, then plots)")
        doc, pngs = logic.build(run, model, logic.DEFAULT_REFERENCE if args.reference is None else args.reference)
        progress.stage(f"writing to {out}")
        try:
            written = logic.write(out, doc, pngs)
        except OSError as exc:
            raise InputError(f"{where}: cannot write the report to {out}: {one_line(exc, 200)}") from None
    except InputError as exc:
        print(f"error: {error_line(exc)}", file=sys.stderr)
        return 2
    for note in run.notes():
        print(note)
    print(report_doc.markdown(doc)[0])
    print("wrote " + ", ".join(str(p) for p in written))
    if doc["verdict"] == "FAIL" and not args.exit_zero:
        # a script or CI job that runs the report stops on a failing sweep
        print(f"verdict FAIL: {'; '.join(doc['reasons'])} (exit 1; --exit-zero exits 0)", file=sys.stderr)
        return 1
    return 0
