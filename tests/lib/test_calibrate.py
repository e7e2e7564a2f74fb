"""iters=auto: the stopping rule, its agreement over ranks, and its config."""

from __future__ import annotations

import math

import numpy as np
import pytest

from matrix.app.config import ConfigError, MatrixConfig, validate, validate_value
from matrix.review.compare import DEFAULT_THRESHOLD, parse_threshold
from matrix.store.samples import lines_for
from matrix_cli import run_matrix
from nsa_cp_comm.harness import calibrate
from nsa_cp_comm.harness.calibrate import decide, median_ci, relative_width
from nsa_cp_comm.harness.significance import POWER_MIN, power, resolved_change
from nsa_cp_comm.harness.spec import PointSpec

import calibrate_tasks
from rank_tasks import answered


def test_median_interval_is_the_binomial_order_statistics():
    xs = list(range(1, 21))  # n=20: ranks 6 and 15 (coverage 95.9%), the textbook interval
    assert median_ci(xs) == (6.0, 15.0)
    assert median_ci([3.0, 1.0, 2.0, 6.0, 5.0, 4.0]) == (1.0, 6.0)  # n=6: the extremes (96.9%)
    assert all(math.isnan(v) for v in median_ci([1.0, 2.0, 3.0, 4.0, 5.0]))  # n=5: 93.8% at best
    assert relative_width([1.0] * 5) == math.inf
    assert median_ci(np.linspace(0, 1, 2001))[0] == pytest.approx(0.478, abs=0.002)  # large n: no overflow


def test_stops_when_narrow_continues_when_wide_and_stops_at_the_caps():
    rng = np.random.default_rng(0)
    narrow = {"padded": 1 + 0.01 * rng.standard_normal(40), "legacy": 1 + 0.01 * rng.standard_normal(40)}
    wide = {**narrow, "legacy": rng.uniform(0.1, 10, 40)}
    assert decide(narrow, elapsed_s=1.0, min_iters=20) == calibrate.Decision(True, True, pytest.approx(
        max(relative_width(v) for v in narrow.values())))
    # one implementation still wide: go on
    d = decide(wide, elapsed_s=1.0, min_iters=20, max_iters=1000, time_cap_s=30)
    assert not d.stop and not d.reached and d.width > 0.15
    # never before the minimum, however narrow
    assert not decide(narrow, elapsed_s=1.0, min_iters=41).stop
    # the iteration cap and the time cap stop it, target not reached
    assert decide(wide, elapsed_s=1.0, max_iters=40) == calibrate.Decision(True, False, d.width)
    assert decide(wide, elapsed_s=30.0, max_iters=1000, time_cap_s=30) == calibrate.Decision(True, False, d.width)


def test_past_the_soft_cap_the_loop_goes_on_only_while_the_gate_lacks_power():
    """At the soft cap a noisy point whose samples could not show compare the
    1.3x it must flag goes on, to the hard cap at most; a quiet one stops."""
    rng = np.random.default_rng(2)
    noisy = {"padded": rng.lognormal(0, 0.8, 60)}
    quiet = {"padded": rng.lognormal(0, 0.05, 60)}
    caps = {"target": 0.01, "min_iters": 20, "max_iters": 2000, "time_cap_s": 30.0, "hard_cap_s": 60.0}
    assert calibrate.gate_power(noisy) < calibrate.POWER_TARGET < calibrate.gate_power(quiet)
    d = decide(noisy, elapsed_s=31.0, **caps)
    assert not d.stop and d.power == pytest.approx(calibrate.gate_power(noisy))
    assert decide(quiet, elapsed_s=31.0, **caps).stop
    assert not decide(noisy, elapsed_s=29.0, **caps).stop and decide(noisy, elapsed_s=29.0, **caps).power is None
    assert decide(noisy, elapsed_s=60.0, **caps).stop  # the hard cap, power or not
    # more samples of the same noise give the power, and the loop stops
    assert decide({"padded": rng.lognormal(0, 0.8, 1500)}, elapsed_s=31.0, **caps).stop
    # without a hard cap above the soft one (NSA_CP_AUTO_MAX_S) the soft cap is hard
    assert decide(noisy, elapsed_s=31.0, **{**caps, "hard_cap_s": None}).stop


def test_the_hard_cap_bounds_the_floor_too():
    """Iterations of seconds: the loop ends at its hard cap with fewer than
    MIN_ITERS, rather than run 20 of them past the point's timeout."""
    few = {"padded": [1.0, 1.1, 0.9]}
    assert not decide(few, elapsed_s=10.0, min_iters=20, time_cap_s=30.0, hard_cap_s=60.0).stop
    assert decide(few, elapsed_s=60.0, min_iters=20, time_cap_s=30.0, hard_cap_s=60.0).stop
    assert decide(few, elapsed_s=30.0, min_iters=20, time_cap_s=30.0).stop


def test_the_power_asked_for_is_compares():
    """The loop asks for the change and power compare's gate judges by: twice
    its default threshold, and no less power than compare requires."""
    assert calibrate.GATE_CHANGE == pytest.approx(resolved_change(parse_threshold(DEFAULT_THRESHOLD)))
    assert calibrate.POWER_TARGET >= POWER_MIN
    xs = np.random.default_rng(3).lognormal(0, 0.5, 80)
    assert calibrate.gate_power({"a": xs, "b": xs * 2}) == pytest.approx(power(xs, xs, calibrate.GATE_CHANGE))
    assert calibrate.EXTENDED_CAP_S > calibrate.TIME_CAP_S and calibrate.time_caps({}) == (
        calibrate.TIME_CAP_S, calibrate.EXTENDED_CAP_S)


