"""A matrix point as the ranks run it, and the data they run it on.

:class:`PointSpec` holds plain values only (it is pickled to the ranks) and is
built by the matrix after validation (matrix/app/config.py); its own checks guard
library users. Data is seeded from ``(seed, rank)``, generated on the CPU so a
point gives the same bits on every device, and reproducible from a row alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import engines
from ..modes import SHARED_EXPERTS, ScatterMode, quant_refusal
from ..plan import CPPlan, plan_split

if TYPE_CHECKING:
    import torch

# The dtypes by name and their bytes per element; DTYPES maps the names to
# torch's, built on first use so that the names and sizes (the app's config,
# --help and memory estimate read them in the sweep's own process) load
# without torch.
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2}
DTYPE_NAMES = tuple(DTYPE_BYTES)
# Seeds are mixed with the rank into a 63-bit torch seed (see shard_seed).
MAX_SEED = 2**31 - 1


@dataclass(frozen=True)
class PointSpec:
    """Everything a rank needs to run a point."""

    seq_lens: tuple[int, ...]
    cp_size: int
    policy: str
    page_size: int = 1
    align: int | None = None
    mode: str = "FULL"
    impls: tuple[str, ...] = ("padded", "legacy")
    hidden_size: int = 7168
    dtype: str = "bfloat16"
    num_experts: int | None = None  # None: two experts per rank
    topk: int = 2
    warmup: int = 5
    iters: int | str = 20  # or "auto": calibrated as it runs (.calibrate)
    seed: int = 0
    flush_l2: bool = False
    bystanders: int = 0  # ranks of the world outside the CP group (CP inside TP/DP)
    engine: str = engines.DEFAULT  # the serving engine whose split and padding the plan follows
    # DeepSeek-V3.2's shared expert in the reference MoE: none | sharded | replicated (..moe.SHARED_EXPERTS)
    shared_expert: str = "replicated"
    engine_model: str = engines.DEFAULT_MODEL  # the model the engine serves (engines.MODELS)
    # the largest CUDA-graph capture size the engine runs the step in (Engine.graphs); 0: eager
    max_capture_size: int = 0
    # the experts' activation quantization (..modes.MOE_QUANTS): what the experts compute on, and
    # where the engine quantizes before the gather, what it gathers
    moe_quant: str = "none"

    def __post_init__(self) -> None:
        from .. import impls as impl_registry

        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype={self.dtype!r} is not one of {', '.join(DTYPE_NAMES)}")
        ScatterMode(self.mode)
        if self.shared_expert not in SHARED_EXPERTS:
            raise ValueError(f"shared_expert={self.shared_expert!r} is not one of {', '.join(SHARED_EXPERTS)}")
        engines.get(self.engine, self.engine_model)
        why = quant_refusal(self.hidden_size, self.moe_quant) if isinstance(self.hidden_size, int) else ""
        if why:
            raise ValueError(why)
        if not isinstance(self.max_capture_size, int) or isinstance(self.max_capture_size, bool) \
                or self.max_capture_size < 0:
            raise ValueError(f"max_capture_size={self.max_capture_size!r} must be a non-negative int (0: eager)")
        for name in self.impls:
            impl_registry.get(name)
        iters = {"iters": 1} if self.iters != "auto" else {}
        for key, low in {"hidden_size": 1, "topk": 1, **iters, "bystanders": 0, "warmup": 0}.items():
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                what = "a positive int" if low else "a non-negative int"
                raise ValueError(f"{key}={v!r} must be {what}" + (' or "auto"' if key == "iters" else ""))
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed={self.seed!r} must be an int in [0, {MAX_SEED}]")
        if self.experts % self.cp_size:
            raise ValueError(f"num_experts={self.experts} is not a multiple of cp_size={self.cp_size}")
        if not 1 <= self.topk <= self.experts:
            raise ValueError(f"topk={self.topk} must be in [1, num_experts={self.experts}]")

    @property
    def experts(self) -> int:
        return self.num_experts if self.num_experts is not None else 2 * self.cp_size

    @property
    def max_iters(self) -> int:
        """The most timed iterations the point runs (``iters=auto``: the calibration's cap)."""
        from .calibrate import MAX_ITERS

        return MAX_ITERS if self.iters == "auto" else int(self.iters)

    @property
    def world_size(self) -> int:
        """Ranks the point starts: the CP group and its bystanders."""
        return self.cp_size + self.bystanders

    def plan(self) -> CPPlan:
        """The split by the engine's batch rule. A split the engine does not
        have is still planned (a point it would not run is skipped with the
        engine's reason, and its row describes this plan)."""
        return plan_split(self.seq_lens, self.cp_size, policy=self.policy, page_size=self.page_size,
                          align=self.align, pad_batch=engines.get(self.engine).pads_batch, engine=self.engine,
                          max_capture_size=self.max_capture_size, engine_model=self.engine_model,
                          moe_quant=self.moe_quant)


def shard_seed(seed: int, rank: int) -> int:
    """Seed of rank ``rank``'s hidden states: (seed, rank) names the data, so a
    failing point reproduces from its row alone. Fits torch's 64-bit seed for
    every seed <= MAX_SEED and rank < 2**20."""
    return seed * 1_000_003 + rank


def _dtypes() -> dict[str, torch.dtype]:
    import torch

    return {n: getattr(torch, n) for n in DTYPE_NAMES}


def __getattr__(name: str) -> object:
    """``DTYPES``, name to torch dtype, made (and kept) on first use."""
    if name != "DTYPES":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    table = globals()["DTYPES"] = _dtypes()
    return table


def make_shard(spec: PointSpec, plan: CPPlan, rank: int, device: torch.device, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s ``[n_r, H]`` hidden states, generated on the CPU (same bits
    on every device) from :func:`shard_seed`. ``salt`` picks another input set."""
    import torch

    g = torch.Generator().manual_seed(shard_seed(spec.seed, rank) + 7919 * salt)
    x = torch.randn(plan.per_rank_tokens[rank], spec.hidden_size, generator=g)
    return x.to(device=device, dtype=_dtypes()[spec.dtype])


# The seed's "rank" of the engine's padding row: no rank of a plan (they are below 2**20).
PADDING_RANK = 2**20 - 1


def padding_content(spec: PointSpec, plan: CPPlan, rows: int, device: torch.device) -> torch.Tensor:
    """``[rows, H]``: what the plan's engine puts in a shard's padding rows
    (:attr:`nsa_cp_comm.engines.Engine.padding_rows`): zeros, or every row
    one non-zero row drawn from ``(seed, PADDING_RANK)`` (vLLM's token id 0 at
    position 0: the same row on every rank, in every padding slot)."""
    import torch

    dtype = _dtypes()[spec.dtype]
    if engines.of(plan).padding_rows == "zeros" or rows == 0:
        return torch.zeros((rows, spec.hidden_size), dtype=dtype, device=device)
    g = torch.Generator().manual_seed(shard_seed(spec.seed, PADDING_RANK))
    row = torch.randn(1, spec.hidden_size, generator=g).to(device=device, dtype=dtype)
    return row.expand(rows, spec.hidden_size).clone()


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte-exact equality: NaN == NaN and -0.0 != 0.0 here, unlike torch.equal."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    import torch

    return torch.equal(as_bytes(a), as_bytes(b))


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes, flat (``uint8``). Flattened first: a view as bytes needs a last stride
    of 1, which an empty tensor of one column (a ``[0, 1]`` of scales: a rank without rows)
    need not have."""
    import torch

    return t.contiguous().reshape(-1).view(torch.uint8)
