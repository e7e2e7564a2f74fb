"""Bounds from the machine: what a sweep will cost, checked before it runs.

:func:`estimate` puts figures on one point (rank processes, memory per rank,
seconds on this machine's device); :func:`check_sweep` refuses, in one line
naming the key, the estimate and the limit, a sweep that would start more
rank processes than the machine allows, need more memory than it has, or run
far longer than anyone means to wait (the GPU preset started on a CPU-only
machine); ``force=true`` skips these checks. :func:`sweep_estimate` is the
dry run's figure.

The figures are estimates from stated constants (below; order-of-magnitude
figures of a 2-core CPU machine), meant to catch a sweep that is off by an order
of magnitude (a mistyped ``cp_size``, a production shape on a laptop), not to
predict run times. Memory is counted from the buffers a point allocates
(nsa_cp_comm.harness.checks and nsa_cp_comm.harness.steps): the shard, the gathered buffer,
the MoE partials and their copies, the rotated input sets of the timed loop,
the reference MoE's weights and its float64 / float32 temporaries.
"""

from __future__ import annotations

import math
import os
import resource
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .config import ConfigError, override_value

MB = 1e6
GIB = float(1 << 30)

# Memory of a rank before a point's buffers (interpreter + torch + gloo): an
# idle rank's anonymous memory is ~150 MB, plus torch's shared libraries
# mapped in, 75-135 MB (more in a freshly installed environment, whose files
# were just written); after a point's checks ~100 MB more.
RANK_BASE_BYTES = 370 * MB
# A CUDA rank also holds the CUDA runtime on the host, and a context on its GPU.
CUDA_RANK_HOST_BYTES = 600 * MB
CUDA_CONTEXT_BYTES = 500 * MB
FFN_SIZE = 32  # nsa_cp_comm.moe.ReferenceMoE's default
MAX_SETS = 4  # nsa_cp_comm.harness.steps.MAX_SETS: input sets the timed loop rotates through
CACHE_BYTES = 64 << 20  # nsa_cp_comm.harness.steps.CACHE_BYTES

# Rank processes per core before the machine is refused (ranks of one point
# share the cores; beyond a few per core a point only measures contention),
# and never fewer than this many.
RANKS_PER_CORE = 4
MIN_RANK_LIMIT = 8
# Tasks (threads) one rank holds at once: interpreter, gloo, OpenMP.
THREADS_PER_RANK = 8
# A sweep estimated to take longer than this on this machine is refused.
MAX_SWEEP_S = 3600.0
# Remote launchers: the job's node is unknown here; refuse only what no node has.
REMOTE_MAX_RANK_BYTES = 2 * (1 << 40)


@dataclass(frozen=True)
class Throughput:
    """What one rank gets from its device when it has the device to itself."""

    busbw_Bps: float  # nccl-tests bus bandwidth of one collective
    latency_s: float  # per collective or barrier, however small
    flops: float  # the reference MoE's float64 routing and experts
    elements: float  # element-wise work per second (generating shards, comparing buffers)
    start_s: float  # starting the ranks of one world (each imports torch)


THROUGHPUT: dict[tuple[str, str], Throughput] = {
    # gloo on CPU: tenths of a GB/s busbw with 2-4 ranks on 2 cores (PERF.md's CPU table).
    ("cpu", "gloo"): Throughput(0.3e9, 5e-4, 5e9, 1e8, 3.0),
    # gloo on CUDA tensors stages through host memory.
    ("cuda", "gloo"): Throughput(1e9, 1e-3, 5e11, 1e10, 5.0),
    ("cuda", "nccl"): Throughput(50e9, 5e-5, 5e11, 1e10, 8.0),
}
# Per point: sending the task, folding reports, writing the rows.
POINT_OVERHEAD_S = 0.3


@dataclass(frozen=True)
class Machine:
    """What this machine offers the ranks of one point."""

    cores: int
    memory_bytes: float  # host memory available
    memory_source: str  # where memory_bytes comes from
    max_ranks: int  # rank processes one point may start
    max_ranks_source: str  # why max_ranks
    gpus: int
    gpu_bytes: float  # memory of the smallest GPU (0 without GPUs)


