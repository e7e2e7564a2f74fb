"""The reference MoE, the timing/bandwidth semantics, and whole matrix points
through measure.run_point on real ranks."""

from __future__ import annotations

import math

import pytest
import torch

from nsa_cp_comm import ReferenceMoE
from nsa_cp_comm.harness import RankPool, timing
from nsa_cp_comm.harness.measure import PointSpec, run_point
from nsa_cp_comm.moe import max_rel_err, tolerance
from nsa_cp_comm.harness.timing import (
    Clock,
    algbw_GBps,
    busbw_GBps,
    fold_phases,
    max_over_ranks,
    roundtrip_bandwidth,
    summarize,
)
from rank_tasks import TORCH_UNEVEN_TEXT, by_impl

# -- ReferenceMoE -----------------------------------------------------------------


@pytest.mark.parametrize("cp", [1, 2, 4, 8])
def test_partials_over_ranks_sum_to_the_reference(cp):
    moe = ReferenceMoE(48, num_experts=8, topk=3, seed=1)
    x = torch.randn(40, 48, generator=torch.Generator().manual_seed(2))
    total = sum(moe.partial(x, r, cp) for r in range(cp))
    ref = moe.reference(x)
    assert ref.abs().max() > 0.1
    assert max_rel_err(total, ref) < 1e-6


def test_each_rank_owns_a_disjoint_share_of_experts():
    moe = ReferenceMoE(16, num_experts=8)
    owned = [list(moe.experts_of(r, 4)) for r in range(4)]
    assert owned == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(ValueError, match="num_experts=8"):
        moe.experts_of(0, 3)


def test_routing_is_per_row():
    moe = ReferenceMoE(32, num_experts=8, topk=2, seed=5)
    x = torch.randn(20, 32, generator=torch.Generator().manual_seed(6))
    idx, w = moe.route(x)
    assert idx.shape == (20, 2) and w.dtype == torch.float32
    assert torch.allclose(w.sum(-1), torch.ones(20))
    for i in (0, 7, 19):
        idx_i, w_i = moe.route(x[i : i + 1])
        assert torch.equal(idx_i[0], idx[i]) and torch.equal(w_i[0], w[i])


def test_weights_depend_on_seed_only():
    a, b, c = ReferenceMoE(16, seed=9), ReferenceMoE(16, seed=9, dtype=torch.bfloat16), ReferenceMoE(16, seed=10)
    assert torch.equal(a.w1.to(torch.bfloat16), b.w1) and torch.equal(a.router, b.router)
    assert not torch.equal(a.w1, c.w1)
    x = torch.randn(3, 16)
    assert torch.equal(a.reference(x), ReferenceMoE(16, seed=9).reference(x))


def test_partial_keeps_input_dtype():
    moe = ReferenceMoE(16, num_experts=4, dtype=torch.bfloat16)
    x = torch.randn(5, 16).to(torch.bfloat16)
    assert moe.partial(x, 0, 2).dtype == torch.bfloat16
    assert moe.reference(x).dtype == torch.float32


@pytest.mark.parametrize("topk,experts", [(0, 8), (9, 8), (-1, 4)])
def test_bad_topk(topk, experts):
    with pytest.raises(ValueError, match=f"topk={topk}"):
        ReferenceMoE(16, num_experts=experts, topk=topk)


def test_max_rel_err():
    ref = torch.tensor([[2.0, -4.0]])
    assert max_rel_err(ref, ref) == 0.0
    assert max_rel_err(torch.tensor([[2.0, -3.0]]), ref) == pytest.approx(0.25)
    assert max_rel_err(torch.tensor([[float("nan"), -4.0]]), ref) == math.inf
    assert max_rel_err(torch.zeros(0, 2), torch.zeros(0, 2)) == 0.0
    assert max_rel_err(torch.tensor([[0.5]]), torch.tensor([[0.0]])) == pytest.approx(0.5)


