"""`python -m matrix.report`: verdicts first, the claim explained, noise said,
duplicates said, long lists in the appendix, plots that show what they claim,
bad input as one line."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pandas as pd
import pytest

from matrix.compare import cli as compare_cli
from matrix.report import cli as report_cli
from matrix.review import _review, compare, plots, report
from matrix.app.config import INT_RANGES
from matrix.store.results import COLUMNS, INT_COLUMNS, RESULTS_FILE, STATUS_VALUES
from matrix.store.runs import LAYOUT2_ENV
from report_rows import (RUN, TORCH_TEXT, _frame, append, bench_review, make_row, md_of, mixed_rows, plot_rows,
                         run_report, section, table_row)

PNGS = ("roundtrip_latency.png", "padding_frac.png", "busbw.png")


@pytest.fixture(autouse=True)
def _text_only(request):
    """The tests here read the report's text: its plots are built, not drawn
    (tests/conftest.py plots_not_drawn), but where a test asks for `real_plots`."""
    if "real_plots" not in request.fixturenames:
        request.getfixturevalue("plots_not_drawn")


@pytest.fixture
def real_plots():
    """The report's plots drawn as the CLI draws them."""


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    append(tmp_path / "run", mixed_rows())
    return tmp_path / "run"


# --- files and order


