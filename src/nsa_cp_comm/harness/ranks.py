"""Run a function on ``cp_size`` real torch.distributed ranks, and keep them warm.

A :class:`RankPool` spawns one process per rank, rendezvouses them through a
``FileStore`` in a directory the caller owns (no TCP port to race for under
pytest-xdist or parallel sweeps), and then runs any number of tasks on them.
Starting ranks costs seconds (each imports torch), so pools are reused across
points with the same world (:func:`get_pool`).

Failure handling is the pool's job, not the task's: a rank that raises, dies or
hangs past the task's timeout turns into a :class:`RankResult` with a status and
a reason naming the rank; then every rank of the pool is killed (a peer left
inside a collective would otherwise block forever) and the next task spawns a
fresh pool.

No rank outlives the process that started it: a rank's first statements (in
``_worker.py``, run by path so nothing heavy loads before them) arm
``PR_SET_PDEATHSIG`` and check that the parent is still its starter; a pool
whose start fails or is interrupted kills the ranks it started; a rank still
starting exits when its pipe to the starter closes; rendezvous files left by
killed starters are removed by the next pool in the same directory. What a
rank started dies with it: ranks are child subreapers, and their descendants
(in a session of their own or not) are stopped and killed before them
(:mod:`.reap`); a rank ends with ``os._exit``, no exit handler run. The death
signal follows the *thread* that started the ranks: start a pool from a
thread that outlives it (the main thread, as Hydra and pytest do).
"""

from __future__ import annotations

import atexit
import faulthandler
import importlib.util
import math
import numbers
import os
import pickle
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from . import exits, forkserver, rank_warnings
from .machine import bind_rank, load_factor
from .rank_result import STOPPED, RankResult, summarize_failure
from .rank_state import remember
from .reap import kill_descendants
from .switches import check_switches, env_switch
from ..modes import BACKENDS

DEVICES: tuple[str, ...] = ("cpu", "cuda")

# How long the surviving ranks get to report after one rank failed before they
# are killed: they are usually blocked in a collective with the dead rank.
FAILURE_GRACE_S = 2.0
_POLL_S = 0.05
# Ranks that announced different places and each wait inside a collective have
# parted (one skipped a collective its peers entered, or issued an extra one):
# nothing will answer before the task's bound. Looked at this often: idle ranks
# (no CPU time used since the last look) at different places, twice in a row at
# the same places, are then asked for their stacks, and when every one waits in
# a torch.distributed call the task ends there, not at its bound. A rank still
# computing uses CPU, and one asleep outside a collective is not waiting in one,
# so neither reads as parted; healthy ranks are never signalled for a stack.
PARTED_S = 5.0
PARTED_IDLE_CPU_S = 0.05
# The rank's entry point, run by path (see its docstring for why not ``-m``).
WORKER_PATH = Path(__file__).resolve().with_name("_worker.py")
STORE_PREFIX = ".rendezvous-"


_WORKER_DEVICE = None
# This rank's marker (an open file in the pool's workdir) and the task it runs:
# see announce().
_MARKER_FD: int | None = None
_TASK_ID: object = None
# Outside a pool (ranks torchrun started): the latest announcement, which the
# rank reports itself when its point fails (:func:`last_announced`).
_LAST: list[str] = [""]
MARKER_SUFFIX = ".doing"
# On a timed-out task the starter asks each stuck rank for its Python stack
# (faulthandler, which writes it even while the rank waits inside a collective)
# before killing it: where it waits is the evidence a hang leaves.
STACK_SIGNAL = signal.SIGUSR1
STACK_SUFFIX = ".stack"
STACK_WAIT_S = 1.0  # idle; scaled by the load (a loaded machine schedules the dumping rank late)
STACK_WAIT_MAX_S = 10.0  # a stopped rank never dumps: the wait stays bounded whatever the load
_STACK_FILE: Any = None


def announce(text: str) -> None:
    """Say what this rank is about to run, in one line the starter reads only
    when the task fails: a rank killed, hung or aborted mid-task cannot say it
    afterwards. A file, not a message on the pipe, so the starter can read it
    after the rank is gone and nothing reads the pipe while a rank is busy.
    Outside a pool (ranks started by torchrun) it is kept in the process for
    :func:`last_announced`: such a rank reports its own failure."""
    _LAST[0] = " ".join(text.split())
    if _MARKER_FD is not None:
        line = f"{_TASK_ID}\t{' '.join(text.split())}\n".encode()
        # One write at offset 0: the first line is always the latest (a longer
        # earlier line's tail after it is never read).
        os.pwrite(_MARKER_FD, line, 0)


