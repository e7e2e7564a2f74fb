"""RankPool: tasks on real ranks, and what happens when a rank raises, hangs or dies."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

import rank_tasks
from matrix_cli import live_processes
from orphan_drills import read_text
from nsa_cp_comm.harness import RankPool, RankResult, exits, forkserver, hangs, ranks, run_on_ranks
from nsa_cp_comm.harness.rank_body import rank_device
from nsa_cp_comm.harness.ranks import summarize_failure

# Bounds on how long things take are loose: the suite runs on loaded 2-core
# machines. A bound says "noticed, not waited out" (far below the timeout it
# could otherwise have waited for), never "fast".
NOTICED_WITHIN_S = 60.0


def gone(pid: int) -> bool:
    """True once ``pid`` no longer exists: killed *and* reaped (a zombie still exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def assert_all_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 30.0  # close() reaps before it returns; this is slack for a loaded machine
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
    results = pool.run(rank_tasks.raise_on_last_others_in_collective, timeout_s=600)
    took = time.monotonic() - t0
    assert results[1].status == "error"
    # the error, and where outside the library it was raised
    site = " (raised at tests/rank_tasks.py:"
    assert results[1].error.startswith("KeyError: 'injected failure'" + site), results[1].error
    assert results[1].error.endswith(" in raise_on_last_others_in_collective)"), results[1].error
    assert "raise_on_last_others_in_collective" in results[1].traceback
    # rank 0 was blocked in the all-reduce the failed rank never joined
    assert results[0].status == "aborted", results[0]
    assert summarize_failure(results) == ("error", "rank 1 error: " + results[1].error)
    # far below the 600 s timeout: the grace period after the first failure, then a kill
    assert took < NOTICED_WITHIN_S, took
    assert pool.closed and not pool.alive
    pool.close()  # again: nothing left to do
    assert_all_gone(pids)
    assert not list(pool_workdir.glob(".rendezvous-*")), "rendezvous file left behind"
    with pytest.raises(RuntimeError, match="closed"):
        pool.run(rank_tasks.whoami, "x", timeout_s=5)


def test_hanging_and_stopped_ranks_time_out_promptly_the_stopped_one_is_named_and_all_are_killed(pool_workdir):
    pool = RankPool(3, workdir=pool_workdir)
    pids = pool.pids
    assert pool.run(rank_tasks.whoami, "warm", timeout_s=60)[0].ok
    t0 = time.monotonic()
    results = pool.run(rank_tasks.hang_on_one_and_stop_the_last, timeout_s=4)
    took = time.monotonic() - t0
    assert [r.status for r in results] == ["timeout"] * 3
    assert [r.error for r in results] == ["no answer within 4s", "no answer within 4s", "no answer within 4s (stopped)"]
    assert summarize_failure(results) == ("timeout", "rank 0,1,2 timeout: no answer within 4s; rank 2 never answered: "
                                                     "its process is stopped (SIGSTOP?)")
    assert pool.closed
    assert_all_gone(pids)
    # RankPool.run waits out the timeout, then returns (it does not block on the hung rank)
    assert 4 <= took < 4 + NOTICED_WITHIN_S, f"run() returned after {took:.1f}s"


@pytest.mark.parametrize("fork", ["1", "0"], ids=["forked", "execd"])
def test_rank_exiting_gives_crashed_with_exit_code(pool_workdir, monkeypatch, fork):
    """Read alike from a rank forked from the fork server and an exec'd one."""
    monkeypatch.setenv(forkserver.FORK_ENV, fork)
    monkeypatch.setattr(forkserver, "MAX_SERVERS", len(forkserver.servers()) + 1)
    pool = RankPool(2, workdir=pool_workdir)
    pids, forked = pool.pids, rank_tasks.parent_pid(pool.pids[1]) != os.getpid()
    results = pool.run(rank_tasks.exit_on_last, 17, timeout_s=30)
    assert forked == (fork == "1")
    assert results[0].status == "ok" and results[0].value == 0
    assert results[1].status == "crashed"
    assert results[1].error == "exited with code 17"
    assert summarize_failure(results) == ("error", "rank 1 crashed: exited with code 17")
    assert pool.closed
    assert_all_gone(pids)


def test_run_on_ranks_one_shot_leaves_nothing_running(pool_workdir):
    results = run_on_ranks(rank_tasks.whoami, 2, "one", workdir=pool_workdir, timeout_s=60, extra=1)
    assert [r.value[:4] for r in results] == [(r, 2, "one", 1) for r in range(2)]
    assert_all_gone([r.value[4] for r in results])  # closed politely, and reaped
    assert not list(pool_workdir.glob(".rendezvous-*")), "rendezvous file left behind"


@pytest.mark.parametrize("kwargs,match", [
    *[(dict(world_size=bad), f"world_size={bad}") for bad in (0, True, 2.0)],
    (dict(world_size=2, backend="mpi"), "backend='mpi'"), (dict(world_size=2, device="tpu"), "device='tpu'"),
    *[(dict(world_size=2, start_timeout_s=bad), f"start_timeout_s={bad} must be a positive finite number")
      for bad in (float("nan"), float("inf"), 0, True)],
])
def test_bad_pool_arguments(kwargs, match, tmp_path):
    ws = kwargs.pop("world_size")
    with pytest.raises(ValueError, match=match) as info:
        RankPool(ws, workdir=tmp_path / "w", **kwargs)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "w").exists()  # refused before anything was created


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_pool_without_a_gpu_is_a_one_line_value_error(tmp_path):
    with pytest.raises(ValueError) as info:
        RankPool(2, device="cuda", workdir=tmp_path / "w")
    assert str(info.value) == "device='cuda' needs a CUDA device; torch.cuda.is_available() is False here"
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("timeout_s", [float("nan"), float("inf"), 0, -1.0, "5", True])
def test_run_refuses_a_timeout_that_would_not_end(rank_pool, timeout_s):
    pool = rank_pool(1)
    with pytest.raises(ValueError, match=r"^timeout_s=.* must be a positive finite number of seconds$"):
        pool.run(rank_tasks.whoami, "x", timeout_s=timeout_s)
    assert pool.alive  # nothing was sent


