"""What a rank started ends with the rank: its descendants, found and killed.

A rank's own process group catches a helper that stays in it, not one that
left: a plug-in's child started with ``start_new_session=True`` (or
``os.setsid``), or a daemon that double-forked, has its own session and
group, and once its parent is gone the kernel hands it to init. So every
rank, and the fork server ranks are forked from, is a *child subreaper*
(``PR_SET_CHILD_SUBREAPER``, Linux 3.4+, :func:`._worker.die_with_starter`): a
descendant whose parent died is handed to the rank instead, so the rank's
tree of descendants (``/proc``'s parent links, :func:`descendants`) holds
everything it started, whatever session it made. :func:`kill_descendants`
stops that tree (SIGSTOP, so no process in it forks while it is walked),
walks it again until nothing new appears, then SIGKILLs it: the starter does
so before it kills a rank, a rank before it leaves, and the fork server for
whatever its dead ranks left to it.

Standard library only: ``_worker.py`` and the fork server use it before torch
loads.
"""

from __future__ import annotations

import contextlib
import os
import signal

# Walks of a stopped tree before it is killed: each finds what forked before
# its parent was stopped; a tree still growing after this many is killed as found.
_ROUNDS = 8


def proc_stat(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command's name (the state
    first, the parent pid second), on Linux; [] where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError):
        return []


def _parents() -> dict[int, int]:
    """``pid -> parent pid`` of every process this one can see in ``/proc``."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    found = {int(name): proc_stat(name) for name in names if name.isdigit()}
    return {pid: int(fields[1]) for pid, fields in found.items() if fields}


def descendants(pid: int, keep: frozenset[int] | set[int] = frozenset()) -> list[int]:
    """Every live descendant of ``pid`` (nearest first) outside the subtrees
    of ``keep``, from ``/proc``; [] where there is no ``/proc``."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    seen = {pid, *keep}
    todo = [c for c in children.get(pid, ()) if c not in seen]
    while todo:
        p = todo.pop(0)
        if p in seen:
            continue
        seen.add(p)
        found.append(p)
        todo += children.get(p, ())
    return found


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def kill_descendants(pid: int, keep: frozenset[int] | set[int] = frozenset()) -> list[int]:
    """SIGKILL every descendant of ``pid`` but those in ``keep`` (and theirs):
    stopped first, walked until the tree stops growing. Returns the killed pids."""
    stopped: list[int] = []
    for _ in range(_ROUNDS):
        new = [p for p in descendants(pid, keep) if p not in stopped]
        if not new:
            break
        for p in new:
            _signal(p, signal.SIGSTOP)
        stopped += new
    for p in stopped:
        _signal(p, signal.SIGKILL)
    return stopped