@dataclass(frozen=True)
class Estimate:
    """One point's cost. ``seconds``: its checks and timed loop on its ranks
    (starting them is counted per sweep, :func:`sweep_estimate`)."""

    ranks: int
    backend: str
    device: str
    rank_bytes: float  # host memory per rank
    device_bytes: float  # GPU memory per rank (0 on CPU)
    seconds: float
    memory_key: str  # the key that drives the memory figure: cp_size, hidden_size, seq_lens, align, num_experts
    busbw_Bps: float  # the bandwidth the estimate assumes per collective

    @property
    def world(self) -> tuple[int, str, str]:
        return (self.ranks, self.backend, self.device)


# --- the machine ----------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _cgroup_dirs(controller: str) -> list[str]:
    """Directories of this process's cgroup for ``controller`` (v2 and v1),
    then the mount roots (a container's own cgroup is often mounted there)."""
    dirs = []
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[1] == "":
            dirs += [f"/sys/fs/cgroup{parts[2]}", f"/sys/fs/cgroup/unified{parts[2]}"]
        elif controller in parts[1].split(","):
            dirs.append(f"/sys/fs/cgroup/{parts[1]}{parts[2]}")
    return [*dirs, "/sys/fs/cgroup", f"/sys/fs/cgroup/{controller}"]


def _cgroup_limit(controller: str, files: Sequence[str]) -> int | None:
    """The first numeric limit among ``files`` of this process's cgroup
    (``max`` and v1's near-2**63 "unlimited" count as none)."""
    for d in _cgroup_dirs(controller):
        for name in files:
            text = _read(f"{d}/{name}")
            if text is None:
                continue
            first = text.split()[0] if text.split() else ""
            if first.isdigit() and int(first) < 1 << 60:
                return int(first)
            if first:
                return None  # the cgroup is there and sets no limit
    return None


def _cores() -> int:
    """CPUs this process may use: its affinity, capped by a cgroup CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    for d in _cgroup_dirs("cpu"):
        quota = (_read(f"{d}/cpu.max") or "").split()
        if len(quota) == 2 and quota[0].isdigit():
            return max(1, min(cores, math.ceil(int(quota[0]) / int(quota[1]))))
        q, p = _read(f"{d}/cpu.cfs_quota_us"), _read(f"{d}/cpu.cfs_period_us")
        if q and p and q.strip().lstrip("-").isdigit() and int(q) > 0:
            return max(1, min(cores, math.ceil(int(q) / int(p))))
    return max(1, cores)


def _memory() -> tuple[float, str]:
    """Host memory available to new processes: MemAvailable, or the cgroup's
    memory limit where that is lower."""
    avail = None
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            avail = int(line.split()[1]) * 1024
    limit = _cgroup_limit("memory", ("memory.max", "memory.limit_in_bytes"))
    if limit is not None and (avail is None or limit < avail):
        return float(limit), "cgroup memory limit"
    if avail is None:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "physical memory"
    return float(avail), "available memory"


def _user_tasks() -> int:
    """Tasks (threads) of this user now: what RLIMIT_NPROC counts."""
    uid, n = os.getuid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    n += len(os.listdir(f"/proc/{entry}/task"))
            except OSError:
                continue
    return n


def _rank_limit(cores: int) -> tuple[int, str]:
    """Rank processes one point may start, and why: a few per core, within
    what RLIMIT_NPROC (not for root) and the cgroup's pids.max leave room for."""
    limit = max(MIN_RANK_LIMIT, RANKS_PER_CORE * cores)
    why = f"{RANKS_PER_CORE} per core, {cores} cores"
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY and os.geteuid() != 0:
        room = max(0, soft - _user_tasks()) // THREADS_PER_RANK
        if room < limit:
            limit, why = room, f"RLIMIT_NPROC={soft} leaves room for {room} ranks of ~{THREADS_PER_RANK} threads"
    pids = _cgroup_limit("pids", ("pids.max",))
    if pids is not None:
        current = _cgroup_limit("pids", ("pids.current",)) or 0
        room = max(0, pids - current) // THREADS_PER_RANK
        if room < limit:
            limit, why = room, f"the cgroup's pids.max={pids} leaves room for {room} ranks of ~{THREADS_PER_RANK} threads"
    return limit, why


