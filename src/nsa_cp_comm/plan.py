"""How a prefill batch is split over context-parallel ranks (docs/design.md, section 2).

Pure Python: no torch, no torch.distributed. A :class:`CPPlan` is what every
rank of a CP group agrees on; the round trips decide everything (buffer sizes,
whether the legacy path may run) from it, never from local tensor shapes.

``zigzag`` at cp 2, one request of 10 tokens ``A..J`` (``2*cp`` blocks, rank
``k`` owning blocks ``k`` and ``2*cp-1-k``)::

    blocks:   | A B C | D E F | G H | I J |
    rank 0:   A B C I J        blocks 0, 3: n_0 = 5
    rank 1:   D E F G H        blocks 1, 2: n_1 = 5   (even: max_rank_len * cp == T)
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Policy = Literal["round_robin", "zigzag", "zigzag_page", "dual_chunk_swap", "contiguous"]
POLICIES: tuple[str, ...] = ("round_robin", "zigzag", "zigzag_page", "dual_chunk_swap", "contiguous")


def ceil_align(a: int, b: int) -> int:
    """Smallest multiple of ``b`` that is ``>= a``."""
    return -(-a // b) * b


@dataclass(frozen=True)
class CPPlan:
    """The split of one batch over ``cp_size`` ranks. Build it with :func:`plan_split`.

    ``blocks[s]`` is request ``s``'s block table: for ``zigzag``,
    ``zigzag_page`` and ``dual_chunk_swap`` the ``2*cp`` consecutive block
    lengths (rank ``k`` owns blocks ``k`` and ``2*cp-1-k``); for
    ``round_robin`` and ``contiguous`` the number of the request's tokens that
    land on each of the ``cp`` ranks.
    """

    policy: str
    cp_size: int
    page_size: int
    align: int
    seq_lens: tuple[int, ...]
    padded_lens: tuple[int, ...]
    total_tokens: int
    per_rank_tokens: tuple[int, ...]
    blocks: tuple[tuple[int, ...], ...]
    # The serving engine whose rules the plan follows (nsa_cp_comm.engines):
    # its split-time padding (``physical_len``) is read from it.
    engine: str = "seed_fix"
    # The largest CUDA-graph capture size where the engine runs this step in
    # graphs (its ``physical_len`` is then the capture bucket that holds the
    # longest rank); 0: eager.
    max_capture_size: int = 0
    # The model the engine serves (nsa_cp_comm.engines.MODELS): its router's
    # masking of padding rows and what its padding rows hold are the engine's
    # for that model.
    engine_model: str = "deepseek_v32"
    # The experts' activation quantization (nsa_cp_comm.modes.MOE_QUANTS):
    # whether the engine gathers quantized rows, and whether its router's
    # padding mask runs, are the engine's for it.
    moe_quant: str = "none"

    @property
    def max_rank_len(self) -> int:
        """``m = max_r n_r``: every rank's shard is padded to this many rows."""
        return max(self.per_rank_tokens)

    @property
    def padded_total(self) -> int:
        """Rows of the padded gather buffer, ``m * cp`` (may exceed ``total_tokens``)."""
        return self.max_rank_len * self.cp_size

    @property
    def is_even(self) -> bool:
        return len(set(self.per_rank_tokens)) == 1

    @property
    def padding_frac(self) -> float:
        """Share of the padded buffer that is padding: ``1 - T / (m * cp)``."""
        return self.padding_columns()["padding_frac"]

    @property
    def claim_holds(self) -> bool:
        """Whether ``m * cp == ceil_align(sum(seq_lens), cp)``, the assumption
        that the pre-existing cp alignment sizes the gather buffer. False for
        page-aligned and multi-request zigzag splits in general."""
        return self.padding_columns()["claim_holds"]

    def padding_columns(self, stride: int | None = None) -> dict[str, Any]:
        """``padded_total``, ``padding_frac`` and ``claim_holds`` of a gather
        buffer of ``stride`` rows per rank (default ``max_rank_len``; an
        implementation padded at the split moves ``P``)."""
        total = (self.max_rank_len if stride is None else stride) * self.cp_size
        return {"padded_total": total, "padding_frac": 1.0 - self.total_tokens / total,
                "claim_holds": total == ceil_align(sum(self.seq_lens), self.cp_size)}

    def rank_indices(self, rank: int) -> tuple[int, ...]:
        """Global token indices (over the padded, concatenated batch) that
        ``rank`` holds, in its local row order."""
        _check_rank(rank, self.cp_size)
        if self.policy == "round_robin":
            return tuple(range(rank, self.total_tokens, self.cp_size))
        if self.policy == "contiguous":
            start = rank * _contiguous_len(self.total_tokens, self.cp_size)
            return tuple(range(start, start + self.per_rank_tokens[rank]))
        # Block k of every request, then block 2*cp-1-k of every request; dual_chunk_swap
        # keeps each request's two chunks together (vLLM's rank-local row order).
        first: list[int] = []
        second: list[int] = []
        mirror = first if self.policy == "dual_chunk_swap" else second
        req_start = 0
        for length, blk in zip(self.padded_lens, self.blocks):
            starts = list(itertools.accumulate(blk, initial=req_start))
            for rows, j in ((first, rank), (mirror, 2 * self.cp_size - 1 - rank)):
                rows.extend(range(starts[j], starts[j] + blk[j]))
            req_start += length
        return tuple(first + second)

    def rank_offset(self, rank: int) -> int:
        """First row of ``rank``'s shard in the rank-major concatenation of all
        shards (``sum_{r<rank} n_r``), as used by unpadded layouts."""
        _check_rank(rank, self.cp_size)
        return sum(self.per_rank_tokens[:rank])


