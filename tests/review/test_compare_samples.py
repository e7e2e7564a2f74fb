"""compare's gate on per-iteration samples: a regression is significant and
beyond the threshold; a load that slows the control alike is no regression;
each verdict flips when the thing it checks is broken."""

from __future__ import annotations

import itertools
import json
import re
import zlib
from pathlib import Path

import numpy as np
import pytest

from matrix.compare import cli as compare_cli
from matrix.report import cli as report_cli
from matrix.review import compare, report
from matrix.store.runs import SCHEMA_VERSION
from matrix.store.samples import SAMPLES_FILE, append_samples, read_samples
from nsa_cp_comm.harness import significance
from nsa_cp_comm.harness.significance import ALPHA, adjusted, p_greater, power, smallest_p

from compare_rows import make_row, marks, summary, write_run

RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def _rng_of_this_test(request):
    """Each test draws from its own seed: under xdist the tests a worker ran
    before would otherwise decide what this one draws."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _noisy(median: float, n: int = 16, spread: float = 0.05) -> list[float]:
    return list(median * (1 + spread * RNG.standard_normal(n)))


def write_sampled(path: Path, runs: dict[str, tuple[list[float], list[float]]], **extra: object) -> str:
    """A results folder with one padded row per point id and its samples
    ``{point_id: (roundtrip_us, control_us)}`` (``extra``: columns of every row)."""
    rows = [make_row("padded", cp=2, seq_lens=f"[{512 + i}]", p50=float(np.median(rt)), point_id=pid,
                     timestamp="2026-01-01T00:00:00+00:00", **extra)
            for i, (pid, (rt, _)) in enumerate(runs.items())]
    write_run(path, rows)
    append_samples(path, rows, [{"roundtrip": rt, "control": ctl} for rt, ctl in runs.values()])
    return str(path)


def gate(base: str, new: str, capsys, *extra: str) -> tuple[int, str]:
    code = compare_cli.main([base, new, *extra])
    return code, capsys.readouterr().out


def _edit_line(folder: str, edit) -> None:
    """The one line of ``folder``'s samples file, changed in place by ``edit(line)``."""
    f = Path(folder) / SAMPLES_FILE
    line = json.loads(f.read_text())
    edit(line)
    f.write_text(json.dumps(line) + "\n")


def test_a_significant_paired_regression_beyond_the_threshold_fails(tmp_path, capsys):
    base = write_sampled(tmp_path / "b", {"p1": (_noisy(100), _noisy(100)), "p2": (_noisy(100), _noisy(100))})
    new = write_sampled(tmp_path / "n", {"p1": (_noisy(200), _noisy(100)), "p2": (_noisy(100), _noisy(100))})
    code, out = gate(base, new, capsys)
    assert code == 1 and "regressed=1" in summary(out)
    assert any(m.startswith("REGRESSED (beyond 15%, significant: p=") for m in marks(out))
    assert "roundtrip_vs_control" in out and "Mann-Whitney" in out


def test_a_significant_paired_improvement_is_an_improvement_not_noise(tmp_path, capsys):
    """A quarter faster, significantly: marked improved (the gate passes), never "within noise",
    whichever side of the threshold the test's direction is read from."""
    base = write_sampled(tmp_path / "b", {"p1": (_noisy(100), _noisy(100)), "p2": (_noisy(100), _noisy(100))})
    new = write_sampled(tmp_path / "n", {"p1": (_noisy(75), _noisy(100)), "p2": (_noisy(100), _noisy(100))})
    code, out = gate(base, new, capsys)
    assert code == 0 and "improved=1" in summary(out) and "within-noise=0" in summary(out), out
    assert "improved" in marks(out) and not any("within noise" in m for m in marks(out))


def test_a_second_samples_line_of_the_same_run_is_an_inconsistency_not_a_replacement(tmp_path, capsys):
    """A regressed row's samples followed by a second line of the same run and point (a fast one):
    read as "the last line wins", the gate saw the fast one and passed. Now the row is unverified,
    its reason naming both lines' run; a line of a later run (a resume's) still replaces the old."""
    base = write_sampled(tmp_path / "b", {"p1": (_noisy(100), _noisy(100)), "p2": (_noisy(100), _noisy(100))})
    new = write_sampled(tmp_path / "n", {"p1": (_noisy(200), _noisy(100)), "p2": (_noisy(100), _noisy(100))})
    f = Path(new) / SAMPLES_FILE
    first = json.loads(f.read_text().splitlines()[0])
    assert first["point_id"] == "p1"
    with f.open("a") as out:
        out.write(json.dumps({**first, "roundtrip_us": _noisy(45)}) + "\n")
    code, out = gate(base, new, capsys)
    assert code == 1 and "unverified=1" in summary(out) and "regressed=0" in summary(out), out
    # (these rows carry no run id, as before run ids: one run is told by its timestamp)
    assert f"two lines of one run (timestamp {first['timestamp']}) for this point and impl" in out
    with f.open("a") as out_f:  # a later run of the point: its line replaces, as a resume's does
        out_f.write(json.dumps({**first, "timestamp": "2026-01-02T00:00:00+00:00"}) + "\n")
    code, out = gate(base, new, capsys)
    assert "two lines of" not in out and "its line is another run's (timestamp 2026-01-02" in out, out


