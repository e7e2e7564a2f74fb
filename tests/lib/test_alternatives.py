"""The padded algorithm's collectives, the zero-copy form, and the alternatives
(sumlen_allreduce, allgatherv, the a2a stand-in for DeepEP).

Single-process fake collectives appear only in the unit tests at the top (they
record what each path hands to the collective); everything else runs on real
gloo ranks, through the matrix path (``run_point``) where it can.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import nsa_cp_comm.roundtrip as roundtrip
from nsa_cp_comm import alternatives, hooks, impls, origins
from nsa_cp_comm.harness.measure import point_on_rank, run_point
from nsa_cp_comm.harness.spec import DTYPES, PointSpec, bitwise_equal, make_shard
from nsa_cp_comm.moe import ReferenceMoE, max_rel_err, tolerance
from nsa_cp_comm.plan import plan_split
from nsa_cp_comm.harness.rank_body import rank_device
from nsa_cp_comm.harness.ranks import RankPool
from nsa_cp_comm.roundtrip import (
    legacy_gather,
    legacy_scatter,
    padded_buffer,
    padded_gather,
    padded_gather_,
    padded_scatter,
)
from rank_tasks import by_impl, folded

H = 32
TIMEOUT_S = 120.0


# ---------------------------------------------------------------------------
# Unit tests: a single-process stand-in for the collectives, recording calls
# ---------------------------------------------------------------------------


def _rel(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Offset in elements of ``a`` inside ``b``'s storage, None if separate."""
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return None
    return a.storage_offset() - b.storage_offset()  # data_ptr() is 0 for empty views


