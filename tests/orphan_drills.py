"""Parts of the kill drills: a reaper that reports how each process it
adopted ended, the driver's environment, a file read as a drill reads it,
a worker with one of its guards removed, and a rank start interrupted
in-process."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from matrix_cli import REPO, cli_env
from nsa_cp_comm.harness import RankPool
from nsa_cp_comm.harness.ranks import WORKER_PATH

# Bounds of the drills: a rank's start-up on a loaded machine, and the time
# the kernel's death signal gets to end a rank (it is sent as the driver dies).
START_S = 180.0
DEATH_SIGNAL_S = 10.0
# Two looks this far apart that find the drill's processes :func:`frozen`:
# their states cannot change any more (a parent dying hands over its children
# and sends their death signals under one kernel lock, far shorter than this).
_SETTLE_S = 0.2

# Starts the driver and reaps, as the subreaper, the driver and every rank it
# orphans: one line "PID EXITCODE" per process that ended (-N: signal N).
REAPER = """\
import ctypes, os, subprocess, sys
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
driver = subprocess.Popen(sys.argv[1:])
print(driver.pid, flush=True)
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        break
    print(pid, os.waitstatus_to_exitcode(status), flush=True)
"""


def _driver_env() -> dict[str, str]:
    return cli_env(OMP_NUM_THREADS="1")


def start_reaper(tmp_path: Path, env: dict[str, str], *driver_args: str) -> subprocess.Popen:
    """``tmp_path/driver.py driver_args`` started by :data:`REAPER` (written to
    ``tmp_path/reaper.py``); the reaper's lines are its stdout."""
    (tmp_path / "reaper.py").write_text(REAPER)
    return subprocess.Popen([sys.executable, str(tmp_path / "reaper.py"), sys.executable, str(tmp_path / "driver.py"),
                             *driver_args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def end_drill(reaper: subprocess.Popen, pids: Iterable[int], ended: dict[int, int]) -> None:
    """SIGKILL what outlived the drill (each of ``pids`` not in ``ended``), then
    the reaper: its own children go with it."""
    for pid in pids:
        if pid and pid not in ended:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    reaper.kill()
    reaper.wait()


def read_text(path: Path | str) -> str:
    """The text of ``path``; "" where it cannot be read (not written yet, or its process gone)."""
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def mutated_worker(tmp_path: Path, guard: str | None, replacement: str = "pass") -> Path | None:
    """A copy of the rank worker with ``guard`` replaced, for a drill that must
    then fail; None (the real worker) where ``guard`` is None."""
    if guard is None:
        return None
    source = WORKER_PATH.read_text()
    assert guard in source, f"the worker no longer says {guard!r}: update this mutation"
    worker = tmp_path / "mutated_worker.py"
    worker.write_text(source.replace(guard, replacement))
    return worker


def stop(pid: int, timeout_s: float = 60.0) -> None:
    """SIGSTOP ``pid`` and wait until the kernel shows it stopped: kill() returns
    before the stop takes hold, and a rank whose driver is killed in that window
    may still run (the kill drill saw rank 0 exit 1 instead of ending stopped)."""
    os.kill(pid, signal.SIGSTOP)
    wait_for(f"pid {pid} stop", lambda: read_text(f"/proc/{pid}/stat").rpartition(")")[2].split()[:1] == ["T"],
             timeout_s)


def wait_for(what: str, condition, timeout_s: float = START_S):
    """The first true value of ``condition()``, polled for up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        assert time.monotonic() < deadline, f"the drill never saw {what}"
        time.sleep(0.01)
    return found


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return proc.stdout.readline().decode().strip() if ready else ""


# SIGKILL's bit in /proc/PID/status's pending-signal masks.
_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


def _status(pid: int) -> dict[str, str]:
    """``/proc/PID/status`` as ``{field: value}``; {} where the process is gone."""
    return dict(line.split(":", 1) for line in read_text(f"/proc/{pid}/status").splitlines() if ":" in line)


def frozen(pids: Iterable[int], ended: dict[int, int], outside: int) -> bool:
    """Whether nothing can end any of ``pids`` that has not ``ended`` any more:
    each is stopped (it cannot act), has no SIGKILL pending, and its parent is
    ``outside`` (the reaper, which outlives the drill) or one of them, itself
    frozen. A parent's death signals are sent before it can be reaped, and
    none is pending: a drill waiting for deaths that never come can stop
    waiting here instead of at its bound."""
    live = [p for p in pids if p not in ended]
    for pid in live:
        status = _status(pid)
        pending = int(status.get("SigPnd", "0"), 16) | int(status.get("ShdPnd", "0"), 16)
        parent = int(status.get("PPid", "0") or 0)
        if not status.get("State", "").strip().startswith("T") or pending & _SIGKILL_BIT:
            return False
        if parent != outside and parent not in live:
            return False
    return True


def _reap(reaper: subprocess.Popen, ended: dict[int, int], said: list[str], pids: set[int], timeout_s: float,
          settled=lambda: False) -> None:
    """Read the reaper's lines into ``ended`` until every pid in ``pids`` ended,
    ``settled()`` holds twice in a row (``_SETTLE_S`` apart: no end can come
    any more), or ``timeout_s`` passed (other lines into ``said``)."""
    deadline = time.monotonic() + timeout_s
    looks = 0
    while not pids <= ended.keys() and (left := deadline - time.monotonic()) > 0:
        looks = looks + 1 if settled() else 0
        if looks == 2:
            return
        ready, _, _ = select.select([reaper.stdout], [], [], min(left, _SETTLE_S))
        if not ready:
            continue
        line = reaper.stdout.readline().decode()
        looks = 0  # something ended or was said: the next two looks start afresh, _SETTLE_S apart
        if not line:
            return  # the reaper ended: nothing is left to end
        pid, _, code = line.strip().partition(" ")
        if pid.isdigit() and code.lstrip("-").isdigit():
            ended[int(pid)] = int(code)
        elif line.strip():
            said.append(line.strip())


def start_interrupted(workdir: Path, after_s: float) -> None:
    """Start a pool of 2 ranks in ``workdir`` and interrupt it ``after_s``
    seconds in; the interrupt must reach the caller."""
    def interrupt(signum, frame):
        raise Interrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, after_s)
    try:
        with pytest.raises(Interrupt):
            RankPool(2, workdir=workdir)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Interrupt(BaseException):
    """Stands for a KeyboardInterrupt arriving while ranks start."""