def test_two_lines_of_one_run_id_leave_the_row_without_evidence_and_a_later_run_replaces_them(tmp_path):
    line = {"schema_version": SCHEMA_VERSION, "point_id": "p1", "impl": "padded", "run_id": "run-a",
            "timestamp": "t1", "roundtrip_us": [1.0, 2.0], "control_us": [1.0, 2.0]}
    f = tmp_path / SAMPLES_FILE
    f.write_text("".join(json.dumps(x) + "\n" for x in (line, {**line, "timestamp": "t2"})))
    got = read_samples(f)
    assert got.evidence("p1", "padded", paired=True) == (None, "its samples.jsonl line is unusable (two lines of "
                                                        "run run-a for this point and impl: which one timed the row "
                                                        "is not known)")
    with f.open("a") as out:
        out.write(json.dumps({**line, "run_id": "run-b"}) + "\n")
    assert read_samples(f).evidence("p1", "padded", paired=True)[1] == ""


def test_a_load_that_slows_the_control_alike_is_no_regression(tmp_path, capsys):
    """Every absolute time doubled (a busy machine), the paired ratio unchanged."""
    base = write_sampled(tmp_path / "b", {"p1": (_noisy(100), _noisy(100))})
    new = write_sampled(tmp_path / "n", {"p1": (_noisy(200), _noisy(200))})
    code, out = gate(base, new, capsys)
    assert code == 0, out
    absolute, out_abs = gate(base, new, capsys, "--metric", "roundtrip_p50_us")
    assert absolute == 1 and "REGRESSED" in out_abs  # what the absolute metric would have said


def test_beyond_the_threshold_but_too_noisy_to_judge_is_unverified_not_noise(tmp_path, capsys):
    """Medians 30% apart over 8 samples that overlap: "within noise" and PASS
    before, though a 15% change could not have been flagged on such samples."""
    spread = [50, 300, 80, 250, 100, 400, 60, 200]
    base = write_sampled(tmp_path / "b", {"p1": (spread, [100.0] * 8)})
    new = write_sampled(tmp_path / "n", {"p1": ([x * 1.3 for x in spread[::-1]], [100.0] * 8)})
    code, out = gate(base, new, capsys)
    assert code == 1 and "unverified=1" in summary(out) and "within-noise=0" in summary(out), out
    assert any(m.startswith("UNVERIFIED (low power: P(flag a 30% change) = 0.")
               and "< 0.8 with 8 samples a side" in m and m.endswith("time both runs with iters=auto)")
               for m in marks(out)), marks(out)
    assert "has the power to flag it" not in out  # a row lacks it: the row says so, the noise line does not
    assert gate(base, new, capsys, "--allow-unverified")[0] == 0


def test_beyond_the_threshold_but_not_significant_with_power_is_noise(tmp_path, capsys):
    """A bimodal row whose median jumps between its modes (+100%) while the
    rank test sees the mixture barely move: within noise, and the test had
    the power to see 15% on these samples."""
    rng = np.random.default_rng(5)
    mode = lambda median, k: list(median * (1 + 0.001 * rng.standard_normal(k)))  # noqa: E731
    base = write_sampled(tmp_path / "b", {"p1": (mode(100, 101) + mode(200, 99), [100.0] * 200)})
    new = write_sampled(tmp_path / "n", {"p1": (mode(100, 99) + mode(200, 101), [100.0] * 200)})
    code, out = gate(base, new, capsys)
    assert code == 0 and "within-noise=1" in summary(out) and "unverified=0" in summary(out), out
    assert any(m.startswith("within noise (beyond 15% but not significant") for m in marks(out))
    # a spread far wider than the 30% to flag, with the power to flag it: said, and why
    assert re.search(r"the spread within a run \(\d+\.\d%\) is wider than the 30% change the gate must flag, yet "
                     r"every tested row has the power to flag it \(least P = (0\.[89]\d|1\.00) >= 0\.8, 200 or more "
                     r"samples a side\)", out), out


def test_significant_but_within_the_threshold_passes(tmp_path, capsys):
    base = write_sampled(tmp_path / "b", {"p1": (_noisy(100, spread=0.001), [100.0] * 16)})
    new = write_sampled(tmp_path / "n", {"p1": (_noisy(105, spread=0.001), [100.0] * 16)})
    code, out = gate(base, new, capsys)
    assert code == 0 and "regressed=0" in summary(out)
    tighter, _ = gate(base, new, capsys, "--fail-above", "2%")
    assert tighter == 1  # the same samples gate once the threshold is below the change


