"""A row's repro shows where the rank raised: one point run without -m prints the raising rank's
traceback on stderr after the rows are written; a sweep (-m) does not (its rows' reasons name the
place, file and line, in one line each)."""

from __future__ import annotations

import re

from matrix.app.sweep import single_point
from matrix_cli import sweep_here

POINT = ("cp_size=2", "seq_lens=[7]", "hidden_size=32", "iters=1", "warmup=0", "timeout_s=120",
         "impl=tests.broken_impls:raise_rank")


def test_a_single_points_run_prints_the_raising_ranks_traceback(tmp_path, monkeypatch, capsys):
    run = sweep_here(tmp_path / "one", *POINT, monkeypatch=monkeypatch, capsys=capsys, multirun=False)
    assert run.returncode == 1, run.stderr[-2000:]
    # the rank as the row's reason numbers it (the CP group's numbering, which the harness permutes)
    assert re.search(r"traceback of tests\.broken_impls:raise_rank's error, rank \d \(ranks numbered as in the CP "
                     r"group\):\nTraceback \(most recent call last\)", run.stderr), run.stderr[-3000:]
    assert "Traceback (most recent call last)" in run.stderr and "in _raise" in run.stderr, run.stderr[-3000:]
    assert "RuntimeError: injected fault on rank 1" in run.stderr


def test_only_one_point_run_without_m_shows_tracebacks():
    """The rule the job asks (a sweep's rows name the place in one line each; its console stays a
    line a point)."""
    point = object()
    assert single_point([point], ["cp_size=2"]) is True
    assert single_point([point], ["-m", "cp_size=2"]) is False
    assert single_point([point], ["--multirun", "cp_size=2"]) is False
    assert single_point([point, point], ["cp_size=2"]) is False
