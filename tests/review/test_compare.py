"""`python -m matrix.compare`: every gate trips when it should and only then;
noise, duplicates, big files and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from matrix.compare import cli as compare_cli
from matrix.review import _review, compare
from compare_rows import (FIRST, PASSTHROUGH, REFUSED, base_rows, changed, counts, make_row, marks, run,
                          summary, write_run)
from matrix.store.results import COLUMNS, CONFIG_COLUMNS, RESULTS_FILE
from matrix_cli import run_python
from report_rows import bench_review


@pytest.fixture
def base(tmp_path: Path) -> str:
    return write_run(tmp_path / "base", base_rows())


# --- no change


def test_run_against_itself_passes(base, capsys):
    code, out, err = run([base, base], capsys)
    assert code == 0, out
    assert summary(out) == (
        "summary: points=6 rows=10 joined=10 missing=0 only-in-new=0 status-worse=0 failing-in-new=0 "
        "correctness-lost=0 regressed=0 unverified=0 underpowered=0 within-noise=0 improved=0 -> PASS"
    )
    assert err == ""  # same environment: no warning
    assert "+0.0%" in out
    assert marks(out).count("no timing") == 2  # the refused and passthrough rows: shown, never timed


# --- missing points


def test_missing_point_fails_unless_allowed(base, tmp_path, capsys):
    new = write_run(tmp_path / "new", base_rows()[1:])
    code, out, _ = run([base, new], capsys)
    assert code == 1
    assert counts(out)["missing"] == "1" and summary(out).endswith("FAIL")
    assert "MISSING in NEW" in marks(out) and "FAIL: 1 row(s) of 1 point(s) trip a gate (missing 1)" in out
    code, out, _ = run([base, new, "--allow-missing"], capsys)
    assert code == 0
    assert "missing=1 (allowed)" in summary(out) and "MISSING in NEW (allowed)" in marks(out)


def test_point_only_in_new_gates_only_when_failing(base, tmp_path, capsys):
    slow = write_run(tmp_path / "slow", base_rows() + [make_row("padded", 8, p50=1e6)])  # a new point, slow
    code, out, _ = run([base, slow], capsys)
    assert code == 0
    assert counts(out)["only-in-new"] == "1" and marks(out).count("only in NEW") == 1
    # broken: correctness is absolute, whether BASE had the point or not
    broken = write_run(tmp_path / "broken", base_rows() + [make_row("padded", 8, status="failed")])
    code, out, _ = run([base, broken], capsys)
    assert code == 1 and counts(out)["failing-in-new"] == "1"
    assert "only in NEW; FAILING in NEW: failed (BASE: no row)" in marks(out)


# --- statuses


@pytest.mark.parametrize(
    "index, new_status, code",
    [
        (FIRST, "failed", 1),
        (FIRST, "error", 1),
        (FIRST, "timeout", 1),
        (FIRST, "exploded", 1),  # not a status of the schema: not good
        (REFUSED, "error", 1),
        (PASSTHROUGH, "failed", 1),
        (FIRST, "skipped", 0),  # neutral: the point did not run
        (FIRST, "refused", 0),  # good to good
        (PASSTHROUGH, "ok", 0),
    ],
)
def test_status_change(base, tmp_path, capsys, index, new_status, code):
    rows = base_rows()
    old = rows[index]
    rows[index] = make_row(old["impl"], old["cp_size"], old["seq_lens"], status=new_status,
                           mlp_mode=old["mlp_mode"], moe_a2a_backend=old["moe_a2a_backend"], is_even=old["is_even"])
    new = write_run(tmp_path / "new", rows)
    got, out, _ = run([base, new], capsys)
    assert got == code, out
    assert counts(out)["status-worse"] == str(code)
    word = "STATUS WORSE" if code else "status"
    assert f"{word} {old['status']}->{new_status}" in out


def test_bad_to_good_passes_and_bad_to_bad_fails(tmp_path, capsys):
    """A row failing in NEW fails the gate whatever BASE had: both runs broken is no pass."""
    errors = [make_row(status="error"), make_row(cp=4, status="timeout"), make_row(cp=8, status="skipped")]
    base = write_run(tmp_path / "base", errors)
    fixed = write_run(tmp_path / "fixed", [make_row(status="ok"), make_row(cp=4, status="ok"),
                                           make_row(cp=8, status="skipped")])
    code, out, _ = run([base, fixed], capsys)
    assert code == 0 and counts(out)["status-worse"] == "0" and counts(out)["failing-in-new"] == "0"
    assert "status error->ok" in out and "status timeout->ok" in out
    still = write_run(tmp_path / "still", [make_row(status="ok"), make_row(cp=4, status="failed"),
                                           make_row(cp=8, status="error")])
    code, out, _ = run([base, still], capsys)
    assert code == 1, out
    assert counts(out)["failing-in-new"] == "2" and counts(out)["status-worse"] == "0"
    assert "FAILING in NEW: failed (BASE: timeout); no timing" in marks(out)
    assert "FAILING in NEW: error (BASE: skipped); no timing" in marks(out)
    assert "FAIL: 2 row(s) of 2 point(s) trip a gate (failing-in-new 2)" in out


# --- correctness


def test_correctness_loss_fails(base, tmp_path, capsys):
    new = write_run(tmp_path / "new", changed(2, correct=False))  # status still ok
    code, out, _ = run([base, new], capsys)
    assert code == 1
    assert counts(out)["correctness-lost"] == "1" and counts(out)["status-worse"] == "0"
    assert "CORRECTNESS LOST (correct True->False)" in out


def test_skipped_point_is_no_correctness_loss(base, tmp_path, capsys):
    new = write_run(tmp_path / "new", changed(2, status="skipped", correct=None, roundtrip_p50_us=None))
    code, out, _ = run([base, new], capsys)
    assert code == 0 and counts(out)["correctness-lost"] == "0"


# --- the metric: threshold and spread


def test_20_percent_slower_fails(base, tmp_path, capsys):
    new = write_run(tmp_path / "new", changed(FIRST, roundtrip_p50_us=210.0 * 1.2))
    code, out, _ = run([base, new], capsys)
    assert code == 1
    assert counts(out)["regressed"] == "1" and summary(out).endswith("FAIL")
    assert "+20.0%" in out and "REGRESSED (roundtrip_p50_us, neither run kept samples: beyond 5% and the spread)" in out
    # a looser threshold lets it pass, in either spelling
    for threshold in ("25%", "0.25"):
        assert compare_cli.main([base, new, "--fail-above", threshold]) == 0


def _without_spread(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{**r, "roundtrip_iqr_us": None} for r in rows]


def test_an_absolute_metric_without_spread_gates_on_the_threshold(tmp_path, capsys):
    base = write_run(tmp_path / "b", _without_spread(base_rows()))
    new = write_run(tmp_path / "n", _without_spread(changed(FIRST, roundtrip_p50_us=210.0 * 1.2)))
    code, out, _ = run([base, new, "--metric", "roundtrip_p50_us"], capsys)
    assert code == 1 and any(m.startswith("REGRESSED (beyond 5%; no spread); evidence: ") for m in marks(out))
    assert "none: 5% alone" in out  # the rule that applied is named
    assert compare_cli.main([base, new, "--metric", "roundtrip_p50_us", "--fail-above", "25%"]) == 0


def test_the_paired_metric_without_samples_or_spread_is_unverified(tmp_path, capsys):
    """Absolute times move with the load: without samples, and no spread to
    judge them by, a row is neither a pass nor a fail but unverified."""
    base = write_run(tmp_path / "b", _without_spread(base_rows()))
    new = write_run(tmp_path / "n", _without_spread(changed(FIRST, roundtrip_p50_us=210.0 * 3)))
    code, out, _ = run([base, new, "--fail-above", "15%"], capsys)
    assert code == 1, out
    assert counts(out)["unverified"] == "8" and counts(out)["regressed"] == "0"
    assert marks(out).count("UNVERIFIED (neither run kept samples.jsonl; roundtrip_p50_us without a spread)") == 16
    assert "+200.0%" in out  # the absolute change is shown
    assert "FAIL: 8 row(s) of 4 point(s) trip a gate (unverified 8)" in out
    assert "8 timed row(s) that neither rule could check: unverified" in out
    assert "a size" not in out  # the rule line names the rules that applied, nothing else
    code, out, _ = run([base, new, "--fail-above", "15%", "--allow-unverified"], capsys)
    assert code == 0 and "unverified=8 (allowed)" in summary(out)
    assert "unverified (allowed: neither run kept samples.jsonl; roundtrip_p50_us without a spread)" in marks(out)


@pytest.mark.parametrize("factor, shown, count, value", [(1.04, "+4.0%", "regressed", "0"),
                                                        (0.5, "-50.0%", "improved", "1")],
                         ids=["4_percent_slower_passes", "faster_is_improved_not_failed"])
def test_within_the_threshold_or_faster_passes(base, tmp_path, capsys, factor, shown, count, value):
    new = write_run(tmp_path / "new", changed(FIRST, roundtrip_p50_us=210.0 * factor))
    code, out, _ = run([base, new], capsys)
    assert code == 0 and shown in out and counts(out)[count] == value


@pytest.mark.parametrize("iqr_base, iqr_new, code, gauge, says", [
    # +42 us against a spread of 15 us: beyond it, and the rule is named
    (10.0, 20.0, 1, {"regressed": "1"}, ["REGRESSED (roundtrip_p50_us, neither run kept samples: beyond 5% and the "
                                         "spread)", "mean roundtrip_iqr_us of the two rows"]),
    # +42 us against a spread of 50 us: noise
    (40.0, 60.0, 0, {"regressed": "0", "within-noise": "1"},
     ["within noise (roundtrip_p50_us, neither run kept samples: beyond 5% but not the spread 50)"]),
    # a BASE written before the spread column: NEW's spread still guards
    (None, 50.0, 0, {}, []),
    (None, 30.0, 1, {}, []),
], ids=["beyond_threshold_and_spread_fails", "within_spread_is_noise", "one_sides_spread_passes",
        "one_sides_spread_fails"])
def test_a_regression_is_gated_on_the_spread(tmp_path, capsys, iqr_base, iqr_new, code, gauge, says):
    base = write_run(tmp_path / "b", changed(FIRST, roundtrip_iqr_us=iqr_base))
    new = write_run(tmp_path / "n", changed(FIRST, roundtrip_iqr_us=iqr_new, roundtrip_p50_us=210.0 * 1.2))
    got, out, _ = run([base, new], capsys)
    assert got == code, out
    assert {k: counts(out)[k] for k in gauge} == gauge
    for text in says:
        assert text in out


def test_bandwidth_regresses_by_dropping(base, tmp_path, capsys):
    slower = write_run(tmp_path / "drop", changed(FIRST, busbw_padded_GBps=1e4 / 210.0 * 0.8))
    faster = write_run(tmp_path / "rise", changed(FIRST, busbw_padded_GBps=1e4 / 210.0 * 1.2))
    assert compare_cli.main([base, slower, "--metric", "busbw_padded_GBps"]) == 1
    assert compare_cli.main([base, faster, "--metric", "busbw_padded_GBps"]) == 0
    assert counts(capsys.readouterr().out)["improved"] == "1"


def test_bandwidth_noise_is_relative(tmp_path, capsys):
    # a 20% drop of bandwidth; round-trip spread 30% of p50 -> noise, 10% -> a regression
    for rel, code in ((0.3, 0), (0.1, 1)):
        d = tmp_path / str(rel)
        base = write_run(d / "b", changed(FIRST, roundtrip_iqr_us=210.0 * rel))
        new = write_run(d / "n", changed(FIRST, roundtrip_iqr_us=210.0 * rel, busbw_padded_GBps=1e4 / 210.0 * 0.8))
        got, out, _ = run([base, new, "--metric", "busbw_padded_GBps"], capsys)
        assert got == code, out
    assert "roundtrip_iqr_us / roundtrip_p50_us" in out


def test_rows_without_timings_never_gate_on_the_metric(base, tmp_path, capsys):
    # stray values on refused/passthrough rows are not measurements
    b, n = (write_run(tmp_path / name, [{**r, "roundtrip_p50_us": p50} if i in (REFUSED, PASSTHROUGH) else r
                                        for i, r in enumerate(base_rows())])
            for name, p50 in (("b", 1.0), ("n", 100.0)))
    code, out, _ = run([b, n], capsys)
    assert code == 0 and counts(out)["regressed"] == "0"


@pytest.mark.parametrize("metric", ["roundtrip_vs_control", "roundtrip_p50_us", "busbw_padded_GBps"])
def test_a_timing_missing_on_one_side_is_unverified(base, tmp_path, capsys, metric):
    """An ok row of NEW without its time passed as "no timing"; measured on
    neither side (bandwidth where nothing moves), there is nothing to verify."""
    column = "roundtrip_p50_us" if metric == "roundtrip_vs_control" else metric
    new = write_run(tmp_path / "new", changed(FIRST, **{column: None}))
    code, out, _ = run([base, new, "--metric", metric], capsys)
    assert code == 1 and counts(out)["unverified"] == "1", out
    assert any(m.startswith("UNVERIFIED (") and m.endswith(f"no {column} in NEW)") for m in marks(out)), marks(out)
    assert run([base, new, "--metric", metric, "--allow-unverified"], capsys)[0] == 0
    neither = write_run(tmp_path / "neither", changed(FIRST, **{column: None}))
    code, out, _ = run([neither, new, "--metric", metric], capsys)
    assert code == 0 and counts(out)["unverified"] == "0" and "no timing" in marks(out)


# --- one row per point


@pytest.mark.parametrize("order, code", [("bad_then_good", 0), ("good_then_bad", 1)])
def test_last_row_per_point_is_used(base, tmp_path, capsys, order, code):
    bad = {**base_rows()[FIRST], "roundtrip_p50_us": 210.0 * 2}
    good = base_rows()[FIRST]
    rerun = [bad, good] if order == "bad_then_good" else [good, bad]
    new = write_run(tmp_path / "new", base_rows()[1:] + rerun)
    got, out, _ = run([base, new], capsys)
    assert got == code
    assert counts(out)["rows"] == "10" and counts(out)["points"] == "6"
    assert (f"note: NEW={new}: 1 duplicate row(s) of 1 point(s) dropped: the latest run's row of each point and "
            "impl is used (within one run, a failing row over a passing one)") in out


def test_duplicates_of_two_impls_of_one_point_are_one_point(base, tmp_path, capsys):
    """Padded and legacy of one configuration rerun: 2 rows of 1 point, not "of 2 point(s)"."""
    rows = base_rows()
    assert all(rows[0][k] == rows[2][k] for k in CONFIG_COLUMNS if k != "impl" and k in rows[0])
    new = write_run(tmp_path / "new", rows + [rows[0], rows[2]])
    code, out, _ = run([base, new], capsys)
    assert code == 0 and f"note: NEW={new}: 2 duplicate row(s) of 1 point(s) dropped" in out


# --- big runs


def test_big_run_lists_only_marked_points(tmp_path, capsys):
    rows = [make_row(cp=2, seed=s, p50=100.0) for s in range(compare.LIST_LIMIT + 50)]
    base = write_run(tmp_path / "b", rows)
    rows[7] = {**rows[7], "roundtrip_p50_us": 150.0}
    new = write_run(tmp_path / "n", rows)
    code, out, _ = run([base, new], capsys)
    assert code == 1
    assert f"{compare.LIST_LIMIT + 49} of {compare.LIST_LIMIT + 50} rows show no change" in out
    regressed = "REGRESSED (roundtrip_p50_us, neither run kept samples: beyond 5% and the spread); evidence: "
    assert [m[:len(regressed)] for m in marks(out)] == [regressed] * 2  # and under FAIL
    code, out, _ = run([base, new, "--all"], capsys)
    assert len(marks(out)) == compare.LIST_LIMIT + 50 + 1


def test_big_file_is_handled_column_wise(tmp_path, capsys, column_wise):
    """No per-row Python: row iteration is forbidden, and per-cell helpers run
    once per distinct value (or per listed row), not once per row."""
    bench = bench_review()
    big = bench.synthesise(5_000, dup_frac=0.01)
    base = bench.write(big, tmp_path / "b")
    new = bench.write(bench.slower(big), tmp_path / "n")
    calls = column_wise(_review, "canonical")
    code, out, _ = run([str(base), str(new)], capsys)
    assert code == 1 and int(counts(out)["regressed"]) > 0
    assert "50 duplicate row(s) of 50 point(s) dropped" in out
    assert calls["canonical"] < 2000, calls  # distinct values of the key columns, not 5k rows x 19 columns


# --- environment, spelling, bad input, entry point


def test_environment_difference_warns(base, tmp_path, capsys):
    new = write_run(tmp_path / "new", base_rows(), run_id="new00001", host="box2", torch_version="2.14.0")
    code, _, err = run([base, new], capsys)
    assert code == 0
    assert "warning: environments differ: host: BASE box1 vs NEW box2" in err
    assert "torch_version: BASE 2.13.0 vs NEW 2.14.0" in err


def test_csv_files_and_numeric_spelling_join(base, tmp_path, capsys):
    # "[512, 512]" and "2.0" join with "[512,512]" and "2": formatting is not a configuration change
    rows = [
        {**r, "seq_lens": str(r["seq_lens"]).replace(",", ", "), "cp_size": float(r["cp_size"])} for r in base_rows()
    ]
    new = write_run(tmp_path / "new", rows)
    code, out, _ = run([str(Path(base) / RESULTS_FILE), str(Path(new) / RESULTS_FILE)], capsys)
    assert code == 0 and counts(out)["joined"] == "10"


# argv and the start of the error line, per case ({t}: the test's folder, {base}: the base run)
BAD = {
    "missing_base": (["{t}/nope", "{base}"], "BASE={t}/nope: no such file or directory"),
    "missing_new": (["{base}", "{t}/nope"], "NEW={t}/nope: no such file or directory"),
    "no_columns": (["{base}", "{t}/other.csv"], "NEW={t}/other.csv: not a results table"),
    "empty_run": (["{t}/empty", "{base}"], "BASE={t}/empty: no rows"),
    "torn": (["{base}", "{t}/torn.csv"], "NEW={t}/torn.csv: no rows (empty run; 1 malformed row(s) set aside)"),
    "unknown_metric": (["{base}", "{base}", "--metric", "speed"], "--metric=speed: unknown metric"),
    "bad_threshold": (["{base}", "{base}", "--fail-above", "abc"], "--fail-above=abc: not a percentage"),
    "negative_threshold": (["{base}", "{base}", "--fail-above=-5%"], "--fail-above=-5%: must be"),
    "percent_without_sign": (["{base}", "{base}", "--fail-above", "5"], "--fail-above=5: a bare number"),
    # a threshold no regression could cross: 1e6% passed a 3x slowdown silently
    "threshold_over_100": (["{base}", "{base}", "--fail-above=1e6%"],
                           "--fail-above=1e6%: over 100%, the gate could flag nothing sensible"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_exits_2_with_one_line(base, tmp_path, capsys, case):
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / RESULTS_FILE).write_text(",".join(COLUMNS) + "\n")
    (tmp_path / "torn.csv").write_text(",".join(COLUMNS) + '\n"unterminated\n')
    argv, expected = ([a.format(t=tmp_path, base=base) for a in BAD[case][0]], BAD[case][1].format(t=tmp_path))
    before = sorted(tmp_path.rglob("*"))
    code, out, err = run(argv, capsys)
    assert code == 2
    assert err.splitlines() == [err.strip()] and err.startswith(f"error: {expected}"), err
    assert out == "" and "Traceback" not in err
    assert sorted(tmp_path.rglob("*")) == before


def test_module_entry_point(base, tmp_path):
    new = write_run(tmp_path / "new", changed(FIRST, roundtrip_p50_us=210.0 * 1.2))
    proc = run_python("-m", "matrix.compare", base, new, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.strip().splitlines()[-1].endswith("-> FAIL")
    assert "Traceback" not in proc.stderr


# --- bad data: a metric that is not a finite, non-negative number


@pytest.mark.parametrize("which", ["new", "base"])
@pytest.mark.parametrize("value, shown", [(float("nan"), "nan"), (-50.0, "-50.0"), (float("inf"), "inf"),
                                          ("fast", "fast")])
def test_a_nan_or_impossible_metric_is_bad_data(base, tmp_path, capsys, which, value, shown):
    """A NaN in NEW passed unmarked; a negative latency counted as improved."""
    bad = write_run(tmp_path / "bad", changed(FIRST, roundtrip_p50_us=value))
    argv = [base, bad] if which == "new" else [bad, base]
    code, out, err = run(argv, capsys)
    assert code == 2 and out == "", out
    arg = "NEW" if which == "new" else "BASE"
    assert err.strip().splitlines() == [
        f"error: {arg}={bad}: bad data: roundtrip_p50_us={shown} in 1 row(s) "
        "(first: cp_size=2 seq_lens=[512,512] impl=padded); a time or size is a finite number >= 0"
    ], err


# --- each gate, broken: the row that trips it alone passes


def _failing_both(tmp_path):
    rows = changed(FIRST, status="error")
    return write_run(tmp_path / "bad_base", rows), write_run(tmp_path / "bad_new", rows)


@pytest.mark.parametrize("gate, column, runs", [
    ("status-worse", "status_worse", lambda base, tmp: (base, write_run(tmp / "new", changed(FIRST, status="exploded")))),
    ("failing-in-new", "failing_new", lambda base, tmp: _failing_both(tmp)),
    ("correctness-lost", "correctness_lost", lambda base, tmp: (base, write_run(tmp / "new", changed(2, correct=False)))),
    ("regressed", "regressed",
     lambda base, tmp: (base, write_run(tmp / "new", changed(FIRST, roundtrip_p50_us=210.0 * 1.2)))),
    ("missing", "missing", lambda base, tmp: (base, write_run(tmp / "new", base_rows()[1:]))),
    ("unverified", "unverified", lambda base, tmp: (write_run(tmp / "b", _without_spread(base_rows())), write_run(
        tmp / "n", _without_spread(changed(FIRST, roundtrip_p50_us=210.0 * 3))))),
])
def test_each_gate_turned_off_lets_the_row_it_alone_trips_pass(base, tmp_path, capsys, monkeypatch, gate, column,
                                                              runs):
    """The gate is what fails the run: the same two runs pass once its column no longer gates
    (``gating`` broken for it), and every other gate's count is 0 on them."""
    old, new = runs(base, tmp_path)
    code, out, _ = run([old, new], capsys)
    assert code == 1 and counts(out)[gate] != "0", out
    assert [g for g in compare.GATES if g != gate and counts(out)[g] != "0"] == [], out
    gating = compare.gating
    monkeypatch.setattr(compare, "gating", lambda j, *a, **k: gating(j.assign(**{column: False}), *a, **k))
    code, out, _ = run([old, new], capsys)
    assert code == 0, out


def test_the_gate_table_is_what_gates_counts_and_allows(base, tmp_path, capsys, monkeypatch):
    """One table (compare.GATE_TABLE) names each gate's column and the flag allowing it: a missing row
    passes with --allow-missing; with the table's allowance taken away it fails and the FAIL line names
    the gate; a gate dropped from the table no longer trips or counts."""
    new = write_run(tmp_path / "new", base_rows()[1:])
    assert run([base, new, "--allow-missing"], capsys)[0] == 0
    strict = tuple(compare.Gate(g.name, g.column) for g in compare.GATE_TABLE)
    monkeypatch.setattr(compare, "GATE_TABLE", strict)
    code, out, _ = run([base, new, "--allow-missing"], capsys)
    assert code == 1 and "trip a gate (missing 1)" in out, out
    monkeypatch.setattr(compare, "GATE_TABLE", tuple(g for g in strict if g.name != "missing"))
    code, out, _ = run([base, new], capsys)
    assert code == 0 and "missing=" not in counts(out), out