def _check_rank(rank: int, cp_size: int) -> None:
    if not _is_int(rank) or not 0 <= rank < cp_size:
        raise ValueError(f"rank={rank!r} is not in [0, {cp_size})")


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


# Bounds checked before any planning: a plan holds ``2*cp`` (or ``cp``) block
# lengths per request, so its size and the time to build it grow with
# requests x cp (cp_size=10^7 took 40 s and 460 MB before any error). Far
# beyond any CP group that serves (tens of ranks) and any batch one holds.
MAX_CP_SIZE = 1 << 16
MAX_PLAN_BLOCKS = 1 << 24  # requests x cp_size: ~5 s and ~150 MB to plan


def _positive_int(name: str, value: object) -> int:
    if not _is_int(value) or value < 1:  # type: ignore[operator]
        raise ValueError(f"{name}={value!r} must be a positive int")
    return int(value)  # type: ignore[arg-type]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def _even_blocks(length: int, n: int) -> tuple[int, ...]:
    q, rem = divmod(length, n)
    return tuple(q + (1 if i < rem else 0) for i in range(n))


def _clipped(sizes: Sequence[int], length: int) -> tuple[int, ...]:
    """Blocks of ``sizes`` laid end to end from 0, each cut to its part below
    ``length`` (the blocks past it empty)."""
    starts = itertools.accumulate(sizes, initial=0)
    return tuple(max(0, min(size, length - start)) for size, start in zip(sizes, starts))


