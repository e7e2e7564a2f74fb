"""Every iteration of the timed loop, checked against a reference the implementation cannot touch.

The timed loop runs an implementation's production form: outside code that
may cache results, share a workspace with its checked calls, write into the
caller's rows, or work only some of the time. So every iteration (warm-up
included) gets inputs no earlier iteration had, and what it returns is
checked, untimed, right after the phase that returned it (before any later
call can write the same buffer), against what the plan says every rank
contributed. The inputs are the reference's, not the implementation's: a
form that corrupts its input cannot corrupt the reference with it.

- Gather. Rank ``r``'s rows at iteration ``k`` are its shard with a mask row
  XORed into every row: per column, the sign bit and the low mantissa bits
  (exact and cheap; a finite value stays finite). The gathered buffer must
  hold every rank's masked rows byte-exact at the layout's offsets and zeros
  in the padding; after the round trip, the caller's rows must be as given.
- Scatter. Rank ``j``'s partials at iteration ``k`` are a fixed pattern
  ``P_j`` (generated block by block, so any rank can make any block) plus a
  row ``v_(j,k)``, all small multiples of 1/8 whose sums over ranks are exact
  in bfloat16 and float32 in any order. This rank's output must equal
  ``sum_j P_j[its rows] + sum_j v_(j,k)`` byte-exact.
- A padded shard (``shard = "padded"``): the rows are the first ``n_r`` of
  the ``[P, H]`` shard, its padding rows zero every iteration; the partials'
  padding rows are zero, so the scatter's ``[P, H]`` must hold the sums then
  zeros (the engine's reduce-scatter sums the padding rows too), and the
  caller's shard, padding included, must be as given.

Every rank draws the masks and rows of every rank from one generator seeded
by the point's seed, so no check needs a collective and the ranks stay in
step whatever they find.
"""

from __future__ import annotations

import time
import zlib

import torch

from ..plan import CPPlan
from .checks import layout_faults, padding_mask, stand_in, unlike
from .spec import shard_seed

# Per dtype: the integer view, the sign bit in it, and how many low mantissa bits the mask flips.
_BITS: dict[torch.dtype, tuple[torch.dtype, int, int]] = {
    torch.float32: (torch.int32, -(2**31), 16),
    torch.bfloat16: (torch.int16, -(2**15), 7),
}
# How many failed iterations a reason describes (the count covers them all).
_SHOWN = 2


