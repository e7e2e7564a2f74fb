"""vLLM 0.33's PCP gather and reduce-scatter as a plug-in on the engine's [P, H] shards.

examples/vllm_pcp_plugin wraps the engine's functions (written from
``pcp_manager.py`` and the fused-MoE runner): ``shard="padded"`` with
``P = max n_r``, the router's padding mask honoured. Over DualChunkSwap plans,
even, uneven and with ranks a short prefill leaves empty, every point is
``ok`` or ``skipped`` with vLLM's reason; copies broken the way serving code
broke at the boundary (vLLM #53573: a rank without rows skips the gather;
SGLang #35535: the replicated shared expert added before the reduce-scatter,
which sums it cp times) fail on every point the break changes. In-process, on the warm pools.
"""

from __future__ import annotations

import pytest

import plugin_tasks
from matrix_cli import sweep_here
import vllm_plugin_tasks as tasks
from matrix.scale import plan_classes
from nsa_cp_comm import protocol

plugin_tasks.on_path(tasks.PLUGIN)
REF = tasks.REF
VLLM = "vllm_0_33"
DCS = "dual_chunk_swap"


def _spec(lens, cp, policy=DCS, engine=VLLM, iters=2):
    return plugin_tasks.spec(REF, lens, cp, policy, engine, iters)


# (lens, cp, policy, engine) -> the plug-in's status, or what its skip reason says
SWEEP = {
    2: [
        ((1,), DCS, VLLM, "ok"),  # rows [1, 0]: rank 1 empty (vLLM #53573's batch)
        ((2,), DCS, VLLM, "ok"),  # even (1, 1): legacy's bits
        ((7,), DCS, VLLM, "ok"),  # (3, 4), P = 4
        ((1001, 300), DCS, VLLM, "ok"),
        ((1000,), "zigzag", VLLM, "vLLM 0.33 PCP has no zigzag split"),
        # the seed fix's engine pads the batch to 8 first: not vLLM's split of the raw 7
        ((7,), DCS, "seed_fix", "not vLLM 0.33's DualChunkSwap split of the raw 7 tokens"),
    ],
    3: [
        ((1,), DCS, VLLM, "ok"),  # (1, 0, 0)
        ((5,), DCS, VLLM, "ok"),  # chunks of 1: (2, 2, 1)
        ((6,), DCS, VLLM, "ok"),  # even (2, 2, 2)
        ((1001, 300), DCS, VLLM, "ok"),
        ((1001, 300), "round_robin", VLLM, "vLLM 0.33 PCP has no round_robin split"),
    ],
}


@pytest.mark.parametrize("cp", sorted(SWEEP))
def test_every_point_of_a_sweep_is_ok_or_skipped_with_vllms_reason(rank_pool, cp):
    # skipped, or ok, correct and timed: checked in ok_points_of_sweep
    for r, plan, where in plugin_tasks.ok_points_of_sweep(rank_pool, tasks, cp, SWEEP[cp], _spec):
        p = protocol.shard_len(plan)
        assert p == max(plan.per_rank_tokens) and r.rows_moved == p * cp, where  # P = max n_r
        assert r.even_bitwise_equal is (True if plan.is_even else None), where


# variant -> the check each point fails (None: the point does not change under the break)
BROKEN = {
    # (1,): the rank without rows is all padding (token 0's row, routed): the term summed there shows first
    "replicated_before_rs": {(1,): "padding_zero", (7,): "reference_moe", (2,): "reference_moe"},
    "sglang_alignment": {(1,): "physical_len", (7,): None, (2,): "physical_len"},  # (3, 4) at cp 2: P = 4 is a multiple of 2
    "strips_padding": {(1,): "scatter_chunk", (7,): "scatter_chunk", (2,): None},
    "unmasked_garbage": {(1,): "padding_zero", (7,): "padding_zero", (2,): None},
    # vLLM's padding rows are token 0's, and DeepSeek-V3.2's experts process them: a mask there shows
    "masks_padding": {(1,): "padding_zero", (7,): "padding_zero", (2,): None},
    # (1,) puts its one row on a rank without padding; (7,) is (3, 4): rank 0's token-0 padding row summed
    # into its last real row (with zero padding it would add nothing)
    "pads_into_a_real_row": {(1,): None, (7,): "scatter_chunk", (2,): None},
}


@pytest.mark.parametrize("variant", sorted(BROKEN))
def test_broken_copies_of_the_plugin_fail_where_the_break_shows(rank_pool, variant):
    cases = BROKEN[variant]
    rows = plugin_tasks.rows(rank_pool, tasks, 2, [(_spec(lens, 2, iters=3), variant) for lens in cases])
    for (lens, check), res in zip(cases.items(), rows):
        r = res[REF]
        if check is None:
            assert r.status == "ok", (variant, lens, r.status, r.failed_check, r.reason)
        else:
            assert (r.status, r.failed_check) == ("failed", check), (variant, lens, r.status, r.failed_check, r.reason)
            assert not r.stats  # a failed implementation is never timed
            if variant == "replicated_before_rs":
                assert "a replicated term counted cp times" in r.reason, r.reason


