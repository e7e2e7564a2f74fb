"""iters=auto: the stopping rule, its agreement over ranks, and its config."""

from __future__ import annotations

import math

import numpy as np
import pytest

from matrix.config import ConfigError, MatrixConfig, validate, validate_value
from matrix.samples import lines_for
from nsa_cp_comm.harness import calibrate
from nsa_cp_comm.harness.calibrate import decide, median_ci, relative_width
from nsa_cp_comm.harness.spec import PointSpec

import calibrate_tasks


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
    results = rank_pool(2).run(calibrate_tasks.calibrated_loop, noisy, 40, timeout_s=30)
    assert all(r.ok for r in results), [r.error for r in results]
    assert [r.value["iters"] for r in results] == [expect_iters] * 2
    assert [r.value["reached"] for r in results] == [reached] * 2


def test_config_accepts_iters_auto_and_names_the_key_otherwise():
    validate_value("iters", "auto")
    cfg = {**vars(MatrixConfig()), "iters": "auto", "results_dir": "/tmp/x"}
    validate(cfg)
    for bad in ("many", 0, 1.5):
        with pytest.raises(ConfigError, match=r"^iters=.*: must be an integer in \[1, 100000\] or auto$"):
            validate_value("iters", bad)
    with pytest.raises(ConfigError, match=r"^timeout_s=30: must be at least 60 with iters=auto"):
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
    assert calibrate.Calibrator(control=None, group=None, device="cpu").time_cap_s == 5.0
    cfg = {**vars(MatrixConfig()), "iters": "auto", "results_dir": "/tmp/x"}
    validate(cfg)
    monkeypatch.setenv(calibrate.TIME_CAP_ENV, "ten")
    with pytest.raises(ConfigError, match=r"^NSA_CP_AUTO_MAX_S='ten': must be seconds"):
        validate(cfg)
    validate({**cfg, "iters": 8})  # read only where iters=auto
    from matrix_cli import run_matrix

    run = run_matrix(tmp_path / "r", "cp_size=2", "hidden_size=64", "iters=auto", multirun=False)
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert run.returncode == 2 and lines == ["error: NSA_CP_AUTO_MAX_S='ten': must be seconds in (0, 30]"], run.stderr
