"""Every verdict a matrix point reports can fail: break the thing checked and
the verdict flips (status failed, the check named in failed_check).

Each broken implementation (tests/broken_impls.py) runs by reference, as
outside code does, through the point's rank side as the matrix runs it; the
few parts no implementation can stand in for are patched on the ranks
(``broken_impls.MUTATIONS``).
"""

from __future__ import annotations

import pytest

import broken_impls
from broken_impls import ref as B
from nsa_cp_comm.harness.spec import PointSpec
from rank_tasks import folded

UNEVEN = dict(seq_lens=(1000,), cp_size=2, policy="zigzag_page", page_size=64)  # n = (488, 512)
EVEN = dict(seq_lens=(1000,), cp_size=2, policy="zigzag")  # n = (500, 500)


def run(rank_pool, mutation="none", where=UNEVEN, impls=("padded", "legacy"), mode="FULL", dtype="bfloat16", topk=2):
    spec = PointSpec(**where, impls=impls, mode=mode, hidden_size=32, dtype=dtype, warmup=0, iters=1, topk=topk)
    return folded(spec, rank_pool(spec.cp_size).run(broken_impls.point_with_mutation, spec, "gloo", mutation,
                                                    timeout_s=120))


def test_healthy_points_pass(rank_pool):
    uneven = run(rank_pool)
    assert uneven["padded"].status == "ok" and uneven["padded"].failed_check == ""
    assert uneven["legacy"].status == "refused" and uneven["legacy"].correct
    even = run(rank_pool, where=EVEN)
    assert even["padded"].status == "ok" and even["padded"].even_bitwise_equal is True
    assert even["legacy"].status == "ok"


@pytest.mark.parametrize("broken,where,check", [
    ("offset_by_one", UNEVEN, "gather_rows"), ("offset_by_one", EVEN, "gather_rows"),
    ("dirty_padding", UNEVEN, "padding_zero"), ("chunk_off_by_one", UNEVEN, "scatter_chunk"),
    ("chunk_off_by_one", EVEN, "scatter_chunk"), ("mutates_input", UNEVEN, "input_mutated"),
    ("mutates_input", EVEN, "input_mutated"),
])
def test_broken_padded_path_fails_its_check(rank_pool, broken, where, check):
    rows = run(rank_pool, where=where, impls=(B(broken), "legacy"))
    res = rows[B(broken)]
    assert res.status == "failed" and res.correct is False, res
    assert res.failed_check == check, res.reason
    assert not res.stats  # a failed implementation is never timed
    # each implementation gets its own copy of the rank's rows: the next one (legacy) is unaffected
    assert rows["legacy"].status == ("ok" if where is EVEN else "refused"), rows["legacy"].reason


def test_scatter_chunk_is_byte_exact(rank_pool):
    """One ulp off in the scatter: within the MoE tolerance, caught byte-exact."""
    res = run(rank_pool, where=UNEVEN, impls=(B("one_ulp_off"),))[B("one_ulp_off")]
    assert res.status == "failed" and res.failed_check == "scatter_chunk", res.reason
    assert res.max_rel_err is not None and res.max_rel_err < 1e-2  # the reference check alone would pass


def test_even_bitwise_catches_what_tolerances_allow(rank_pool):
    """A scatter that sums in another precision on even plans: exact on the
    probes, within the MoE tolerance, but not legacy's bits."""
    # topk = all 6 experts: every rank's partial is non-zero, so the order matters
    shortcut = B("even_shortcut")
    res = run(rank_pool, where=dict(EVEN, seq_lens=(999,), cp_size=3), impls=(shortcut,), topk=6)[shortcut]
    assert res.status == "failed" and res.failed_check == "even_bitwise" and res.even_bitwise_equal is False, res
    assert [c for c in ("scatter_chunk", "reference_moe", "gather_rows") if c in res.reason] == []
    uneven = run(rank_pool, where=dict(UNEVEN, cp_size=3), impls=(shortcut,), topk=6)[shortcut]
    assert uneven.status == "ok", uneven.reason  # on uneven plans there are no legacy bits to match


@pytest.mark.parametrize(
    "impl,mutation,says",
    [(B("accepts_uneven"), "none", "accepted an uneven plan"), (B("refuses_late_c10d"), "none", "after issuing"),
     ("legacy", "legacy_wrong_text", "not torch's ValueError text")],
)
def test_refusal_verdict_fails_for_a_wrong_refusal(rank_pool, impl, mutation, says):
    res = run(rank_pool, mutation, impls=(impl,))[impl]
    assert res.status == "failed" and res.failed_check == "refusal" and res.correct is False
    assert says in res.reason, res.reason


def test_scattered_verdicts_fail_when_broken(rank_pool):
    healthy = run(rank_pool, impls=("padded", "a2a"), mode="SCATTERED")
    assert healthy["padded"].status == "passthrough" and healthy["a2a"].status == "ok"
    moved = run(rank_pool, "passthrough_copies", impls=("padded",), mode="SCATTERED")["padded"]
    assert moved.status == "failed" and moved.failed_check == "passthrough"
    dropped = run(rank_pool, impls=(B("drops_a_row"),), mode="SCATTERED")[B("drops_a_row")]
    assert dropped.status == "failed" and dropped.failed_check == "dispatch_rows", dropped.reason


def test_a_short_shard_handed_to_the_library_on_one_rank_is_refused_inside_the_points_agreement(rank_pool):
    """The checks run inside one agreed() block per point: a plug-in that hands
    the library's checked gather one row short on rank 1 is refused there, on
    that rank, before any collective, and its peer is stopped, not left waiting."""
    spec = PointSpec(**UNEVEN, impls=(B("short_on_one_rank"),), hidden_size=32, warmup=0, iters=1)
    results = rank_pool(spec.cp_size).run(broken_impls.point_with_mutation, spec, "gloo", "none", timeout_s=120)
    # (the CP group runs in reverse order of the world: its rank 1 is world rank 0)
    seen = sorted((r.status, r.error) for r in results)
    assert seen[0][0] == "aborted" or seen[0][0] == "error", seen
    assert seen[1][0] == "error" and "padded_gather local on this rank has 511 rows, the plan expects 512" \
        in seen[1][1], seen
