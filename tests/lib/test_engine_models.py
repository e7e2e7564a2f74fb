"""The engines' rules per model and version, held to the engines' text: the router each model's
MoE gets and whether it masks padding rows, where the CP prefill runs in CUDA graphs and the
capture bucket it pads to, what each layer gathers beside the hidden states.

Transcribed here from the released wheels, independent of nsa_cp_comm.engines (the code they
check); each rule broken on purpose fails. vllm==0.33.0 lines unless marked [0.34]:

- ``fused_moe/router/router_factory.py:166-230``: ``use_grouped_topk`` builds a
  ``GroupedTopKRouter`` (``deepseek_v2.py:383``, ``DeepseekV2MoE``, which DeepSeek-V3.2 and GLM-5
  build: ``models/deepseek_v32/nvidia/model.py:98``, ``models/deepseek_v32/__init__.py:20-21``);
  DeepSeek-V4 (``models/deepseek_v4/nvidia/model.py:424-447``) a ``FusedTopKBiasRouter``.
  ``grouped_topk_router.py:351-360`` masks only with ``skip_padding`` ([0.34] ``:344-357``),
  which ``fused_moe/layer.py:327`` sets only with DeepEP v2 kernels (expert parallelism: no PCP
  gather, ``fused_moe/config.py:1035-1038``); ``fused_topk_bias_router.py:179`` masks.
- ``v1/worker/gpu/pcp_manager.py:202-212`` ([0.34] ``:190-200``): sparse MLA PCP runs CUDA
  graphs only for ``deepseek_v32`` and ``glm_moe_dsa``.
- ``config/vllm.py:2579-2590``: capture sizes ``[1, 2, 4]``, ``range(8, min(M + 1, 256), 8)``,
  ``range(256, M + 1, 16)``, ``M = 512`` by default (``:2463-2470``).
- ``v1/worker/gpu/cudagraph_utils.py:380-394, 135``: the bucket of ``n`` tokens is the smallest
  capture size ``>= n``; ``pcp_manager.py:426-440``: ``n`` is the largest rank's rows;
  ``cudagraph_utils.py:547``: past the largest size, eager (``P = max n_r``).
- ``fused_moe/runner/moe_runner.py:828-829, 861``: the hidden states and the router logits
  all-gathered, one reduce-scatter; logits fp32 for ``glm_moe_dsa`` (``deepseek_v2.py:139-142``)
  and DeepSeek-V4, the activation dtype for DeepSeek-V3.2.
- SGLang 0.5.23: every gathered row routed (``forward_batch_info.py:1436-1437``;
  ``models/deepseek_common/moe_transport.py:47-63`` for V4); CP prefill graphs only for
  ``Glm5NextForConditionalGeneration`` interleave/DSA or zigzag/trtllm_mha
  (``layers/cp/bcg/__init__.py:21-26``, ``arg_groups/cuda_graph_hook.py:203-211``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from matrix.app.config import ConfigError, MatrixConfig, validate
from matrix.app.resolve import resolve
from matrix.scale import plans
from matrix.scale.workload import Batches
from nsa_cp_comm import engines

VLLM = ("vllm_0_33", "vllm_0_34")
# model -> (router on the PCP all-gather path, masks padding rows, runs CP prefill in graphs, logits bytes)
VLLM_MODELS = {
    "deepseek_v32": ("GroupedTopKRouter", False, True, None),  # None: the activation dtype
    "glm_moe_dsa": ("GroupedTopKRouter", False, True, 4),
    "deepseek_v4": ("FusedTopKBiasRouter", True, False, 4),
}
# every gathered row routed, for every model here; the seed fix (the SGLang change the padded
# communicator was written for) the same, eager, gathering the rows alone
SGLANG_MASKS = False
# vllm-ascend's DSA-CP: the equal all-gather of the padded slices carries no padding mask: processed
ASCEND_MASKS = False
# config/vllm.py:2579-2590 at M = 512: written out, not computed the way the engine module does
VLLM_SIZES_512 = (1, 2, 4, *(8 * k for k in range(1, 32)), *(256 + 16 * k for k in range(17)))


def vllm_bucket(n_max: int, sizes=VLLM_SIZES_512) -> int:
    """P where the step runs in graphs: the smallest capture size at least the longest rank, else eager."""
    for s in sizes:  # ascending
        if s >= n_max:
            return s
    return n_max


def model_mismatches(rules: engines.Engine, model: str) -> list[str]:
    """Where ``rules`` (an engine for ``model``) differ from the transcription."""
    out = []
    if rules.name in VLLM:
        _, masks, graphs, logits = VLLM_MODELS[model]
        if rules.moe_pad_masked != masks:
            out.append(f"MoE padding masked={rules.moe_pad_masked}, the engine's router: {masks}")
        if (rules.graphs()[0] > 0) != graphs:
            out.append(f"graphs={rules.graphs()}, the engine runs them: {graphs}")
        if rules.graphs()[0] and tuple(rules.capture_sizes(rules.graphs()[0])) != VLLM_SIZES_512:
            out.append(f"capture sizes {rules.capture_sizes(rules.graphs()[0])}")
        side = [(t.name, t.columns, t.itemsize or None) for t in rules.side_tensors]
        if side != [("router_logits", "experts", logits)]:
            out.append(f"side tensors {side}")
    elif rules.name == "vllm_ascend":
        if rules.moe_pad_masked != ASCEND_MASKS:
            out.append(f"MoE padding masked={rules.moe_pad_masked}: vllm-ascend's experts process it")
    elif rules.name in ("sglang_0_5_23", "seed_fix"):
        if rules.moe_pad_masked != SGLANG_MASKS:
            out.append(f"MoE padding masked={rules.moe_pad_masked}")
        if rules.graphs()[0]:
            out.append(f"graphs={rules.graphs()}: SGLang runs these models' CP prefill eager")
        if rules.side_tensors:
            out.append(f"side tensors {rules.side_tensors}")
    else:  # every engine of engines.NAMES is held to a transcription: a new one fails here until it has one
        out.append(f"no transcription of {rules.name}'s rules per model in this module")
    return out


@pytest.mark.parametrize("name", engines.NAMES)
@pytest.mark.parametrize("model", engines.MODELS)
def test_each_engine_follows_its_code_for_each_model(name, model):
    assert model_mismatches(engines.get(name, model), model) == []


# Rows per rank at the bucket edges (255/256/257, 511/512/513) and a few more, over cp sizes.
EDGES = (1, 3, 4, 5, 8, 9, 247, 248, 249, 255, 256, 257, 271, 272, 273, 511, 512, 513, 600)


def bucket_mismatches(rules: engines.Engine) -> list[str]:
    """P of a DualChunkSwap plan whose longest rank has each EDGES row count, against the
    transcribed bucket rule; the bulk plans' P equal the per-batch ones."""
    out = []
    for n_max in EDGES:
        for cp in (2, 3, 4):
            # requests of 2*cp tokens put two rows on every rank, one of 1 token one row on rank 0
            lens = [2 * cp] * (n_max // 2) + [1] * (n_max % 2)
            plan = rules.plan(lens, cp, policy="dual_chunk_swap", max_capture_size=512)
            assert plan.max_rank_len == n_max
            want = vllm_bucket(n_max)
            if rules.physical_len(plan) != want:
                out.append(f"n_max={n_max} cp={cp}: P={rules.physical_len(plan)}, the engine's {want}")
        bulk = rules.physical_rows(np.asarray([n_max, n_max + 1]), "dual_chunk_swap", 2, 512)
        if list(bulk) != [vllm_bucket(n_max), vllm_bucket(n_max + 1)]:
            out.append(f"bulk P {list(bulk)} at {n_max}")
    return out


@pytest.mark.parametrize("name", VLLM)
def test_vllm_pads_to_the_capture_bucket_that_holds_the_longest_rank(name):
    assert bucket_mismatches(engines.get(name)) == []


class _Strict(engines.Engine):
    """P the smallest bucket strictly larger than the longest rank (an exact fit skipped)."""

    def physical_rows(self, mx, policy, cp, max_capture_size=0):
        return super().physical_rows(np.asarray(mx) + 1, policy, cp, max_capture_size)


# each case: an engine with one rule broken, and what the break shows
@pytest.mark.parametrize("broken,needle", [
    (dict(moe_pad_masked=True), "MoE padding masked"),  # V3.2's padding read as masked (the old rule)
    (dict(graph_refusal="refuses graphs"), "graphs="),  # V3.2 run eager where it runs graphs
    (dict(capture_sizes=lambda most: tuple(range(8, most + 1, 8))), "capture sizes"),  # 8-step to the top
    (dict(side_tensors=()), "side tensors"),  # the router logits not gathered
])
def test_a_broken_model_rule_is_caught(broken, needle):
    rules = engines.get("vllm_0_33", "deepseek_v32")
    assert model_mismatches(rules, "deepseek_v32") == []
    got = model_mismatches(dataclasses.replace(rules, **broken), "deepseek_v32")
    assert any(needle in m for m in got), got


def test_vllm_ascends_padding_read_as_masked_is_caught():
    ascend = engines.get("vllm_ascend")
    assert model_mismatches(ascend, "deepseek_v32") == []
    assert model_mismatches(dataclasses.replace(ascend, moe_pad_masked=True), "deepseek_v32")


def test_a_broken_bucket_rule_is_caught():
    rules = engines.get("vllm_0_33")
    strict = _Strict(**{f.name: getattr(rules, f.name) for f in dataclasses.fields(rules)})
    got = bucket_mismatches(strict)
    assert any("n_max=256 " in m for m in got) and any("n_max=512 " in m for m in got), got
    eager = dataclasses.replace(rules, capture_sizes=lambda most: ())
    assert any("n_max=255 " in m for m in bucket_mismatches(eager))


def test_graphs_follow_the_key_and_the_engines_refusal():
    v32, v4 = engines.get("vllm_0_33", "deepseek_v32"), engines.get("vllm_0_33", "deepseek_v4")
    assert v32.graphs() == (512, "") and v32.graphs(True, 1024) == (1024, "") and v32.graphs(False) == (0, "")
    assert v4.graphs() == (0, "") and v4.graphs(False) == (0, "")
    assert "pcp_manager.py:202-212" in v4.graphs(True)[1]
    assert "cuda_graph_hook.py:203-211" in engines.get("sglang_0_5_23").graphs(True)[1]
    with pytest.raises(ValueError, match="engine_model='gpt'"):
        engines.get("vllm_0_33", "gpt")


def _resolved(**cfg):
    full = {**vars(MatrixConfig()), "device": "cpu", "backend": "gloo", "impl": "designs", "results_dir": "r",
            "engine": "vllm_0_33", "split": "dual_chunk_swap", "cp_size": 2, **cfg}
    validate(full)
    return resolve(full, gpus=0)


def test_a_points_p_is_the_bucket_where_its_engine_runs_graphs():
    # [1000] at pcp 2: 500 rows on each rank, in the 512 bucket; eager at 500 for DeepSeek-V4
    assert _resolved(seq_lens=[1000]).plan().max_capture_size == 512
    assert engines.get("vllm_0_33").physical_len(_resolved(seq_lens=[1000]).plan()) == 512
    assert _resolved(seq_lens=[1000], graphs=False).plan().max_capture_size == 0
    assert _resolved(seq_lens=[1000], engine_model="deepseek_v4").plan().max_capture_size == 0
    assert _resolved(seq_lens=[1000], max_capture_size=256).plan().max_capture_size == 256
    skipped = _resolved(seq_lens=[1000], engine_model="deepseek_v4", graphs=True)
    assert "runs deepseek_v4 CP prefill eager" in skipped.skip, skipped.skip
    # engines without graphs for these models: auto is eager, true a skip
    assert _resolved(engine="sglang_0_5_23", split="round_robin", seq_lens=[1000]).plan().max_capture_size == 0
    assert _resolved(engine="sglang_0_5_23", split="round_robin", seq_lens=[1000], graphs=True).skip


@pytest.mark.parametrize("key,value,needle", [
    ("engine_model", "gpt", "must be one of deepseek_v32"),
    ("graphs", "sometimes", "must be auto, true or false"),
    ("max_capture_size", 0, "must be an integer in [1,"),
])
def test_bad_values_are_one_line_naming_the_key(key, value, needle):
    with pytest.raises(ConfigError) as info:
        _resolved(seq_lens=[1000], **{key: value})
    assert needle in str(info.value) and str(info.value).startswith(f"{key}="), str(info.value)


def test_the_plans_table_counts_bucket_rows_side_tensors_and_collectives():
    """vLLM's DeepSeek-V3.2 at pcp 2: a [1000] batch pads 12 rows per rank to the 512 bucket
    (24 in the buffer), beside the 0 the split pads; three collectives; each row gathers H
    activations and 256 logits."""
    batches = Batches(np.asarray([1000, 1030]), np.asarray([1, 1]))
    st = plans.plan_stats(batches, 2, "dual_chunk_swap", engine="vllm_0_33")
    assert list(st["physical"]) == [512, 516]  # 1030: 516 rows on the longest rank, past 512: eager
    assert list(st["costs"]["pad_at_split"]["graph_pad"]) == [24, 0]
    row = {r["design"]: r for r in plans.summarize(st, 2, "dual_chunk_swap", 7168, 2, engine="vllm_0_33")}
    assert row["pad_at_split"]["collectives_per_layer"] == 3
    assert row["pad_at_split"]["gathered"] == "hidden_states, router_logits"
    assert row["legacy_even"]["gather_MB_mean"] == pytest.approx(1015 * (7168 + 256) * 2 / 1e6)
    v4 = plans.plan_stats(batches, 2, "dual_chunk_swap", engine="vllm_0_33", model="deepseek_v4")
    assert list(v4["physical"]) == [500, 516] and not v4["costs"]["pad_at_split"]["graph_pad"].any()
    assert v4["costs"]["padded"]["moe_pad_masked"].sum() > 0 == st["costs"]["padded"]["moe_pad_masked"].sum()


# The experts' block fp8 on vLLM ([0.34] lines are 0.34.0's; the rest 0.33.0's):
# [0.34] moe_runner.py:820-842 (_quantizes_before_pcp_gather: a MoEPrepareAndFinalizeNoDPEPMonolithic
# kernel with fp8 dynamic block activations) and :863-876 gather the fp8 rows, then their scales, then
# the logits; :632-640 (0.33 :620-625) a monolithic kernel is handed the logits, select_experts (where
# the routers' padding mask is) never runs. 0.33 :824-829 gathers the activations and the logits only.
# (engine, moe_quant) -> (gathered in order, bytes of a gathered hidden-state element (0: the
# activation dtype), whether DeepSeek-V4's padding is masked)
VLLM_QUANT = {
    ("vllm_0_33", "fp8_block"): (("hidden_states", "router_logits"), 0, True),
    ("vllm_0_33", "fp8_block_monolithic"): (("hidden_states", "router_logits"), 0, False),
    ("vllm_0_34", "fp8_block"): (("hidden_states", "router_logits"), 0, True),
    ("vllm_0_34", "fp8_block_monolithic"): (("hidden_states_fp8", "hidden_states_scale", "router_logits"), 1, False),
}


def quant_mismatches(rules: engines.Engine) -> list[str]:
    gathered, itemsize, v4_masks = VLLM_QUANT[rules.name, rules.moe_quant]
    out = []
    if rules.gathered != gathered:
        out.append(f"gathered {rules.gathered}, the engine's {gathered}")
    if rules.gather_itemsize != itemsize:
        out.append(f"hidden-state bytes {rules.gather_itemsize}, the engine's {itemsize}")
    if rules.model == "deepseek_v4" and rules.moe_pad_masked != v4_masks:
        out.append(f"MoE padding masked={rules.moe_pad_masked}, the kernel's: {v4_masks}")
    if rules.model == "deepseek_v32" and rules.moe_pad_masked:
        out.append("MoE padding masked for DeepSeek-V3.2")
    return out


@pytest.mark.parametrize("name,quant", list(VLLM_QUANT))
@pytest.mark.parametrize("model", ["deepseek_v32", "deepseek_v4"])
def test_vllm_quantized_experts_follow_its_code(name, quant, model):
    rules = engines.get(name, model, quant)
    assert rules.quant_refusal == "" and quant_mismatches(rules) == []


@pytest.mark.parametrize("broken,needle", [
    (dict(gather_itemsize=0), "hidden-state bytes"),  # 0.34's fp8 rows read as gathered in bf16
    (dict(moe_pad_masked=True), "the kernel's"),  # the monolithic kernel read as masking V4's padding
    (dict(side_tensors=engines.get("vllm_0_34", "deepseek_v4").side_tensors), "gathered"),  # no scales
])
def test_a_broken_quantization_rule_is_caught(broken, needle):
    rules = engines.get("vllm_0_34", "deepseek_v4", "fp8_block_monolithic")
    got = quant_mismatches(dataclasses.replace(rules, **broken))
    assert any(needle in m for m in got), got


def test_engines_that_do_not_model_a_quantization_skip_its_points():
    for name in ("seed_fix", "sglang_0_5_23", "vllm_ascend"):
        why = engines.get(name, "deepseek_v32", "fp8_block").quant_refusal
        assert f"engine={name}" in why and "vllm_0_33, vllm_0_34 model fp8_block" in why, why
    skipped = _resolved(engine="sglang_0_5_23", split="round_robin", seq_lens=[1000], moe_quant="fp8_block",
                        hidden_size=256)
    assert "fp8_block MoE path is not modelled" in skipped.skip, skipped.skip
    with pytest.raises(ConfigError, match=r"^hidden_size=100: must be a multiple of 128 with moe_quant=fp8_block"):
        _resolved(seq_lens=[1000], moe_quant="fp8_block", hidden_size=100)


def test_the_plans_table_counts_the_quantized_gather():
    """vLLM 0.34 on a monolithic block-fp8 kernel, DeepSeek-V3.2 in bf16: each row gathers H fp8
    bytes, H/128 float32 scales and 256 bf16 logits, in four collectives; 0.33 gathers H bf16."""
    batches = Batches(np.asarray([1000, 1030]), np.asarray([1, 1]))
    rows = {}
    for name in VLLM:
        st = plans.plan_stats(batches, 2, "dual_chunk_swap", engine=name, moe_quant="fp8_block_monolithic")
        rows[name] = {r["design"]: r for r in plans.summarize(st, 2, "dual_chunk_swap", 7168, 2, engine=name,
                                                               moe_quant="fp8_block_monolithic")}
    new, old = rows["vllm_0_34"]["legacy_even"], rows["vllm_0_33"]["legacy_even"]
    assert (new["collectives_per_layer"], old["collectives_per_layer"]) == (4, 3)
    assert new["gathered"] == "hidden_states_fp8, hidden_states_scale, router_logits"
    assert new["gather_MB_mean"] == pytest.approx(1015 * (7168 + 56 * 4 + 256 * 2) / 1e6)
    assert old["gather_MB_mean"] == pytest.approx(1015 * (7168 * 2 + 256 * 2) / 1e6)
