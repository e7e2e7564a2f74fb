"""Every verdict a matrix point reports can fail: break the thing checked and
the verdict flips (status failed, the check named in failed_check).

Each mutation replaces one part of an implementation on every rank (see
tests/check_tasks.py) and runs the point's rank side as the matrix does.
"""

from __future__ import annotations

import pytest

import check_tasks
from nsa_cp_comm.harness.fold import fold_reports
from nsa_cp_comm.harness.spec import PointSpec

UNEVEN = dict(seq_lens=(1000,), cp_size=2, policy="zigzag_page", page_size=64)  # n = (488, 512)
EVEN = dict(seq_lens=(1000,), cp_size=2, policy="zigzag")  # n = (500, 500)


def run(rank_pool, mutation, where=UNEVEN, impls=("padded", "legacy"), mode="FULL", dtype="bfloat16", topk=2):
    spec = PointSpec(**where, impls=impls, mode=mode, hidden_size=32, dtype=dtype, warmup=0, iters=1, topk=topk)
    results = rank_pool(spec.cp_size).run(check_tasks.point_with_mutation, spec, "gloo", mutation, timeout_s=120)
    assert all(r.ok for r in results), [(r.status, r.error) for r in results]
    return {r.impl: r for r in fold_reports(spec, spec.plan(), [r.value for r in results])}


def test_healthy_points_pass(rank_pool):
    uneven = run(rank_pool, "none")
    assert uneven["padded"].status == "ok" and uneven["padded"].failed_check == ""
    assert uneven["legacy"].status == "refused" and uneven["legacy"].correct
    even = run(rank_pool, "none", where=EVEN)
    assert even["padded"].status == "ok" and even["padded"].even_bitwise_equal is True
    assert even["legacy"].status == "ok"


@pytest.mark.parametrize(
    "mutation,where,check",
    [
        ("offset_by_one", UNEVEN, "gather_rows"),
        ("offset_by_one", EVEN, "gather_rows"),
        ("nonzero_pad", UNEVEN, "padding_zero"),
        ("wrong_chunk", UNEVEN, "scatter_chunk"),
        ("wrong_chunk", EVEN, "scatter_chunk"),
        ("mutates_input", UNEVEN, "input_mutated"),
    ],
)
def test_broken_padded_path_fails_its_check(rank_pool, mutation, where, check):
    res = run(rank_pool, mutation, where=where)["padded"]
    assert res.status == "failed" and res.correct is False, res
    assert res.failed_check == check, res.reason
    assert not res.stats  # a failed implementation is never timed


def test_scatter_chunk_is_byte_exact(rank_pool):
    """One ulp off in the scatter: within the MoE tolerance, caught byte-exact."""
    res = run(rank_pool, "one_ulp_off", where=UNEVEN)["padded"]
    assert res.status == "failed" and res.failed_check == "scatter_chunk", res.reason
    assert res.max_rel_err is not None and res.max_rel_err < 1e-2  # the reference check alone would pass


EVEN3 = dict(seq_lens=(999,), cp_size=3, policy="zigzag")


def test_even_bitwise_catches_what_tolerances_allow(rank_pool):
    """A scatter that sums in another order, rounding each step: exact on the
    probes, within the MoE tolerance, but not legacy's bits on an even plan."""
    # topk = all 6 experts: every rank's partial is non-zero, so the order matters
    res = run(rank_pool, "stepwise_sum", where=EVEN3, topk=6)["padded"]
    assert res.status == "failed" and res.failed_check == "even_bitwise" and res.even_bitwise_equal is False, res
    assert [c for c in ("scatter_chunk", "reference_moe", "gather_rows") if c in res.reason] == []
    uneven = run(rank_pool, "stepwise_sum", where=dict(UNEVEN, cp_size=3), topk=6)["padded"]
    assert uneven.status == "ok", uneven.reason  # on uneven plans there are no legacy bits to match


@pytest.mark.parametrize(
    "mutation,says",
    [("legacy_accepts_uneven", "accepted an uneven plan"), ("legacy_refuses_late", "after issuing"),
     ("legacy_wrong_text", "not torch's ValueError text")],
)
def test_refusal_verdict_fails_for_a_wrong_refusal(rank_pool, mutation, says):
    res = run(rank_pool, mutation)["legacy"]
    assert res.status == "failed" and res.failed_check == "refusal" and res.correct is False
    assert says in res.reason, res.reason


def test_scattered_verdicts_fail_when_broken(rank_pool):
    healthy = run(rank_pool, "none", impls=("padded", "a2a"), mode="SCATTERED")
    assert healthy["padded"].status == "passthrough" and healthy["a2a"].status == "ok"
    moved = run(rank_pool, "passthrough_copies", impls=("padded",), mode="SCATTERED")["padded"]
    assert moved.status == "failed" and moved.failed_check == "passthrough"
    dropped = run(rank_pool, "dispatch_drops_a_row", impls=("a2a",), mode="SCATTERED")["a2a"]
    assert dropped.status == "failed" and dropped.failed_check == "dispatch_rows", dropped.reason


def test_an_implementation_that_writes_into_its_input_fails_alone(rank_pool):
    """Each implementation gets its own copy of the rank's rows: one that
    writes into its input fails input_mutated, and the next is unaffected."""
    res = run(rank_pool, "mutates_input", where=EVEN)
    assert res["padded"].status == "failed" and res["padded"].failed_check == "input_mutated"
    assert res["legacy"].status == "ok", res["legacy"].reason
