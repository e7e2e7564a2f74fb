"""Serving engines, one module per engine version: how each splits a batch and pads it.

An engine is a set of rules (:class:`Engine`): which split strategies it has,
whether it pads the batch before the split, the physical length every rank is
padded to at the split (``P = ceil_align(max_r n_r, align)``), which batches it
refuses to run with CP, and which padding rows its attention and MoE mask
rather than process. :meth:`Engine.plan` builds the :class:`~nsa_cp_comm.plan.CPPlan`
the engine would run, :meth:`Engine.costs` what each design pays per layer on it.

The rules are plain scalar formulas that numpy arrays pass through unchanged,
so ``matrix.plans`` applies the same functions to a hundred thousand batches
at once. Adding an engine version is adding a module here (its rules, with the
engine's file and version cited) and a ``conf/engine/NAME.yaml``.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..plan import CPPlan, ceil_align, plan_split

# The engine every plan and row follows unless told otherwise: the one the
# padded communicator was written for (rows written before engines existed
# were planned by its rules).
DEFAULT = "seed_fix"
# Every engine module of this package, by name (the name is the module's).
NAMES: tuple[str, ...] = ("seed_fix", "sglang_0_5_23", "vllm_0_33", "vllm_ascend")
# The designs each engine's costs are given for (matrix.plans, the report):
# the raw batch moved once with no padding (the lower bound), the padded
# communicator, and every rank padded at the split.
DESIGNS: tuple[str, ...] = ("legacy_even", "padded", "pad_at_split")


@dataclass(frozen=True)
class Engine:
    """One serving engine version's rules (see the module of that name).

    ``refuses(min_len, total, cp, policy)``: whether the engine runs this batch
    without CP (``min_len``: its shortest request, ``total``: its raw tokens);
    scalars or numpy arrays. ``split_align(policy, cp)``: the alignment of the
    physical length. ``attn_pad_masked`` / ``moe_pad_masked``: the engine keeps
    the padding rows out of attention's output / the MoE (masked) rather than
    computing them (processed)."""

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
        if bool(self.refuses(min(seq_lens), sum(seq_lens), cp, policy)):
            return f"engine={self.name}: " + self.refusal_reason(min(seq_lens), sum(seq_lens), cp, policy)
        return ""

    def plan(self, seq_lens: Sequence[int], cp: int, *, policy: str, page_size: int = 1,
             align: int | None = None) -> CPPlan:
        """The split this engine makes (ValueError for a strategy it does not have)."""
        why = self.strategy_refusal(policy, align)
        if why:
            raise ValueError(why)
        return plan_split(seq_lens, cp, policy=policy, page_size=page_size, align=align,
                          pad_batch=self.pads_batch, engine=self.name)

    def physical_len(self, plan: CPPlan) -> int:
        """``P``: the rows every rank holds once the split is padded."""
        return int(ceil_align(plan.max_rank_len, self.split_align(plan.policy, plan.cp_size)))

    def costs(self, plan: CPPlan) -> dict[str, dict[str, int]]:
        """Per design (:data:`DESIGNS`), what one layer's MoE round trip costs on
        ``plan``: :func:`design_costs` of the plan's lengths."""
        raw = sum(plan.seq_lens)
        refused = self.refuses(min(plan.seq_lens), raw, plan.cp_size, plan.policy)
        return {d: {k: int(v) for k, v in c.items()} for d, c in design_costs(
            self, raw, plan.total_tokens, plan.max_rank_len, min(plan.per_rank_tokens), plan.cp_size, plan.policy,
            refused).items()}


def design_costs(engine: Engine, raw: Any, total: Any, mx: Any, mn: Any, cp: int, policy: str,
                 refused: Any = False) -> dict[str, dict[str, Any]]:
    """Per design: ``rows`` moved by the gather (and again by the reduce-scatter),
    padding rows in one rank's attention (max over ranks) and in the buffer the
    MoE runs on (every row that is not one of the ``raw`` tokens: a batch
    padded to ``total`` counts its alignment tokens here), each split into
    ``*_processed`` and ``*_masked`` as the engine pays them, and
    ``collectives`` per layer. ``mx`` max n_r, ``mn`` min n_r, ``refused``
    (the engine runs the batch without CP: every cost 0): scalars or numpy
    arrays of batches (the same formulas)."""
    keep = 1 - (refused * 1)  # 0 where the batch runs without CP
    raw, total, mx, mn = raw * keep, total * keep, mx * keep, mn * keep
    phys = ceil_align(mx, engine.split_align(policy, cp))
    zero = raw * 0

    def split(attn: Any, moe: Any) -> dict[str, Any]:
        return {
            "attn_pad_processed": zero if engine.attn_pad_masked else attn,
            "attn_pad_masked": attn if engine.attn_pad_masked else zero,
            "moe_pad_processed": zero if engine.moe_pad_masked else moe,
            "moe_pad_masked": moe if engine.moe_pad_masked else zero,
        }

    return {
        "legacy_even": {"rows": raw, **split(zero, zero), "collectives": 2 * keep},
        "padded": {"rows": mx * cp, **split(zero, mx * cp - raw), "collectives": 2 * keep},
        "pad_at_split": {"rows": phys * cp, **split(phys - mn, phys * cp - raw), "collectives": 2 * keep},
    }


@functools.cache
def get(name: str) -> Engine:
    """The engine called ``name``, from its module's rules (ValueError, one
    line, for an unknown one). A module holds ``TITLE``, ``SOURCE``,
    ``STRATEGIES``, ``PADS_BATCH``, ``ATTN_PAD_MASKED``, ``MOE_PAD_MASKED``,
    ``split_align``, ``refuses``, ``refusal_reason`` and optionally
    ``STRATEGY_NAMES`` (the engine's own name of a split policy) and
    ``PADDING_AT`` (where its split puts the padding rows)."""
    if name not in NAMES:
        raise ValueError(f"engine={name!r} is not one of {', '.join(NAMES)}")
    mod = importlib.import_module(f"{__name__}.{name}")
    names = getattr(mod, "STRATEGY_NAMES", {})
    return Engine(
        name=name, title=mod.TITLE, source=mod.SOURCE, strategies=tuple(mod.STRATEGIES), pads_batch=mod.PADS_BATCH,
        split_align=mod.split_align, refuses=mod.refuses, refusal_reason=mod.refusal_reason,
        attn_pad_masked=mod.ATTN_PAD_MASKED, moe_pad_masked=mod.MOE_PAD_MASKED,
        strategy_names=lambda policy: names.get(policy, policy),
        padding_at=getattr(mod, "PADDING_AT", Engine.padding_at),
    )