def _gpus() -> tuple[int, float]:
    """(GPUs, memory of the smallest) through torch, (0, 0) without CUDA."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0, 0.0
    if not torch.cuda.is_available():
        return 0, 0.0
    n = torch.cuda.device_count()
    return n, float(min(torch.cuda.get_device_properties(i).total_memory for i in range(n)))


def this_machine() -> Machine:
    """The machine this process runs on."""
    cores = _cores()
    memory, source = _memory()
    ranks, why = _rank_limit(cores)
    gpus, gpu_bytes = _gpus()
    return Machine(cores, memory, source, ranks, why, gpus, gpu_bytes)


# --- one point --------------------------------------------------------------------------


def world(cfg: Mapping[str, Any], gpus: int) -> tuple[str, str]:
    """``(backend, device)`` of a point: ``auto`` resolved as matrix.point.resolve does."""
    device, backend = cfg.get("device", "auto"), cfg.get("backend", "auto")
    cp = cfg["cp_size"]
    if device == "auto":
        device = "cuda" if backend == "nccl" or (backend == "auto" and 0 < gpus and gpus >= cp) else "cpu"
    if backend == "auto":
        backend = "nccl" if device == "cuda" and gpus >= cp else "gloo"
    return backend, device


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2}.get(dtype, 4)


def _kinds(cfg: Mapping[str, Any], plan: Any) -> tuple[str, list[str]]:
    """The point's mode and, per implementation, what it does: ``full`` (a
    timed gather/scatter round trip), ``dispatch`` (a timed all-to-all),
    ``refused``/``passthrough``/``skipped`` (checked, not timed)."""
    from nsa_cp_comm import impls as impl_registry
    from nsa_cp_comm.modes import mlp_mode

    from .point import impls_for

    derived = mlp_mode(cfg.get("moe_a2a_backend", "none")).value
    mode = derived if cfg.get("mlp_mode", "auto") == "auto" else cfg["mlp_mode"]
    kinds = []
    for name in impls_for(cfg.get("impl", "both"), mode):
        try:
            impl = impl_registry.get(name)
        except Exception:  # noqa: BLE001 - an outside implementation that does not load: count it as a round trip
            kinds.append("full" if mode == "FULL" else "skipped")
            continue
        if getattr(impl, "mode", "FULL") == "SCATTERED":
            kinds.append("dispatch" if mode == "SCATTERED" else "skipped")
        elif mode == "SCATTERED":
            kinds.append("passthrough")
        elif getattr(impl, "needs_even", False) and not plan.is_even:
            kinds.append("refused")
        else:
            kinds.append("full")
    return mode, kinds


def _memory_key(cfg: Mapping[str, Any], plan: Any, base: float, weights: float, buffers: float) -> str:
    """The key to name for a point's memory: the rank count when the ranks'
    own memory dominates, the experts when their weights do, else what makes
    the buffers large (relative to a production shape: H=7168, 16k tokens)."""
    if base * 2 >= base + weights + buffers:
        return "cp_size"
    if weights >= buffers:
        return "num_experts"
    if cfg.get("align") and plan.padded_total >= 2 * sum(plan.seq_lens):
        return "align"
    return "hidden_size" if cfg["hidden_size"] / 7168 >= plan.padded_total / 16384 else "seq_lens"


def estimate(cfg: Mapping[str, Any], machine: Machine | None = None) -> Estimate:
    """Ranks, memory per rank and seconds of one (validated) point on
    ``machine`` (default: this one)."""
    from nsa_cp_comm.plan import plan_split

    machine = machine or this_machine()
    cp, H = cfg["cp_size"], cfg["hidden_size"]
    item = _itemsize(cfg.get("dtype", "float32"))
    backend, device = world(cfg, machine.gpus)
    policy = "zigzag_page" if cfg.get("shared_kv") else cfg.get("split", "zigzag")
    page = cfg.get("page_size", 1) if policy == "zigzag_page" else 1
    plan = plan_split(list(cfg["seq_lens"]), cp, policy=policy, page_size=page, align=cfg.get("align"))
    m, P = plan.max_rank_len, plan.padded_total
    experts = cfg.get("num_experts") or 2 * cp
    topk = min(cfg.get("topk", 2), experts)
    mode, kinds = _kinds(cfg, plan)

    row = H * item
    weights = experts * H * FFN_SIZE * 2 * item + H * experts * 8
    # Checks, one implementation at a time: gathered buffer, scatter probe,
    # the MoE partial and its copy, legacy's on even plans; the reference
    # routes every gathered row in float64, then accumulates in float32.
    # (Measured peaks of CPU ranks came 3-25 % below this.)
    check = P * row * 6 + P * H * 8 + m * row * 3
    # Timed loop, all implementations at once: rotated input sets and partials,
    # the scratch and the pre-sized gathered buffer, and the copy of the
    # first timed iteration's outputs (gathered buffer, scatter output) when
    # it is not the last (the checked calls they are compared with after the
    # loop fit in the timed buffers freed by then).
    n_sets = max(1, min(MAX_SETS, -(-CACHE_BYTES // max((m + P) * row, 1))))
    kept = (P + m) * row if cfg.get("iters", 1) > 1 else 0
    per_full = n_sets * (m + P) * row + 2 * P * row + kept
    per_dispatch = n_sets * m * row + 2 * P * min(topk, cp) * row
    timed = sum(per_full if k == "full" else per_dispatch if k == "dispatch" else 0 for k in kinds)
    buffers = max(check, timed) + m * row * 2  # plus the shard and its copy
    if device == "cuda":
        host, dev = CUDA_RANK_HOST_BYTES, CUDA_CONTEXT_BYTES + weights + buffers
    else:
        host, dev = RANK_BASE_BYTES + weights + buffers, 0.0

    tp = THROUGHPUT.get((device, backend), THROUGHPUT[("cpu", "gloo")])
    share = 1.0 if backend == "nccl" else min(1.0, machine.cores / cp)  # ranks share the cores
    busbw, flops, elements = tp.busbw_Bps * share, tp.flops * share, tp.elements * share
    bus = max(cp - 1, 1) / cp
    iters = cfg.get("warmup", 0) + cfg.get("iters", 1)
    seconds = POINT_OVERHEAD_S
    for k in kinds:
        if k == "full":
            moved = P * row * bus
            seconds += iters * (4 * tp.latency_s + 2 * moved / busbw)
            # checks: ~6 collectives, every rank's shard regenerated and
            # compared (~10 passes over the gathered buffer), routing every
            # gathered row, the experts
            seconds += 6 * (tp.latency_s + moved / busbw) + 10 * P * H / elements
            seconds += 2 * (P * H * experts * 2 + P * topk * H * FFN_SIZE * 4) / flops
        elif k == "dispatch":
            moved = P * min(topk, cp) * row * bus
            seconds += iters * (4 * tp.latency_s + 2 * moved / busbw)
            seconds += 4 * (tp.latency_s + moved / busbw) + 2 * (P * H * experts * 2) / flops
    key = _memory_key(cfg, plan, RANK_BASE_BYTES, weights, buffers)
    return Estimate(cp, backend, device, host, dev, seconds, key, busbw)


# --- a sweep ----------------------------------------------------------------------------


def _size(n: float) -> str:
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{n / MB:.0f} MB"


def _minutes(s: float) -> str:
    return f"{s / 60:.0f} min" if s >= 600 else f"{s / 60:.1f} min"


def _key(cfg: Mapping[str, Any], key: str) -> str:
    return f"{key}={override_value(cfg.get(key))}"


def _starts(ests: Sequence[Estimate]) -> list[Estimate]:
    """The points that start ranks: the first, and each whose world differs
    from the previous point's (matrix.point keeps one warm pool at a time)."""
    return [e for i, e in enumerate(ests) if i == 0 or e.world != ests[i - 1].world]


