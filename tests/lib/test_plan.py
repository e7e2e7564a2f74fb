"""plan_split: worked examples and bad input. Pure Python, no ranks.

The invariants over arbitrary batches (every token on exactly one rank, block
shapes, the even cases, when the claim ``m*cp == ceil_align(T, cp)`` holds) are
hypothesis properties in test_properties.py.
"""

from __future__ import annotations

import pytest

from nsa_cp_comm import POLICIES, plan_split


# -- worked examples -----------------------------------------------------------

def test_zigzag_page_single_request_1000_tokens():
    plan = plan_split([1000], 2, policy="zigzag_page", page_size=64)
    assert (plan.total_tokens, plan.blocks, plan.per_rank_tokens) == (1000, ((256, 256, 256, 232),), (488, 512))
    assert (plan.max_rank_len, plan.padded_total) == (512, 1024)
    assert plan.is_even is False and plan.claim_holds is False
    assert plan.padding_frac == pytest.approx(1 - 1000 / 1024)
    # rank 0 holds blocks 0 and 3, rank 1 blocks 1 and 2
    assert plan.rank_indices(0) == tuple(range(0, 256)) + tuple(range(768, 1000))
    assert plan.rank_indices(1) == tuple(range(256, 768))


def test_zigzag_two_requests_1001_300():
    plan = plan_split([1001, 300], 2, policy="zigzag")
    assert (plan.total_tokens, plan.padded_lens) == (1302, (1001, 301))
    assert plan.blocks == ((251, 250, 250, 250), (76, 75, 75, 75))
    assert (plan.per_rank_tokens, plan.max_rank_len, plan.padded_total) == ((652, 650), 652, 1304)
    assert not plan.is_even and not plan.claim_holds
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
    assert [plan.rank_indices(r) for r in range(3)] == [(0, 3, 6), (1, 4, 7), (2, 5, 8)]
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
    assert plan.total_tokens == 72 and plan.blocks == ((16, 16, 16, 16, 8, 0, 0, 0),)
    assert plan.per_rank_tokens == (16, 16, 16, 24)


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


# -- bad input ------------------------------------------------------------------

GOOD = dict(seq_lens=[100, 200], cp_size=2, policy="zigzag")

# the arguments other than seq_lens, each value shown as its repr
BAD_VALUES = {
    "cp_size": [0, -2, 2.0, True, "2"],
    "page_size": [0, -64, 1.5, True],
    "align": [3, 1, 0, -4, 4.0, True],
    "policy": ["zigzag-page", "ZIGZAG", None],
}

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
    *[({arg: value}, arg, repr(value)) for arg, values in BAD_VALUES.items() for value in values],
]


@pytest.mark.parametrize("override,arg,shown", BAD, ids=[f"{a}={s}" for _, a, s in BAD])
def test_bad_input_names_argument_and_value(override, arg, shown):
    kw = {**GOOD, **override}
    seq_lens, cp = kw.pop("seq_lens"), kw.pop("cp_size")
    with pytest.raises(ValueError) as info:
        plan_split(seq_lens, cp, **kw)
    assert arg in str(info.value) and shown in str(info.value), str(info.value)


def test_bad_policy_message_lists_valid_ones():
    with pytest.raises(ValueError) as info:
        plan_split([10], 2, policy="stripes")
    assert all(p in str(info.value) for p in POLICIES)


def test_good_edge_inputs_are_accepted():
    assert plan_split([1], 1, policy="round_robin").per_rank_tokens == (1,)
    assert plan_split((1,) * 5, 8, policy="zigzag_page", page_size=128, align=16).total_tokens == 16
    assert plan_split([3], 2, policy="zigzag", align=None).align == 2
