"""Run a function on ``cp_size`` real torch.distributed ranks, and keep them warm.

A :class:`RankPool` spawns one process per rank, rendezvouses them through a
``FileStore`` in a directory the caller owns (no TCP port to race for under
pytest-xdist or parallel sweeps), and then runs any number of tasks on them.
Starting ranks costs seconds (each imports torch), so pools are reused across
points with the same world (:func:`.pools.get_pool`).

Failure handling is the pool's job, not the task's: a rank that raises, dies or
hangs past the task's timeout turns into a :class:`RankResult` with a status and
a reason naming the rank (and what it was doing: :mod:`.hangs`); then every
rank of the pool is killed (a peer left inside a collective would otherwise
block forever) and the next task spawns a fresh pool.

No rank outlives the process that started it: a rank's first statements tie
its life to its starter (``_worker.py``'s docstring says how); a pool
whose start fails or is interrupted kills the ranks it started; a rank still
starting exits when its pipe to the starter closes; rendezvous files left by
killed starters are removed by the next pool in the same directory
(:mod:`.rendezvous`). What a rank started dies with it: ranks are child
subreapers, and their descendants (in a session of their own or not) are
stopped and killed before them (:mod:`.reap`); a rank ends with ``os._exit``,
no exit handler run. The death signal follows the *thread* that started the
ranks: start a pool from a thread that outlives it (the main thread, as Hydra
and pytest do).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from . import exits, forkserver, hangs, rank_warnings
from .rank_result import STOPPED, RankResult, summarize_failure
from .reap import kill_descendants
from .rendezvous import remove_stale_stores, store_name
from .switches import check_switches
from ..modes import BACKENDS

DEVICES: tuple[str, ...] = ("cpu", "cuda")

# How long the surviving ranks get to report after one rank failed before they
# are killed: they are usually blocked in a collective with the dead rank.
FAILURE_GRACE_S = 2.0
_POLL_S = 0.05
# The rank's entry point, run by path (see its docstring for why not ``-m``).
WORKER_PATH = Path(__file__).resolve().with_name("_worker.py")


class StartTimeout(RuntimeError):
    """Ranks were still starting when the start-up bound ran out (none failed)."""


def check_seconds(name: str, value: object) -> float:
    """``value`` as a positive, finite number of seconds, else ValueError
    (one line): a NaN or infinite timeout would disable the timeout."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive finite number of seconds")
    return float(value)