def test_report_writes_markdown_appendix_and_pngs(run_dir, capsys, real_plots):
    md, appendix, _ = run_report(run_dir, code=1)  # the mixed run has failing rows: verdict FAIL
    for name in PNGS:
        data = (run_dir / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 1000
    out = capsys.readouterr().out
    assert "wrote " in out and "report.md" in out and "report_appendix.md" in out
    assert md in out  # report.md is what the terminal shows
    titles = ("## Verdicts", "## Claim check", "## Latency", "## Bandwidth and padding", "## Environment", "## Plots")
    heads = [md.index(h) for h in titles]
    assert heads == sorted(heads)
    assert md.rstrip().splitlines()[-1].endswith("[report_appendix.md](report_appendix.md)")
    assert appendix.startswith("# nsa-cp-comm matrix report: appendix") and "](report.md)" in appendix


def test_verdicts_count_every_status_and_explain_each(run_dir, capsys):
    md, _, _ = run_report(run_dir, code=1)  # the mixed run has failing rows: verdict FAIL
    verdicts = section(md, "Verdicts")
    header = table_row(verdicts, "status")
    assert header[:1] == ["status"] and header[-2:] == ["all", "meaning"]
    impls = header[1:-2]
    assert impls == sorted(["a2a", "allgatherv", "legacy", "padded", "sumlen_allreduce"])
    expected = {"ok": 18, "failed": 1, "error": 1, "timeout": 1, "skipped": 1, "refused": 1, "passthrough": 1}
    for status in STATUS_VALUES:
        cells = table_row(verdicts, status)
        assert int(cells[-2]) == expected[status], cells
        assert cells[-1] == report.STATUS_MEANING[status]  # one sentence each, in the table
    assert table_row(verdicts, "refused")[1 + impls.index("legacy")] == "1"
    assert table_row(verdicts, "passthrough")[1 + impls.index("padded")] == "1"


def test_readers_use_the_status_column_only(tmp_path, capsys):
    # torch's text in a reason changes nothing: the error stays an error, the ok stays ok
    rows = [make_row("legacy", status="error", correct=None, reason=f"RuntimeError: {TORCH_TEXT}"),
            make_row("legacy", cp=4, reason=f"note: {TORCH_TEXT}")]
    md, _, _ = run_report(tmp_path, code=1, rows=rows)
    verdicts = section(md, "Verdicts")
    assert table_row(verdicts, "error")[-2] == "1" and table_row(verdicts, "ok")[-2] == "1"
    assert table_row(verdicts, "refused")[-2] == "0"
    assert "failed, error or timeout: 1 row of 1 point" in md


def test_the_verdict_counts_points_as_points_and_rows_as_rows(tmp_path, capsys):
    """Two failing rows of one point read "2 failed, error or timeout point(s)"."""
    rows = [make_row("padded", status="error", correct=None, reason="boom"),
            make_row("legacy", status="timeout", correct=None, reason="hung"),
            make_row("padded", cp=4, status="failed", correct=False, failed_check="reference_moe"),
            make_row("legacy", cp=4), make_row("padded", cp=8, correct=None), make_row("legacy", cp=8, correct=None)]
    verdict = run_report(tmp_path, code=1, rows=rows)[0].splitlines()[2]
    assert verdict.startswith("**Verdict: FAIL**: 3 points, 6 rows"), verdict
    assert "**failed, error or timeout: 3 rows of 2 points**" in verdict
    assert "**!!! INCORRECT RESULTS: 1 row of 1 point !!!**" in verdict
    verdicts = section(md_of(tmp_path)[0], "Verdicts")  # the section's headings count alike
    assert "### Failed, error and timeout: 3 rows of 2 points" in verdicts
    assert "### !!! INCORRECT RESULTS: 1 row of 1 point !!!" in verdicts
    assert "**warning:** ok without a correctness verdict (`correct` is empty): 2 rows of 1 point." in verdicts


def test_incorrect_points_are_loud_and_first(run_dir, capsys):
    md, appendix, _ = run_report(run_dir, code=1)  # the mixed run has failing rows: verdict FAIL
    banner = md.index("**Verdict: FAIL**")
    assert "INCORRECT RESULTS: 2 rows of 2 points" in md.splitlines()[2]
    loud = md.index("### !!! INCORRECT RESULTS: 2 rows of 2 points !!!")
    assert banner < md.index("## Verdicts") < loud < md.index("## Claim check")
    assert "[777,333]" in md and "[999,1]" in md
    assert "python -m matrix impl=allgatherv cp_size=2" in appendix  # repro of the incorrect point


def test_failing_points_grouped_here_listed_in_appendix(run_dir, capsys):
    md, appendix, _ = run_report(run_dir, code=1)  # the mixed run has failing rows: verdict FAIL
    failing = section(md, "Verdicts")[section(md, "Verdicts").index("### Failed"):]
    assert "### Failed, error and timeout: 3 rows of 3 points" in failing
    assert "reference_moe" in failing and "ValueError: boom" in failing and "timed out after 60 s" in failing
    detail = appendix[appendix.index("## Failed, error and timeout points"):]
    assert "max_rel_err 0.5" in detail and "python -m matrix impl=a2a cp_size=4" in detail
    assert "same effective configuration as point 3" in md  # skipped reason


def test_a_failing_folder_exits_1_with_its_verdict_and_reasons_in_the_json(run_dir, capsys):
    """A script or CI job that runs the report stops on a failing sweep; the
    files are written all the same, and report.json says why."""
    _, _, doc = run_report(run_dir, code=1)
    assert doc["verdict"] == "FAIL"
    assert doc["reasons"] == [
        "incorrect results: 2 rows of 2 points (`correct` or `even_bitwise_equal` is False)",
        "failed, error or timeout: 3 rows of 3 points (failed 1, error 1, timeout 1)",
    ]
    err = capsys.readouterr().err
    assert err.splitlines() == [err.strip()] and err.startswith("verdict FAIL: incorrect results: 2 rows"), err


@pytest.mark.parametrize("broken, left", [
    ("_failing", ["incorrect results: 2 rows of 2 points (`correct` or `even_bitwise_equal` is False)"]),
    ("_incorrect", ["failed, error or timeout: 3 rows of 3 points (failed 1, error 1, timeout 1)"]),
])
def test_the_verdict_is_its_two_rules_each_broken_lets_its_rows_pass(run_dir, monkeypatch, broken, left):
    """The verdict's rules (the incorrect rows, the failing rows), each broken to find none: its
    reason is gone from the FAIL; both broken, the same folder PASSes and exits 0."""
    df = _frame(run_dir)
    monkeypatch.setattr(report, broken, lambda df: df.iloc[0:0])
    assert report.verdict(df) == ("FAIL", left)
    monkeypatch.setattr(report, "_failing" if broken == "_incorrect" else "_incorrect", lambda df: df.iloc[0:0])
    assert report.verdict(df) == ("PASS", [])
    assert run_report(run_dir, code=0)[2]["verdict"] == "PASS"  # the exit code follows it


def test_exit_zero_keeps_exit_0_on_a_failing_folder(run_dir, capsys):
    assert run_report(run_dir, "--exit-zero")[2]["verdict"] == "FAIL"
    assert "verdict FAIL" not in capsys.readouterr().err


def test_a_passing_run_exits_0_with_verdict_pass_and_says_so(tmp_path, capsys):
    append(tmp_path, [make_row(), make_row("legacy", p50=90.0)])
    assert report_cli.main([str(tmp_path / RESULTS_FILE)]) == 0  # named by its results file
    md, _ = md_of(tmp_path)
    assert "No incorrect results" in md and "No failed, error or timeout point." in md and "INCORRECT" not in md
    md, _, doc = run_report(tmp_path)  # named by its folder
    assert (doc["verdict"], doc["reasons"]) == ("PASS", [])
    assert "**Verdict: PASS**" in md


def test_a_folder_of_skipped_rows_says_nothing_checked_and_exits_0(tmp_path, capsys):
    append(tmp_path, [make_row(status="skipped", correct=None, reason="same effective configuration")])
    _, _, doc = run_report(tmp_path)
    assert doc["verdict"] == "NOTHING CHECKED"
    assert doc["reasons"] == ["every row is skipped (1 row): no point was run"]


# --- claim, latency, bandwidth, environment


def test_claim_is_explained_and_checked(run_dir, capsys):
    md, appendix, _ = run_report(run_dir, code=1)  # the mixed run has failing rows: verdict FAIL
    claim = section(md, "Claim check")
    assert "`max_rank_len * cp` equals `ceil_align(sum(seq_lens), cp)`" in claim
    assert "extra rows" in claim and "must refuse" in claim  # why it matters
    assert "Plans where the claim fails: 1" in claim
    # zigzag_page cp=4 page=64 [1001,300]: 1536 padded - 1301 tokens = 235 rows of padding
    assert table_row(claim, "zigzag_page")[:4] == ["zigzag_page", "1", "0", "1"]
    full = appendix[appendix.index("## Plans where the claim fails"):]
    assert table_row(full, "zigzag_page") == [
        "zigzag_page", "4", "64", "[1001,300]", "1301", "384", "1536", "235", "0.153"
    ]


def test_latency_bandwidth_environment(run_dir, capsys):
    md, appendix, _ = run_report(run_dir, code=1)  # the mixed run has failing rows: verdict FAIL
    latency = section(md, "Latency")
    assert "`X/padded`: the median over the same points of each point's ratio" in latency
    # points, then by impl: legacy, padded, and legacy over padded (every even pair is padded = 1.1 x legacy)
    assert table_row(latency, "2")[1:] == ["4", "150", "165", "0.909"]
    assert "local work" in latency and "10%" in latency
    assert "No row carries a spread" in latency
    assert "round_robin" in appendix[appendix.index("## Round-trip p50 (us) by cp size, impl and policy"):]
    bandwidth = section(md, "Bandwidth and padding")
    assert "padded: useful bytes" in bandwidth and "zigzag_page p64" in bandwidth
    env = section(md, "Environment")
    assert "2.13.0" in env and "box1" in env and "abc1234" in env and "nsa_cp_comm 0.1.0" in env
    assert "cp_size=2,4 policy=zigzag,round_robin" in appendix and "cp_size=2,4 policy" not in md


def test_pairs_and_plans_are_computed_once_per_report(run_dir, monkeypatch, capsys):
    """The verdict line, the Latency section and the plot takeaways read one
    table of padded/legacy pairs; the claim check and the takeaways one table
    of plans."""
    calls = {"ratios": 0, "_plans": 0}
    for name in calls:
        def counted(*args, real=getattr(report, name), name=name) -> pd.DataFrame:
            calls[name] += 1
            return real(*args)
        monkeypatch.setattr(report, name, counted)
    assert report_cli.main([str(run_dir)]) == 1  # the mixed run has failing rows: verdict FAIL
    assert calls == {"ratios": 1, "_plans": 1}
    md, _ = md_of(run_dir)
    # each reader got the one table: the ratio of every even pair, and the uneven plan
    assert "legacy/padded 0.91 (quartiles 0.91-0.91 over 8 points)" in md.splitlines()[2]
    assert "legacy's a median 0.91x (8 points)" in section(md, "Plots")
    assert "zigzag_page" in section(md, "Claim check") and "zigzag_page p64 at cp=4" in section(md, "Plots")


def test_ratio_within_spread_is_marked_noise(tmp_path, capsys):
    rows = [
        # difference 5 us, spread 20 us: noise
        make_row("padded", seq_lens=(512, 512), p50=105.0, iqr=20.0),
        make_row("legacy", seq_lens=(512, 512), p50=100.0, iqr=20.0),
        # difference 50 us, spread 10 us: a real difference
        make_row("padded", seq_lens=(1024, 1024), p50=250.0, iqr=10.0),
        make_row("legacy", seq_lens=(1024, 1024), p50=200.0, iqr=10.0),
    ]
    md, appendix, _ = run_report(tmp_path, rows=rows)
    latency = section(md, "Latency")
    assert "1 of 2 ratios are" in latency and "noise" in latency
    ratios = appendix[appendix.index("## Each impl relative to padded (ratio"):]
    assert table_row(ratios, "2")[-1] == "1"  # within_noise
    per_point = appendix[appendix.index("## Each impl relative to padded per point"):]
    assert table_row(per_point, "2").count("True") == 1
    noisy = next(ln for ln in per_point.splitlines() if "[512,512]" in ln)
    real = next(ln for ln in per_point.splitlines() if "[1024,1024]" in ln)
    assert noisy.rstrip(" |").endswith("True") and real.rstrip(" |").endswith("False")


# --- duplicates and older files


def test_duplicate_rows_are_said_and_the_last_is_used(tmp_path, capsys):
    append(tmp_path, [make_row(status="error", correct=None, reason="rank died"), make_row("legacy")])
    append(tmp_path, [make_row()], run_id="run00002")  # the rerun of the error point (resume: a run of its own)
    md, appendix, _ = run_report(tmp_path)
    # padded and legacy of one configuration: 2 rows of 1 point, after the dropped duplicate
    assert "(3 rows read; the latest of each point and impl: 2 rows of 1 point)" in md
    assert md.splitlines()[2].startswith("**Verdict: PASS**: 1 point, 2 rows")
    assert ("Duplicates: 1 duplicate row(s) of 1 point(s) dropped: the latest run's row of each point and impl is "
            "used (within one run, a failing row over a passing one)") in md
    verdicts = section(md, "Verdicts")
    assert table_row(verdicts, "ok")[-2] == "2" and table_row(verdicts, "error")[-2] == "0"
    assert "error -> ok" in appendix and "the last" in appendix
    assert "duplicate row(s) of 1 point(s)" in capsys.readouterr().out


def test_a_stray_quote_merges_no_rows_a_bom_and_long_cells_read(tmp_path, capsys):
    """A ``"`` in a middle row joined the rows after it into a fake point with
    status ok. A cell longer than the csv module's limit, and a byte-order
    mark, read as the matrix reads them."""
    rows = [make_row(seq_lens=(n, 512)) for n in (100, 200, 300, 400)]
    rows[3]["reason"] = "x" * 200_000
    append(tmp_path, rows)
    path = tmp_path / RESULTS_FILE
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = lines[2].replace(",padded,", ',"padded,', 1)
    path.write_bytes(b"\xef\xbb\xbf" + "".join(lines).encode())
    run = _review.load_run("RESULTS", str(tmp_path))
    assert sorted(run.latest["seq_lens"].astype(str)) == ["[100,512]", "[300,512]", "[400,512]"]
    assert run.malformed == 1
    assert "1 malformed row(s) set aside" in " ".join(run.notes())
    assert report_cli.main([str(tmp_path)]) == 0
    assert "1 malformed row(s) set aside" in capsys.readouterr().out


@pytest.mark.parametrize("byte", ["\x00", "\x1b"])
def test_a_control_character_in_a_key_cell_is_a_damaged_row_not_a_point(tmp_path, capsys, monkeypatch, byte):
    """A NUL (or an escape) in a configuration cell: the report counted a point of its own. No value
    the app writes holds one: the row is set aside as malformed, and the verdict reads the others;
    with the rule taken out, the damaged row is a point again."""
    rows = [make_row(seq_lens=(n, 512)) for n in (100, 200)]
    append(tmp_path, rows)
    path = tmp_path / RESULTS_FILE
    lines = path.read_bytes().split(b"\n")
    # in the impl cell (no enumerated column: a plug-in's name is any text, a control character none)
    lines[2] = lines[2].replace(b",padded,", b",padded" + byte.encode() + b",", 1)
    path.write_bytes(b"\n".join(lines))
    run = _review.load_run("RESULTS", str(tmp_path))
    assert run.malformed == 1 and sorted(run.latest["seq_lens"].astype(str)) == ["[100,512]"], run.latest
    monkeypatch.setattr(_review, "_CONTROL", r"(?!x)x")  # matches nothing
    assert _review.load_run("RESULTS", str(tmp_path)).malformed == 0


def test_a_cell_outside_its_columns_values_is_set_aside_with_its_line_named(tmp_path, monkeypatch):
    """No row the app writes holds a dtype or an engine it does not know (a field shifted, a
    hand edit): the row is set aside and the note names its line; an unknown status is kept and
    counted bad (setting it aside could hide a failure). With the rule taken out they are read."""
    rows = [make_row(seq_lens=(n, 512)) for n in (100, 200, 300, 400)]
    append(tmp_path, rows)
    path = tmp_path / RESULTS_FILE
    table = list(csv.reader(path.read_text().splitlines()))
    header = table[0]
    for line, col, value in ((2, "dtype", "float99"), (4, "engine", "vllm_9"), (5, "status", "weird")):
        table[line - 1][header.index(col)] = value
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(table)
    path.write_text(buf.getvalue())
    run = _review.load_run("RESULTS", str(tmp_path))
    assert run.malformed == 2 and run.malformed_at == ["2", "4"], run.malformed_at
    assert "line 2, 4: not whole rows of the header" in " ".join(run.notes())
    assert sorted(run.latest["seq_lens"].astype(str)) == ["[200,512]", "[400,512]"]
    assert list(run.latest["status"].astype(str)) == ["ok", "weird"]
    assert report_cli.main([str(tmp_path)]) == 1  # the unknown status is bad
    monkeypatch.setattr(_review, "COLUMN_VALUES", {})
    assert _review.load_run("RESULTS", str(tmp_path)).malformed == 0


def test_an_integer_cell_no_cast_takes_is_set_aside_and_both_tools_read_the_rest(tmp_path, capsys):
    """A 1e400 or a 400-digit number in an integer column (a hand edit) raised out of report and
    compare (int too large to convert to float, non-finite values to integer): no row the app writes
    holds one, so the row is set aside with its line named; iters=auto is an iters cell of the writer's."""
    odd = [{"hidden_size": "1e400"}, {"page_size": "9" * 400}, {"iters": "auto"}, {"bystanders": "abc"}]
    append(tmp_path, [make_row(seq_lens=(n, 512), **cells) for n, cells in zip((100, 200, 300, 400), odd)])
    run = _review.load_run("RESULTS", str(tmp_path))
    assert run.malformed_at == ["2", "3", "5"] and list(run.latest["iters"].astype(str)) == ["auto"]
    assert report_cli.main([str(tmp_path)]) == 0 and compare_cli.main([str(tmp_path), str(tmp_path)]) in (0, 1)
    assert set(INT_COLUMNS) == set(INT_RANGES)  # the writer's integer keys


def test_file_from_before_refused_and_passthrough(tmp_path, capsys):
    old_columns = [c for c in COLUMNS if c not in ("effective_id", "effective_page_size", "roundtrip_iqr_us",
                                                   "failed_check", "impl_origin", "run_id")] + list(LAYOUT2_ENV)
    rows = [
        make_row("padded", p50=100.0),
        make_row("legacy", seq_lens=(1001, 300), padded_total=1302, p50=None, reason=TORCH_TEXT),  # refused, then ok
        make_row("legacy", mlp_mode="SCATTERED", moe_a2a_backend="deepep", p50=0.5),  # a pass-through, then ok
    ]
    rows = [{**r, **{k: RUN[k] for k in LAYOUT2_ENV}} for r in rows]
    rows[1]["is_even"], rows[2]["roundtrip_p50_us"] = False, 0.5
    pd.DataFrame(rows).reindex(columns=old_columns).to_csv(tmp_path / RESULTS_FILE, index=False)
    md, _, _ = run_report(tmp_path)
    verdicts = section(md, "Verdicts")
    assert [table_row(verdicts, s)[-2] for s in ("ok", "refused", "passthrough")] == ["1", "1", "1"]
    assert ("Written before the refused/passthrough statuses: 1 ok row(s) read as passthrough, "
            "1 ok row(s) read as refused") in md


def test_file_with_the_removed_fault_column(tmp_path, capsys):
    """A file written while the matrix had its test-only ``fault`` key reads in
    report and compare; a row of a point made to fail on purpose is not read
    (it shares its configuration with the real point and came after it)."""
    old_columns = [*COLUMNS[: COLUMNS.index("resume") + 1], "fault", *COLUMNS[COLUMNS.index("resume") + 1 :]]
    rows = [make_row("padded"), make_row("legacy"),
            make_row("padded", status="error", correct=None, reason="rank 1 error: RuntimeError: injected")]
    for row, fault in zip(rows, ("none", "none", "raise")):
        row["fault"] = fault
    pd.DataFrame(rows).reindex(columns=old_columns).to_csv(tmp_path / RESULTS_FILE, index=False)
    run = _review.load_run("RESULTS", str(tmp_path))
    assert sorted(zip(run.latest["impl"], run.latest["status"])) == [("legacy", "ok"), ("padded", "ok")]
    assert "fault" not in run.raw.columns
    assert report_cli.main([str(tmp_path)]) == 0
    assert compare_cli.main([str(tmp_path), str(tmp_path), "--metric", "roundtrip_p50_us"]) == 0
    capsys.readouterr()


# --- length: the default sweep on two screens


def test_default_sweep_report_fits_two_screens(tmp_path, capsys):
    bench = bench_review()
    sweep = bench.synthesise(400, dup_frac=0, error_frac=0)  # 160 points x 2-3 impls, as +matrix=default
    sweep.loc[sweep.index[:7], "status"] = ["error", "error", "failed", "timeout", "error", "failed", "error"]
    sweep.loc[sweep.index[:7], "reason"] = [f"reason {c}" for c in "abcdefg"]  # seven mistakes: seven groups
    bench.write(sweep, tmp_path)
    md, appendix, _ = run_report(tmp_path, code=1)  # its 7 failing rows: verdict FAIL
    lines = md.rstrip().splitlines()
    assert lines[-1].endswith("(report_appendix.md)") and len(lines) <= 120, len(lines)
    for moved in ("## Sweep overrides", "## Each impl relative to padded per point", "## Plans where the claim fails",
                  "## Failed, error and timeout points"):
        assert moved in appendix.splitlines() or any(ln.startswith(moved + " (") for ln in appendix.splitlines())
        assert not any(line.startswith(moved) for line in lines)
    assert "more groups: all in the [appendix]" in md


# --- plots


def _legend(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts() if t.get_text()]  # blanks pad columns


def test_latency_plot_series_once_timed_rows_only(tmp_path):
    append(tmp_path, plot_rows())
    fig = plots.latency(_frame(tmp_path))
    lines = [ln for ln in fig.axes[0].get_lines() if len(ln.get_xdata())]
    assert len(lines) == 3 * 2  # one per cp size and impl, whatever the policies
    assert min(min(ln.get_ydata()) for ln in lines) > 1  # the passthrough's 0.01 us is not there
    assert _legend(fig) == ["cp=1", "cp=2", "cp=4", "legacy", "padded"]


def test_busbw_plot_no_cp1_hollow_only_with_padding_legend_complete(tmp_path):
    append(tmp_path, plot_rows())
    fig = plots.busbw(_frame(tmp_path))
    ax = fig.axes[0]
    filled = [c for c in ax.collections if c.get_facecolors().size]
    hollow = [c for c in ax.collections if not c.get_facecolors().size]
    assert len(filled) == 2 * 2  # (cp 2, 4) x (padded, legacy): cp=1 moves nothing
    assert len(hollow) == 1 and len(hollow[0].get_offsets()) == 1  # only the padded plan has padding
    ys = [y for c in ax.collections for _, y in c.get_offsets()]
    assert min(ys) > 0 and max(ys) < 999  # no cp=1 zero, no passthrough value
    legend = _legend(fig)
    assert legend[:4] == ["cp=2", "cp=4", "legacy", "padded"]
    assert "filled: padded bytes" in legend and "hollow: useful bytes\n(plans with padding)" in legend


def test_padding_plot_separates_and_annotates_zero_series(tmp_path):
    append(tmp_path, plot_rows())
    fig = plots.padding(_frame(tmp_path))
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert "padding 0 at every cp size for: round_robin, zigzag" in texts
    assert sum(t.strip() == "0" for t in texts) >= 3  # each zero bar labelled
    assert _legend(fig) == ["round_robin", "zigzag", "zigzag_page p64", "max over batches"]
    bars = [p for p in ax.patches if p.get_height() > 0]
    assert len(bars) == 1 and abs(bars[0].get_height() - 235 / 1536) < 1e-9
    rows = plot_rows()
    rows[0]["padding_frac"] = float("inf")  # "Axis limits cannot be NaN or Inf" out of the report
    append(tmp_path / "inf", rows)
    assert len(plots.padding(_frame(tmp_path / "inf")).axes[0].patches) == len(ax.patches)


def test_plots_of_a_run_with_nothing_timed_say_so(tmp_path):
    append(tmp_path, [make_row(status="error", correct=None)])
    df = _frame(tmp_path)
    for plot in (plots.latency, plots.busbw):
        assert any(t.get_text().startswith("no ") for t in plot(df).axes[0].texts)


# --- big input, input resolution, bad input


def test_big_file_is_handled_column_wise(tmp_path, capsys, column_wise):
    bench = bench_review()
    bench.write(bench.synthesise(5_000, dup_frac=0.01), tmp_path)
    calls = column_wise(_review, "fmt")
    md, appendix, _ = run_report(tmp_path, code=1)  # the synthesised error rows: verdict FAIL
    assert len(md.splitlines()) <= 120 and "50 duplicate row(s) of 50 point(s)" in md
    assert calls["fmt"] < 100_000, calls  # table cells, capped lists: not every cell of 5k rows (~370k)


def test_out_dir_and_nested_lookup(tmp_path, capsys):
    append(tmp_path / "sweep" / "multirun" / "0", [make_row()])
    out = tmp_path / "elsewhere"
    assert report_cli.main([str(tmp_path / "sweep"), "--out", str(out)]) == 0
    assert (out / "report.md").is_file() and (out / "report_appendix.md").is_file()
    assert all((out / p).stat().st_size > 0 for p in PNGS)
    assert not list((tmp_path / "sweep").rglob("report*.md"))


def test_several_nested_csvs_are_concatenated_and_named(tmp_path, capsys):
    append(tmp_path / "a", [make_row(cp=2)])
    append(tmp_path / "b", [make_row(cp=4)])
    assert report_cli.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "concatenated 2 results.csv files" in out
    assert str(tmp_path / "a" / RESULTS_FILE) in out and str(tmp_path / "b" / RESULTS_FILE) in out
    md, appendix = md_of(tmp_path)
    assert "2 files under" in md and "(2 rows read; the latest of each point and impl: 2 rows of 2 points)" in md and "## Files read" in appendix


# argv and the start of the expected error line, per case ({t}: the test's folder)
BAD = {
    "missing": (["{t}/nope"], "RESULTS={t}/nope: no such file or directory"),
    "no_columns": (["{t}/other.csv"], "RESULTS={t}/other.csv: not a results table"),
    "torn": (["{t}/torn.csv"], "RESULTS={t}/torn.csv: no rows (empty run; 1 malformed row(s) set aside)"),
    "header_only": (["{t}/header_only"], "RESULTS={t}/header_only: no rows (empty run)"),
    "zero_bytes": (["{t}/zero.csv"], "RESULTS={t}/zero.csv: no rows (empty run)"),
    "no_results_below": (["{t}/nothing"], "RESULTS={t}/nothing: no results.csv in or below"),
    "out_is_file": (["{t}/good", "--out", "{t}/notdir"], "--out={t}/notdir: exists and is not a directory"),
    # a name over the file system's 255: pathlib's exists() raised ENAMETOOLONG out of both
    "name_too_long": (["{t}/" + "x" * 300], "RESULTS={t}/" + "x" * 300 + ": no such file or directory"),
    "out_name_too_long": (["{t}/good", "--out", "{t}/" + "x" * 300], "--out={t}/" + "x" * 300 + ": cannot write"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, case):
    (tmp_path / "header_only").mkdir()
    (tmp_path / "header_only" / RESULTS_FILE).write_text(",".join(COLUMNS) + "\n")
    (tmp_path / "zero.csv").write_text("")
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    (tmp_path / "torn.csv").write_text(",".join(COLUMNS) + '\n"unterminated\n')
    (tmp_path / "nothing").mkdir()
    (tmp_path / "notdir").write_text("x")
    append(tmp_path / "good", [make_row()])
    argv, expected = [a.format(t=tmp_path) for a in BAD[case][0]], BAD[case][1].format(t=tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert report_cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [captured.err.strip()], captured.err
    assert captured.err.startswith(f"error: {expected}"), captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


def test_usage_error_returns_2(capsys):
    assert report_cli.main([]) == 2
    assert "usage:" in capsys.readouterr().err


def test_each_impls_ratio_is_over_the_points_every_impl_was_timed_in_the_report_and_its_json(tmp_path, capsys):
    """Like with like: a plug-in 3x slower only on the uneven point legacy
    refused is 1x on the points all three were timed. Taken over each impl's
    own pairs the median would read 2x. The verdict line of report.md and the
    summary of report.json are two renderings of it: they agree, on a folder
    with a torn line and a refused row too."""
    mine = dict(impl_origin="mine 1.0")
    rows = [
        make_row("padded", seq_lens=(512, 512), p50=100.0), make_row("legacy", seq_lens=(512, 512), p50=100.0),
        make_row("mine", seq_lens=(512, 512), p50=100.0, **mine),
        make_row("padded", seq_lens=(1001, 300), p50=100.0, padded_total=1304),
        make_row("legacy", seq_lens=(1001, 300), p50=None, status="refused", padded_total=1304),
        make_row("mine", seq_lens=(1001, 300), p50=300.0, padded_total=1304, **mine),
    ]
    append(tmp_path, rows)
    with (tmp_path / "results.csv").open("a") as f:
        f.write("2,1,[7")  # a torn last line
    summary = run_report(tmp_path)[2]["summary"]
    assert summary["ratio_to_reference"]["mine"]["n"] == 1
    assert summary["ratio_to_reference"]["mine"]["median"] == pytest.approx(1.0)
    first = next(ln for ln in (tmp_path / "report.md").read_text().splitlines() if ln.startswith("**Verdict"))
    for impl, r in summary["ratio_to_reference"].items():
        if impl != "padded":
            assert f"{impl}/padded {r['median']:.2f} (quartiles {r['q1']:.2f}-{r['q3']:.2f} over {r['n']} point" \
                in first, (impl, r, first)
    assert "2.00" not in first, first


@pytest.mark.parametrize("local, says", [
    (None, "the padded path issues legacy's call (it gathers straight from the shard: no copy, no local phase): "
           "padded/legacy 1.01 (median over 2 points)"),
    (20.0, "The padded path still copies its shard into its slot"),
])
def test_the_cp1_line_says_a_copy_only_where_the_results_have_one(local, says):
    """At cp=1 (one rank: an even plan) padded stages nothing: its line says so
    unless the results it reads were timed with a local phase (older ones)."""
    rows = [{report.PAIR: p, "cp_size": 1, "impl": impl, "roundtrip_p50_us": us,
             "local_p50_us": (local if impl == "padded" else None)}
            for p in ("a", "b") for impl, us in (("legacy", 100.0), ("padded", 101.0))]
    text = " ".join(report._cp1_lines(pd.DataFrame(rows)))
    assert says in text, text


def test_one_mistake_at_many_sizes_is_one_failing_group_with_its_numbers_in_an_example(tmp_path):
    """A plug-in whose pad target is wrong raises the same error at every uneven plan, with the sizes
    of each: one group (the numbers read as N), its count, and one row's reason with its numbers and
    the site the plug-in raised at; another mistake is another group."""
    site = " (raised at mycomm.py:41 in gather, in the implementation's gather)"
    rows = [make_row("mycomm:ceil_pad", seq_lens=(n, n + 1), status="error", p50=None, correct=None,
                     reason=f"in mycomm:ceil_pad's checks: rank 0 error: RuntimeError: The size of tensor a ({n}) must "
                            f"match the size of tensor b ({n + 1}) at non-singleton dimension 0{site}")
            for n in (17, 33, 65, 129)]
    rows.append(make_row("mycomm:ceil_pad", seq_lens=(8, 8), status="error", p50=None, correct=None,
                         reason="in mycomm:ceil_pad's checks: rank 1 error: KeyError: 'plan'"))
    md, _, _ = run_report(tmp_path, code=1, rows=rows)
    part = section(md, "Failed, error and timeout")
    lines = part.splitlines()
    assert [line.split("|")[-2].strip() for line in lines if "rank N error: RuntimeError: The size of tensor a (N)"
            in line] == ["4"], part
    assert [line.split("|")[-2].strip() for line in lines if "rank N error: KeyError" in line] == ["1"], part
    example = next(line for line in lines if line.startswith("One row's reason as written"))
    assert "`mycomm:ceil_pad` error: in mycomm:ceil_pad's checks: rank 0 error: RuntimeError: The size of tensor a (17) " \
           "must match the size of tensor b (18) at non-singleton dimension 0" + site in example, example


@pytest.mark.parametrize("encoding, name, bom", [("utf-16", "UTF-16", "ff fe"), ("utf-32", "UTF-32", "ff fe 00 00"),
                                                ("utf-16-be", "UTF-16", "fe ff")])
def test_a_results_file_in_another_unicode_encoding_is_named_in_one_line(run_dir, capsys, encoding, name, bom):
    """A spreadsheet's "Unicode text" export: its header read as UTF-8 names no column.
    The report and compare say the encoding and exit 2."""
    path = run_dir / RESULTS_FILE
    text = path.read_text(encoding="utf-8")
    data = text.encode(encoding)
    if encoding == "utf-16-be":
        data = b"\xfe\xff" + data  # the big-endian codec writes no mark of its own
    path.write_bytes(data)
    for tool, args in ((report_cli.main, [str(run_dir)]), (compare_cli.main, [str(run_dir), str(run_dir)])):
        assert tool(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"is {name} text (its first bytes are {name}'s byte-order mark, {bom})" \
            in err, err
