"""The main job as a user meets it first: one results folder per sweep, an exit
status that means something, and the app's own --help."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta

from matrix.app.sweep import freeze_now, main
from matrix.app.preflight import points

from matrix_cli import REPO, run_matrix, run_python
from matrix.store.runs import SCHEMA_VERSION

SMALL = ("hidden_size=32", "dtype=float32", "warmup=0", "iters=2")

# A clock that moves one second at every reading: each point, each job and the
# summary would see another second without a sweep-wide timestamp.
TICKING = textwrap.dedent("""
    import datetime as _dt, runpy
    class _Ticking(_dt.datetime):
        _t = _dt.datetime(2026, 1, 2, 3, 4, 5)
        @classmethod
        def now(cls, tz=None):
            cls._t += _dt.timedelta(seconds=1)
            return cls._t if tz is None else cls._t.replace(tzinfo=tz)
    _dt.datetime = _Ticking  # before Hydra or the matrix import it
    runpy.run_module("matrix", run_name="__main__", alter_sys=True)
""")

def test_preflight_resolves_every_point_to_one_results_folder(monkeypatch):
    class Ticking(datetime):
        t = datetime(2026, 1, 2, 3, 4, 5)

        @classmethod
        def now(cls, tz=None):
            cls.t += timedelta(seconds=1)
            return cls.t

    import hydra.core.utils

    monkeypatch.setattr(hydra.core.utils, "datetime", Ticking)
    monkeypatch.setattr("matrix.app.preflight.datetime", Ticking)
    dirs = {cfg["results_dir"] for cfg, _ in points(["-m", "cp_size=1,2,4", "seq_lens=[8],[9]"])}
    assert len(dirs) == 1, dirs


def test_now_on_the_command_line_is_written_out_once():
    start = datetime(2026, 1, 2, 3, 4, 5)
    assert freeze_now(["results_dir=r/${now:%H%M%S}-x", "cp_size=2"], start) == ["results_dir=r/030405-x", "cp_size=2"]


def test_a_sweep_straddling_seconds_writes_one_folder_and_exits_0(tmp_path):
    """No results_dir given: the default, timestamped one, with a clock that
    ticks at every reading."""
    proc = run_python("-c", TICKING, "-m", "cp_size=1", "seq_lens=[8],[9],[10]", *SMALL, cwd=tmp_path)
    folders = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert len(folders) == 1, folders
    assert "missing" not in proc.stdout.split("matrix summary:")[1].splitlines()[0] or " missing 0" in proc.stdout
    assert f"results/{folders[0]}/results.csv" in proc.stdout
    # one process, one run: its metadata once, named by every row
    folder = tmp_path / "results" / folders[0]
    lines = [json.loads(x) for x in (folder / "runs.jsonl").read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["schema_version"] == SCHEMA_VERSION, lines
    assert lines[0]["torch_version"] and lines[0]["host"] and "seq_lens=[8],[9],[10]" in lines[0]["command"]
    with (folder / "results.csv").open(newline="") as f:
        ids = [r["run_id"] for r in csv.DictReader(f)]
    assert len(ids) == 6 and set(ids) == {lines[0]["run_id"]}  # 3 points x padded, legacy


def test_a_sweep_that_checks_nothing_exits_5_with_one_line(tmp_path):
    run = run_matrix(tmp_path / "res", "cp_size=1", "seq_lens=[8]", "mlp_mode=SCATTERED", *SMALL)
    assert run.returncode == 5, run.stdout + run.stderr
    why = [ln for ln in run.stderr.splitlines() if ln.startswith("error: nothing was checked")]
    assert len(why) == 1 and "skipped" in why[0]
    assert {r["status"] for r in run.rows()} == {"skipped"}


# Counts Hydra's job composes: the sweeper's check of a batch and the
# launcher's compose of each job both go through load_sweep_config.
COUNTING = textwrap.dedent("""
    import atexit, runpy, sys
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    _load, _n = ConfigLoaderImpl.load_sweep_config, [0]
    def _counted(self, *a, **k):
        _n[0] += 1
        return _load(self, *a, **k)
    ConfigLoaderImpl.load_sweep_config = _counted
    atexit.register(lambda: print(f"composes: {_n[0]}", file=sys.stderr))
    runpy.run_module("matrix", run_name="__main__", alter_sys=True)
""")


def test_a_sweep_with_checked_rows_exits_0_and_composes_each_choice_of_groups_once(tmp_path):
    """Points with the mode their backend implies: checked, so exit 0. Preflight
    composed every job before the sweep; Hydra's launcher composes the first
    once more, as it starts, not twice, and the second (another seq_lens
    only) from a copy of the first's (preflight.composed_once)."""
    run = run_python("-c", COUNTING, "-m", "cp_size=1", "seq_lens=[8],[9]", "mlp_mode=FULL",
                     f"results_dir={tmp_path / 'res'}", *SMALL)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "nothing was checked" not in run.stderr
    assert "composes: 1" in run.stderr.splitlines(), run.stderr[-2000:]


def test_help_is_the_apps_own(tmp_path, monkeypatch, capsys):
    """Every key with its meaning and range, the presets with the + form, the
    layouts; exit 0 and nothing written. (In-process: the README's
    `python -m matrix --help` runs as a command in the slow set.)"""
    from matrix.app.config import KEYS
    from matrix.app.config import MEANING

    assert set(MEANING) == set(KEYS), "a schema key without a meaning in matrix/app/config.py"
    monkeypatch.chdir(tmp_path)
    code = main(["--help"])
    proc = subprocess.CompletedProcess([], code, capsys.readouterr().out, "")
    assert proc.returncode == 0 and not list(tmp_path.iterdir())
    for key in KEYS:
        assert f"\n  {key} " in proc.stdout, key
    for preset in (REPO / "conf" / "matrix").glob("*.yaml"):
        assert f"+matrix={preset.stem}" in proc.stdout
    for layout in (REPO / "conf" / "layout").glob("*.yaml"):
        assert f"+layout={layout.stem}" in proc.stdout
    assert "int in [1, 1024]" in proc.stdout  # cp_size's range, from the validation tables
    # the installed commands throughout, the checkout's module form named once
    assert proc.stdout.startswith("nsa-cp-matrix: ") and proc.stdout.count("python -m matrix") == 1
    assert "\n  nsa-cp-matrix +matrix=NAME " in proc.stdout and "review: nsa-cp-matrix-report " in proc.stdout


def test_a_local_sweep_is_checked_against_the_machine_once(tmp_path, monkeypatch):
    """Preflight checks the whole sweep before any rank starts; its jobs, run
    here by the local launcher, do not check again mid-sweep."""
    from matrix.app import budget, point, guards

    checked = []
    monkeypatch.setattr(budget, "check_sweep", lambda points, *, runs_here, machine=None: checked.append(len(points)))
    monkeypatch.setattr(point, "_results_for", lambda cfg, res, job_dir: point.every_impl(res, "ok", ""))
    monkeypatch.setattr(guards, "install", lambda: None)  # pytest's own handlers and stdout stay
    monkeypatch.setattr(guards, "guard", lambda: None)
    monkeypatch.setattr(sys, "argv", ["matrix"])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    monkeypatch.chdir(tmp_path)
    assert main(["-m", "cp_size=1", "seq_lens=[8],[9]", *SMALL, f"results_dir={tmp_path / 'res'}"]) == 0
    assert checked == [2]
