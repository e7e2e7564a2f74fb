"""No rank process outlives the process that started it, whenever that one dies.

The sweep may be killed at any moment, also while its ranks are starting
(importing torch, waiting in the rendezvous). These tests kill a sweep-like
driver with SIGKILL at random moments of its pool's start-up and find no rank
left, and interrupt a start in-process and find it torn down.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from matrix_cli import live_processes
from nsa_cp_comm.harness import RankPool
from nsa_cp_comm.harness._worker import ORPHAN_EXIT
from nsa_cp_comm.harness.ranks import STORE_PREFIX, WORKER_PATH, remove_stale_stores

REPO = Path(__file__).resolve().parent.parent
# How long a rank may take to notice that its starter is gone. With the death
# signal armed from the first statements it is milliseconds; the bound is
# generous for a loaded 2-core machine (a rank that had not yet reached those
# statements must first finish starting the interpreter).
GONE_WITHIN_S = 30.0

DRIVER = """\
import sys, time
from nsa_cp_comm.harness import RankPool  # torch is loaded, as in a sweep
print("starting", flush=True)
RankPool(4, backend="gloo", device="cpu", workdir=sys.argv[1])
print("ready", flush=True)
time.sleep(600)
"""


def live_processes_mentioning(text: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains ``text``."""
    return list(live_processes(text))


def wait_until_gone(text: str, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := live_processes_mentioning(text)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _driver_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return proc.stdout.readline().decode().strip() if ready else ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_sigkill_of_the_starter_at_random_moments_of_rank_start_up_leaves_no_rank(tmp_path):
    """20 drivers, each killed (SIGKILL) a random time after it begins starting
    4 ranks: early (inside the spawn loop and the ranks' interpreter start-up)
    or anywhere in the window in which the ranks import torch and rendezvous.
    Every rank is gone within GONE_WITHIN_S of its driver's death."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    seed = int(os.environ.get("ORPHAN_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    caught_mid_start = 0
    for trial in range(20):
        work = tmp_path / f"w{trial}"
        work.mkdir()
        proc = subprocess.Popen([sys.executable, str(script), str(work)], cwd=REPO, env=_driver_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            assert _read_line(proc, 120) == "starting", f"driver did not start (seed {seed})"
            delay = rng.uniform(0, 0.3) if rng.random() < 0.4 else rng.uniform(0, 6.0)
            time.sleep(delay)
            ranks_at_kill = [p for p in live_processes_mentioning(str(work)) if p != proc.pid]
            ready = bool(select.select([proc.stdout], [], [], 0)[0])
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        if ranks_at_kill and not ready:
            caught_mid_start += 1
        left = wait_until_gone(str(work), GONE_WITHIN_S)
        assert left == [], f"trial {trial} (seed {seed}, kill after {delay:.2f}s): ranks {left} outlived their starter"
    # The kills must have landed while ranks were starting, or the test proves nothing.
    assert caught_mid_start >= 3, f"only {caught_mid_start} of 20 kills hit a starting pool (seed {seed})"


def test_a_rank_whose_starter_is_not_its_parent_exits_before_importing_anything_heavy(tmp_path):
    """The race the death signal cannot see: the starter died before the rank
    armed it (the rank then has another parent). The rank exits at once, with
    ORPHAN_EXIT, having imported neither torch nor the package."""
    args = [sys.executable, "-X", "importtime", str(WORKER_PATH), "1", "0", "2", "gloo", "cpu",
            str(tmp_path / "store"), "0", "1"]
    run = subprocess.run(args, env=_driver_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == ORPHAN_EXIT, run.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if "|" in line]
    assert imported and not any(m.split(".")[0] in ("torch", "nsa_cp_comm", "numpy") for m in imported), imported
    assert not (tmp_path / "store").exists()


class Interrupt(BaseException):
    """Stands for a KeyboardInterrupt arriving while ranks start."""


def test_an_interrupted_start_kills_the_started_ranks_and_removes_the_rendezvous(tmp_path):
    def interrupt(signum, frame):
        raise Interrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)  # the ranks are still importing torch then
    try:
        with pytest.raises(Interrupt):
            RankPool(2, workdir=tmp_path)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert wait_until_gone(str(tmp_path), 5.0) == []
    assert list(tmp_path.glob(f"{STORE_PREFIX}*")) == []


def test_an_abandoned_rank_exits_when_its_pipe_closes(tmp_path):
    """A rank waiting in the rendezvous whose starter dropped it (its pipe
    closed) without killing it, e.g. interrupted between starting it and
    recording it, exits by itself."""
    import socket

    ours, theirs = socket.socketpair()
    args = [sys.executable, str(WORKER_PATH), str(os.getpid()), "0", "2", "gloo", "cpu",
            str(tmp_path / "store"), str(theirs.fileno()), "1"]
    proc = subprocess.Popen(args, env=_driver_env(), pass_fds=(theirs.fileno(),))
    theirs.close()
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "store").exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # the rank is in the rendezvous, waiting for rank 1
        assert proc.poll() is None
        ours.close()
        assert proc.wait(timeout=GONE_WITHIN_S) == 1
    finally:
        proc.kill()
        proc.wait()


def test_stale_rendezvous_files_of_dead_starters_are_removed(tmp_path):
    import socket

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
