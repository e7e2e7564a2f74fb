"""compare's gate on per-iteration samples: a regression is significant and
beyond the threshold; a load that slows the control alike is no regression;
each verdict flips when the thing it checks is broken."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from matrix import compare
from matrix.samples import SAMPLES_FILE, append_samples, read_samples
from matrix.significance import adjusted, p_greater, smallest_p

from test_compare import make_row, marks, summary, write_run

RNG = np.random.default_rng(7)


def _noisy(median: float, n: int = 16, spread: float = 0.05) -> list[float]:
    return list(median * (1 + spread * RNG.standard_normal(n)))


def write_sampled(path: Path, runs: dict[str, tuple[list[float], list[float]]]) -> str:
    """A results folder with one padded row per point id and its samples
    ``{point_id: (roundtrip_us, control_us)}``."""
    rows = [make_row("padded", cp=2, seq_lens=f"[{512 + i}]", p50=float(np.median(rt)), point_id=pid,
                     timestamp="2026-01-01T00:00:00+00:00")
            for i, (pid, (rt, _)) in enumerate(runs.items())]
    write_run(path, rows)
    append_samples(path, rows, [{"roundtrip": rt, "control": ctl} for rt, ctl in runs.values()])
    return str(path)


def gate(base: str, new: str, capsys, *extra: str) -> tuple[int, str]:
    code = compare.main([base, new, *extra])
    return code, capsys.readouterr().out


def test_a_significant_paired_regression_beyond_the_threshold_fails(tmp_path: Path, capsys):
    base = write_sampled(tmp_path / "b", {"p1": (_noisy(100), _noisy(100)), "p2": (_noisy(100), _noisy(100))})
    new = write_sampled(tmp_path / "n", {"p1": (_noisy(200), _noisy(100)), "p2": (_noisy(100), _noisy(100))})
    code, out = gate(base, new, capsys)
    assert code == 1 and "regressed=1" in summary(out)
    assert any(m.startswith("REGRESSED (beyond 15%, significant: p=") for m in marks(out))
    assert "roundtrip_vs_control" in out and "Mann-Whitney" in out


def test_a_load_that_slows_the_control_alike_is_no_regression(tmp_path: Path, capsys):
    """Every absolute time doubled (a busy machine), the paired ratio unchanged."""
    base = write_sampled(tmp_path / "b", {"p1": (_noisy(100), _noisy(100))})
    new = write_sampled(tmp_path / "n", {"p1": (_noisy(200), _noisy(200))})
    code, out = gate(base, new, capsys)
    assert code == 0, out
    absolute, out_abs = gate(base, new, capsys, "--metric", "roundtrip_p50_us")
    assert absolute == 1 and "REGRESSED" in out_abs  # what the absolute metric would have said


def test_beyond_the_threshold_but_not_significant_is_noise(tmp_path: Path, capsys):
    """Medians 30% apart over samples that overlap: no evidence."""
    spread = [50, 300, 80, 250, 100, 400, 60, 200]
    base = write_sampled(tmp_path / "b", {"p1": (spread, [100.0] * 8)})
    new = write_sampled(tmp_path / "n", {"p1": ([x * 1.3 for x in spread[::-1]], [100.0] * 8)})
    code, out = gate(base, new, capsys)
    assert code == 0 and "within-noise=1" in summary(out)
    assert any(m.startswith("within noise (beyond 15% but not significant") for m in marks(out))


def test_significant_but_within_the_threshold_passes(tmp_path: Path, capsys):
    base = write_sampled(tmp_path / "b", {"p1": (_noisy(100, spread=0.001), [100.0] * 16)})
    new = write_sampled(tmp_path / "n", {"p1": (_noisy(105, spread=0.001), [100.0] * 16)})
    code, out = gate(base, new, capsys)
    assert code == 0 and "regressed=0" in summary(out)
    tighter, _ = gate(base, new, capsys, "--fail-above", "2%")
    assert tighter == 1  # the same samples gate once the threshold is below the change


def test_runs_without_samples_fall_back_to_absolute_times_and_say_so(tmp_path: Path, capsys):
    base = write_run(tmp_path / "b", [make_row(p50=100.0, point_id="p1")])
    new = write_run(tmp_path / "n", [make_row(p50=300.0, point_id="p1")])
    code, out = gate(base, new, capsys)
    assert code == 1 and "REGRESSED (roundtrip_p50_us, no samples: beyond 15% and the spread)" in marks(out)
    for arg in ("BASE", "NEW"):
        assert (f"note: {arg}={tmp_path / arg[0].lower()} has no samples.jsonl although 1 of its rows are timed "
                "(written before samples were kept, or not copied with its results)") in out
    assert "1 row(s) without samples on both sides: on roundtrip_p50_us" in out and "Mann-Whitney" not in out


def test_runs_that_timed_nothing_are_not_said_to_predate_samples(tmp_path: Path, capsys):
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
    """One padded row (p50 the median of ``rt``) and its samples line."""
    path = tmp_path / name
    row = make_row("padded", p50=float(np.median(rt)), point_id="p1", roundtrip_iqr_us=iqr,
                   timestamp="2026-01-01T00:00:00+00:00")
    write_run(path, [row])
    append_samples(path, [row], [{"roundtrip": rt, "control": ctl}])
    return str(path)


def _break(path: str, how: str) -> None:
    """A samples file whose one line is unusable, as found in the wild."""
    f = Path(path) / SAMPLES_FILE
    if how == "line missing":
        f.write_text("")
    elif how == "empty control":
        line = json.loads(f.read_text())
        f.write_text(json.dumps({**line, "control_us": []}) + "\n")
    else:  # a NaN: not JSON's, Python's json writes it anyway
        line = json.loads(f.read_text())
        f.write_text(json.dumps({**line, "roundtrip_us": [float("nan")] + line["roundtrip_us"][1:]}) + "\n")


@pytest.mark.parametrize("how", ["line missing", "empty control", "NaN"])
@pytest.mark.parametrize("side", ["base", "new"])
def test_a_slow_row_without_usable_samples_does_not_pass(tmp_path: Path, capsys, how: str, side: str):
    """3x slower, its samples unusable on one side: "no timing", PASS before.
    With a spread it is gated on its absolute time; without one it is unverified."""
    base = _one_point(tmp_path, "b", _noisy(100), _noisy(100))
    new = _one_point(tmp_path, "n", _noisy(300), _noisy(100))
    _break(base if side == "base" else new, how)
    code, out = gate(base, new, capsys)
    assert code == 1 and "regressed=1" in summary(out), out
    assert "REGRESSED (roundtrip_p50_us, no samples: beyond 15% and the spread)" in marks(out)
    side_name = side.upper()
    base = _one_point(tmp_path / "2", "b", _noisy(100), _noisy(100), iqr=None)
    new = _one_point(tmp_path / "2", "n", _noisy(300), _noisy(100), iqr=None)
    _break(base if side == "base" else new, how)
    code, out = gate(base, new, capsys)
    assert code == 1 and "unverified=1" in summary(out), out
    assert f"UNVERIFIED (no samples in {side_name}; roundtrip_p50_us without a spread)" in marks(out)
    assert gate(base, new, capsys, "--allow-unverified")[0] == 0
    # the same runs, samples intact: tested, and the verdict is the test's
    whole = _one_point(tmp_path / "3", "n", _noisy(300), _noisy(100), iqr=None)
    code, out = gate(_one_point(tmp_path / "3", "b", _noisy(100), _noisy(100), iqr=None), whole, capsys)
    assert code == 1 and any(m.startswith("REGRESSED (beyond 15%, significant") for m in marks(out))


@pytest.mark.parametrize("extra", [[], ["--allow-missing"], ["--allow-missing", "--allow-unverified"]])
def test_nothing_joined_fails(tmp_path: Path, capsys, extra: list[str]):
    """iters=12 against iters=20: no row joins; "joined=0 -> PASS" before."""
    base = write_run(tmp_path / "b", [make_row(iters=12), make_row("legacy", iters=12)])
    new = write_run(tmp_path / "n", [make_row(iters=20), make_row("legacy", iters=20)])
    code, out = gate(base, new, capsys, *extra)
    assert code == 1 and "joined=0" in summary(out) and summary(out).endswith("FAIL"), out
    assert "FAIL: nothing compared: no row of NEW is at a point and impl of BASE" in out
    # one row in common is enough to compare
    new = write_run(tmp_path / "n2", [make_row(iters=12), make_row("legacy", iters=20)])
    assert gate(base, new, capsys, "--allow-missing")[0] == 0


def test_nothing_ran_in_both_fails(tmp_path: Path, capsys):
    base = write_run(tmp_path / "b", [make_row(), make_row("legacy")])
    new = write_run(tmp_path / "n", [make_row(status="skipped", p50=None, correct=None)] * 1
                    + [make_row("legacy", status="skipped", p50=None, correct=None)])
    code, out = gate(base, new, capsys)
    assert code == 1 and "FAIL: nothing compared: each of the 2 joined row(s) is skipped in BASE or NEW" in out
    new = write_run(tmp_path / "n2", [make_row(status="skipped", p50=None, correct=None), make_row("legacy")])
    assert gate(base, new, capsys)[0] == 0


def test_the_noise_measured_is_stated_and_a_too_fine_threshold_warned(tmp_path: Path, capsys):
    # every point moved 10% one way or the other, within samples too broad to tell
    runs_b = {f"p{i}": (_noisy(100, spread=0.4), _noisy(100, spread=0.01)) for i in range(6)}
    runs_n = {f"p{i}": (_noisy(100 * (1 + 0.1 * (-1) ** i), spread=0.4), _noisy(100, spread=0.01)) for i in range(6)}
    base, new = write_sampled(tmp_path / "b", runs_b), write_sampled(tmp_path / "n", runs_n)
    _, out = gate(base, new, capsys, "--fail-above", "1%")
    assert "noise measured: between the runs the median unchanged row moved" in out
    assert "warning: --fail-above=1% is finer than these runs resolve" in out


def test_samples_too_few_to_be_significant_fail_the_gate(tmp_path: Path, capsys):
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


def test_samples_as_many_as_iters_auto_takes_compare_without_overflow(tmp_path: Path, capsys):
    # up to 2000 a side: C(2n, n) is past a float from n = 515
    rng = np.random.default_rng(3)
    many = lambda: (list(100 + rng.random(1200)), [100.0] * 1200)  # noqa: E731
    base, new = write_sampled(tmp_path / "b", {"p1": many()}), write_sampled(tmp_path / "n", {"p1": many()})
    code, out = gate(base, new, capsys)
    assert code == 0 and summary(out).endswith("PASS")
    assert smallest_p(2000) == 0.0 and smallest_p(5) == pytest.approx(1 / 252)


def test_unreadable_sample_lines_are_skipped_and_counted(tmp_path: Path, capsys):
    base = write_sampled(tmp_path / "b", {"p1": (_noisy(100), _noisy(100))})
    with (tmp_path / "b" / SAMPLES_FILE).open("a") as f:
        f.write('{"point_id": "p1", "impl": "padded", "roundtrip_us": [1, "x"]}\nnot json\n')
    smp = read_samples(tmp_path / "b" / SAMPLES_FILE)
    assert smp.skipped_lines == 2 and smp.paired("p1", "padded") is not None
    _, out = gate(base, base, capsys)
    assert "2 unreadable line(s) of samples.jsonl skipped" in out


# --- the test itself


def test_exact_p_values_match_enumeration():
    base, new = [1.0, 4.0, 6.0], [2.0, 3.0, 5.0, 7.0]
    values = base + new
    observed = sum(n > b for n in new for b in base)
    count = total = 0
    for idx in itertools.combinations(range(7), 4):  # every relabelling of the 7 values
        ys = [values[i] for i in idx]
        xs = [values[i] for i in range(7) if i not in idx]
        count += sum(y > x for y in ys for x in xs) >= observed
        total += 1
    assert p_greater(base, new) == pytest.approx(count / total)
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
    order = sorted(range(len(ps)), key=ps.__getitem__)
    m = len(ps)
    out = [0.0] * m
    for i, idx in enumerate(order):
        out[idx] = min(1.0, min(ps[order[k]] * m / (k + 1) for k in range(i, m)))
    return out


def _holm(ps: list[float]) -> list[float]:
    order = sorted(range(len(ps)), key=ps.__getitem__)
    m, out, running = len(ps), [0.0] * len(ps), 0.0
    for i, idx in enumerate(order):
        running = max(running, min(1.0, ps[idx] * (m - i)))
        out[idx] = running
    return out


def test_the_docs_name_the_correction_the_code_applies():
    """The module's docstring named Holm while the code applies Benjamini-Hochberg."""
    from matrix import significance

    ps = [0.004, 0.03, 0.02, 0.5, 0.011]
    assert list(adjusted(ps)) == pytest.approx(_bh(ps)) and _bh(ps) != pytest.approx(_holm(ps))
    review = (Path(__file__).resolve().parents[1] / "docs" / "review.md").read_text()
    for text in (significance.__doc__, review, compare.__doc__):
        assert "Benjamini-Hochberg" in text and "Holm" not in text and "family-wise" not in text.lower()


def test_samples_sidecar_round_trips(tmp_path: Path):
    rows = [{"point_id": "a", "impl": "padded", "timestamp": "t"}, {"point_id": "a", "impl": "legacy", "timestamp": "t"}]
    append_samples(tmp_path, rows, [{"roundtrip": [1.0, 2.0], "control": [2.0, 2.0]}, {}])
    lines = (tmp_path / SAMPLES_FILE).read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["roundtrip_us"] == [1.0, 2.0]
    assert list(read_samples(tmp_path / SAMPLES_FILE).paired("a", "padded")) == [0.5, 1.0]
