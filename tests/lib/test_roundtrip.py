"""The round trips on real gloo ranks: byte-exact gathers, MoE round trips, refusals.

One warm pool per world size; each test sends one task that loops over many
cases, and the findings come back per case and rank."""

from __future__ import annotations

import time

import pytest
import torch

import nsa_cp_comm
import rank_tasks
from nsa_cp_comm.harness import RankPool
from rank_tasks import TORCH_UNEVEN_TEXT

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="requires a CUDA GPU")

CP_SIZES = (1, 2, 3, 4, 8)


def cases_for(cp: int) -> list[dict]:
    """Cases over all three policies and both dtypes: even and uneven plans,
    and (for cp > 1) ranks with zero rows."""
    if cp == 8:
        # 8 ranks on a 2-core CI box: few, small cases.
        specs = [("round_robin", 1, [40, 21]), ("zigzag", 1, [1, 1]), ("zigzag", 1, [37, 91]),
                 ("zigzag_page", 16, [100]), ("zigzag_page", 64, [10, 3])]
        hidden = (64, 128)
    else:
        specs = [(pol, page, lens)
                 for pol, page in (("round_robin", 1), ("zigzag", 1), ("zigzag_page", 16), ("zigzag_page", 64))
                 for lens in ([64 * cp], [37, 91, 5], [1, 1], [10])]
        hidden = (64, 96, 256)
    cases = []
    for dtype in ("float32", "bfloat16"):
        for pol, page, lens in specs:
            i = len(cases)
            cases.append(dict(seq_lens=lens, cp=cp, policy=pol, page=page, align=cp if i % 3 else 2 * cp,
                              H=hidden[i % len(hidden)], dtype=dtype, seed=i))
    if cp == 2:  # one production-width case
        cases.append(dict(seq_lens=[203, 30], cp=2, policy="zigzag", page=1, H=7168, dtype="bfloat16", seed=99))
    return cases


def check_findings(results, cases):
    assert [r.status for r in results] == ["ok"] * len(results), [(r.status, r.error) for r in results]
    problems = []
    for r in results:
        assert len(r.value) == len(cases), r.value[-1]
        for f in r.value:
            for msg in f["failures"]:
                problems.append(f"rank {r.rank} case {f['case']} {cases[f['case']]}: {msg}")
    assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("cp", CP_SIZES)
def test_gather_byte_exact_and_moe_round_trip(cp, rank_pool):
    cases = cases_for(cp)
    plans = [rank_tasks.make_plan(c) for c in cases]
    # The cases must keep covering what the issue asks for.
    assert {p.policy for p in plans} == {"round_robin", "zigzag", "zigzag_page"}
    assert {c["dtype"] for c in cases} == {"float32", "bfloat16"}
    assert any(p.is_even for p in plans)
    if cp > 1:
        assert any(not p.is_even for p in plans)
        assert any(0 in p.per_rank_tokens for p in plans), "no case with a zero-row rank"
        assert any(0 in p.per_rank_tokens for p in plans if p.policy == "zigzag")
    results = rank_pool(cp).run(rank_tasks.roundtrip_cases, cases, timeout_s=120)
    check_findings(results, cases)
    # The ranks' own view of their shard sizes agrees with the plan.
    for r in results:
        assert [f["n"] for f in r.value] == [p.per_rank_tokens[r.rank] for p in plans]
        for f, p in zip(r.value, plans):
            if p.is_even:
                assert f["legacy"] == {"even": True}
            else:
                assert set(f["legacy"]) == {"even", "legacy_gather", "legacy_scatter", "communicator"}


def test_legacy_error_text_is_torchs():
    assert nsa_cp_comm.LEGACY_UNEVEN_ERROR == TORCH_UNEVEN_TEXT


@pytest.mark.parametrize("cp", [2, 4])
def test_legacy_on_uneven_raises_on_every_rank_then_pool_still_works(cp, rank_pool):
    case = dict(seq_lens=[1001, 300], cp=cp, policy="zigzag", page=1, H=64, dtype="float32", seed=3)
    if cp == 4:
        case.update(policy="zigzag_page", page=64, seq_lens=[10])  # ranks 1..3 hold zero rows
    plan = rank_tasks.make_plan(case)
    assert not plan.is_even
    pool = rank_pool(cp)
    results = pool.run(rank_tasks.legacy_uneven_caught, case, timeout_s=30)
    # No wall-time bound: a rank left in a collective would show as "timeout" (30 s) below.
    assert [r.status for r in results] == ["ok"] * cp
    for r in results:
        for name in ("gather", "scatter"):
            msg, took = r.value[name]
            assert msg.startswith(TORCH_UNEVEN_TEXT), (r.rank, name, msg)
            assert took < 20.0, (r.rank, name, took)  # raised by itself, not by a collective's timeout
    # No rank was left inside a collective: a round trip on the same pool completes.
    follow = pool.run(rank_tasks.padded_roundtrip_sum, dict(case, seed=4), timeout_s=30)
    assert [r.status for r in follow] == ["ok"] * cp, [(r.status, r.error) for r in follow]
    assert all(r.value <= 1e-5 for r in follow), [r.value for r in follow]


