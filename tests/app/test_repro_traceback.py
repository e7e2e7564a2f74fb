"""A row's repro reruns its point into the row's folder and shows where the rank raised: one point
run without -m prints the raising rank's traceback on stderr after the rows are written; a sweep (-m)
does not (its rows' reasons name the place, file and line, in one line each)."""

from __future__ import annotations

import csv
import re

from matrix.app.repro_env import split
from matrix.app.sweep import single_point
from matrix.review import report
from matrix.review._review import load_run
from matrix_cli import sweep_here

POINT = ("cp_size=2", "seq_lens=[7]", "hidden_size=32", "iters=1", "warmup=0", "timeout_s=120",
         "impl=tests.broken_impls:raise_rank")


def test_a_single_points_run_and_its_repro_print_the_raising_ranks_traceback(tmp_path, monkeypatch, capsys):
    """The row's repro as written (its results_dir named, absolute) reruns the point into the same
    folder: a second row, readers use the later one, the report's appendix shows both statuses in
    order; each run prints where the rank raised."""
    folder = tmp_path / "one"
    first = sweep_here(folder, *POINT, monkeypatch=monkeypatch, capsys=capsys, multirun=False)
    with open(folder / "results.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    env, argv = split(row["repro"])
    assert argv[:3] == ["python", "-m", "matrix"] and f"results_dir={folder.resolve()}" in argv, row["repro"]
    again = sweep_here(folder, *[a for a in argv[3:] if not a.startswith("results_dir=")], monkeypatch=monkeypatch,
                       capsys=capsys, multirun=False)
    for run in (first, again):
        assert run.returncode == 1, run.stderr[-2000:]
        # the rank as the row's reason numbers it (the CP group's numbering, which the harness permutes)
        assert re.search(r"traceback of tests\.broken_impls:raise_rank's error, rank \d \(ranks numbered as in the "
                         r"CP group\):\nTraceback \(most recent call last\)", run.stderr), run.stderr[-3000:]
        assert "in _raise" in run.stderr and "RuntimeError: injected fault on rank 1" in run.stderr, run.stderr[-3000:]
    with open(folder / "results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["point_id"] for r in rows] == [row["point_id"]] * 2
    appendix = "\n".join(report.duplicates(load_run("RESULTS", str(folder), report.READ)))
    assert "Points with duplicate rows" in appendix and "error -> error" in appendix, appendix


def test_only_one_point_run_without_m_shows_tracebacks():
    """The rule the job asks (a sweep's rows name the place in one line each; its console stays a
    line a point)."""
    point = object()
    assert single_point([point], ["cp_size=2"]) is True
    assert single_point([point], ["-m", "cp_size=2"]) is False
    assert single_point([point], ["--multirun", "cp_size=2"]) is False
    assert single_point([point, point], ["cp_size=2"]) is False