def test_runs_without_samples_fall_back_to_absolute_times_and_say_so(tmp_path, capsys):
    base = write_run(tmp_path / "b", [make_row(p50=100.0, point_id="p1")])
    new = write_run(tmp_path / "n", [make_row(p50=300.0, point_id="p1")])
    code, out = gate(base, new, capsys)
    assert code == 1 and any(m.startswith("REGRESSED (roundtrip_p50_us, neither run kept samples: beyond 15% and the "
                                          "spread); evidence: roundtrip_p50_us NEW/BASE x3") for m in marks(out))
    for arg in ("BASE", "NEW"):
        assert (f"note: {arg}={tmp_path / arg[0].lower()} has no samples.jsonl although 1 of its rows are timed "
                "(written before samples were kept, or not copied with its results)") in out
    assert "1 row(s) without samples on both sides: on roundtrip_p50_us" in out and "Mann-Whitney" not in out


def test_runs_that_timed_nothing_are_not_said_to_predate_samples(tmp_path, capsys):
    """Both runs entirely failed: the note said "written before samples were
    kept", and the rule line claimed the size rule; now each says what is so."""
    base = write_run(tmp_path / "b", [make_row(status="failed", point_id="p1"), make_row(cp=4, status="error")])
    new = write_run(tmp_path / "n", [make_row(status="error", point_id="p1"), make_row(cp=4, status="error")])
    code, out = gate(base, new, capsys)
    assert code == 1 and "failing-in-new=2" in summary(out)
    assert f"note: BASE={base} has no samples.jsonl, and none of its rows is timed" in out
    assert "written before" not in out and "a size" not in out
    assert "no row is timed in both runs: none was gated on the metric" in out


def _one_point(tmp_path: Path, name: str, rt: list[float], ctl: list[float], iqr: float | None = 5.0) -> str:
    """One padded row (p50 the median of ``rt``, spread ``iqr``) and its samples line."""
    return write_sampled(tmp_path / name, {"p1": (rt, ctl)}, roundtrip_iqr_us=iqr)


# a samples line whose roundtrip_us is no list of numbers
UNREADABLE_LINE = '{"point_id": "p1", "impl": "padded", "roundtrip_us": [1, "x"]}\n'
# each damage _break does, and what the unverified row then says is wrong with its samples
DAMAGES = {
    "line missing": "no line in samples.jsonl",
    "empty control": "no control samples (control_us empty)",
    "NaN": "its samples.jsonl line is unusable (roundtrip_us is not a list of finite numbers >= 0",
    "all NaN": "its samples.jsonl line is unusable (roundtrip_us is not a list of finite numbers >= 0",
    "unreadable line": "its samples.jsonl line is unusable (roundtrip_us is not a list",
    "truncated file": "no line in samples.jsonl; 1 unreadable line(s) skipped",
    "file deleted": "no samples.jsonl",
    "line of another run": "its line is another run's (timestamp 2025-06-01T00:00:00+00:00, the row's 2026-01-01",
    "line newer than the reader": "its samples.jsonl line is unusable (schema_version 99, newer than",
}


def _break(path: str, how: str) -> None:
    """A samples file whose one line is unusable, as a crashed writer, a copy
    or a hand leaves it."""
    f, nan = Path(path) / SAMPLES_FILE, float("nan")
    updates = {"empty control": lambda line: {"control_us": []},
               "NaN": lambda line: {"roundtrip_us": [nan] + line["roundtrip_us"][1:]},  # not JSON's; Python's writes it
               "all NaN": lambda line: {"roundtrip_us": [nan] * line["iters"], "control_us": [nan] * line["iters"]},
               "line of another run": lambda line: {"timestamp": "2025-06-01T00:00:00+00:00"},
               "line newer than the reader": lambda line: {"schema_version": 99}}
    if how in updates:
        _edit_line(path, lambda line: line.update(updates[how](line)))
    elif how == "truncated file":
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    elif how == "file deleted":
        f.unlink()
    else:
        f.write_text({"line missing": "", "unreadable line": UNREADABLE_LINE}[how])


SPREADS = {"quiet": 5.0, "loaded": 13620.0, "no-spread": None}
# Every damage on either side at the spread that swallowed the slowdown; the
# other spreads with a damage of the line and one of the file (the reason is
# read apart from the spread, which only decides the fallback's verdict).
DAMAGED_CASES = [pytest.param(how, side, iqr, id=f"{name}-{side}-{how}") for name, iqr in SPREADS.items()
                 for side in ("base", "new")
                 for how in (DAMAGES if name == "loaded" else ("NaN", "file deleted"))]


