"""SGLang 0.5.23's CP gather and reduce-scatter as a plug-in on the engine's [P, H] shards.

examples/sglang_cp_plugin wraps the engine's functions (written from its
wheel) as an engine engineer would: ``shard="padded"``, so the matrix hands it
the split's ``[P, H]`` and holds the ``[P, H]`` it returns, padding rows
included, in the checked calls and in every timed iteration. Over both
strategies, even and uneven plans, every point is ``ok`` or ``skipped`` with
the engine's reason; each broken copy fails its check. In-process, on the
warm pools.
"""

from __future__ import annotations

import pytest
import torch

import plugin_tasks
import sglang_plugin_tasks as tasks
from nsa_cp_comm import impls, protocol
from nsa_cp_comm.harness.checks import shard_input
from nsa_cp_comm.plan import plan_split

plugin_tasks.on_path(tasks.PLUGIN)
REF = tasks.REF
SGLANG = "sglang_0_5_23"
DEEPEP = "zigzag DSA CP runs its MoE through DeepEP"


def _spec(lens, cp, policy="round_robin", engine=SGLANG, iters=2):
    return plugin_tasks.spec(REF, lens, cp, policy, engine, iters)


# (lens, cp, policy, engine) -> the plug-in's status, and what its reason says when skipped
SWEEP = {
    2: [
        ((8,), "round_robin", SGLANG, "ok"),  # even, P*cp == T: legacy's bits
        ((6,), "round_robin", SGLANG, "ok"),  # even, n = 3 < P = 4: padded anyway
        ((7,), "round_robin", SGLANG, "ok"),  # uneven (4, 3)
        ((1,), "round_robin", SGLANG, "InterleaveCPStrategy.can_apply refuses 1 tokens at cp = 2"),
        ((1000,), "zigzag", SGLANG, DEEPEP),
        ((3, 500), "zigzag", SGLANG, "ZigzagCPStrategy.can_apply refuses a request shorter than 2*cp = 4"),
        # the seed fix's engine pads the batch to 8 before the split: not this engine's (4, 3)
        ((7,), "round_robin", "seed_fix", "not SGLang 0.5.23's interleave split of the raw 7 tokens"),
    ],
    3: [
        ((1001, 300), "round_robin", SGLANG, "ok"),  # (434, 434, 433), P = 435
        ((5,), "round_robin", SGLANG, "ok"),  # (2, 2, 1), P = 3
        ((9,), "round_robin", SGLANG, "ok"),  # even, P*cp == T
        ((6,), "round_robin", SGLANG, "ok"),  # even, n = 2 < P = 3
        ((1001, 300), "zigzag", SGLANG, DEEPEP),
    ],
}


@pytest.mark.parametrize("cp", sorted(SWEEP))
def test_every_point_of_a_sweep_is_ok_or_skipped_with_the_engines_reason(rank_pool, cp):
    # skipped, or ok, correct and timed: checked in ok_points_of_sweep
    for r, plan, where in plugin_tasks.ok_points_of_sweep(rank_pool, tasks, cp, SWEEP[cp], _spec):
        p, pas = protocol.shard_len(plan), impls.get("pad_at_split")
        # the engine's [P, H] shards, moved as the project's pad_at_split moves them
        assert r.rows_moved == p * cp == pas.buffer_rows(plan), where
        assert r.attn_pad_rows == p - min(plan.per_rank_tokens) == pas.stride(plan) - min(plan.per_rank_tokens)
        # legacy's bits checked exactly where no rank is padded
        assert r.even_bitwise_equal is (True if p * cp == plan.total_tokens else None), where


BROKEN = [
    ("strips_padding", (7,), "scatter_chunk"),
    ("wrong_p", (7,), "physical_len"),  # (3, 2, 2): P = 3, zigzag's alignment gives 6
    ("garbage_padding", (7,), "padding_zero"),
    ("dirty_input_padding", (7,), "input_mutated"),
    ("garbage_later", (7,), "production_form"),
    ("garbage_in_round_trip", (7,), "padding_zero"),  # tiny: within the reference MoE's tolerance
    ("bits_always", (6,), "even_bitwise"),  # even (2, 2, 2), P = 3: not legacy's buffer
    ("global_rank", (6,), "group"),  # the world reversed in the CP group: ranks 0 and 2 read each other's padded shard
]


def test_broken_copies_of_the_plugin_fail(rank_pool):
    runs = [(_spec(lens, 3, iters=3), variant) for variant, lens, _ in BROKEN]
    runs.append((_spec((1001, 300), 3, policy="zigzag"), "no_refusal"))
    rows = plugin_tasks.rows(rank_pool, tasks, 3, runs)
    for (variant, lens, check), res in zip(BROKEN, rows):
        r = res[REF]
        assert (r.status, r.failed_check) == ("failed", check), (variant, r.status, r.failed_check, r.reason)
        assert not r.stats  # a failed implementation is never timed
    assert "the scatter's [3, H] shard has nonzero padding row 2" in rows[2][REF].reason
    later, global_rank = rows[4][REF].reason, rows[7][REF].reason
    assert "iterations of the timed loop" in later and "padding rows of the [3, H] shard" in later
    assert "the scatter returned the rows of rank " in global_rank
    assert "as if ranked by this process's global rank" in global_rank
    # without its refusal the plug-in would run zigzag, which the engine sends through DeepEP: the skip is its
    assert rows[-1][REF].status == "ok", rows[-1][REF].reason


@pytest.mark.parametrize("lens,cp", [((7,), 2), ((7,), 3), ((9,), 3), ((1001, 300), 3), ((5,), 4)])
def test_the_harness_hands_the_engines_padded_shard(lens, cp):
    # what gather gets is what the engine's pad_local_rows makes of the rank's rows
    plan = plan_split(lens, cp, policy="round_robin", pad_batch=False, engine=SGLANG)
    impl = impls.get(REF)
    for rank, n in enumerate(plan.per_rank_tokens):
        rows = torch.randn(n, 8)
        got = shard_input(impl, plan, rows)
        assert torch.equal(got, tasks.shard_rows(rows, plan))
        assert got.shape[0] == impl.shard_rows(plan, rank) == impl.stride(plan)
        assert got.data_ptr() != rows.data_ptr()  # a copy: the caller's rows stay the caller's
    assert torch.equal(shard_input(impls.get("pad_at_split"), plan, rows), rows)  # [n_r, H] as before


def test_shard_is_validated():
    with pytest.raises(ValueError, match="shard='padded' needs layout='rank_major_padded'"):
        impls.RoundTripImpl("x", lambda *a: None, lambda *a: None, layout="rank_major_packed", shard="padded")
    with pytest.raises(ValueError, match="shard='rowz' is not one of rows, padded"):
        impls.RoundTripImpl("x", lambda *a: None, lambda *a: None, shard="rowz")
    assert impls.RoundTripImpl("x", lambda *a: None, lambda *a: None, shard="padded").pads_split
