"""Ranks agree or all fail: a bad input on ONE rank of a round trip gives the
same one-line ValueError on every rank, and no rank is left inside a
collective (the all-reduce after it completes). Real gloo ranks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import agree_tasks
import nsa_cp_comm.agree as agree
from nsa_cp_comm.agree import NOT_A_TENSOR, USABLE, _all_dtypes, _dtype_code, _dtype_text, fingerprint, verdict
from nsa_cp_comm.plan import plan_split
from rank_tasks import answered

CASES = {
    "one_row_too_many": "padded_gather local: rank 1 has 513 rows, the plan expects 512",
    "hidden_size": "ranks disagree on hidden size H: rank 0=8, rank 1=9",
    "dtype_int32": "ranks disagree on dtype: rank 0=torch.float32, rank 1=torch.int32",
    "plan_differs": "ranks passed different plans",
    "numpy": "local on rank 1 is not a torch.Tensor",
    "list": "local on rank 1 is not a torch.Tensor",
    "none": "local on rank 1 is not a torch.Tensor",
    "meta": "local on rank 1 is on the meta device",
    "scatter_rows": "padded_scatter full: rank 1 has 1025 rows, the plan expects 1024",
    "legacy_rows": "legacy_gather local: rank 1 has 501 rows, the plan expects 500",
    # layout is part of the agreement: decided on one rank, refused on every rank
    "expanded_full_rank0": "padded_gather_ full on rank 0 is expanded (a stride of 0",
    "strided_full": "padded_gather_ full on rank 1 is not contiguous",
    "overlapping_full": "padded_gather_ full on rank 1 has rows that overlap in memory",
    # a negative view's memory holds the un-negated values: the collective would gather those
    "neg_view_full": "padded_gather_ full on rank 1 is a lazy negative or conjugate view",
    "neg_view_local": "padded_gather local on rank 1 is a lazy negative or conjugate view",
    "requires_grad_full": "padded_gather_ full on rank 1 requires grad",
    "check_differs_per_rank": "padded_gather_ full on rank 1 is expanded (a stride of 0: its rows share one row's "
                              "memory, so the collective cannot write into it; pass a padded_buffer)",
    "requires_grad_local": "padded_gather local on rank 1 requires grad (the collectives are not differentiable",
    "requires_grad_scatter": "padded_scatter full on rank 1 requires grad",
}


@pytest.mark.parametrize("label", sorted(CASES))
def test_bad_input_on_one_rank_is_the_same_error_on_every_rank(rank_pool, label):
    answers = answered(rank_pool(2).run(agree_tasks.bad_input_on_one_rank, label, timeout_s=60))
    errors = [v["error"] for v in answers]
    assert errors[0] == errors[1], errors  # the same text on every rank
    assert errors[0].startswith("ValueError: ") and CASES[label] in errors[0], errors[0]
    assert "\n" not in errors[0]
    assert [v["after"] for v in answers] == [2, 2]  # nobody was left in a collective


def test_ranks_passing_different_check_values_gather_the_right_rows(rank_pool):
    """check= is no per-rank choice of a collective: with rank 0 checked and rank 1 not, both
    exchange (no agreed() block covers the call) and both gather every rank's rows. Where check
    decided it, rank 0's exchange met rank 1's gather: gloo aborted one and the other returned
    wrong rows."""
    plan = agree_tasks.plan_split([1000], 2, policy="zigzag_page", page_size=64)
    want = [n * agree_tasks.H * (r + 1) for r, n in enumerate(plan.per_rank_tokens)]
    assert answered(rank_pool(2).run(agree_tasks.check_differs_per_rank, timeout_s=60)) == [want, want]


def test_a_tensor_that_requires_grad_is_usable_with_grad_mode_off(rank_pool):
    assert answered(rank_pool(2).run(agree_tasks.grad_off_on_every_rank, timeout_s=60)) == [[80], [80]]


def test_the_layout_verdict_rests_on_the_layout_kind(monkeypatch):
    """The checker broken: with the layout left out of the fingerprint, an
    expanded buffer on one rank reads as usable, every rank enters the
    collective and torch raises on that rank only, mid-collective. The
    rank test above sees the verdict only through this field."""
    plan = plan_split([10], 2, policy="zigzag")
    m = plan.padded_total
    expanded = torch.ones(1, 4).expand(m, 4)
    prints = [agree.fingerprint("f", t, plan, m, in_place=True) for t in (expanded, torch.ones(m, 4))]
    assert prints[0][0] == agree.EXPANDED and "f on rank 0 is expanded" in agree.verdict("f", prints)
    # the out-of-place forms copy their input: an expanded local is fine there
    assert agree.fingerprint("f", expanded, plan, m)[0] == agree.USABLE
    monkeypatch.setattr(agree, "layout_kind", lambda tensor, *, in_place: agree.USABLE)
    broken = [agree.fingerprint("f", expanded, plan, m, in_place=True)] * 2
    assert agree.verdict("f", broken) is None
    for t, kind in ((torch.zeros(4, m).t(), agree.NOT_CONTIGUOUS),
                    (torch.zeros(m + 4).as_strided((m, 4), (1, 1)), agree.OVERLAPPING),
                    (torch.zeros(m, 8)[:, :4], agree.NOT_CONTIGUOUS),
                    (torch.zeros(m, 4).requires_grad_(), agree.REQUIRES_GRAD),
                    (torch._neg_view(torch.zeros(m, 4)), agree.LAZY_VIEW)):
        monkeypatch.undo()
        assert agree.layout_kind(t, in_place=True) == kind, t.stride()


def test_correctness_group_turns_a_mismatched_collective_into_an_error(rank_pool):
    """Without the consistency wrapper gloo aborts the process (SIGABRT)."""
    for value in answered(rank_pool(2).run(agree_tasks.mismatched_collective_on_checked_group, timeout_s=90)):
        assert value.startswith("RuntimeError: Detected mismatch between collectives"), value


def test_verdict_is_decided_from_the_fingerprints_alone():
    plan = plan_split([1000], 2, policy="zigzag_page", page_size=64)
    good = [fingerprint("g", torch.ones(n, 4), plan, n) for n in plan.per_rank_tokens]
    assert all(p[0] == USABLE for p in good) and verdict("g", good) is None
    bad = [good[0], fingerprint("g", [1, 2], plan, 512)]
    assert bad[1][0] == NOT_A_TENSOR
    assert verdict("g", bad) == verdict("g", list(bad)) and "rank 1" in verdict("g", bad)
    swapped = [fingerprint("g", torch.ones(4, 4), plan, 488), good[1]]
    assert "rank 0 has 4 rows, the plan expects 488" in verdict("g", swapped)
    wrong_world = [fingerprint("g", torch.ones(1, 4), plan_split([9], 3, policy="round_robin"), 3)] * 2
    assert "group size 2 != plan.cp_size=3" in verdict("g", wrong_world)


def test_dtype_codes_are_the_same_in_every_process_and_distinct():
    """String hashing differs between processes: codes from it made ranks that
    all passed int16 (or float8, complex64) 'disagree on dtype'."""
    code = ("from nsa_cp_comm.agree import _all_dtypes, _dtype_code; "
            "print(sorted((str(d), _dtype_code(d)) for d in set(_all_dtypes())))")
    outs = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True).stdout)
    assert len(outs) == 1, "dtype codes differ between processes"
    dtypes = set(_all_dtypes())
    assert len({_dtype_code(d) for d in dtypes}) == len(dtypes)
    assert all(_dtype_text(_dtype_code(d)) == str(d) for d in dtypes)


def test_every_dtype_on_every_rank_agrees(rank_pool):
    assert answered(rank_pool(2).run(agree_tasks.every_dtype_on_every_rank, timeout_s=60)) == [{}, {}]


def test_an_agreed_block_costs_one_exchange_and_still_refuses_what_differs(rank_pool):
    """agreed(): one exchange on entry, none for the round trips it covers;
    a disagreement on entry is the same error on every rank, a call with
    another plan or dtype on every rank exchanges as usual, and a rank whose
    own rows are not the plan's, or that passes no tensor, raises (there
    only, before any collective)."""
    pool = rank_pool(2)

    def run(label):
        answers = answered(pool.run(agree_tasks.inside_agreed, label, timeout_s=60))
        assert [v["after"] for v in answers] == [2, 2]
        return answers

    covered = run("covered")
    assert [v["error"] for v in covered] == ["", ""] and [v["exchanges"] for v in covered] == [0, 0]
    for label in ("other_plan", "dtype_int32"):
        values = run(label)
        assert [v["exchanges"] for v in values] == [1, 1] and [v["error"] for v in values] == ["", ""], values
    for label, text in (("entry_plan_differs", "agreed: ranks passed different plans"),
                        ("entry_width_differs", "agreed: ranks disagree on hidden size H: rank 0=8, rank 1=9")):
        errors = [v["error"] for v in run(label)]
        assert errors[0] == errors[1] and errors[0].startswith("ValueError: ") and text in errors[0], errors
    for label, text in (("one_row_too_many", "padded_gather local on this rank has 513 rows, the plan expects 512"),
                        ("none", "padded_gather local on this rank is not a torch.Tensor")):
        errors = [v["error"] for v in run(label)]
        assert errors[0] == "" and errors[1].startswith("ValueError: ") and text in errors[1], errors
