"""Every timed iteration of a dispatch implementation, checked against a reference it cannot touch.

A SCATTERED-mode implementation (DeepEP's role) is outside code that may
memoise its all-to-all, skip the routing metadata, or deliver rows only some
of the time, checked as :mod:`.verify` checks the FULL-mode forms:

- Dispatch. Rank ``s``'s rows at iteration ``k`` are its shard with a mask
  row XORed into every row (sign and low mantissa bits, as :mod:`.verify`
  does); the routing keeps which ranks each token goes to (the checks'
  routing of the shard) but draws new metadata: every expert id moves to
  another expert of the same rank, every weight gets new low mantissa bits.
  The received rows, their expert ids and weights must be exactly those of
  the tokens routed here, source-rank major, tokens ascending.
- Combine. What this rank hands the combine for its received rows (its
  experts' weighted outputs, in production) is a fixed pattern per
  (destination, source) segment plus a row per (rank, iteration), small
  multiples of 1/8 whose sums over ranks are exact in bfloat16 and float32 in
  any order. Token ``t``'s output must equal the sum over the ranks it went
  to of their pattern rows for it, byte-exact; after the round trip the
  caller's rows must be as given.

Every rank derives every rank's routing and draws from the point's seed (no collective).
"""

from __future__ import annotations

import time

import torch

from ..alternatives import a2a_layout
from ..plan import CPPlan
from .checks import stand_in, unlike
from .spec import shard_seed
from .verify import IterationCheck, _generator, rows_fault

# Low mantissa bits of a float32 routing weight redrawn each iteration.
_WEIGHT_BITS = 12


