"""Every timed iteration is checked against a reference the implementation
cannot touch (nsa_cp_comm.harness.verify): timed forms that cheat fail on
every point they run, and pass once the check is off."""

from __future__ import annotations

import pytest
import torch

import broken_impls
from nsa_cp_comm.harness import PointSpec, run_point
from nsa_cp_comm.harness.measure import point_on_rank
from nsa_cp_comm.harness.phases import PHASES_KEY, PhaseClock
from nsa_cp_comm.harness.spec import shard_seed
from nsa_cp_comm.harness.verify import TimedCheck, _amplitude
from nsa_cp_comm.impls import get
from nsa_cp_comm.plan import plan_split

CHEATS = tuple(f"tests.broken_impls:{name}" for name in broken_impls.CHEATS)
DISPATCH_CHEATS = tuple(f"tests.broken_impls:{name}" for name in broken_impls.DISPATCH_CHEATS)
HONEST = ("padded", "legacy", "pad_at_split", "padded_zero_copy", "sumlen_allreduce")


def _run(rank_pool, cp, lens, *, verify=True, dtype="bfloat16", dispatch=False):
    """A point's rows: the honest implementations and the cheats (``dispatch``: a2a's, SCATTERED)."""
    kw = (dict(mode="SCATTERED", impls=("a2a", *DISPATCH_CHEATS), iters=6) if dispatch
          else dict(impls=(*HONEST, *CHEATS), iters=12))
    spec = PointSpec(lens, cp, policy="zigzag", hidden_size=32, dtype=dtype, warmup=1, **kw)
    return {r.impl: r for r in run_point(spec, rank_pool(cp), timeout_s=120, verify=verify)}


def _honest_pass_cheats_fail(rows, honest, cheats):
    for name in honest:
        assert rows[name].status in ("ok", "refused"), (name, rows[name].reason)
    for name in cheats:
        r = rows[name]
        assert (r.status, r.failed_check) == ("failed", "production_form"), (name, r.status, r.reason)
        assert "iterations of the timed loop" in r.reason and not r.stats, (name, r.reason)


@pytest.mark.parametrize("cp, lens, dtype", [(2, (4, 4), "bfloat16"), (2, (3, 3), "float32"),
                                             (3, (1001, 300), "bfloat16")])
def test_a_timed_form_that_cheats_fails_and_the_honest_ones_pass(rank_pool, cp, lens, dtype):
    rows = _run(rank_pool, cp, lens, dtype=dtype)
    _honest_pass_cheats_fail(rows, HONEST, CHEATS)
    # The count is of wrong iterations, out of all of them (warm-up included).
    assert "wrong in 1 of 13 iterations" in rows["tests.broken_impls:rare_corruption"].reason
    assert "wrong in 2 of 13 iterations" in rows["tests.broken_impls:idle_between"].reason
    # the loop's last iteration is checked as every other is
    last = rows["tests.broken_impls:last_only"].reason
    assert "wrong in 1 of 13 iterations" in last and "iteration 12 (timed 11)" in last, last
    zeroed = rows["tests.broken_impls:zeroes_caller"].reason
    assert "the caller's rows changed during the round trip" in zeroed


def _check(impl="padded", dtype=torch.bfloat16, rank=1, seed=3):
    """The check of ``impl`` (a name or an implementation) on ``rank``, its plan, its shards (seeded by seed and
    rank as the harness's: only the implementation tells two checks apart), a local shard and a partials buffer."""
    impl = get(impl) if isinstance(impl, str) else impl
    plan = plan_split((5, 3, 9), 4, policy="zigzag")
    shards = [torch.randn(n, 16, generator=torch.Generator().manual_seed(shard_seed(seed, r))).to(dtype)
              for r, n in enumerate(plan.per_rank_tokens)]
    local = torch.full((impl.shard_rows(plan, rank), 16), 7.0, dtype=dtype)
    partials = torch.empty((impl.buffer_rows(plan), 16), dtype=dtype)
    return TimedCheck(impl, plan, rank, shards, 16, seed, "cpu", warmup=1), plan, shards, local, partials


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_iteration_has_new_inputs_and_every_element_changes(dtype):
    check, _, shards, local, partials = _check(dtype=dtype)
    seen_local, seen_partials = [], []
    for it in range(20):
        check.inputs(it, local, partials)
        # XOR of the sign and low mantissa bits: every element changed, none made infinite or NaN
        assert bool((local.view(check.int_dtype) != shards[1].view(check.int_dtype)).all())
        assert bool(torch.isfinite(local).all())
        assert all(not torch.equal(local, x) for x in seen_local)
        assert all(not torch.equal(partials, x) for x in seen_partials)
        seen_local.append(local.clone())
        seen_partials.append(partials.clone())


