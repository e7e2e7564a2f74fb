"""The experts' block-fp8 activations (``moe_quant``) and vLLM 0.34's quantized gather.

vLLM 0.34 on a monolithic block-fp8 kernel quantizes each rank's rows before the PCP all-gather
and gathers the fp8 rows, their float32 scales and the router logits, in that order
(``fused_moe/runner/moe_runner.py:863-876``, vllm==0.34.0); the experts compute on the
dequantized rows that came back. A copy that gathers one of those in another layout than the
rows fails ``side_tensors`` naming that tensor; with the check off the reference MoE still
catches it (the experts computed on other rows' values, or with other rows' scales).

The quantization itself is held to vLLM's formula (``per_token_group_quant_fp8``: one scale per
128 columns of a row, ``max(amax, 1e-10) / 448``), written out here, not read from the code.
"""

from __future__ import annotations

import pytest
import torch

from broken_impls import ref as B
from nsa_cp_comm import quant
from nsa_cp_comm.harness.spec import PointSpec
from nsa_cp_comm.moe import ReferenceMoE
from rank_tasks import folded, point_without_check

UNEVEN = dict(seq_lens=(7,), cp_size=2, policy="dual_chunk_swap")  # (3, 4)
EVEN = dict(seq_lens=(8,), cp_size=2, policy="dual_chunk_swap")  # (4, 4)
MONOLITHIC = "fp8_block_monolithic"


def run(rank_pool, where, impls, engine="vllm_0_34", moe_quant=MONOLITHIC, check="", model="deepseek_v32"):
    spec = PointSpec(**where, impls=impls, hidden_size=256, dtype="bfloat16", warmup=0, iters=1, engine=engine,
                     engine_model=model, moe_quant=moe_quant)
    return folded(spec, rank_pool(spec.cp_size).run(point_without_check, spec, "gloo", check, timeout_s=120))


def test_each_quantized_tensor_gathered_in_another_layout_is_named(rank_pool):
    got = run(rank_pool, UNEVEN, ("padded", "legacy", B("side_packed"), B("scales_packed"), B("side_not_gathered")))
    assert got["padded"].status == "ok", got["padded"].reason
    assert got["legacy"].status == "refused", got["legacy"].reason
    for name, needle in ((B("side_packed"), "hidden_states_fp8 of rank 1 are not at row 4"),
                         (B("scales_packed"), "hidden_states_scale of rank 1 are not at row 4"),
                         (B("side_not_gathered"), "hidden_states_fp8 gathered beside the rows")):
        row = got[name]
        assert (row.status, row.failed_check) == ("failed", "side_tensors"), (name, row.reason)
        assert needle in row.reason, (name, row.reason)
    assert "router_logits" not in got[B("scales_packed")].reason  # the logits it gathered as the rows


def test_with_the_check_off_the_experts_compute_with_the_misplaced_scales(rank_pool):
    got = run(rank_pool, UNEVEN, (B("scales_packed"),), check="side_tensors")[B("scales_packed")]
    assert (got.status, got.failed_check) == ("failed", "reference_moe"), got.reason


def test_an_even_plan_is_legacy_bit_for_bit_with_quantized_experts(rank_pool):
    got = run(rank_pool, EVEN, ("padded", "legacy", B("scales_packed")))
    assert got["padded"].status == "ok" and got["padded"].even_bitwise_equal, got["padded"].reason
    assert got[B("scales_packed")].status == "ok", got[B("scales_packed")].reason  # packed = padded when even


@pytest.mark.parametrize("engine,moe_quant", [("vllm_0_33", MONOLITHIC), ("vllm_0_34", "fp8_block")])
def test_where_the_rows_are_gathered_as_they_are_no_scales_are_asked(rank_pool, engine, moe_quant):
    got = run(rank_pool, UNEVEN, (B("scales_packed"),), engine=engine, moe_quant=moe_quant)
    # only the logits (bfloat16 for DeepSeek-V3.2) are gathered beside the rows: nothing float32 to pack
    assert got[B("scales_packed")].status == "ok", got[B("scales_packed")].reason