def last_announced() -> str:
    """What this rank last announced (:func:`announce`), or ''."""
    return _LAST[0]


def _marker_path(store_path: str | os.PathLike[str], rank: int, suffix: str = MARKER_SUFFIX) -> Path:
    # No "-" after the store's name: remove_stale_stores parses it as the store's.
    return Path(f"{store_path}{suffix}{rank}")


_FRAME = re.compile(r'File "(.+?)", line (\d+) in (\S+)')
# Frames not worth naming as a collective's caller: torch's own, and the
# project's shim and counter around torch's collectives.
_WRAPPERS = (f"{os.sep}torch{os.sep}", f"nsa_cp_comm{os.sep}collectives.py")


def waiting_in(dump: str) -> str:
    """Where a rank's task thread was, from its faulthandler dump: the
    ``torch.distributed`` function it waits in and the code that called it,
    or the innermost frame; '' when the dump holds no task thread."""
    # the last such block: a dump still being written when the next was asked for comes first
    block = ([b for b in re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump) if "in worker_main" in b] or [""])[-1]
    frames = _FRAME.findall(block)  # most recent call first
    k = next((i for i, (path, _, _) in enumerate(frames) if not any(w in path for w in _WRAPPERS)), len(frames))
    if k == len(frames):
        return ""
    path, line, func = frames[k]
    at = f"{os.sep.join(Path(path).parts[-2:])}:{line} in {func}"
    collective = next((f for p, _, f in frames[:k] if p.endswith("distributed_c10d.py")), "")
    return f"waiting in torch.distributed.{collective}, called at {at}" if collective else f"at {at}"


class StartTimeout(RuntimeError):
    """Ranks were still starting when the start-up bound ran out (none failed)."""


def rank_device():
    """The torch device this rank's tensors live on (inside a pool task)."""
    if _WORKER_DEVICE is None:
        raise RuntimeError("rank_device() is only defined inside a RankPool task")
    return _WORKER_DEVICE


def set_rank_device(device) -> None:
    """Declare this process a rank whose tensors live on ``device``: for ranks
    started by another launcher (``torchrun``: matrix.torchrun_point)."""
    global _WORKER_DEVICE
    _WORKER_DEVICE = device


def _exit_when_starter_closes(fd: int, started: threading.Event) -> None:
    """Until ``started`` is set, end this process as soon as the starter's end
    of the pipe closes. The starter sends nothing before every rank is ready,
    so a readable pipe here means EOF: a pool whose start was abandoned (an
    exception, an interrupt) while this rank waited in the rendezvous."""
    sock = socket.socket(fileno=os.dup(fd))
    try:
        while not started.is_set():
            readable, _, _ = select.select([sock], [], [], 0.2)
            if readable and not started.is_set():
                try:
                    data = sock.recv(1, socket.MSG_PEEK)
                except OSError:
                    data = b""
                if not data:
                    os._exit(1)
                return
    finally:
        sock.close()


