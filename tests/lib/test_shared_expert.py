"""DeepSeek-V3.2's shared expert in the reference MoE, in each placement
(``shared_expert``: none, sharded, replicated), and the verdict on where an
implementation adds a replicated term.

A replicated shared expert's output is the same on every rank; added to the
partials before the reduce-scatter it is summed over the ranks, counted cp
times. A row that does that must be ``failed`` naming it ("a replicated term
counted cp times") at every cp > 1, on real gloo ranks; one that adds it
once, after, must be ``ok``. The checker is broken too: the diagnosis must
stay silent where the error is not ``(cp - 1)`` times the term, and a
reference that leaves the shared expert out must fail correct rows.
"""

from __future__ import annotations

import pytest
import torch

import broken_impls
from broken_impls import ref as B
from nsa_cp_comm.harness.spec import PointSpec
from nsa_cp_comm.moe import SHARED_EXPERTS, ReferenceMoE, counted_cp_times, max_rel_err, tolerance
from rank_tasks import folded

PHRASE = "a replicated term counted cp times"
UNEVEN = dict(seq_lens=(1001, 300), policy="zigzag")


def run(rank_pool, impls, cp=2, shared="replicated", mutation="none", where=UNEVEN, dtype="bfloat16", mode="FULL"):
    spec = PointSpec(**where, cp_size=cp, impls=impls, hidden_size=32, dtype=dtype, warmup=0, iters=1,
                     shared_expert=shared, mode=mode)
    return folded(spec, rank_pool(cp).run(broken_impls.point_with_mutation, spec, "gloo", mutation, timeout_s=240))


# -- the model ---------------------------------------------------------------------


def _x(n=40, h=48, seed=2):
    return torch.randn(n, h, generator=torch.Generator().manual_seed(seed))


def test_none_is_the_model_without_a_shared_expert_bit_for_bit():
    """The routed experts' weights are drawn first, from the seed alone, so a
    point with shared_expert=none computes exactly what it did before the
    shared expert existed."""
    moe = ReferenceMoE(48, num_experts=8, topk=3, seed=1, shared_expert="none")
    g = torch.Generator().manual_seed(1)
    router = torch.randn(48, 8, generator=g) / 48**0.5
    w1 = torch.randn(8, 48, 32, generator=g) / 48**0.5
    assert torch.equal(moe.router, router.to(torch.float64)) and torch.equal(moe.w1, w1)
    x = _x()
    assert torch.equal(moe.reference(x), moe._apply(x, range(8)))
    for r in range(4):
        assert torch.equal(moe.partial(x, r, 4), moe._apply(x, moe.experts_of(r, 4)))
    assert moe.replicated(x) is None and torch.equal(moe.shared(x), torch.zeros_like(x))
    # the other placements' routed part is the same model
    assert torch.equal(ReferenceMoE(48, num_experts=8, topk=3, seed=1, shared_expert="replicated").w2, moe.w2)


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_every_placement_sums_to_the_reference(cp):
    x = _x()
    routed = ReferenceMoE(48, num_experts=24, topk=3, seed=1).reference(x)
    for placement in SHARED_EXPERTS:
        moe = ReferenceMoE(48, num_experts=24, topk=3, seed=1, shared_expert=placement)
        total = sum(moe.partial(x, r, cp) for r in range(cp))
        rep = moe.replicated(x)
        if rep is not None:
            total = total + rep  # once, after the sum
        assert max_rel_err(total, moe.reference(x)) < 1e-5, placement
    sharded = ReferenceMoE(48, num_experts=24, topk=3, seed=1, shared_expert="sharded")
    assert (sharded.reference(x) - routed).abs().max() > 0.1  # the shared expert adds something
    units = [sharded.shared_units(r, cp) for r in range(cp)]
    assert units[0].start == 0 and units[-1].stop == 32
    assert all(a.stop == b.start for a, b in zip(units, units[1:]))
    assert max_rel_err(sum(sharded._shared(x, u) for u in units), sharded.shared(x)) < 1e-5


@pytest.mark.parametrize("placement,seed", [("none", 4), ("sharded", 2), ("replicated", 2)])
def test_zero_rows_give_zero_outputs_and_do_not_change_other_rows(placement, seed):
    moe = ReferenceMoE(32, num_experts=4, seed=3, shared_expert=placement)
    x = _x(6, 32, seed)
    padded = torch.cat([x, torch.zeros(5, 32)])
    for r in range(2):
        p = moe.partial(padded, r, 2)
        assert torch.equal(p[6:], torch.zeros(5, 32))
        # Equal up to float32 rounding: the matmul's blocking follows the row count, so 11 rows
        # and 6 round differently (1.6e-7 of the output's scale on an AMD EPYC); a leak is far larger.
        assert max_rel_err(p[:6], moe.partial(x, r, 2)) < 1e-6
    assert torch.equal(moe.shared(padded)[6:], torch.zeros(5, 32))


def test_a_bad_placement_is_one_line():
    with pytest.raises(ValueError, match="shared_expert='both' is not one of none, sharded, replicated"):
        ReferenceMoE(16, shared_expert="both")
    with pytest.raises(ValueError, match="shared_expert='both' is not one of"):
        PointSpec((100,), 2, "zigzag", shared_expert="both")