def test_tolerance():
    assert tolerance(torch.float32, 8) == 1e-5
    assert tolerance(torch.bfloat16, 1) == pytest.approx(2.0**-7)
    assert tolerance(torch.bfloat16, 8) > tolerance(torch.bfloat16, 2) > tolerance(torch.bfloat16, 1)
    with pytest.raises(ValueError, match="float16"):
        tolerance(torch.float16, 2)


# -- timing semantics ---------------------------------------------------------------


def test_summarize():
    s = summarize([4.0, 1.0, 3.0, 2.0])
    assert set(s) == {"p10", "p50", "p90", "p99", "mean", "iqr"}
    assert s["p50"] == 2.5 and s["mean"] == 2.5 and s["p10"] == pytest.approx(1.3)
    assert s["iqr"] == pytest.approx(3.25 - 1.75)  # p75 - p25, numpy's linear method
    assert math.isnan(summarize([])["mean"])


def test_slowest_rank_per_iteration():
    assert max_over_ranks([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]]) == [3.0, 5.0, 2.5]


def test_bandwidth_definitions():
    assert algbw_GBps(2e9, 1.0) == 2.0
    assert busbw_GBps(2e9, 1.0, 8) == pytest.approx(2.0 * 7 / 8)
    assert busbw_GBps(2e9, 1.0, 1) == 0.0
    assert math.isnan(algbw_GBps(1e9, 0.0))
    # a round trip moves the buffer twice (gather + reduce-scatter)
    alg, bus = roundtrip_bandwidth(10**9, 4e6, 4)
    assert alg == pytest.approx(0.5) and bus == pytest.approx(0.5 * 3 / 4)


def test_phases_fold_to_collective_and_roundtrip():
    ranks = [{"local": [1.0, 1.0], "gather": [10.0, 20.0], "scatter": [5.0, 5.0]},
             {"local": [3.0, 0.0], "gather": [12.0, 10.0], "scatter": [4.0, 9.0]}]
    folded = fold_phases(ranks)
    assert folded["local"] == [3.0, 1.0] and folded["gather"] == [12.0, 20.0] and folded["scatter"] == [5.0, 9.0]
    assert folded["collective"] == [17.0, 29.0] and folded["roundtrip"] == [20.0, 30.0]
    no_local = fold_phases([{"gather": [1.0], "scatter": [2.0]}])
    assert "local" not in no_local and no_local["roundtrip"] == no_local["collective"] == [3.0]


def test_cpu_clock_reads_perf_counter_in_microseconds(monkeypatch):
    ticks = iter([10.0, 10.25])
    monkeypatch.setattr(timing, "_clock", lambda: next(ticks))  # the harness's own, bound at import
    clock = Clock(torch.device("cpu"))
    a, b = clock.mark(), clock.mark()
    clock.sync()
    assert clock.elapsed_us(a, b) == 250_000.0 and clock.elapsed_us(b, a) == -250_000.0
    with pytest.raises(ValueError, match="explicit CUDA device index"):
        Clock("cuda")  # which device's stream to time on must be said, not taken from the thread


def test_a_task_that_replaces_time_perf_counter_does_not_change_the_harness_clock(monkeypatch):
    import time

    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)  # what a plug-in's rank could do
    clock = Clock(torch.device("cpu"))
    a = clock.mark()
    b = clock.mark()
    assert a > 0.0 and b >= a


# -- whole points on real ranks (measure.run_point) ---------------------------------


def small(**kw) -> PointSpec:
    base = dict(seq_lens=(1001, 300), cp_size=2, policy="zigzag", hidden_size=128, dtype="float32",
                warmup=1, iters=3)
    return PointSpec(**{**base, **kw})


