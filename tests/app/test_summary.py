"""The sweep's closing summary line (matrix.app.summary): rows counted as rows, points as points."""

from __future__ import annotations

from matrix.app import summary

from compare_rows import make_row, write_run


def test_the_closing_line_counts_points_as_points_and_rows_as_rows(tmp_path):
    """Two failing rows of one point are one failing point; a point without a row is one missing point."""
    write_run(tmp_path, [make_row("padded", status="error", point_id="p1"),
                         make_row("legacy", status="timeout", point_id="p1"),
                         make_row("padded", cp=4, point_id="p2"), make_row("legacy", cp=4, point_id="p2")])
    cfg = [{"results_dir": str(tmp_path), "seq_lens": [n]} for n in (1, 2, 3)]
    counts, _, _ = summary.summarize([(cfg[0], "p1"), (cfg[1], "p2"), (cfg[2], "p3")])
    assert summary.render(counts, []) == ("matrix summary: 3 points, 4 rows: ok 2, failed 0, error 1, timeout 1; "
                    "failed, error or timeout: 2 rows of 1 point; missing 1 point (wrote no row)")
    assert summary.exit_code(counts) == summary.EXIT_BAD
    counts, _, _ = summary.summarize([(cfg[1], "p2")])
    assert summary.render(counts, []) == "matrix summary: 1 point, 2 rows: ok 2, failed 0, error 0, timeout 0"


def test_rows_too_few_to_be_significant_are_named(tmp_path):
    """The smoke preset's iters=3 can never fail compare's test: the summary says so;
    iters=auto and 5 or more are silent, as are rows that were not timed."""
    write_run(tmp_path, [make_row("padded", point_id="p1", iters=3), make_row("legacy", point_id="p1", iters=3),
                         make_row("padded", point_id="p2", iters="auto"), make_row("padded", point_id="p3")])
    cfg = {"results_dir": str(tmp_path)}
    counts, _, _ = summary.summarize([({**cfg, "seq_lens": [n]}, f"p{n}") for n in (1, 2, 3)])
    assert summary.render(counts, []).splitlines()[1] == (
        "samples too few: 2 timed rows with fewer than 5 iterations: no change in them can be significant, and "
        "compare fails them as unverified (between two runs of the smoke preset it gates their status and "
        "correctness only); time with iters=5 or more, or iters=auto")
    counts, _, _ = summary.summarize([({**cfg, "seq_lens": [n]}, f"p{n}") for n in (2, 3)])
    assert "samples too few" not in summary.render(counts, [])


def test_a_long_reason_on_the_console_is_marked_as_cut_and_points_to_the_row():
    short = "rank 1 never entered _ALLGATHER_BASE"
    assert summary.clipped(short) == short
    long = ("in mycomm:ceil_pad's checks: rank 0 error: RuntimeError: The size of tensor a (17) must match the "
            "size of tensor b (18) at non-singleton dimension 0")
    assert len(long) > summary.REASON_CHARS
    got = summary.describe({"impl": "x", "status": "error", "failed_check": "", "reason": long})
    assert got.endswith(summary.CUT_MARK + ")") and "results.csv" in got
    # its start and its end, each cut at a word: the numbers at the end of a message are kept
    head, tail = summary.clipped(long)[: -len(summary.CUT_MARK)].split(summary.GAP_MARK)
    assert long.startswith(head) and long[len(head)] == " "
    assert long.endswith(tail) and long[-len(tail) - 1] == " ", tail
    assert "(17) must match the size of tensor b (18) at non-singleton dimension 0" in tail, tail


def test_a_point_swept_over_its_impls_is_one_point(tmp_path):
    """`impl=mine,padded` under -m makes a job per point and impl (two point
    ids); the summary counts the configuration once, as the report does."""
    write_run(tmp_path, [make_row("padded", point_id="a1"), make_row("legacy", status="error", point_id="a2"),
                         make_row("padded", cp=4, point_id="b1")])
    base = {"results_dir": str(tmp_path), "cp_size": 2}
    pts = [({**base, "impl": "padded"}, "a1"), ({**base, "impl": "legacy"}, "a2"),
           ({**base, "cp_size": 4, "impl": "padded"}, "b1"), ({**base, "cp_size": 4, "impl": "legacy"}, "b2")]
    counts, _, _ = summary.summarize(pts)
    assert summary.render(counts, []) == (
        "matrix summary: 2 points, 3 rows: ok 2, failed 0, error 1, timeout 0; "
        "failed, error or timeout: 1 row of 1 point; missing 1 point (wrote no row)")


def test_the_console_the_summary_and_the_report_count_the_same_points(tmp_path):
    """The conformance preset swept over two impls, cut to 2 configurations:
    its dry run, its closing summary and its report (report.md's verdict line,
    report.json) all say 2 points and 4 rows (a point: a configuration; a row:
    a point and an impl). Before, the console counted jobs: 4 points."""
    import json
    import re

    from matrix.report import cli as report_cli
    from matrix_cli import run_matrix

    args = ("+matrix=conformance", "impl=padded,legacy", "+plan_class=even,uneven_by_one", "+conformance_cp=cp2",
            "bystanders=0")
    res = tmp_path / "res"
    dry = run_matrix(res, *args, "--dry-run", multirun=False)
    assert dry.returncode == 0, dry.stderr[-2000:]
    estimate = dry.stdout.strip().splitlines()[-1]
    assert estimate.startswith("estimate: 2 points (4 jobs: one per point and impl), about "), estimate
    run = run_matrix(res, *args, multirun=False, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    closing = next(ln for ln in run.stdout.splitlines() if ln.startswith("matrix summary:"))
    assert re.match(r"matrix summary: 2 points, 4 rows: ", closing), closing
    assert report_cli.main([str(res), "--exit-zero"]) == 0
    first = next(ln for ln in (res / "report.md").read_text().splitlines() if ln.startswith("**Verdict"))
    assert "2 points, 4 rows (a row: one point and one impl)" in first, first
    doc = json.loads((res / "report.json").read_text())
    assert (doc["summary"]["points"], doc["summary"]["rows"]) == (2, 4)


def test_allow_skipped_passes_the_gaps_only_where_every_point_allows_them(tmp_path):
    """An outside plug-in that ran no uneven plan at cp 2: allowed when every point of the sweep
    says allow_skipped=true, a gap (exit 1) when one point does not."""
    mine = "tests.broken_impls:x"
    write_run(tmp_path, [make_row(mine, point_id="p1", plan_class="even", impl_origin="tests.broken_impls"),
                         make_row(mine, point_id="p2", seq_lens="[1024]", plan_class="even",
                                  impl_origin="tests.broken_impls")])
    cfg = {"results_dir": str(tmp_path)}
    both = [({**cfg, "seq_lens": [1], "allow_skipped": True}, "p1"), ({**cfg, "seq_lens": [2], "allow_skipped": True},
                                                                          "p2")]
    counts, _, gaps = summary.summarize(both)
    assert gaps and counts["coverage gaps"] == 0 and summary.exit_code(counts) == 0
    one = [both[0], ({**cfg, "seq_lens": [2], "allow_skipped": False}, "p2")]
    counts, _, _ = summary.summarize(one)
    assert counts["coverage gaps"] == 1 and summary.exit_code(counts) == summary.EXIT_BAD
