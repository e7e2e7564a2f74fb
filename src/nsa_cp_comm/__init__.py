"""nsa-cp-comm: the padded context-parallel communicator of NSA prefill.

The fix in one screen lives in :mod:`nsa_cp_comm.roundtrip`. This package is
what a serving engine imports; :mod:`nsa_cp_comm.harness` runs a matrix point
on real ranks (checks, timed loop, fold) and is not needed to serve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import names as _names

__version__ = "0.1.0"

# Each public name and the module it lives in, imported on first use (PEP 562):
# a tool that reads only the pure-Python parts (the plans, the engines' rules,
# the app's --help) does not pay for importing torch.
_WHERE = {
    "CPLayerCommunicator": "communicator",
    "A2A_BACKENDS": "modes", "ScatterMode": "modes", "mlp_mode": "modes",
    "ReferenceMoE": "moe",
    "POLICIES": "plan", "CPPlan": "plan", "ceil_align": "plan", "plan_split": "plan",
    "DispatchImpl": "protocol", "RoundTripImpl": "protocol",
    "LEGACY_UNEVEN_ERROR": "roundtrip", "legacy_gather": "roundtrip", "legacy_scatter": "roundtrip",
    "padded_buffer": "roundtrip", "padded_gather": "roundtrip", "padded_gather_": "roundtrip",
    "padded_scatter": "roundtrip",
}

if TYPE_CHECKING:
    from .communicator import CPLayerCommunicator
    from .modes import A2A_BACKENDS, ScatterMode, mlp_mode
    from .moe import ReferenceMoE
    from .plan import POLICIES, CPPlan, ceil_align, plan_split
    from .protocol import DispatchImpl, RoundTripImpl
    from .roundtrip import (
        LEGACY_UNEVEN_ERROR,
        legacy_gather,
        legacy_scatter,
        padded_buffer,
        padded_gather,
        padded_gather_,
        padded_scatter,
    )


__getattr__, __dir__ = _names(__name__, _WHERE, globals())

__all__ = [
    "A2A_BACKENDS",
    "CPLayerCommunicator",
    "CPPlan",
    "DispatchImpl",
    "LEGACY_UNEVEN_ERROR",
    "POLICIES",
    "RoundTripImpl",
    "ReferenceMoE",
    "ScatterMode",
    "ceil_align",
    "legacy_gather",
    "legacy_scatter",
    "mlp_mode",
    "padded_buffer",
    "padded_gather",
    "padded_gather_",
    "padded_scatter",
    "plan_split",
]
