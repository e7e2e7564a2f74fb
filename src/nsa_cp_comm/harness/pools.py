"""The warm pools of this process, one per world: reused across points
(:func:`get_pool`) unless outside code ran on them, and closed when the
process ends (at exit, or by :func:`end_process`, which bounds the exit
handlers a plug-in may have left)."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading

from . import forkserver
from .ranks import RankPool, StartTimeout
from .switches import env_switch

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
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
