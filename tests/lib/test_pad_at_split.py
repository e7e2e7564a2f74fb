"""pad_at_split, the serving engine's pad-at-the-split design, through every check.

Healthy, it passes every check the matrix runs on the plans that break other
implementations (uneven page-aligned splits, empty ranks, three ranks); each
deliberate break flips the verdict to the check that catches it. Through the
CLI, ``impl=designs`` gives both designs' rows for one point, with the bytes
and padding rows the vectorised plans (matrix.scale.plans) compute for that batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import pad_at_split_tasks
from matrix.app.config import MatrixConfig, validate
from matrix.app.point import build_rows
from matrix.app.resolve import resolve
from matrix.report import cli as report_cli
from matrix.review import designs, report
from matrix.review._review import m_stride
from matrix.scale import plans
from matrix.scale.workload import Batches
from matrix_cli import run_matrix
from nsa_cp_comm import impls
from nsa_cp_comm.harness.fold import ImplResult
from nsa_cp_comm.pad_at_split import padding_rows, physical_len
from nsa_cp_comm.harness.spec import PointSpec
from rank_tasks import folded

UNEVEN = dict(seq_lens=(1000,), cp_size=2, policy="zigzag_page", page_size=64)  # n = (488, 512), P = 512
EVEN = dict(seq_lens=(1000,), cp_size=2, policy="zigzag")  # n = (500, 500), P = 500
EMPTY = dict(seq_lens=(5,), cp_size=4, policy="zigzag_page", page_size=64)  # ranks without rows
THREE = dict(seq_lens=(1001, 300), cp_size=3, policy="zigzag")  # even n = 434, P = 438 > m
ROUND = dict(seq_lens=(10,), cp_size=4, policy="round_robin")  # n = 3, P = 4
# SGLang 0.5.23 splits the raw lengths: n = (433, 434, 434), P = ceil_align(434, 6) = 438
SGLANG_THREE = dict(seq_lens=(1001, 300), cp_size=3, policy="zigzag", engine="sglang_0_5_23")
# interleave on the raw 10 tokens: n = (3, 3, 2, 2), P = 4, the engine's padding on an uneven split
SGLANG_ROUND = dict(seq_lens=(10,), cp_size=4, policy="round_robin", engine="sglang_0_5_23")


def run(rank_pool, mutation, where, topk=2):
    spec = PointSpec(**where, impls=("padded", "pad_at_split"), hidden_size=32, dtype="bfloat16", warmup=0,
                     iters=1, topk=topk)
    results = rank_pool(spec.cp_size).run(pad_at_split_tasks.point_with_mutation, spec, "gloo", mutation,
                                          timeout_s=120)
    return folded(spec, results), spec


@pytest.mark.parametrize("where", [UNEVEN, EVEN, EMPTY, THREE, ROUND, SGLANG_THREE, SGLANG_ROUND],
                         ids=["uneven", "even", "empty", "three", "rr", "sglang-zigzag", "sglang-interleave"])
def test_pad_at_split_passes_every_check(rank_pool, where):
    res, spec = run(rank_pool, "none", where)
    r = res["pad_at_split"]
    assert r.status == "ok" and r.correct and r.failed_check == "", r.reason
    plan = spec.plan()
    p = physical_len(plan)
    assert r.rows_moved == p * plan.cp_size == impls.get("pad_at_split").buffer_rows(plan)
    assert r.bytes_padded == p * plan.cp_size * 32 * 2
    pad = padding_rows(plan)
    assert (r.attn_pad_rows, r.moe_pad_rows) == (pad["pad_at_split_attn"], pad["pad_at_split_moe"])
    assert (res["padded"].attn_pad_rows, res["padded"].moe_pad_rows) == (0, pad["padded_moe"])
    assert r.stats["roundtrip"]["p50"] > 0 and "local" not in r.stats  # padded at the split: no per-layer local work
    # legacy's bits, checked, exactly where no rank is padded (P*cp == T)
    assert r.even_bitwise_equal is (True if plan.is_even and p * plan.cp_size == plan.total_tokens else None)


@pytest.mark.parametrize("mutation,where,check", [
    ("dirty_padding", UNEVEN, "padding_zero"), ("dirty_padding", THREE, "padding_zero"),
    ("stride_m", THREE, "gather_rows"),  # m = 434 < P = 438
    # P > every n_r: the padding kept is not the rows of another rank either
    ("keeps_padding", THREE, "scatter_chunk"),
    ("mutates_input", EVEN, "input_mutated"),
    # P = ceil_align(434, 3) = 435 where the rule gives 438, consistently everywhere: only the engine's rule sees it
    ("wrong_p_everywhere", THREE, "physical_len"), ("wrong_p_everywhere", SGLANG_THREE, "physical_len"),
    ("bits_always", THREE, "even_bitwise"),  # even, but P = 438 > 434: not legacy's buffer
])
def test_broken_pad_at_split_fails_its_check(rank_pool, mutation, where, check):
    res, _ = run(rank_pool, mutation, where)
    r = res["pad_at_split"]
    assert r.status == "failed" and r.correct is False and r.failed_check == check, r.reason
    assert not r.stats  # a failed implementation is never timed
    assert res["padded"].status == "ok", res["padded"].reason  # the other design is unaffected


@pytest.mark.parametrize("where,status", [(UNEVEN, "skipped"), (EVEN, "ok")], ids=["uneven", "even"])
def test_a_plan_the_implementation_does_not_support_is_skipped(rank_pool, where, status):
    res, _ = run(rank_pool, "supports_even_only", where)
    r = res["pad_at_split"]
    assert r.status == status, r.reason
    if status == "skipped":
        assert r.reason == "impl=pad_at_split: uneven plan [488, 512]: not this engine's" and not r.stats
    assert res["padded"].status == "ok"


def test_designs_rows_match_the_vectorised_plans_and_report(tmp_path):
    """The rows a real run writes for both designs equal matrix.scale.plans' statistics for that batch, under
    each engine; a split the engine does not have is a skipped point naming the engine."""
    lens = [1001, 300, 77]
    run_ = run_matrix(tmp_path / "r", "impl=designs", "cp_size=3", "engine=seed_fix,sglang_0_5_23",
                      "+layout=shared_page16,zigzag", f"seq_lens=[{','.join(map(str, lens))}]", "hidden_size=32",
                      "dtype=float32", "iters=1", "warmup=0")
    assert run_.returncode == 0, run_.stderr[-2000:]
    rows = {(r["engine"], r["policy"], r["impl"]): r for r in run_.rows()}
    assert len(rows) == 8
    for engine, policy in (("seed_fix", "zigzag_page"), ("seed_fix", "zigzag"), ("sglang_0_5_23", "zigzag")):
        st = plans.plan_stats(Batches(np.array(lens), np.array([3])), 3, policy, 16 if policy == "zigzag_page" else 1,
                              engine=engine)
        for impl in ("padded", "pad_at_split"):
            row = rows[(engine, policy, impl)]
            assert row["status"] == "ok", row["reason"]
            assert int(row["bytes_padded"]) == st["rows"][impl][0] * 32 * 4
            assert int(row["moe_pad_rows"]) == st["moe_pad"][impl][0]
            assert int(row["attn_pad_rows"]) == st["attn_pad"][impl][0]
            assert int(row["attn_pad_masked_rows"]) == st["costs"][impl]["attn_pad_masked"][0]
            assert int(row["total_tokens"]) == st["total"][0]
    assert rows[("sglang_0_5_23", "zigzag", "pad_at_split")]["attn_pad_masked_rows"] != "0"  # the engine zeroes them
    skipped = rows[("sglang_0_5_23", "zigzag_page", "pad_at_split")]
    assert skipped["status"] == "skipped" and "SGLang 0.5.23 has no zigzag_page split" in skipped["reason"]
    # the report answers "which is cheaper, where", and shows the nccl-tests model when given one
    data = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
    assert report_cli.main([str(tmp_path / "r"), "--out", str(tmp_path / "rep"),
                        "--nccl-tests", str(data / "nccl_tests_sample_all_gather.json"),
                        "--nccl-tests", str(data / "nccl_tests_sample_reduce_scatter.json")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Designs: padded vs pad_at_split" in md
    assert "**Which is cheaper, where:** over 3 point(s) (seed_fix, sglang_0_5_23)" in md
    assert "## Collectives predicted from nccl-tests (a model)" in md and "a model, not a measurement" in md
    assert report_cli.main([str(tmp_path / "r"), "--out", str(tmp_path / "rep2")]) == 0
    assert "nccl-tests" not in (tmp_path / "rep2" / "report.md").read_text()


def test_plan_level_padding_columns_follow_the_implementations_row_stride():
    """``padded_total``, ``padding_frac`` and ``claim_holds`` are the buffer each
    implementation moves: ``m * cp`` for the padded communicator, ``P * cp`` for
    pad_at_split (and a padded shard), not the plan's ``max_rank_len`` for all."""
    cfg = {**vars(MatrixConfig()), "device": "cpu", "backend": "gloo", "impl": "designs", "results_dir": "r",
           "cp_size": 3, "seq_lens": [1001, 300]}  # THREE: the batch padded to 1302, n = 434 = m, P = 438
    validate(cfg)
    res = resolve(cfg, gpus=0)
    rows = {r["impl"]: r for r in build_rows(cfg, res, [ImplResult("padded", "ok"), ImplResult("pad_at_split", "ok")],
                                            "", 0.0)}
    assert (rows["padded"]["padded_total"], rows["padded"]["padding_frac"], rows["padded"]["claim_holds"]) == (
        1302, 0.0, True)
    pas = rows["pad_at_split"]
    assert (pas["padded_total"], pas["claim_holds"]) == (438 * 3, False)
    assert pas["padding_frac"] == pytest.approx(1 - 1302 / 1314)
    assert rows["padded"]["max_rank_len"] == pas["max_rank_len"] == 434  # the plan's own
    # the report's plan sections (the claim, the padding table) read the padded communicator's m * cp buffer
    df = pd.DataFrame([pas, rows["padded"]])
    assert list(m_stride(df)["impl"]) == ["padded"]