def test_the_draws_differ_between_implementations():
    a, _, shards_a, la, pa = _check(impl="padded")
    b, _, shards_b, lb, pb = _check(impl="padded_zero_copy")
    assert all(torch.equal(x, y) for x, y in zip(shards_a, shards_b))  # the same rows: only the draws can differ
    a.inputs(0, la, pa)
    b.inputs(0, lb, pb)
    assert not torch.equal(la, lb)  # no memo shared by two names of one plug-in can answer


@pytest.mark.parametrize("cp", [2, 3, 8, 16, 64, 128])
def test_the_partials_sum_exactly_in_bfloat16_at_any_cp(cp):
    # A rank's value is at most 2 * amplitude eighths; the sum over cp ranks
    # must stay within bfloat16's exact integers (256) in any order.
    amp = _amplitude(cp)
    assert amp >= 1 and 2 * amp * cp <= 256
    worst = torch.full((cp,), 2 * amp / 8, dtype=torch.bfloat16)
    acc = torch.zeros((), dtype=torch.bfloat16)
    for x in worst:
        acc = acc + x
    assert float(acc) == 2 * amp * cp / 8


def test_a_wrong_gather_a_wrong_scatter_and_a_changed_caller_are_each_counted():
    check, plan, _, local, partials = _check()
    m = plan.max_rank_len

    def right_gather():
        full = torch.zeros((m * plan.cp_size, 16), dtype=torch.bfloat16)
        for r in range(plan.cp_size):
            full[r * m : r * m + plan.per_rank_tokens[r]].view(check.int_dtype).copy_(
                torch.bitwise_xor(check.shards[r], check.masks[r]))
        return full

    def right_scatter():
        return check.expected_sum().clone()

    check.inputs(0, local, partials)
    check.gathered(0, right_gather())
    check.scattered(0, right_scatter(), local)
    assert check.reason(3) == ""
    check.inputs(1, local, partials)
    stale = right_gather()
    check.inputs(2, local, partials)
    check.gathered(2, stale)  # the previous iteration's buffer
    out = right_scatter()
    out[0, 0] += 0.125
    local[0, 0] = 0
    check.scattered(2, out, local)
    reason = check.reason(3)
    assert reason.startswith("wrong in 1 of 3 iterations"), reason
    assert "gathered rows of rank 0" in reason and "scatter output: 1 of" in reason
    assert "the caller's rows changed" in reason


def test_a_point_reports_where_its_time_went(rank_pool):
    # benchmarks/point_phases.py reads these: each phase's seconds and collectives.
    spec = PointSpec((5, 3), 2, policy="zigzag", impls=("padded", "legacy"), hidden_size=16, warmup=1, iters=2)
    for r in rank_pool(2).run(point_on_rank, spec, "gloo", timeout_s=120):
        phases = r.value[PHASES_KEY]
        assert set(phases) == {"setup", "checks", "agreement", "prepare", "timed loop", "of which A/A control",
                               "of which verification"}, phases
        assert phases["agreement"]["collectives"] == 1
        # per iteration: a barrier per phase (padded 2 on this even plan, where it stages nothing, legacy 2,
        # the control 2; each turn's first on the fence group) and six collectives (a gather and a scatter each)
        assert spec.plan().is_even
        assert phases["timed loop"]["collectives"] == (1 + 2) * (6 + 6), phases
        assert phases["checks"]["collectives"] > 0 and all(v["s"] >= 0 for v in phases.values())
    clock = PhaseClock()
    clock.lap("a")
    clock.lap("b")
    clock.add("a", 1.0, 2)
    assert clock.report()["a"]["s"] >= 1.0 and clock.report()["a"]["collectives"] == 2


