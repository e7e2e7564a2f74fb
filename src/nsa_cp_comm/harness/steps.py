"""What the timed loop runs for each implementation: the production forms.

Serving code gathers into a pre-sized buffer that it reuses, so a FULL-mode
implementation is timed as its production form
(:meth:`~nsa_cp_comm.impls.RoundTripImpl.production`, :mod:`.production`):
buffers allocated once per point, outside the timed phases; its local work
(the padded path's: copy the shard into its slot, zero its padding rows) a
``local`` phase of its own, apart from the ``gather`` and ``scatter``
collectives; rows that a producer writes in place (``padded_zero_copy``;
``pad_at_split``, padded once at the split before attention) written untimed
in ``reset``, like nccl-tests' in-place column. Implementations without a
production form (the alternatives, most outside ones) are timed as their
``gather``/``scatter`` calls, allocation included. With ``keep``, the first
timed iteration's outputs are copied aside (untimed) and the last one's held
for the ``production_form`` check. Dispatch implementations time ``dispatch`` as the
gather phase and ``combine`` as the scatter phase (routing and the experts
are not timed).

No step checks its inputs: the ranks agreed on them in the correctness phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .. import impls as impl_registry
from ..collectives import all_gather_into, reduce_scatter_into
from ..moe import ReferenceMoE
from ..plan import CPPlan
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


def _aside(x: object) -> object:
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


@dataclass
class RoundTripSteps(Steps):
    """A FULL-mode implementation's timed steps, with its input sets
    (``inputs[i]``: this rank's rows and the scatter's partials) and, with
    ``keep``, what its first timed iteration returned (copies) and its last
    returned (the form's own buffers) (``kept[k] = (input set, gathered
    buffer, scatter output)``)."""

    inputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    kept: dict[int, tuple[int, object, object]] = field(default_factory=dict)

    def release(self) -> None:
        """After the loop: drop the production form's buffers and the input
        sets no kept iteration used, keeping what the ``production_form``
        check reads (so its checked calls do not add to the loop's peak)."""
        self.phases, self.reset, self.after = [], None, None
        used = {i for i, _, _ in self.kept.values()}
        self.inputs = {i: v for i, v in self.inputs.items() if i in used}


def full_steps(impl: impl_registry.RoundTripImpl, spec: PointSpec, plan: CPPlan, rank: int, device,
               group: dist.ProcessGroup | None, *, keep: bool = False) -> RoundTripSteps:
    """The timed form of a FULL-mode implementation at this point: its
    production form, whatever the implementation (no branch on its name)."""
    dtype = DTYPES[spec.dtype]
    rows = impl.buffer_rows(plan)
    set_bytes = (plan.per_rank_tokens[rank] + rows) * spec.hidden_size * dtype.itemsize
    n_sets = rotation(set_bytes)
    locals_ = [make_shard(spec, plan, rank, device, salt=i) for i in range(n_sets)]
    partials = _partials(rows, spec, n_sets, device)
    form = impl.production(plan, spec.hidden_size, dtype, device, group)
    produced = form.stage if form.produced else None
    timed_stage = form.stage if not form.produced else None
    out: dict[str, object] = {}
    kept: dict[int, tuple[int, object, object]] = {}

    def reset(i: int) -> None:
        form.partials.copy_(partials[i])  # the scatter consumes its input
        if produced is not None:
            produced(locals_[i])  # the producer writes its rows in place

    # Outputs are held only to be kept: a held fresh buffer would double a
    # calls form's peak memory.
    def gather(i: int) -> None:
        g = form.gather(locals_[i])
        if keep:
            out["gathered"] = g

    def scatter(i: int) -> None:
        o = form.scatter()
        if keep:
            out["scattered"] = o

    def keep_ends(i: int, k: int, iters: int) -> None:
        # The last iteration's outputs stay valid in the form's buffers after
        # the loop (nothing writes them later): held, not copied. The first's
        # are copied aside before the next iteration overwrites them.
        if k == iters - 1:
            kept[k] = (i, out["gathered"], out["scattered"])
        elif k == 0:
            kept[k] = (i, _aside(out["gathered"]), _aside(out["scattered"]))
        out.clear()

    phases = [("gather", gather), ("scatter", scatter)]
    if timed_stage is not None:
        phases.insert(0, ("local", lambda i: timed_stage(locals_[i])))
    return RoundTripSteps(impl.name, phases, reset=reset, n_sets=n_sets, after=keep_ends if keep else None,
                          inputs=dict(enumerate(zip(locals_, partials))), kept=kept)


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
