"""How a rank's process ended, in words: the signal or exit code, and whether the kernel's
OOM killer sent the SIGKILL (its kill counter rose while the rank ran)."""

from __future__ import annotations

import contextlib
import signal

from .machine import cgroup_dirs


def read_counter(path: str, key: str) -> int | None:
    """The value of the ``key N`` line of a kernel stats file, or None."""
    with contextlib.suppress(OSError, ValueError), open(path) as f:
        for line in f:
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return None


def oom_counter_files() -> list[str]:
    """Files counting OOM kills (``oom_kill N``), most specific first: this
    process's memory cgroup (v2 ``memory.events``, v1 ``memory.oom_control``;
    :func:`.machine.cgroup_dirs`), then the whole system (``/proc/vmstat``)."""
    names = ("memory.events", "memory.oom_control")
    return [*(f"{d}/{name}" for d in cgroup_dirs("memory") for name in names), "/proc/vmstat"]


def oom_kill_count() -> int | None:
    """OOM kills so far in the first readable counter of
    :func:`oom_counter_files`; None when no counter is readable."""
    for path in oom_counter_files():
        n = read_counter(path, "oom_kill")
        if n is not None:
            return n
    return None


def exit_reason(code: int | None, oom_before: int | None = None) -> str:
    """How a rank process ended. A SIGKILL while the OOM-kill counter rose
    (``oom_before`` -> now) says "out of memory"; when no counter is readable
    it says "out of memory?" (the usual sender of an unexplained SIGKILL)."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            reason = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
        if -code == signal.SIGKILL:
            now = oom_kill_count()
            if oom_before is None or now is None:
                reason += " (out of memory?)"
            elif now > oom_before:
                reason += " (out of memory)"
        return reason
    return f"exited with code {code}"