@pytest.mark.parametrize("how, side, iqr", DAMAGED_CASES)
def test_a_slow_row_whose_samples_are_damaged_is_unverified_at_any_load(tmp_path, capsys, how, side, iqr):
    """3x slower, its samples unusable on one side: it fell back to
    roundtrip_p50_us and its spread, which at load 16-22 (IQR 13.6 ms on a
    3.7 ms point) swallowed +200% and passed. Whatever the spread, the row
    is unverified, the side and what is wrong named."""
    base = _one_point(tmp_path, "b", _noisy(100), _noisy(100), iqr=iqr)
    new = _one_point(tmp_path, "n", _noisy(300), _noisy(100), iqr=iqr)
    _break(base if side == "base" else new, how)
    code, out = gate(base, new, capsys)
    assert code == 1 and "unverified=1" in summary(out) and "regressed=0" in summary(out), out
    assert "FAIL: 1 row(s) of 1 point(s) trip a gate (unverified 1)" in out
    # what is wrong with the samples, named on the side they are wrong on
    assert any(m.startswith(f"UNVERIFIED (samples missing, {side.upper()}: {DAMAGES[how]}") for m in marks(out)), \
        marks(out)
    if how in ("NaN", "file deleted"):  # the allowance reads the verdict, not the damage: two of them suffice
        assert gate(base, new, capsys, "--allow-unverified")[0] == 0


@pytest.mark.parametrize("iqr", SPREADS.values(), ids=SPREADS.keys())
def test_the_same_slow_row_with_its_samples_intact_is_regressed_at_any_load(tmp_path, capsys, iqr):
    """The runs of the test above, undamaged: tested, and the verdict is the
    test's; an undamaged A/A pair passes."""
    whole_b = _one_point(tmp_path / "2", "b", _noisy(100), _noisy(100), iqr=iqr)
    code, out = gate(whole_b, _one_point(tmp_path / "2", "n", _noisy(300), _noisy(100), iqr=iqr), capsys)
    assert code == 1 and any(m.startswith("REGRESSED (beyond 15%, significant") for m in marks(out))
    assert gate(whole_b, _one_point(tmp_path / "3", "n", _noisy(100), _noisy(100), iqr=iqr), capsys)[0] == 0


def test_only_runs_that_both_kept_no_samples_fall_back_and_the_verdict_says_so(tmp_path, capsys):
    """One side's file deleted: unverified (above). Both: a folder older than
    the samples, gated on absolute times, and every mark says so."""
    base = _one_point(tmp_path, "b", _noisy(100), _noisy(100), iqr=5.0)
    new = _one_point(tmp_path, "n", _noisy(300), _noisy(100), iqr=5.0)
    _break(base, "file deleted"), _break(new, "file deleted")
    code, out = gate(base, new, capsys)
    assert code == 1 and "regressed=1" in summary(out)
    assert any(m.startswith("REGRESSED (roundtrip_p50_us, neither run kept samples: ") for m in marks(out))


@pytest.mark.parametrize("extra", [[], ["--allow-missing"], ["--allow-missing", "--allow-unverified"]])
def test_nothing_joined_fails(tmp_path, capsys, extra):
    """iters=12 against iters=20: no row joins; "joined=0 -> PASS" before."""
    base = write_run(tmp_path / "b", [make_row(iters=12), make_row("legacy", iters=12)])
    new = write_run(tmp_path / "n", [make_row(iters=20), make_row("legacy", iters=20)])
    code, out = gate(base, new, capsys, *extra)
    assert code == 1 and "joined=0" in summary(out) and summary(out).endswith("FAIL"), out
    assert "FAIL: nothing compared: no row of NEW is at a point and impl of BASE" in out
    # one row in common is enough to compare
    new = write_run(tmp_path / "n2", [make_row(iters=12), make_row("legacy", iters=20)])
    assert gate(base, new, capsys, "--allow-missing")[0] == 0


def test_nothing_ran_in_both_fails(tmp_path, capsys):
    base = write_run(tmp_path / "b", [make_row(), make_row("legacy")])
    new = write_run(tmp_path / "n", [make_row(impl, status="skipped", p50=None, correct=None)
                                     for impl in ("padded", "legacy")])
    code, out = gate(base, new, capsys)
    assert code == 1 and "FAIL: nothing compared: each of the 2 joined row(s) is skipped in BASE or NEW" in out
    new = write_run(tmp_path / "n2", [make_row(status="skipped", p50=None, correct=None), make_row("legacy")])
    assert gate(base, new, capsys)[0] == 0


def test_the_noise_measured_is_stated_and_a_too_fine_threshold_warned(tmp_path, capsys):
    # every point moved 10% one way or the other, within samples too broad to tell
    runs_b = {f"p{i}": (_noisy(100, spread=0.4), _noisy(100, spread=0.01)) for i in range(6)}
    runs_n = {f"p{i}": (_noisy(100 * (1 + 0.1 * (-1) ** i), spread=0.4), _noisy(100, spread=0.01)) for i in range(6)}
    base, new = write_sampled(tmp_path / "b", runs_b), write_sampled(tmp_path / "n", runs_n)
    _, out = gate(base, new, capsys, "--fail-above", "1%")
    assert "noise measured: between the runs the median unchanged row moved" in out
    assert "warning: --fail-above=1% is finer than these runs resolve" in out


