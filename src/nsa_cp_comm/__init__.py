"""nsa-cp-comm: the padded context-parallel communicator of NSA prefill.

The fix in one screen lives in :mod:`nsa_cp_comm.roundtrip`. This package is
what a serving engine imports; :mod:`nsa_cp_comm.harness` runs a matrix point
on real ranks (checks, timed loop, fold) and is not needed to serve.
"""

from .communicator import CPLayerCommunicator
from .modes import A2A_BACKENDS, ScatterMode, mlp_mode
from .moe import ReferenceMoE
from .plan import POLICIES, CPPlan, ceil_align, plan_split
from .impls import DispatchImpl, RoundTripImpl
from .roundtrip import (
    LEGACY_UNEVEN_ERROR,
    legacy_gather,
    legacy_scatter,
    padded_buffer,
    padded_gather,
    padded_gather_,
    padded_scatter,
)

__version__ = "0.1.0"

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
