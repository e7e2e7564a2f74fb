"""A warm rank is checked after every point: a task that destroyed its process
group, changed one of torch's global settings or replaced a torch.distributed
function is found, the pool is closed (the next point gets fresh ranks), and
what a task started on a rank dies with its rank. Every point seeds torch's
RNG from (seed, rank), whatever ran before it."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

import rank_tasks
from matrix.app import budget, point
from matrix.app.config import MatrixConfig
from matrix_cli import live_processes, processes_left
from nsa_cp_comm.harness import RankPool, pools, ranks
from nsa_cp_comm.harness.blame import state_change
from nsa_cp_comm.harness.cpgroup import group_rank_of
from nsa_cp_comm.harness.fold import ImplResult
from nsa_cp_comm.harness.machine import Machine
from nsa_cp_comm.harness.measure import run_point
from nsa_cp_comm.harness.rank_result import RankResult
from nsa_cp_comm.harness.rank_state import STATE_KEY, check_pool
from nsa_cp_comm.harness.spec import PointSpec
from nsa_cp_comm.harness.steps import CONTROL

SMALL = dict(hidden_size=64, dtype="float32", warmup=1, iters=2)
HOSTILE = "tests.hostile_impls"


def _checked_point(pool, impls, seq_lens=(10, 6), **kw):
    """The rows of a small zigzag point of ``impls`` on ``pool``, as a sweep
    gets them: the point run, then the after-point check of its ranks."""
    spec = PointSpec(seq_lens, 2, "zigzag", impls=impls, **{**SMALL, **kw})
    return point._after_point_check(pool, run_point(spec, pool, timeout_s=60), 60)


@pytest.mark.parametrize("how, named", [
    ("intra_threads", "intra-op threads is "),
    ("grad_mode", "grad mode is False (was True)"),
    ("deterministic", "deterministic algorithms is True (was False)"),
    ("deterministic_warn_only", "deterministic algorithms warn-only is True (was False)"),
    ("flush_denormal", "flush-denormal is True (was False)"),
    ("default_dtype", "default dtype is torch.float64 (was torch.float32)"),
    ("default_device", "default device is meta (was cpu)"),
    *[(f"wrap:dist.{name}", f"torch.distributed.{name} is rank_tasks._wrapped.<locals>.wrapped (was torch.")
      for name in ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_single", "reduce_scatter_tensor",
                   "all_reduce", "barrier", "get_rank", "get_world_size", "new_group")],
    *[(f"wrap:c10d.{name}", f"torch.distributed.distributed_c10d.{name} is rank_tasks._wrapped.<locals>.wrapped "
                            f"(was torch.distributed.distributed_c10d.{name})")
      for name in ("all_gather_single", "all_reduce", "_new_group_with_tag")],
    ("wrap:ProcessGroup._allgather_base", "torch.distributed.ProcessGroup._allgather_base is rank_tasks._wrapped."),
    # torch couples these two: setting either sets the other
    ("matmul_precision", "float32 matmul precision is medium (was highest); cuda matmul allow_tf32 is True (was False)"),
    ("backend:cuda.matmul.allow_tf32", "float32 matmul precision is high (was highest); cuda matmul allow_tf32 is "
                                       "True (was False)"),
    ("backend:cudnn.benchmark", "cudnn benchmark is True (was False)"),
    ("backend:cudnn.allow_tf32", "cudnn allow_tf32 is "),
    # the process, not torch: what a plug-in can leave that slows or changes every later point
    ("nice", "niceness is "),
    ("affinity", "CPU affinity is "),
    ("thread", "1 thread started by the point still running ('spinner')"),
    ("env", "NSA_* environment is {NSA_CP_AUTO_MAX_S='0.5'"),
    ("function_mode", "torch function modes is [rank_tasks._state_change.<locals>.Tracing] (was [])"),
    ("dispatch_mode", "torch dispatch modes is 1 (was 0)"),
    ("tensor:zero_", "torch.Tensor.zero_ is rank_tasks._wrapped.<locals>.wrapped (was inherited)"),
    ("tensor:copy_", "torch.Tensor.copy_ is rank_tasks._wrapped.<locals>.wrapped (was inherited)"),
    ("torch:empty", "torch.empty is rank_tasks._wrapped.<locals>.wrapped (was torch._VariableFunctionsClass.empty)"),
    ("wrap:c10d._check_single_tensor", "torch.distributed.distributed_c10d._check_single_tensor is rank_tasks."),
    ("code:nsa_cp_comm.roundtrip.padded_stage", "nsa_cp_comm.roundtrip.padded_stage.__code__ is "),
    ("code:torch.distributed.distributed_c10d._check_single_tensor",
     "torch.distributed.distributed_c10d._check_single_tensor.__code__ is "),
    *[(f"lib:{name}", f"{name} is rank_tasks._wrapped.<locals>.wrapped (was ")
      for name in ("nsa_cp_comm.production.all_gather_into", "nsa_cp_comm.collectives.reduce_scatter_into",
                   "nsa_cp_comm.roundtrip.padded_gather", "nsa_cp_comm.communicator.CPLayerCommunicator.prepare_mlp")],
])
def test_each_recorded_item_changed_by_a_task_is_named(rank_pool, how, named):
    """Each item alone, undone by the same task, so the warm pool stays clean
    (the check's own all-reduce goes through the functions the rank started
    with: a wrapped all_reduce or get_world_size still gives the right answer)."""
    pool = rank_pool(2)
    for r in pool.run(rank_tasks.state_changes_seen, how, timeout_s=60):
        assert r.ok, r.error
        seen, after = r.value
        assert seen.startswith(named) and "; " not in seen.removeprefix(named), seen  # that item, and only it
        assert after == ""


def test_a_warm_pool_passes_and_a_changed_rank_is_found_and_its_pool_closed(rank_pool):
    pool = rank_pool(2)  # warm, as the tests before left it: every task must have left it as it started
    outside = pool.ran_outside_code  # a test before ran a plug-in on it: clean, but closed after the check
    assert check_pool(pool, 60) == ("", "") and pool.alive is not outside
    pool = rank_pool(2)
    assert check_pool(pool, 60) == ("", "") and pool.alive  # no outside code ran on these
    # inter-op threads can be set once per process and never back: this pool is closed anyway
    assert all(r.ok for r in pool.run(rank_tasks.leave_rank_changed, "default_dtype@0", "default_device@1",
                                      "interop_threads", timeout_s=60))
    check, problem = check_pool(pool, 60)
    assert check == "rank_state"
    assert problem.startswith("the point left its ranks changed: global rank 0: inter-op threads is "), problem
    assert "(was " in problem and problem.endswith(
        "); default dtype is torch.float64 (was torch.float32); global rank 1: inter-op threads is "
        f"{problem.split('inter-op threads is ')[1].split(' ')[0]} "
        f"(was {problem.split('(was ')[1].split(')')[0]}); default device is meta (was cpu)"), problem
    assert not pool.alive
    fresh = rank_pool(2)  # what the next point gets: ranks as they started
    assert fresh is not pool and check_pool(fresh, 60) == ("", "")


def test_a_point_is_seeded_from_its_seed_and_rank_whatever_ran_before(rank_pool):
    pool = rank_pool(2)
    spec = PointSpec((10, 6), 2, "zigzag", impls=("padded",), seed=3, **SMALL)
    draws = {noise: [r.value for r in pool.run(rank_tasks.rand_after_point, spec, pool.backend, noise, timeout_s=60)]
             for noise in ("draws", "seed", "none")}
    assert draws["draws"] == draws["seed"] == draws["none"], draws
    assert draws["none"][0] != draws["none"][1]  # the rank is mixed in
    other = PointSpec((10, 6), 2, "zigzag", impls=("padded",), seed=4, **SMALL)
    assert pool.run(rank_tasks.rand_after_point, other, pool.backend, "none", timeout_s=60)[0].value != draws["none"][0]


def test_a_plug_in_that_changes_its_ranks_gets_the_failed_row_and_the_others_are_rerun_on_fresh_ranks(rank_pool):
    """The change is blamed on the implementation after whose step it was
    found: its row is ``failed`` (rank_state) naming the change and the
    ranks; the point's other implementations are rerun on fresh ranks (a
    second culprit among them blamed the same way, a row that fails its own
    check keeps it, an honest one is ok); the changed ranks are closed."""
    pool = rank_pool(2)
    impls = (f"{HOSTILE}:sets_threads", f"{HOSTILE}:wraps_all_gather", "tests.broken_impls:wrong_order", "padded",
             f"{HOSTILE}:sets_matmul_precision", f"{HOSTILE}:slows_library_gather")
    rows = {r.impl: r for r in _checked_point(pool, impls)}
    assert not pool.alive
    assert rows["tests.broken_impls:wrong_order"].failed_check == "gather_rows"
    assert rows["padded"].status == "ok", rows["padded"]
    threads, wraps = rows[impls[0]], rows[impls[1]]
    for row in (threads, wraps):
        assert (row.status, row.failed_check, row.correct, row.stats) == ("failed", "rank_state", None, {}), row
        assert "(found after its checks; ranks numbered as in the CP group): rank 0,1: " in row.reason, row.reason
    found = re.search(r"intra-op threads is (\d+) \(was (\d+)\)", threads.reason)
    assert found and found[1] != found[2], threads.reason
    assert "all_gather_single" not in threads.reason
    # (torch.distributed's own name is one the checks' collective counter swaps
    # and puts back around each checked call: the wrapper under distributed_c10d stays.)
    fn = "torch.distributed.distributed_c10d.all_gather_single"
    assert f"{fn} is tests.hostile_impls._wrap_all_gather.<locals>.traced (was " in wraps.reason
    assert "intra-op threads" not in wraps.reason
    # torch's precision switches, and the project's own functions the built-ins call
    precision, slows = rows[impls[4]], rows[impls[5]]
    for row in (precision, slows):
        assert (row.status, row.failed_check) == ("failed", "rank_state"), row
    assert "float32 matmul precision is medium (was " in precision.reason, precision.reason
    assert ("nsa_cp_comm.production.all_gather_into is tests.hostile_impls._slowing_gather.<locals>.slowed (was "
            "nsa_cp_comm.collectives.all_gather_into)") in slows.reason, slows.reason
    fresh = rank_pool(2)
    ok = _checked_point(fresh, ("padded",))
    assert [r.status for r in ok] == ["ok"] and fresh.alive, ok


def test_a_change_made_in_a_real_timed_turn_is_blamed_on_that_turn_alone(rank_pool):
    """The watch looks after every timed turn: a plug-in that changes its
    ranks in its timed loop only gets the failed row, naming the turn, and
    the point's other implementations are rerun on fresh ranks and pass.
    Without the look after timed turns, only the after-point check sees the
    change, and every row of the point fails, the built-ins' included."""
    impls = (f"{HOSTILE}:changes_in_its_timed_loop", "padded", "legacy")
    rows = {r.impl: r for r in _checked_point(rank_pool(2), impls, iters=4)}
    late = rows[impls[0]]
    assert (late.status, late.failed_check) == ("failed", "rank_state"), late
    assert "found after its turn in iteration " in late.reason and "of the timed loop" in late.reason, late.reason
    assert re.search(r"intra-op threads is (\d+) \(was (\d+)\)", late.reason), late.reason
    assert rows["padded"].status == "ok" and rows["legacy"].status == "ok", (rows["padded"], rows["legacy"])


