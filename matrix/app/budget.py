"""Bounds from the machine: what a sweep will cost, checked before it runs.

:func:`estimate` puts figures on a resolved point (matrix.app.resolve): rank
processes, memory per rank, seconds on the machine's device;
:func:`check_sweep` refuses a sweep beyond the machine
(nsa_cp_comm.harness.machine), hours where minutes were meant included (the
GPU preset on a CPU-only machine). :func:`sweep_estimate` is the dry run's
figure. The constants below are order-of-magnitude figures (of a 2-core CPU
machine): they catch a mistyped ``cp_size`` or a production shape on a laptop,
not predict run times. Memory counts the buffers a point
allocates (harness.checks, harness.steps) and the reference MoE's weights.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nsa_cp_comm import impls as impl_registry
from nsa_cp_comm.harness import calibrate
from nsa_cp_comm.harness.machine import Machine, load_factor as cores_load_factor, this_machine
from nsa_cp_comm.harness.spec import DTYPE_BYTES
from nsa_cp_comm.modes import REFERENCE_FFN_SIZE as FFN_SIZE  # the experts the checks build
from nsa_cp_comm.protocol import shard_len

from .config import ConfigError, override_value
from .resolve import Resolved

MB, GIB = 1e6, float(1 << 30)
# Memory of a rank before a point's buffers (interpreter + torch + gloo): an
# idle rank's anonymous memory is ~150 MB, plus torch's shared libraries
# mapped in, 75-135 MB (more in a freshly installed environment, whose files
# were just written); after a point's checks ~100 MB more.
RANK_BASE_BYTES = 370 * MB
# A CUDA rank also holds the CUDA runtime on the host, and a context on its GPU.
CUDA_RANK_HOST_BYTES, CUDA_CONTEXT_BYTES = 600 * MB, 500 * MB
MAX_SWEEP_S = 3600.0  # a sweep estimated to take longer here is refused
REMOTE_MAX_RANK_BYTES = 2 * (1 << 40)  # remote launchers: refuse only what no node holds
POINT_OVERHEAD_S = 0.3  # per point: sending the task, folding reports, writing the rows
FORCE_HINT = "(set force=true to run anyway)"


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


@dataclass(frozen=True)
class Estimate:
    """One point's cost. ``seconds``: its checks and timed loop on its ranks;
    ``start_s``: starting them, counted where the sweep changes world
    (:func:`sweep_estimate`)."""

    ranks: int  # rank processes: the CP group and its bystanders
    backend: str
    device: str
    rank_bytes: float  # host memory per rank
    device_bytes: float  # GPU memory per rank (0 on CPU)
    memory_key: str  # the key that drives the memory figure: cp_size, hidden_size, seq_lens, align, num_experts
    seconds: float
    start_s: float
    busbw_Bps: float  # the bandwidth the estimate assumes per collective

    @property
    def world(self) -> tuple[int, str, str]:
        return (self.ranks, self.backend, self.device)


def _timed(res: Resolved) -> list[str]:
    """What each implementation times: ``full`` (a gather/scatter round trip)
    or ``dispatch`` (an all-to-all); the refused, passed-through and skipped
    ones are checked, not timed, and left out."""
    if res.skip:
        return []
    own = [impl for impl in map(impl_registry.get, res.impls) if impl.mode == res.mode]
    if res.mode == "SCATTERED":
        return ["dispatch"] * len(own)
    return ["full" for impl in own if res.plan().is_even or not impl.needs_even]


def estimate(res: Resolved, machine: Machine | None = None) -> Estimate:
    """Ranks, memory per rank and seconds of a resolved point on ``machine``
    (default: this one)."""
    machine = machine or this_machine()
    spec, plan, kinds = res.spec, res.plan(), _timed(res)
    cp, H, ranks, experts, topk = spec.cp_size, spec.hidden_size, spec.world_size, spec.experts, spec.topk
    m, P, item = plan.max_rank_len, plan.padded_total, DTYPE_BYTES[spec.dtype]
    # An implementation that takes the split's padded shard ([P_r, H], the
    # engine's physical length) gathers P_r*cp rows, at least m*cp.
    if any(getattr(impl_registry.get(name), "shard", "rows") == "padded" for name in res.impls):
        P = max(P, shard_len(plan) * cp)
    row = H * item

    # the routed experts' weights, the shared expert's (drawn whatever its placement), the router
    weights = (experts + 1) * H * FFN_SIZE * 2 * item + H * experts * 8
    # Checks, one implementation at a time: gathered buffer, scatter probe,
    # the MoE partial and its copy, legacy's on even plans; the reference
    # routes every gathered row in float64, then accumulates in float32.
    # (Measured peaks of CPU ranks came 3-25 % below this.) A replicated
    # shared expert's output on the gathered rows takes the place of the
    # partial, which is let go before legacy's recomputation; its transients
    # (in the rows' dtype, added into the float32 accumulator in place) stay
    # below the float64 routing's.
    check = P * row * 6 + P * H * 8 + m * row * 3
    # Timed loop, all implementations at once: per FULL implementation its
    # input rows, its form's gathered buffer and partials, and the check of
    # every iteration (its partials pattern, the expected sum); every rank's
    # rows once, which that check compares with. Per dispatch implementation:
    # its input rows and their check, the received rows, what the combine is
    # handed and the expected rows (each at most every rank's rows routed here).
    per_full = 2 * m * row + 3 * P * row
    per_dispatch = 2 * m * row + 3 * P * min(topk, cp) * row
    timed = sum(per_full if k == "full" else per_dispatch for k in kinds) + P * row
    buffers = max(check, timed) + m * row * 2  # plus the shard and its copy
    if res.device == "cuda":
        rank_bytes, dev = CUDA_RANK_HOST_BYTES, CUDA_CONTEXT_BYTES + weights + buffers
    else:
        rank_bytes, dev = RANK_BASE_BYTES + weights + buffers, 0.0

    tp = THROUGHPUT.get((res.device, res.backend), THROUGHPUT[("cpu", "gloo")])
    share = 1.0 if res.backend == "nccl" else min(1.0, machine.cores / ranks)  # ranks share the cores
    busbw, flops, elements = tp.busbw_Bps * share, tp.flops * share, tp.elements * share
    bus, iters = max(cp - 1, 1) / cp, spec.max_iters
    seconds = POINT_OVERHEAD_S
    loop_s = warm_s = 0.0
    for k in kinds:
        full = k == "full"
        moved = P * row * bus * (1 if full else min(topk, cp))
        loop_s += iters * (4 * tp.latency_s + 2 * moved / busbw)
        warm_s += spec.warmup * (4 * tp.latency_s + 2 * moved / busbw)
        seconds += 2 * P * H * experts * 2 / flops
        # checks: ~6 collectives, every rank's shard regenerated and compared
        # (~10 passes over the gathered buffer), routing every gathered row,
        # the experts; a dispatch's checks: ~4 collectives and the routing
        seconds += (6 if full else 4) * (tp.latency_s + moved / busbw)
        if full:
            seconds += 10 * P * H / elements + 2 * P * topk * H * FFN_SIZE * 4 / flops
    # iters=auto's timed iterations stop at its time cap, if not before; its
    # warm-up iterations run first, outside the cap
    seconds += warm_s + (min(loop_s, calibrate.time_cap()) if calibrate.is_auto(spec.iters) else loop_s)
    start_s = tp.start_s * max(1.0, ranks / machine.cores)
    key = _memory_key(res, weights, buffers)
    return Estimate(ranks, res.backend, res.device, rank_bytes, dev, key, seconds, start_s, busbw)


# The least time ranks get to start, and how many times the estimate a start may take:
# on a loaded 2-core machine, 8 ranks took over 180 s where 12 s is the idle estimate.
STARTUP_MIN_S = 60.0
STARTUP_MARGIN = 10.0


def load_factor(machine: Machine, load: float | None = None) -> tuple[float, float]:
    """``(factor, load)`` on ``machine``: :func:`nsa_cp_comm.harness.machine.load_factor`."""
    return cores_load_factor(machine.cores, load)


def startup_timeout_s(res: Resolved, machine: Machine | None = None, load: float | None = None) -> float:
    """How long a point's ranks get to start (``startup_timeout_s=null``): ten
    times the estimate for its world on this machine, scaled by its
    :func:`load_factor`, never below :data:`STARTUP_MIN_S`."""
    machine = machine or this_machine()
    start_s = estimate(res, machine).start_s
    return max(STARTUP_MIN_S, STARTUP_MARGIN * start_s * load_factor(machine, load)[0])


def _memory_key(res: Resolved, weights: float, buffers: float) -> str:
    """The key to name for a point's memory: the rank count when the ranks'
    own memory dominates, the experts when their weights do, else what makes
    the buffers large (relative to a production shape: H=7168, 16k tokens)."""
    plan = res.plan()
    if RANK_BASE_BYTES >= weights + buffers:
        return "cp_size"
    if weights >= buffers:
        return "num_experts"
    if res.spec.align and plan.padded_total >= 2 * sum(plan.seq_lens):
        return "align"
    return "hidden_size" if res.spec.hidden_size / 7168 >= plan.padded_total / 16384 else "seq_lens"


# --- a sweep ----------------------------------------------------------------------------


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MB:.0f} MB"


def _minutes(s: float) -> str:
    return f"{s / 60:.0f} min" if s >= 600 else f"{s / 60:.1f} min"


def _key(res: Resolved, *keys: str) -> str:
    """``key=value`` of each key as the config gave it (the spec keeps the given values)."""
    return " ".join(f"{key}={override_value(getattr(res.spec, key))}" for key in keys)


def _over(key: str, estimate: str, limit: str) -> ConfigError:
    """The one-line refusal: the key that drives the estimate, the estimate, the limit."""
    return ConfigError(f"{key}: {estimate} exceed {limit} {FORCE_HINT}")


def _starts(ests: Sequence[Estimate]) -> list[Estimate]:
    """The points that start ranks: the first, and each whose world differs
    from the previous point's (matrix.app.point keeps one warm pool at a time)."""
    return [e for i, e in enumerate(ests) if i == 0 or e.world != ests[i - 1].world]