def test_the_report_sets_each_engines_plugins_beside_its_rules():
    """An engine's implementations are listed under that engine with its rules for the
    row's model (vLLM's experts process DeepSeek-V3.2's padding, DeepSeek-V4's router masks
    it; rows without the column are DeepSeek-V3.2's); a run of the default engine alone has
    no such section."""
    rows = pd.DataFrame([
        {"impl": "vllm_pcp", "engine": "vllm_0_33", "engine_model": "deepseek_v4", "policy": "dual_chunk_swap",
         "page_size": 1, "cp_size": 2, "status": "ok", "graph_pad_rows": 0},
        {"impl": "vllm_pcp", "engine": "vllm_0_33", "policy": "dual_chunk_swap", "page_size": 1, "cp_size": 2,
         "status": "ok"},
        {"impl": "vllm_pcp", "engine": "vllm_0_33", "policy": "round_robin", "page_size": 1, "cp_size": 3,
         "status": "skipped"},
        {"impl": "padded", "engine": "seed_fix", "policy": "zigzag", "page_size": 1, "cp_size": 2, "status": "ok"},
    ])
    lines = designs.engines_section(rows, table=lambda f: f)
    frame = lines[-1]
    got = {(r.engine, r.model, r.impl): r for r in frame.itertuples()}
    vllm = got[("vllm_0_33", "deepseek_v32", "vllm_pcp")]
    assert (vllm.rows, vllm.splits, vllm.cp, vllm.MoE) == ("ok 1, skipped 1", "DualChunkSwap, round_robin", "2, 3",
                                                         "processed")
    assert got[("vllm_0_33", "deepseek_v4", "vllm_pcp")].MoE == "masked"
    assert got[("seed_fix", "deepseek_v32", "padded")].MoE == "processed"
    assert designs.engines_section(rows[rows["engine"].eq("seed_fix")]) == []
    # the rules read per model: the same rows all read as DeepSeek-V4's mask the padding
    frame = designs.engines_section(rows.assign(engine_model="deepseek_v4"), table=lambda f: f)[-1]
    assert set(frame[frame["engine"].eq("vllm_0_33")]["MoE"]) == {"masked"}