class DispatchCheck(IterationCheck):
    """One dispatch implementation's timed iterations on one rank: writes each
    iteration's inputs (:meth:`inputs`) and checks the dispatch's received rows
    and routing (:meth:`dispatched`) and the combine's output
    (:meth:`combined`). ``shards``: every rank's rows, as the checks generated
    them; ``moe``: the point's reference MoE (its routing and expert count)."""

    def __init__(self, impl, plan: CPPlan, rank: int, shards: list[torch.Tensor], moe, seed: int, device,
                 warmup: int) -> None:
        super().__init__(impl, plan.cp_size, rank, shards, seed, device, warmup, 0xD15)
        self.hidden = shards[rank].shape[1]
        self.per = moe.num_experts // self.cp
        k = moe.topk
        routes = [moe.route(s) if s.shape[0] else
                  (torch.empty((0, k), dtype=torch.int64, device=device),
                   torch.empty((0, k), dtype=torch.float32, device=device)) for s in shards]
        self.idx, self.weight = routes[rank]
        layouts = [a2a_layout(idx, self.per, self.cp) for idx, _ in routes]
        # counts[s][d]: rows rank s sends rank d.
        counts = [splits for _, splits in layouts]
        # What this rank must receive: per source, the tokens routed here.
        recv_rows, src, recv_idx, recv_weight = [], [], [], []
        for s, (send_token, splits) in enumerate(layouts):
            tok = send_token[sum(splits[:rank]) : sum(splits[: rank + 1])]
            recv_rows.append(self.shards[s].index_select(0, tok))
            src.append(torch.full((tok.numel(),), s, dtype=torch.int64, device=device))
            recv_idx.append(routes[s][0].index_select(0, tok))
            recv_weight.append(routes[s][1].index_select(0, tok))
        self.recv_rows = torch.cat(recv_rows)
        self.recv_src = torch.cat(src)
        self.recv_idx = torch.cat(recv_idx)
        self.recv_weight = torch.cat(recv_weight)
        self.n_recv = self.recv_rows.shape[0]
        # What this rank hands the combine: per source segment, (this rank, s)'s pattern.
        self.y_base = torch.cat([self._segment(rank, s, counts[s][rank]) for s in range(self.cp)])
        # What the combine must return: per destination d, d's pattern rows for this rank's tokens.
        send_token, splits = layouts[rank]
        n = shards[rank].shape[0]
        self.summed = torch.zeros((n, self.hidden), dtype=torch.float32, device=device)
        self.sent_to = torch.zeros((n, self.cp), dtype=torch.float32, device=device)
        at = 0
        for d in range(self.cp):
            tok = send_token[at : at + splits[d]]
            at += splits[d]
            self.summed.index_add_(0, tok, self._segment(d, rank, splits[d]).to(torch.float32))
            self.sent_to[tok, d] = 1.0
        self.v = self.shift = self.w_masks = None

    def _segment(self, d: int, s: int, rows: int) -> torch.Tensor:
        """Destination ``d``'s combine-input pattern for the rows source ``s`` sent it, in eighths."""
        g = _generator(shard_seed(self.seed, d), s, 0xC0B)
        return torch.randint(-self.amp, self.amp + 1, (rows, self.hidden), generator=g, dtype=torch.int8).to(self.device)

    # --- inputs -----------------------------------------------------------------
    def _moved(self, idx: torch.Tensor) -> torch.Tensor:
        # Another expert of the same rank: the same ranks receive the token.
        return idx - idx % self.per + (idx % self.per + self.shift) % self.per

    def _reweighed(self, weight: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        return (weight.view(torch.int32) ^ masks).view(torch.float32)

    def inputs(self, it: int, local: torch.Tensor, idx: torch.Tensor, weight: torch.Tensor, y: torch.Tensor) -> None:
        """Write iteration ``it``'s rows, routing and combine input (untimed, before the iteration)."""
        g = self.draws
        self._draw_masks(self.hidden)
        self.v = torch.randint(-self.amp, self.amp + 1, (self.cp, self.hidden), generator=g,
                               dtype=torch.int16).to(self.device)
        self.shift = int(torch.randint(0, self.per, (1,), generator=g))
        self.w_masks = torch.randint(1, 2**_WEIGHT_BITS, (self.cp,), generator=g, dtype=torch.int32).to(self.device)
        torch.bitwise_xor(self.shards[self.rank], self.masks[self.rank], out=local.view(self.int_dtype))
        idx.copy_(self._moved(self.idx))
        weight.copy_(self._reweighed(self.weight, self.w_masks[self.rank]))
        y.copy_(self.y_base)
        y.add_(self.v[self.rank].to(y.dtype))
        y.mul_(0.125)

    # --- checks ---------------------------------------------------------------------
    def dispatched(self, it: int, recv: object, handle: object) -> None:
        """The rows and routing the dispatch of iteration ``it`` delivered here."""
        t0 = time.perf_counter()
        want = stand_in((self.n_recv, self.hidden), self.dtype, self.device)
        diff = unlike(recv, want)
        if diff:
            self._fail(it, f"received rows: {diff}")
        else:
            rows = torch.bitwise_xor(self.recv_rows, self.masks.index_select(0, self.recv_src))
            if not torch.equal(recv.view(self.int_dtype), rows):
                self._fail(it, "received rows are not the rows routed to this rank this iteration")
        r_idx, r_weight = getattr(handle, "recv_idx", None), getattr(handle, "recv_weight", None)
        if r_idx is not None and not (isinstance(r_idx, torch.Tensor) and r_idx.shape == self.recv_idx.shape
                                      and torch.equal(r_idx.to(torch.int64), self._moved(self.recv_idx))):
            self._fail(it, "received expert ids are not this iteration's routing")
        if r_weight is not None:
            w = self._reweighed(self.recv_weight, self.w_masks.index_select(0, self.recv_src)[:, None])
            if not (isinstance(r_weight, torch.Tensor) and r_weight.shape == w.shape
                    and torch.equal(r_weight.to(torch.float32), w)):
                self._fail(it, "received routing weights are not this iteration's")
        self.seconds += time.perf_counter() - t0

    def combined(self, it: int, out: object, local: torch.Tensor) -> None:
        """The combine's output of iteration ``it``: per token, the pattern rows
        of the ranks it went to, summed; and the caller's rows after the round trip."""
        t0 = time.perf_counter()
        want = ((self.summed + self.sent_to @ self.v.to(torch.float32)) * 0.125).to(self.dtype)
        fault = rows_fault("combine output", out, want, self.int_dtype, "the sum of what the ranks they went to handed back")
        if fault:
            self._fail(it, fault)
        mine = torch.bitwise_xor(self.shards[self.rank], self.masks[self.rank])
        if not torch.equal(local.view(self.int_dtype), mine):
            self._fail(it, "the caller's rows changed during the round trip (the dispatch must leave them untouched)")
        self.seconds += time.perf_counter() - t0
