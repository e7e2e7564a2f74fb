"""Block-fp8 activations, as the engines quantize a MoE's input rows.

vLLM's dynamic per-token-group fp8 (``model_executor/layers/quantization/utils/fp8_utils.py``
``per_token_group_quant_fp8``, vllm==0.34.0): each row in groups of
:data:`~nsa_cp_comm.modes.QUANT_GROUP` columns, one float32 scale per group,
``scale = max(amax(|group|), eps) / 448`` and ``q = clamp(x / scale, -448, 448)`` in
``float8_e4m3fn`` (448: its largest finite value). Row by row, so a row quantizes to the
same bytes alone, in a shard or among padding rows: a gather of quantized rows and their
scales dequantizes to the quantized rows gathered.

The fp8 rows travel as their bytes (a ``uint8`` view, ``[n, H]``): gloo has no float8
type, and a gather moves bytes whatever they mean.
"""

from __future__ import annotations

import torch

from .modes import QUANT_GROUP

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(float8_e4m3fn).max
EPS = 1e-10  # fp8_utils.per_token_group_quant_fp8's eps: an all-zero group gets a finite scale


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scales)``: ``x`` ``[n, H]`` as fp8 bytes (``uint8`` ``[n, H]``) and its float32
    scales ``[n, H / QUANT_GROUP]``."""
    n, h = x.shape
    groups = x.to(torch.float32).reshape(n, h // QUANT_GROUP, QUANT_GROUP)
    scales = groups.abs().amax(dim=-1).clamp(min=EPS) / FP8_MAX
    q = (groups / scales[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.reshape(n, h).view(torch.uint8), scales


def dequantize(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The rows ``q`` (fp8 bytes, ``[n, H]``) with ``scales`` ``[n, H / QUANT_GROUP]`` stand
    for, in ``dtype``: what the experts compute on."""
    n, h = q.shape
    vals = q.view(FP8).to(torch.float32).reshape(n, h // QUANT_GROUP, QUANT_GROUP) * scales[..., None]
    return vals.reshape(n, h).to(dtype)


def round_trip(x: torch.Tensor) -> torch.Tensor:
    """``x`` quantized and dequantized, in its own dtype: the rows the experts see."""
    return dequantize(*quantize(x), x.dtype)
