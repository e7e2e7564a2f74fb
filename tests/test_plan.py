"""plan_split (SPEC section 2): worked examples, invariants over random batches,
and bad input. Pure Python, no ranks."""

from __future__ import annotations

import random

import pytest

from nsa_cp_comm import POLICIES, CPPlan, ceil_align, plan_split


# -- an independent transcription of SPEC 2, to compare the library against --

def spec_blocks(padded_len: int, cp: int, policy: str, page: int) -> tuple[int, ...]:
    n = 2 * cp
    if policy == "zigzag":
        q, rem = divmod(padded_len, n)
        return tuple(q + (i < rem) for i in range(n))
    pages = -(-padded_len // page)
    q, rem = divmod(pages, n)
    out, left = [], padded_len
    for i in range(n):
        tokens = min((q + (i < rem)) * page, left)
        out.append(tokens)
        left -= tokens
    return tuple(out)


def spec_rank_indices(seq_lens, cp, policy, page, align) -> tuple[int, list[list[int]]]:
    """(T, per-rank global indices in local order), straight from SPEC 2."""
    T = -(-sum(seq_lens) // align) * align
    padded = list(seq_lens[:-1]) + [seq_lens[-1] + T - sum(seq_lens)]
    if policy == "round_robin":
        return T, [[t for t in range(T) if t % cp == r] for r in range(cp)]
    n = 2 * cp
    ranks = []
    for k in range(cp):
        prev, nxt, start = [], [], 0
        for length in padded:
            blk = spec_blocks(length, cp, policy, page)
            bounds = [start + sum(blk[:i]) for i in range(n + 1)]
            prev += range(bounds[k], bounds[k + 1])
            nxt += range(bounds[n - 1 - k], bounds[n - k])
            start += length
        ranks.append(prev + nxt)
    return T, ranks


def random_case(rng: random.Random, policy: str | None = None):
    cp = rng.randint(1, 8)
    page = rng.choice([1, 1, 2, 3, 16, 32, 64, 100, 128, rng.randint(1, 128)])
    kind = rng.random()
    if kind < 0.3:
        lens = [rng.randint(1, 12) for _ in range(rng.randint(1, 6))]  # tiny: zero-size blocks
    elif kind < 0.8:
        lens = [rng.randint(1, 700) for _ in range(rng.randint(1, 5))]
    else:
        lens = [rng.randint(500, 5000) for _ in range(rng.randint(1, 3))]
    align = rng.choice([None, cp, 2 * cp])
    return lens, cp, policy or rng.choice(POLICIES), page, align


RANDOM_CASES = [random_case(random.Random(1000 + i), POLICIES[i % 3]) for i in range(450)]


# -- worked examples (SPEC 2.4) ----------------------------------------------

def test_zigzag_page_single_request_1000_tokens():
    plan = plan_split([1000], 2, policy="zigzag_page", page_size=64)
    assert plan.total_tokens == 1000
    assert plan.blocks == ((256, 256, 256, 232),)
    assert plan.per_rank_tokens == (488, 512)
    assert plan.max_rank_len == 512
    assert plan.padded_total == 1024
    assert plan.is_even is False
    assert plan.claim_holds is False
    assert plan.padding_frac == pytest.approx(1 - 1000 / 1024)
    # rank 0 holds blocks 0 and 3, rank 1 blocks 1 and 2
    assert plan.rank_indices(0) == tuple(range(0, 256)) + tuple(range(768, 1000))
    assert plan.rank_indices(1) == tuple(range(256, 768))


def test_zigzag_two_requests_1001_300():
    plan = plan_split([1001, 300], 2, policy="zigzag")
    assert plan.total_tokens == 1302
    assert plan.padded_lens == (1001, 301)
    assert plan.blocks == ((251, 250, 250, 250), (76, 75, 75, 75))
    assert plan.per_rank_tokens == (652, 650)
    assert plan.max_rank_len == 652
    assert plan.padded_total == 1304
    assert not plan.is_even
    assert not plan.claim_holds
    # local order: prev blocks of every request, then next blocks
    r0 = plan.rank_indices(0)
    assert r0 == (tuple(range(0, 251)) + tuple(range(1001, 1077))
                  + tuple(range(751, 1001)) + tuple(range(1227, 1302)))
    assert plan.rank_offset(0) == 0 and plan.rank_offset(1) == 652


def test_padding_lengthens_only_the_last_request():
    plan = plan_split([5, 7, 3], 4, policy="zigzag")
    assert plan.total_tokens == 16 and plan.padded_lens == (5, 7, 4)
    plan = plan_split([5, 7, 3], 4, policy="zigzag", align=8)
    assert plan.total_tokens == 16 and plan.padded_lens == (5, 7, 4) and plan.align == 8
    plan = plan_split([5, 7, 5], 4, policy="round_robin", align=8)
    assert plan.total_tokens == 24 and plan.padded_lens == (5, 7, 12)


def test_round_robin_owner_is_token_mod_cp():
    plan = plan_split([3, 4], 3, policy="round_robin")
    assert plan.total_tokens == 9
    assert plan.rank_indices(0) == (0, 3, 6)
    assert plan.rank_indices(1) == (1, 4, 7)
    assert plan.rank_indices(2) == (2, 5, 8)
    # per-request counts: request 0 = tokens 0..2, request 1 = tokens 3..8
    assert plan.blocks == ((1, 1, 1), (2, 2, 2))
    plan = plan_split([2, 7], 3, policy="round_robin")
    assert plan.blocks == ((1, 1, 0), (2, 2, 3))


def test_zero_row_rank_example():
    plan = plan_split([1], 4, policy="zigzag")
    assert plan.total_tokens == 4 and plan.blocks == ((1, 1, 1, 1, 0, 0, 0, 0),)
    assert plan.per_rank_tokens == (1, 1, 1, 1)
    plan = plan_split([1, 1], 4, policy="zigzag")
    assert plan.blocks == ((1, 0, 0, 0, 0, 0, 0, 0), (1, 1, 1, 0, 0, 0, 0, 0))
    assert plan.per_rank_tokens == (2, 1, 1, 0)
    assert plan.rank_indices(3) == ()
    plan = plan_split([10], 2, policy="zigzag_page", page_size=64)
    assert plan.blocks == ((10, 0, 0, 0),) and plan.per_rank_tokens == (10, 0)
    assert plan.padded_total == 20 and plan.padding_frac == pytest.approx(0.5)


def test_zigzag_page_last_page_block_shortened_and_later_blocks_empty():
    # 72 tokens = 5 pages of 16 over 8 blocks: blocks 0..3 one full page each,
    # block 4 holds the last (8-token) page, blocks 5..7 are empty
    plan = plan_split([70], 4, policy="zigzag_page", page_size=16, align=4)
    assert plan.total_tokens == 72
    assert plan.blocks == ((16, 16, 16, 16, 8, 0, 0, 0),)
    assert plan.per_rank_tokens == (16, 16, 16, 24)


# -- claims that do / do not hold (SPEC 2.4) ----------------------------------

@pytest.mark.parametrize("seed", range(60))
def test_round_robin_always_even_and_claim_holds(seed):
    rng = random.Random(seed)
    lens, cp, _, page, _ = random_case(rng)
    plan = plan_split(lens, cp, policy="round_robin", page_size=page)
    assert plan.is_even and plan.claim_holds
    assert plan.padded_total == plan.total_tokens == ceil_align(sum(lens), cp)
    assert plan.padding_frac == 0.0


@pytest.mark.parametrize("seed", range(60))
def test_single_request_zigzag_even_and_claim_holds(seed):
    rng = random.Random(seed)
    cp = rng.randint(1, 8)
    length = rng.choice([rng.randint(1, 20), rng.randint(1, 10_000)])
    plan = plan_split([length], cp, policy="zigzag")
    assert plan.is_even, plan
    assert plan.claim_holds, plan
    assert plan.padded_total == ceil_align(length, cp)


def test_claims_fail_somewhere_for_multi_request_zigzag_and_zigzag_page():
    rng = random.Random(7)
    zig = [plan_split([rng.randint(1, 900) for _ in range(3)], 4, policy="zigzag") for _ in range(100)]
    page = [plan_split([rng.randint(1, 900)], 4, policy="zigzag_page", page_size=64) for _ in range(100)]
    assert any(not p.claim_holds for p in zig) and any(not p.is_even for p in zig)
    assert any(not p.claim_holds for p in page) and any(not p.is_even for p in page)
    # and claim_holds is exactly the SPEC formula, never assumed
    for p in zig + page:
        assert p.claim_holds == (p.max_rank_len * p.cp_size == ceil_align(sum(p.seq_lens), p.cp_size))


@pytest.mark.parametrize("seed", range(60))
def test_zigzag_page_with_page_size_1_equals_zigzag(seed):
    lens, cp, _, _, align = random_case(random.Random(seed))
    a = plan_split(lens, cp, policy="zigzag_page", page_size=1, align=align)
    b = plan_split(lens, cp, policy="zigzag", align=align)
    assert a.blocks == b.blocks
    assert a.per_rank_tokens == b.per_rank_tokens
    assert all(a.rank_indices(r) == b.rank_indices(r) for r in range(cp))


# -- invariants over many random batches -------------------------------------

@pytest.mark.parametrize("lens,cp,policy,page,align", RANDOM_CASES)
def test_invariants(lens, cp, policy, page, align):
    plan = plan_split(lens, cp, policy=policy, page_size=page, align=align)
    a = cp if align is None else align
    T = plan.total_tokens
    assert isinstance(plan, CPPlan)
    assert (plan.cp_size, plan.policy, plan.page_size, plan.align) == (cp, policy, page, a)
    assert plan.seq_lens == tuple(lens)
    assert T % a == 0 and sum(lens) <= T < sum(lens) + a
    assert plan.padded_lens[:-1] == tuple(lens[:-1]) and sum(plan.padded_lens) == T
    assert len(plan.per_rank_tokens) == cp and sum(plan.per_rank_tokens) == T
    assert plan.max_rank_len == max(plan.per_rank_tokens)
    assert plan.padded_total == plan.max_rank_len * cp >= T
    assert plan.is_even == (plan.padded_total == T)
    assert plan.padding_frac == pytest.approx(1 - T / plan.padded_total)

    # every token on exactly one rank, in the SPEC's order
    _, want = spec_rank_indices(lens, cp, policy, page, a)
    seen = []
    for r in range(cp):
        idx = plan.rank_indices(r)
        assert len(idx) == plan.per_rank_tokens[r]
        assert list(idx) == want[r]
        assert plan.rank_offset(r) == sum(plan.per_rank_tokens[:r])
        seen += idx
    assert sorted(seen) == list(range(T))

    assert len(plan.blocks) == len(lens)
    assert all(b >= 0 for blk in plan.blocks for b in blk)
    if policy == "round_robin":
        assert all(len(blk) == cp for blk in plan.blocks)
        assert [sum(blk) for blk in plan.blocks] == list(plan.padded_lens)
        assert all(t % cp == r for r in range(cp) for t in plan.rank_indices(r))
        return
    n = 2 * cp
    for length, blk in zip(plan.padded_lens, plan.blocks):
        assert len(blk) == n and sum(blk) == length
        assert blk == spec_blocks(length, cp, policy, page)
        if policy == "zigzag_page":
            nonempty = [i for i, b in enumerate(blk) if b]
            last = nonempty[-1]
            assert all(blk[i] % page == 0 for i in range(n) if i != last)
            assert all(b == 0 for b in blk[last + 1 :])
    for k in range(cp):
        assert plan.per_rank_tokens[k] == sum(b[k] + b[n - 1 - k] for b in plan.blocks)
        idx = plan.rank_indices(k)
        n_prev = sum(b[k] for b in plan.blocks)
        prev, nxt = idx[:n_prev], idx[n_prev:]
        assert list(prev) == sorted(prev) and list(nxt) == sorted(nxt)
        assert len(set(idx)) == len(idx)


def test_random_cases_cover_what_matters():
    """The random batches above must keep covering the interesting corners."""
    plans = [plan_split(lens, cp, policy=p, page_size=pg, align=a) for lens, cp, p, pg, a in RANDOM_CASES]
    assert {p.policy for p in plans} == set(POLICIES)
    assert {p.cp_size for p in plans} == set(range(1, 9))
    assert any(0 in p.per_rank_tokens for p in plans)
    assert any(not p.is_even for p in plans if p.policy == "zigzag")
    assert any(not p.is_even for p in plans if p.policy == "zigzag_page")
    assert any(p.page_size > 1 and p.policy == "zigzag_page" for p in plans)
    assert any(p.align == 2 * p.cp_size and p.cp_size > 1 for p in plans)
    assert len(plans) >= 300


def test_plan_is_deterministic_and_frozen():
    a = plan_split([1001, 300], 2, policy="zigzag")
    assert a == plan_split((1001, 300), 2, policy="zigzag")
    with pytest.raises(AttributeError):
        a.cp_size = 3  # type: ignore[misc]


@pytest.mark.parametrize("rank", [-1, 2, 2.0, True, "0"])
def test_rank_indices_rejects_bad_rank(rank):
    plan = plan_split([1001, 300], 2, policy="zigzag")
    with pytest.raises(ValueError, match="rank"):
        plan.rank_indices(rank)
    with pytest.raises(ValueError, match="rank"):
        plan.rank_offset(rank)


# -- bad input (issue 2 item 2) ------------------------------------------------

GOOD = dict(seq_lens=[100, 200], cp_size=2, policy="zigzag")

BAD = [
    # (override, argument named, value shown)
    (dict(seq_lens=[]), "seq_lens", "[]"),
    (dict(seq_lens=[100, 0]), "seq_lens", "0"),
    (dict(seq_lens=[-5]), "seq_lens", "-5"),
    (dict(seq_lens=[100, 2.5]), "seq_lens", "2.5"),
    (dict(seq_lens=[100, 200.0]), "seq_lens", "200.0"),
    (dict(seq_lens=[True, 3]), "seq_lens", "True"),
    (dict(seq_lens=["100"]), "seq_lens", "'100'"),
    (dict(seq_lens=None), "seq_lens", "None"),
    (dict(seq_lens="100"), "seq_lens", "'100'"),
    (dict(seq_lens=100), "seq_lens", "100"),
    (dict(cp_size=0), "cp_size", "0"),
    (dict(cp_size=-2), "cp_size", "-2"),
    (dict(cp_size=2.0), "cp_size", "2.0"),
    (dict(cp_size=True), "cp_size", "True"),
    (dict(cp_size="2"), "cp_size", "'2'"),
    (dict(page_size=0), "page_size", "0"),
    (dict(page_size=-64), "page_size", "-64"),
    (dict(page_size=1.5), "page_size", "1.5"),
    (dict(page_size=True), "page_size", "True"),
    (dict(align=3), "align", "3"),
    (dict(align=1), "align", "1"),
    (dict(align=0), "align", "0"),
    (dict(align=-4), "align", "-4"),
    (dict(align=4.0), "align", "4.0"),
    (dict(align=True), "align", "True"),
    (dict(policy="zigzag-page"), "policy", "'zigzag-page'"),
    (dict(policy="ZIGZAG"), "policy", "'ZIGZAG'"),
    (dict(policy=None), "policy", "None"),
]


@pytest.mark.parametrize("override,arg,shown", BAD, ids=[f"{a}={s}" for _, a, s in BAD])
def test_bad_input_names_argument_and_value(override, arg, shown):
    kw = {**GOOD, **override}
    seq_lens, cp = kw.pop("seq_lens"), kw.pop("cp_size")
    with pytest.raises(ValueError) as info:
        plan_split(seq_lens, cp, **kw)
    msg = str(info.value)
    assert arg in msg, msg
    assert shown in msg, msg


def test_bad_policy_message_lists_valid_ones():
    with pytest.raises(ValueError) as info:
        plan_split([10], 2, policy="stripes")
    assert all(p in str(info.value) for p in POLICIES)


def test_good_edge_inputs_are_accepted():
    assert plan_split([1], 1, policy="round_robin").per_rank_tokens == (1,)
    assert plan_split((1,) * 5, 8, policy="zigzag_page", page_size=128, align=16).total_tokens == 16
    assert plan_split([3], 2, policy="zigzag", align=None).align == 2
