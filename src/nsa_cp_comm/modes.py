"""Which way the layer communicator moves rows before a MoE (docs/design.md, section 1)."""

from __future__ import annotations

import enum

# The torch.distributed backends the project's ranks run on.
BACKENDS: tuple[str, ...] = ("gloo", "nccl")

# The serving code's MoE all-to-all backends. Anything but "none" dispatches
# tokens itself and accepts uneven per-rank counts.
A2A_BACKENDS: tuple[str, ...] = ("none", "deepep", "mooncake", "mori", "ascend_fuseep", "flashinfer")


class ScatterMode(str, enum.Enum):
    """Layout of the MLP input: each rank's own rows, or every rank's rows."""

    SCATTERED = "SCATTERED"
    FULL = "FULL"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def _missing_(cls, value: object) -> ScatterMode:
        # One line naming the field, like every other bad input.
        raise ValueError(f"mlp_mode={value!r} is not one of {', '.join(m.value for m in cls)}")


def mlp_mode(moe_a2a_backend: str, *, sparse_layer: bool = True) -> ScatterMode:
    """The mlp_mode of a layer under CP prefill.

    Sparse (MoE) layers on the all-gather path (``moe_a2a_backend="none"``)
    need every rank's rows: ``FULL``. An a2a backend (DeepEP, ...) routes the
    rows itself, and dense layers stay local: ``SCATTERED``.
    """
    if moe_a2a_backend not in A2A_BACKENDS:
        raise ValueError(
            f"moe_a2a_backend={moe_a2a_backend!r} is not one of {', '.join(A2A_BACKENDS)}"
        )
    if sparse_layer and moe_a2a_backend == "none":
        return ScatterMode.FULL
    return ScatterMode.SCATTERED


# The width of the reference MoE's experts (nsa_cp_comm.moe.ReferenceMoE's
# default), here so the app's memory estimate reads it without torch.
REFERENCE_FFN_SIZE = 32

# Where DeepSeek-V3.2's shared expert runs in the MoE model (nsa_cp_comm.moe):
# nowhere, sharded like the routed experts, or replicated on every CP rank.
# Here, beside the modes, so configuration can name them without torch.
SHARED_EXPERTS: tuple[str, ...] = ("none", "sharded", "replicated")
