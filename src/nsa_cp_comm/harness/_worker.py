"""Entry point of a rank process, started by :class:`nsa_cp_comm.harness.ranks.RankPool` by file path:

    python .../nsa_cp_comm/_worker.py STARTER_PID RANK WORLD BACKEND DEVICE STORE FD THREADS

or, as the fork server that CPU ranks are forked from (:mod:`.forkserver`):

    python .../nsa_cp_comm/_worker.py fork-server STARTER_PID FD

A fresh interpreter rather than multiprocessing's spawn, which would re-import
the parent's ``__main__`` (a Hydra app, a test runner) in every rank.

Run by path, never as ``python -m nsa_cp_comm.harness._worker``: ``-m`` first imports
the package, and with it torch (seconds), before this file's first line. A
rank whose starter died in those seconds would live on as an orphan, waiting
in the rendezvous for peers that were never started. So the first statements
here use only what the interpreter has already loaded (plus ctypes): they ask
the kernel to SIGKILL this process when its parent dies, then check that the
parent is still the process that started it (it may have died before the
request, which the kernel would then never report). Only then does anything
heavy load.
"""

import os
import sys

ORPHAN_EXIT = 75  # the starter was gone before the death signal was armed
SERVE_ARG = "fork-server"  # the first argument of a fork server


def die_with_starter(starter_pid: int) -> None:
    """Arm ``PR_SET_PDEATHSIG`` = SIGKILL (Linux), then exit at once with
    :data:`ORPHAN_EXIT` unless the parent is still ``starter_pid``. Also
    make this process a child subreaper (``PR_SET_CHILD_SUBREAPER``, not
    inherited across fork: a forked rank calls this itself), so what a task
    starts here stays its descendant even in a session of its own, and dies
    with it (``harness/reap.py``).

    The order closes the race: a parent dying before the prctl is seen by the
    getppid check; one dying after it is seen by the kernel."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
            libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        except (OSError, AttributeError):  # pragma: no cover - exotic libc
            pass
    if os.getppid() != starter_pid:
        os._exit(ORPHAN_EXIT)


def _drop_script_dir() -> None:
    """Python puts this file's directory first on sys.path; its modules
    (plan, timing, ...) must only be importable as ``nsa_cp_comm.*``."""
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        del sys.path[0]


def ignore_interrupts() -> None:
    """A terminal's Ctrl-C reaches every process of its group: the ranks leave
    the interrupt to their starter, which reports it in one line and kills
    them (or dies, and the death signal ends them); a rank's own
    KeyboardInterrupt would only print a traceback."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    ignore_interrupts()
    serving = sys.argv[1] == SERVE_ARG
    die_with_starter(int(sys.argv[2] if serving else sys.argv[1]))
    _drop_script_dir()
    from nsa_cp_comm.harness.rank_body import worker_main

    if serving:
        # What every rank runs, imported once here so each rank forked from
        # this server starts with it (the library's names load on first use,
        # so importing the harness alone would leave torch to every rank).
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401

        import nsa_cp_comm.harness.measure  # noqa: F401
        import nsa_cp_comm.impls
        import nsa_cp_comm.plugins
        from nsa_cp_comm.harness.forkserver import serve

        nsa_cp_comm.impls.load_builtins()
        nsa_cp_comm.plugins.installed_packages()

        serve(int(sys.argv[3]), die_with_starter, worker_main)  # never returns
    else:
        from nsa_cp_comm.harness.forkserver import run_then_exit

        rank, world, backend, device, store, fd, threads = sys.argv[2:9]
        run_then_exit(lambda: worker_main(int(rank), int(world), backend, device, store, int(fd), int(threads)))