def test_a_change_made_in_a_timed_turn_is_blamed_on_that_turn():
    """Ranks whose reports say where their state first changed: the earliest
    step over the ranks names the culprit; a change after the A/A control's
    turn is no implementation's."""
    spec = PointSpec((10, 6), 2, "zigzag", impls=("padded", "legacy"), **SMALL)

    def found(impl, seq, what="grad mode is False (was True)"):
        return {STATE_KEY: {"impl": impl, "where": "its turn in iteration 3 of the timed loop", "what": what,
                            "seq": seq}}

    assert state_change(spec, [RankResult(0, "ok", value={}), RankResult(1, "ok", value={})]) is None
    failure = state_change(spec, [RankResult(0, "ok", value=found("legacy", 9)), RankResult(1, "ok", value=found("padded", 12))])
    assert (failure.culprit, failure.failed_check, failure.status) == ("legacy", "rank_state", "failed")
    # named as the CP group numbers its ranks (global rank 0's number there)
    assert f"rank {group_rank_of(0, 2)}: grad mode is False" in failure.reason and "iteration 3" in failure.reason
    assert state_change(spec, [RankResult(0, "ok", value=found(CONTROL, 4))]).culprit == ""


def test_ranks_that_do_not_answer_the_state_check_give_error_rows_not_a_check():
    """A stand-in pool whose state check raised on one rank (the pool then
    closes itself): ``error`` rows without a ``failed_check``, since nothing was
    compared; a row that had already failed keeps its own."""
    class AnswerlessPool:
        alive = True

        def run(self, fn, *args, timeout_s):
            self.alive = False
            return [RankResult(0, "aborted", error="killed after another rank failed"),
                    RankResult(1, "error", error="RuntimeError: no state")]

    results = [ImplResult("padded", "ok", correct=True), ImplResult("x", "failed", failed_check="gather_rows")]
    rows = point._after_point_check(AnswerlessPool(), results, 60)
    assert [(r.status, r.failed_check, r.correct) for r in rows] == [
        ("error", "", None), ("failed", "gather_rows", None)]
    assert rows[0].reason == ("the ranks did not answer a state check after the point "
                              "(rank 1 error: RuntimeError: no state)"), rows[0].reason