def worker_main(rank: int, world_size: int, backend: str, device: str, store_path: str, fd: int, threads: int) -> None:
    """Body of a rank process (started by :class:`RankPool` through
    ``_worker.py``, which has already tied this process's life to its
    starter's): join the group, then run tasks from the pipe."""
    bind_rank(rank, world_size)  # first: every thread started below inherits it
    conn = Connection(fd)
    started = threading.Event()
    threading.Thread(target=_exit_when_starter_closes, args=(fd, started), daemon=True).start()
    global _WORKER_DEVICE
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        if device == "cuda":
            torch.cuda.set_device(rank % torch.cuda.device_count())
            _WORKER_DEVICE = torch.device("cuda", torch.cuda.current_device())
        else:
            _WORKER_DEVICE = torch.device("cpu")
        store = dist.FileStore(store_path, world_size)
        kwargs: dict[str, Any] = {}
        if backend == "nccl":
            kwargs["device_id"] = _WORKER_DEVICE
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(minutes=30), **kwargs
        )
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        started.set()
        conn.send(("ready", "error", one_line_error(exc), traceback.format_exc()))
        return
    remember()
    global _MARKER_FD, _TASK_ID
    try:
        _MARKER_FD = os.open(_marker_path(store_path, rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        _MARKER_FD = None  # no marker: a failure is then blamed on the whole point
    global _STACK_FILE
    try:
        _STACK_FILE = open(_marker_path(store_path, rank, STACK_SUFFIX), "w")  # noqa: SIM115 - the rank's lifetime
        faulthandler.register(STACK_SIGNAL, file=_STACK_FILE, all_threads=True)
    except (OSError, RuntimeError, ValueError):
        _STACK_FILE = None
    started.set()
    conn.send(("ready", "ok", None, ""))
    while True:
        try:
            item = conn.recv()
        except EOFError:  # the parent is gone
            _leave(1)
        if item is None:
            # Leave at once: tearing down the group and the interpreter
            # costs seconds per pool and frees nothing the OS would not.
            _leave(0)
        task_id, main_path, payload = item
        _TASK_ID = task_id
        # the warnings the task raises go back with its answer, for the sweep to say once (.rank_warnings)
        with rank_warnings.recording() as raised:
            try:
                fn, args, kwargs = _load_task(payload, main_path)
                answer: tuple[str, Any, str] = ("ok", fn(*args, **kwargs), "")
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                # where an implementation's own code raised, and in which of its steps
                site = implementation_site(exc.__traceback__)
                answer = ("error", one_line_error(exc) + site, traceback.format_exc())
        conn.send((task_id, *answer, tuple(raised)))


def _leave(code: int) -> None:
    """End this rank: what its tasks started first (:mod:`.reap`: this rank
    is their subreaper), then the process, with no exit handler run (a
    plug-in's could block forever)."""
    try:
        kill_descendants(os.getpid())
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


_PARENT_MAIN_LOADED = False


def _load_task(payload: bytes, main_path: str | None) -> tuple[Callable[..., Any], tuple, dict]:
    """Unpickle a task. A function defined in the parent's script lives in its
    ``__main__``: load that script as ``__mp_main__`` (as multiprocessing's
    spawn does; its top level must be guarded by ``if __name__ == "__main__"``)
    and retry."""
    global _PARENT_MAIN_LOADED
    try:
        return pickle.loads(payload)
    except (AttributeError, ImportError):
        if not main_path or _PARENT_MAIN_LOADED:
            raise
    _PARENT_MAIN_LOADED = True
    spec = importlib.util.spec_from_file_location("__mp_main__", main_path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["__mp_main__"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    sys.modules["__main__"] = module
    return pickle.loads(payload)


def implementation_site(tb) -> str:
    """:func:`.sites.implementation_site`, never raising (a rank reports its error whatever happens here)."""
    try:
        from .sites import implementation_site as site

        return site(tb)
    except Exception:  # noqa: BLE001 - the error itself is what matters
        return ""


def one_line_error(exc: BaseException) -> str:
    """``"Type: message"`` on one line: how a failure appears in a row's reason."""
    msg = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


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


def _cpu_s(pid: int) -> float | None:
    """CPU seconds the process has used (every thread), on Linux; None if unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _still_apart(looks: list[tuple[tuple[str, ...], tuple[float, ...]] | None]) -> bool:
    """Three looks (:meth:`RankPool._idle_apart`) at the same places, no rank
    using CPU between them: idle and apart twice in a row."""
    if len(looks) < 3 or not all(looks):
        return False
    if len({look[0] for look in looks}) != 1:  # type: ignore[index]
        return False
    return all(b - a < PARTED_IDLE_CPU_S for prev, cur in zip(looks, looks[1:])
               for a, b in zip(prev[1], cur[1]))  # type: ignore[index]


def _is_stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP, a debugger), on Linux."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")


def _kill_group(pgid: int) -> None:
    """SIGKILL what is left of a rank's process group (its descendants)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def store_name() -> str:
    """A fresh rendezvous file name naming its starter: host and pid."""
    return f"{STORE_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}"


def remove_stale_stores(workdir: Path) -> list[Path]:
    """Remove the rendezvous files in ``workdir`` whose starter (a process of
    this host) is gone: a starter killed with SIGKILL cannot remove its own.
    Files of other hosts, or of an unknown form, are left alone. Returns the
    removed paths."""
    host = socket.gethostname()
    removed = []
    for path in workdir.glob(f"{STORE_PREFIX}*"):
        parts = path.name[len(STORE_PREFIX):].rsplit("-", 2)
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit() or _pid_alive(int(parts[1])):
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed


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
        # (measure.run_point): no later point is run on them (get_pool).
        self.ran_outside_code = False
        self._next_task = 0
        self._stack_from: dict[int, int] = {}  # per rank: where its latest stack dump starts
        self._parted_stacks = False  # the running task's stacks were read when it parted
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
        try:
            self._store_path.unlink()
        except FileNotFoundError:
            pass
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
        self._parted_stacks = False
        results = self._collect(task_id, timeout_s, parting=True)
        if not all(r.ok for r in results):
            stuck = [r.rank for r in results if r.status == "timeout"]
            if not self._parted_stacks:  # parted: the stacks that showed it are the evidence; asking
                self._ask_stacks(stuck)  # again could find a rank the load keeps from dumping in time
            self._kill()  # first: a rank still running could move its marker
            for r in results:
                r.doing = self._doing(r.rank, task_id)
                if r.rank in stuck:
                    r.waiting = self._waiting(r.rank)
            self.close(graceful=False)
        return results

    def _doing(self, rank: int, task_id: int) -> str:
        """What the rank last announced (:func:`announce`) in this task, or ''."""
        try:
            with open(_marker_path(self._store_path, rank), "rb") as f:
                line = f.readline(4096).decode(errors="replace")
        except OSError:
            return ""
        tid, _, text = line.rstrip("\n").partition("\t")
        return text if tid == str(task_id) else ""

    def _ask_stacks(self, ranks: list[int]) -> None:
        """Signal each rank for its stack dump; wait until each dump has grown
        and stopped growing (at most :data:`STACK_WAIT_S`)."""
        paths = {r: _marker_path(self._store_path, r, STACK_SUFFIX) for r in ranks}

        def size(r: int) -> int:
            try:
                return paths[r].stat().st_size
            except OSError:
                return 0

        before = {}
        for r in ranks:
            before[r] = size(r)
            self._stack_from[r] = before[r]  # the dump this call asks for starts here
            try:
                os.kill(self._procs[r].pid, STACK_SIGNAL)
            except OSError:
                del before[r]
        last = dict(before)
        deadline = time.monotonic() + min(STACK_WAIT_MAX_S, STACK_WAIT_S * load_factor()[0])
        while last and time.monotonic() < deadline:
            time.sleep(_POLL_S)
            for r in list(last):
                now = size(r)
                if now > before[r] and now == last[r]:
                    del last[r]
                else:
                    last[r] = now

    def _waiting(self, rank: int) -> str:
        """Where the rank waits, from the latest dump :meth:`_ask_stacks` asked for."""
        try:
            with open(_marker_path(self._store_path, rank, STACK_SUFFIX), "rb") as f:
                f.seek(self._stack_from.get(rank, 0))
                dump = f.read(1 << 20).decode(errors="replace")
        except OSError:
            return ""
        return waiting_in(dump)

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
            _kill_group(p.pid)

    def _idle_apart(self, task_id: object, pending: list[int]) -> tuple[tuple[str, ...], tuple[float, ...]] | None:
        """The pending ranks' places and CPU seconds when they announced more
        than one place (every one of them something), else None."""
        doing = tuple(self._doing(r, task_id) for r in pending)
        if len(set(doing)) < 2 or "" in doing:  # one place, or a rank not yet in the task
            return None
        cpu = tuple(_cpu_s(self._procs[r].pid) for r in pending)
        return None if None in cpu else (doing, cpu)  # type: ignore[return-value]

    def _parted(self, pending: list[int]) -> bool:
        """Whether every pending rank's stack shows it waiting in a collective."""
        self._ask_stacks(pending)
        return all(self._waiting(r).startswith("waiting in torch.distributed.") for r in pending)

    def _collect(self, task_id: object, timeout_s: float, deadline: float | None = None,
                 parting: bool = False) -> list[RankResult]:
        got: dict[int, RankResult] = {}
        oom_before = exits.oom_kill_count()
        deadline = time.monotonic() + timeout_s if deadline is None else deadline
        failed_at: float | None = None
        parted_s: float | None = None
        next_look = time.monotonic() + PARTED_S
        looks: list[tuple[tuple[str, ...], tuple[float, ...]] | None] = []
        while len(got) < self.world_size:
            now = time.monotonic()
            if now >= deadline or (failed_at is not None and now >= failed_at + FAILURE_GRACE_S):
                break
            if parting and failed_at is None and now >= next_look:
                pending = [r for r in range(self.world_size) if r not in got]
                looks = [*looks[-2:], self._idle_apart(task_id, pending)]
                if _still_apart(looks) and self._parted(pending):
                    self._parted_stacks = True
                    parted_s = now - (deadline - timeout_s)
                    break
                next_look = time.monotonic() + PARTED_S
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
                        f"different place (seen {PARTED_S:g}s apart), so none would have answered within "
                        f"{timeout_s:g}s"))
                elif timed_out:
                    stopped = STOPPED if _is_stopped(self._procs[r].pid) else ""
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
                try:
                    conn.send(None)
                except OSError:
                    pass
            deadline = time.monotonic() + 5.0
            for p in self._procs:
                try:
                    p.wait(max(0.01, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    break
        self._kill()
        for conn in self._conns:
            conn.close()
        for path in (self._store_path, *(_marker_path(self._store_path, r, suffix) for r in range(self.world_size)
                                         for suffix in (MARKER_SUFFIX, STACK_SUFFIX))):
            try:
                path.unlink()
            except OSError:  # gone already, or in a folder made read-only under the sweep: left there
                pass

    def alive_processes(self) -> int:
        return sum(p.poll() is None for p in self._procs)

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            self.close()


_POOLS: dict[tuple[int, str, str], RankPool] = {}
# Set to 0 to start fresh ranks for every point (the harness benchmark's cold run).
REUSE_ENV = "NSA_CP_COMM_REUSE_RANKS"


def get_pool(world_size: int, *, backend: str, device: str, workdir: str | os.PathLike[str],
             start_timeout_s: float = 180.0, start_retries: int = 0) -> RankPool:
    """A warm pool for this world, started (rendezvous in ``workdir``) only when
    no live one exists that ran no outside code (or always, with
    ``NSA_CP_COMM_REUSE_RANKS=0``). Pools of other worlds are closed first, so at most one
    set of ranks holds the machine's cores at a time. A start whose ranks were
    still starting at ``start_timeout_s`` (:class:`StartTimeout`) is tried
    again up to ``start_retries`` times; any other failure raises at once."""
    key = (world_size, backend, device)
    pool = _POOLS.get(key)
    # Ranks that ran outside code are trusted with nothing after it: whatever
    # it left in the process (a method patched, a thread spinning, a nice
    # level) no check has to find.
    if pool is not None and pool.alive and not pool.ran_outside_code and env_switch(REUSE_ENV, True):
        return pool
    close_pools()
    for attempt in range(start_retries + 1):
        try:
            pool = RankPool(world_size, backend=backend, device=device, workdir=workdir,
                            start_timeout_s=start_timeout_s)
            break
        except StartTimeout as exc:
            if attempt == start_retries:
                raise StartTimeout(f"{exc} (tried {attempt + 1} time(s), {start_timeout_s:g} s each)") from None
    _POOLS[key] = pool
    return pool


def close_pools() -> None:
    """Close every pool :func:`get_pool` started."""
    while _POOLS:
        _, pool = _POOLS.popitem()
        pool.close()


atexit.register(close_pools)

# How long the exit handlers of a process that ran outside code get (end_process).
EXIT_HANDLERS_S = 10.0


def end_process(code: int, handlers_s: float = EXIT_HANDLERS_S) -> None:
    """End this process with ``code`` once its ranks and fork servers are
    closed and its output flushed, giving the exit handlers (``atexit``: a
    plug-in imported here may have registered one that never returns) at
    most ``handlers_s`` seconds on a thread of their own. Never returns."""
    try:
        close_pools()
        forkserver.close_servers()
    finally:
        done = threading.Event()

        def handlers() -> None:
            try:
                atexit._run_exitfuncs()
            finally:
                done.set()

        threading.Thread(target=handlers, name="exit-handlers", daemon=True).start()
        if not done.wait(handlers_s):
            print(f"warning: exit handlers still running after {handlers_s:g}s (a plug-in's?); leaving without them",
                  file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


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