def test_samples_too_few_to_be_significant_fail_the_gate(tmp_path, capsys):
    # iters=3 (the smoke preset): the smallest p-value is 0.05, so a 3x slowdown
    # could never be flagged; the rows are unverified, which the exit says
    base = write_sampled(tmp_path / "b", {"p1": ([100.0, 101, 99], [100.0] * 3)})
    new = write_sampled(tmp_path / "n", {"p1": ([300.0, 301, 299], [100.0] * 3)})
    code, out = gate(base, new, capsys)
    assert code == 1 and "UNVERIFIED (3 sample(s) a side: no difference can be significant" in out
    assert "unverified=1" in summary(out) and summary(out).endswith("FAIL")
    code, out = gate(base, new, capsys, "--allow-unverified")
    assert code == 0 and "unverified (allowed: 3 sample(s) a side" in out
    # from MIN_SAMPLES a side the test can decide: the slowdown is flagged
    five = lambda v: ([v, v + 1, v - 1, v + 2, v - 2], [100.0] * 5)  # noqa: E731
    code, out = gate(write_sampled(tmp_path / "b5", {"p1": five(100.0)}),
                     write_sampled(tmp_path / "n5", {"p1": five(300.0)}), capsys)
    assert code == 1 and "regressed=1" in summary(out) and "unverified=0" in summary(out)


SMOKE = "cp_size=1 +layout=zigzag seq_lens=[1000] moe_a2a_backend=none +matrix=smoke results_dir=r"


def test_two_smoke_runs_pass_with_their_times_not_gated_and_say_what_gates_them(tmp_path, capsys):
    """The smoke preset (iters=3) checks that every path runs: between two of
    its runs a 3x slowdown cannot be significant, so the time is not gated and
    the compare says what to run to gate it; as any other row's, it would be
    unverified."""
    three = lambda v: ([v, v + 1, v - 1], [100.0] * 3)  # noqa: E731
    base = write_sampled(tmp_path / "b", {"p1": three(100.0)}, overrides=SMOKE)
    new = write_sampled(tmp_path / "n", {"p1": three(300.0)}, overrides=SMOKE)
    code, out = gate(base, new, capsys)
    assert code == 0 and summary(out).endswith("smoke-untimed=1 -> PASS"), out
    assert "unverified=0" in summary(out) and marks(out) == ["time not gated (smoke preset: 3 sample(s) a side)"]
    assert "note: 1 timed row(s) are the smoke preset's in both runs" in out and "iters=auto" in out
    # one side not the smoke preset's: the row is unverified, as before
    plain = write_sampled(tmp_path / "p", {"p1": three(300.0)})
    code, out = gate(base, plain, capsys)
    assert code == 1 and "UNVERIFIED (3 sample(s) a side" in out and "smoke-untimed" not in summary(out)


def test_two_smoke_runs_still_fail_on_what_else_is_wrong(tmp_path, capsys):
    three = lambda v: ([v, v + 1, v - 1], [100.0] * 3)  # noqa: E731
    base = write_sampled(tmp_path / "b", {"p1": three(100.0), "p2": three(100.0)}, overrides=SMOKE)
    # NEW's second row errored: status worse, whatever the smoke preset
    rows = [make_row("padded", cp=2, seq_lens="[512]", p50=300.0, point_id="p1", overrides=SMOKE,
                     timestamp="2026-01-01T00:00:00+00:00"),
            make_row("padded", cp=2, seq_lens="[513]", p50=None, status="error", correct=None, point_id="p2",
                     overrides=SMOKE, reason="boom")]
    write_run(tmp_path / "n", rows)
    append_samples(tmp_path / "n", rows[:1], [{"roundtrip": three(300.0)[0], "control": [100.0] * 3}])
    code, out = gate(base, str(tmp_path / "n"), capsys)
    assert code == 1 and "status-worse=1" in summary(out) and "smoke-untimed=1" in summary(out), out


def test_the_smoke_preset_timed_long_enough_for_the_test_keeps_the_power_rule(tmp_path, capsys):
    """+matrix=smoke with more iterations asks for a gate: too noisy a row is unverified."""
    # one wide draw, reversed for NEW: an A/A pair no seed can make significant
    wide = list(100 * np.exp(0.8 * RNG.standard_normal(30)))
    control = _noisy(100, n=30, spread=0.01)
    base = write_sampled(tmp_path / "b", {"p1": (wide, control)}, overrides=SMOKE + " iters=30")
    new = write_sampled(tmp_path / "n", {"p1": (wide[::-1], control[::-1])}, overrides=SMOKE + " iters=30")
    code, out = gate(base, new, capsys)
    assert code == 1 and "underpowered=1" in summary(out) and "smoke-untimed" not in summary(out), out
    assert any(m.startswith("UNVERIFIED (low power: ") for m in marks(out))