def _start_seconds(e: Estimate, machine: Machine) -> float:
    tp = THROUGHPUT.get((e.device, e.backend), THROUGHPUT[("cpu", "gloo")])
    return tp.start_s * max(1.0, e.ranks / machine.cores)


def _total_seconds(ests: Sequence[Estimate], machine: Machine) -> float:
    return sum(e.seconds for e in ests) + sum(_start_seconds(e, machine) for e in _starts(ests))


def sweep_estimate(cfgs: Sequence[Mapping[str, Any]], machine: Machine | None = None) -> tuple[float, str]:
    """``(seconds, description)`` of a sweep on this machine, for the dry run:
    e.g. ``(5280.0, "cpu/gloo, 8 rank starts, at ~0.075 GB/s busbw; peak 8 ranks x ~2.6 GiB")``."""
    if not cfgs:
        return 0.0, "no points"
    machine = machine or this_machine()
    ests = [estimate(c, machine) for c in cfgs]
    total = _total_seconds(ests, machine)
    worlds = sorted({f"{e.device}/{e.backend}" for e in ests})
    peak = max(ests, key=lambda e: e.ranks * e.rank_bytes)
    slow = min(e.busbw_Bps for e in ests)
    desc = (f"{', '.join(worlds)}, {len(_starts(ests))} rank starts, at ~{slow / 1e9:.3g} GB/s busbw; "
            f"peak {peak.ranks} ranks x ~{_size(peak.rank_bytes)}")
    return total, desc