def _amplitude(cp: int) -> int:
    """Largest |integer| per partial value (in eighths): a rank's value is at
    most twice it, and a sum over ``cp`` ranks stays within 240 eighths,
    exact in bfloat16's 8 significant bits."""
    return max(1, min(3, 120 // (2 * cp)))


def _generator(*key: int) -> torch.Generator:
    seed = 0
    for part in key:
        seed = (seed * 1_000_003 + part) % (2**63 - 1)
    return torch.Generator().manual_seed(seed)


class IterationCheck:
    """What the checks of timed iterations share: the dtype's integer view
    and mask bits, every rank's rows in it, the draws of every iteration (one
    generator per implementation and ``tag``, the same sequence on every rank,
    so no two implementations share an input to memoise), each iteration's row
    masks, and the tally of wrong iterations."""

    def __init__(self, impl, cp: int, rank: int, shards: list[torch.Tensor], seed: int, device, warmup: int,
                 tag: int) -> None:
        dtype = shards[rank].dtype
        if dtype not in _BITS:
            raise ValueError(f"no timed-iteration check for dtype {dtype}")
        self.int_dtype, self.sign, self.low_bits = _BITS[dtype]
        self.impl, self.rank, self.device, self.warmup, self.seed = impl, rank, device, warmup, seed
        self.cp, self.dtype = cp, dtype
        self.shards = [s.view(self.int_dtype) for s in shards]
        self.amp = _amplitude(cp)
        self.draws = _generator(shard_seed(seed, 0), zlib.crc32(impl.name.encode()), tag)
        self.masks: torch.Tensor | None = None
        self.wrong: dict[int, list[str]] = {}
        self.seconds = 0.0  # spent checking, for the cost figure

    def _draw_masks(self, hidden: int) -> None:
        """This iteration's mask row per rank: the sign bit and the low
        mantissa bits, XORed into every row of that rank (finite stays finite)."""
        g = self.draws
        low = torch.randint(1, 2**self.low_bits, (self.cp, hidden), generator=g, dtype=torch.int32)
        sign = torch.randint(0, 2, (self.cp, hidden), generator=g, dtype=torch.int32) * self.sign
        self.masks = (low | sign).to(self.int_dtype).to(self.device)

    def _fail(self, it: int, what: str) -> None:
        self.wrong.setdefault(it, []).append(what)

    def reason(self, total: int) -> str:
        """'' when every iteration was right; else how many of ``total`` were
        wrong, and what was wrong in the first ones."""
        if not self.wrong:
            return ""

        def where(it: int) -> str:
            return f"iteration {it}" + (" (warm-up)" if it < self.warmup else f" (timed {it - self.warmup})")

        shown = "; ".join(f"{where(it)}: {', '.join(what)}" for it, what in sorted(self.wrong.items())[:_SHOWN])
        return f"wrong in {len(self.wrong)} of {total} iterations of the timed loop: {shown}"


class TimedCheck(IterationCheck):
    """One FULL-mode implementation's timed iterations on one rank: writes
    each iteration's inputs (:meth:`inputs`) and checks its outputs
    (:meth:`gathered`, :meth:`scattered`), counting the iterations that were
    wrong. ``shards``: every rank's rows, as the checks generated them."""

    def __init__(self, impl, plan: CPPlan, rank: int, shards: list[torch.Tensor], hidden: int, seed: int,
                 device, warmup: int) -> None:
        super().__init__(impl, plan.cp_size, rank, shards, seed, device, warmup, 0x7E57)
        self.plan, self.hidden = plan, hidden
        self.starts = impl.starts(plan)
        self.n = plan.per_rank_tokens
        padded = impl.layout == "rank_major_padded"
        # Each rank's block of the layout: its rows, then (padded layout) its padding.
        self.block = [impl.stride(plan) if padded else self.n[r] for r in range(self.cp)]
        self.v = self.v_sum = None
        # Partials in eighths, as small ints: exact in every dtype, a quarter of float32's memory. This
        # rank's whole buffer of them, and its rows of every rank's summed.
        self.base = torch.zeros((impl.buffer_rows(plan), hidden), dtype=torch.int8, device=device)
        for b in range(self.cp):
            self.base[self.starts[b] : self.starts[b] + self.block[b]] = self._block(rank, b)
        self.summed = torch.zeros((self.n[rank], hidden), dtype=torch.int16, device=device)
        for j in range(self.cp):
            self.summed += self._block(j, rank)[: self.n[rank]]
        # One buffer every comparison writes its expected rows into: no allocation per iteration.
        self.scratch = torch.empty((plan.max_rank_len, hidden), dtype=self.dtype, device=device)
        self.scratch_int = self.scratch.view(self.int_dtype)
        # A padded shard: [P, H] in and out, and the partials' padding rows (zero) listed once.
        self.padded_shard = impl.shard == "padded"
        self.shard_rows = impl.shard_rows(plan, rank)
        self.pad_rows = padding_mask(impl, plan, device).nonzero().flatten() if self.padded_shard else None

    # --- inputs -----------------------------------------------------------------
    def _block(self, j: int, b: int) -> torch.Tensor:
        """Block ``b`` of rank ``j``'s partials pattern, in eighths."""
        g = _generator(shard_seed(self.seed, j), b, 0xB10C)
        ints = torch.randint(-self.amp, self.amp + 1, (self.block[b], self.hidden), generator=g, dtype=torch.int8)
        return ints.to(self.device)

    def inputs(self, it: int, local: torch.Tensor, partials: torch.Tensor) -> None:
        """Write iteration ``it``'s rows into ``local`` and partials into
        ``partials`` (untimed, before the iteration)."""
        g = self.draws
        self._draw_masks(self.hidden)
        v = torch.randint(-self.amp, self.amp + 1, (self.cp, self.hidden), generator=g, dtype=torch.int16)
        self.v = v.to(device=self.device, dtype=self.dtype)  # eighths
        self.v_sum = v.sum(0).to(device=self.device, dtype=self.dtype)
        n = self.n[self.rank]
        torch.bitwise_xor(self.shards[self.rank], self.masks[self.rank], out=local[:n].view(self.int_dtype))
        local[n:].zero_()  # a padded shard's padding rows, as the split leaves them
        partials.copy_(self.base)
        partials.add_(self.v[self.rank])
        partials.mul_(0.125)
        if self.padded_shard:
            partials.index_fill_(0, self.pad_rows, 0)

    def expected_sum(self) -> torch.Tensor:
        """This rank's rows of the ranks' partials summed, this iteration (a view of the scratch buffer)."""
        want = self.scratch[: self.n[self.rank]]
        want.copy_(self.summed)
        want.add_(self.v_sum)
        return want.mul_(0.125)

    # --- checks ---------------------------------------------------------------------
    def _rows_of_this_iteration(self, r: int, rows: torch.Tensor) -> bool:
        want = torch.bitwise_xor(self.shards[r], self.masks[r], out=self.scratch_int[: self.n[r]])
        return torch.equal(rows.view(self.int_dtype), want)

    def gathered(self, it: int, full: object) -> None:
        """The gathered buffer of iteration ``it``: every rank's masked rows at
        its offset, zeros in the padding."""
        t0 = time.perf_counter()
        diff = unlike(full, stand_in((self.impl.buffer_rows(self.plan), self.hidden), self.dtype, self.device))
        if diff:
            self._fail(it, f"gathered buffer: {diff}")
        else:
            for check, r, s in layout_faults(self.impl, self.plan, full, self._rows_of_this_iteration):
                self._fail(it, f"gathered rows of rank {r} (at row {s}) are not rank {r}'s rows of this iteration"
                           if check == "gather_rows" else f"padding rows of rank {r} are not zero")
        self.seconds += time.perf_counter() - t0

    def scattered(self, it: int, out: object, local: torch.Tensor) -> None:
        """The scatter's output of iteration ``it`` (this rank's rows summed
        over ranks), and the caller's rows after the round trip."""
        t0 = time.perf_counter()
        want = self.expected_sum()
        n = self.n[self.rank]
        diff = unlike(out, stand_in((self.shard_rows, self.hidden), self.dtype, self.device))
        if diff:
            self._fail(it, f"scatter output: {diff}")
        else:
            fault = rows_differ("scatter output", out[:n], want, self.int_dtype, "the ranks' partials summed")
            if fault:
                self._fail(it, fault)
            elif self.padded_shard and bool(out[n:].ne(0).any()):
                self._fail(it, f"scatter output: padding rows of the [{self.shard_rows}, H] shard are not zero "
                               "(the partials' are)")
        if not self._rows_of_this_iteration(self.rank, local[:n]) or bool(local[n:].ne(0).any()):
            self._fail(it, "the caller's rows changed during the round trip (the gather must leave them untouched)")
        self.seconds += time.perf_counter() - t0


def rows_fault(label: str, out: object, want: torch.Tensor, int_dtype: torch.dtype, meaning: str) -> str:
    """'' when ``out`` is ``want`` byte for byte; else what differs: its
    kind, shape, dtype or device, or how many rows are not ``meaning``."""
    diff = unlike(out, stand_in(tuple(want.shape), want.dtype, want.device))
    return f"{label}: {diff}" if diff else rows_differ(label, out, want, int_dtype, meaning)


def rows_differ(label: str, out: torch.Tensor, want: torch.Tensor, int_dtype: torch.dtype, meaning: str) -> str:
    """'' when ``out`` (a tensor like ``want``) holds ``want``'s bytes; else
    how many rows are not ``meaning``, and the first."""
    got, exp = out.view(int_dtype), want.view(int_dtype)
    if torch.equal(got, exp):
        return ""
    bad = (got != exp).any(dim=1).nonzero().flatten().tolist()
    return f"{label}: {len(bad)} of {want.shape[0]} row(s) are not {meaning} (first {bad[0]})"
