"""The gather / scatter implementations a matrix point can check and time.

Each :class:`RoundTrip` pairs a gather (``[n_r, H]`` -> gathered buffer) with a
scatter (partials in the gathered layout -> this rank's ``[n_r, H]``) and says
where each rank's rows live in the gathered buffer, which is all the
correctness check needs to know about it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .alternatives import (
    A2A_NOTE,
    a2a_not_a_roundtrip,
    allgatherv_gather,
    allgatherv_scatter,
    sumlen_gather,
    sumlen_scatter,
)
from .plan import CPPlan
from .roundtrip import legacy_gather, legacy_scatter, padded_gather, padded_scatter

GatherFn = Callable[[torch.Tensor, CPPlan], torch.Tensor]


@dataclass(frozen=True)
class RoundTrip:
    name: str
    gather: GatherFn
    scatter: GatherFn
    # "rank_major_padded": rank r at r*m, buffer m*cp rows;
    # "rank_major_packed": rank r at sum(n_<r), buffer T rows.
    layout: str
    # Backends the implementation runs on (gloo lacks uneven list collectives).
    backends: tuple[str, ...] = ("gloo", "nccl")
    needs_even: bool = False
    doc: str = ""

    def starts(self, plan: CPPlan) -> list[int]:
        """First row of each rank's rows in the gathered buffer."""
        if self.layout == "rank_major_padded":
            return [r * plan.max_rank_len for r in range(plan.cp_size)]
        return [plan.rank_offset(r) for r in range(plan.cp_size)]

    def buffer_rows(self, plan: CPPlan) -> int:
        return plan.padded_total if self.layout == "rank_major_padded" else plan.total_tokens

    def skip_reason(self, backend: str) -> str | None:
        if backend not in self.backends:
            return f"impl={self.name} needs backend {'/'.join(self.backends)}, not {backend}"
        return None


REGISTRY: dict[str, RoundTrip] = {}


def register(rt: RoundTrip) -> RoundTrip:
    REGISTRY[rt.name] = rt
    return rt


register(RoundTrip("padded", padded_gather, padded_scatter, "rank_major_padded", doc="the fix: pad to max_rank_len"))
register(
    RoundTrip(
        "legacy", legacy_gather, legacy_scatter, "rank_major_padded", needs_even=True,
        doc="the old path: even shards only",
    )
)


# --- issue 5: the alternatives (nsa_cp_comm.alternatives) -------------------
register(
    RoundTrip(
        "sumlen_allreduce", sumlen_gather, sumlen_scatter, "rank_major_packed",
        doc="zero-filled [T, H], rows at rank_offset, all-reduce; back: all-reduce + slice",
    )
)
register(
    RoundTrip(
        "allgatherv", allgatherv_gather, allgatherv_scatter, "rank_major_packed", backends=("nccl",),
        doc="list all_gather / list reduce_scatter with per-rank sizes (gloo refuses uneven lists)",
    )
)
register(
    RoundTrip(
        "a2a", a2a_not_a_roundtrip, a2a_not_a_roundtrip, "a2a_dispatch",
        doc="SCATTERED mode only: " + A2A_NOTE,
    )
)
# --- end issue 5 ---------------------------------------------------------------


def get(name: str) -> RoundTrip:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"impl={name!r} is not one of {', '.join(REGISTRY)}") from None
