"""The implementation protocol, and the registry a matrix point picks from.

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

The project's own implementations are registered here through the same
protocol as outside ones. Outside implementations come from installed packages
(the entry-point group :data:`ENTRY_POINT_GROUP`) or ad hoc as
``package.module:attribute`` (see :func:`get`); the attribute is an
implementation instance, or a zero-argument callable returning one.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from . import engines
from ._lazy import Deferred
from .modes import BACKENDS
from .origins import is_reference, own
from .plan import CPPlan

if TYPE_CHECKING:
    from .production import Production

ENTRY_POINT_GROUP = "nsa_cp_comm.impls"
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
        rule = self.legacy_bits_on_even
        if not callable(rule):
            return plan.is_even and bool(rule)
        if not plan.is_even:
            return False
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
        """The plan-level padding columns as this implementation moves the plan:
        ``padded_total`` (``stride * cp``), ``padding_frac`` and ``claim_holds``
        (that buffer equals the cp-aligned raw total)."""
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


def skip_reason(impl: Impl, backend: str, plan: CPPlan | None = None) -> str | None:
    """Why ``impl`` cannot run on ``backend`` (or, given one, ``plan``: its
    ``supports``), else None. A ``supports`` that raises, or returns other
    than a str, raises :class:`HookError` (an error row: it is the
    implementation's fault); its reason is folded to one line."""
    if backend not in impl.backends:
        return f"impl={impl.name} needs backend {'/'.join(impl.backends)}, not {backend}"
    if plan is not None and getattr(impl, "supports", None) is not None:
        why = ask(impl, "supports", plan)
        if not isinstance(why, str):
            raise HookError(f"impl {impl.name!r}: supports(plan) returned {_shown(why)}, not a str "
                            "('' when it runs the plan)")
        why = " ".join(why.split())[:_SHOWN_CHARS * 8]
        return f"impl={impl.name}: {why}" if why else None
    return None


class HookError(ValueError):
    """An implementation's hook raised, or answered what its contract does
    not allow: that implementation's ``error`` row, its reason this one line
    (the hook, and the value or the exception)."""


# How much of a bad answer or a hook's exception a reason shows.
_SHOWN_CHARS = 80
# The most rows a ``row_stride`` may give each rank's block beyond the longest
# shard: generous for any alignment (pages, cp-aligned physical lengths), and
# far below what would make the gathered buffer the machine's memory.
MAX_STRIDE_SLACK = 1 << 16


def _shown(value: object) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


class HookEnded(Exception):
    """A hook's call that ended the process answering it, or gave no answer in
    time (asked in a child: :mod:`.harness.hook_child`); its text says how."""


def ask(impl: Impl, hook: str, plan: CPPlan) -> Any:
    """``impl.<hook>(plan)``: an exception from it (SystemExit included) is a
    :class:`HookError` naming the hook."""
    try:
        return getattr(impl, hook)(plan)
    except HookEnded as exc:
        raise HookError(f"impl {impl.name!r}: {hook}(plan) {exc}") from exc
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - outside code: its answer is data
        msg = " ".join(str(exc).split())
        msg = msg if len(msg) <= _SHOWN_CHARS * 2 else msg[: _SHOWN_CHARS * 2] + "..."
        raise HookError(f"impl {impl.name!r}: {hook}(plan) raised {type(exc).__name__}"
                        f"{': ' + msg if msg else ''}") from exc


def _valid_stride(impl: Impl, plan: CPPlan, stride: object) -> int:
    """``row_stride``'s answer, held to its range: an int (not a bool) that
    holds the longest shard, at most :data:`MAX_STRIDE_SLACK` rows beyond it."""
    lo = max(plan.max_rank_len, 1)
    hi = plan.max_rank_len + MAX_STRIDE_SLACK
    if isinstance(stride, bool) or not isinstance(stride, numbers.Integral) or not lo <= stride <= hi:
        raise HookError(f"impl {impl.name!r}: row_stride(plan) returned {_shown(stride)}, not an int in "
                        f"[{lo}, {hi}] (max_rank_len={plan.max_rank_len}, +{MAX_STRIDE_SLACK} at most)")
    return int(stride)


def hook_error(impl: Impl, backend: str, plan: CPPlan) -> str:
    """What is wrong with ``impl``'s answers about ``plan`` (``''`` when
    nothing): every hook that is a function of the plan alone (``supports``,
    ``row_stride`` through the rows it sizes, a ``legacy_bits_on_even``
    rule), asked as the checks and the fold will ask them. Asked in the
    process that folds the point's rows, before any rank runs it, so a bad
    answer is that implementation's ``error`` row and no other's."""
    try:
        if skip_reason(impl, backend, plan):
            return ""  # it does not run the plan: none of its other answers is read
        if isinstance(impl, RoundTripImpl):
            impl.claims_legacy_bits(plan)
            impl.starts(plan)
            impl.plan_columns(plan)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - outside code: its answer is data
        if isinstance(exc, HookError):
            return str(exc)
        return f"impl {impl.name!r}: its answers about the plan raised {type(exc).__name__}: {_shown(str(exc))}"
    return ""


REGISTRY: dict[str, Impl] = {}
# Implementations registered from entry points: name -> the entry point's "module:attribute".
ENTRY_POINT_OF: dict[str, str] = {}
# Implementations loaded by reference: "module:attribute" -> the name its object
# declares (it is registered, and found by the ranks, under the reference).
DECLARED: dict[str, str] = {}


def register(impl: Impl) -> Impl:
    """Add ``impl`` under its name (an outside one gets its origin filled in)."""
    if not isinstance(impl, (RoundTripImpl, DispatchImpl)):
        raise ValueError(f"{impl!r} is not a RoundTripImpl or DispatchImpl")
    REGISTRY[impl.name] = impl
    return impl


def _own(function: str) -> Deferred:
    """A function of the library's own modules, imported at its first call:
    this registry is read in processes that never run a collective (a
    sweep's own process), which then never import torch."""
    return Deferred(f"{__package__}.{function}")


register(
    RoundTripImpl(
        "padded", _own("roundtrip:padded_gather"), _own("roundtrip:padded_scatter"), "rank_major_padded",
        prepare=_own("production:padded_form"),
        doc="the fix: pad every shard to max_rank_len, all-gather, reduce-scatter equal chunks, slice",
    )
)
register(
    RoundTripImpl(
        "legacy", _own("roundtrip:legacy_gather"), _own("roundtrip:legacy_scatter"), "rank_major_padded",
        needs_even=True, prepare=_own("production:legacy_form"),
        legacy_bits_on_even=False,  # it is the reference
        doc="the old path: even shards only; refuses uneven plans on every rank",
    )
)
register(
    RoundTripImpl(
        "sumlen_allreduce", _own("alternatives:sumlen_gather"), _own("alternatives:sumlen_scatter"),
        "rank_major_packed", legacy_bits_on_even=False,
        doc="zero-filled [T, H], rows at rank_offset, all-reduce; back: all-reduce + slice",
    )
)
register(
    RoundTripImpl(
        "allgatherv", _own("alternatives:allgatherv_gather"), _own("alternatives:allgatherv_scatter"),
        "rank_major_packed", backends=("nccl",), legacy_bits_on_even=False,
        doc="list all_gather / list reduce_scatter with per-rank sizes (gloo refuses uneven lists)",
    )
)
register(DispatchImpl("a2a", _own("alternatives:a2a_dispatch"), _own("alternatives:a2a_combine"),
                      doc="stand-in for DeepEP: all_to_all_single dispatch/combine under the reference MoE's top-k "
                      "routing"))

register(
    RoundTripImpl(
        "padded_zero_copy", _own("roundtrip:padded_gather_zero_copy"), _own("roundtrip:padded_scatter"),
        "rank_major_padded", prepare=_own("production:padded_zero_copy_form"),
        doc="the fix's zero-copy form: rows are produced in their slot of a reused buffer (padded_buffer + "
        "padded_gather_); timed without the slot copy, like nccl-tests' in-place column",
    )
)

register(
    RoundTripImpl(
        "pad_at_split", _own("pad_at_split:pad_at_split_gather"), _own("pad_at_split:pad_at_split_scatter"),
        "rank_major_padded", row_stride=shard_len, pads_split=True, prepare=_own("production:pad_at_split_form"),
        # legacy's [T, H] buffer, and bytes, exactly where P*cp == T (no rank padded)
        legacy_bits_on_even=lambda plan: shard_len(plan) * plan.cp_size == plan.total_tokens,
        doc="the serving engine's rule: every rank padded at the split to P = ceil_align(max n_r, 2*cp zigzag "
        "| cp), attention and MoE process the zero rows, every collective even",
    )
)

# The project's own names, before anything outside is discovered.
BUILTIN: tuple[str, ...] = tuple(REGISTRY)
_BUILTIN_IMPLS: tuple[Impl, ...] = tuple(REGISTRY.values())


def load_builtins() -> None:
    """Import every function the built-ins defer (:func:`_own`). A rank does so
    before it runs anything: the built-ins then call the library's own
    functions whatever a task later rebinds, and the rank-state check
    records those modules among the library's (.harness.rank_state)."""
    for impl in _BUILTIN_IMPLS:
        for value in vars(impl).values():
            if isinstance(value, Deferred):
                value.resolve()


class ImplError(ValueError):
    """A bad implementation reference: the message is one line naming it."""


@functools.lru_cache(maxsize=1)
def installed_packages() -> Mapping[str, list[str]]:
    """``importlib.metadata.packages_distributions()``, read once per process
    (the fork server reads it before it forks, so every rank has it): it
    reads every installed distribution's file list, torch's thousands of
    lines among them, and a rank loading a point's outside implementations
    spent most of its time reading it once per implementation."""
    try:
        return importlib.metadata.packages_distributions()
    except Exception:  # noqa: BLE001 - metadata is best effort
        return {}


def _origin(module_name: str) -> str:
    top = module_name.split(".")[0]
    try:
        dists = installed_packages().get(top, [])
        if dists:
            return f"{module_name} {importlib.metadata.version(dists[0])}"
    except Exception:  # noqa: BLE001 - metadata is best effort
        pass
    return f"{module_name} (no installed distribution)"


def _materialise(ref: str, obj: object, module_name: str) -> Impl:
    if not isinstance(obj, (RoundTripImpl, DispatchImpl)) and callable(obj):
        try:
            obj = obj()
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - the user's factory
            # sys.exit as a factory would otherwise end the sweep silently, with status 0
            raise ImplError(f"impl={ref}: calling the factory raised {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, (RoundTripImpl, DispatchImpl)):
        raise ImplError(
            f"impl={ref}: {type(obj).__name__} is not a RoundTripImpl or DispatchImpl (nsa_cp_comm.impls)"
        )
    return replace(obj, origin=obj.origin or _origin(module_name))


def _beside_hint(module_name: str, exc: BaseException) -> str:
    """Why a module in the working directory is not found: an installed console
    command's path starts at its own bin folder, not at the working directory
    (``python -m`` puts the working directory first)."""
    top = module_name.split(".")[0]
    cwd = Path.cwd()
    if not (isinstance(exc, ModuleNotFoundError) and exc.name == top
            and ((cwd / f"{top}.py").is_file() or (cwd / top / "__init__.py").is_file())):
        return ""
    return (f" ({top} is in the working directory, which this command does not import from: "
            f"set PYTHONPATH=$PWD, or run python -m nsa_cp_matrix)")


def load_reference(ref: str) -> Impl:
    """``package.module:attribute`` -> the implementation, named ``ref`` (so rows and
    ranks find it again by that name). Raises ImplError (one line)."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ImplError(f"impl={ref}: expected package.module:attribute")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - ImportError or the module's own
        raise ImplError(f"impl={ref}: cannot import {module_name}: {type(exc).__name__}: {exc}"
                        f"{_beside_hint(module_name, exc)}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImplError(f"impl={ref}: {module_name} has no attribute {attr}")
        obj = getattr(obj, part)
    impl = _materialise(ref, obj, module_name)
    DECLARED[ref] = impl.name
    return replace(impl, name=ref)


@functools.lru_cache(maxsize=1)
def discover() -> tuple[str, ...]:
    """Register the implementations of installed packages' ``nsa_cp_comm.impls``
    entry points (once per process); returns their names. A broken entry point
    raises ImplError naming it."""
    found = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as exc:  # noqa: BLE001
            raise ImplError(f"entry point {ep.name} = {ep.value}: cannot load: {type(exc).__name__}: {exc}") from None
        impl = _materialise(f"{ep.name} (entry point {ep.value})", obj, ep.value.split(":")[0])
        if impl.name in BUILTIN:
            raise ImplError(f"entry point {ep.name} = {ep.value}: name {impl.name!r} is a built-in implementation")
        register(impl)
        ENTRY_POINT_OF[impl.name] = ep.value
        found.append(impl.name)
    return tuple(found)


def get(name: str) -> Impl:
    """The implementation called ``name``: built-in, discovered, or a
    ``module:attribute`` reference. Raises ImplError (one line) otherwise."""
    if name in REGISTRY:
        return REGISTRY[name]
    if is_reference(name):
        impl = load_reference(name)
        REGISTRY[name] = impl
        return impl
    discover()
    if name in REGISTRY:
        return REGISTRY[name]
    raise ImplError(f"impl={name!r} is not one of {', '.join(REGISTRY)} (or package.module:attribute)")


def origin(impl: Impl) -> str:
    return impl.origin or own()


def all_of_mode(mode: str) -> tuple[str, ...]:
    """Every registered implementation (built-in and discovered) of ``mode``."""
    discover()
    return tuple(n for n, impl in REGISTRY.items() if impl.mode == mode and not is_reference(n))
