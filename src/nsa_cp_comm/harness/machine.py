"""The machine the ranks run on: what a timing was measured on (CPU model,
GPU name, NCCL version) and what it offers the ranks of a point
(:func:`this_machine`: cores, memory, rank processes, GPUs, as its cgroups and
RLIMIT_NPROC limit them). Torch is imported only where a GPU is asked about
on a machine that has a GPU driver: a sweep's own process on a CPU machine
never imports it (the ranks do).

The one reader of this process's cgroups: the ranks read its OOM-kill counter
through :func:`cgroup_dirs`, the matrix's budget the machine's limits.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import importlib.metadata
import math
import os
import platform
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

from .switches import env_switch

# Rank processes per core before a machine is called full (ranks of one point
# share the cores; beyond a few per core a point only measures contention),
# and never fewer than this many.
RANKS_PER_CORE, MIN_RANK_LIMIT = 4, 8
THREADS_PER_RANK = 8  # tasks one rank holds at once: interpreter, gloo, OpenMP


# Set to 0 to leave the ranks unbound (the kernel places them).
BIND_ENV = "NSA_CP_COMM_BIND_RANKS"


def rank_cpus(rank: int, world: int, cpus: list[int], loaded: bool = False) -> set[int] | None:
    """The CPUs rank ``rank`` of ``world`` is bound to, out of the starter's
    ``cpus``: with more ranks than CPUs, or on a ``loaded`` machine (its
    1-minute load average at or above its CPUs), one CPU each, round robin;
    else None (unbound: the kernel places them).

    Why bind only then: every step of a gloo collective wakes a thread of
    another rank, and an unbound one may be woken on, or moved to, a core
    where it waits behind others; under load, bound ranks' paired ratio spreads
    half as wide: the difference between a gate that can and cannot see a 15%
    change in iters=auto's 30 s. The measurements (``benchmarks/rank_start.py``):
    docs/design.md, "Starting ranks"."""
    if world <= len(cpus) and not loaded:
        return None
    return {cpus[rank % len(cpus)]}


def bind_rank(rank: int, world: int) -> set[int] | None:
    """Bind this process (and the threads it starts from now on) to
    :func:`rank_cpus`; None where it is not bound (no more ranks than CPUs,
    ``NSA_CP_COMM_BIND_RANKS=0``, no affinity on this platform, or the
    kernel refused)."""
    if not env_switch(BIND_ENV, True) or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        cpus = sorted(os.sched_getaffinity(0))
        mine = rank_cpus(rank, world, cpus, loaded=os.getloadavg()[0] >= len(cpus))
        if mine is not None:
            os.sched_setaffinity(0, mine)
    except OSError:
        return None
    return mine


@dataclass(frozen=True)
class Machine:
    """What a machine offers the ranks of one point."""

    cores: int
    memory_bytes: float  # host memory available
    memory_source: str  # where memory_bytes comes from
    max_ranks: int  # rank processes one point may start
    max_ranks_source: str  # why max_ranks
    gpus: int
    gpu_bytes: float  # memory of the smallest GPU (0 without GPUs)


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what platform knows."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def nccl_version() -> str:
    """``"2.21.5"``, or ``""`` where torch has no CUDA/NCCL."""
    if not gpus()[0]:
        return ""
    import torch

    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - a build without NCCL
        return ""


@functools.lru_cache(maxsize=1)
def torch_version() -> str:
    """torch's version (``"2.13.0+cpu"``): ``torch.__version__`` once torch is
    imported, else its installed distribution's, read without importing it;
    a torch that is no installed distribution (a source tree on the path) is
    imported and asked."""
    if "torch" in sys.modules:
        return str(sys.modules["torch"].__version__)
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        import torch

        return str(torch.__version__)


def device_name(device: str) -> str:
    """The GPU's name for ``cuda``, the CPU model otherwise."""
    if device != "cuda":
        return cpu_model()
    import torch

    return torch.cuda.get_device_name(0)


# --- what the machine offers ------------------------------------------------------------