def _total_seconds(ests: Sequence[Estimate]) -> float:
    return sum(e.seconds for e in ests) + sum(e.start_s for e in _starts(ests))


def sweep_estimate(points: Sequence[Resolved], machine: Machine | None = None) -> tuple[float, str]:
    """``(seconds, description)`` of a sweep on this machine idle, for the dry
    run (which scales it by :func:`load_factor` too) and the sweep's time
    bound: e.g. ``(5280.0, "cpu/gloo, 8 rank starts, at ~0.075 GB/s busbw;
    peak 8 ranks x ~2.6 GiB")``."""
    if not points:
        return 0.0, "no points"
    machine = machine or this_machine()
    ests = [estimate(p, machine) for p in points]
    worlds = sorted({f"{e.device}/{e.backend}" for e in ests})
    peak = max(ests, key=lambda e: e.ranks * e.rank_bytes)
    slow = min(e.busbw_Bps for e in ests)
    return _total_seconds(ests), (
        f"{', '.join(worlds)}, {len(_starts(ests))} rank starts, at ~{slow / 1e9:.3g} GB/s busbw; "
        f"peak {peak.ranks} ranks x ~{_size(peak.rank_bytes)}")


def past_timeout(points: Sequence[Any], machine: Machine) -> str:
    """One warning line for the points (preflight's: ``.resolved``, ``.cfg``) whose
    estimate at this machine's load now (:func:`load_factor`) is past their
    ``timeout_s``, which would end them as ``timeout`` rows; '' when none is."""
    factor = load_factor(machine)[0]
    over = [(i, estimate(p.resolved, machine).seconds * factor, float(p.cfg["timeout_s"]))
            for i, p in enumerate(points)]
    over = [o for o in over if o[1] > o[2]]
    if not over:
        return ""
    i, seconds, limit = max(over, key=lambda o: o[1] / o[2])
    return (f"warning: {len(over)} point(s) estimated past their timeout_s, e.g. point {i}: ~{seconds:.0f} s against "
            f"timeout_s={limit:g}: they would end as timeout rows; raise timeout_s")