def test_samples_as_many_as_iters_auto_takes_compare_without_overflow(tmp_path, capsys):
    # up to 2000 a side: C(2n, n) is past a float from n = 515
    rng = np.random.default_rng(3)
    many = lambda: (list(100 + rng.random(1200)), [100.0] * 1200)  # noqa: E731
    base, new = write_sampled(tmp_path / "b", {"p1": many()}), write_sampled(tmp_path / "n", {"p1": many()})
    code, out = gate(base, new, capsys)
    assert code == 0 and summary(out).endswith("PASS")
    assert smallest_p(2000) == 0.0 and smallest_p(5) == pytest.approx(1 / 252)


def test_unreadable_sample_lines_are_skipped_and_counted(tmp_path, capsys):
    """The latest line of a point decides: an unusable one after a good one
    leaves the row without evidence (the good one is an earlier run's)."""
    base = write_sampled(tmp_path / "b", {"p1": (_noisy(100), _noisy(100))})
    with (tmp_path / "b" / SAMPLES_FILE).open("a") as f:
        f.write(UNREADABLE_LINE + "not json\n")
    smp = read_samples(tmp_path / "b" / SAMPLES_FILE)
    assert smp.skipped_lines == 2 and smp.paired("p1", "padded") is None
    assert smp.rejected[("p1", "padded")].startswith("roundtrip_us is not a list of finite numbers")
    code, out = gate(base, base, capsys)
    assert "2 unreadable line(s) of samples.jsonl skipped" in out
    assert code == 1 and any(m.startswith("UNVERIFIED (samples missing, BASE: its samples.jsonl line is unusable")
                             for m in marks(out))


# --- the test itself


def test_exact_p_values_match_enumeration():
    base, new = [1.0, 4.0, 6.0], [2.0, 3.0, 5.0, 7.0]
    values = base + new
    observed = sum(n > b for n in new for b in base)
    relabellings = list(itertools.combinations(range(7), 4))  # every relabelling of the 7 values as NEW
    count = sum(sum(values[j] > values[i] for j in idx for i in range(7) if i not in idx) >= observed
                for idx in relabellings)
    assert p_greater(base, new) == pytest.approx(count / len(relabellings))
    assert smallest_p(8) == pytest.approx(p_greater(list(range(8)), list(range(8, 16))))


def test_p_values_are_calibrated_when_nothing_changed():
    rng = np.random.default_rng(1)
    ps = np.array([p_greater(rng.normal(size=10), rng.normal(size=10)) for _ in range(2000)])
    assert (ps < 0.05).mean() <= 0.06 and (ps < 0.01).mean() <= 0.015


def test_false_discovery_adjustment():
    adj = adjusted([0.01, 0.04, float("nan"), 0.03])
    assert np.isnan(adj[2]) and list(np.round(adj[[0, 1, 3]], 6)) == [0.03, 0.04, 0.04]


def _bh(ps: list[float]) -> list[float]:
    """Benjamini-Hochberg by its definition: min over k >= rank of p_(k) * m / k."""
    order, m = sorted(range(len(ps)), key=ps.__getitem__), len(ps)
    return [min(1.0, min(ps[order[k]] * m / (k + 1) for k in range(order.index(j), m))) for j in range(m)]


def _holm(ps: list[float]) -> list[float]:
    order, m = sorted(range(len(ps)), key=ps.__getitem__), len(ps)
    running = itertools.accumulate((min(1.0, ps[idx] * (m - i)) for i, idx in enumerate(order)), max)
    return [p for _, p in sorted(zip(order, running))]  # back in the order of ps


def test_the_docs_name_the_correction_the_code_applies():
    """The module's docstring named Holm while the code applies Benjamini-Hochberg."""
    ps = [0.004, 0.03, 0.02, 0.5, 0.011]
    assert list(adjusted(ps)) == pytest.approx(_bh(ps)) and _bh(ps) != pytest.approx(_holm(ps))
    review = (Path(__file__).resolve().parents[2] / "docs" / "review.md").read_text()
    for text in (significance.__doc__, review, compare.__doc__):
        assert "Benjamini-Hochberg" in text and "Holm" not in text and "family-wise" not in text.lower()