def _read(path: str) -> str:
    """A (kernel) file's text, ``""`` when it cannot be read."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def cgroup_dirs(controller: str) -> list[str]:
    """Directories of this process's cgroup for ``controller``, most specific
    first: v2 (also under ``unified/``) and v1, then the mount roots (inside a
    container its own cgroup is often mounted there)."""
    dirs = []
    for line in _read("/proc/self/cgroup").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[1] == "":
            dirs += [f"/sys/fs/cgroup{parts[2]}", f"/sys/fs/cgroup/unified{parts[2]}"]
        elif controller in parts[1].split(","):
            dirs.append(f"/sys/fs/cgroup/{parts[1]}{parts[2]}")
    return [*dirs, "/sys/fs/cgroup", f"/sys/fs/cgroup/{controller}"]


def _cgroup_value(controller: str, *names: str) -> int | None:
    """The number in the first existing file of ``names`` in this process's
    cgroup; None where none exists or it sets no limit (``max``, or v1's
    near-2**63 "unlimited")."""
    for d in cgroup_dirs(controller):
        for name in names:
            words = _read(f"{d}/{name}").split()
            if words:
                return int(words[0]) if words[0].isdigit() and int(words[0]) < 1 << 60 else None
    return None


def load_factor(cores: int | None = None, load: float | None = None) -> tuple[float, float]:
    """``(factor, load)``: how many times longer work takes on this machine
    now than idle, by how far the 1-minute load average (``load``: read here
    when not given) exceeds its ``cores`` (default: this process's, cgroup
    quota included); 1 when it does not. The one rule every bound that
    scales with the load reads (a point's rank start, its checks' collective
    bound, the tests' waits)."""
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = 0.0
    return max(1.0, load / (cores or _cores())), load


def _cores() -> int:
    """CPUs this process may use: its affinity, capped by a cgroup CPU quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    for d in cgroup_dirs("cpu"):
        # v2's "QUOTA PERIOD" (QUOTA "max" when unlimited), or v1's two files (-1 when unlimited)
        quota = _read(f"{d}/cpu.max").split() or [_read(f"{d}/cpu.cfs_{f}_us").strip() for f in ("quota", "period")]
        if len(quota) == 2 and quota[0].isdigit() and quota[1].isdigit() and int(quota[0]) > 0:
            return max(1, min(n, math.ceil(int(quota[0]) / int(quota[1]))))
    return max(1, n)


def _memory() -> tuple[float, str]:
    """Host memory available to new processes, and where the figure comes from:
    MemAvailable, or the cgroup's memory limit where that is lower."""
    avail = next((int(ln.split()[1]) * 1024 for ln in _read("/proc/meminfo").splitlines()
                  if ln.startswith("MemAvailable:")), None)
    limit = _cgroup_value("memory", "memory.max", "memory.limit_in_bytes")
    if limit is not None and (avail is None or limit < avail):
        return float(limit), "cgroup memory limit"
    if avail is None:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "physical memory"
    return float(avail), "available memory"


def _user_tasks() -> int:
    """Tasks (threads) of this user now: what RLIMIT_NPROC counts."""
    uid, n = os.getuid(), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                n += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
    return n


def _task_room() -> tuple[int, str] | None:
    """Tasks (threads) this process may still start, and the limit that leaves
    the least: RLIMIT_NPROC (over this user's tasks; root is exempt) or the
    cgroup's pids.max; None where neither limits it."""
    rooms = []
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY and os.geteuid() != 0:
        rooms.append((max(0, soft - _user_tasks()), f"RLIMIT_NPROC={soft}"))
    pids = _cgroup_value("pids", "pids.max")
    if pids is not None:
        rooms.append((max(0, pids - (_cgroup_value("pids", "pids.current") or 0)), f"the cgroup's pids.max={pids}"))
    return min(rooms, default=None)


# The device nodes a GPU driver makes on Linux (NVIDIA's, AMD ROCm's, WSL's
# GPU bridge): without one, no process here sees a GPU, and asking torch
# (seconds of imports in a sweep's own process) would only say so.
GPU_DEVICE_NODES: tuple[str, ...] = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg")


def gpu_driver_absent() -> bool:
    """True where this is Linux and no GPU driver's device node exists."""
    return sys.platform.startswith("linux") and not any(glob.glob(p) for p in GPU_DEVICE_NODES)


@functools.lru_cache(maxsize=1)
def gpus() -> tuple[int, float]:
    """(GPUs this process sees, memory of the smallest); (0, 0.0) without CUDA.

    Read once per process: the devices a process sees do not change while it
    runs (CUDA fixes them as it starts), and a sweep resolves every point
    against them (matrix.app.resolve). Without a GPU driver
    (:func:`gpu_driver_absent`) the answer is (0, 0.0) without importing torch."""
    if gpu_driver_absent():
        return 0, 0.0
    import torch

    if not torch.cuda.is_available():
        return 0, 0.0
    n = torch.cuda.device_count()
    return n, float(min(torch.cuda.get_device_properties(i).total_memory for i in range(n)))


def this_machine() -> Machine:
    """The machine this process runs on: a few ranks per core, within the
    tasks RLIMIT_NPROC and the cgroup's pids.max leave room for."""
    n, (mem, source), (n_gpus, gpu_bytes) = _cores(), _memory(), gpus()
    ranks, why = max(MIN_RANK_LIMIT, RANKS_PER_CORE * n), f"{RANKS_PER_CORE} per core, {n} cores"
    room = _task_room()
    if room is not None and room[0] // THREADS_PER_RANK < ranks:
        ranks = room[0] // THREADS_PER_RANK
        why = f"{room[1]} leaves room for {ranks} ranks of ~{THREADS_PER_RANK} threads"
    return Machine(n, mem, source, ranks, why, n_gpus, gpu_bytes)