def test_a_loop_of_slow_iterations_stops_at_its_hard_cap_on_every_rank(rank_pool):
    iters = [v["iters"] for v in answered(rank_pool(2).run(calibrate_tasks.slow_loop, 0.05, 1.0, timeout_s=60))]
    assert iters[0] == iters[1] and 1 <= iters[0] < calibrate.MIN_ITERS, iters


def test_the_ratio_to_the_control_is_what_is_calibrated():
    # times that swing with the load, the control alike: the paired ratio is steady
    load = np.random.default_rng(1).uniform(1, 5, 40)
    folded = {"padded": 100 * load, "_control": 80 * load}
    metric = calibrate.paired_metric(folded, "_control")
    assert list(metric) == ["padded"] and np.allclose(metric["padded"], 1.25)
    assert decide(metric, elapsed_s=0.0).stop
    assert not decide(calibrate.paired_metric(folded, None), elapsed_s=0.0).stop  # no control: the swinging times


@pytest.mark.parametrize("noisy, expect_iters, reached", [((), 6, True), ((1,), 40, False)])
def test_every_rank_runs_the_same_number_of_iterations(rank_pool, noisy, expect_iters, reached):
    # Rank 1 alone sees wide times: on its own it would go on while rank 0
    # stopped (and waited for it forever); deciding on the slowest rank's
    # times, all-reduced, both stop together.
    values = answered(rank_pool(2).run(calibrate_tasks.calibrated_loop, noisy, 40, timeout_s=30))
    assert [v["iters"] for v in values] == [expect_iters] * 2
    assert [v["reached"] for v in values] == [reached] * 2


def test_config_accepts_iters_auto_and_names_the_key_otherwise():
    validate_value("iters", "auto")
    cfg = {**vars(MatrixConfig()), "iters": "auto", "results_dir": "/tmp/x"}
    validate(cfg)
    for bad in ("many", 0, 1.5):
        with pytest.raises(ConfigError, match=r"^iters=.*: must be an integer in \[1, 100000\] or auto$"):
            validate_value("iters", bad)
    with pytest.raises(ConfigError, match=r"^timeout_s=30: must be at least 120 with iters=auto"):
        validate({**cfg, "timeout_s": 30})
    assert PointSpec((1000,), 2, "zigzag", iters="auto").max_iters == calibrate.MAX_ITERS
    with pytest.raises(ValueError, match="iters='many' must be a positive int or \"auto\""):
        PointSpec((1000,), 2, "zigzag", iters="many")


def test_samples_record_the_iterations_and_the_calibration():
    row = {"point_id": "p", "impl": "padded", "timestamp": "t"}
    cal = {"iters": 2, "ci_width": 0.1, "target": 0.15, "reached": True}
    line = lines_for([row, {**row, "impl": "legacy"}], [{"roundtrip": [1.0, 2.0], "control": [1.0, 1.0]}] * 2,
                     [cal, {}])
    first, second = line.splitlines()
    assert '"iters":2' in first and '"calibration":{"iters":2,"ci_width":0.1,"target":0.15,"reached":true}' in first
    assert '"iters":2' in second and "calibration" not in second


def test_the_time_cap_is_shortened_only_by_seconds_within_it(monkeypatch, tmp_path):
    """NSA_CP_AUTO_MAX_S: seconds in (0, 30] shorten iters=auto's cap, on every
    process that reads the environment; anything else is one line naming it
    (and exit 2 from the command line, before any rank starts)."""
    assert calibrate.time_cap({}) == calibrate.TIME_CAP_S
    assert calibrate.time_cap({calibrate.TIME_CAP_ENV: "7.5"}) == 7.5
    for bad in ("0", "-1", "31", "ten", "nan", "inf"):
        with pytest.raises(ValueError, match=rf"^NSA_CP_AUTO_MAX_S='{bad}': must be seconds in \(0, 30\]$"):
            calibrate.time_cap({calibrate.TIME_CAP_ENV: bad})
    monkeypatch.setenv(calibrate.TIME_CAP_ENV, "5")
    calib = calibrate.Calibrator(control=None, group=None, device="cpu")
    assert (calib.time_cap_s, calib.hard_cap_s) == (5.0, 5.0)  # one hard cap: a quick run is not extended
    cfg = {**vars(MatrixConfig()), "iters": "auto", "results_dir": "/tmp/x"}
    validate(cfg)
    monkeypatch.setenv(calibrate.TIME_CAP_ENV, "ten")
    with pytest.raises(ConfigError, match=r"^NSA_CP_AUTO_MAX_S='ten': must be seconds"):
        validate(cfg)
    validate({**cfg, "iters": 8})  # read only where iters=auto
    run = run_matrix(tmp_path / "r", "cp_size=2", "hidden_size=64", "iters=auto", multirun=False)
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert run.returncode == 2 and lines == ["error: NSA_CP_AUTO_MAX_S='ten': must be seconds in (0, 30]"], run.stderr


def test_the_gate_power_is_the_least_over_the_implementations_in_any_order():
    """A quiet first implementation and a noisy second: the loop goes on past the soft cap for the
    second (its rows could not show a 1.3x change), whichever comes first."""
    rng = np.random.default_rng(5)
    quiet, noisy = rng.lognormal(0, 0.05, 60), rng.lognormal(0, 0.8, 60)
    caps = {"target": 0.01, "min_iters": 20, "max_iters": 2000, "time_cap_s": 30.0, "hard_cap_s": 60.0}
    for metric in ({"padded": quiet, "legacy": noisy}, {"legacy": noisy, "padded": quiet}):
        assert calibrate.gate_power(metric) == pytest.approx(calibrate.gate_power({"x": noisy}))
        assert not decide(metric, elapsed_s=31.0, **caps).stop