def test_a_rank_that_skips_the_gather_on_no_rows_is_named(tmp_path, monkeypatch, capsys):
    """vLLM #53573: the rank a 1-token prefill leaves empty skips the gather its
    peer entered; the row names the rank and what it skipped, and the point
    where no rank is empty is ok (a sweep, as a plug-in author runs it)."""
    run = sweep_here(tmp_path / "res", "impl=tests.vllm_plugin_tasks:skip_on_empty,padded", "engine=vllm_0_33",
                     "+layout=dual_chunk_swap", "cp_size=2", "seq_lens=[1],[7]", "hidden_size=32", "iters=1",
                     "warmup=0", "timeout_s=120", monkeypatch=monkeypatch, capsys=capsys)
    assert run.returncode == 1, run.stderr[-2000:]
    rows = {(r["impl"], r["seq_lens"]): r for r in run.rows()}
    bad = rows[("vllm_pcp", "[1]")]  # the name it declares
    assert (bad["status"], bad["failed_check"]) == ("error", "collective_skipped"), bad["reason"]
    assert "rank 1 skipped _ALLGATHER_BASE (already in _REDUCE_SCATTER_BASE)" in bad["reason"], bad["reason"]
    assert rows[("vllm_pcp", "[7]")]["status"] == "ok"
    assert {rows[("padded", lens)]["status"] for lens in ("[1]", "[7]")} == {"ok"}


def test_the_conformance_preset_with_vllms_engine_runs_vllms_plans(tmp_path, monkeypatch, capsys):
    """The plug-in author's first command with vLLM's engine, at cp 2, over the
    classes this module's sweep does not hold (the others: test above): each
    is a DualChunkSwap plan of the raw lengths (the page-aligned one, which
    vLLM has no split for, skipped with vLLM's reason), the plug-in pads to the
    graph bucket (255 rows to 256) and every row of it is ok."""
    classes = ("empty_rank", "paged_uneven", "bucket_edge")
    run = sweep_here(tmp_path / "res", "+matrix=conformance", f"impl={REF},padded", "engine=vllm_0_33",
                     "+conformance_cp=cp2", "bystanders=0", f"+plan_class={','.join(classes)}",
                     monkeypatch=monkeypatch, capsys=capsys)
    rows = run.rows()
    mine = {r["plan_class"]: r for r in rows if r["impl"] == "vllm_pcp"}
    assert {c for label in mine for c in label.split("+")} >= set(classes), sorted(mine)
    for label, r in mine.items():
        if "paged_uneven" in label:
            assert r["status"] == "skipped" and "has no zigzag_page split" in r["reason"], r["reason"]
            continue
        assert (r["policy"], r["status"]) == (DCS, "ok"), (label, r["status"], r["reason"])
    (edge,) = [r for label, r in mine.items() if "bucket_edge" in label]
    assert (edge["max_rank_len"], edge["graph_pad_rows"]) == ("255", "2"), edge  # one row on each of 2 ranks
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])


def _quantized(lens, cp=2):
    """A point of vLLM 0.34 on a monolithic block-fp8 kernel: the runner quantizes each rank's rows
    before the gather and hands the plug-in's ``gather_side`` the fp8 rows, their scales and the logits."""
    from nsa_cp_comm.harness.spec import PointSpec

    return PointSpec(tuple(lens), cp, policy=DCS, impls=(REF,), hidden_size=128, dtype="bfloat16", warmup=1,
                     iters=2, engine="vllm_0_34", moe_quant="fp8_block_monolithic")


@pytest.mark.parametrize("cp", [2, 3])
def test_on_vllms_quantized_gather_the_plugin_gathers_rows_scales_and_logits_as_its_rows(rank_pool, cp):
    """docs/plugins.md's quantized sweep: every point ok; at cp 2, a copy that packs what it gathers
    beside its padded rows fails naming the fp8 rows (the first the runner hands it)."""
    lens = ((1,), (7,), (1001, 300))
    runs = [(_quantized(x, cp), "as_is") for x in lens] + ([(_quantized((7,)), "packs_side_tensors")] if cp == 2
                                                             else [])
    found = plugin_tasks.rows(rank_pool, tasks, cp, runs)
    for x, res in zip(lens, found):
        r = res[REF]
        assert (r.status, r.correct) == ("ok", True), (x, r.status, r.failed_check, r.reason)
    if cp == 2:
        bad = found[-1][REF]
        assert (bad.status, bad.failed_check) == ("failed", "side_tensors"), (bad.status, bad.reason)
        assert "hidden_states_fp8 of rank 1 are not at row 4" in bad.reason, bad.reason
