"""The padding rows a router is told of: where the point's model's router masks the padding
rows its runner marks (vLLM's DeepSeek-V4: ``is_padding``, built rank-major as ``rows >= n_r``
per rank's block, ``v1/worker/gpu/pcp_manager.py:630-635`` in 0.33.0), an implementation that
builds the mark (``is_padding``) must mark exactly the gathered buffer's padding rows.

Left unmarked (SGLang #31838, vLLM #38128), every padding row is routed, the identical ones
all to the same experts: ``padding_routing`` fails, naming how many and the most one expert
got. A real row marked goes to no expert: named too. On an even plan there is nothing to mark;
where the model routes its padding (DeepSeek-V3.2) the mark is not read. With the check
turned off the unmarked padding gets past: its rows' outputs are the padding's, which the
scatter drops, so no other check sees the skewed expert.
"""

from __future__ import annotations

import pytest

from broken_impls import ref as B
from nsa_cp_comm.harness.spec import PointSpec
from rank_tasks import folded, point_without_check

UNEVEN = dict(seq_lens=(7,), cp_size=2, policy="dual_chunk_swap")  # (3, 4): one padding row, rank 0's
EVEN = dict(seq_lens=(8,), cp_size=2, policy="dual_chunk_swap")  # (4, 4)
MARKS = (B("marks_padding"), B("marks_no_padding"), B("marks_a_real_row"), B("marks_a_short_mask"))


def run(rank_pool, where, impls, model="deepseek_v4", check=""):
    spec = PointSpec(**where, impls=impls, hidden_size=32, dtype="bfloat16", warmup=0, iters=1, engine="vllm_0_33",
                     engine_model=model)
    return folded(spec, rank_pool(spec.cp_size).run(point_without_check, spec, "gloo", check, timeout_s=120))


def test_a_padding_mark_that_is_not_the_padding_rows_is_named(rank_pool):
    got = run(rank_pool, UNEVEN, ("padded", *MARKS))
    for name in ("padded", B("marks_padding")):
        assert got[name].status == "ok", got[name].reason
        assert got[name].moe_pad_masked_rows == 1 and got[name].moe_pad_expert_max_rows == 0, got[name]
    unmarked, real, short = got[B("marks_no_padding")], got[B("marks_a_real_row")], got[B("marks_a_short_mask")]
    for row in (unmarked, real, short):
        assert (row.status, row.failed_check) == ("failed", "padding_routing"), row.reason
    assert ("is_padding leaves 1 padding row(s) unmarked, first row 3 (rank 0's): the router routes them, 1 to "
            "expert") in unmarked.reason, unmarked.reason
    assert "is_padding marks 1 real row(s) as padding, first row 0 (rank 0's)" in real.reason, real.reason
    assert "is_padding(plan) returned a bool tensor of shape (4,), not one bool per row of the gathered buffer " \
           "(8 rows)" in short.reason, short.reason


@pytest.mark.parametrize("where, model", [(EVEN, "deepseek_v4"), (UNEVEN, "deepseek_v32")],
                         ids=["even_plan", "model_routes_padding"])
def test_no_padding_or_no_mask_read_is_nothing_to_mark(rank_pool, where, model):
    got = run(rank_pool, where, (B("marks_no_padding"),), model=model)[B("marks_no_padding")]
    assert got.status == "ok", got.reason


def test_with_the_check_off_unmarked_padding_is_routed_unseen(rank_pool):
    got = run(rank_pool, UNEVEN, (B("marks_no_padding"),), check="padding_routing")[B("marks_no_padding")]
    # what the experts were handed: the unmarked row routed, counted as such
    assert (got.status, got.moe_pad_masked_rows, got.moe_pad_expert_max_rows) == ("ok", 0, 1), got.reason
