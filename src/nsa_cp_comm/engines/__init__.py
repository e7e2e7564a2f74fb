"""Serving engines, one module per engine version: how each splits a batch and pads it.

An engine is a set of rules (:class:`Engine`), for the model it serves
(:data:`MODELS`; the engines' code differs per model): which split strategies
it has, whether it pads the batch before the split, the physical length every
rank is padded to at the split (``P = ceil_align(max_r n_r, align)``, or the
CUDA-graph capture size that holds ``max_r n_r`` where the engine runs the
step in graphs), which batches it refuses to run with CP, which padding rows
its attention and MoE mask rather than process, and which row-indexed side
tensors it gathers with the hidden states (each one more collective per
layer), and, for the experts' activation quantization a point names
(``moe_quant``), whether it gathers the quantized rows and their scales in
place of the rows. :meth:`Engine.plan` builds the :class:`~nsa_cp_comm.plan.CPPlan` the
engine would run, :meth:`Engine.costs` what each design pays per layer on it.

The rules are plain scalar formulas that numpy arrays pass through unchanged,
so ``matrix.plans`` applies the same functions to a hundred thousand batches
at once. Adding an engine version is adding a module here (its rules, with the
engine's file and version cited), a ``conf/engine/NAME.yaml`` and its rules'
transcription in tests/lib/test_engines.py (docs/design.md, "Where a change goes").
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..modes import MOE_QUANTS, QUANT_GROUP
from ..plan import CPPlan, ceil_align, plan_split

# The engine every plan and row follows unless told otherwise: the one the
# padded communicator was written for (rows written before engines existed
# were planned by its rules).
DEFAULT = "seed_fix"
# Every engine module of this package, by name (the name is the module's): a module added
# here is an engine (``_``-prefixed modules hold shared rules).
NAMES: tuple[str, ...] = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")))
# The models whose MoE path the engines' rules are given for (the engines'
# ``model_type``), and the one every plan follows unless told otherwise: the
# model this project exists for.
MODELS: tuple[str, ...] = ("deepseek_v32", "glm_moe_dsa", "deepseek_v4")
DEFAULT_MODEL = "deepseek_v32"
# The designs each engine's costs are given for (matrix.plans, the report):
# the raw batch moved once with no padding (the lower bound), the padded
# communicator, and every rank padded at the split.
DESIGNS: tuple[str, ...] = ("legacy_even", "padded", "pad_at_split")


@dataclass(frozen=True)
class SideTensor:
    """A row-indexed tensor an engine all-gathers beside the hidden states
    (one more collective per layer): ``columns`` per row (``"experts"``: one
    per routed expert, ``"hidden"``: one per hidden unit, ``"groups"``: one per
    quantization group of a row) of ``itemsize``
    bytes (0: the hidden states' own dtype)."""

    name: str
    columns: str
    itemsize: int = 0

    def row_bytes(self, hidden: int, experts: int, hidden_itemsize: int) -> int:
        cols = {"experts": experts, "hidden": hidden, "groups": hidden // QUANT_GROUP}[self.columns]
        return cols * (self.itemsize or hidden_itemsize)


@dataclass(frozen=True)
class Engine:
    """One serving engine version's rules, for one model (see the module of that name).

    ``refuses(min_len, total, cp, policy)``: whether the engine runs this batch
    without CP (``min_len``: its shortest request, ``total``: its raw tokens);
    scalars or numpy arrays. ``split_align(policy, cp)``: the alignment of the
    physical length. ``attn_pad_masked`` / ``moe_pad_masked``: the engine keeps
    the padding rows out of attention's output / the MoE (masked) rather than
    computing them (processed), for ``model``. ``graph_refusal``: why the
    engine runs this model's CP prefill eager ('' where it captures CUDA
    graphs); ``capture_sizes(max)``: its capture sizes up to ``max``
    (``default_max_capture_size`` unless the user sets it). ``side_tensors``:
    what it gathers beside the hidden states. ``moe_quant``: the experts'
    activation quantization (:data:`~nsa_cp_comm.modes.MOE_QUANTS`);
    ``gather_itemsize``: the bytes of one gathered hidden-state element where
    the engine quantizes before the gather (1: fp8; 0: the rows' own dtype);
    ``quant_refusal``: why the engine's ``moe_quant`` path is not modelled
    ('' where it is)."""

    name: str
    title: str
    source: str
    strategies: tuple[str, ...]
    pads_batch: bool
    split_align: Callable[[str, int], int]
    refuses: Callable[[Any, Any, int, str], Any]
    refusal_reason: Callable[[int, int, int, str], str]
    attn_pad_masked: bool
    moe_pad_masked: bool
    strategy_names: Callable[[str], str] = lambda policy: policy
    padding_at: str = "the end of every rank shorter than P"
    model: str = DEFAULT_MODEL
    graph_refusal: str = "no CUDA graphs of its CP prefill are modelled"
    capture_sizes: Callable[[int], tuple[int, ...]] = lambda most: ()
    default_max_capture_size: int = 0
    side_tensors: tuple[SideTensor, ...] = ()
    # What the engine's padding rows of a shard hold: "zeros", or "first_token" (every one a copy
    # of one non-zero row: the hidden state of token id 0 at position 0).
    padding_rows: str = "zeros"
    moe_quant: str = "none"
    gather_itemsize: int = 0
    quant_refusal: str = ""

    def strategy_refusal(self, policy: str, align: int | None = None) -> str:
        """Why this engine cannot run ``policy`` (or a batch alignment), '' if it can."""
        if policy not in self.strategies:
            have = ", ".join(f"{self.strategy_names(p)} (split={p})" if self.strategy_names(p) != p else p
                             for p in self.strategies)
            return f"engine={self.name}: {self.title} has no {policy} split (it has {have})"
        if align is not None and not self.pads_batch:
            return f"engine={self.name}: {self.title} splits the raw extend lengths: it pads no batch to align={align}"
        return ""

    def refusal(self, seq_lens: Sequence[int], cp: int, policy: str, align: int | None = None) -> str:
        """Why this engine would not run this batch with CP ('' when it would)."""
        why = self.strategy_refusal(policy, align)
        if why:
            return why
        batch = (min(seq_lens), sum(seq_lens), cp, policy)
        return f"engine={self.name}: " + self.refusal_reason(*batch) if self.refuses(*batch) else ""

    def plan(self, seq_lens: Sequence[int], cp: int, *, policy: str, page_size: int = 1,
             align: int | None = None, max_capture_size: int = 0) -> CPPlan:
        """The split this engine makes (ValueError for a strategy it does not
        have); ``max_capture_size``: see :meth:`graphs`."""
        why = self.strategy_refusal(policy, align)
        if why:
            raise ValueError(why)
        return plan_split(seq_lens, cp, policy=policy, page_size=page_size, align=align,
                          pad_batch=self.pads_batch, engine=self.name, max_capture_size=max_capture_size,
                          engine_model=self.model, moe_quant=self.moe_quant)

    def graphs(self, graphs: str | bool = "auto", max_capture_size: int | None = None) -> tuple[int, str]:
        """``(max_capture_size, why)``: the largest capture size of the CUDA
        graphs this engine runs the CP prefill in for its model (0: eager),
        from the user's ``graphs`` (``auto``: where the engine allows them, as
        the engines do by default; ``True``; ``False``) and
        ``max_capture_size`` (None: the engine's default). ``why`` is non-empty
        where graphs were asked for and the engine refuses them (it would not
        start)."""
        if graphs is False or graphs == "false":
            return 0, ""
        if self.graph_refusal:
            why = f"engine={self.name}: {self.title} runs {self.model} CP prefill eager: {self.graph_refusal}"
            return 0, (why if graphs is True or graphs == "true" else "")
        return int(max_capture_size if max_capture_size is not None else self.default_max_capture_size), ""

    @property
    def gathered(self) -> tuple[str, ...]:
        """What each layer all-gathers: the hidden states, then each side tensor."""
        return ("hidden_states_fp8" if self.gather_itemsize == 1 else "hidden_states",
                *(t.name for t in self.side_tensors))

    def split_len(self, mx: Any, policy: str, cp: int) -> Any:
        """The split's own padded length for a longest rank of ``mx`` rows,
        ``ceil_align(mx, split_align)``: ``P`` where the step runs eager."""
        return ceil_align(mx, self.split_align(policy, cp))

    def physical_rows(self, mx: Any, policy: str, cp: int, max_capture_size: int = 0) -> Any:
        """``P`` for a longest rank of ``mx`` rows (scalar or numpy array): the
        smallest capture size at least ``mx`` where the step runs in graphs
        (an exact fit is its own bucket), else eager at :meth:`split_len`
        (past the largest size too)."""
        eager = self.split_len(mx, policy, cp)
        sizes = np.asarray(sorted(self.capture_sizes(max_capture_size)) if max_capture_size else [], dtype=np.int64)
        if not len(sizes):
            return eager
        i = np.searchsorted(sizes, mx, side="left")
        out = np.where(i < len(sizes), sizes[np.minimum(i, len(sizes) - 1)], eager)
        return int(out) if np.ndim(out) == 0 else out

    def physical_len(self, plan: CPPlan) -> int:
        """``P``: the rows every rank holds once the split is padded (the
        graph bucket where the plan's step runs in graphs)."""
        return int(self.physical_rows(plan.max_rank_len, plan.policy, plan.cp_size, plan.max_capture_size))

    def costs(self, plan: CPPlan) -> dict[str, dict[str, int]]:
        """Per design (:data:`DESIGNS`), what one layer's MoE round trip costs on
        ``plan``: :func:`design_costs` of the plan's lengths."""
        raw = sum(plan.seq_lens)
        refused = self.refuses(min(plan.seq_lens), raw, plan.cp_size, plan.policy)
        return {d: {k: int(v) for k, v in c.items()} for d, c in design_costs(
            self, raw, plan.total_tokens, plan.max_rank_len, min(plan.per_rank_tokens), plan.cp_size, plan.policy,
            refused, plan.max_capture_size).items()}


def design_costs(engine: Engine, raw: Any, total: Any, mx: Any, mn: Any, cp: int, policy: str,
                 refused: Any = False, max_capture_size: int = 0) -> dict[str, dict[str, Any]]:
    """Per design: ``rows`` moved by the gather (and again by the reduce-scatter),
    padding rows in one rank's attention (max over ranks) and in the buffer the
    MoE runs on (every row that is not one of the ``raw`` tokens: a batch
    padded to ``total`` counts its alignment tokens here), each split into
    ``*_processed`` and ``*_masked`` as the engine pays them, of them
    ``graph_pad`` rows padded by the CUDA-graph bucket past the split's own
    length (``max_capture_size``: :meth:`Engine.graphs`), and ``collectives``
    per layer (the gather, the reduce-scatter and one gather per side
    tensor). ``mx`` max n_r, ``mn`` min n_r, ``refused`` (the engine runs
    the batch without CP: every cost 0): scalars or numpy arrays of batches
    (the same formulas)."""
    keep = 1 - (refused * 1)  # 0 where the batch runs without CP
    raw, total, mx, mn = raw * keep, total * keep, mx * keep, mn * keep
    phys = engine.physical_rows(mx, policy, cp, max_capture_size) * keep
    graph = (phys - engine.split_len(mx, policy, cp)) * cp
    zero = raw * 0
    colls = (2 + len(engine.side_tensors)) * keep

    def split(attn: Any, moe: Any) -> dict[str, Any]:
        return {
            "attn_pad_processed": zero if engine.attn_pad_masked else attn,
            "attn_pad_masked": attn if engine.attn_pad_masked else zero,
            "moe_pad_processed": zero if engine.moe_pad_masked else moe,
            "moe_pad_masked": moe if engine.moe_pad_masked else zero,
        }

    return {
        "legacy_even": {"rows": raw, **split(zero, zero), "graph_pad": zero, "collectives": colls},
        "padded": {"rows": mx * cp, **split(zero, mx * cp - raw), "graph_pad": zero, "collectives": colls},
        "pad_at_split": {"rows": phys * cp, **split(phys - mn, phys * cp - raw), "graph_pad": graph,
                         "collectives": colls},
    }


def of(plan: CPPlan) -> Engine:
    """The rules ``plan`` follows: its engine, for its model and its experts' quantization."""
    return get(plan.engine, plan.engine_model, plan.moe_quant)


def _per_model(value: Any, model: str) -> Any:
    """A module's rule given once for every model, or per model (a dict)."""
    return value[model] if isinstance(value, dict) else value


@functools.cache
def get(name: str, model: str = DEFAULT_MODEL, quant: str = "none") -> Engine:
    """The engine called ``name`` serving ``model``, from its module's rules
    (ValueError, one line, for an unknown one). A module holds ``TITLE``,
    ``SOURCE``, ``STRATEGIES``, ``PADS_BATCH``, ``ATTN_PAD_MASKED``,
    ``MOE_PAD_MASKED`` (a bool, or one per model), ``split_align``,
    ``refuses``, ``refusal_reason`` and optionally ``STRATEGY_NAMES`` (the
    engine's own name of a split policy), ``PADDING_AT`` (where its split puts
    the padding rows), ``graph_refusal(model)``, ``capture_sizes(max)`` and
    ``MAX_CAPTURE_SIZE`` (its CUDA graphs), ``side_tensors(model)``,
    ``PADDING_ROWS`` (what its padding rows hold), ``QUANTS`` (the
    ``moe_quant`` values whose MoE path is modelled: ``none`` alone without
    it), ``moe_pad_masked(model, quant)`` (over ``MOE_PAD_MASKED``) and
    ``quantized_gather(quant)`` (the quantized rows and their scales gathered
    in place of the rows: :class:`Engine`'s ``gather_itemsize``)."""
    if name not in NAMES:
        raise ValueError(f"engine={name!r} is not one of {', '.join(NAMES)}")
    if model not in MODELS:
        raise ValueError(f"engine_model={model!r} is not one of {', '.join(MODELS)}")
    if quant not in MOE_QUANTS:
        raise ValueError(f"moe_quant={quant!r} is not one of {', '.join(MOE_QUANTS)}")
    mod = importlib.import_module(f"{__name__}.{name}")
    quants = tuple(getattr(mod, "QUANTS", ("none",)))
    quant_refusal = "" if quant in quants else (
        f"engine={name}: {mod.TITLE}'s {quant} MoE path is not modelled (it models moe_quant "
        f"{', '.join(quants)}; " + ", ".join(n for n in NAMES if quant in getattr(
            importlib.import_module(f"{__name__}.{n}"), "QUANTS", ("none",))) + f" model {quant})")
    modelled = quant if not quant_refusal else "none"
    before = bool(getattr(mod, "quantized_gather", lambda q: False)(modelled))
    scales = (SideTensor("hidden_states_scale", "groups", 4),) if before else ()
    names = getattr(mod, "STRATEGY_NAMES", {})
    graphs = getattr(mod, "graph_refusal", None)
    return Engine(
        name=name, title=mod.TITLE, source=mod.SOURCE, strategies=tuple(mod.STRATEGIES), pads_batch=mod.PADS_BATCH,
        split_align=mod.split_align, refuses=mod.refuses, refusal_reason=mod.refusal_reason,
        attn_pad_masked=_per_model(mod.ATTN_PAD_MASKED, model),
        moe_pad_masked=(mod.moe_pad_masked(model, modelled) if hasattr(mod, "moe_pad_masked")
                        else _per_model(mod.MOE_PAD_MASKED, model)),
        strategy_names=lambda policy: names.get(policy, policy),
        padding_at=getattr(mod, "PADDING_AT", Engine.padding_at),
        model=model,
        graph_refusal=graphs(model) if graphs else Engine.graph_refusal,
        capture_sizes=getattr(mod, "capture_sizes", lambda most: ()),
        default_max_capture_size=getattr(mod, "MAX_CAPTURE_SIZE", 0),
        side_tensors=scales + (tuple(mod.side_tensors(model)) if hasattr(mod, "side_tensors") else ()),
        padding_rows=getattr(mod, "PADDING_ROWS", "zeros"),
        moe_quant=quant, gather_itemsize=1 if before else 0, quant_refusal=quant_refusal,
    )
