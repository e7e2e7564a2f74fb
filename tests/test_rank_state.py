"""A warm rank is checked after every point: a task that destroyed its process
group or changed a global default is found, the pool is closed (the next point
gets fresh ranks), and what a task started on a rank dies with its rank."""

from __future__ import annotations

import os
import time

import rank_tasks
from matrix_cli import live_processes
from nsa_cp_comm.harness import RankPool
from nsa_cp_comm.harness.rank_state import check_pool


def test_a_warm_pool_passes_and_a_changed_rank_is_found_and_its_pool_closed(rank_pool):
    pool = rank_pool(2)  # warm, as the tests before left it: every task must have left it as it started
    assert check_pool(pool, 60) == "" and pool.alive
    assert all(r.ok for r in pool.run(rank_tasks.leave_rank_changed, "default_dtype@0", "default_device@1",
                                      timeout_s=60))
    problem = check_pool(pool, 60)
    assert problem == ("the point left its ranks changed: rank 0: default dtype is torch.float64 (was torch.float32); "
                       "rank 1: default device is meta (was cpu)"), problem
    assert not pool.alive


def test_a_destroyed_group_is_found_and_a_tasks_helper_process_dies_with_its_rank(pool_workdir):
    helper = f"sleep {900_000 + os.getpid() % 90_000}"  # this test's own: other runs may share the machine
    pool = RankPool(2, workdir=pool_workdir)
    try:
        assert all(r.ok for r in pool.run(rank_tasks.leave_rank_changed, "start_helper", "destroy_group",
                                          helper_s=int(helper.split()[1]), timeout_s=60))
        assert len(live_processes(helper)) == 2
        problem = check_pool(pool, 60)
        assert problem == ("the point left its ranks changed: rank 0: its default process group was destroyed; "
                           "rank 1: its default process group was destroyed"), problem
        assert not pool.alive
    finally:
        pool.close(graceful=False)
    deadline = time.monotonic() + 30
    while live_processes(helper) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_processes(helper) == {}


def test_a_point_bounds_rank_start_up_by_its_timeout(monkeypatch, tmp_path):
    """A rank stopped while starting cost the pool's 180 s whatever timeout_s said."""
    import dataclasses

    from matrix import point
    from matrix.config import MatrixConfig
    from nsa_cp_comm.harness import ranks

    seen = {}

    def fake_pool(*args, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("no ranks here")

    monkeypatch.setattr(ranks, "get_pool", fake_pool)
    cfg = {**dataclasses.asdict(MatrixConfig()), "cp_size": 2, "seq_lens": [10], "timeout_s": 7.0, "results_dir": str(tmp_path)}
    res = point.resolve(cfg)
    results = point._results_for(cfg, res, tmp_path)
    assert seen["start_timeout_s"] == point.START_TIMEOUT_MIN_S == 60.0  # never below a loaded start-up
    assert {r.status for r in results} == {"error"}
    cfg["timeout_s"] = 100.0
    point._results_for(cfg, res, tmp_path)
    assert seen["start_timeout_s"] == 100.0
