"""Property-based tests of the plan and of the padded round trip (hypothesis).

The plan properties hold for every batch; hypothesis draws batches (request
lengths from tiny to long, cp 1..16, page sizes, policies, align multiples)
and, when a property fails, shrinks the batch to the smallest one that still
fails. They run in the normal suite under the bounded ``ci`` profile and,
marked ``fuzz``, with thousands of examples under ``HYPOTHESIS_PROFILE=fuzz``
(tests/conftest.py). The round-trip property runs a few batches on real gloo
ranks. The last tests break the plan on purpose and check that the properties
catch it with a minimal batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("hypothesis", reason="the property tests need hypothesis (the test extra)")
from hypothesis import HealthCheck, find, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import nsa_cp_comm.plan as plan_module
from nsa_cp_comm import (
    POLICIES,
    CPPlan,
    ceil_align,
    legacy_gather,
    padded_buffer,
    padded_gather,
    padded_gather_,
    padded_scatter,
    plan_split,
)
from rank_tasks import int_partial


@dataclass(frozen=True)
class Batch:
    """One drawn input of :func:`plan_split` (its repr is the falsifying example)."""

    seq_lens: list[int]
    cp: int
    policy: str
    page_size: int = 1
    align: int | None = None

    def plan(self) -> CPPlan:
        return plan_split(self.seq_lens, self.cp, policy=self.policy, page_size=self.page_size, align=self.align)


# Tiny lengths give zero-size blocks and zero-row ranks; long ones many pages.
LENGTHS = st.one_of(st.integers(1, 12), st.integers(1, 700), st.integers(500, 5000))
# 1 first: it is where shrinking ends, and it makes zigzag_page equal zigzag.
PAGE_SIZES = st.one_of(st.just(1), st.sampled_from([2, 3, 16, 32, 64, 100, 128]), st.integers(1, 256))


@st.composite
def batches(draw, policies=POLICIES, max_cp: int = 16, max_requests: int = 6, lengths=LENGTHS,
            page_sizes=PAGE_SIZES) -> Batch:
    cp = draw(st.integers(1, max_cp))
    policy = draw(st.sampled_from(policies))
    seq_lens = draw(st.lists(lengths, min_size=1, max_size=max_requests))
    page_size = draw(page_sizes)
    align = draw(st.one_of(st.none(), st.integers(1, 3).map(lambda k: k * cp)))
    return Batch(seq_lens, cp, policy, page_size, align)


# -- an independent transcription of the split, to compare the library against --

def reference_blocks(padded_len: int, cp: int, policy: str, page: int) -> tuple[int, ...]:
    """A request's 2*cp zigzag block lengths: near-equal token counts, or
    near-equal page counts with the block holding the last page shortened."""
    n = 2 * cp
    if policy == "zigzag":
        q, rem = divmod(padded_len, n)
        return tuple(q + (i < rem) for i in range(n))
    if policy == "dual_chunk_swap":  # chunks of ceil(len / n), the last ones short or empty
        size = -(-padded_len // n)
        return tuple(max(0, min(size, padded_len - i * size)) for i in range(n))
    q, rem = divmod(-(-padded_len // page), n)
    # block i ends after i*q + min(i, rem) pages, cut at the request's end
    ends = [min(padded_len, (i * q + min(i, rem)) * page) for i in range(n + 1)]
    return tuple(b - a for a, b in pairwise(ends))


def reference_rank_indices(b: Batch) -> tuple[int, list[list[int]]]:
    """(T, each rank's global token indices in local order): round_robin gives
    token t to rank t % cp; zigzag gives rank k blocks k and 2cp-1-k of every
    request, all "previous" blocks first, then all "next" ones."""
    align = b.cp if b.align is None else b.align
    T = ceil_align(sum(b.seq_lens), align)
    padded = list(b.seq_lens[:-1]) + [b.seq_lens[-1] + T - sum(b.seq_lens)]
    cp = b.cp
    if b.policy == "round_robin":
        return T, [[t for t in range(T) if t % cp == r] for r in range(cp)]
    if b.policy == "contiguous":  # cp slices of ceil(T / cp) tokens of the stream
        size = -(-T // cp)
        return T, [list(range(r * size, min(T, (r + 1) * size))) for r in range(cp)]
    n = 2 * cp
    ranks = []
    for k in range(cp):
        prev, nxt, start = [], [], 0
        for length in padded:
            blk = reference_blocks(length, cp, b.policy, b.page_size)
            bounds = [start + sum(blk[:i]) for i in range(n + 1)]
            if b.policy == "dual_chunk_swap":  # request by request: chunk k, then chunk n-1-k
                prev += [*range(bounds[k], bounds[k + 1]), *range(bounds[n - 1 - k], bounds[n - k])]
            else:
                prev += range(bounds[k], bounds[k + 1])
                nxt += range(bounds[n - 1 - k], bounds[n - k])
            start += length
        ranks.append(prev + nxt)
    return T, ranks


# -- the properties, as plain functions (the broken-plan tests reuse them) ------------

def check_shape_invariants(b: Batch) -> None:
    plan = b.plan()
    align = b.cp if b.align is None else b.align
    T = plan.total_tokens
    assert (plan.cp_size, plan.policy, plan.page_size, plan.align) == (b.cp, b.policy, b.page_size, align)
    assert plan.seq_lens == tuple(b.seq_lens)
    # padding: to a multiple of align, by lengthening the last request only
    assert T % align == 0 and sum(b.seq_lens) <= T < sum(b.seq_lens) + align
    assert plan.padded_lens[:-1] == tuple(b.seq_lens[:-1]) and sum(plan.padded_lens) == T
    assert len(plan.per_rank_tokens) == b.cp and sum(plan.per_rank_tokens) == T
    assert plan.max_rank_len == max(plan.per_rank_tokens)
    assert plan.padded_total == plan.max_rank_len * b.cp >= T
    assert plan.is_even == (plan.padded_total == T)
    assert plan.padding_frac == pytest.approx(1 - T / plan.padded_total)
    assert plan.claim_holds == (plan.padded_total == ceil_align(sum(b.seq_lens), b.cp))


def check_every_token_once(b: Batch) -> None:
    plan = b.plan()
    seen: list[int] = []
    for r in range(b.cp):
        idx = plan.rank_indices(r)
        assert len(idx) == plan.per_rank_tokens[r]
        assert plan.rank_offset(r) == sum(plan.per_rank_tokens[:r])
        seen += idx
    assert sorted(seen) == list(range(plan.total_tokens))


def check_blocks(b: Batch) -> None:
    plan = b.plan()
    cp, n = b.cp, 2 * b.cp
    assert len(plan.blocks) == len(b.seq_lens)
    assert all(x >= 0 for blk in plan.blocks for x in blk)
    if b.policy in ("round_robin", "contiguous"):
        assert all(len(blk) == cp for blk in plan.blocks)
        assert [sum(blk) for blk in plan.blocks] == list(plan.padded_lens)
        assert [sum(blk[r] for blk in plan.blocks) for r in range(cp)] == list(plan.per_rank_tokens)
        if b.policy == "round_robin":
            assert all(t % cp == r for r in range(cp) for t in plan.rank_indices(r))
        else:  # one run of the stream per rank, only the tail rank(s) short
            assert all(list(plan.rank_indices(r)) == list(range(plan.rank_offset(r), plan.rank_offset(r)
                       + plan.per_rank_tokens[r])) for r in range(cp))
            assert list(plan.per_rank_tokens) == sorted(plan.per_rank_tokens, reverse=True)
        return
    for length, blk in zip(plan.padded_lens, plan.blocks):
        assert len(blk) == n and sum(blk) == length
        if b.policy == "zigzag_page":
            # whole pages, except the block holding the request's last page;
            # every block after that one is empty
            last = max(i for i, x in enumerate(blk) if x)
            assert all(blk[i] % b.page_size == 0 for i in range(n) if i != last), blk
            assert all(x == 0 for x in blk[last + 1:]), blk
    for k in range(cp):
        assert plan.per_rank_tokens[k] == sum(blk[k] + blk[n - 1 - k] for blk in plan.blocks)
        idx = plan.rank_indices(k)
        if b.policy == "dual_chunk_swap":  # request by request, each request's rows ascending
            assert list(idx) == sorted(idx)
            continue
        n_prev = sum(blk[k] for blk in plan.blocks)
        assert list(idx[:n_prev]) == sorted(idx[:n_prev]) and list(idx[n_prev:]) == sorted(idx[n_prev:])


def check_matches_reference(b: Batch) -> None:
    plan = b.plan()
    T, want = reference_rank_indices(b)
    assert plan.total_tokens == T
    for r in range(b.cp):
        assert list(plan.rank_indices(r)) == want[r], f"rank {r}"
    if b.policy not in ("round_robin", "contiguous"):
        assert plan.blocks == tuple(reference_blocks(x, b.cp, b.policy, b.page_size) for x in plan.padded_lens)


def check_page_1_is_zigzag(b: Batch) -> None:
    a = plan_split(b.seq_lens, b.cp, policy="zigzag_page", page_size=1, align=b.align)
    z = plan_split(b.seq_lens, b.cp, policy="zigzag", align=b.align)
    assert a.blocks == z.blocks
    assert a.per_rank_tokens == z.per_rank_tokens
    assert all(a.rank_indices(r) == z.rank_indices(r) for r in range(b.cp))


def check_even_and_the_claim(b: Batch) -> None:
    plan = b.plan()
    assert plan.is_even, plan
    assert plan.padded_total == plan.total_tokens and plan.padding_frac == 0.0
    # even, so m*cp == T: the claim holds unless a coarser align padded past ceil_align(S, cp)
    assert plan.claim_holds == (plan.total_tokens == ceil_align(sum(b.seq_lens), b.cp)), plan
    if b.align in (None, b.cp):
        assert plan.claim_holds, plan


PLAN_PROPERTIES = (check_shape_invariants, check_every_token_once, check_blocks, check_matches_reference)


# -- plan properties over random batches ----------------------------------------------

PROPERTY_TESTS = {  # id: (the property, the batches it holds for)
    "shape_invariants": (check_shape_invariants, batches()),
    "every_global_token_on_exactly_one_rank": (check_every_token_once, batches()),
    "blocks": (check_blocks, batches()),
    "plan_matches_reference_transcription": (check_matches_reference, batches()),
    "zigzag_page_with_page_size_1_is_zigzag": (check_page_1_is_zigzag, batches(policies=("zigzag",))),
    "round_robin_is_always_even_and_the_claim_holds": (check_even_and_the_claim, batches(policies=("round_robin",))),
    # one request in 2*cp near-equal blocks, T a multiple of cp: the block
    # sizes differ by one at most, and rank k's pair (k, 2cp-1-k) always sums
    # to the same count
    "single_request_zigzag_is_even_and_the_claim_holds": (check_even_and_the_claim,
                                                          batches(policies=("zigzag",), max_requests=1)),
}


@pytest.mark.fuzz
@pytest.mark.parametrize("check,strategy", list(PROPERTY_TESTS.values()), ids=list(PROPERTY_TESTS))
@given(data=st.data())
def test_plan_property(check, strategy, data):
    check(data.draw(strategy))


# -- where the claim m*cp == ceil_align(T, cp) fails: hypothesis finds the smallest ----

FIND = settings(max_examples=2000, database=None, derandomize=True, deadline=None)


def smallest(strategy, condition) -> Batch:
    return find(strategy, condition, settings=FIND)


def test_claim_fails_for_multi_request_zigzag_smallest_case():
    b = smallest(batches(policies=("zigzag",)), lambda b: not b.plan().claim_holds)
    # two one-token requests on two ranks: both first blocks land on rank 0
    assert b == Batch([1, 1], 2, "zigzag"), b
    assert b.plan().per_rank_tokens == (2, 0)


def test_claim_fails_for_single_request_zigzag_page_smallest_case():
    b = smallest(batches(policies=("zigzag_page",), max_requests=1), lambda b: not b.plan().claim_holds)
    assert len(b.seq_lens) == 1 and b.cp == 2 and b.page_size > 1, b
    assert not b.plan().is_even


def test_strategy_reaches_the_corners():
    # The drawn batches must keep covering what the properties are about.
    corners = {
        "zero-row rank": lambda b: 0 in b.plan().per_rank_tokens,
        "uneven zigzag": lambda b: b.policy == "zigzag" and not b.plan().is_even,
        "uneven zigzag_page, page > 1": lambda b: (b.policy == "zigzag_page" and b.page_size > 1
                                                   and not b.plan().is_even),
        "align 2*cp": lambda b: b.cp > 1 and b.align == 2 * b.cp,
        "cp 16": lambda b: b.cp == 16,
        "many pages": lambda b: b.policy == "zigzag_page" and sum(b.seq_lens) > 40 * b.page_size > 40,
    }
    for name, condition in corners.items():
        assert condition(smallest(batches(), condition)), name


# -- the padded round trip on real gloo ranks -------------------------------------------

def _rows(case: dict, plan: CPPlan, rank: int) -> torch.Tensor:
    """Rank ``rank``'s [n_r, H] rows: column 0 is the global token index + 1
    (so a zero means padding), the rest seeded noise."""
    g = torch.Generator().manual_seed(case["seed"] * 1009 + rank)
    x = torch.randn(plan.per_rank_tokens[rank], case["H"], generator=g)
    x[:, 0] = torch.tensor(plan.rank_indices(rank), dtype=torch.float32) + 1
    return x


def roundtrip_task(case: dict) -> list[str]:
    """On every rank: gather (plain and zero-copy) and scatter, each compared
    with what this rank computes alone from the plan. Returns the failures."""
    rank = dist.get_rank()
    b = Batch(**{k: case[k] for k in ("seq_lens", "cp", "policy", "page_size")})
    plan = b.plan()
    m, n, cp = plan.max_rank_len, plan.per_rank_tokens[rank], plan.cp_size
    fails = []

    expect = torch.zeros(plan.padded_total, case["H"])
    for q in range(cp):
        expect[q * m: q * m + plan.per_rank_tokens[q]] = _rows(case, plan, q)
    local = _rows(case, plan, rank)
    got = padded_gather(local, plan)
    if not torch.equal(got, expect):
        fails.append("padded_gather layout differs from the rank-major padded buffer")
    # The general algorithm, with no even-plan shortcut.
    buf, slot = padded_buffer(plan, case["H"], dtype=torch.float32)
    slot.copy_(local)
    padded_gather_(buf, plan)
    if not torch.equal(buf, expect):
        fails.append("padded_buffer + padded_gather_ differs from the rank-major padded buffer")
    ids = buf[:, 0][buf[:, 0] > 0].to(torch.int64) - 1
    if sorted(ids.tolist()) != list(range(plan.total_tokens)):
        fails.append("gathered rows do not hold every global token exactly once")
    if plan.is_even and not torch.equal(legacy_gather(local, plan), buf):
        fails.append("even plan: the padded buffer is not legacy's [T, H] bit for bit")

    # small integers: the sum is exact in any reduction order
    want = sum(int_partial(case, plan, q) for q in range(cp))[rank * m: rank * m + n]
    out = padded_scatter(int_partial(case, plan, rank), plan)
    if tuple(out.shape) != (n, case["H"]) or not torch.equal(out, want):
        fails.append(f"padded_scatter gave {tuple(out.shape)}, want the summed rows [{rank * m}, {rank * m + n})")
    return fails


ROUNDTRIP_EXAMPLES = max(4, settings.default.max_examples // 10)


@pytest.mark.fuzz
@settings(max_examples=ROUNDTRIP_EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(b=batches(max_cp=4, max_requests=3, lengths=st.integers(1, 300), page_sizes=st.sampled_from([1, 16, 64])),
       hidden=st.sampled_from([1, 8, 33]), seed=st.integers(0, 2**16))
def test_padded_round_trip_on_gloo_ranks(rank_pool, b, hidden, seed):
    # the round trip takes the plan's own padding; align is a plan property
    case = dict(seq_lens=b.seq_lens, cp=b.cp, policy=b.policy, page_size=b.page_size, H=hidden, seed=seed,
                dtype="float32")
    results = rank_pool(b.cp).run(roundtrip_task, case, timeout_s=120)
    assert [r.status for r in results] == ["ok"] * b.cp, [(r.rank, r.status, r.error) for r in results]
    problems = [f"rank {r.rank}: {msg}" for r in results for msg in r.value]
    assert not problems, problems


# -- a broken plan is caught, and shrunk to a minimal batch ------------------------------

def _page_blocks_one_page_late(length: int, n: int, page_size: int) -> tuple[int, ...]:
    """The real page blocks with one page moved from the first block to the
    second: every invariant of sizes still holds, the layout is wrong."""
    out = list(_REAL_PAGE_BLOCKS(length, n, page_size))
    if n > 1 and out[0] >= page_size:
        out[0] -= page_size
        out[1] += page_size
    return tuple(out)


_REAL_PAGE_BLOCKS = plan_module._page_blocks


def _fails(check, b: Batch) -> bool:
    try:
        check(b)
    except AssertionError:
        return True
    return False


def as_property(check, strategy):
    """``check`` as a hypothesis test, under the active profile."""
    return settings(report_multiple_bugs=False)(given(strategy)(check))


def test_broken_page_blocks_are_caught_with_a_minimal_batch(monkeypatch):
    monkeypatch.setattr(plan_module, "_page_blocks", _page_blocks_one_page_late)
    # The properties fail as their tests would (the same check, the same
    # strategy; one failure reported, not one per failing line, so it is the
    # smallest) ...
    with pytest.raises(AssertionError) as info:
        as_property(check_matches_reference, batches())()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "check_matches_reference(" in notes and "Batch(" in notes, notes
    with pytest.raises(AssertionError):
        as_property(check_page_1_is_zigzag, batches(policies=("zigzag",)))()
    # ... and the shrunk counterexample is the smallest batch there is: one
    # one-token request on one rank, pages of one token.
    b = smallest(batches(), lambda b: any(_fails(check, b) for check in PLAN_PROPERTIES))
    assert b == Batch([1], 1, "zigzag_page", 1, None), b
    assert f"seq_lens={b.seq_lens!r}" in notes and "cp=1" in notes, notes
    # ... which fails for the breakage alone: with the real page blocks it passes
    monkeypatch.undo()
    assert [check.__name__ for check in (*PLAN_PROPERTIES, check_page_1_is_zigzag) if _fails(check, b)] == []
