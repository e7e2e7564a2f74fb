"""Each check turned off, the broken path it names gets past it: the checker, not another
check, is what makes the verdict (tests/verdicts.py pairs each verdict with the test that
breaks the thing checked and this one, or another, that breaks the checker).

On the warm pools, each broken path of the checks' own tests (tests/lib/test_checks.py,
tests/lib/test_pad_at_split.py, tests/harness/test_blame.py) run once with its check off on
every rank (``rank_tasks.without_check``: the check's failures dropped). The row must then not
name that check: another check may still catch the path, or none; what the check alone
catches is what it adds.
"""

from __future__ import annotations

import pytest

import broken_impls
import pad_at_split_tasks
from broken_impls import ref as B
from nsa_cp_comm.harness.spec import PointSpec
from rank_tasks import folded, without_check

UNEVEN = dict(seq_lens=(1000,), cp_size=2, policy="zigzag_page", page_size=64)  # n = (488, 512)
EVEN3 = dict(seq_lens=(999,), cp_size=3, policy="zigzag")  # n = (333, 333, 333)
THREE = dict(seq_lens=(1001, 300), cp_size=3, policy="zigzag")  # even n = 434, pad_at_split's P = 438

# check -> (the rank task, where, impls, the row judged, the task's argument, extra spec fields)
CASES = {
    "input_mutated": (broken_impls.point_with_mutation, UNEVEN, (B("mutates_input"),), "none", {}),
    "gather_shape": (broken_impls.point_with_mutation, UNEVEN, (B("drops_last_row"),), "none", {}),
    "gather_rows": (broken_impls.point_with_mutation, UNEVEN, (B("offset_by_one"),), "none", {}),
    "even_bitwise": (broken_impls.point_with_mutation, EVEN3, (B("even_shortcut"),), "none", dict(topk=6)),
    "refusal": (broken_impls.point_with_mutation, UNEVEN, (B("accepts_uneven"),), "none", {}),
    "passthrough": (broken_impls.point_with_mutation, UNEVEN, ("padded",), "passthrough_copies",
                    dict(mode="SCATTERED")),
    "dispatch_rows": (broken_impls.point_with_mutation, UNEVEN, (B("drops_a_row"),), "none", dict(mode="SCATTERED")),
    "physical_len": (pad_at_split_tasks.point_with_mutation, THREE, ("pad_at_split",), "wrong_p_everywhere", {}),
}


@pytest.mark.parametrize("check", sorted(CASES))
def test_a_check_turned_off_lets_its_broken_path_past_it(rank_pool, check):
    task, where, impls, mutation, extra = CASES[check]
    spec = PointSpec(**where, impls=impls, hidden_size=32, dtype="bfloat16", warmup=0, iters=1, **extra)
    got = folded(spec, rank_pool(spec.cp_size).run(without_check, task, spec, "gloo", check, mutation,
                                                   timeout_s=120))
    row = got[impls[0]]
    assert row.failed_check != check, (row.status, row.reason)
