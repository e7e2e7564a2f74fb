"""Rank-side tasks of ``bench_comm.py`` (a module of their own so the rank
processes can import them: a function of ``__main__`` cannot be pickled to them).

Each task runs on every rank of a :class:`nsa_cp_comm.ranks.RankPool`, checks
correctness first (failures are returned, never raised) and returns per-rank
per-iteration samples in microseconds; the driver takes the max over ranks per
iteration (:func:`nsa_cp_comm.timing.max_over_ranks`).
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from nsa_cp_comm.collectives import all_gather_into, reduce_scatter_into
from nsa_cp_comm.measure import DTYPES, PointSpec, bitwise_equal, make_shard
from nsa_cp_comm.moe import max_rel_err, tolerance
from nsa_cp_comm.ranks import rank_device
from nsa_cp_comm.roundtrip import legacy_gather, legacy_scatter, padded_gather, padded_scatter
from nsa_cp_comm.timing import CacheFlusher, Clock

# "control" is the legacy path again: the legacy/control ratio is an A/A
# measurement of the machine's noise floor, printed next to padded/legacy.
PATHS = {
    "legacy": (legacy_gather, legacy_scatter),
    "padded": (padded_gather, padded_scatter),
    "control": (legacy_gather, legacy_scatter),
}
ORDERS = list(itertools.permutations(PATHS))


def even_ratio_task(spec: PointSpec) -> dict:
    """padded vs legacy round trips on an even plan, **interleaved** (each
    iteration runs every path once, in a rotating order) so that drift on a
    shared machine hits all alike; with an A/A control (legacy once more).
    Correctness: the padded buffer has no padding row and both paths give the
    same bits."""
    rank, device = dist.get_rank(), rank_device()
    plan = spec.plan()
    failures: list[str] = []
    if not plan.is_even:
        return {"failures": [f"plan {plan.per_rank_tokens} is not even"], "samples": {}}
    locals_ = [make_shard(spec, plan, rank, device, salt=i) for i in range(2)]
    lf, pf = legacy_gather(locals_[0], plan), padded_gather(locals_[0], plan)
    if pf.shape[0] != plan.total_tokens:
        failures.append(f"rank {rank}: padded buffer has {pf.shape[0]} rows on an even plan of {plan.total_tokens}")
    elif not bitwise_equal(pf, lf):
        failures.append(f"rank {rank}: padded and legacy gathers differ")
    if not bitwise_equal(padded_scatter(pf.clone(), plan), legacy_scatter(lf.clone(), plan)):
        failures.append(f"rank {rank}: padded and legacy scatters differ")
    clock = Clock(device)
    flush = CacheFlusher(device) if spec.flush_l2 else None
    samples: dict[str, list[float]] = {f"{p}_{ph}": [] for p in PATHS for ph in ("gather", "scatter", "roundtrip")}
    for it in range(spec.warmup + spec.iters):
        order = ORDERS[it % len(ORDERS)]
        x = locals_[it % 2]
        for name in order:
            gather, scatter = PATHS[name]
            if flush:
                flush()
            clock.sync()
            dist.barrier()
            t0 = clock.mark()
            full = gather(x, plan)
            t1 = clock.mark()
            scatter(full, plan)
            t2 = clock.mark()
            clock.sync()
            if it >= spec.warmup:
                samples[f"{name}_gather"].append(clock.elapsed_us(t0, t1))
                samples[f"{name}_scatter"].append(clock.elapsed_us(t1, t2))
                samples[f"{name}_roundtrip"].append(clock.elapsed_us(t0, t2))
    return {"failures": failures, "samples": samples}


LOCAL_STEPS = ("alloc", "zero_pad", "copy_in", "all_gather", "split", "reduce_scatter", "slice")
COLLECTIVE_STEPS = ("all_gather", "reduce_scatter")


def local_work_task(spec: PointSpec) -> dict:
    """The padded round trip (``padded_buffer`` + copy + ``padded_gather_`` +
    ``padded_scatter``) split into its steps, each timed in place: the
    allocation of the ``[m*cp, H]`` buffer, zeroing this rank's padding rows,
    the copy of the shard into its slot, the all-gather, the chunk split, the
    reduce-scatter, the slice. Everything but the two collectives is local
    work. The steps are the library's, written out (see roundtrip.py); the
    first (warm-up) iteration is checked against the expected bytes."""
    rank, device = dist.get_rank(), rank_device()
    plan = spec.plan()
    cp, m, n, hidden = plan.cp_size, plan.max_rank_len, plan.per_rank_tokens[rank], spec.hidden_size
    dtype = DTYPES[spec.dtype]
    local = make_shard(spec, plan, rank, device)
    failures: list[str] = []
    # Correctness of the library's padded path on this plan, once.
    full = padded_gather(local, plan)
    peer = (rank + 1) % cp
    if not bitwise_equal(full[rank * m : rank * m + n], local) or not bitwise_equal(
        full[peer * m : peer * m + plan.per_rank_tokens[peer]], make_shard(spec, plan, peer, device)
    ):
        failures.append(f"rank {rank}: gathered rows differ")
    for r in range(cp):
        if bool(full[r * m + plan.per_rank_tokens[r] : (r + 1) * m].ne(0).any()):
            failures.append(f"rank {rank}: padding rows of rank {r} are not zero")
    # Every rank holds the same gathered buffer, so the reduce-scatter gives cp * local.
    out = padded_scatter(full, plan)
    err = max_rel_err(out, local.to(torch.float32) * cp)
    if not err <= tolerance(dtype, cp):
        failures.append(f"rank {rank}: scatter of the gathered rows: max_rel_err {err:.3g}")
    del full, out
    clock = Clock(device)
    flush = CacheFlusher(device) if spec.flush_l2 else None
    samples: dict[str, list[float]] = {s: [] for s in (*LOCAL_STEPS, "roundtrip")}
    for it in range(spec.warmup + spec.iters):
        if flush:
            flush()
        clock.sync()
        dist.barrier()
        t = [clock.mark()]
        full = torch.empty((plan.padded_total, hidden), dtype=dtype, device=device)
        t.append(clock.mark())
        full[rank * m + n : (rank + 1) * m].zero_()
        t.append(clock.mark())
        full[rank * m : rank * m + n].copy_(local)
        t.append(clock.mark())
        all_gather_into(full, full[rank * m : (rank + 1) * m])
        t.append(clock.mark())
        chunk = full.contiguous().tensor_split(cp)[rank]
        t.append(clock.mark())
        reduce_scatter_into(chunk, full)
        t.append(clock.mark())
        out = chunk[:n]
        t.append(clock.mark())
        clock.sync()
        del out, chunk, full
        if it >= spec.warmup:
            for step, (a, b) in zip(LOCAL_STEPS, zip(t, t[1:])):
                samples[step].append(clock.elapsed_us(a, b))
            samples["roundtrip"].append(clock.elapsed_us(t[0], t[-1]))
    return {"failures": failures, "samples": samples}