def test_a_destroyed_group_is_found_and_a_tasks_helper_process_dies_with_its_rank(pool_workdir):
    helper = f"sleep {900_000 + os.getpid() % 90_000}"  # this test's own: other runs may share the machine
    pool = RankPool(2, workdir=pool_workdir)
    try:
        assert all(r.ok for r in pool.run(rank_tasks.leave_rank_changed, "start_helper", "destroy_group",
                                          helper_s=int(helper.split()[1]), timeout_s=60))
        assert len(live_processes(helper)) == 2
        assert check_pool(pool, 60) == (
            "rank_state", "the point left its ranks changed: global ranks 0,1: its default process group was destroyed")
        assert not pool.alive
    finally:
        pool.close(graceful=False)
    assert processes_left(helper) == {}


def test_a_point_bounds_rank_start_up_by_its_own_key_or_the_machine(monkeypatch, tmp_path):
    """Start-up has its own bound: startup_timeout_s, else the budget's for the
    world on this machine under its load; a timed-out start is retried once."""
    seen = {}

    def fake_pool(*args, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("no ranks here")

    monkeypatch.setattr(pools, "get_pool", fake_pool)
    cfg = {**dataclasses.asdict(MatrixConfig()), "cp_size": 2, "seq_lens": [10], "timeout_s": 7.0,
           "results_dir": str(tmp_path)}
    res = point.resolve(cfg)
    results = point._results_for(cfg, res, tmp_path)
    assert seen["start_timeout_s"] == budget.startup_timeout_s(res) >= budget.STARTUP_MIN_S == 60.0
    assert seen["start_retries"] == 1
    assert {r.status for r in results} == {"error"}
    cfg["startup_timeout_s"] = 100.0
    point._results_for(cfg, res, tmp_path)
    assert seen["start_timeout_s"] == 100.0


def test_the_start_up_bound_grows_with_the_world_and_the_load():
    two_cores = dataclasses.replace(budget.this_machine(), cores=2)
    cfg = {**dataclasses.asdict(MatrixConfig()), "seq_lens": [10], "hidden_size": 64}
    small = point.resolve({**cfg, "cp_size": 2})
    large = point.resolve({**cfg, "cp_size": 8})
    idle = budget.startup_timeout_s(large, two_cores, load=0.0)
    assert budget.startup_timeout_s(small, two_cores, load=0.0) == budget.STARTUP_MIN_S
    assert idle > budget.STARTUP_MIN_S
    assert budget.startup_timeout_s(large, two_cores, load=10.0) == pytest.approx(5 * idle)
    assert isinstance(two_cores, Machine)


def test_a_start_that_times_out_is_retried_and_one_that_fails_is_not(monkeypatch, tmp_path):
    calls = []

    def flaky(kind, fails):
        """From now on no pool is warm, and each start raises ``kind`` until ``fails`` starts have."""
        class Pool:
            alive = True

            def __init__(self, *args, **kwargs):
                calls.append(kind)
                if len(calls) <= fails:
                    raise kind("starting 2 gloo/cpu ranks failed: rank 1 still starting")

            def close(self):
                pass

        calls.clear()
        monkeypatch.setattr(pools, "_POOLS", {})
        monkeypatch.setattr(pools, "RankPool", Pool)

    flaky(ranks.StartTimeout, 1)
    assert pools.get_pool(2, backend="gloo", device="cpu", workdir=tmp_path, start_retries=1).alive
    assert len(calls) == 2
    flaky(ranks.StartTimeout, 2)
    with pytest.raises(ranks.StartTimeout, match=r"tried 2 time\(s\), 5 s each"):
        pools.get_pool(2, backend="gloo", device="cpu", workdir=tmp_path, start_timeout_s=5, start_retries=1)
    flaky(RuntimeError, 1)
    with pytest.raises(RuntimeError):  # a rank that failed to start is not slow: no second try
        pools.get_pool(2, backend="gloo", device="cpu", workdir=tmp_path, start_retries=1)
    assert len(calls) == 1


def _sweep_of_two(workdir, first):
    """Two points as a sweep runs them (ranks from pools.get_pool, the
    after-point check): ``first`` alone, then padded alone. Their rows."""
    rows = []
    try:
        for impls in ((first,), ("padded",)):
            pool = pools.get_pool(2, backend="gloo", device="cpu", workdir=workdir)
            # uneven (651 and 650 rows): padding rows for zero_ to zero
            rows += _checked_point(pool, impls, seq_lens=(1001, 300))
    finally:
        pools.close_pools()
    return rows


def test_a_plug_in_that_breaks_zero_gets_its_own_failed_row_and_the_next_points_padded_is_ok(pool_workdir):
    """Tensor.zero_ broken after the plug-in's own gathers: its row is
    ``failed rank_state`` naming the method; the next point's padded, which
    zeroes its padding rows with it, is ok (before: the plug-in ok, padded
    ``failed padding_zero``)."""
    bad, padded = _sweep_of_two(pool_workdir, f"{HOSTILE}:noop_zero")
    assert (bad.status, bad.failed_check) == ("failed", "rank_state"), bad
    assert "torch.Tensor.zero_ is tests.hostile_impls._noop_zero.<locals>.zero_ (was inherited)" in bad.reason, bad
    assert padded.status == "ok", padded


def test_a_plug_in_that_fools_the_state_check_still_leaves_the_next_point_fresh_ranks(pool_workdir, monkeypatch):
    """The checker broken (the plug-in rewrites the check's record): its row
    is ok, but the next point runs on fresh ranks, so padded is ok; with
    ranks that ran outside code reused (the other guard broken too), the next
    point's padded gets the blame, ``failed padding_zero``."""
    bad, padded = _sweep_of_two(pool_workdir, f"{HOSTILE}:hidden_noop_zero")
    assert bad.status == "ok", bad  # fooled
    assert padded.status == "ok", padded
    monkeypatch.setattr(ranks.RankPool, "ran_outside_code", property(lambda self: False, lambda self, v: None), raising=False)
    bad, padded = _sweep_of_two(pool_workdir, f"{HOSTILE}:hidden_noop_zero")
    assert bad.status == "ok", bad
    assert (padded.status, padded.failed_check) == ("failed", "padding_zero"), padded


@pytest.mark.parametrize("name, named", [
    ("enters_function_mode", "torch function modes is [tests.hostile_impls._traced_gather.<locals>.Tracer] (was [])"),
    ("renices_rank", "niceness is 19 (was "),
    ("leaves_thread_spinning", "1 thread started by the point still running ('hostile-spinner')"),
    ("leaks_env", "NSA_* environment is {NSA_CP_AUTO_MAX_S='0.5'"),
    ("patches_clock", "time.perf_counter"),
    ("lowers_nofile", "RLIMIT_NOFILE is (64, "),
])
def test_a_plug_in_that_leaves_its_process_changed_gets_the_blame_and_padded_beside_it_is_rerun(rank_pool, name, named):
    """A mode entered, a nice level, a spinning thread, an NSA_* variable:
    each is found after the plug-in's own checks; padded, in the same point,
    is rerun on fresh ranks and ok."""
    pool = rank_pool(2)
    bad, padded = _checked_point(pool, (f"{HOSTILE}:{name}", "padded"))
    assert (bad.status, bad.failed_check) == ("failed", "rank_state"), bad
    assert "found after its checks" in bad.reason and named in bad.reason, bad.reason
    assert padded.status == "ok", padded
    assert not pool.alive
