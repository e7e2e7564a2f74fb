"""The layer communicator around a MoE layer under CP prefill.

Before each MoE layer the serving code's layer communicator turns this rank's
``[n_r, H]`` hidden states into the MoE's input (``prepare_mlp``) and the MoE's
output back into ``[n_r, H]`` (``postprocess``). In FULL mode (the all-gather
MoE path) that is a gather / reduce-scatter round trip; in SCATTERED mode (an
a2a MoE such as DeepEP, or dense layers) rows pass through.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .modes import ScatterMode
from .plan import CPPlan


class CPLayerCommunicator:
    """Holds the batch's plan, the layer's mlp_mode and the CP group.

    In ``FULL`` mode ``prepare_mlp`` / ``postprocess`` run the gather /
    reduce-scatter of the FULL-mode implementation ``impl`` (``"padded"``, the
    fix; ``"legacy"``; or any registered one, see :mod:`.impls`); in
    ``SCATTERED`` mode, or when ``plan`` is None (CP prefill not in use for
    this batch), rows pass through untouched. All ranks must construct it with
    the same plan and mode.

    With ``"padded"``, ``prepare_mlp`` copies only where it must (on an even
    plan, nothing: :func:`~nsa_cp_comm.roundtrip.padded_gather` says how).
    """

    def __init__(
        self,
        plan: CPPlan | None,
        mode: ScatterMode,
        group: dist.ProcessGroup | None = None,
        *,
        impl: str = "padded",
    ) -> None:
        from . import impls

        found = impls.REGISTRY.get(impl) if isinstance(impl, str) else None
        if found is None or found.mode != "FULL":
            full = [n for n, i in impls.REGISTRY.items() if i.mode == "FULL"]
            raise ValueError(f"impl={impl!r} is not one of {', '.join(full)}")
        self.plan, self.mode, self.group, self.impl = plan, ScatterMode(mode), group, impl
        self._gather, self._scatter = found.gather, found.scatter

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
