"""What the padded gather copies: on an even plan nothing (legacy's call, the
shard's own storage as the all-gather's input); on an uneven plan only the
ranks shorter than m, into a send block whose padding stays zero, also when a
reused block sees its rank's length change.

Unit level, one process: a stand-in for the all-gather records each call's
arguments (no rows move), and a dispatch mode records every aten op the
library runs around it, so a copy or a zeroing cannot hide. Then the same
facts on real gloo ranks (the warm pool), with the bytes.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import staging_tasks
from nsa_cp_comm import production, roundtrip
from nsa_cp_comm.plan import CPPlan, plan_split

H = 8
EVEN = [plan_split((8,), 2, policy="zigzag"), plan_split((12,), 4, policy="round_robin"),
        plan_split((1001, 300), 3, policy="zigzag"), plan_split((7,), 1, policy="zigzag")]
UNEVEN = [plan_split((1001, 300), 2, policy="zigzag"),  # n = (652, 650): rank 1 short by 2
          plan_split((1000,), 2, policy="zigzag_page", page_size=64),  # n = (488, 512)
          plan_split((5,), 4, policy="zigzag_page", page_size=64)]  # n = (8, 0, 0, 0): empty ranks
WRITES = ("copy_", "zero_", "fill_", "clone", "zeros", "_to_copy", "index_put_", "cat")


def _plan_id(plan: CPPlan) -> str:
    return f"cp{plan.cp_size}-n{'_'.join(map(str, plan.per_rank_tokens))}"


class Recorder(TorchDispatchMode):
    """The stand-in world of one rank: ``rank`` of ``world``; every all-gather
    recorded (its arguments, what its input holds), never run; every aten op
    the library runs outside the stand-in recorded by name."""

    def __init__(self, rank: int, world: int) -> None:
        super().__init__()
        self.rank, self.world = rank, world
        self.gathers: list[dict] = []
        self.ops: list[str] = []
        self._inside = False

    def all_gather_into(self, output, input, group=None):
        self._inside = True
        try:
            self.gathers.append(dict(out_ptr=output.data_ptr(), out_shape=tuple(output.shape),
                                     in_ptr=input.data_ptr(), in_shape=tuple(input.shape),
                                     in_rows=input.detach().clone(), group=group))
        finally:
            self._inside = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._inside:
            self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))

    def copies(self) -> list[str]:
        return [op for op in self.ops if op in WRITES]

    def take(self) -> tuple[list[dict], list[str]]:
        out = self.gathers, self.ops
        self.gathers, self.ops = [], []
        return out


@pytest.fixture
def world(monkeypatch):
    """``world(rank, cp)``: the stand-in collectives of that rank, patched into
    the modules that issue the padded and legacy gathers."""

    def make(rank: int, cp: int) -> Recorder:
        rec = Recorder(rank, cp)
        for mod in (roundtrip, production):
            monkeypatch.setattr(mod, "all_gather_into", rec.all_gather_into)
            monkeypatch.setattr(mod, "group_rank", lambda group=None: rec.rank)
        monkeypatch.setattr(roundtrip, "group_size", lambda group=None: rec.world)
        # a stand-in world has no peers to exchange fingerprints with (test_agree.py: real ranks)
        monkeypatch.setattr(roundtrip, "agree", lambda *args, **kwargs: None)
        return rec

    return make


def _shard(plan: CPPlan, rank: int, it: int = 0) -> torch.Tensor:
    n = plan.per_rank_tokens[rank]
    return (torch.arange(n * H, dtype=torch.float32).reshape(n, H) + 1000 * rank + 100_000 * it + 1)


def _recorded(rec: Recorder, fn):
    with rec:
        fn()
    return rec.take()


# -- the checker: what the copy rule says, for every rank of a plan -----------------


def assert_copy_rule(world, plan: CPPlan) -> None:
    """Every rank of ``plan``, through the checked call and the production form:
    a rank with m rows hands its shard (its own data_ptr) to one all-gather
    into the [m*cp, H] buffer, copying and zeroing nothing; on an even plan that
    is legacy's call and legacy's ops exactly. A shorter rank copies its rows
    once into an [m, H] send block whose tail is zero."""
    m = plan.max_rank_len
    for rank in range(plan.cp_size):
        rec = world(rank, plan.cp_size)
        local, n = _shard(plan, rank), plan.per_rank_tokens[rank]
        where = f"rank {rank} of {list(plan.per_rank_tokens)}"

        # The checked call.
        (g,), ops = _recorded(rec, lambda: roundtrip.padded_gather(local, plan, check=False))
        assert g["out_shape"] == (plan.padded_total, H), where
        if n == m:
            assert g["in_ptr"] == local.data_ptr(), f"{where}: the all-gather's input is not the shard itself"
            assert rec.copies() == [] and not [op for op in ops if op in WRITES], f"{where} copied: {ops}"
        else:
            assert g["in_ptr"] != local.data_ptr() and g["in_shape"] == (m, H), f"{where}: not an [m, H] send block"
            assert torch.equal(g["in_rows"][:n], local) and bool(g["in_rows"][n:].eq(0).all()), where
            # one copy (of no rows on an empty rank) and the tail zeroed as the fresh block is made
            assert ops.count("copy_") == 1 and ops.count("zero_") == 1, f"{where}: {ops}"
        if plan.is_even:
            (leg,), leg_ops = _recorded(rec, lambda: roundtrip.legacy_gather(local, plan, check=False))
            same = ("out_shape", "in_ptr", "in_shape", "group")
            assert {k: g[k] for k in same} == {k: leg[k] for k in same}, f"{where}: not legacy's call"
            assert ops == leg_ops, f"{where}: padded ran {ops}, legacy {leg_ops}"

        # The production form: buffers made once (untimed), then two calls with new rows.
        form = production.padded_form(plan, H, torch.float32, "cpu", None)
        rec.take()
        if plan.is_even:
            assert form.stage is None, f"{where}: a local phase on an even plan"
        else:
            assert form.stage is not None, f"{where}: every rank of an uneven plan has the local phase"
        ptrs = []
        for it in (1, 2):
            local = _shard(plan, rank, it)
            if form.stage is not None:
                _, stage_ops = _recorded(rec, lambda: form.stage(local))
                want = ["copy_"] if n < m else []  # the tail was zeroed once, when the form was made
                assert [op for op in stage_ops if op in WRITES] == want, f"{where}, call {it}: staged {stage_ops}"
            (g,), ops = _recorded(rec, lambda: form.gather(local))
            assert not [op for op in ops if op in WRITES], f"{where}: the gather copied: {ops}"
            assert g["out_shape"] == (plan.padded_total, H), where
            if n == m:
                assert g["in_ptr"] == local.data_ptr(), f"{where}: the all-gather's input is not the shard itself"
            else:
                assert torch.equal(g["in_rows"][:n], local) and bool(g["in_rows"][n:].eq(0).all()), where
            ptrs.append((g["out_ptr"], g["in_ptr"] if n < m else None))
        assert ptrs[0] == ptrs[1], f"{where}: the reused buffers moved"


@pytest.mark.parametrize("plan", EVEN, ids=_plan_id)
def test_an_even_plan_issues_legacys_call_from_the_shard(world, plan):
    assert plan.is_even
    assert_copy_rule(world, plan)


@pytest.mark.parametrize("plan", UNEVEN, ids=_plan_id)
def test_an_uneven_plan_copies_only_on_short_ranks(world, plan):
    assert not plan.is_even and plan.max_rank_len in plan.per_rank_tokens
    assert_copy_rule(world, plan)


NOT_THE_SHARD = "the all-gather's input is not the shard itself"


@pytest.mark.parametrize("broken, plan, says", [
    ("every_rank_stages", EVEN[0], rf"rank 0 of \[4, 4\]: {NOT_THE_SHARD}"),
    ("every_rank_stages", UNEVEN[1], rf"rank 1 of \[488, 512\]: {NOT_THE_SHARD}"),  # rank 0 is short: it must stage
    ("stage_copies", EVEN[0], rf"rank 0 of \[4, 4\]: {NOT_THE_SHARD}"),
    ("stage_copies", UNEVEN[1], r"rank 0 of \[488, 512\]: not an \[m, H\] send block"),
], ids=["every_rank_stages-even", "every_rank_stages-uneven", "stage_copies-even", "stage_copies-uneven"])
def test_the_checker_fails_a_gather_that_copies_again(world, monkeypatch, broken, plan, says):
    """The checker above, against the old rule brought back: staging on every
    rank (the rule patched), or a copy in the stage whatever the rule says."""
    if broken == "every_rank_stages":
        monkeypatch.setattr(roundtrip, "stages_rows", lambda plan, rank: True)
    else:
        monkeypatch.setattr(roundtrip, "padded_stage", lambda send, local, plan, rank: local.clone())
    with pytest.raises(AssertionError, match=says):
        assert_copy_rule(world, plan)


# -- a reused send block whose rank's length changes --------------------------------

# cp 2, page 8: m = 8 on all of them, rank 1 holds 6, 2, 0, 6, 4 rows
SAME_M = [plan_split((length,), 2, policy="zigzag_page", page_size=8) for length in (13, 9, 7, 13, 11)]


def assert_no_stale_tail(world) -> None:
    """One send block, made for the first plan, reused for every later one:
    each call's [m, H] input is that call's rows, then zeros; a call as long as
    the one before zeroes nothing, a shorter one exactly the rows it left."""
    assert {p.max_rank_len for p in SAME_M} == {8} and [p.per_rank_tokens[1] for p in SAME_M] == [6, 2, 0, 6, 4]
    rec = world(1, 2)
    send = roundtrip.padded_send_block(SAME_M[0], H, dtype=torch.float32)
    assert send is not None and send.block.shape == (8, H) and bool(send.block[6:].eq(0).all())
    before = 6
    for it, plan in enumerate(SAME_M + [SAME_M[-1]]):  # the last plan twice: nothing to zero
        local = _shard(plan, 1, it)
        n = local.shape[0]
        with rec:
            got = roundtrip.padded_stage(send, local, plan, 1)
        _, ops = rec.take()
        assert got.shape == (8, H) and got.data_ptr() == send.block.data_ptr()
        assert torch.equal(got[:n], local), f"call {it}: rows"
        assert bool(got[n:].eq(0).all()), f"call {it}: stale rows in the padding after {before} -> {n} rows"
        assert ops.count("zero_") == (1 if before > n else 0), f"call {it} ({before} -> {n} rows): {ops}"
        before = n


def test_a_reused_send_block_never_sends_stale_rows(world):
    assert_no_stale_tail(world)


def test_the_stale_tail_checker_fails_a_block_that_never_rezeroes(world, monkeypatch):
    def stage_without_rezeroing(self, local, m):
        self.block[: local.shape[0]].copy_(local)
        return self.block[:m]

    monkeypatch.setattr(roundtrip.SendBlock, "stage", stage_without_rezeroing)
    with pytest.raises(AssertionError, match=r"call 1: stale rows in the padding after 6 -> 2 rows"):
        assert_no_stale_tail(world)


def test_a_send_block_refuses_a_plan_it_cannot_hold():
    block = roundtrip.SendBlock(4, H, dtype=torch.float32, zero_from=2)
    with pytest.raises(ValueError, match="do not fit a send block of 4 rows"):
        block.stage(torch.ones(3, H), 5)
    with pytest.raises(ValueError, match="none was given"):
        roundtrip.padded_stage(None, torch.ones(2, H), UNEVEN[1], 0)


# -- the same on real gloo ranks, with the bytes ------------------------------------


def test_on_gloo_ranks_the_inputs_and_bytes(rank_pool):
    """Two real ranks, every entry point (checked call, production form,
    CPLayerCommunicator, a reused send block across plans): the all-gather's
    input is the shard where the rank has m rows, and every gathered buffer
    is byte-exact (legacy's bytes on the even plan)."""
    for r in rank_pool(2).run(staging_tasks.gather_inputs_and_bytes, H, timeout_s=60):
        assert r.ok, r.error
        assert r.value["fails"] == [], r.value["fails"]
        seen = r.value["seen"]
        assert seen["even"] == {"padded_gather": True, "communicator": True, "production": [True, True]}
        short = r.rank == 0  # n = (488, 512)
        assert seen["uneven"] == {"padded_gather": not short, "communicator": not short,
                                  "production": [not short, not short]}
        assert r.value["reused_calls"] == len(staging_tasks.REUSED)