FORCE_HINT = "(set force=true to run anyway)"


def _check_point(cfg: Mapping[str, Any], machine: Machine) -> Estimate:
    """Raise ConfigError when one point exceeds the machine; else its estimate."""
    cp = cfg["cp_size"]
    ranks = cp + cfg.get("bystanders", 0)
    if ranks > machine.max_ranks:
        extra = f" bystanders={cfg['bystanders']}" if ranks > cp else ""
        raise ConfigError(
            f"cp_size={cp}{extra}: {ranks} rank processes exceed this machine's limit of {machine.max_ranks} "
            f"({machine.max_ranks_source}) {FORCE_HINT}")
    e = estimate(cfg, machine)
    if e.ranks * e.rank_bytes > machine.memory_bytes:
        raise ConfigError(
            f"{_key(cfg, e.memory_key)}: {e.ranks} ranks x ~{_size(e.rank_bytes)} exceed this machine's "
            f"{_size(machine.memory_bytes)} {machine.memory_source} {FORCE_HINT}")
    if e.device == "cuda" and machine.gpus:
        per_gpu = math.ceil(e.ranks / machine.gpus)
        if per_gpu * e.device_bytes > machine.gpu_bytes:
            raise ConfigError(
                f"{_key(cfg, e.memory_key)}: {per_gpu} ranks per GPU x ~{_size(e.device_bytes)} exceed the "
                f"{_size(machine.gpu_bytes)} of this machine's GPU {FORCE_HINT}")
    return e


def _check_remote(cfg: Mapping[str, Any]) -> None:
    """What holds on any machine: a rank's buffers must fit in a node."""
    node = Machine(cores=1 << 10, memory_bytes=float("inf"), memory_source="", max_ranks=1 << 20,
                   max_ranks_source="", gpus=0, gpu_bytes=0.0)
    e = estimate(cfg, node)
    if e.rank_bytes > REMOTE_MAX_RANK_BYTES:
        raise ConfigError(
            f"{_key(cfg, e.memory_key)}: ~{_size(e.rank_bytes)} per rank exceed any node's memory "
            f"(taken as {_size(REMOTE_MAX_RANK_BYTES)}) {FORCE_HINT}")


def check_sweep(cfgs: Sequence[Mapping[str, Any]], *, runs_here: bool, machine: Machine | None = None) -> None:
    """Refuse (ConfigError, one line naming the key, the estimate and the
    limit) a sweep beyond the machine: a point with more ranks than it may
    start or more memory than it has (host, or GPU), or a sweep estimated to
    run longer than :data:`MAX_SWEEP_S` here. Points with ``force=true`` are
    not checked. With a remote launcher (``runs_here=False``) only what no
    node could hold is refused; the job checks its own node."""
    todo = [c for c in cfgs if not c.get("force", False)]
    if not todo:
        return
    if not runs_here:
        for cfg in todo:
            _check_remote(cfg)
        return
    machine = machine or this_machine()
    ests = [_check_point(cfg, machine) for cfg in todo]
    total = _total_seconds(ests, machine)
    if total > MAX_SWEEP_S:
        i = max(range(len(ests)), key=lambda j: ests[j].seconds)
        big, e = todo[i], ests[i]
        raise ConfigError(
            f"{_key(big, 'cp_size')} {_key(big, 'hidden_size')} {_key(big, 'seq_lens')}: the sweep's "
            f"{len(todo)} points would take ~{_minutes(total)} on this machine ({e.device}/{e.backend} at "
            f"~{e.busbw_Bps / 1e9:.3g} GB/s busbw; this point ~{_minutes(e.seconds)}), over the "
            f"{_minutes(MAX_SWEEP_S)} limit {FORCE_HINT}")
