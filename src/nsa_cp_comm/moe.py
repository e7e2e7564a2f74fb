"""A small reference MoE: per-rank partial outputs and the single-process truth.

Bias-free top-k experts split evenly over the CP ranks (docs/design.md, section 6). Weights come
from a CPU generator seeded by ``seed`` alone, so every rank and the reference
hold identical weights whatever the device. Routing is computed in float64 on
each row by itself, so a row routes the same way whether it arrives alone, in
a gathered batch, or among zero padding rows.
"""

from __future__ import annotations

import math

import torch


class ReferenceMoE:
    """``num_experts`` SiLU experts ``x -> silu(x W1) W2``, top-``topk`` routing."""

    def __init__(
        self,
        hidden_size: int,
        *,
        num_experts: int = 8,
        topk: int = 2,
        ffn_size: int = 32,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if not 1 <= topk <= num_experts:
            raise ValueError(f"topk={topk} must be in [1, num_experts={num_experts}]")
        self.hidden_size, self.num_experts, self.topk = hidden_size, num_experts, topk
        self.dtype = dtype
        g = torch.Generator().manual_seed(seed)
        router = torch.randn(hidden_size, num_experts, generator=g) / math.sqrt(hidden_size)
        w1 = torch.randn(num_experts, hidden_size, ffn_size, generator=g) / math.sqrt(hidden_size)
        w2 = torch.randn(num_experts, ffn_size, hidden_size, generator=g) / math.sqrt(ffn_size)
        self.router = router.to(device=device, dtype=torch.float64)
        self.w1 = w1.to(device=device, dtype=dtype)
        self.w2 = w2.to(device=device, dtype=dtype)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(expert ids [N, k], weights [N, k] float32)`` for each row of ``x``."""
        logits = x.to(torch.float64) @ self.router
        top, idx = logits.topk(self.topk, dim=-1)
        return idx, torch.softmax(top, dim=-1).to(torch.float32)

    def experts_of(self, rank: int, cp_size: int) -> range:
        if self.num_experts % cp_size:
            raise ValueError(f"num_experts={self.num_experts} is not a multiple of cp_size={cp_size}")
        per = self.num_experts // cp_size
        return range(rank * per, (rank + 1) * per)

    def _apply(self, x: torch.Tensor, experts: range) -> torch.Tensor:
        idx, weight = self.route(x)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in experts:
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            y = torch.nn.functional.silu(x[rows].to(self.dtype) @ self.w1[e]) @ self.w2[e]
            out.index_add_(0, rows, y.to(torch.float32) * weight[rows, slot, None])
        return out

    def partial(self, x: torch.Tensor, rank: int, cp_size: int) -> torch.Tensor:
        """This rank's experts' contribution for every row of ``x``, in ``x.dtype``.
        Zero rows give zero outputs (no biases)."""
        return self._apply(x, self.experts_of(rank, cp_size)).to(x.dtype)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """All experts on ``x`` in one process, accumulated in float32."""
        return self._apply(x, range(self.num_experts))


def max_rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``max |out - ref| / max |ref|``: relative to the output's scale, so rows
    whose true value is near zero do not blow the figure up."""
    if ref.numel() == 0:
        return 0.0
    diff = (out.to(torch.float32) - ref.to(torch.float32)).abs().max().item()
    scale = ref.abs().max().item()
    if math.isnan(diff):
        return math.inf
    return diff / scale if scale > 0 else diff


def tolerance(dtype: torch.dtype, cp_size: int) -> float:
    """The error a correct round trip may show: float32 rounding, or bf16's
    8-bit mantissa once per partial sum step over ``cp_size`` ranks."""
    if dtype == torch.float32:
        return 1e-5
    if dtype == torch.bfloat16:
        return 2.0**-8 * (1 + math.log2(max(cp_size, 1))) * 2
    raise ValueError(f"dtype={dtype} has no tolerance; use float32 or bfloat16")
