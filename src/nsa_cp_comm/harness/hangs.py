"""Why a task's ranks did not answer, as the starter reads it: what each rank
last announced (its ``.doing`` marker, written by :func:`.rank_body.announce`),
where a stuck one waits (the Python stack it dumps when asked), and ranks that
parted, each waiting in a collective at a different place, seen before the
task's bound."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Container
from pathlib import Path

from .machine import load_factor
from .reap import proc_stat

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
MARKER_SUFFIX = ".doing"
# On a timed-out task the starter asks each stuck rank for its Python stack
# (faulthandler, which writes it even while the rank waits inside a collective)
# before killing it: where it waits is the evidence a hang leaves.
STACK_SIGNAL = signal.SIGUSR1
STACK_SUFFIX = ".stack"
STACK_WAIT_S = 1.0  # idle; scaled by the load (a loaded machine schedules the dumping rank late)
STACK_WAIT_MAX_S = 10.0  # a stopped rank never dumps: the wait stays bounded whatever the load
_POLL_S = 0.05  # how often a dump is looked at while it grows


def marker_path(store_path: str | os.PathLike[str], rank: int, suffix: str = MARKER_SUFFIX) -> Path:
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


def _cpu_s(pid: int) -> float | None:
    """CPU seconds the process has used (every thread), on Linux; None if unknown."""
    fields = proc_stat(pid)
    try:
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError):
        return None


def _still_apart(looks: list[tuple[tuple[str, ...], tuple[float, ...]] | None]) -> bool:
    """Three looks (:meth:`TaskWatch.idle_apart`) at the same places, no rank
    using CPU between them: idle and apart twice in a row."""
    if len(looks) < 3 or not all(looks):
        return False
    if len({look[0] for look in looks}) != 1:  # type: ignore[index]
        return False
    return all(b - a < PARTED_IDLE_CPU_S for prev, cur in zip(looks, looks[1:])
               for a, b in zip(prev[1], cur[1]))  # type: ignore[index]


def is_stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP, a debugger), on Linux."""
    fields = proc_stat(pid)
    return bool(fields) and fields[0] in ("T", "t")


class TaskWatch:
    """One task on a pool's ranks (``pids``, by rank) as the starter sees it, through the files
    beside their rendezvous ``store_path``, from the task's start until its ranks are killed."""

    def __init__(self, store_path: str | os.PathLike[str], pids: list[int], task_id: object) -> None:
        self.store_path, self.pids, self.task_id = store_path, pids, task_id
        self.stack_from: dict[int, int] = {}  # per rank: where its latest stack dump starts
        self.stacks_read = False  # the ranks parted, and the stacks that showed it were read
        self._next_look = time.monotonic() + PARTED_S
        self._looks: list[tuple[tuple[str, ...], tuple[float, ...]] | None] = []

    def parted(self, got: Container[int], now: float) -> bool:
        """Whether the ranks yet to answer (not in ``got``) have parted: looked
        at every :data:`PARTED_S`, idle at the same different places on three
        looks, then each waiting in a collective by its stack."""
        if now < self._next_look:
            return False
        pending = [r for r in range(len(self.pids)) if r not in got]
        self._looks = [*self._looks[-2:], self.idle_apart(pending)]
        self.stacks_read = _still_apart(self._looks) and self.in_collectives(pending)
        self._next_look = time.monotonic() + PARTED_S
        return self.stacks_read

    def doing(self, rank: int) -> str:
        """What the rank last announced (:func:`.rank_body.announce`) in this task, or ''."""
        try:
            with open(marker_path(self.store_path, rank), "rb") as f:
                line = f.readline(4096).decode(errors="replace")
        except OSError:
            return ""
        tid, _, text = line.rstrip("\n").partition("\t")
        return text if tid == str(self.task_id) else ""

    def ask_stacks(self, ranks: list[int]) -> None:
        """Signal each rank for its stack dump; wait until each dump has grown
        and stopped growing (at most :data:`STACK_WAIT_S`)."""
        paths = {r: marker_path(self.store_path, r, STACK_SUFFIX) for r in ranks}

        def size(r: int) -> int:
            try:
                return paths[r].stat().st_size
            except OSError:
                return 0

        before = {}
        for r in ranks:
            before[r] = size(r)
            self.stack_from[r] = before[r]  # the dump this call asks for starts here
            try:
                os.kill(self.pids[r], STACK_SIGNAL)
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

    def waiting(self, rank: int) -> str:
        """Where the rank waits, from the latest dump :meth:`ask_stacks` asked for."""
        try:
            with open(marker_path(self.store_path, rank, STACK_SUFFIX), "rb") as f:
                f.seek(self.stack_from.get(rank, 0))
                dump = f.read(1 << 20).decode(errors="replace")
        except OSError:
            return ""
        return waiting_in(dump)

    def idle_apart(self, pending: list[int]) -> tuple[tuple[str, ...], tuple[float, ...]] | None:
        """The pending ranks' places and CPU seconds when they announced more
        than one place (every one of them something), else None."""
        doing = tuple(self.doing(r) for r in pending)
        if len(set(doing)) < 2 or "" in doing:  # one place, or a rank not yet in the task
            return None
        cpu = tuple(_cpu_s(self.pids[r]) for r in pending)
        return None if None in cpu else (doing, cpu)  # type: ignore[return-value]

    def in_collectives(self, pending: list[int]) -> bool:
        """Whether every pending rank's stack shows it waiting in a collective."""
        self.ask_stacks(pending)
        return all(self.waiting(r).startswith("waiting in torch.distributed.") for r in pending)
