"""The registry a matrix point picks its implementations from, by name.

It holds the project's own implementations, registered through the same
protocol as outside ones (:mod:`.protocol`), the implementations of installed
packages' entry points (the group :data:`ENTRY_POINT_GROUP`, registered at
first need: :func:`discover`), and ``package.module:attribute`` references
(loaded by :mod:`.plugins`; see :func:`get`), whose attribute is an
implementation instance, or a zero-argument callable returning one. A plug-in
imports the protocol's classes, :class:`RoundTripImpl` and
:class:`DispatchImpl`, from here (docs/plugins.md).
"""

from __future__ import annotations

import functools
import importlib.metadata

from ._lazy import Deferred
from .origins import is_reference
from .plugins import ImplError, _materialise, load_reference
from .protocol import DispatchImpl, Impl, RoundTripImpl, shard_len

ENTRY_POINT_GROUP = "nsa_cp_comm.impls"
REGISTRY: dict[str, Impl] = {}
# Implementations registered from entry points: name -> the entry point's "module:attribute".
ENTRY_POINT_OF: dict[str, str] = {}


def register(impl: Impl) -> Impl:
    """Add ``impl`` under its name (an outside one gets its origin filled in)."""
    if not isinstance(impl, (RoundTripImpl, DispatchImpl)):
        raise ValueError(f"{impl!r} is not a RoundTripImpl or DispatchImpl")
    REGISTRY[impl.name] = impl
    return impl


def _own(function: str) -> Deferred:
    """A function of the library's own modules, imported at its first call (:class:`._lazy.Deferred`: why)."""
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


def all_of_mode(mode: str) -> tuple[str, ...]:
    """Every registered implementation (built-in and discovered) of ``mode``."""
    discover()
    return tuple(n for n, impl in REGISTRY.items() if impl.mode == mode and not is_reference(n))
