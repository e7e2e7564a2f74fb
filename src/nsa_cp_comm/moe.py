"""A small reference MoE: per-rank partial outputs and the single-process truth.

Bias-free top-k experts split evenly over the CP ranks (docs/design.md, section 6), and
DeepSeek-V3.2's one shared expert, an MLP every token goes through, in one of
:data:`SHARED_EXPERTS` placements: ``none``; ``sharded`` (its hidden units
split over the ranks like a tensor-parallel MLP: each rank's share is part of
its partial, summed by the reduce-scatter with the routed experts'); or
``replicated`` (every rank computes all of it, :meth:`ReferenceMoE.replicated`:
a term the reduce-scatter must not sum, added once after it). Weights come
from a CPU generator seeded by ``seed`` alone, so every rank and the reference
hold identical weights whatever the device. Routing is computed in float64 on
each row by itself, so a row routes the same way whether it arrives alone, in
a gathered batch, or among zero padding rows.
"""

from __future__ import annotations

import math

import torch

# Where the shared expert runs: not at all, split over the ranks, or whole on
# every rank (named in .modes, where configuration reads it without torch).
from . import quant
from .modes import MOE_QUANTS, REFERENCE_FFN_SIZE, SHARED_EXPERTS


class ReferenceMoE:
    """``num_experts`` SiLU experts ``x -> silu(x W1) W2``, top-``topk`` routing,
    and a shared expert of the same form placed as ``shared_expert`` says."""

    def __init__(
        self,
        hidden_size: int,
        *,
        num_experts: int = 8,
        topk: int = 2,
        ffn_size: int = REFERENCE_FFN_SIZE,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        shared_expert: str = "none",
        logits_dtype: torch.dtype | None = None,
        moe_quant: str = "none",
    ) -> None:
        if not 1 <= topk <= num_experts:
            raise ValueError(f"topk={topk} must be in [1, num_experts={num_experts}]")
        if shared_expert not in SHARED_EXPERTS:
            raise ValueError(f"shared_expert={shared_expert!r} is not one of {', '.join(SHARED_EXPERTS)}")
        self.hidden_size, self.num_experts, self.topk = hidden_size, num_experts, topk
        self.dtype, self.shared_expert = dtype, shared_expert
        # The router logits' dtype where an engine gathers them beside the rows (its side tensor):
        # every routing then reads them in that dtype, as the engine's router reads the gathered
        # logits; None: float64, each row by itself.
        self.logits_dtype = logits_dtype
        # The routed experts' activation quantization (.modes.MOE_QUANTS): they compute on each
        # row quantized and dequantized (.quant), routed from the row's own logits (the router
        # reads the activations before the quantization).
        if moe_quant not in MOE_QUANTS:
            raise ValueError(f"moe_quant={moe_quant!r} is not one of {', '.join(MOE_QUANTS)}")
        self.moe_quant = moe_quant
        g = torch.Generator().manual_seed(seed)
        router = torch.randn(hidden_size, num_experts, generator=g) / math.sqrt(hidden_size)
        w1 = torch.randn(num_experts, hidden_size, ffn_size, generator=g) / math.sqrt(hidden_size)
        w2 = torch.randn(num_experts, ffn_size, hidden_size, generator=g) / math.sqrt(ffn_size)
        self.router = router.to(device=device, dtype=torch.float64)
        self.w1 = w1.to(device=device, dtype=dtype)
        self.w2 = w2.to(device=device, dtype=dtype)
        # Drawn after the routed experts' weights, so those (and every output
        # with shared_expert="none") are what they were before it existed.
        s1 = torch.randn(hidden_size, ffn_size, generator=g) / math.sqrt(hidden_size)
        s2 = torch.randn(ffn_size, hidden_size, generator=g) / math.sqrt(ffn_size)
        self.s1 = s1.to(device=device, dtype=dtype)
        self.s2 = s2.to(device=device, dtype=dtype)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The router logits of each row of ``x`` (``[N, num_experts]``), computed in
        float64 row by row, in ``logits_dtype`` (float64 without one)."""
        out = x.to(torch.float64) @ self.router
        return out if self.logits_dtype is None else out.to(self.logits_dtype)

    def route(self, x: torch.Tensor, logits: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(expert ids [N, k], weights [N, k] float32)`` for each row of ``x``,
        from ``logits`` where given (gathered beside the rows), else its own."""
        logits = (self.logits(x) if logits is None else logits).to(torch.float64)
        top, idx = logits.topk(self.topk, dim=-1)
        return idx, torch.softmax(top, dim=-1).to(torch.float32)

    def experts_of(self, rank: int, cp_size: int) -> range:
        if self.num_experts % cp_size:
            raise ValueError(f"num_experts={self.num_experts} is not a multiple of cp_size={cp_size}")
        per = self.num_experts // cp_size
        return range(rank * per, (rank + 1) * per)

    def expert_input(self, x: torch.Tensor) -> torch.Tensor:
        """The rows the routed experts compute on: ``x``, or with a quantized ``moe_quant``
        each row quantized and dequantized."""
        return x if self.moe_quant == "none" else quant.round_trip(x)

    def experts_on(self, x: torch.Tensor, idx: torch.Tensor, weight: torch.Tensor, experts: range) -> torch.Tensor:
        """``experts`` on the rows of ``x`` routed to them (``idx`` / ``weight``: each
        row's top-k expert ids and weights), weighted and summed per row in float32.
        Rows routed to none of ``experts`` stay zero."""
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in experts:
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            y = torch.nn.functional.silu(x[rows].to(self.dtype) @ self.w1[e]) @ self.w2[e]
            out.index_add_(0, rows, y.to(torch.float32) * weight[rows, slot, None])
        return out

    def _apply(self, x: torch.Tensor, experts: range, logits: torch.Tensor | None = None,
               seen: torch.Tensor | None = None) -> torch.Tensor:
        idx, weight = self.route(x, logits)
        return self.experts_on(self.expert_input(x) if seen is None else seen, idx, weight, experts)

    def _shared(self, x: torch.Tensor, units: slice = slice(None)) -> torch.Tensor:
        """The shared expert's hidden ``units`` on every row of ``x``, in the
        weights' dtype (callers add it into float32 in place: no float32 copy
        of a gathered buffer's worth beside the routed experts' accumulator)."""
        return torch.nn.functional.silu(x.to(self.dtype) @ self.s1[:, units]) @ self.s2[units]

    def shared_units(self, rank: int, cp_size: int) -> slice:
        """Rank ``rank``'s hidden units of the shared expert when it is sharded
        (contiguous, as even as integer division makes them; a rank may get none)."""
        f = self.s1.shape[1]
        return slice(f * rank // cp_size, f * (rank + 1) // cp_size)

    def shared(self, x: torch.Tensor) -> torch.Tensor:
        """The whole shared expert on every row of ``x``, in float32 (zeros with
        ``shared_expert="none"``)."""
        if self.shared_expert == "none":
            return torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        return self._shared(x).to(torch.float32)

    def partial(self, x: torch.Tensor, rank: int, cp_size: int, masked: torch.Tensor | None = None,
                logits: torch.Tensor | None = None, seen: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's experts' contribution for every row of ``x``, in ``x.dtype``
        (with a sharded shared expert, its share of that too). Zero rows give
        zero outputs (no biases). ``masked`` (bool per row): rows the router
        sends to no expert (an engine's padding mask), whose routed output is
        zero; a sharded shared expert still runs on them. ``logits``: the
        router logits gathered beside ``x``, routed from as they are. ``seen``:
        the rows the routed experts compute on where the engine gathered them
        quantized (dequantized from what came back; else :meth:`expert_input`
        of ``x``)."""
        out = self._apply(x, self.experts_of(rank, cp_size), logits, seen)
        if masked is not None:
            out[masked] = 0
        if self.shared_expert == "sharded":
            out.add_(self._shared(x, self.shared_units(rank, cp_size)))
        return out.to(x.dtype)

    def replicated(self, x: torch.Tensor) -> torch.Tensor | None:
        """With a replicated shared expert, its output on every row of ``x`` in
        ``x.dtype``, the same on every rank: to be added once, after the
        reduce-scatter, not summed by it. None with any other placement."""
        if self.shared_expert != "replicated":
            return None
        return self._shared(x).to(x.dtype)  # a no-op where the weights have the rows' dtype

    def summed(self, x: torch.Tensor, masked: bool = False) -> torch.Tensor:
        """What the reduce-scatter sums for the rows ``x`` over every rank, in
        float32: every routed expert (none where ``masked``) and a sharded
        shared expert (a replicated one is added after the sum, to real rows
        only)."""
        out = (torch.zeros(x.shape, dtype=torch.float32, device=x.device) if masked
               else self._apply(x, range(self.num_experts)))
        if self.shared_expert == "sharded":
            out.add_(self._shared(x))
        return out

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """All experts on ``x`` in one process, accumulated in float32, the
        whole shared expert included (unless ``shared_expert="none"``)."""
        out = self._apply(x, range(self.num_experts))
        if self.shared_expert != "none":
            out.add_(self._shared(x))
        return out


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


def counted_cp_times(out: torch.Tensor, ref: torch.Tensor, shared: torch.Tensor, cp_size: int, tol: float) -> bool:
    """Whether ``out`` is ``ref`` with the replicated term ``shared`` (this
    rank's rows of it, float32) added ``cp_size - 1`` times too many: the
    term added to every rank's partial before the reduce-scatter, which sums
    it over the ranks. Within ``tol`` of that (relative to its own scale, as
    :func:`max_rel_err`), and only where the term is not lost in the
    tolerance (with one rank, or a term of zeros, nothing can be told apart)."""
    if cp_size < 2 or ref.numel() == 0 or out.shape != ref.shape or shared.shape != ref.shape:
        return False
    extra = (cp_size - 1) * shared
    scale = ref.abs().max().item()
    if not extra.abs().max().item() > tol * max(scale, 1e-30):
        return False
    return max_rel_err(out, ref + extra) <= tol


def tolerance(dtype: torch.dtype, cp_size: int) -> float:
    """The error a correct round trip may show: float32 rounding, or bf16's
    8-bit mantissa once per partial sum step over ``cp_size`` ranks."""
    if dtype == torch.float32:
        return 1e-5
    if dtype == torch.bfloat16:
        return 2.0**-8 * (1 + math.log2(max(cp_size, 1))) * 2
    raise ValueError(f"dtype={dtype} has no tolerance; use float32 or bfloat16")
