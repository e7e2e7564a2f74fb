"""The implementation protocol: what an implementation gives, checked when it is made.

Two kinds of implementation, one per mlp_mode (docs/design.md, "Implementations"):

- :class:`RoundTripImpl` (FULL mode, the all-gather MoE path): ``gather(local,
  plan, group) -> gathered buffer`` and ``scatter(partials, plan, group) ->
  [n_r, H]``, plus where each rank's rows live in the gathered buffer
  (``layout``), the backends it runs on, and whether it needs even plans;
  optionally ``prepare(plan, hidden, dtype, device, group)``, its production
  form (pre-sized buffers reused across calls, :mod:`.production`), which is
  what the timed loop runs; optionally ``scatter_replicated(partials,
  replicated, plan, group)``, the scatter given a replicated term to add
  once (:meth:`RoundTripImpl.scatter_moe`).
- :class:`DispatchImpl` (SCATTERED mode, a MoE all-to-all such as DeepEP):
  ``dispatch(local, topk_idx, topk_weight, experts_per_rank, group) ->
  (received rows, handle)`` and ``combine(expert_outputs, handle, group) ->
  [n_r, H]``. The handle exposes ``recv_idx`` / ``recv_weight`` (the received
  rows' top-k expert ids and weights) and ``rows_sent``.

The project's own implementations (registered in :mod:`.impls`, from which a
plug-in imports these classes too) and outside ones (:mod:`.plugins`) are
made of these classes; a hook's answers are held to its contract by
:mod:`.hooks`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from . import engines
from .hooks import HookError, _shown, _valid_stride, ask
from .modes import BACKENDS
from .plan import CPPlan

if TYPE_CHECKING:
    from .production import Production

LAYOUTS: tuple[str, ...] = ("rank_major_padded", "rank_major_packed")
# What ``gather`` takes and ``scatter`` returns: this rank's ``[n_r, H]`` rows,
# or the split's padded shard ``[P, H]`` (the rows, then ``P - n_r`` zero rows;
# ``P`` from the plan's engine), as an engine that pads at the split keeps it.
SHARDS: tuple[str, ...] = ("rows", "padded")


# A round trip's hooks: the protocol's functions an implementation gives (each checked callable
# when it is made; harness.sites names the one a plug-in's exception was raised under).
REQUIRED_HOOKS: tuple[str, ...] = ("gather", "scatter")
OPTIONAL_HOOKS: tuple[str, ...] = ("prepare", "supports", "row_stride", "scatter_replicated", "gather_side",
                                   "is_padding")


@dataclass(frozen=True)
class RoundTripImpl:
    """A FULL-mode round trip: gather before the MoE, reduce-scatter after it.

    Contract (checked at every matrix point): all ranks pass the same plan;
    ``gather`` leaves ``local`` untouched and returns the gathered buffer in
    ``layout`` (``rank_major_padded``: ``m*cp`` rows, rank ``r`` at ``r*m``,
    zero padding after its ``n_r`` rows; ``rank_major_packed``: ``T`` rows, rank
    ``r`` at ``sum(n_<r)``); ``scatter`` sums the ranks' partial outputs in that
    layout and returns this rank's ``[n_r, H]`` (it may consume its input).
    ``needs_even``: the implementation must refuse uneven plans on every rank,
    before any collective. ``legacy_bits_on_even``: on even plans its results
    must equal legacy's bit for bit (a bool, or a rule of the plan: a
    callable ``plan -> bool`` saying on which even plans it claims them).
    ``supports(plan) -> str``: why it does not run this plan ('' when it
    does; e.g. a plan its engine would not run): a ``skipped`` row with that
    reason, decided from the plan alone. ``prepare(plan, hidden, dtype, device,
    group) -> Production``: the production form the timed loop runs, under
    the same contract as ``gather`` and ``scatter``, checked at every
    iteration (without it, the timed loop runs ``gather`` and ``scatter``).
    ``shard``: ``"rows"`` (``gather`` takes and ``scatter`` returns ``[n_r,
    H]``) or ``"padded"`` (both the split's ``[P, H]``, ``P`` the plan's
    engine's physical length, the padding rows zero in and out; implies
    ``pads_split``, ``rank_major_padded`` with row stride ``P`` by default).
    ``scatter_replicated(partials, replicated, plan, group)`` (optional): the
    scatter of a MoE step that also has a replicated term (a shared expert
    every rank computed whole on the gathered rows: ``replicated``, in the
    gathered layout, the same on every rank): the partials summed over ranks,
    plus this rank's rows of ``replicated`` added once; without it the
    caller adds them to what ``scatter`` returns (:meth:`scatter_moe`).
    ``gather_side(tensor, plan, group)`` (optional): how the round trip
    gathers a row-indexed side tensor beside the hidden states (the router
    logits, ``[rows, experts]``, one row per row ``gather`` takes), into the
    hidden states' layout; without it, ``gather`` itself gathers it. The
    matrix asks for it where the point's engine gathers one (vLLM's router
    logits; on vLLM 0.34's quantized gather first the rows' fp8 bytes,
    ``uint8`` ``[rows, H]``, and their float32 scales) and routes the MoE from
    what comes back. ``is_padding(plan)``
    (optional): the rows of the gathered buffer its runner marks as padding
    (one bool per row, the same on every rank; vLLM builds it rank-major,
    ``rows >= n_r`` in each rank's block: ``v1/worker/gpu/pcp_manager.py``
    lines 630-635 in 0.33.0, 618-623 in 0.34.0), which a router that masks
    what it is told sends to no expert. The matrix asks for it where the
    point's model's router masks padding (vLLM's DeepSeek-V4) and masks the
    rows it names; without it, the rows that are padding (the engine's
    runner marks them).
    """

    name: str
    gather: Callable[..., Any]
    scatter: Callable[..., Any]
    layout: str = "rank_major_padded"
    backends: tuple[str, ...] = BACKENDS
    needs_even: bool = False
    legacy_bits_on_even: bool | Callable[[CPPlan], bool] = True
    doc: str = ""
    origin: str = ""
    # rank_major_padded only: rows per rank's block (default: plan.max_rank_len).
    row_stride: Callable[[CPPlan], int] | None = None
    # The rows are padded to the stride at the split, before attention, which
    # then processes the padding rows too.
    pads_split: bool = False
    prepare: Callable[..., Production] | None = None
    supports: Callable[[CPPlan], str] | None = None
    shard: str = "rows"
    scatter_replicated: Callable[..., Any] | None = None
    gather_side: Callable[..., Any] | None = None
    is_padding: Callable[[CPPlan], Any] | None = None
    mode: ClassVar[str] = "FULL"

    def __post_init__(self) -> None:
        _check_common(self)
        if self.layout not in LAYOUTS:
            raise ValueError(f"impl {self.name!r}: layout={self.layout!r} is not one of {', '.join(LAYOUTS)}")
        for attr in REQUIRED_HOOKS:
            if not callable(getattr(self, attr)):
                raise ValueError(f"impl {self.name!r}: {attr} is not callable")
        for attr in OPTIONAL_HOOKS:
            if getattr(self, attr) is not None and not callable(getattr(self, attr)):
                raise ValueError(f"impl {self.name!r}: {attr} is not callable")
        if self.shard not in SHARDS:
            raise ValueError(f"impl {self.name!r}: shard={self.shard!r} is not one of {', '.join(SHARDS)}")
        if self.shard == "padded":
            if self.layout != "rank_major_padded":
                raise ValueError(f"impl {self.name!r}: shard='padded' needs layout='rank_major_padded', "
                                 f"not {self.layout!r}")
            # the shard is padded at the split: attention holds the padding rows too
            object.__setattr__(self, "pads_split", True)

    def claims_legacy_bits(self, plan: CPPlan) -> bool:
        """Whether its results on ``plan`` must be legacy's bit for bit (even plans only)."""
        if not plan.is_even:
            return False
        if not callable(self.legacy_bits_on_even):
            return bool(self.legacy_bits_on_even)
        claims = ask(self, "legacy_bits_on_even", plan)
        if not isinstance(claims, bool):
            raise HookError(f"impl {self.name!r}: legacy_bits_on_even(plan) returned {_shown(claims)}, not a bool")
        return claims

    def production(self, plan: CPPlan, hidden: int, dtype: Any, device: Any, group: Any) -> Production:
        """The form the timed loop runs at this point: ``prepare``'s, else the
        ``gather`` / ``scatter`` calls themselves."""
        from .production import Production, calls_form

        if self.prepare is None:
            return calls_form(self, plan, hidden, dtype, device, group)
        form = self.prepare(plan, hidden, dtype, device, group)
        if not isinstance(form, Production):
            raise TypeError(f"impl {self.name!r}: prepare returned {type(form).__name__}, not a "
                            "nsa_cp_comm.production.Production")
        return form

    def scatter_moe(self, partials: Any, replicated: Any, plan: CPPlan, group: Any) -> Any:
        """The reduce-scatter after a MoE step: ``scatter(partials)``, and
        with a replicated term (``replicated``: ``[buffer_rows, H]`` in the
        gathered layout, the same on every rank; None when there is none)
        this rank's rows of it added once, after the sum over ranks: by
        ``scatter_replicated`` where the implementation has one, else here.
        Adding it to the partials before the reduce-scatter would count it
        ``cp`` times."""
        if replicated is None:
            return self.scatter(partials, plan, group)
        if self.scatter_replicated is not None:
            return self.scatter_replicated(partials, replicated, plan, group)
        import torch.distributed as dist

        return add_replicated(self.scatter(partials, plan, group), replicated, self, plan, dist.get_rank(group))

    def stride(self, plan: CPPlan) -> int:
        """Rows of each rank's block in the padded layout (its rows, then zeros):
        ``row_stride``'s, else ``P`` for a padded shard, else ``max_rank_len``."""
        if self.row_stride is not None:
            return _valid_stride(self, plan, ask(self, "row_stride", plan))
        return shard_len(plan) if self.shard == "padded" else plan.max_rank_len

    def shard_rows(self, plan: CPPlan, rank: int) -> int:
        """Rows of what ``gather`` takes and ``scatter`` returns on ``rank``:
        ``n_r``, or the plan's ``P`` for a padded shard."""
        return shard_len(plan) if self.shard == "padded" else plan.per_rank_tokens[rank]

    def plan_columns(self, plan: CPPlan) -> dict[str, Any]:
        """:meth:`CPPlan.padding_columns` of the buffer this implementation moves (:meth:`stride` rows a rank)."""
        return plan.padding_columns(self.stride(plan))

    def starts(self, plan: CPPlan) -> list[int]:
        """First row of each rank's rows in the gathered buffer."""
        if self.layout == "rank_major_padded":
            return [r * self.stride(plan) for r in range(plan.cp_size)]
        return [plan.rank_offset(r) for r in range(plan.cp_size)]

    def buffer_rows(self, plan: CPPlan) -> int:
        return self.stride(plan) * plan.cp_size if self.layout == "rank_major_padded" else plan.total_tokens


@dataclass(frozen=True)
class DispatchImpl:
    """A SCATTERED-mode MoE all-to-all (DeepEP's role): route each token to the
    ranks owning its top-k experts and combine the weighted outputs back.

    Contract: ``dispatch`` returns the rows routed to this rank, source-rank
    major, each token once per destination rank, and a handle with
    ``recv_idx``/``recv_weight`` ([R, k]) and ``rows_sent``; ``combine`` takes
    this rank's experts' weighted outputs for those rows and returns this
    rank's ``[n_r, H]`` MoE output.
    """

    name: str
    dispatch: Callable[..., Any]
    combine: Callable[..., Any]
    backends: tuple[str, ...] = BACKENDS
    doc: str = ""
    origin: str = ""
    mode: ClassVar[str] = "SCATTERED"

    def __post_init__(self) -> None:
        _check_common(self)
        for attr in ("dispatch", "combine"):
            if not callable(getattr(self, attr)):
                raise ValueError(f"impl {self.name!r}: {attr} is not callable")


Impl = RoundTripImpl | DispatchImpl


def add_replicated(out: Any, replicated: Any, impl: RoundTripImpl, plan: CPPlan, rank: int) -> Any:
    """``out`` (a scatter's result on ``rank``) with that rank's rows of the
    replicated term added once, as a new tensor; ``out`` itself when it is
    not a tensor that can hold them (wrong dtype, width, device, too few
    rows), left for the checks to name. A padded shard's padding rows get
    nothing (the term's rows there are zero anyway: no biases)."""
    import torch

    n, start = plan.per_rank_tokens[rank], impl.starts(plan)[rank]
    rows = replicated[start : start + n]
    if not (isinstance(out, torch.Tensor) and out.dim() == 2 and out.dtype == rows.dtype and out.device == rows.device
            and out.shape[0] >= n and out.shape[1] == rows.shape[1]):
        return out
    res = out.clone()
    res[:n] += rows
    return res


def shard_len(plan: CPPlan) -> int:
    """``P``, the rows of a padded shard: the physical length by the rule of the
    plan's engine (the plan owns the split's padding, not the implementation)."""
    return engines.of(plan).physical_len(plan)


def _check_common(impl: Any) -> None:
    if not isinstance(impl.name, str) or not impl.name or any(c in impl.name for c in " ,=[]"):
        raise ValueError(f"impl name {impl.name!r} must be a non-empty string without spaces, commas, = or []")
    if not impl.backends or any(b not in BACKENDS for b in impl.backends):
        raise ValueError(f"impl {impl.name!r}: backends={impl.backends!r} must be a subset of {', '.join(BACKENDS)}")