def _chunk_blocks(length: int, n: int) -> tuple[int, ...]:
    """``n`` chunks of ``ceil(length / n)`` tokens, the last ones shorter or
    empty (vLLM's DualChunkSwap: a chunk of length <= 0 is skipped)."""
    return _clipped((-(-length // n),) * n, length)


def _contiguous_len(total: int, cp: int) -> int:
    """Rows of every rank's slice of a stream of ``total`` tokens cut into ``cp``
    equal contiguous slices (the stream padded to a multiple of ``cp``)."""
    return -(-total // cp)


def _page_blocks(length: int, n: int, page_size: int) -> tuple[int, ...]:
    """Blocks of whole pages; the block holding the last page is shortened so
    the blocks sum to ``length`` and the blocks after it are empty."""
    pages = _even_blocks(-(-length // page_size), n)
    return _clipped([p * page_size for p in pages], length)


def plan_split(
    seq_lens: Sequence[int],
    cp_size: int,
    *,
    policy: str,
    page_size: int = 1,
    align: int | None = None,
    pad_batch: bool = True,
    engine: str = "seed_fix",
    max_capture_size: int = 0,
    engine_model: str = "deepseek_v32",
    moe_quant: str = "none",
) -> CPPlan:
    """Split a batch of requests with extend lengths ``seq_lens`` over ``cp_size`` ranks.

    The batch is first padded to a multiple of ``align`` (default ``cp_size``)
    by lengthening the last request; with ``pad_batch=False`` (an engine that
    splits the raw extend lengths) it is not, and ``align`` must be None.
    ``engine`` names the rules the plan follows (nsa_cp_comm.engines; use
    ``engines.get(name).plan`` to build a plan by an engine's rules);
    ``max_capture_size`` the largest CUDA-graph capture size where the engine
    runs the step in graphs (0: eager), ``engine_model`` the model it serves,
    ``moe_quant`` its experts' activation quantization.
    ``policy`` is one of ``round_robin``,
    ``zigzag`` (two mirrored blocks per rank of every request, near-equal
    blocks), ``zigzag_page`` (the same on page boundaries, used with a shared
    KV pool), ``dual_chunk_swap`` (vLLM's: the same mirror with blocks of
    ``ceil(len / (2*cp))`` tokens, so a request shorter than ``2*cp`` leaves
    ranks without rows) or ``contiguous`` (vllm-ascend's DSA-CP: the
    concatenated stream cut into ``cp`` slices of ``ceil(T / cp)`` tokens, so
    only the tail rank(s) are short and a request can span ranks).

    Raises ValueError naming the argument and value on bad input.
    """
    # The sizes first, before anything costs time in proportion to them.
    cp_size = _positive_int("cp_size", cp_size)
    if cp_size > MAX_CP_SIZE:
        raise ValueError(f"cp_size={cp_size} is over the {MAX_CP_SIZE} ranks a plan may have")
    if isinstance(seq_lens, (str, bytes)) or not isinstance(seq_lens, Sequence):
        raise ValueError(f"seq_lens={_short(seq_lens)} must be a non-empty list of positive ints")
    if len(seq_lens) == 0:
        raise ValueError(f"seq_lens={seq_lens!r} must be a non-empty list of positive ints")
    if len(seq_lens) * cp_size > MAX_PLAN_BLOCKS:
        raise ValueError(f"seq_lens has {len(seq_lens)} requests: at cp_size={cp_size} that is "
                         f"{len(seq_lens) * cp_size} request-rank blocks, over the {MAX_PLAN_BLOCKS} a plan may hold")
    for i, length in enumerate(seq_lens):
        if not _is_int(length) or length < 1:
            raise ValueError(f"seq_lens[{i}]={length!r} must be a positive int")
    page_size = _positive_int("page_size", page_size)
    if not _is_int(max_capture_size) or max_capture_size < 0:
        raise ValueError(f"max_capture_size={max_capture_size!r} must be a non-negative int (0: eager)")
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is not one of {', '.join(POLICIES)}")
    if not pad_batch and align is not None:
        raise ValueError(f"align={align!r} needs pad_batch=True: a split of the raw lengths pads no batch")
    if align is None:
        align = cp_size
    elif not _is_int(align) or align < 1 or align % cp_size:
        raise ValueError(f"align={align!r} must be a positive multiple of cp_size={cp_size}")

    lens = [int(x) for x in seq_lens]
    total = ceil_align(sum(lens), int(align)) if pad_batch else sum(lens)
    padded = lens[:-1] + [lens[-1] + total - sum(lens)]

    n = 2 * cp_size
    starts = itertools.accumulate(padded, initial=0)  # each request's first token
    if policy == "round_robin":
        # a request's tokens t in [s, s+length) with t % cp == r
        blocks = [tuple(len(range(s + (r - s) % cp_size, s + length, cp_size)) for r in range(cp_size))
                  for s, length in zip(starts, padded)]
        per_rank = _even_blocks(total, cp_size)
    elif policy == "contiguous":
        size = _contiguous_len(total, cp_size)
        per_rank = _clipped((size,) * cp_size, total)
        blocks = [tuple(max(0, min(s + length, (r + 1) * size) - max(s, r * size)) for r in range(cp_size))
                  for s, length in zip(starts, padded)]
    else:
        if policy == "zigzag":
            blocks = [_even_blocks(length, n) for length in padded]
        elif policy == "dual_chunk_swap":
            blocks = [_chunk_blocks(length, n) for length in padded]
        else:
            blocks = [_page_blocks(length, n, page_size) for length in padded]
        per_rank = tuple(sum(b[k] + b[n - 1 - k] for b in blocks) for k in range(cp_size))

    return CPPlan(
        policy=policy,
        cp_size=cp_size,
        page_size=page_size,
        align=int(align),
        seq_lens=tuple(lens),
        padded_lens=tuple(padded),
        total_tokens=total,
        per_rank_tokens=per_rank,
        blocks=tuple(blocks),
        engine=engine,
        max_capture_size=int(max_capture_size),
        engine_model=str(engine_model),
        moe_quant=str(moe_quant),
    )