def test_ranks_run_the_worker_by_path(rank_pool):
    """Not ``python -m nsa_cp_comm.harness._worker``, which imports torch before the
    worker can tie its life to its starter's (tests/harness/test_orphans.py)."""
    worker, me = str(ranks.WORKER_PATH).encode(), str(os.getpid()).encode()
    for pid in rank_pool(1).pids:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        # exec'd, or forked from a fork server that was itself run by path (tests/harness/test_forkserver.py)
        assert argv[1] == worker and (argv[2] == me or argv[2:4] == [b"fork-server", me]), argv


def sigkill_on_last() -> int:
    """Rank task: the last rank dies by SIGKILL, as the OOM killer kills."""
    import torch.distributed as dist

    if dist.get_rank() == dist.get_world_size() - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return 0


def test_a_rank_killed_by_the_oom_killer_says_so(rank_pool, monkeypatch):
    """On real ranks: the counter is read as the task starts and again at the
    crash; it rose, so the reason says out of memory."""
    pool = rank_pool(2)
    seen = iter([3, *[4] * 10])  # at the task's start, then at the crash
    monkeypatch.setattr(exits, "oom_kill_count", lambda: next(seen))
    results = pool.run(sigkill_on_last, timeout_s=600)
    assert (results[1].status, results[1].error) == ("crashed", "killed by SIGKILL (out of memory)")
    assert summarize_failure(results) == ("error", "rank 1 crashed: killed by SIGKILL (out of memory)")


@pytest.mark.parametrize("code, before, now, reason", [
    (-signal.SIGKILL, 3, 4, "killed by SIGKILL (out of memory)"),  # the OOM-kill counter rose meanwhile
    (-signal.SIGKILL, 3, 3, "killed by SIGKILL"),  # it did not: someone else's SIGKILL
    (-signal.SIGKILL, None, None, "killed by SIGKILL (out of memory?)"),  # no counter readable here
    (-signal.SIGKILL, 3, None, "killed by SIGKILL (out of memory?)"),  # unreadable at the crash
    (-signal.SIGSEGV, 3, 4, "killed by SIGSEGV"),  # only a SIGKILL is the OOM killer's
    (-200, None, None, "killed by signal 200"),
    (17, 3, 4, "exited with code 17"),
    (None, None, None, "still running"),
])
def test_how_a_rank_ended_is_told_from_its_exit_code_and_the_oom_counter(monkeypatch, code, before, now, reason):
    monkeypatch.setattr(exits, "oom_kill_count", lambda: now)
    assert exits.exit_reason(code, before) == reason


def test_the_oom_kill_counter_is_read_here(tmp_path):
    events = tmp_path / "memory.events"
    events.write_text("low 0\noom 7\noom_kill 3\noom_group_kill 1\n")
    assert exits.read_counter(str(events), "oom_kill") == 3  # its own line, not oom's or oom_group_kill's
    events.write_text("oom 7\n")
    assert exits.read_counter(str(events), "oom_kill") is None
    events.write_text("oom_kill many\n")
    assert exits.read_counter(str(events), "oom_kill") is None
    assert exits.read_counter(str(tmp_path / "missing"), "oom_kill") is None
    n = exits.oom_kill_count()
    if n is None:
        pytest.skip("no OOM-kill counter is readable on this machine")
    # the first candidate file holding the counter, read here by other means
    for path in exits.oom_counter_files():
        found = [line.split()[1] for line in read_text(path).splitlines() if line.split()[:1] == ["oom_kill"]]
        if found:
            assert n == int(found[0]), path
            break
    else:
        pytest.fail(f"oom_kill_count() gave {n}, but no candidate file holds an oom_kill line")


@pytest.mark.skipif(torch.cuda.is_available(), reason="NCCL can start where a GPU is present")
def test_failed_start_raises_and_leaves_no_process(tmp_path):
    with pytest.raises(RuntimeError, match=r"starting 1 nccl/cpu ranks failed: rank 0 error"):
        RankPool(1, backend="nccl", device="cpu", workdir=tmp_path)
    # the rank's command line names its rendezvous file under tmp_path
    assert live_processes(str(tmp_path)) == {}


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


