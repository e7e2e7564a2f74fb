"""Rank tasks of tests/lib/test_gather_copies.py: what the padded gather hands
the all-gather, and the bytes it gathers, on real ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist

from nsa_cp_comm import CPLayerCommunicator, ScatterMode, legacy_gather, padded_gather, production, roundtrip
from nsa_cp_comm.collectives import all_gather_into
from nsa_cp_comm.plan import CPPlan, plan_split

EVEN = plan_split((1000,), 2, policy="zigzag")  # n = (500, 500)
UNEVEN = plan_split((1000,), 2, policy="zigzag_page", page_size=64)  # n = (488, 512)
# m = 8 on each, rank 0 holds 8 rows, rank 1 6, 2, 0, 6, 4: one send block reused across them
REUSED = [plan_split((length,), 2, policy="zigzag_page", page_size=8) for length in (13, 9, 7, 13, 11)]


def rows(plan: CPPlan, rank: int, hidden: int, it: int) -> torch.Tensor:
    """Rank ``rank``'s rows of call ``it``: distinct on every rank and call,
    so any rank can build every rank's, and a stale row shows."""
    n = plan.per_rank_tokens[rank]
    return torch.arange(n * hidden, dtype=torch.float32).reshape(n, hidden) + 1000 * rank + 100_000 * it + 1


def expected(plan: CPPlan, hidden: int, it: int) -> torch.Tensor:
    m = plan.max_rank_len
    full = torch.zeros((plan.padded_total, hidden), dtype=torch.float32)
    for r, n in enumerate(plan.per_rank_tokens):
        full[r * m : r * m + n] = rows(plan, r, hidden, it)
    return full


def gather_inputs_and_bytes(hidden: int) -> dict:
    """Per entry point and plan: whether the all-gather's input was the shard
    itself (its data_ptr); every gathered buffer checked byte for byte."""
    rank = dist.get_rank()
    fails: list[str] = []
    inputs: list[int] = []
    saved = roundtrip.all_gather_into, production.all_gather_into

    def spy(output, input, group=None):
        inputs.append(input.data_ptr())
        return all_gather_into(output, input, group)

    def from_shard(local, call) -> bool:
        inputs.clear()
        out = call()
        if len(inputs) != 1:
            fails.append(f"{len(inputs)} all-gathers seen")
        return out, bool(inputs) and inputs[-1] == local.data_ptr()

    def same(label, got, want):
        if not torch.equal(got.view(torch.int32), want.view(torch.int32)):
            fails.append(f"{label}: bytes differ")

    seen: dict[str, dict] = {}
    roundtrip.all_gather_into = production.all_gather_into = spy
    try:
        for name, plan in (("even", EVEN), ("uneven", UNEVEN)):
            local = rows(plan, rank, hidden, 0)
            out, direct = from_shard(local, lambda: padded_gather(local, plan))
            same(f"{name} padded_gather", out, expected(plan, hidden, 0))
            if plan.is_even:
                same(f"{name} padded == legacy", out, legacy_gather(local, plan))
            comm = CPLayerCommunicator(plan, ScatterMode.FULL)
            out, via_comm = from_shard(local, lambda: comm.prepare_mlp(local))
            same(f"{name} prepare_mlp", out, expected(plan, hidden, 0))
            form = production.padded_form(plan, hidden, torch.float32, "cpu", None)
            timed = []
            for it in (1, 2):  # reused buffers, new rows
                local = rows(plan, rank, hidden, it)
                if form.stage is not None:
                    form.stage(local)
                out, direct_form = from_shard(local, lambda: form.gather(local))
                same(f"{name} production call {it}", out, expected(plan, hidden, it))
                timed.append(direct_form)
            seen[name] = {"padded_gather": direct, "communicator": via_comm, "production": timed}
    finally:
        roundtrip.all_gather_into, production.all_gather_into = saved

    # One send block, made for the first plan, reused as rank 1's length changes.
    send = roundtrip.padded_send_block(REUSED[0], hidden, dtype=torch.float32)
    for it, plan in enumerate(REUSED):
        full = torch.empty((plan.padded_total, hidden), dtype=torch.float32)
        all_gather_into(full, roundtrip.padded_stage(send, rows(plan, rank, hidden, it), plan, rank))
        same(f"reused send block, call {it} ({list(plan.per_rank_tokens)})", full, expected(plan, hidden, it))
    return {"seen": seen, "fails": fails, "reused_calls": len(REUSED)}
