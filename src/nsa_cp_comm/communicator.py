"""The layer communicator around a MoE layer under CP prefill (SPEC section 1)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .modes import ScatterMode
from .plan import CPPlan
from .roundtrip import legacy_gather, legacy_scatter, padded_gather, padded_scatter

IMPLS = {"padded": (padded_gather, padded_scatter), "legacy": (legacy_gather, legacy_scatter)}


class CPLayerCommunicator:
    """Holds the batch's plan, the layer's mlp_mode and the CP group.

    ``prepare_mlp`` turns this rank's ``[n_r, H]`` hidden states into the MoE's
    input, ``postprocess`` turns the MoE's output back into ``[n_r, H]``. In
    ``FULL`` mode that is the gather / reduce-scatter round trip (``impl``
    ``"padded"``, the fix, or ``"legacy"``); in ``SCATTERED`` mode, or when
    ``plan`` is None (CP prefill not in use for this batch), rows pass through
    untouched. All ranks must construct it with the same plan and mode.
    """

    def __init__(
        self,
        plan: CPPlan | None,
        mode: ScatterMode,
        group: dist.ProcessGroup | None = None,
        *,
        impl: str = "padded",
    ) -> None:
        if impl not in IMPLS:
            raise ValueError(f"impl={impl!r} is not one of {', '.join(IMPLS)}")
        self.plan, self.mode, self.group, self.impl = plan, ScatterMode(mode), group, impl
        self._gather, self._scatter = IMPLS[impl]

    @property
    def moves_rows(self) -> bool:
        return self.plan is not None and self.mode is ScatterMode.FULL

    def prepare_mlp(self, hidden: torch.Tensor) -> torch.Tensor:
        if not self.moves_rows:
            return hidden
        return self._gather(hidden, self.plan, self.group)

    def postprocess(self, moe_out: torch.Tensor) -> torch.Tensor:
        if not self.moves_rows:
            return moe_out
        return self._scatter(moe_out, self.plan, self.group)
