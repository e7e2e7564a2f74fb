"""Padding rows hold what the engine puts there, and go through the experts as the engine's router
for its model sends them.

vLLM's padding rows are token id 0's (the same non-zero row in every slot, ``pcp_manager.py:623-629``);
SGLang's are zeros. DeepSeek-V3.2's experts process them on vLLM, DeepSeek-V4's router masks them.
So a plug-in that masks where the model routes, or sums a padding row into a real row, fails (zero
padding would hide both); the same masking is right for DeepSeek-V4; and the rows count the padding
the router masked and the most of it one expert got, from the routing the checks ran.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import plugin_tasks
import vllm_plugin_tasks as tasks
from nsa_cp_comm import impls, protocol
from nsa_cp_comm.harness import checks
from nsa_cp_comm.harness.measure import point_on_rank
from nsa_cp_comm.harness.spec import PointSpec, padding_content
from rank_tasks import folded

plugin_tasks.on_path(tasks.PLUGIN)
DCS = "dual_chunk_swap"


def _spec(lens, cp, model="deepseek_v32", impls_=(tasks.REF,), engine="vllm_0_33", capture=0):
    return PointSpec(tuple(lens), cp, policy=DCS, impls=impls_, hidden_size=32, dtype="bfloat16", warmup=1, iters=2,
                     engine=engine, engine_model=model, max_capture_size=capture)


def test_the_engines_padding_rows_are_its_own():
    vllm, sglang = _spec([7], 2), dataclasses.replace(_spec([7], 2), engine="sglang_0_5_23", policy="round_robin")
    rows = padding_content(vllm, vllm.plan(), 3, torch.device("cpu"))
    assert bool(rows.ne(0).any()) and torch.equal(rows[0], rows[2])  # one non-zero row, in every slot
    assert not padding_content(sglang, sglang.plan(), 3, torch.device("cpu")).ne(0).any()
    # the padded shard a plug-in is handed: its rows, then the engine's padding
    impl = dataclasses.replace(impls.get("padded"), shard="padded")
    rank_rows = torch.ones(3, 32, dtype=torch.bfloat16)
    shard = checks.shard_input(impl, vllm.plan(), rank_rows, vllm)
    assert shard.shape == (4, 32) and torch.equal(shard[3], rows[0])
    assert not checks.shard_input(impl, vllm.plan(), rank_rows)[3].ne(0).any()  # without the point: zeros


def test_the_gathered_padding_is_checked_against_what_the_shard_held():
    plan = _spec([7], 2).plan()  # (3, 4): P = 4, rank 0 one padding row at row 3
    impl = dataclasses.replace(impls.get("padded"), shard="padded", pads_split=True,
                               row_stride=lambda p: protocol.shard_len(p))
    full = torch.zeros(8, 4)
    content = torch.full((4, 4), 2.0)
    assert list(checks.layout_faults(impl, plan, full, lambda r, rows: True)) == []  # zeros, zeros expected
    assert list(checks.layout_faults(impl, plan, full, lambda r, rows: True, content)) == [("padding_zero", 0, 3)]
    full[3] = 2.0
    assert list(checks.layout_faults(impl, plan, full, lambda r, rows: True, content)) == []
    assert list(checks.layout_faults(impl, plan, full, lambda r, rows: True)) == [("padding_zero", 0, 3)]


@pytest.mark.parametrize("variant,model,check", [
    ("as_is", "deepseek_v32", None),
    ("masks_padding", "deepseek_v32", "padding_zero"),  # masked where the model routes them
    ("masks_padding", "deepseek_v4", None),  # DeepSeek-V4's router masks them: the same mask is right
    ("pads_into_a_real_row", "deepseek_v4", "scatter_chunk"),
], ids=["as_it_is", "mask_v32", "mask_v4", "sum_v4"])
def test_the_models_router_decides_what_a_plugins_padding_rows_must_hold(rank_pool, variant, model, check):
    spec = _spec([7], 2, model)
    res = plugin_tasks.rows(rank_pool, tasks, 2, [(spec, variant)])[0][tasks.REF]
    if check is None:
        assert res.status == "ok", (variant, model, res.reason)
    else:
        assert (res.status, res.failed_check) == ("failed", check), (variant, model, res.reason)
        assert "padding rows" in res.reason or "rows" in res.reason


def test_rows_count_the_padding_the_router_masked_and_the_most_one_expert_got(rank_pool):
    """[1030] at pcp 2 is (514, 516): two padding rows in the gathered buffer (eager: past the 512 bucket).
    DeepSeek-V3.2's router routes both to the same experts (identical rows); DeepSeek-V4's masks both."""
    got = {}
    for model in ("deepseek_v32", "deepseek_v4"):
        spec = _spec([1030], 2, model, impls_=("padded", "pad_at_split"))
        got[model] = folded(spec, rank_pool(2).run(point_on_rank, spec, "gloo", timeout_s=120))
    for impl in ("padded", "pad_at_split"):
        v32, v4 = got["deepseek_v32"][impl], got["deepseek_v4"][impl]
        assert v32.status == v4.status == "ok", (v32.reason, v4.reason)
        assert (v32.moe_pad_rows, v32.moe_pad_masked_rows, v32.moe_pad_expert_max_rows) == (2, 0, 2)
        assert (v4.moe_pad_rows, v4.moe_pad_masked_rows, v4.moe_pad_expert_max_rows) == (2, 2, 0)


def test_a_plugin_that_pads_to_max_n_r_where_vllm_runs_a_graph_bucket_is_named(rank_pool):
    """[9] at pcp 2 is (3, 6): the step runs in the 8-row capture bucket, so P = 8, not 6; [7] is (3, 4),
    whose bucket is 4 itself: the same copy is right there."""
    runs = [(_spec([9], 2, capture=512), "ignores_graphs"), (_spec([7], 2, capture=512), "ignores_graphs"),
            (_spec([9], 2, capture=512), "as_is")]
    rows = plugin_tasks.rows(rank_pool, tasks, 2, runs)
    wrong, fits, right = (r[tasks.REF] for r in rows)
    assert (wrong.status, wrong.failed_check) == ("failed", "physical_len"), wrong.reason
    assert "the CUDA-graph capture size that holds max n_r = 6 (max_capture_size=512) = 8" in wrong.reason
    assert fits.status == "ok" and right.status == "ok", (fits.reason, right.reason)
    assert right.graph_pad_rows == (8 - 6) * 2
