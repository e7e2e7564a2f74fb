"""Sweeps given what an adversary would give them: hostile plug-ins, odd
results files, odd working directories, closed pipes and signals. Each ends
in a true row or one line, never a folder that cannot be resumed, a false
verdict, a traceback, a hang or a process left behind. Real CLI runs."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hostile_impls import SESSION_MARK, SLEEP_MARK
from matrix.report import cli as report_cli
from matrix.review import report
from matrix_cli import REPO, cli_env, live_processes, processes_left, run_matrix, sweep_in_background

SMALL = ("cp_size=2", "seq_lens=[1001,300]", "hidden_size=64", "dtype=float32", "warmup=1", "iters=2")
HOSTILE = "tests.hostile_impls"


def test_a_huge_error_message_leaves_a_resumable_folder(tmp_path):
    res = tmp_path / "res"
    run = run_matrix(res, f"impl={HOSTILE}:long_error", *SMALL)
    assert run.returncode == 1, run.stderr[-2000:]
    (row,) = run.rows()
    assert row["status"] == "error" and "[cut: " in row["reason"] and len(row["reason"]) <= 4096
    (kept,) = [json.loads(x) for x in (res / "results.full-text.jsonl").read_text().splitlines()]
    # the whole message kept, before the reason's closing note on rank numbering
    assert kept["column"] == "reason" and kept["chars"] > 229_000 and "E" * 229_000 in kept["text"]
    again = run_matrix(res, f"impl={HOSTILE}:long_error", *SMALL, "resume=true")
    assert again.returncode == 1 and "not CSV" not in again.stderr, again.stderr[-2000:]
    assert len(again.rows()) == 2  # the error point ran again
    assert report_cli.main([str(res), "--out", str(tmp_path / "rep")]) == 1  # the error row: verdict FAIL


@pytest.mark.parametrize("impl, mark", [("spawns_helper", SLEEP_MARK), ("spawns_session_helper", SESSION_MARK)])
def test_a_plug_ins_helper_processes_end_with_its_ranks(tmp_path, impl, mark):
    """A sweep of ``impl``, whose helper processes' command lines hold ``sleep mark``:
    none is left once the sweep ends. A daemon started with start_new_session=True
    (``spawns_session_helper``) leaves the rank's process group: the rank is its
    subreaper and kills its descendants, so it ends too."""
    before = set(live_processes(f"sleep {mark}"))
    run = run_matrix(tmp_path / "res", f"impl={HOSTILE}:{impl}", *SMALL)
    assert run.returncode == 0, run.stderr[-2000:]
    left = processes_left(f"sleep {mark}", but=before)
    assert not left, f"orphaned helper processes: {left}"


def test_a_point_that_changes_its_ranks_gets_the_failure_not_the_next_point(tmp_path):
    run = run_matrix(tmp_path / "res", f"impl={HOSTILE}:sets_float64,legacy", *SMALL)
    rows = {r["impl"]: r for r in run.rows()}
    hostile = rows["sets_float64"]  # the name it declares
    assert (hostile["status"], hostile["failed_check"]) == ("failed", "rank_state"), hostile
    assert "rank 0,1: default dtype is torch.float64 (was torch.float32)" in hostile["reason"]
    assert rows["legacy"]["status"] == "refused", rows["legacy"]  # uneven plan: legacy refuses, on fresh ranks
    assert run.returncode == 1


def test_relative_results_dir_with_hydra_chdir_keeps_every_row_in_one_place(tmp_path):
    sweep = ("hydra.job.chdir=true", "cp_size=1,2", "seq_lens=[10]", "hidden_size=16", "warmup=0", "iters=1")
    run = run_matrix(Path("rel"), *sweep, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("results.csv")) == [Path("rel/results.csv")]
    again = run_matrix(Path("rel"), *sweep, "resume=true", cwd=tmp_path, timeout=300)
    assert again.returncode == 0 and "4 rows" in again.stdout, again.stdout[-2000:]


def test_stdout_into_a_closed_pipe_is_one_line_and_the_rows_are_written(tmp_path):
    res = tmp_path / "res"
    cmd = shlex.join([sys.executable, "-m", "matrix", "-m", f"results_dir={res}", "cp_size=1,2", "seq_lens=[10]",
                      "hidden_size=16", "warmup=0", "iters=1"])
    # The reader is gone before the sweep's first line (it ends at once; the sweep writes after its first
    # point, seconds later): with `head -c 100` a starved head could read only once the sweep had written
    # everything into the pipe's buffer, and no write ever met the closed pipe.
    run = subprocess.run(f"{cmd} | true; exit ${{PIPESTATUS[0]}}", shell=True,
                         executable="/bin/bash", cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert "Traceback" not in run.stderr and "Error" not in run.stderr, run.stderr[-3000:]
    assert run.stderr.strip().splitlines()[-1].startswith("warning: stdout was closed (broken pipe)")
    assert run.returncode == 0
    assert len((res / "results.csv").read_text().splitlines()) == 5


def test_a_job_folder_that_cannot_be_written_is_one_line_with_the_resume_hint(tmp_path):
    res = tmp_path / "res"
    res.mkdir()
    (res / "hydra").write_text("")  # Hydra cannot make its folders there
    run = run_matrix(res, "cp_size=1", "seq_lens=[10]", "hidden_size=16", "warmup=0", "iters=1")
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert "Traceback" not in run.stderr and lines[-1].startswith("error: "), run.stderr[-3000:]
    assert "hydra" in lines[-1] and "finish the sweep with: python -m matrix" in lines[-1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_say_what_was_running_and_how_to_resume(tmp_path, sig):
    res = tmp_path / "res"
    proc = sweep_in_background(res)
    time.sleep(1.0)
    proc.send_signal(sig)  # the sweep alone, as a service manager or a closing terminal does
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, (out[-2000:], err[-2000:])
    assert "Traceback" not in err, err[-3000:]
    last = [ln for ln in err.splitlines() if ln.strip()][-1]
    assert last.startswith(f"{signal.Signals(sig).name}; finish the sweep with: python -m matrix"), last
    assert shlex.split(last.split(": ", 1)[1])[-1] == "resume=true"
    # exec'd ranks name the results folder; a fork server and the ranks it forked name the sweep
    server = f"_worker.py fork-server {proc.pid} "
    assert processes_left(str(res), server) == {}


def test_a_plug_ins_exit_handler_that_never_returns_does_not_hang_the_sweep(tmp_path):
    """The plug-in's atexit handler blocks forever (registered in the sweep's
    own process, which imports it): the sweep ends after its summary, the
    handlers bounded, with the sweep's exit status."""
    run = run_matrix(tmp_path / "res", "impl=tests.hostile_exit:hangs_at_exit", *SMALL)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "exit handlers still running after 10s" in run.stderr, run.stderr[-2000:]


def test_a_switch_that_is_not_a_boolean_is_one_line_before_anything_runs(tmp_path):
    run = run_matrix(tmp_path / "res", *SMALL, env=cli_env(NSA_CP_COMM_FORK_RANKS="sometimes"), timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.strip() == ("error: NSA_CP_COMM_FORK_RANKS='sometimes': must be one of 0, false, no, off (off) "
                                  "or 1, true, yes, on (on)"), run.stderr
    assert not (tmp_path / "res").exists()
