"""No rank process outlives the process that started it, whenever that one dies.

The sweep may be killed at any moment, also while its ranks are starting
(importing torch, waiting in the rendezvous). The kill drill holds the ranks
of a sweep-like driver at fixed points of their start-up, kills the driver
with SIGKILL and sees how each rank ended; the other tests interrupt a start
in-process and drop a rank that waits in the rendezvous, and find them gone.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import rank_tasks
from matrix_cli import live_processes, processes_left, run_python
from orphan_drills import (DEATH_SIGNAL_S, START_S, _driver_env, _read_line, _reap, end_drill, frozen, mutated_worker,
                           read_text, start_interrupted, start_reaper, stop, wait_for)
from nsa_cp_comm.harness import RankPool, ranks
from nsa_cp_comm.harness._worker import ORPHAN_EXIT
from nsa_cp_comm.harness.ranks import WORKER_PATH
from nsa_cp_comm.harness.rendezvous import STORE_PREFIX, remove_stale_stores

# How long a rank may take to notice that its starter is gone. With the death
# signal armed from the first statements it is milliseconds; the bound is
# generous for a loaded 2-core machine (a rank that had not yet reached those
# statements must first finish starting the interpreter).
GONE_WITHIN_S = 30.0

# A sweep-like driver: torch loaded, 3 ranks started through the drill's gate.
DRIVER = """\
import os, sys, time
from nsa_cp_comm.harness import RankPool  # torch is loaded, as in a sweep
sys.executable = os.environ["DRILL_WRAPPER"]  # each rank's interpreter starts through the gate
RankPool(3, backend="gloo", device="cpu", workdir=sys.argv[1])
print("ready", flush=True)
time.sleep(600)
"""

# What RankPool starts as a rank's interpreter ($1 the worker, $3 the rank): it
# records its pid; rank $DRILL_HOLD waits there, started but not yet running
# the worker's first statement, until the drill says go. Then the interpreter
# replaces it (same pid, same parent).
GATE = """\
#!/bin/sh
echo $$ > "$DRILL/rank$3.tmp" && mv "$DRILL/rank$3.tmp" "$DRILL/rank$3.pid"
if [ "$3" = "$DRILL_HOLD" ]; then
  while [ ! -e "$DRILL/go" ]; do sleep 0.01; done
