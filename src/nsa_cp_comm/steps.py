"""What the timed loop runs for each implementation: the production forms.

Serving code gathers into a pre-sized buffer that it reuses, so the padded and
legacy implementations are timed that way: buffers are allocated once per
point, outside the timed phases, and the padded path's local work (copy the
shard into its slot, zero its padding rows) is its own ``local`` phase, apart
from the ``gather`` and ``scatter`` collectives. ``padded_zero_copy`` and
``pad_at_split`` (rows padded once at the split, before attention) have no
local phase: its rows are produced in their slot (the copy happens untimed in
``reset``, standing in for the producer), like nccl-tests' in-place column.
Other implementations (the alternatives, outside ones) are timed as their
``gather``/``scatter`` calls, allocation included. Dispatch implementations
time ``dispatch`` as the gather phase and ``combine`` as the scatter phase
(routing and the experts are not timed).

No step checks its inputs: the ranks agreed on them in the correctness phase.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import impls as impl_registry
from .collectives import all_gather_into, reduce_scatter_into
from .moe import ReferenceMoE
from .plan import CPPlan
from .roundtrip import padded_stage
from .spec import DTYPES, PointSpec, make_shard
from .timing import Steps

# Input sets rotate so a small point does not time a warm cache.
MAX_SETS = 4
CACHE_BYTES = 64 << 20


def rotation(set_bytes: int) -> int:
    """How many input sets to rotate through: enough to outgrow a 64 MiB
    cache, at most :data:`MAX_SETS` (memory)."""
    return max(1, min(MAX_SETS, -(-CACHE_BYTES // max(set_bytes, 1))))


def _partials(rows: int, spec: PointSpec, n_sets: int, device) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(spec.seed + 104729)
    dtype = DTYPES[spec.dtype]
    return [torch.randn(rows, spec.hidden_size, generator=g).to(device=device, dtype=dtype) for _ in range(n_sets)]


def full_steps(impl: impl_registry.RoundTripImpl, spec: PointSpec, plan: CPPlan, rank: int, device,
               group: dist.ProcessGroup | None) -> Steps:
    """The timed form of a FULL-mode implementation at this point."""
    dtype = DTYPES[spec.dtype]
    rows = impl.buffer_rows(plan)
    set_bytes = (plan.per_rank_tokens[rank] + rows) * spec.hidden_size * dtype.itemsize
    n_sets = rotation(set_bytes)
    locals_ = [make_shard(spec, plan, rank, device, salt=i) for i in range(n_sets)]
    partials = _partials(rows, spec, n_sets, device)
    scratch = torch.empty_like(partials[0])
    chunk = scratch.tensor_split(plan.cp_size)[rank]

    def refill(i: int) -> None:
        scratch.copy_(partials[i])  # the scatter consumes its input

    def reduce_scatter(i: int) -> None:
        reduce_scatter_into(chunk, scratch, group)

    m, n = impl.stride(plan), plan.per_rank_tokens[rank]
    if impl.name in ("padded", "padded_zero_copy", "pad_at_split"):
        # pad_at_split: the rows were padded at the split, before attention, so
        # each layer gathers its [P, H] block as it is (no local phase), like
        # the zero-copy form with P in place of max_rank_len.
        full = torch.zeros((rows, spec.hidden_size), dtype=dtype, device=device)
        block = full[rank * m : (rank + 1) * m]

        def gather(i: int) -> None:
            all_gather_into(full, block, group)

        if impl.name == "padded":
            return Steps(impl.name, [("local", lambda i: padded_stage(full, locals_[i], plan, rank)),
                                     ("gather", gather), ("scatter", reduce_scatter)], reset=refill, n_sets=n_sets)

        def produce(i: int) -> None:
            refill(i)
            full[rank * m : rank * m + n].copy_(locals_[i])  # the producer writes its rows in place

        return Steps(impl.name, [("gather", gather), ("scatter", reduce_scatter)], reset=produce, n_sets=n_sets)
    if impl.name == "legacy":
        out = torch.empty((plan.total_tokens, spec.hidden_size), dtype=dtype, device=device)

        def legacy_gather(i: int) -> None:
            all_gather_into(out, locals_[i], group)

        return Steps(impl.name, [("gather", legacy_gather), ("scatter", reduce_scatter)], reset=refill, n_sets=n_sets)

    def gather_call(i: int) -> None:
        impl.gather(locals_[i], plan, group)

    def scatter_call(i: int) -> None:
        impl.scatter(scratch, plan, group)

    return Steps(impl.name, [("gather", gather_call), ("scatter", scatter_call)], reset=refill, n_sets=n_sets)


def dispatch_steps(impl: impl_registry.DispatchImpl, spec: PointSpec, plan: CPPlan, rank: int, device,
                   moe: ReferenceMoE, group: dist.ProcessGroup | None) -> Steps:
    """The timed form of a dispatch implementation: dispatch, then combine."""
    per = moe.num_experts // plan.cp_size
    set_bytes = 2 * plan.per_rank_tokens[rank] * spec.hidden_size * DTYPES[spec.dtype].itemsize
    n_sets = rotation(set_bytes)
    sets = []
    for i in range(n_sets):
        x = make_shard(spec, plan, rank, device, salt=i)
        sets.append((x, *moe.route(x)))
    state: dict[str, object] = {}

    def dispatch(i: int) -> None:
        x, idx, weight = sets[i]
        state["recv"], state["handle"] = impl.dispatch(x, idx, weight, per, group)

    def combine(i: int) -> None:
        impl.combine(state["recv"], state["handle"], group)

    return Steps(impl.name, [("gather", dispatch), ("scatter", combine)], n_sets=n_sets)


# The control's name in the timed loop: never an implementation's (a leading
# underscore is not a valid registry name).
CONTROL = "_control"


def control_steps(spec: PointSpec, plan: CPPlan, rank: int, device, group: dist.ProcessGroup | None) -> Steps:
    """The A/A control timed in the same loop as the implementations: a bare
    all-gather into the padded ``[max*cp, H]`` buffer and a reduce-scatter of
    it, torch's calls with nothing of this project's around them. An
    implementation's time over the control's in the same iteration moves with
    the implementation's code, hardly with the machine's load, which both share."""
    dtype = DTYPES[spec.dtype]
    m = plan.max_rank_len
    full = torch.zeros((plan.padded_total, spec.hidden_size), dtype=dtype, device=device)
    block = full[rank * m : (rank + 1) * m]
    scratch = torch.zeros_like(full)
    chunk = scratch.tensor_split(plan.cp_size)[rank]
    return Steps(CONTROL, [("gather", lambda i: all_gather_into(full, block, group)),
                           ("scatter", lambda i: reduce_scatter_into(chunk, scratch, group))])
