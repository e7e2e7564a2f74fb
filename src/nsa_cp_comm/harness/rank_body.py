"""The body of a rank process, from joining its group to leaving: the tasks
its starter sends are run one by one, each answered with its value or its
error in one line (and the warnings it raised); before each place of a task
the rank says what it is about to run (:func:`announce`), for the starter to
read if the task fails; :func:`rank_device` is where a task's tensors live."""

from __future__ import annotations

import faulthandler
import importlib.util
import os
import pickle
import select
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

from . import rank_warnings
from .hangs import STACK_SIGNAL, STACK_SUFFIX, marker_path
from .machine import bind_rank
from .rank_state import remember
from .reap import kill_descendants

_WORKER_DEVICE = None
# This rank's marker (an open file in the pool's workdir) and the task it runs:
# see announce().
_MARKER_FD: int | None = None
_TASK_ID: object = None
# Outside a pool (ranks torchrun started): the latest announcement, which the
# rank reports itself when its point fails (:func:`last_announced`).
_LAST: list[str] = [""]
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
        line = f"{_TASK_ID}\t{_LAST[0]}\n".encode()
        # One write at offset 0: the first line is always the latest (a longer
        # earlier line's tail after it is never read).
        os.pwrite(_MARKER_FD, line, 0)


def last_announced() -> str:
    """What this rank last announced (:func:`announce`), or ''."""
    return _LAST[0]


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
    """Body of a rank process (started by :class:`.ranks.RankPool` through
    ``_worker.py``, which has already tied this process's life to its
    starter's): join the group, then run tasks from the pipe."""
    global _WORKER_DEVICE, _MARKER_FD, _TASK_ID, _STACK_FILE
    bind_rank(rank, world_size)  # first: every thread started below inherits it
    conn = Connection(fd)
    started = threading.Event()
    threading.Thread(target=_exit_when_starter_closes, args=(fd, started), daemon=True).start()
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
    try:
        _MARKER_FD = os.open(marker_path(store_path, rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        _MARKER_FD = None  # no marker: a failure is then blamed on the whole point
    try:
        _STACK_FILE = open(marker_path(store_path, rank, STACK_SUFFIX), "w")  # noqa: SIM115 - the rank's lifetime
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