def test_legacy_on_uneven_uncaught_errors_on_every_rank_promptly(rank_pool):
    case = dict(seq_lens=[1001, 300], cp=2, policy="zigzag", page=1, H=32, dtype="bfloat16", seed=5)
    pool = rank_pool(2)
    t0 = time.monotonic()
    results = pool.run(rank_tasks.legacy_uneven_uncaught, case, timeout_s=60)
    took = time.monotonic() - t0
    # Every rank raised by itself (none "aborted" for waiting in a collective).
    assert [r.status for r in results] == ["error", "error"], [(r.status, r.error) for r in results]
    assert all(r.error.startswith("ValueError: " + TORCH_UNEVEN_TEXT) for r in results)
    assert took < 50  # well inside the 60 s task timeout: nobody waited it out


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_round_trip_inputs_are_validated_against_the_plan(cp, rank_pool):
    results = rank_pool(cp).run(rank_tasks.validation_messages, cp, timeout_s=60)
    assert [r.status for r in results] == ["ok"] * cp, [(r.status, r.error) for r in results]
    for r in results:
        msgs = r.value
        assert msgs["in_step"] == cp
        for label in ("padded_gather_rows", "padded_gather_1d", "padded_scatter_rows", "padded_gather__rows",
                      "legacy_gather_rows", "legacy_scatter_rows"):
            assert msgs[label].startswith("ValueError: "), (r.rank, label, msgs[label])
            assert ("rows, the plan expects" in msgs[label] or "not 2-D" in msgs[label]), msgs[label]
            assert f"rank {r.rank}" in msgs[label] or "not 2-D" in msgs[label], msgs[label]
        for label in ("padded_gather_group", "padded_scatter_group", "padded_buffer_group", "legacy_gather_group"):
            assert msgs[label].startswith("ValueError: "), (r.rank, label, msgs[label])
            assert f"group size {cp}" in msgs[label] and f"cp_size={cp + 1}" in msgs[label], msgs[label]
        assert msgs["communicator_impl"].startswith("ValueError: ") and "'fast'" in msgs["communicator_impl"]
        if cp > 1:
            for label in ("legacy_gather_uneven", "legacy_scatter_uneven"):
                assert msgs[label].startswith("ValueError: " + TORCH_UNEVEN_TEXT), (r.rank, label, msgs[label])
    if cp > 1:
        assert 0 in [r.value["n_uneven"] for r in results]


def test_round_trip_emits_no_deprecation_warning(rank_pool):
    case = dict(seq_lens=[1001, 300], cp=2, policy="zigzag", page=1, H=64, dtype="float32", seed=8)  # uneven
    assert rank_tasks.answered(rank_pool(2).run(rank_tasks.warnings_of_roundtrip, case, timeout_s=60)) == [[], []]


# -- GPU (skipped without one) ---------------------------------------------------

def _round_trips_on_cuda(cp: int, backend: str, workdir, timeout_s: float) -> list[dict]:
    """The first 12 of cp's cases with H <= 256, on CUDA tensors of fresh ranks: checked; the cases."""
    cases = [c for c in cases_for(cp) if c["H"] <= 256][:12]
    with RankPool(cp, backend=backend, device="cuda", workdir=workdir) as pool:
        results = pool.run(rank_tasks.roundtrip_cases, cases, timeout_s=timeout_s)
    check_findings(results, cases)
    return cases


@pytest.mark.requires_gpu
@needs_cuda
def test_nccl_cp1_round_trip_on_cuda(pool_workdir):
    _round_trips_on_cuda(1, "nccl", pool_workdir, timeout_s=120)


@pytest.mark.requires_gpu
@needs_cuda
def test_gloo_cp2_round_trip_on_cuda_tensors(pool_workdir):
    cases = _round_trips_on_cuda(2, "gloo", pool_workdir, timeout_s=180)
    with RankPool(2, backend="gloo", device="cuda", workdir=pool_workdir) as pool:
        warned = pool.run(rank_tasks.warnings_of_roundtrip, cases[1], timeout_s=60)
    assert [r.value for r in warned] == [[], []]