fi
worker=$1
shift
exec "$DRILL_PYTHON" "${DRILL_WORKER:-$worker}" "$@"
"""


def _thread_names(pid: int) -> list[str]:
    return [read_text(t / "comm").strip() for t in Path(f"/proc/{pid}/task").glob("*")]


def kill_drill(tmp_path: Path, worker: Path | None = None) -> dict[int, int | None]:
    """Hold a driver's 3 starting ranks at fixed points, SIGKILL the driver,
    and return each rank's exit code (-9: SIGKILL) or None if it lives on:

    * rank 0 in the rendezvous (its store written, gloo's connection thread
      up, waiting for its peers), stopped there;
    * rank 1 past the worker's first statements (the death signal armed),
      loading torch, stopped there;
    * rank 2 started but before the worker's first statement: it runs only
      once the driver is dead.

    A stopped rank can only be ended by the kernel (SIGKILL reaches a stopped
    process; its pipe watcher cannot run): the death signal is all that ends
    ranks 0 and 1. Rank 2 arms it too late; its parent check must end it.
    ``worker``: a worker file to run instead of the real one."""
    gate, work = tmp_path / "gate", tmp_path / "work"
    gate.mkdir()
    work.mkdir()
    for name, text in (("driver.py", DRIVER), ("rank-python", GATE)):
        (tmp_path / name).write_text(text)
    (tmp_path / "rank-python").chmod(0o755)
    # The exec path's drill (CUDA ranks take it; tests/harness/test_forkserver.py drills the fork path)
    env = dict(_driver_env(), NSA_CP_COMM_FORK_RANKS="0", DRILL=str(gate), DRILL_HOLD="2", DRILL_PYTHON=sys.executable,
               DRILL_WRAPPER=str(tmp_path / "rank-python"), **({"DRILL_WORKER": str(worker)} if worker else {}))
    reaper = start_reaper(tmp_path, env, str(work))
    ended: dict[int, int] = {}
    said: list[str] = []
    pids: dict[int, int] = {}
    driver = 0
    try:
        driver = int(_read_line(reaper, START_S) or 0)
        assert driver, "the drill's driver did not start"
        pids = {r: int(wait_for(f"rank {r} start", lambda r=r: read_text(gate / f"rank{r}.pid"))) for r in range(3)}
        wait_for("rank 1 load torch", lambda: "/torch/" in read_text(f"/proc/{pids[1]}/maps"))
        stop(pids[1])
        wait_for("rank 0 in the rendezvous", lambda: any(work.glob(f"{STORE_PREFIX}*"))
                 and "gloo_tcp_loop" in _thread_names(pids[0]))
        stop(pids[0])
        os.kill(driver, signal.SIGKILL)
        _reap(reaper, ended, said, {driver, pids[0], pids[1]}, DEATH_SIGNAL_S,
              settled=lambda: driver in ended and frozen((pids[0], pids[1]), ended, reaper.pid))
        (gate / "go").touch()
        _reap(reaper, ended, said, {pids[2]}, START_S)  # a broken worker's rank 2 loads torch first
        assert "ready" not in said, "the pool finished starting: the drill held no rank"
        assert ended.get(driver) == -signal.SIGKILL, (driver, ended)
    finally:
        (gate / "go").touch()
        end_drill(reaper, [driver, *pids.values()], ended)  # a broken worker's ranks outlive it
    return {r: ended.get(pid) for r, pid in pids.items()}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("guard, unguarded, ends", [
    # ranks in the rendezvous and loading torch die by the death signal with
    # their driver; a rank not yet running exits with ORPHAN_EXIT as it starts,
    # before importing anything
    (None, None, {0: -signal.SIGKILL, 1: -signal.SIGKILL, 2: ORPHAN_EXIT}),
    # no death signal: the stopped ranks outlive their driver
    ("libc.prctl(1, 9)", "pass", {0: None, 1: None, 2: ORPHAN_EXIT}),
    # no parent check: rank 2 runs on, loads torch, and only its pipe's end stops it
    ("if os.getppid() != starter_pid:", "if False:", {0: -signal.SIGKILL, 1: -signal.SIGKILL, 2: 1}),
], ids=["intact", "no_death_signal", "no_parent_check"])
def test_sigkill_of_the_starter_at_fixed_points_of_rank_start_up_leaves_no_rank(tmp_path, guard, unguarded, ends):
    """The drill can fail: a worker without one of its guards changes how the
    ranks that guard ends end. None is left either way (the drill ends the
    survivors)."""
    assert kill_drill(tmp_path, mutated_worker(tmp_path, guard, unguarded)) == ends
    assert processes_left(str(tmp_path / "work"), timeout_s=GONE_WITHIN_S) == {}


def test_a_rank_whose_starter_is_not_its_parent_exits_before_importing_anything_heavy(tmp_path):
    """The race the death signal cannot see: the starter died before the rank
    armed it (the rank then has another parent). The rank exits at once, with
    ORPHAN_EXIT, having imported neither torch nor the package."""
    run = run_python("-X", "importtime", str(WORKER_PATH), "1", "0", "2", "gloo", "cpu", str(tmp_path / "store"), "0",
                     "1", env=_driver_env(), timeout=120)
    assert run.returncode == ORPHAN_EXIT, run.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if "|" in line]
    assert imported and not any(m.split(".")[0] in ("torch", "nsa_cp_comm", "numpy") for m in imported), imported
    assert not (tmp_path / "store").exists()


def test_an_interrupted_start_kills_the_started_ranks_and_removes_the_rendezvous(tmp_path, monkeypatch):
    monkeypatch.setenv("NSA_CP_COMM_FORK_RANKS", "0")  # exec'd ranks: still importing torch at the interrupt
    start_interrupted(tmp_path, 0.5)
    assert processes_left(str(tmp_path), timeout_s=5.0) == {}
    assert list(tmp_path.glob(f"{STORE_PREFIX}*")) == []


def test_an_abandoned_rank_exits_when_its_pipe_closes(tmp_path):
    """A rank waiting in the rendezvous whose starter dropped it (its pipe
    closed) without killing it, e.g. interrupted between starting it and
    recording it, exits by itself."""
    ours, theirs = socket.socketpair()
    args = [sys.executable, str(WORKER_PATH), str(os.getpid()), "0", "2", "gloo", "cpu",
            str(tmp_path / "store"), str(theirs.fileno()), "1"]
    proc = subprocess.Popen(args, env=_driver_env(), pass_fds=(theirs.fileno(),))
    theirs.close()
    try:
        wait_for("the rank in the rendezvous, waiting for rank 1", (tmp_path / "store").exists, 120)
        assert proc.poll() is None
        ours.close()
        assert proc.wait(timeout=GONE_WITHIN_S) == 1
    finally:
        proc.kill()
        proc.wait()


def test_stale_rendezvous_files_of_dead_starters_are_removed(tmp_path):
    host = socket.gethostname()
    dead = tmp_path / f"{STORE_PREFIX}{host}-999999999-abc"  # no such pid (above pid_max)
    live = tmp_path / f"{STORE_PREFIX}{host}-{os.getpid()}-def"
    other_host = tmp_path / f"{STORE_PREFIX}elsewhere-999999999-abc"
    legacy = tmp_path / f"{STORE_PREFIX}0123456789abcdef"
    for p in (dead, live, other_host, legacy):
        p.write_text("")
    assert remove_stale_stores(tmp_path) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (live, other_host, legacy))
    # A pool started in the directory clears them too, and leaves none of its own.
    live.unlink()
    dead.write_text("")
    with RankPool(1, workdir=tmp_path) as pool:
        assert pool.alive
        assert not dead.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (other_host, legacy))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreapers are Linux's")
@pytest.mark.parametrize("subreaper", [True, False], ids=["subreaper", "no_subreaper"])
def test_a_daemon_a_task_started_dies_with_its_ranks_only_where_the_rank_is_its_subreaper(
        tmp_path, monkeypatch, subreaper):
    """A task daemonizes a sleep (new session, its parent gone): handed to the
    rank, a child subreaper, it is in the rank's tree and killed with the
    pool. The drill can fail: with a worker that does not become a subreaper
    the daemon goes to init and outlives the pool."""
    # this case's own while this process lives: xdist workers' pids are often adjacent, and
    # pid % N + (0 | 1) let one worker's subreaper case match (and kill) another's daemons
    seconds = 10_000_000 + 2 * os.getpid() + (0 if subreaper else 1)
    if not subreaper:
        monkeypatch.setattr(ranks, "WORKER_PATH", mutated_worker(tmp_path, "libc.prctl(36, 1, 0, 0, 0)"))
    monkeypatch.setenv("NSA_CP_COMM_FORK_RANKS", "0")  # exec'd ranks: the worker file is the one run
    try:
        with RankPool(2, workdir=tmp_path / "work") as pool:
            assert all(r.ok for r in pool.run(rank_tasks.daemonize_sleep, seconds, timeout_s=60))
            wait_for("both daemons", lambda: len(live_processes(f"sleep {seconds}")) >= 2, 30)
            assert len(live_processes(f"sleep {seconds}")) == 2
            rank_pids = set(pool.pids)
        if subreaper:
            assert processes_left(f"sleep {seconds}") == {}
        else:
            # Closing the pool killed what the ranks' trees held, before it
            # returned: daemons outside them, adopted by neither rank, are
            # left for good (no later step of the pool could reach them).
            left = live_processes(f"sleep {seconds}")
            assert len(left) == 2 and not {rank_tasks.parent_pid(pid) for pid in left} & rank_pids, left
    finally:
        for pid in live_processes(f"sleep {seconds}"):
            os.kill(pid, signal.SIGKILL)
