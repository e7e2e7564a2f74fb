"""Each engine's rules (nsa_cp_comm.engines), held to an independent transcription of the engine.

For every engine and every strategy it has, on random batches (1-16 requests,
lengths 1-20000, cp 2-16), the plan's per-rank lengths, the physical length
every rank is padded to, the padding rows and the refusal equal the rule as
transcribed here from the engine (SGLang 0.5.23: ``layers/cp/zigzag.py`` and
``interleave.py`` ``build_metadata`` and ``can_apply``, ``layers/cp/padding.py``
``pad_logical_token_to_physical``; the seed fix's engine: docs/design.md
section 2), and the numpy bulk plans (matrix.scale.plans) equal the per-batch ones.
Engines broken on purpose (an alignment, the batch padding, the refusal) are
caught. ``HYPOTHESIS_PROFILE=fuzz`` runs thousands of batches (tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from matrix.app.config import MatrixConfig, validate
from matrix.app.resolve import resolve
from matrix.scale import plans
from matrix.scale.workload import Batches
from nsa_cp_comm import engines
from nsa_cp_comm import plan as plan_mod
from nsa_cp_comm.plan import POLICIES, ceil_align

pytest.importorskip("hypothesis", reason="the property tests need hypothesis (the test extra)")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from test_properties import reference_blocks  # noqa: E402

LENGTHS = st.one_of(st.integers(1, 40), st.integers(1, 20000))
PAGES = st.sampled_from([1, 2, 16, 64])


@st.composite
def cases(draw, engine: str):
    rules = engines.get(engine)
    return (draw(st.lists(LENGTHS, min_size=1, max_size=16)), draw(st.integers(2, 16)),
            draw(st.sampled_from(rules.strategies)), draw(PAGES))


def sglang_rule(lens: list[int], cp: int, policy: str, page: int) -> dict:
    """SGLang 0.5.23 as its code reads: the raw extend lengths split (zigzag: each request's
    2*cp near-equal blocks, rank k blocks k and 2cp-1-k; interleave: T//cp + (r < T % cp)),
    every rank's physical length ceil_align(max, 2*cp | cp); no CP where can_apply refuses."""
    total = sum(lens)
    if policy == "zigzag":
        blocks = [reference_blocks(n, cp, "zigzag", 1) for n in lens]
        n_r = [sum(b[k] + b[2 * cp - 1 - k] for b in blocks) for k in range(cp)]
        refused = any(n < 2 * cp for n in lens) or total < 2 * cp
    else:
        n_r = [total // cp + (r < total % cp) for r in range(cp)]
        refused = total < cp
    align = 2 * cp if policy == "zigzag" else cp
    # attention zeroes the padded output rows (padding.py attention_output_tokens): masked
    return {"n_r": n_r, "P": -(-max(n_r) // align) * align, "refused": refused, "raw": total, "attn_masked": True}


def seed_fix_rule(lens: list[int], cp: int, policy: str, page: int) -> dict:
    """The seed fix's engine: the batch padded to a multiple of cp by lengthening the last
    request, then round robin, zigzag or page-aligned zigzag; every batch split."""
    total = ceil_align(sum(lens), cp)
    padded = lens[:-1] + [lens[-1] + total - sum(lens)]
    if policy == "round_robin":
        n_r = [total // cp] * cp
    else:
        blocks = [reference_blocks(n, cp, policy, page) for n in padded]
        n_r = [sum(b[k] + b[2 * cp - 1 - k] for b in blocks) for k in range(cp)]
    align = cp if policy == "round_robin" else 2 * cp
    return {"n_r": n_r, "P": -(-max(n_r) // align) * align, "refused": False, "raw": sum(lens), "attn_masked": False}


def vllm_segments(lens: list[int], pcp: int, rank: int) -> list[tuple[int, int]]:
    """vLLM's ``PCPManager._get_rank_segments`` for a batch of fresh prefills, as its code
    reads: (global start, length) of each chunk the rank takes, request by request."""
    out, start, num_chunks = [], 0, 2 * pcp
    for query_len in lens:
        chunk_size = (query_len + num_chunks - 1) // num_chunks
        for chunk_idx in (rank, num_chunks - 1 - rank):
            chunk_offset = chunk_idx * chunk_size
            chunk_len = min(chunk_size, query_len - chunk_offset)
            if chunk_len <= 0:
                continue
            out.append((start + chunk_offset, chunk_len))
        start += query_len
    return out


def vllm_rule(lens: list[int], cp: int, policy: str, page: int) -> dict:
    """vLLM 0.33: the segments' lengths per rank; ``_build_batch_layout`` pads every rank to
    ``max(per_rank_num_tokens)``; no PCP manager at pcp <= 1; is_padding masks attention."""
    n_r = [sum(n for _, n in vllm_segments(lens, cp, r)) for r in range(cp)]
    return {"n_r": n_r, "P": max(n_r), "refused": cp <= 1, "raw": sum(lens), "attn_masked": True}


def ascend_slice(num_input_tokens: int, tp_size: int, tp_rank: int) -> tuple[int, int, int]:
    """vllm-ascend's ``_build_local_token_metadata``: (local_start, local_end, tokens_per_rank)."""
    num_tokens_pad = ((num_input_tokens + tp_size - 1) // tp_size) * tp_size
    tokens_per_rank = num_tokens_pad // tp_size
    local_start = tp_rank * tokens_per_rank
    return local_start, local_start + tokens_per_rank, tokens_per_rank


def ascend_rule(lens: list[int], cp: int, policy: str, page: int) -> dict:
    """vllm-ascend DSA-CP: each request's interval clamped to the rank's slice; the real rows
    of a rank are those before T; P = tokens_per_rank."""
    total, n_r = sum(lens), []
    for r in range(cp):
        lo, hi, per = ascend_slice(total, cp, r)
        starts = np.cumsum([0] + lens)
        n_r.append(int(sum(max(0, min(e, hi) - max(b, lo)) for b, e in zip(starts[:-1], starts[1:]))))
    return {"n_r": n_r, "P": per, "refused": cp <= 1, "raw": total, "attn_masked": True}


# one signature for every rule: the page size only the seed fix's engine reads. Every engine of
# engines.NAMES is held to its entry here: a new engine module fails the tests below until its
# rule is transcribed (vLLM 0.34's split is 0.33's byte for byte: its module's docstring).
RULES = {"seed_fix": seed_fix_rule, "sglang_0_5_23": sglang_rule, "vllm_0_33": vllm_rule, "vllm_0_34": vllm_rule,
         "vllm_ascend": ascend_rule}


def mismatches(rules: engines.Engine, lens: list[int], cp: int, policy: str, page: int) -> list[str]:
    """How ``rules`` differs from the engine's transcribed rule on this batch ([] when it does not)."""
    want = RULES[rules.name](list(lens), cp, policy, page)
    page = page if policy == "zigzag_page" else 1
    plan = rules.plan(lens, cp, policy=policy, page_size=page)
    out = []
    if list(plan.per_rank_tokens) != want["n_r"]:
        out.append(f"per-rank lengths {list(plan.per_rank_tokens)} != {want['n_r']}")
    if rules.physical_len(plan) != want["P"]:
        out.append(f"physical length {rules.physical_len(plan)} != {want['P']}")
    if bool(rules.refusal(lens, cp, policy)) != want["refused"]:
        out.append(f"refusal {rules.refusal(lens, cp, policy)!r}, the engine refuses: {want['refused']}")
    cost = rules.costs(plan)["pad_at_split"]
    keep = 0 if want["refused"] else 1
    attn = keep * (want["P"] - min(want["n_r"]))
    moe = keep * (want["P"] * cp - want["raw"])
    got = (cost["attn_pad_processed"] + cost["attn_pad_masked"], cost["moe_pad_processed"] + cost["moe_pad_masked"],
           cost["rows"])
    if got != (attn, moe, keep * want["P"] * cp):
        out.append(f"pad_at_split (attn pad, moe pad, rows) {got} != {(attn, moe, keep * want['P'] * cp)}")
    if attn and cost["attn_pad_masked"] != (attn if want["attn_masked"] else 0):
        out.append("attention padding masked/processed the wrong way")
    return out


def test_every_engine_is_held_to_a_transcription():
    assert sorted(RULES) == sorted(engines.NAMES), "transcribe the new engine's rule into RULES"


@pytest.mark.fuzz
@pytest.mark.parametrize("engine", engines.NAMES)
@given(data=st.data())
def test_each_engine_follows_its_code(engine, data):
    assert mismatches(engines.get(engine), *data.draw(cases(engine))) == []


@pytest.mark.fuzz
@given(st.lists(LENGTHS, min_size=1, max_size=8), st.integers(2, 16))
def test_each_ranks_rows_are_the_engines_rows_in_its_order(lens, cp):
    """Which global tokens a rank holds, in its local row order: vLLM's segments request by
    request (chunk r, then chunk 2*pcp-1-r), vllm-ascend's one slice clamped to the stream."""
    dcs = engines.get("vllm_0_33").plan(lens, cp, policy="dual_chunk_swap")
    con = engines.get("vllm_ascend").plan(lens, cp, policy="contiguous")
    for r in range(cp):
        want = [t for start, n in vllm_segments(lens, cp, r) for t in range(start, start + n)]
        assert list(dcs.rank_indices(r)) == want
        lo, hi, _ = ascend_slice(sum(lens), cp, r)
        assert list(con.rank_indices(r)) == list(range(lo, min(hi, sum(lens))))


@st.composite
def batch_sets(draw, engine: str):
    rules = engines.get(engine)
    groups = draw(st.lists(st.lists(LENGTHS, min_size=1, max_size=16), min_size=1, max_size=8))
    return groups, draw(st.integers(2, 16)), draw(st.sampled_from(rules.strategies)), draw(PAGES)


def bulk_mismatches(rules: engines.Engine, groups: list[list[int]], cp: int, policy: str, page: int) -> list:
    """Batches where matrix.scale.plans' numpy statistics differ from the engine's per-batch plan and costs
    (both with the CUDA graphs the engine runs by default)."""
    page = page if policy == "zigzag_page" else 1
    capture = rules.graphs()[0]
    batches = Batches(np.asarray([x for g in groups for x in g], dtype=np.int64),
                      np.asarray([len(g) for g in groups], dtype=np.int64))
    stats = plans.plan_stats(batches, cp, policy, page, engine=rules.name)
    out = []
    for i, g in enumerate(groups):
        plan = rules.plan(g, cp, policy=policy, page_size=page, max_capture_size=capture)
        got = {d: {k: int(v[i]) for k, v in stats["costs"][d].items()} for d in engines.DESIGNS}
        if (got != rules.costs(plan) or int(stats["total"][i]) != plan.total_tokens
                or bool(stats["refused"][i]) != bool(rules.refusal(g, cp, policy))
                or int(stats["physical"][i]) != rules.physical_len(plan)):
            out.append(g)
    return out


@pytest.mark.fuzz
@pytest.mark.parametrize("engine", engines.NAMES)
@given(data=st.data())
def test_bulk_plans_are_the_per_batch_plans(engine, data):
    assert bulk_mismatches(engines.get(engine), *data.draw(batch_sets(engine))) == []


# -- each rule broken on purpose is caught --------------------------------------------------

SEED, SGLANG, VLLM, ASCEND = (engines.get(name) for name in ("seed_fix", "sglang_0_5_23", "vllm_0_33", "vllm_ascend"))


# each case: the engine, the fields of its rules broken (dataclasses.replace), a batch, what the break shows
@pytest.mark.parametrize("engine,broken,case,needle", [
    # zigzag aligned to cp instead of 2*cp: n = (433, 434, 434) gives P = 435, not 438
    (SGLANG, dict(split_align=lambda policy, cp: cp), ([1001, 300], 3, "zigzag", 1), "physical length"),
    # the batch padded to cp first (the seed fix's engine did): 18057 + 8366 + 1064 = 27487 becomes 27488
    (SGLANG, dict(pads_batch=True), ([18057, 8366, 1064], 4, "zigzag", 1), "per-rank lengths"),
    # can_apply ignored: a 5-token request at cp 4 runs with CP
    (SGLANG, dict(refuses=lambda mn, total, cp, policy: mn < 0), ([5, 100], 4, "zigzag", 1), "refusal"),
    # attention computing the padding rows SGLang zeroes
    (SGLANG, dict(attn_pad_masked=False), ([10], 4, "round_robin", 1), "masked/processed"),
    # vLLM's P aligned to cp as SGLang aligns interleave: [5] at pcp 2 is n = (2, 3), P = 3, not 4
    (VLLM, dict(split_align=lambda policy, cp: cp), ([5], 2, "dual_chunk_swap", 1), "physical length"),
    # the batch padded to cp first: [5] becomes [6], n = (3, 3)
    (VLLM, dict(pads_batch=True), ([5], 2, "dual_chunk_swap", 1), "per-rank lengths"),
    # a pcp=1 batch run with CP
    (VLLM, dict(refuses=lambda mn, total, cp, policy: mn < 0), ([5], 1, "dual_chunk_swap", 1), "refusal"),
    # P aligned to 2*tp: [5] at tp 2 has slices of 3, so P = 3, not 4
    (ASCEND, dict(split_align=lambda policy, cp: 2 * cp), ([5], 2, "contiguous", 1), "physical length"),
    (ASCEND, dict(attn_pad_masked=False), ([7], 2, "contiguous", 1), "masked/processed"),
])
def test_a_broken_rule_is_caught(engine, broken, case, needle):
    assert mismatches(engine, *case) == []
    got = mismatches(dataclasses.replace(engine, **broken), *case)
    assert any(needle in m for m in got), got


def test_a_wrong_chunk_size_or_padding_placement_is_caught(monkeypatch):
    """The splits themselves can fail their transcriptions: DualChunkSwap with near-equal
    blocks (zigzag's) instead of ceil-sized chunks, and the contiguous split with slices of
    ``T // tp + 1`` instead of ``ceil(T / tp)`` (on [6] at tp 3: ranks (3, 3, 0), the padding a
    whole rank where the engine has none)."""
    assert mismatches(VLLM, [5], 2, "dual_chunk_swap", 1) == []
    assert mismatches(ASCEND, [6], 3, "contiguous", 1) == []
    monkeypatch.setattr(plan_mod, "_chunk_blocks", plan_mod._even_blocks)
    assert any("per-rank lengths" in m for m in mismatches(VLLM, [5], 2, "dual_chunk_swap", 1))
    monkeypatch.setattr(plan_mod, "_contiguous_len", lambda total, cp: total // cp + 1)
    assert any("per-rank lengths" in m for m in mismatches(ASCEND, [6], 3, "contiguous", 1))


def test_short_prefills_leave_ranks_empty_under_vllm_and_ascend():
    """1 token at PCP 2 is rows [1, 0] (vLLM #53573's batch); 3 tokens at TP 4 fill rank 0's slice
    of one token and leave rank 3 with padding only."""
    assert VLLM.plan([1], 2, policy="dual_chunk_swap").per_rank_tokens == (1, 0)
    assert VLLM.plan([2], 2, policy="dual_chunk_swap").per_rank_tokens == (1, 1)
    assert VLLM.plan([3], 4, policy="dual_chunk_swap").per_rank_tokens == (1, 1, 1, 0)
    assert ASCEND.plan([3], 4, policy="contiguous").per_rank_tokens == (1, 1, 1, 0)


def test_a_graph_bucket_smaller_than_the_longest_rank_is_refused():
    from nsa_cp_comm.engines import vllm_0_33

    assert vllm_0_33.graph_padded_len([2, 3]) == 3
    assert vllm_0_33.graph_padded_len([2, 3], buckets=(1, 2, 4, 8)) == 4
    assert vllm_0_33.graph_padded_len([2, 9], buckets=(1, 2, 4, 8)) == 9  # past the largest: eager
    assert vllm_0_33.graph_padded_len([2, 3], bucket=8) == 8
    with pytest.raises(ValueError, match=r"padded_num_tokens=2 is smaller than max\(per_rank_num_tokens\)=3"):
        vllm_0_33.graph_padded_len([2, 3], bucket=2)


@pytest.mark.parametrize("kwargs, says", [
    (dict(bucket=True), "bucket=True must be a positive int"), (dict(bucket=3.7), "bucket=3.7 must be"),
    (dict(bucket="8"), "bucket='8' must be"), (dict(bucket=0), "bucket=0 must be"),
    (dict(buckets=(4, "8")), "buckets[1]='8' must be"),
])
def test_a_bucket_that_is_not_a_capture_size_is_refused_in_one_line(kwargs, says):
    from nsa_cp_comm.engines import vllm_0_33

    with pytest.raises(ValueError) as info:
        vllm_0_33.graph_padded_len([2, 3], **kwargs)
    assert str(info.value).startswith(says) and "\n" not in str(info.value), info.value


def test_a_broken_bulk_plan_is_caught(monkeypatch):
    """The bulk property can fail: a numpy split that pads the batch where the engine does not."""
    groups = [[18057, 8366, 1064], [16]]
    assert bulk_mismatches(SGLANG, groups, 4, "zigzag", 1) == []
    real = plans.per_rank_tokens
    monkeypatch.setattr(plans, "per_rank_tokens", lambda *a, pad_batch=True: real(*a, pad_batch=True))
    assert bulk_mismatches(SGLANG, groups, 4, "zigzag", 1) == [[18057, 8366, 1064]]


def test_the_issue_example_and_the_refusal_share():
    """[18057, 8366, 1064] at cp 4: SGLang 0.5.23 pads to P = 6872 with 1 MoE padding row, the seed
    fix's engine to 6880 with 32 (its alignment token counted as a padding row too)."""
    sg, seed = (rules.plan([18057, 8366, 1064], 4, policy="zigzag") for rules in (SGLANG, SEED))
    assert (SGLANG.physical_len(sg), SGLANG.costs(sg)["pad_at_split"]["moe_pad_processed"]) == (6872, 1)
    assert (SEED.physical_len(seed), SEED.costs(seed)["pad_at_split"]["moe_pad_processed"]) == (6880, 6880 * 4 - 27487)
    # interleave on [5] at cp 4: 16 rows for 5 tokens (pads an uneven plan; the seed fix's 8-token even plan too)
    five = SGLANG.plan([5], 4, policy="round_robin")
    assert SGLANG.costs(five)["pad_at_split"]["rows"] == 16 and SGLANG.costs(five)["padded"]["rows"] == 8


def test_every_engine_has_its_yaml_and_its_module_cites_its_source():
    conf = Path(__file__).resolve().parents[2] / "conf" / "engine"
    assert sorted(p.stem for p in conf.glob("*.yaml")) == sorted(engines.NAMES)
    for name in engines.NAMES:
        assert f"engine: {name}" in (conf / f"{name}.yaml").read_text()
        rules = engines.get(name)
        assert rules.source and rules.title and set(rules.strategies) <= set(POLICIES)
    with pytest.raises(ValueError, match=r"engine='vllm' is not one of seed_fix, sglang_0_5_23"):
        engines.get("vllm")


# -- a matrix point follows its engine --------------------------------------------------------

def _resolved(**cfg):
    full = {**vars(MatrixConfig()), "device": "cpu", "backend": "gloo", "impl": "designs", "results_dir": "r", **cfg}
    validate(full)
    return resolve(full, gpus=0)


@pytest.mark.parametrize("cfg,skip", [
    (dict(cp_size=4, seq_lens=[5, 100]), "ZigzagCPStrategy.can_apply refuses a request of 5 tokens"),
    (dict(cp_size=4, seq_lens=[3], split="round_robin"), "InterleaveCPStrategy.can_apply refuses a batch of 3"),
    (dict(cp_size=4, seq_lens=[1000], shared_kv=True, page_size=64), "SGLang 0.5.23 has no zigzag_page split"),
    (dict(cp_size=4, seq_lens=[1000], align=8), "pads no batch to align=8"),
    (dict(cp_size=4, seq_lens=[8, 100]), ""),  # every request at least 2*cp: runs with CP
])
def test_sglang_points_are_skipped_where_the_engine_would_not_run_them(cfg, skip):
    res = _resolved(engine="sglang_0_5_23", **cfg)
    assert (skip in res.skip) if skip else res.skip == "", res.skip
    assert _resolved(engine="seed_fix", **cfg).skip == ""  # the seed fix's engine splits every batch


def test_a_points_plan_is_its_engines():
    sg = _resolved(engine="sglang_0_5_23", cp_size=4, seq_lens=[18057, 8366, 1064]).plan()
    seed = _resolved(cp_size=4, seq_lens=[18057, 8366, 1064]).plan()
    assert (sg.engine, sg.total_tokens, sg.per_rank_tokens) == ("sglang_0_5_23", 27487, (6872, 6871, 6872, 6872))
    assert (seed.engine, seed.total_tokens, seed.per_rank_tokens) == ("seed_fix", 27488, (6873, 6871, 6872, 6872))


@pytest.mark.parametrize("name", engines.NAMES)
def test_each_engine_module_draws_its_split_and_padding(name):
    """A reader sees the split and where the padding goes before the rules: each engine's module
    docstring holds a drawing (a literal block) naming its ranks."""
    import importlib

    doc = importlib.import_module(f"nsa_cp_comm.engines.{name}").__doc__ or ""
    blocks = []
    for after in doc.split("::\n\n")[1:]:  # a literal block: the indented lines after "::"
        indent = len(after) - len(after.lstrip(" "))
        lines = after.split("\n")
        end = next((i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith(" " * indent)), len(lines))
        blocks.append("\n".join(lines[:end]) if indent else "")
    assert any("rank" in block for block in blocks), (name, blocks)