def check_world(cfg: Mapping[str, Any], machine: Machine | None = None) -> None:
    """Refuse (ConfigError, as :func:`check_sweep` would) a point whose ranks
    this machine may not start, from its config alone: before it is planned
    (a large batch at a large cp_size takes seconds and gigabytes to plan,
    only to be refused for its ranks). ``force=true`` is not checked."""
    if cfg.get("force"):
        return
    machine = machine or this_machine()
    world = int(cfg["cp_size"]) + int(cfg.get("bystanders") or 0)
    if world > machine.max_ranks:
        key = " ".join(f"{k}={override_value(cfg[k])}" for k in ("cp_size", "bystanders")
                       if k == "cp_size" or cfg.get(k))
        raise _over(key, f"{world} rank processes",
                    f"this machine's limit of {machine.max_ranks} ({machine.max_ranks_source})")


def _check_point(res: Resolved, machine: Machine) -> Estimate:
    """Raise ConfigError when one point exceeds the machine; else its estimate."""
    check_world({"cp_size": res.spec.cp_size, "bystanders": res.spec.bystanders}, machine)
    e = estimate(res, machine)
    if e.ranks * e.rank_bytes > machine.memory_bytes:
        raise _over(_key(res, e.memory_key), f"{e.ranks} ranks x ~{_size(e.rank_bytes)}",
                    f"this machine's {_size(machine.memory_bytes)} {machine.memory_source}")
    per_gpu = math.ceil(e.ranks / machine.gpus) if e.device == "cuda" and machine.gpus else 0
    if per_gpu * e.device_bytes > machine.gpu_bytes:
        raise _over(_key(res, e.memory_key), f"{per_gpu} ranks per GPU x ~{_size(e.device_bytes)}",
                    f"the {_size(machine.gpu_bytes)} of this machine's GPU")
    return e


