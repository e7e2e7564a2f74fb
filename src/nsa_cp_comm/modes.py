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

# The experts' activation quantization a point models (nsa_cp_comm.quant), named here so
# configuration reads it without torch: none (the rows' own dtype); fp8_block (DeepSeek-V3.2's
# checkpoint format: float8_e4m3fn activations with one float32 scale per QUANT_GROUP columns of a
# row, on a modular kernel that quantizes the rows it is given); fp8_block_monolithic (the same on
# a monolithic kernel, which routes from the logits itself: the router's padding mask is not
# applied, and vLLM 0.34 quantizes before the CP all-gather).
MOE_QUANTS: tuple[str, ...] = ("none", "fp8_block", "fp8_block_monolithic")
QUANT_GROUP = 128


def quant_refusal(hidden_size: int, quant: str) -> str:
    """Why a point of ``hidden_size`` columns cannot quantize as ``quant`` ('' when it can)."""
    if quant not in MOE_QUANTS:
        return f"moe_quant={quant!r} is not one of {', '.join(MOE_QUANTS)}"
    if quant != "none" and hidden_size % QUANT_GROUP:
        return (f"moe_quant={quant} quantizes rows in groups of {QUANT_GROUP} columns: hidden_size={hidden_size} "
                f"is not a multiple of {QUANT_GROUP}")
    return ""
