"""RankPool: tasks on real ranks, and what happens when a rank raises, hangs or dies."""

from __future__ import annotations

import os
import time

import pytest
import torch

import rank_tasks
from nsa_cp_comm import RankPool, RankResult, run_on_ranks
from nsa_cp_comm.ranks import FAILURE_GRACE_S, rank_device, summarize_failure


def gone(pid: int) -> bool:
    """True once ``pid`` no longer exists: killed *and* reaped (a zombie still exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def assert_all_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 2.0  # close() reaps before it returns; allow nothing much
    while not all(gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if not gone(p)] == []


def test_task_runs_on_every_rank_and_pool_stays_warm(rank_pool):
    pool = rank_pool(2)
    first = pool.run(rank_tasks.whoami, "a", extra=7, timeout_s=30)
    second = pool.run(rank_tasks.whoami, "b", timeout_s=30)
    assert [r.status for r in first + second] == ["ok"] * 4
    assert all(isinstance(r, RankResult) and r.ok for r in first)
    assert [r.rank for r in first] == [0, 1]
    assert [r.value[:4] for r in first] == [(0, 2, "a", 7), (1, 2, "a", 7)]
    assert [r.value[:4] for r in second] == [(0, 2, "b", 0), (1, 2, "b", 0)]
    # the same processes served both tasks: the pool's own ranks
    assert [r.value[4] for r in first] == [r.value[4] for r in second] == pool.pids
    assert {r.value[5] for r in first} == {"cpu"}
    assert pool.alive and not pool.closed


def test_rank_raising_gives_error_peer_aborted_and_pool_closes(pool_workdir):
    pool = RankPool(2, workdir=pool_workdir)
    pids = pool.pids
    assert pool.run(rank_tasks.whoami, "warm", timeout_s=60)[0].ok  # ranks have imported the tasks
    t0 = time.monotonic()
    results = pool.run(rank_tasks.raise_on_last_others_in_collective, timeout_s=60)
    took = time.monotonic() - t0
    assert results[1].status == "error"
    assert results[1].error == "KeyError: 'injected failure'"
    assert "raise_on_last_others_in_collective" in results[1].traceback
    # rank 0 was blocked in the all-reduce the failed rank never joined
    assert results[0].status == "aborted", results[0]
    assert summarize_failure(results) == ("error", "rank 1 error: KeyError: 'injected failure'")
    # far below the 60 s timeout: the grace period after the first failure, then a
    # kill (not a 5 s polite wait on a rank stuck in the collective)
    assert took < 0.2 + FAILURE_GRACE_S + 2.5, took
    assert pool.closed and not pool.alive
    assert_all_gone(pids)
    with pytest.raises(RuntimeError, match="closed"):
        pool.run(rank_tasks.whoami, "x", timeout_s=5)


def test_hanging_rank_times_out_promptly_and_all_ranks_are_killed(pool_workdir):
    pool = RankPool(2, workdir=pool_workdir)
    pids = pool.pids
    assert pool.run(rank_tasks.whoami, "warm", timeout_s=60)[0].ok
    t0 = time.monotonic()
    results = pool.run(rank_tasks.hang_on_last, timeout_s=2)
    took = time.monotonic() - t0
    assert [r.status for r in results] == ["timeout", "timeout"]
    assert results[1].error == "no answer within 2s"
    assert summarize_failure(results)[0] == "timeout"
    assert pool.closed
    assert_all_gone(pids)
    # RankPool.run: "never blocks past timeout_s (plus FAILURE_GRACE_S)"
    assert took < 2 + FAILURE_GRACE_S + 1.5, f"run() returned after {took:.1f}s"


def test_rank_exiting_gives_crashed_with_exit_code(pool_workdir):
    pool = RankPool(2, workdir=pool_workdir)
    pids = pool.pids
    results = pool.run(rank_tasks.exit_on_last, 17, timeout_s=30)
    assert results[0].status == "ok" and results[0].value == 0
    assert results[1].status == "crashed"
    assert results[1].error == "exited with code 17"
    assert summarize_failure(results) == ("error", "rank 1 crashed: exited with code 17")
    assert pool.closed
    assert_all_gone(pids)


def test_close_is_idempotent_and_reaps(pool_workdir):
    with RankPool(1, workdir=pool_workdir) as pool:
        pids = pool.pids
        assert pool.run(rank_tasks.whoami, "z", timeout_s=30)[0].value[1] == 1
    assert pool.closed
    pool.close()
    assert_all_gone(pids)
    assert not list(pool_workdir.glob(".rendezvous-*")), "rendezvous file left behind"


def test_run_on_ranks_one_shot_leaves_nothing_running(pool_workdir):
    results = run_on_ranks(rank_tasks.whoami, 2, "one", workdir=pool_workdir, timeout_s=60, extra=1)
    assert [r.value[:4] for r in results] == [(r, 2, "one", 1) for r in range(2)]
    assert_all_gone([r.value[4] for r in results])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(world_size=0), "world_size=0"),
        (dict(world_size=True), "world_size=True"),
        (dict(world_size=2.0), "world_size=2.0"),
        (dict(world_size=2, backend="mpi"), "backend='mpi'"),
        (dict(world_size=2, device="tpu"), "device='tpu'"),
    ],
)
def test_bad_pool_arguments(kwargs, match, tmp_path):
    ws = kwargs.pop("world_size")
    with pytest.raises(ValueError, match=match):
        RankPool(ws, workdir=tmp_path, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="NCCL can start where a GPU is present")
def test_failed_start_raises_and_leaves_no_process(tmp_path):
    with pytest.raises(RuntimeError, match=r"starting 1 nccl/cpu ranks failed: rank 0 error"):
        RankPool(1, backend="nccl", device="cpu", workdir=tmp_path)
    # the rank's command line names its rendezvous file under tmp_path
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if str(tmp_path).encode() in cmd:
            left.append(pid)
    assert left == []


def test_rank_device_outside_a_task():
    with pytest.raises(RuntimeError, match="RankPool task"):
        rank_device()


def test_summarize_failure_prefers_the_rank_that_failed_by_itself():
    rs = [RankResult(0, "aborted", error="killed after another rank failed"),
          RankResult(1, "error", error="ValueError: x"), RankResult(2, "ok", value=1)]
    assert summarize_failure(rs) == ("error", "rank 1 error: ValueError: x")
    rs = [RankResult(0, "timeout", error="no answer within 3s"), RankResult(1, "crashed", error="killed by SIGKILL")]
    assert summarize_failure(rs) == ("error", "rank 1 crashed: killed by SIGKILL")
    assert summarize_failure([RankResult(0, "timeout", error="no answer within 3s")]) == (
        "timeout", "rank 0 timeout: no answer within 3s")
    assert summarize_failure([RankResult(0, "ok")]) == ("ok", "")