# -- the diagnosis on its own ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cp", [2, 3, 4, 8])
def test_the_diagnosis_fires_only_for_cp_minus_one_extra_terms(cp, dtype):
    moe = ReferenceMoE(48, num_experts=8, seed=4, shared_expert="replicated")
    x = _x(30, 48).to(dtype)
    ref, s = moe.reference(x), moe.shared(x)
    tol = tolerance(dtype, cp)
    assert counted_cp_times((ref + (cp - 1) * s).to(dtype), ref, s, cp, tol)
    assert not counted_cp_times(ref.to(dtype), ref, s, cp, tol)  # right
    assert not counted_cp_times((ref + cp * s).to(dtype), ref, s, cp, tol)  # one more than the sum
    if cp > 2:
        assert not counted_cp_times((ref + s).to(dtype), ref, s, cp, tol)  # counted twice, not cp times
    noise = torch.randn(ref.shape, generator=torch.Generator().manual_seed(5)) * s.abs().max()
    assert not counted_cp_times((ref + (cp - 1) * noise).to(dtype), ref, s, cp, tol)
    # nothing to tell apart: one rank, or a term of zeros
    assert not counted_cp_times(ref.to(dtype), ref, s, 1, tol)
    assert not counted_cp_times(ref.to(dtype), ref, torch.zeros_like(s), cp, tol)


# -- rows on real ranks ------------------------------------------------------------------------


@pytest.mark.parametrize("cp", [2, 3, 4, 8])
def test_a_replicated_term_added_before_the_reduce_scatter_fails_at_every_cp(rank_pool, cp):
    rows = run(rank_pool, ("padded", B("shared_before_rs"), B("shared_after_rs")), cp=cp)
    bad = rows[B("shared_before_rs")]
    assert bad.status == "failed" and bad.failed_check == "reference_moe", bad
    assert PHRASE in bad.reason and f"plus {cp - 1} times" in bad.reason, bad.reason
    assert not bad.stats  # a failed implementation is never timed
    for right in ("padded", B("shared_after_rs")):
        assert rows[right].status == "ok", rows[right].reason


def test_the_placement_decides_what_is_replicated(rank_pool):
    """With the shared expert sharded there is no replicated term: the step
    never calls scatter_replicated, and every rank's share is summed as it
    must be. With none, padded's rows are as they were."""
    for shared in ("sharded", "none"):
        rows = run(rank_pool, ("padded", B("shared_before_rs")), cp=2, shared=shared)
        assert {r.status for r in rows.values()} == {"ok"}, {k: r.reason for k, r in rows.items()}


def test_the_shared_expert_keeps_legacys_bits_on_even_plans(rank_pool):
    """Padded and legacy add the same rows of the same term the same way after
    their sums: on an even plan the round trip is still legacy's bit for bit."""
    for shared in SHARED_EXPERTS:
        rows = run(rank_pool, ("padded", "legacy"), cp=2, shared=shared, where=dict(seq_lens=(1000,), policy="zigzag"))
        assert rows["padded"].status == "ok" and rows["padded"].even_bitwise_equal is True, (shared, rows["padded"])
        assert rows["legacy"].status == "ok", rows["legacy"].reason


def test_the_a2a_path_adds_the_shared_expert_after_the_combine(rank_pool):
    rows = run(rank_pool, ("a2a",), cp=2, mode="SCATTERED")
    assert rows["a2a"].status == "ok", rows["a2a"].reason


# -- the checker broken ------------------------------------------------------------------------


def test_an_error_other_than_cp_minus_one_terms_is_not_named(rank_pool):
    """Counted twice at cp 3: wrong, and not cp times, so the reason must not say so."""
    twice = run(rank_pool, (B("shared_twice"),), cp=3)[B("shared_twice")]
    assert twice.status == "failed" and twice.failed_check == "reference_moe", twice
    assert PHRASE not in twice.reason, twice.reason


def test_a_reference_without_the_shared_expert_fails_correct_rows(rank_pool):
    """At cp 3: a right output is then the (broken) reference plus the term
    once, not twice, so no implementation is blamed for counting it cp times.
    (At cp 2 the two cannot be told apart: the diagnosis reads the reference.)"""
    rows = run(rank_pool, ("padded", B("shared_after_rs")), cp=3, mutation="reference_without_shared")
    for name, row in rows.items():
        assert row.status == "failed" and row.failed_check == "reference_moe", (name, row)
        assert PHRASE not in row.reason, row.reason
    # and the same mutation with no shared expert changes nothing
    rows = run(rank_pool, ("padded",), cp=2, shared="none", mutation="reference_without_shared")
    assert rows["padded"].status == "ok", rows["padded"].reason


def test_the_default_sweep_exercises_the_replicated_term():
    """DeepSeek-V3.2's shared expert, whole on every rank, is the default placement everywhere a point
    is made (the config a sweep composes, the spec a library user builds): a default sweep runs the
    term the SGLang #35535 class gets wrong."""
    from matrix.app.config import MatrixConfig
    from nsa_cp_comm.harness.spec import PointSpec

    assert MatrixConfig().shared_expert == "replicated"
    assert PointSpec((8,), 2, policy="zigzag").shared_expert == "replicated"