def _check_device(device: str) -> None:
    """``device`` is one of :data:`DEVICES` and usable here (ValueError, one line)."""
    if device not in DEVICES:
        raise ValueError(f"device={device!r} is not one of {', '.join(DEVICES)}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("device='cuda' needs a CUDA device; torch.cuda.is_available() is False here")


def rank_env() -> dict[str, str]:
    """The environment a rank gets: this process's, with its ``sys.path`` as
    ``PYTHONPATH`` (a task must import what its starter can)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def prestart(device: str) -> None:
    """Start the fork server that ``device``'s ranks will be forked from, and
    return at once: it imports torch while the caller does other work (a
    sweep's first configs). Nothing where ranks of ``device`` are exec'd."""
    if forkserver.usable(device):
        forkserver.start(rank_env(), WORKER_PATH)


class RankPool:
    """``world_size`` warm rank processes in one process group.

    All tasks run on every rank; a task is a picklable top-level function
    importable by the ranks (they inherit this process's ``sys.path``). The
    pool is closed (all ranks killed) after any failed task.
    """

    def __init__(
        self,
        world_size: int,
        *,
        backend: str = "gloo",
        device: str = "cpu",
        workdir: str | os.PathLike[str],
        start_timeout_s: float = 180.0,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
        _check_device(device)
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ValueError(f"world_size={world_size!r} must be a positive int")
        start_timeout_s = check_seconds("start_timeout_s", start_timeout_s)
        check_switches()  # here, in one line, not as a rank's traceback
        self.world_size = world_size
        self.backend = backend
        self.device = device
        self.closed = True  # until there is something to close
        # Set by whoever runs outside code (a plug-in) on these ranks
        # (measure.run_point): no later point is run on them (pools.get_pool).
        self.ran_outside_code = False
        self._next_task = 0
        self._conns: list[Connection] = []
        self._procs: list[subprocess.Popen | forkserver.ForkedRank] = []
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        remove_stale_stores(workdir)
        self._store_path = workdir / store_name()
        self.closed = False
        try:
            self._start(start_timeout_s)
        except BaseException:
            # An interrupt or error mid-start: no started rank may be left
            # waiting in the rendezvous for peers that will never come.
            self.close(graceful=False)
            raise

    def _start(self, start_timeout_s: float) -> None:
        env = rank_env()
        threads = max(1, (os.cpu_count() or 1) // self.world_size)
        deadline = time.monotonic() + start_timeout_s
        try:
            server = forkserver.server_for(env, WORKER_PATH, deadline) if forkserver.usable(self.device) else None
            for r in range(self.world_size):
                try:
                    self._start_rank(r, server, env, threads, deadline)
                except RuntimeError as exc:
                    if server is None:
                        raise
                    # The server failed (gone, stopped, a request refused): it is
                    # replaced, and every rank starts by exec, on a new rendezvous
                    # (the forked ones die with their server).
                    forkserver.replace_server_of(server, str(exc))
                    server = None
                    self._restart_by_exec(env, threads, deadline)
                    break
        except TimeoutError as exc:  # the fork server still importing torch, or not answering
            raise StartTimeout(f"starting {self.world_size} {self.backend}/{self.device} ranks failed: {exc} "
                               f"within {start_timeout_s:g}s") from None
        # The bound counts from the pool's start: a fork server still importing torch spent part of it.
        ready = self._collect("ready", start_timeout_s, deadline=deadline)
        if not all(r.ok for r in ready):
            _, reason = summarize_failure(ready)
            # Only ranks still starting at the deadline: slow, not broken (a
            # loaded machine importing torch), so a caller may try again.
            slow = all(r.ok or r.status == "timeout" for r in ready)
            raise (StartTimeout if slow else RuntimeError)(
                f"starting {self.world_size} {self.backend}/{self.device} ranks failed: {reason}")

    def _restart_by_exec(self, env: dict[str, str], threads: int, deadline: float) -> None:
        self._kill()
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []
        self._store_path.unlink(missing_ok=True)
        self._store_path = self._store_path.with_name(store_name())
        for r in range(self.world_size):
            self._start_rank(r, None, env, threads, deadline)

    def _start_rank(self, r: int, server: forkserver.ForkServer | None, env: dict[str, str], threads: int,
                    deadline: float) -> None:
        """Start rank ``r``: forked from ``server``, or exec'd where there is none."""
        ours, theirs = socket.socketpair()
        try:
            if server is not None:
                rank_args = (r, self.world_size, self.backend, self.device, str(self._store_path), threads)
                self._procs.append(server.spawn(rank_args, theirs.fileno(), env, deadline))
            else:
                args = [sys.executable, str(WORKER_PATH), str(os.getpid()), str(r), str(self.world_size),
                        self.backend, self.device, str(self._store_path), str(theirs.fileno()), str(threads)]
                # Each rank leads its own process group: what a task starts on it
                # (a plug-in's helper processes) is killed with it (close()).
                self._procs.append(subprocess.Popen(args, env=env, pass_fds=(theirs.fileno(),),
                                                    stdin=subprocess.DEVNULL, process_group=0))
            self._conns.append(Connection(ours.detach()))
        finally:
            theirs.close()
            ours.close()  # no-op once detached; else the rank sees EOF and exits

    @property
    def workdir(self) -> Path:
        """The directory of the pool's rendezvous file (and its ranks' markers)."""
        return self._store_path.parent

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @property
    def alive(self) -> bool:
        return not self.closed and all(p.poll() is None for p in self._procs)

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> list[RankResult]:
        """Run ``fn(*args, **kwargs)`` on every rank; one :class:`RankResult` per rank.

        Never raises for a failing task and never blocks past ``timeout_s``
        (plus :data:`FAILURE_GRACE_S`); on any failure the pool is closed."""
        timeout_s = check_seconds("timeout_s", timeout_s)
        if self.closed:
            raise RuntimeError("RankPool is closed")
        task_id = self._next_task
        self._next_task += 1
        payload = pickle.dumps((fn, args, kwargs))
        main_path = getattr(sys.modules["__main__"], "__file__", None)
        for conn in self._conns:
            conn.send((task_id, main_path, payload))
        watch = hangs.TaskWatch(self._store_path, self.pids, task_id)
        results = self._collect(task_id, timeout_s, watch=watch)
        if not all(r.ok for r in results):
            stuck = [r.rank for r in results if r.status == "timeout"]
            if not watch.stacks_read:  # parted: the stacks that showed it are the evidence; asking
                watch.ask_stacks(stuck)  # again could find a rank the load keeps from dumping in time
            self._kill()  # first: a rank still running could move its marker
            for r in results:
                r.doing = watch.doing(r.rank)
                if r.rank in stuck:
                    r.waiting = watch.waiting(r.rank)
            self.close(graceful=False)
        return results

    def _kill(self) -> None:
        """SIGKILL every rank and what it started (its descendants, in a
        session of their own or not: each rank is their subreaper, :mod:`.reap`),
        then reap them."""
        for p in self._procs:
            if p.poll() is None:
                kill_descendants(p.pid)
        for p in self._procs:
            if p.poll() is None:
                p.kill()
        for p in self._procs:
            p.wait()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)  # what is left of its process group (its descendants)

    def _collect(self, task_id: object, timeout_s: float, deadline: float | None = None,
                 watch: hangs.TaskWatch | None = None) -> list[RankResult]:
        got: dict[int, RankResult] = {}
        oom_before = exits.oom_kill_count()
        deadline = time.monotonic() + timeout_s if deadline is None else deadline
        failed_at: float | None = None
        parted_s: float | None = None
        while len(got) < self.world_size:
            now = time.monotonic()
            if now >= deadline or (failed_at is not None and now >= failed_at + FAILURE_GRACE_S):
                break
            if watch is not None and failed_at is None and watch.parted(got, now):
                parted_s = now - (deadline - timeout_s)
                break
            waiting = {self._conns[r]: r for r in range(self.world_size) if r not in got}
            for conn in wait(list(waiting), timeout=_POLL_S):
                r = waiting[conn]
                try:
                    tid, status, value, tb, *more = conn.recv()  # a task's answer: and its warnings
                except (EOFError, OSError):
                    # The rank died; its exit status tells how.
                    code = self._procs[r].wait(timeout=5.0)
                    got[r] = RankResult(r, "crashed", error=exits.exit_reason(code, oom_before))
                    failed_at = failed_at or time.monotonic()
                    continue
                if tid != task_id:
                    continue  # a late answer of an earlier, abandoned task
                raised = tuple(more[0]) if more else ()
                rank_warnings.count(raised)
                if status == "ok":
                    got[r] = RankResult(r, "ok", value=value, warnings=raised)
                else:
                    got[r] = RankResult(r, "error", error=value, traceback=tb, warnings=raised)
                    failed_at = failed_at or time.monotonic()
        timed_out = failed_at is None
        for r in range(self.world_size):
            if r not in got:
                if parted_s is not None:
                    got[r] = RankResult(r, "timeout", error=(
                        f"no answer after {parted_s:.0f}s: the ranks parted, each waiting in a collective at a "
                        f"different place (seen {hangs.PARTED_S:g}s apart), so none would have answered within "
                        f"{timeout_s:g}s"))
                elif timed_out:
                    stopped = STOPPED if hangs.is_stopped(self._procs[r].pid) else ""
                    got[r] = RankResult(r, "timeout", error=f"no answer within {timeout_s:g}s{stopped}")
                else:
                    got[r] = RankResult(r, "aborted", error="killed after another rank failed")
        return [got[r] for r in range(self.world_size)]

    def close(self, graceful: bool = True) -> None:
        """Stop every rank and reap them: politely when the pool is idle and
        healthy, else (or after 5 s) with SIGKILL."""
        if self.closed:
            return
        self.closed = True
        for p in self._procs:  # what the ranks started, before the ranks leave it to their server
            if p.poll() is None:
                kill_descendants(p.pid)
        if graceful and self.alive_processes() == len(self._procs):
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.send(None)
            deadline = time.monotonic() + 5.0
            for p in self._procs:
                try:
                    p.wait(max(0.01, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    break
        self._kill()
        for conn in self._conns:
            conn.close()
        for path in (self._store_path, *(hangs.marker_path(self._store_path, r, suffix) for r in range(self.world_size)
                                         for suffix in (hangs.MARKER_SUFFIX, hangs.STACK_SUFFIX))):
            # gone already, or in a folder made read-only under the sweep: left there
            with contextlib.suppress(OSError):
                path.unlink()

    def alive_processes(self) -> int:
        return sum(p.poll() is None for p in self._procs)

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            self.close()


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    device: str = "cpu",
    workdir: str | os.PathLike[str],
    timeout_s: float = 120.0,
    **kwargs: Any,
) -> list[RankResult]:
    """One-shot form: start ``world_size`` ranks, run ``fn`` once, stop them."""
    with RankPool(world_size, backend=backend, device=device, workdir=workdir) as pool:
        return pool.run(fn, *args, timeout_s=timeout_s, **kwargs)
