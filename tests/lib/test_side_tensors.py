"""Side tensors: where the point's engine gathers the router logits beside the rows (vLLM,
``moe_runner.py:828-829``), the round trip gathers them too, in the rows' layout, and the MoE
routes from what came back.

A copy that gathers them packed while its rows are padded (vllm-ascend #16834) fails
``side_tensors`` on uneven plans, naming the tensor and the rank, and is ``ok`` on even ones
(where both layouts agree); one that never gathers them fails on every plan. With the check
turned off the packed copy is still caught, by the reference MoE: the experts routed its rows
by other rows' logits. At a point whose engine gathers no logits nothing is asked.
"""

from __future__ import annotations

import pytest

from broken_impls import ref as B
from nsa_cp_comm.harness.spec import PointSpec
from rank_tasks import folded, point_without_check

UNEVEN = dict(seq_lens=(7,), cp_size=2, policy="dual_chunk_swap")  # (3, 4)
EVEN = dict(seq_lens=(8,), cp_size=2, policy="dual_chunk_swap")  # (4, 4)


def run(rank_pool, where, impls, engine="vllm_0_33", model="deepseek_v32", check=""):
    spec = PointSpec(**where, impls=impls, hidden_size=32, dtype="bfloat16", warmup=0, iters=1, engine=engine,
                     engine_model=model)
    return folded(spec, rank_pool(spec.cp_size).run(point_without_check, spec, "gloo", check, timeout_s=120))


@pytest.mark.parametrize("model", ["deepseek_v32", "glm_moe_dsa"])  # bf16 logits, fp32 logits
def test_a_side_tensor_in_another_layout_or_not_gathered_is_named(rank_pool, model):
    got = run(rank_pool, UNEVEN, ("padded", B("side_packed"), B("side_not_gathered")), model=model)
    assert got["padded"].status == "ok", got["padded"].reason
    packed, missing = got[B("side_packed")], got[B("side_not_gathered")]
    assert (packed.status, packed.failed_check) == ("failed", "side_tensors"), packed.reason
    assert "router_logits of rank 1 are not at row 4" in packed.reason, packed.reason
    assert (missing.status, missing.failed_check) == ("failed", "side_tensors"), missing.reason
    assert "router_logits gathered beside the rows" in missing.reason, missing.reason
    even = run(rank_pool, EVEN, (B("side_packed"),), model=model)[B("side_packed")]
    assert even.status == "ok", even.reason  # packed and padded agree when no rank is short


def test_with_the_check_off_the_experts_route_by_the_misplaced_logits(rank_pool):
    got = run(rank_pool, UNEVEN, (B("side_packed"),), check="side_tensors")[B("side_packed")]
    assert (got.status, got.failed_check) == ("failed", "reference_moe"), got.reason


def test_an_engine_that_gathers_no_logits_asks_for_none(rank_pool):
    where = dict(seq_lens=(1000,), cp_size=2, policy="zigzag_page", page_size=64)  # uneven (488, 512)
    got = run(rank_pool, where, (B("side_not_gathered"),), engine="seed_fix")
    assert got[B("side_not_gathered")].status == "ok", got[B("side_not_gathered")].reason