def test_point_uneven_padded_correct_and_legacy_refuses(rank_pool):
    spec = small(dtype="bfloat16")
    assert not spec.plan().is_even
    res = by_impl(run_point(spec, rank_pool(2), timeout_s=120))
    pad, leg = res["padded"], res["legacy"]
    assert pad.status == "ok" and pad.correct is True, pad.reason
    assert pad.max_rel_err is not None and pad.max_rel_err <= tolerance(torch.bfloat16, 2)
    assert pad.even_bitwise_equal is None
    assert set(pad.stats) == {"local", "gather", "scatter", "collective", "roundtrip"}
    assert pad.stats["roundtrip"]["p50"] > 0 and pad.stats["local"]["p50"] > 0
    assert pad.rows_moved == spec.plan().padded_total == 1304
    assert leg.status == "refused" and leg.correct is True and leg.failed_check == ""
    assert leg.reason.startswith(f"gather: ValueError: {TORCH_UNEVEN_TEXT}") and "no collective" in leg.reason
    assert not leg.stats and leg.rows_moved is None


def test_point_even_padded_equals_legacy_bitwise(rank_pool):
    spec = small(seq_lens=(512, 512), policy="round_robin")
    assert spec.plan().is_even
    res = by_impl(run_point(spec, rank_pool(2), timeout_s=120))
    for name in ("padded", "legacy"):
        assert res[name].status == "ok" and res[name].correct, res[name].reason
        assert res[name].max_rel_err <= 1e-5
    assert res["padded"].even_bitwise_equal is True
    assert res["legacy"].even_bitwise_equal is None  # legacy is the reference, not checked against itself
    assert res["padded"].rows_moved == 1024
    # legacy's form on an even plan: no rank stages, so no local phase
    assert "local" not in res["padded"].stats and "local" not in res["legacy"].stats


def test_point_scattered_mode_passes_through(rank_pool):
    spec = small(mode="SCATTERED", impls=("padded", "a2a"))
    res = by_impl(run_point(spec, rank_pool(2), timeout_s=120))
    assert res["padded"].status == "passthrough" and res["padded"].correct is True, res["padded"].reason
    assert not res["padded"].stats and res["padded"].rows_moved is None and res["padded"].busbw_padded_GBps is None
    assert res["a2a"].status == "ok" and res["a2a"].rows_moved > 0 and res["a2a"].stats["roundtrip"]["p50"] > 0


def test_point_light_checks_time_without_the_reference(rank_pool):
    """checks="light": no reference MoE and no A/A control, and a wrong chunk
    still fails its check (the benchmark's production shapes)."""
    wrong = "tests.broken_impls:chunk_off_by_one"
    res = by_impl(run_point(small(impls=("padded", "legacy", wrong)), rank_pool(2), timeout_s=120, checks="light"))
    pad = res["padded"]
    assert pad.status == "ok" and pad.correct is True and pad.max_rel_err is None, pad.reason
    assert pad.stats["local"]["p50"] > 0 and len(pad.samples["local"]) == 3 and pad.samples["control"] == []
    assert res["legacy"].status == "refused"
    assert res[wrong].status == "failed" and res[wrong].failed_check == "scatter_chunk", res[wrong].reason


def test_point_fault_on_a_rank_is_reported(pool_workdir):
    pool = RankPool(2, workdir=pool_workdir)
    res = run_point(small(impls=("padded", "tests.broken_impls:raise_rank")), pool, timeout_s=60)
    # The raising implementation's row; padded rerun on fresh ranks.
    assert [r.status for r in res] == ["ok", "error"]
    assert "injected fault on rank 1" in res[1].reason
    assert pool.closed


def test_point_needs_a_pool_of_its_world_size(rank_pool):
    with pytest.raises(ValueError, match="cp_size=3"):
        run_point(small(cp_size=3, num_experts=6), rank_pool(2), timeout_s=10)


@pytest.mark.parametrize("kw,match", [
    (dict(dtype="float16"), "dtype='float16'"), (dict(impls=("fast",)), "impl='fast'"),
    (dict(hidden_size=0), "hidden_size=0"), (dict(iters=0), "iters=0"), (dict(warmup=-1), "warmup=-1"),
    (dict(num_experts=3), "num_experts=3"), (dict(topk=5), "topk=5"), (dict(mode="HALF"), "HALF"),
])
def test_point_spec_rejects_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        small(**kw)