def test_the_monolithic_kernel_routes_deepseek_v4s_padding(rank_pool):
    """DeepSeek-V4's router masks the padding rows on a modular kernel; a monolithic one is given
    the logits and routes every row (``moe_runner.py:632-640``): the padding is processed."""
    modular = run(rank_pool, UNEVEN, (B("marks_padding"),), moe_quant="fp8_block", model="deepseek_v4")
    mono = run(rank_pool, UNEVEN, (B("marks_padding"),), model="deepseek_v4")
    assert modular[B("marks_padding")].status == mono[B("marks_padding")].status == "ok"
    assert modular[B("marks_padding")].moe_pad_masked_rows == 1
    assert mono[B("marks_padding")].moe_pad_masked_rows == 0


# --- the quantization, held to vLLM's formula -----------------------------------------------------

def test_a_row_quantizes_in_groups_of_128_columns_with_one_scale_each():
    x = torch.zeros(2, 256)
    x[0, :128] = torch.linspace(-896.0, 896.0, 128)  # amax 896: scale 2, the ends at +-448
    x[0, 128:] = 0.5  # amax 0.5: scale 0.5/448, every value 448
    q, scales = quant.quantize(x)  # row 1 all zeros: scale 1e-10/448, every value 0
    assert q.dtype == torch.uint8 and q.shape == (2, 256) and scales.dtype == torch.float32
    assert scales.shape == (2, 2)
    assert scales[0].tolist() == pytest.approx([2.0, 0.5 / 448])
    assert scales[1].tolist() == pytest.approx([1e-10 / 448] * 2)
    vals = q.view(torch.float8_e4m3fn).to(torch.float32)
    assert vals[0, 0] == -448 and vals[0, 127] == 448 and (vals[0, 128:] == 448).all() and (vals[1] == 0).all()
    assert torch.equal(quant.dequantize(q, scales, torch.float32)[1], torch.zeros(256))


def test_a_row_quantizes_the_same_alone_or_among_others():
    x = torch.randn(9, 384, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    q, s = quant.quantize(x)
    for i in range(9):
        qi, si = quant.quantize(x[i : i + 1])
        assert torch.equal(qi, q[i : i + 1]) and torch.equal(si, s[i : i + 1])


def test_a_rank_without_rows_has_scales_that_compare():
    """A rank a short prefill leaves without rows quantizes to ``[0, H/128]`` scales, whose one
    column need not have a last stride of 1: comparing them byte for byte still works."""
    from nsa_cp_comm.harness.spec import bitwise_equal

    q, scales = quant.quantize(torch.zeros(0, 128))
    assert q.shape == (0, 128) and scales.shape == (0, 1)
    assert bitwise_equal(scales, torch.zeros(0, 1)) and bitwise_equal(q, q.clone())


def test_quantized_experts_compute_on_the_dequantized_rows_routed_by_the_rows_own_logits():
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(5))
    plain = ReferenceMoE(256, num_experts=4, seed=2)
    fp8 = ReferenceMoE(256, num_experts=4, seed=2, moe_quant="fp8_block")
    assert not torch.equal(fp8.reference(x), plain.reference(x))  # the quantization changes the output
    # the same experts on the dequantized rows, routed as the rows themselves route
    idx, weight = plain.route(x)
    want = torch.zeros_like(x)
    rows = quant.round_trip(x)
    for e in range(4):
        r, slot = (idx == e).nonzero(as_tuple=True)
        y = torch.nn.functional.silu(rows[r] @ plain.w1[e]) @ plain.w2[e]
        want.index_add_(0, r, y * weight[r, slot, None])
    assert torch.allclose(fp8.reference(x), want, atol=1e-6)
    with pytest.raises(ValueError, match="moe_quant='int4'"):
        ReferenceMoE(256, moe_quant="int4")


def test_a_width_that_is_no_multiple_of_the_group_is_refused_in_one_line():
    with pytest.raises(ValueError, match="hidden_size=200 is not a multiple of 128"):
        PointSpec(**UNEVEN, hidden_size=200, engine="vllm_0_34", moe_quant="fp8_block")