def test_samples_sidecar_round_trips(tmp_path):
    """One line per row with samples, carrying the machine's load, the schema version and the row's run."""
    rows = [{"point_id": "a", "impl": impl, "timestamp": "t", "run_id": "base0001"} for impl in ("padded", "legacy")]
    append_samples(tmp_path, rows, [{"roundtrip": [1.0, 2.0], "control": [2.0, 2.0]}, {}])
    lines = [json.loads(text) for text in (tmp_path / SAMPLES_FILE).read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["roundtrip_us"] == [1.0, 2.0]
    assert isinstance(lines[0]["load_1m"], float) and lines[0]["load_1m"] >= 0
    assert (lines[0]["schema_version"], lines[0]["run_id"]) == (SCHEMA_VERSION, "base0001")
    assert list(read_samples(tmp_path / SAMPLES_FILE).paired("a", "padded")) == [0.5, 1.0]


# --- power: a row the gate could not have flagged is no pass


def _aa(tmp_path: Path, n: int, spread: float, calibration: bool = False) -> tuple[str, str]:
    """Two runs of one unchanged point, ``n`` samples a side of paired ratio spread ``spread``."""
    rng = np.random.default_rng(11)
    paths = []
    for name in ("b", "n"):
        ctl = list(100 * (1 + 0.01 * rng.standard_normal(n)))
        rt = [c * (1 + spread * z) for c, z in zip(ctl, np.abs(rng.standard_normal(n)))]
        path = write_sampled(tmp_path / name, {"p1": (rt, ctl)})
        if calibration:
            _edit_line(path, lambda line: line.update(calibration={"iters": n, "ci_width": 0.3, "target": 0.1,
                                                                    "reached": False}))
        paths.append(path)
    return paths[0], paths[1]


def test_a_row_with_a_coin_flips_chance_to_show_the_change_is_not_a_pass(tmp_path, capsys):
    """Compare's power cut (POWER_MIN), not a looser one: samples with about an even chance of showing
    a 1.3x change (12 a side, spread 0.8: P = 0.54) are unverified, not "within noise"."""
    from nsa_cp_comm.harness.significance import power, resolved_change

    base, new = _aa(tmp_path, 12, 0.8)
    b = read_samples(Path(base) / SAMPLES_FILE).paired("p1", "padded")
    n = read_samples(Path(new) / SAMPLES_FILE).paired("p1", "padded")
    assert 0.45 < power(b, n, resolved_change(0.15)) < 0.75
    code, out = gate(base, new, capsys)
    assert code == 1 and "unverified=1 underpowered=1" in summary(out), out


@pytest.mark.parametrize("n,spread,verdict", [
    (8, 0.5, "low power"),  # the default preset's iters under load: a 15% change cannot show
    (8, 0.01, "pass"),  # the same count on quiet samples can
    (400, 0.5, "pass"),  # the noisy samples, as many as iters=auto takes
])
def test_a_fixed_iteration_row_too_noisy_for_the_threshold_is_unverified(tmp_path, capsys, n, spread, verdict):
    base, new = _aa(tmp_path, n, spread)
    code, out = gate(base, new, capsys)
    if verdict == "pass":
        assert code == 0 and summary(out).endswith("PASS"), out
        return
    assert code == 1 and "unverified=1 underpowered=1" in summary(out), out
    assert any(m.startswith("UNVERIFIED (low power: P(flag a 30% change) = ") for m in marks(out)), marks(out)
    # a coarser threshold (the coarsest compare takes) is one these samples can see
    assert gate(base, new, capsys, "--fail-above", "100%")[0] == 0


def test_iters_auto_rows_still_too_noisy_say_so(tmp_path, capsys):
    base, new = _aa(tmp_path, 8, 0.5, calibration=True)
    code, out = gate(base, new, capsys)
    assert code == 1 and any(m.startswith("UNVERIFIED (too noisy: ") and "at iters=auto's cap" in m
                             for m in marks(out)), marks(out)


def test_the_power_estimate_matches_the_test_it_predicts():
    """The checker of the power rule: its estimate against how often
    p_greater really flags a shifted sample drawn from the same noise."""
    rng = np.random.default_rng(2)
    for n, sd in ((8, 0.05), (20, 0.2), (60, 0.3), (200, 0.5)):
        draw = lambda: np.abs(1 + sd * rng.standard_normal(n))  # noqa: E731
        estimate = power(draw(), draw(), 0.15)
        seen = np.mean([p_greater(draw(), draw() * 1.15) < ALPHA for _ in range(300)])
        assert abs(estimate - seen) < 0.2, (n, sd, estimate, seen)
    assert power([1.0] * 3, [1.0] * 3, 10.0) == 0.0  # three a side can never be significant at 1%


# --- evidence: a regressed row says what it rests on


def test_a_regressed_row_names_its_p_value_paired_ratio_and_both_loads(tmp_path, capsys):
    base = write_sampled(tmp_path / "b", {"p1": (_noisy(100), _noisy(100))})
    new = write_sampled(tmp_path / "n", {"p1": (_noisy(200), _noisy(100))})
    for path, load in ((base, 2.0), (new, 19.5)):
        _edit_line(path, lambda line: line.update(load_1m=load))
    code, out = gate(base, new, capsys)
    mark = next(m for m in marks(out) if m.startswith("REGRESSED"))
    assert code == 1 and "significant: p=" in mark
    ratio = float(mark.split("evidence: median paired ratio NEW/BASE x")[1].split(",")[0])
    assert 1.7 < ratio < 2.3 and mark.endswith(", 1-minute load BASE 2.0 NEW 19.5"), mark
    # a line without its load: the run's, from runs.jsonl
    for path in (base, new):
        _edit_line(path, lambda line: line.pop("load_1m"))
    with (Path(new) / "runs.jsonl").open() as f:
        run = json.loads(f.readline())
    (Path(new) / "runs.jsonl").write_text(json.dumps({**run, "load_1m": 7.25}) + "\n")
    _, out = gate(base, new, capsys)
    mark = next(m for m in marks(out) if m.startswith("REGRESSED"))
    assert "1-minute load BASE unknown NEW 7.2" in mark, mark


def test_a_calibration_short_of_its_target_is_named_once_per_run(tmp_path, capsys):
    """iters=auto rows that stopped at a cap before their interval reached
    the target width were named nowhere; compare counts them per run."""
    base, new = _aa(tmp_path, 400, 0.01, calibration=True)
    code, out = gate(base, new, capsys)
    notes = [line for line in out.splitlines() if "iters=auto missed its interval width target" in line]
    assert len(notes) == 2, out
    assert notes[0].startswith(f"note: BASE={base}: ") and "of 10% on 1 of 1 calibrated row(s)" in notes[0], notes
    assert "the widest stopped at 30%" in notes[0]
    # reached: no line
    for path in (base, new):
        _edit_line(path, lambda line: line["calibration"].update(reached=True))
    _, out = gate(base, new, capsys)
    assert "missed its interval width target" not in out


def test_the_fail_above_bound_is_what_refuses_a_useless_threshold(monkeypatch):
    """The checker broken (no upper bound): 1e6% is taken, and no slowdown short
    of 10,001x would trip the gate."""
    with pytest.raises(compare.InputError, match="over 100%"):
        compare.parse_threshold("1e6%")
    assert compare.parse_threshold("100%") == 1.0
    monkeypatch.setattr(compare, "MAX_THRESHOLD", float("inf"))
    assert compare.parse_threshold("1e6%") == 1e4


def test_the_report_names_a_calibration_short_of_its_target(tmp_path, capsys):
    base, _ = _aa(tmp_path, 40, 0.01, calibration=True)
    report_cli.main([base, "--exit-zero"])
    md = (Path(base) / "report.md").read_text()
    lines = [line for line in md.splitlines() if line.startswith("**Calibration**")]
    assert len(lines) == 1 and "on 1 of 1 calibrated row(s)" in lines[0], md[:2000]


def _even_pair(path: Path, padded: list[float], legacy: list[float], even: bool = True) -> Path:
    """One point's padded and legacy rows, timed in the same iterations (their samples)."""
    rows = [make_row(impl, cp=2, seq_lens="[1024]", p50=float(np.median(rt)), point_id="even0001", is_even=even,
                     timestamp="2026-01-01T00:00:00+00:00") for impl, rt in (("padded", padded), ("legacy", legacy))]
    write_run(path, rows)
    append_samples(path, rows, [{"roundtrip": padded, "control": []}, {"roundtrip": legacy, "control": []}])
    return path


def test_the_report_gives_padded_over_legacy_on_even_plans_as_the_paired_ratio(tmp_path, capsys):
    """The same iterations paired: a load that moves both alike leaves the ratio where it is (here
    every iteration 1.01x, while the round trips themselves drift 3x); a padded path 1.3x slower in
    every iteration reads 1.3; an uneven point or a missing samples line gives no line."""
    legacy = [100.0 * (1 + 2 * i / 40) for i in range(40)]  # the machine's load drifting
    from matrix.review._review import load_run

    same = _even_pair(tmp_path / "same", [x * 1.01 for x in legacy], legacy)
    got = report.even_paired(load_run("R", str(same)), report.prepare(load_run("R", str(same))))
    assert got["median"] == pytest.approx(1.01) and got["lo"] == pytest.approx(1.01) and got["points"] == 1, got
    assert "**Even plans, padded over legacy:** 1.010" in got["line"]
    slow = _even_pair(tmp_path / "slow", [x * 1.3 for x in legacy], legacy)
    assert report.even_paired(load_run("R", str(slow)), report.prepare(load_run("R", str(slow))))["median"] == \
        pytest.approx(1.3)
    few = _even_pair(tmp_path / "few", [101.0, 102.0], [100.0, 100.0])  # no interval from two iterations
    got = report.even_paired(load_run("R", str(few)), report.prepare(load_run("R", str(few))))
    assert (got["lo"], got["hi"]) == (None, None) and "too few iterations for an interval" in got["line"], got
    uneven = _even_pair(tmp_path / "uneven", [x * 1.3 for x in legacy], legacy, even=False)
    assert report.even_paired(load_run("R", str(uneven)), report.prepare(load_run("R", str(uneven)))) == {}
    (same / SAMPLES_FILE).unlink()
    assert report.even_paired(load_run("R", str(same)), report.prepare(load_run("R", str(same)))) == {}
    capsys.readouterr()