# The parting check's period in the tests of it: the looks and the stack
# request are the same at any period; the default's three looks take 15 s.
QUICK_PARTED_S = 1.0


def test_ranks_that_parted_end_the_task_before_its_bound(pool_workdir, monkeypatch):
    """Each rank waits in a collective at a different place: the task ends once
    that is seen twice, not at its bound; every rank's error says they parted,
    and where it waits is read from the stacks that showed the parting (a rank
    that, asked once more, would not dump in time on a loaded machine, as here,
    leaves it right)."""
    monkeypatch.setattr(hangs, "PARTED_S", QUICK_PARTED_S)
    seen = []
    parted, ask = hangs.TaskWatch.in_collectives, hangs.TaskWatch.ask_stacks

    def parted_once(self, pending):
        seen.append(parted(self, pending))
        return seen[-1]

    def late_after_parting(self, which):
        if not any(seen):
            return ask(self, which)
        for r in which:  # asked, and nothing written yet when the wait ran out
            self.stack_from[r] = hangs.marker_path(self.store_path, r, hangs.STACK_SUFFIX).stat().st_size
        return None

    monkeypatch.setattr(hangs.TaskWatch, "in_collectives", parted_once)
    monkeypatch.setattr(hangs.TaskWatch, "ask_stacks", late_after_parting)
    pool = RankPool(2, workdir=pool_workdir)
    t0 = time.monotonic()
    results = pool.run(rank_tasks.part_in_two_groups, timeout_s=600)
    took = time.monotonic() - t0
    assert any(seen) and [r.status for r in results] == ["timeout"] * 2
    assert all("the ranks parted, each waiting in a collective at a different place" in r.error for r in results)
    assert all(r.waiting.startswith("waiting in torch.distributed.all_reduce") for r in results), results
    assert took < 600 - NOTICED_WITHIN_S, f"run() returned after {took:.1f}s"


def test_a_slow_rank_is_not_parted(rank_pool, monkeypatch):
    """One rank computing at its place while its peer waits at the next one
    for longer than the parting check's period: not waiting in a collective,
    so the task runs to its end."""
    monkeypatch.setattr(hangs, "PARTED_S", QUICK_PARTED_S)
    results = rank_pool(2).run(rank_tasks.slow_rank_then_join, 3 * hangs.PARTED_S, timeout_s=300)
    assert rank_tasks.answered(results) == [2, 2]


def test_parting_is_seen_only_where_every_rank_waits_in_a_collective(monkeypatch):
    """The checker can fail: ranks at one place, a rank not yet in the task, or
    one whose stack is outside torch.distributed are not parted."""
    watch = hangs.TaskWatch("store", [os.getpid()] * 2, 0)
    places = {0: "a", 1: "b"}
    waits = {0: "waiting in torch.distributed.all_reduce, called at x.py:1 in f", 1: "at y.py:2 in g"}
    monkeypatch.setattr(watch, "doing", lambda r: places[r], raising=False)
    monkeypatch.setattr(watch, "ask_stacks", lambda rs: None, raising=False)
    monkeypatch.setattr(watch, "waiting", lambda r: waits[r], raising=False)
    assert watch.idle_apart([0, 1])[0] == ("a", "b")
    assert not watch.in_collectives([0, 1])  # rank 1 is not in a collective
    waits[1] = "waiting in torch.distributed.barrier, called at y.py:3 in g"
    assert watch.in_collectives([0, 1])
    places[1] = "a"
    assert watch.idle_apart([0, 1]) is None  # one place: waiting together
    places[1] = ""
    assert watch.idle_apart([0, 1]) is None  # not yet in the task


def test_ranks_are_apart_only_when_idle_at_the_same_places_on_three_looks():
    """The checker can fail: a rank that used CPU between looks, places that
    moved, or too few looks are not parted."""
    places = ("a", "b")
    idle = [(places, (1.0, 2.0)), (places, (1.01, 2.0)), (places, (1.02, 2.01))]
    assert hangs._still_apart(idle)
    assert not hangs._still_apart(idle[:2])
    assert not hangs._still_apart([*idle[:2], (places, (1.5, 2.01))])  # rank 0 computed
    assert not hangs._still_apart([*idle[:2], (("a", "c"), (1.02, 2.01))])  # rank 1 moved on
    assert not hangs._still_apart([None, *idle[1:]])


def test_a_pool_whose_folder_turned_read_only_closes_without_a_traceback(tmp_path, monkeypatch):
    """A results folder made read-only under the sweep: the pool's rendezvous
    and marker files cannot be removed, and are left there (the sweep ends
    with its own line and resume hint, not a traceback from close)."""
    pool = RankPool(1, backend="gloo", device="cpu", workdir=tmp_path)
    real_unlink = Path.unlink

    def read_only(self, *args, **kwargs):
        if tmp_path in self.parents:
            raise PermissionError(13, "Permission denied", str(self))
        return real_unlink(self, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", read_only)
    pool.close()  # raises here if close lets anything but a missing file through
    assert pool.closed and pool.alive_processes() == 0