def check_sweep(points: Sequence[Resolved], *, runs_here: bool, machine: Machine | None = None) -> None:
    """Refuse (ConfigError, one line naming the key, the estimate and the
    limit) a sweep beyond the machine: a point with more ranks than it may
    start or more memory than it has (host, or GPU), or a sweep estimated to
    run longer than :data:`MAX_SWEEP_S` here. Points with ``force=true`` are
    not checked. With a remote launcher (``runs_here=False``; the points
    resolved by matrix.app.resolve.resolve_remote) only a rank's buffers beyond
    any node are refused; the job checks its own node."""
    todo = [p for p in points if not p.force]
    if not todo:
        return
    if not runs_here:
        node = Machine(1 << 10, float("inf"), "", 1 << 20, "", 0, 0.0)
        for res in todo:
            e = estimate(res, node)
            if e.rank_bytes > REMOTE_MAX_RANK_BYTES:
                raise _over(_key(res, e.memory_key), f"~{_size(e.rank_bytes)} per rank",
                            f"any node's memory (taken as {_size(REMOTE_MAX_RANK_BYTES)})")
        return
    machine = machine or this_machine()
    ests = [_check_point(res, machine) for res in todo]
    total = _total_seconds(ests)
    if total > MAX_SWEEP_S:
        big, e = max(zip(todo, ests), key=lambda pair: pair[1].seconds)
        raise ConfigError(
            f"{_key(big, 'cp_size', 'hidden_size', 'seq_lens')}: the sweep's {len(todo)} points would take "
            f"~{_minutes(total)} on this machine ({e.device}/{e.backend} at ~{e.busbw_Bps / 1e9:.3g} GB/s busbw; "
            f"this point ~{_minutes(e.seconds)}), over the {_minutes(MAX_SWEEP_S)} limit {FORCE_HINT}")
