"""Every plug-in answer is data: a hook that raises, or answers what its
contract does not allow, is that implementation's error row, never an
exception in the process that folds the point's rows, and never another
implementation's row (the CLI sweep: tests/app/test_plugins.py)."""

from __future__ import annotations

import dataclasses

import pytest

import broken_impls
from nsa_cp_comm import hooks, impls, protocol
from nsa_cp_comm.harness.fold import ImplResult
from nsa_cp_comm.harness.measure import run_point
from nsa_cp_comm.harness.spec import PointSpec
from nsa_cp_comm.plan import plan_split

PLAN = plan_split([64], 2, policy="zigzag")


def _impl(name: str) -> protocol.Impl:
    return impls.get(f"tests.broken_impls:{name}")


@pytest.mark.parametrize("name", sorted(broken_impls.BAD_ANSWERS))
def test_a_bad_answer_is_one_line_naming_the_hook_and_the_value(name):
    why = hooks.hook_error(_impl(name), "gloo", PLAN)
    assert broken_impls.BAD_ANSWERS[name] in why and "\n" not in why and len(why) < 300, why


def test_the_builtins_and_good_plugins_answer_well():
    for name in impls.all_of_mode("FULL") + impls.all_of_mode("SCATTERED"):
        assert hooks.hook_error(impls.get(name), "gloo", PLAN) == "", name
    for name in ("skips_cp3", "even_only"):  # a refusal is an answer, not an error
        assert hooks.hook_error(_impl(name), "gloo", plan_split([9], 3, policy="zigzag")) == ""


def test_a_row_stride_is_held_to_its_range():
    """The checker broken (any answer taken as a stride): a stride of 0 is
    the ZeroDivisionError that took the sweep's process down."""
    bad = _impl("stride_zero")
    with pytest.raises(hooks.HookError, match="row_stride"):
        bad.plan_columns(PLAN)
    m = PLAN.max_rank_len
    for stride, ok in ((m, True), (m - 1, False), (m + hooks.MAX_STRIDE_SLACK, True),
                       (m + hooks.MAX_STRIDE_SLACK + 1, False), (True, False), (float(m), False)):
        impl = dataclasses.replace(bad, row_stride=lambda plan, s=stride: s)
        assert (hooks.hook_error(impl, "gloo", PLAN) == "") is ok, stride


def test_without_the_check_a_stride_of_zero_breaks_the_fold(monkeypatch):
    monkeypatch.setattr(protocol, "_valid_stride", lambda impl, plan, stride: stride)
    assert hooks.hook_error(_impl("stride_zero"), "gloo", PLAN).startswith(
        "impl 'tests.broken_impls:stride_zero': its answers about the plan raised ZeroDivisionError")
    with pytest.raises(ZeroDivisionError):
        _impl("stride_zero").plan_columns(PLAN)


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "checker_broken"])
def test_a_bad_answer_costs_its_own_row_and_the_others_run(rank_pool, monkeypatch, checked):
    """With the checker broken (hook_error answers '') the ranks meet the bad
    answer in the implementation's checks; the row is still its own error
    (the ranks' blame), so the point's rows stand on both layers."""
    if not checked:
        monkeypatch.setattr(hooks, "hook_error", lambda impl, backend, plan: "")
    spec = PointSpec((64,), 2, "zigzag", hidden_size=16, iters=2, warmup=0,
                     impls=("tests.broken_impls:stride_zero", "padded", "tests.broken_impls:supports_raises"))
    rows = {r.impl: r for r in run_point(spec, rank_pool(2), timeout_s=120)}
    assert list(rows) == list(spec.impls)
    assert rows["tests.broken_impls:stride_zero"].status == "error", rows
    assert "row_stride(plan) returned 0" in rows["tests.broken_impls:stride_zero"].reason
    assert "supports(plan) raised RuntimeError" in rows["tests.broken_impls:supports_raises"].reason
    assert rows["padded"].status == "ok" and rows["padded"].stats, rows["padded"]
    assert isinstance(rows["padded"], ImplResult)