# --- dispatch implementations (SCATTERED mode) ---------------------------------------

@pytest.mark.parametrize("cp, lens, dtype", [(2, (7, 4), "bfloat16"), (4, (1001, 300), "float32")])
def test_a_dispatch_that_cheats_in_its_timed_calls_fails_and_a2a_passes(rank_pool, cp, lens, dtype):
    rows = _run(rank_pool, cp, lens, dtype=dtype, dispatch=True)
    _honest_pass_cheats_fail(rows, ("a2a",), DISPATCH_CHEATS)
    assert "received rows are not" in rows["tests.broken_impls:a2a_memoised"].reason
    assert "routing weights" in rows["tests.broken_impls:a2a_cached_routing"].reason
    assert "wrong in 2 of 7 iterations" in rows["tests.broken_impls:a2a_idle_combine"].reason
    assert "the caller's rows changed" in rows["tests.broken_impls:a2a_zeroes_caller"].reason


@pytest.mark.parametrize("dispatch, lens, cheats", [(False, (3, 3), CHEATS), (True, (7, 4), DISPATCH_CHEATS)],
                         ids=["round_trip", "dispatch"])
def test_without_the_check_every_cheat_would_pass(rank_pool, dispatch, lens, cheats):
    # The verdicts above come from the check of every timed iteration: with it
    # off, the same forms (padded's checked calls) are ok.
    rows = _run(rank_pool, 2, lens, verify=False, dispatch=dispatch)
    for name in cheats:
        assert rows[name].status == "ok", (name, rows[name].reason)


def test_a_padded_shard_is_checked_padding_rows_included():
    # shard="padded": [P, H] in and out; the partials' padding rows are zero, so
    # the scatter's padding rows must come back zero, and the caller's padding stay zero
    impl = get("pad_at_split").__class__("padded_shard", lambda *a: None, lambda *a: None, shard="padded")
    check, plan, _, local, partials = _check(impl)  # n = 5 on every rank, P = ceil_align(5, 8) = 8
    p, n = impl.stride(plan), plan.per_rank_tokens[1]
    assert p > max(plan.per_rank_tokens) and local.shape == (p, 16)
    check.inputs(0, local, partials)
    assert bool(local[n:].eq(0).all()) and bool(local[:n].ne(0).any())
    for r, k in enumerate(plan.per_rank_tokens):
        assert bool(partials[r * p + k : (r + 1) * p].eq(0).all())
    right = torch.zeros((p, 16), dtype=torch.bfloat16)
    right[:n] = check.expected_sum()
    check.scattered(0, right, local)
    assert check.reason(3) == ""
    check.inputs(1, local, partials)
    dirty = torch.zeros((p, 16), dtype=torch.bfloat16)
    dirty[:n] = check.expected_sum()
    dirty[p - 1, 0] = 1.0
    check.scattered(1, dirty, local)
    assert "scatter output: padding rows of the [8, H] shard are not zero" in check.reason(3)
    check.inputs(2, local, partials)
    right = torch.zeros((p, 16), dtype=torch.bfloat16)
    right[:n] = check.expected_sum()
    local[n, 0] = 1.0  # the caller's padding row written
    check.scattered(2, right, local)
    assert "iteration 2 (timed 1): the caller's rows changed" in check.reason(3)
    check.scattered(2, right[:n].clone(), local)  # the [n_r, H] protocol's answer
    assert f"scatter output: shape ({n}, 16), not ({p}, 16)" in check.reason(3)