class FakeCollectives:
    """This process plays rank ``rank`` of ``cp``; the other ranks' shards are
    known, so the gather can fill their blocks. The reduce-scatter sums the
    chunk as if the other ranks' partials equalled this rank's."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cp: int, rank: int, shards: list[torch.Tensor]) -> None:
        self.cp, self.rank, self.shards = cp, rank, shards
        self.calls: list[tuple] = []
        monkeypatch.setattr(roundtrip, "group_size", lambda group=None: cp)
        monkeypatch.setattr(roundtrip, "group_rank", lambda group=None: rank)
        monkeypatch.setattr(roundtrip, "all_gather_into", self.all_gather_into)
        monkeypatch.setattr(roundtrip, "reduce_scatter_into", self.reduce_scatter_into)
        # no peers to exchange fingerprints with (the agreement: tests/lib/test_agree.py, real ranks)
        monkeypatch.setattr(roundtrip, "agree", lambda *args, **kwargs: None)

    def all_gather_into(self, out: torch.Tensor, inp: torch.Tensor, group=None) -> None:
        k = inp.shape[0]
        assert out.shape[0] == k * self.cp, "the real collective would refuse these sizes"
        self.calls.append(("all_gather", tuple(out.shape), tuple(inp.shape), out.dtype, _rel(inp, out)))
        for r in range(self.cp):
            if r == self.rank:
                out[r * k : (r + 1) * k].copy_(inp)
            else:
                out[r * k : (r + 1) * k].zero_()
                out[r * k : r * k + self.shards[r].shape[0]].copy_(self.shards[r])

    def reduce_scatter_into(self, out: torch.Tensor, inp: torch.Tensor, group=None) -> None:
        k = out.shape[0]
        assert inp.shape[0] == k * self.cp, "the real collective would refuse these sizes"
        self.calls.append(("reduce_scatter", tuple(out.shape), tuple(inp.shape), out.dtype, _rel(out, inp)))
        out.copy_(inp[self.rank * k : (self.rank + 1) * k] * self.cp)


def _as_each_rank(monkeypatch, plan, dtype=torch.float32):
    """This process as each rank of ``plan`` in turn: (rank, every rank's seeded shard, its FakeCollectives)."""
    g = torch.Generator().manual_seed(1)
    shards = [torch.randn(n, H, generator=g).to(dtype) for n in plan.per_rank_tokens]
    for rank in range(plan.cp_size):
        yield rank, shards, FakeCollectives(monkeypatch, plan.cp_size, rank, shards)


EVEN_PLANS = [
    ((1000,), 2, "zigzag", 1),
    ((1001, 300), 4, "round_robin", 1),
    ((1024,), 4, "zigzag_page", 64),
    ((5,), 1, "zigzag", 1),
]
UNEVEN_PLANS = [
    ((1001, 300), 2, "zigzag", 1),
    ((900,), 3, "zigzag_page", 64),
    ((64,), 4, "zigzag_page", 64),  # ranks 1..3 hold no rows
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seq_lens,cp,policy,page", EVEN_PLANS)
def test_even_plan_runs_the_general_padded_algorithm(monkeypatch, seq_lens, cp, policy, page, dtype):
    """No even-plan branch: the padded gather's rule (a rank copies only when
    shorter than m) copies nothing on an even plan, so it issues legacy's
    call, out of place from the caller's shard into a [m*cp, H] == [T, H]
    buffer. Same calls, same sizes, same bytes."""
    plan = plan_split(seq_lens, cp, policy=policy, page_size=page)
    assert plan.is_even and plan.padded_total == plan.total_tokens
    for rank, shards, legacy in _as_each_rank(monkeypatch, plan, dtype):
        lf = legacy_gather(shards[rank], plan, check=False)
        lo = legacy_scatter(lf.clone(), plan, check=False)
        padded = FakeCollectives(monkeypatch, cp, rank, shards)
        pf = padded_gather(shards[rank], plan, check=False)
        po = padded_scatter(pf.clone(), plan, check=False)
        assert [c[0] for c in legacy.calls] == [c[0] for c in padded.calls] == ["all_gather", "reduce_scatter"]
        assert [c[1:4] for c in padded.calls] == [c[1:4] for c in legacy.calls]  # shapes and dtype
        assert legacy.calls[0][4] is None  # legacy gathers from the caller's tensor
        assert padded.calls[0][4] is None  # and so does padded
        assert padded.calls == legacy.calls
        assert pf.shape == (plan.total_tokens, H)
        assert bitwise_equal(pf, lf) and bitwise_equal(po, lo)
        zc = FakeCollectives(monkeypatch, cp, rank, shards)
        full, slot = padded_buffer(plan, H, dtype=dtype)
        assert full.shape == (plan.total_tokens, H)
        slot.copy_(shards[rank])
        padded_gather_(full, plan, check=False)
        assert bitwise_equal(full, lf)
        assert bitwise_equal(padded_scatter(full, plan, check=False), lo)
        assert [c[:4] for c in zc.calls] == [c[:4] for c in padded.calls]


@pytest.mark.parametrize("seq_lens,cp,policy,page", EVEN_PLANS + UNEVEN_PLANS)
def test_padded_scatter_returns_a_view_of_its_chunk(monkeypatch, seq_lens, cp, policy, page):
    plan = plan_split(seq_lens, cp, policy=policy, page_size=page)
    m = plan.max_rank_len
    for rank, shards, fake in _as_each_rank(monkeypatch, plan):
        full = torch.randn(plan.padded_total, H)
        expected = full[rank * m : (rank + 1) * m] * cp
        out = padded_scatter(full, plan, check=False)
        n = plan.per_rank_tokens[rank]
        assert out.shape == (n, H)
        # A view of this rank's chunk of the buffer: same storage, at row rank*m.
        assert _rel(out, full) == rank * m * H
        assert out._base is full or out._base is full._base
        assert fake.calls == [("reduce_scatter", (m, H), (plan.padded_total, H), torch.float32, rank * m * H)]
        assert torch.equal(out, expected[:n])
        full[rank * m].fill_(123.0)  # writes through: nothing was copied
        if n:
            assert bool((out[0] == 123.0).all())


@pytest.mark.parametrize("seq_lens,cp,policy,page", UNEVEN_PLANS)
def test_padded_buffer_gather_is_zero_copy(monkeypatch, seq_lens, cp, policy, page):
    plan = plan_split(seq_lens, cp, policy=policy, page_size=page)
    m = plan.max_rank_len
    for rank, shards, fake in _as_each_rank(monkeypatch, plan):
        full, slot = padded_buffer(plan, H, dtype=torch.float32)
        n = plan.per_rank_tokens[rank]
        assert full.shape == (plan.padded_total, H) and slot.shape == (n, H)
        assert _rel(slot, full) == rank * m * H
        assert bool((full[rank * m + n : (rank + 1) * m] == 0).all())
        slot.copy_(shards[rank])
        ptr = full.data_ptr()
        assert padded_gather_(full, plan, check=False) is full and full.data_ptr() == ptr
        # The collective's input is this rank's [m, H] block of the buffer itself.
        assert fake.calls == [("all_gather", (plan.padded_total, H), (m, H), torch.float32, rank * m * H)]
        for r in range(cp):
            nr = plan.per_rank_tokens[r]
            assert torch.equal(full[r * m : r * m + nr], shards[r])
            assert bool((full[r * m + nr : (r + 1) * m] == 0).all())
        # padded_gather (the copying form) gives the same bytes.
        FakeCollectives(monkeypatch, cp, rank, shards)
        assert bitwise_equal(padded_gather(shards[rank], plan, check=False), full)


@pytest.mark.parametrize("seq_lens,cp,policy,page", EVEN_PLANS + UNEVEN_PLANS)
def test_allgatherv_splits_with_a_fake_list_collective(monkeypatch, seq_lens, cp, policy, page):
    """allgatherv cannot run on gloo; check its per-rank splits here with a
    stand-in for the list collectives (the real ones run in the GPU tests)."""
    plan = plan_split(seq_lens, cp, policy=policy, page_size=page)
    for rank, shards, _ in _as_each_rank(monkeypatch, plan):
        seen = {}

        def all_gather(outs, inp, group=None):
            seen["ag"] = [tuple(o.shape) for o in outs]
            for r, o in enumerate(outs):
                o.copy_(inp if r == rank else shards[r])

        def reduce_scatter(out, ins, group=None):
            seen["rs"] = [tuple(i.shape) for i in ins]
            out.copy_(ins[rank] * cp)

        monkeypatch.setattr(dist, "all_gather", all_gather)
        monkeypatch.setattr(dist, "reduce_scatter", reduce_scatter)
        full = alternatives.allgatherv_gather(shards[rank], plan, check=False)
        sizes = [(n, H) for n in plan.per_rank_tokens]
        assert seen["ag"] == sizes
        assert torch.equal(full, torch.cat(shards))
        out = alternatives.allgatherv_scatter(full, plan, check=False)
        assert seen["rs"] == sizes
        assert torch.equal(out, shards[rank] * cp)


def test_a2a_layout_sends_each_token_once_per_rank():
    idx = torch.tensor([[0, 1], [3, 2], [1, 2], [5, 4], [0, 5]])  # 6 experts, 3 ranks, 2 per rank
    send_token, splits = alternatives.a2a_layout(idx, 2, 3)
    assert splits == [3, 2, 2]
    assert send_token.tolist() == [0, 2, 4, 1, 2, 3, 4]
    empty_token, empty_splits = alternatives.a2a_layout(idx[:0], 2, 3)
    assert empty_splits == [0, 0, 0] and empty_token.numel() == 0


def test_registry_holds_every_builtin_through_the_protocol():
    assert {"padded", "legacy", "padded_zero_copy", "sumlen_allreduce", "allgatherv", "a2a"} <= set(impls.REGISTRY)
    ag = impls.get("allgatherv")
    assert isinstance(ag, impls.RoundTripImpl)
    assert "nccl" in hooks.skip_reason(ag, "gloo") and hooks.skip_reason(ag, "nccl") is None
    assert hooks.skip_reason(impls.get("sumlen_allreduce"), "gloo") is None
    assert isinstance(impls.get("a2a"), impls.DispatchImpl) and impls.get("a2a").mode == "SCATTERED"
    plan = plan_split([1001, 300], 2, policy="zigzag")
    assert impls.get("sumlen_allreduce").starts(plan) == [0, 652]
    assert impls.get("sumlen_allreduce").buffer_rows(plan) == plan.total_tokens
    assert origins.origin(impls.get("padded")).startswith("nsa_cp_comm ")


@pytest.mark.parametrize(
    "kw,match",
    [(dict(layout="diagonal"), "layout='diagonal'"), (dict(backends=("mpi",)), "backends"),
     (dict(gather=None), "gather is not callable"), (dict(name="a b"), "name")],
)
def test_protocol_rejects_bad_implementations(kw, match):
    base = dict(name="x", gather=padded_gather, scatter=padded_scatter)
    with pytest.raises(ValueError, match=match):
        impls.RoundTripImpl(**{**base, **kw})


def test_impl_all_resolves_every_registered_implementation():
    pytest.importorskip("hydra")
    from matrix.app.config import MatrixConfig
    from matrix.app.point import resolve

    base = {**vars(MatrixConfig()), "cp_size": 2, "device": "cpu", "backend": "gloo", "impl": "all",
            "hidden_size": 32}
    full = resolve({**base, "moe_a2a_backend": "none"}, gpus=0)
    builtin = ("padded", "legacy", "sumlen_allreduce", "allgatherv", "padded_zero_copy", "pad_at_split")
    # then any installed plug-in (the README's example installs engine_comm)
    assert full.impls[: len(builtin)] == builtin and "padded" not in full.impls[len(builtin):]
    scattered = resolve({**base, "moe_a2a_backend": "deepep"}, gpus=0)
    assert scattered.impls == ("padded", "legacy", "a2a")
    both = resolve({**base, "impl": "both", "moe_a2a_backend": "deepep"}, gpus=0)
    assert both.impls == ("padded", "legacy", "a2a")  # DeepEP points measure the a2a path by default
    assert resolve({**base, "impl": "both"}, gpus=0).impls == ("padded", "legacy")


# ---------------------------------------------------------------------------
# Real gloo ranks
# ---------------------------------------------------------------------------


@pytest.fixture
def pool3(rank_pool):
    """The suite's warm 3-rank gloo pool (conftest.py; spawning ranks costs
    seconds); 3 ranks: offsets and splits that a power of two could hide."""
    return rank_pool(3)


CASES3 = [  # (seq_lens, policy, page, dtype) on 3 ranks
    ((1001, 300), "zigzag", 1, "float32"),  # even
    ((900,), "zigzag_page", 64, "float32"),  # uneven
    ((900,), "zigzag_page", 64, "bfloat16"),
    ((64,), "zigzag_page", 64, "float32"),  # ranks 1 and 2 hold no rows
    ((64,), "zigzag_page", 64, "bfloat16"),
    ((130, 7, 700), "zigzag_page", 16, "bfloat16"),
    ((31, 2), "round_robin", 1, "float32"),
]


def _alternatives_on_rank(cases):
    """Many cases in one task: sumlen_allreduce round trip and the a2a MoE."""
    rank, device = dist.get_rank(), rank_device()
    cp = dist.get_world_size()
    out = []
    for seq_lens, policy, page, dtype in cases:
        spec = PointSpec(seq_lens, cp, policy, page_size=page, hidden_size=H, dtype=dtype)
        plan = spec.plan()
        local = make_shard(spec, plan, rank, device)
        moe = ReferenceMoE(H, num_experts=spec.experts, topk=spec.topk, seed=spec.seed, dtype=DTYPES[dtype])
        ref = moe.reference(local)
        full = alternatives.sumlen_gather(local, plan)
        gathered = torch.cat([make_shard(spec, plan, r, device) for r in range(cp)])
        res = alternatives.sumlen_scatter(moe.partial(full, rank, cp), plan)
        # the whole SCATTERED-mode MoE: route, dispatch, local experts, combine
        idx, weight = moe.route(local)
        experts = moe.experts_of(rank, cp)
        x_recv, handle = alternatives.a2a_dispatch(local, idx, weight, len(experts))
        a2a_out = alternatives.a2a_combine(alternatives.a2a_experts(moe, x_recv, handle, experts), handle)
        out.append(dict(gather_exact=bitwise_equal(full, gathered), sumlen_shape=tuple(res.shape),
                        sumlen_err=max_rel_err(res, ref) if res.shape == ref.shape else float("inf"),
                        a2a_shape=tuple(a2a_out.shape), a2a_dtype=str(a2a_out.dtype),
                        a2a_err=max_rel_err(a2a_out, ref) if a2a_out.shape == ref.shape else float("inf"),
                        rows_sent=handle.rows_sent, rows_received=handle.rows_received))
    return out


def _expected_rows_sent(spec: PointSpec, rank: int) -> int:
    plan = spec.plan()
    moe = ReferenceMoE(spec.hidden_size, num_experts=spec.experts, topk=spec.topk, seed=spec.seed,
                       dtype=DTYPES[spec.dtype])
    local = make_shard(spec, plan, rank, torch.device("cpu"))
    idx, _ = moe.route(local)
    return sum(alternatives.a2a_layout(idx, spec.experts // spec.cp_size, spec.cp_size)[1])


def test_sumlen_and_a2a_on_gloo_ranks(pool3):
    plans = [plan_split(s, 3, policy=p, page_size=pg) for s, p, pg, _ in CASES3]
    assert any(pl.is_even for pl in plans) and any(not pl.is_even for pl in plans)
    assert any(0 in pl.per_rank_tokens for pl in plans)
    results = pool3.run(_alternatives_on_rank, CASES3, timeout_s=TIMEOUT_S)
    assert all(r.ok for r in results), [r.error for r in results]
    for i, (seq_lens, policy, page, dtype) in enumerate(CASES3):
        spec = PointSpec(seq_lens, 3, policy, page_size=page, hidden_size=H, dtype=dtype)
        plan = spec.plan()
        tol = tolerance(DTYPES[dtype], 3)
        received = 0
        for rank in range(3):
            got = results[rank].value[i]
            n = plan.per_rank_tokens[rank]
            assert got["gather_exact"], (i, rank)
            assert got["sumlen_shape"] == (n, H) and got["a2a_shape"] == (n, H), (i, rank)
            assert got["sumlen_err"] <= tol, (i, rank, got)
            assert got["a2a_err"] <= tol, (i, rank, got)
            assert got["a2a_dtype"] == str(DTYPES[dtype])
            assert got["rows_sent"] == _expected_rows_sent(spec, rank), (i, rank)
            received += got["rows_received"]
        assert received == sum(results[r].value[i]["rows_sent"] for r in range(3))


@pytest.mark.parametrize(
    "seq_lens,policy,page,dtype",
    [((900,), "zigzag_page", 64, "float32"), ((1001, 300), "zigzag", 1, "bfloat16"),
     ((64,), "zigzag_page", 64, "bfloat16")],
)
def test_full_mode_alternatives_through_run_point(pool3, seq_lens, policy, page, dtype):
    spec = PointSpec(seq_lens, 3, policy, page_size=page, hidden_size=H, dtype=dtype, warmup=1, iters=3,
                     impls=("padded", "legacy", "sumlen_allreduce", "allgatherv", "a2a"))
    plan = spec.plan()
    res = by_impl(run_point(spec, pool3, timeout_s=TIMEOUT_S))
    assert res["padded"].status == "ok" and res["padded"].correct
    assert res["legacy"].status == ("ok" if plan.is_even else "refused"), res["legacy"].reason
    s = res["sumlen_allreduce"]
    assert s.status == "ok" and s.correct, s.reason
    assert s.max_rel_err <= tolerance(DTYPES[dtype], 3)
    assert s.rows_moved == plan.total_tokens
    assert s.bytes_padded == s.bytes_useful == plan.total_tokens * H * DTYPES[dtype].itemsize
    assert s.stats["roundtrip"]["p50"] > 0 and s.busbw_useful_GBps > 0
    ag = res["allgatherv"]
    assert ag.status == "skipped" and "nccl" in ag.reason and "gloo" in ag.reason
    assert res["a2a"].status == "skipped" and "SCATTERED" in res["a2a"].reason  # a dispatch: no FULL-mode round trip
    if plan.is_even:
        assert res["padded"].even_bitwise_equal is True


@pytest.mark.parametrize(
    "seq_lens,policy,page,dtype",
    [((900,), "zigzag_page", 64, "bfloat16"), ((1001, 300), "zigzag", 1, "float32"),
     ((64,), "zigzag_page", 64, "float32")],
)
def test_scattered_mode_a2a_through_run_point(pool3, seq_lens, policy, page, dtype):
    spec = PointSpec(seq_lens, 3, policy, page_size=page, mode="SCATTERED", hidden_size=H, dtype=dtype,
                     warmup=1, iters=3, impls=("padded", "legacy", "a2a"))
    plan = spec.plan()
    res = by_impl(run_point(spec, pool3, timeout_s=TIMEOUT_S))
    for name in ("padded", "legacy"):
        assert res[name].status == "passthrough" and res[name].correct, res[name].reason
        assert res[name].rows_moved is None and not res[name].stats
    a = res["a2a"]
    assert a.status == "ok" and a.correct, a.reason
    assert a.max_rel_err <= tolerance(DTYPES[dtype], 3)
    rows = sum(_expected_rows_sent(spec, r) for r in range(3))
    assert a.rows_moved == rows
    assert a.bytes_padded == rows * H * DTYPES[dtype].itemsize
    assert a.bytes_useful == plan.total_tokens * H * DTYPES[dtype].itemsize
    for phase in ("gather", "scatter", "roundtrip"):
        assert a.stats[phase]["p50"] > 0
    assert a.busbw_padded_GBps > 0


# The checks must catch broken implementations, on the same matrix path.


def _broken_sumlen_gather(local, plan, group=None):
    full = alternatives.sumlen_gather(local, plan, group)
    return full.roll(1, dims=0)  # rows land one row off


def _broken_a2a_experts(moe, x_recv, handle, experts):
    handle.recv_weight = torch.ones_like(handle.recv_weight)  # routing weights ignored
    return _ORIGINAL_A2A_EXPERTS(moe, x_recv, handle, experts)


_ORIGINAL_A2A_EXPERTS = alternatives.a2a_experts


def _point_with_broken_impls(spec, backend):
    impls.register(impls.RoundTripImpl("broken_sumlen", _broken_sumlen_gather, alternatives.sumlen_scatter,
                                       "rank_major_packed", legacy_bits_on_even=False))
    alternatives.a2a_experts = _broken_a2a_experts
    try:
        return point_on_rank(spec, backend)
    finally:
        alternatives.a2a_experts = _ORIGINAL_A2A_EXPERTS
        impls.REGISTRY.pop("broken_sumlen", None)


def test_checks_catch_broken_alternatives(pool3, monkeypatch):
    monkeypatch.setitem(impls.REGISTRY, "broken_sumlen", impls.get("sumlen_allreduce"))  # PointSpec validation
    full = PointSpec((900,), 3, "zigzag_page", page_size=64, hidden_size=H, dtype="float32", warmup=0, iters=1,
                     impls=("sumlen_allreduce", "broken_sumlen"))
    res = folded(full, pool3.run(_point_with_broken_impls, full, "gloo", timeout_s=TIMEOUT_S))
    assert res["sumlen_allreduce"].status == "ok"
    assert res["broken_sumlen"].status == "failed" and res["broken_sumlen"].failed_check == "gather_rows"
    scat = PointSpec((900,), 3, "zigzag_page", page_size=64, mode="SCATTERED", hidden_size=H, dtype="float32", warmup=0,
                     iters=1, impls=("a2a",))
    res = folded(scat, pool3.run(_point_with_broken_impls, scat, "gloo", timeout_s=TIMEOUT_S))
    assert res["a2a"].status == "failed" and res["a2a"].failed_check == "reference_moe", res["a2a"].reason
    # and the pool's ranks are healthy again
    ok = by_impl(run_point(scat, pool3, timeout_s=TIMEOUT_S))
    assert ok["a2a"].status == "ok"


# ---------------------------------------------------------------------------
# GPU (benchmarks/gpu_check.sh runs these with -m requires_gpu)
# ---------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.requires_gpu
@pytest.mark.parametrize("cp, impls", [
    pytest.param(1, ("padded", "legacy", "sumlen_allreduce", "allgatherv"), marks=needs_cuda, id="cp1"),
    pytest.param(2, ("padded", "sumlen_allreduce", "allgatherv"), id="allgatherv_uneven",
                 marks=pytest.mark.skipif(torch.cuda.device_count() < 2, reason="uneven NCCL allgatherv needs 2 GPUs")),
])
def test_alternatives_on_nccl(tmp_path, cp, impls):
    spec = PointSpec((1001, 300), cp, "zigzag", hidden_size=256, dtype="bfloat16", warmup=1, iters=3, impls=impls)
    with RankPool(cp, backend="nccl", device="cuda", workdir=tmp_path) as pool:
        res = by_impl(run_point(spec, pool, timeout_s=TIMEOUT_S))
    for name, r in res.items():
        assert r.status == "ok" and r.correct, (name, r.reason)


@pytest.mark.requires_gpu
@needs_cuda
def test_alternatives_gloo_cuda_tensors(tmp_path):
    with RankPool(2, backend="gloo", device="cuda", workdir=tmp_path) as pool:
        full = PointSpec((1001, 300), 2, "zigzag", hidden_size=256, dtype="bfloat16", warmup=1, iters=3,
                         impls=("padded", "legacy", "sumlen_allreduce", "allgatherv"))
        res = by_impl(run_point(full, pool, timeout_s=TIMEOUT_S))
        assert res["padded"].status == "ok" and res["sumlen_allreduce"].status == "ok", res
        assert res["allgatherv"].status == "skipped"
        scat = PointSpec((64,), 2, "zigzag_page", page_size=64, mode="SCATTERED", hidden_size=256,
                         dtype="bfloat16", warmup=1, iters=3, impls=("padded", "a2a"))
        res = by_impl(run_point(scat, pool, timeout_s=TIMEOUT_S))
        assert res["a2a"].status == "ok" and res["a2a"].correct, res["a2a"].reason
