"""Plans at scale (matrix.scale.plans) and workloads (matrix.scale.workload), without ranks.

The vectorised split must be the library's ``plan_split`` on every batch
(hypothesis), and its per-design statistics the ones a rank run reports for
the same plan (``RoundTripImpl.buffer_rows``, ``pad_at_split.padding_rows``).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from matrix.app import sweep
from matrix.scale import plans
from matrix.scale.workload import (MATRIX_BATCHES_MAX, Batches, WorkloadError, draw, expand_argv, from_mapping, load,
                                   read_trace, report_lines)
from nsa_cp_comm import engines, impls, plan_split
from nsa_cp_comm.pad_at_split import padding_rows, physical_len
from matrix_cli import REPO, run_python

hypothesis = pytest.importorskip("hypothesis", reason="the property tests need hypothesis (the test extra)")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _batches(groups: list[list[int]]) -> Batches:
    return Batches(np.asarray([x for g in groups for x in g], dtype=np.int64),
                   np.asarray([len(g) for g in groups], dtype=np.int64))


@st.composite
def batch_sets(draw_):
    cp = draw_(st.integers(1, 12))
    policy = draw_(st.sampled_from(["zigzag", "zigzag_page", "round_robin"]))
    page = draw_(st.one_of(st.just(1), st.sampled_from([2, 3, 16, 64]), st.integers(1, 200)))
    align = cp * draw_(st.integers(1, 3))
    lengths = st.one_of(st.integers(1, 12), st.integers(1, 700), st.integers(500, 5000))
    groups = draw_(st.lists(st.lists(lengths, min_size=1, max_size=6), min_size=1, max_size=6))
    return groups, cp, policy, page, align


def _mismatches(split, groups, cp, policy, page, align) -> list:
    """The batches where ``split`` (per_rank_tokens' signature) differs from plan_split."""
    got = split(_batches(groups), cp, policy, page, align)
    return [(g, tuple(int(x) for x in row)) for g, row in zip(groups, got)
            if tuple(int(x) for x in row) != plan_split(g, cp, policy=policy, page_size=page, align=align).per_rank_tokens]


@pytest.mark.fuzz
@given(batch_sets())
def test_vectorised_split_is_plan_split(case):
    assert _mismatches(plans.per_rank_tokens, *case) == []


@pytest.mark.fuzz
@given(batch_sets())
def test_plan_statistics_are_the_rank_run_ones(case):
    """What a rank run's rows report for a plan (gathered rows from the
    implementation's layout, padding rows) is what the vectorised stats say."""
    groups, cp, policy, page, align = case
    st_ = plans.plan_stats(_batches(groups), cp, policy, page, align)
    padded, pas = impls.get("padded"), impls.get("pad_at_split")
    for i, g in enumerate(groups):
        plan = plan_split(g, cp, policy=policy, page_size=page, align=align)
        pad = padding_rows(plan)
        assert st_["total"][i] == plan.total_tokens
        assert st_["physical"][i] == physical_len(plan)
        assert st_["rows"]["padded"][i] == padded.buffer_rows(plan)
        assert st_["rows"]["pad_at_split"][i] == pas.buffer_rows(plan)
        assert st_["moe_pad"]["padded"][i] == pad["padded_moe"]
        assert st_["moe_pad"]["pad_at_split"][i] == pad["pad_at_split_moe"]
        assert st_["attn_pad"]["pad_at_split"][i] == pad["pad_at_split_attn"]
        assert st_["rows"]["legacy_even"][i] == sum(g)  # the raw batch: the lower bound


def test_equality_check_sees_a_wrong_split():
    """The property can fail: a split that ignores page boundaries (page size
    taken as 1) differs from plan_split on a page-aligned batch."""
    def pageless(b, cp, policy, page, align):
        return plans.per_rank_tokens(b, cp, "zigzag" if policy == "zigzag_page" else policy, 1, align)

    case = ([[1000], [8, 8]], 2, "zigzag_page", 64, 2)
    assert _mismatches(plans.per_rank_tokens, *case) == []
    assert _mismatches(pageless, *case) == [([1000], (500, 500)), ([8, 8], (8, 8))]


def test_pad_at_split_rule_worked_example():
    plan = plan_split([1001, 300], 3, policy="zigzag")  # even: 434 rows a rank, the 1301 tokens padded to 1302
    assert plan.per_rank_tokens == (434, 434, 434)
    assert physical_len(plan) == 438  # ceil_align(434, 2*3)
    # the batch's alignment token is a padding row the MoE processes, in both designs
    assert padding_rows(plan) == {"padded_attn": 0, "padded_moe": 1, "pad_at_split_attn": 4,
                                  "pad_at_split_moe": 3 * 438 - 1301}
    page = plan_split([1000], 2, policy="zigzag_page", page_size=64)  # (488, 512)
    assert physical_len(page) == 512
    assert padding_rows(page)["pad_at_split_attn"] == 24 and padding_rows(page)["padded_moe"] == 24
    rr = plan_split([10], 4, policy="round_robin")  # T=12, 3 a rank, align cp=4
    assert physical_len(rr) == 4


# -- workloads -------------------------------------------------------------------

def test_lognormal_draw_is_seeded_and_within_budget():
    w = load("lognormal", {"batches": 500})
    a, b = draw(w), draw(w)
    assert len(a) == 500 and np.array_equal(a.lens, b.lens) and np.array_equal(a.sizes, b.sizes)
    assert a.totals().max() <= w.budget and a.sizes.min() >= 1 and a.lens.min() >= 1
    c = draw(load("lognormal", {"batches": 500, "seed": 1}))
    assert not np.array_equal(a.lens[:50], c.lens[:50])


def test_trace_draw_picks_whole_trace_batches():
    w = load("trace", {"batches": 50})
    lens, sizes = read_trace(REPO / w.path, w.budget)
    got = draw(w)
    trace_batches = {tuple(lens[s : s + n]) for s, n in zip(np.cumsum(sizes) - sizes, sizes)}
    assert len(got) == 50
    assert all(tuple(got.batch(i)) in trace_batches for i in range(len(got)))


@pytest.mark.parametrize("text, needle", [
    ("", "empty file"),
    ("request_id,length\n0,5\n", "no seq_len column"),
    ("seq_len\n", "no requests"),
    ("seq_len\n12\nabc\n", "line 3: seq_len='abc'"),
    ("seq_len\n0\n", "line 2: seq_len='0'"),
    ("seq_len\n99999999\n", "line 2: seq_len='99999999'"),
    ("id,seq_len\n1,5\n2\n", "line 3: 1 fields"),
    ("batch,seq_len\na,10000\na,10000\n", "over the budget"),
    (b"seq_len\n\xff\xfe\x00\n", "not UTF-8"),
    (None, "cannot open"),  # no file there
])
def test_trace_reader_refuses_bad_files_with_one_line(tmp_path, text, needle):
    p = tmp_path / "t.csv"
    if text is not None:  # the bytes as given, a str as UTF-8
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(WorkloadError) as exc:
        read_trace(p, 16384)
    msg = str(exc.value)
    assert needle in msg and "\n" not in msg and str(p) in msg


@pytest.mark.parametrize("cfg, needle", [
    ({"kind": "gamma"}, "workload.kind='gamma'"),
    ({"kind": "lognormal", "mean": 10, "sigma": 1, "budget": 100, "batches": 0}, "workload.batches=0"),
    ({"kind": "lognormal", "mean": 10, "sigma": 9, "budget": 100, "batches": 1}, "workload.sigma=9"),
    ({"kind": "lognormal", "mean": 0, "sigma": 1, "budget": 100, "batches": 1}, "workload.mean=0"),
    ({"kind": "lognormal", "mean": 10, "sigma": 1, "budget": 100, "batches": 1, "path": "x"}, "workload.path"),
    ({"kind": "trace", "budget": 100, "batches": 1}, "workload.path=None"),
])
def test_workload_values_are_checked(cfg, needle):
    with pytest.raises(WorkloadError) as exc:
        from_mapping(cfg)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


# -- the command -----------------------------------------------------------------

def test_cli_writes_stats_and_plot(tmp_path):
    """The one run through a fresh interpreter: ``python -m matrix.plans`` as typed."""
    p = run_python("-m", "matrix.plans", "--batches", "300", "--cp", "2,8", "--policy", "zigzag", "--out",
                   str(tmp_path))
    assert p.returncode == 0, p.stderr
    out = json.loads((tmp_path / "plans.json").read_text())
    assert {(r["engine"], r["cp_size"], r["design"]) for r in out["rows"]} == {
        (e, c, d) for e in ("seed_fix", "sglang_0_5_23") for c in (2, 8) for d in plans.DESIGNS}
    assert set(out["meta"]["engines"]) == set(engines.NAMES)
    assert out["meta"]["engines"]["vllm_ascend"]["padding_at"] == "the tail rank(s) of the stream"
    # DeepSeek-V3.2 (the default model): vLLM's experts process the padding, in CUDA-graph buckets up to 512 rows
    assert out["meta"]["engines"]["vllm_0_33"]["moe_padding"] == "processed"
    assert out["meta"]["engines"]["vllm_0_33"]["cuda_graphs"] == "up to 512 rows per rank"
    assert out["meta"]["engines"]["vllm_0_33"]["gathered"] == ["hidden_states", "router_logits"]
    assert out["meta"]["engine_model"] == "deepseek_v32"
    assert any(line.startswith("vllm_0_33/zigzag: ") for line in out["meta"]["not_planned"])
    assert "sglang==0.5.23" in out["meta"]["engines"]["sglang_0_5_23"]["source"]
    assert all(r["overhead_p99"] == 0 if r["design"] == "legacy_even" else r["overhead_mean"] >= 0
               for r in out["rows"]), out["rows"]
    assert (tmp_path / plans.PLOT).read_bytes()[:4] == b"\x89PNG"
    assert "| 8 | zigzag | pad_at_split |" in p.stdout


@pytest.mark.parametrize("command, args, needle", [
    ("plans", ["--cp", "0"], "--cp=0"),
    ("plans", ["--cp", "x"], "--cp=x"),
    ("plans", ["--policy", "spiral"], "--policy=spiral"),
    ("plans", ["--engine", "vllm"], "--engine=vllm: must be one of seed_fix, sglang_0_5_23"),
    ("plans", ["--engine", "sglang_0_5_23", "--policy", "zigzag_page"], "no engine of --engine=sglang_0_5_23 has any"),
    ("plans", ["--workload", "nope"], "workload=nope"),
    ("plans", ["--batches", "0"], "workload.batches=0"),
    ("plans", ["--nccl-tests", "/nonexistent.json"], "/nonexistent.json"),
    # workload= in the matrix
    ("sweep", ["workload=nope"], "workload=nope: no such workload"),
    ("sweep", ["workload=lognormal", "seq_lens=[5]"], "drop seq_lens="),
    ("sweep", ["workload=lognormal,trace"], "one workload per command line"),
])
def test_bad_input_is_one_line_exit_2(command, args, needle, capsys):
    """``main(args)`` in this process (without a plot or a run): exit code 2 and one line on stderr."""
    main, last = {"plans": (plans.main, "--no-plot"), "sweep": (sweep.main, "--dry-run")}[command]
    code = main([*args, last])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, (code, err)


def test_doc_plans_speed_matches_its_json():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import plans_speed

    data = json.loads(plans_speed.JSON_PATH.read_text())
    found = plans_speed.block(plans_speed.DOC.read_text())
    assert found is not None and " ".join(found.split()) == " ".join(plans_speed.render(data).split()), (
        "docs/designs.md's plans_speed block differs from its JSON: run python benchmarks/plans_speed.py --render")
    assert data["batches"] >= 100_000 and max(data["cp"]) >= 128
    assert plans_speed.PLOT_PATH.is_file()


# -- workload= in the matrix -------------------------------------------------------

def test_workload_expands_into_a_sweep_of_its_batches():
    w = load("lognormal")
    b = draw(w)
    out = expand_argv(["workload=lognormal", "cp_size=2"])
    assert out[0] == "-m" and "workload=lognormal" in out
    [seq_lens] = [a for a in out if a.startswith("seq_lens=")]  # exactly one
    assert seq_lens == "seq_lens=" + ",".join("[" + ",".join(map(str, b.batch(i))) + "]" for i in range(len(b)))
    assert expand_argv(["cp_size=2"]) == ["cp_size=2"]
    assert expand_argv(["-m", "workload=null"]) == ["-m", "workload=null"]


def test_workload_batches_are_bounded(tmp_path):
    p = tmp_path / "big.yaml"
    p.write_text("name: big\nkind: lognormal\nmean: 100\nsigma: 1\nbudget: 1000\nbatches: 65\n")
    with pytest.raises(WorkloadError, match=rf"workload.batches=65: must be an integer in \[1, {MATRIX_BATCHES_MAX}\]"):
        load(str(p), batches_max=MATRIX_BATCHES_MAX)


def test_workload_dry_run_lists_one_point_per_batch(capsys):
    assert sweep.main(["workload=trace", "cp_size=2", "hidden_size=64", "--dry-run"]) == 0, capsys.readouterr().err
    b = draw(load("trace"))
    distinct = {tuple(b.batch(i)) for i in range(len(b))}
    assert f"estimate: {len(distinct)} points" in capsys.readouterr().out


def test_workload_report_section_aggregates_over_batches():
    import pandas as pd

    rows = [dict(workload="lognormal", status="ok", cp_size=2, policy="zigzag", page_size=1, impl="padded",
                 bytes_useful=900, bytes_padded=1000 if i < 9 else 2000, roundtrip_p50_us=float(i))
            for i in range(10)]
    text = "\n".join(report_lines(pd.DataFrame(rows)))
    assert "| lognormal  |         2 | zigzag   | padded |        10 | 10.00%" in text
    assert "| 50.95%" in text  # p99 (interpolated) pulled toward the one batch that pads to 2000 bytes
    assert report_lines(pd.DataFrame([dict(rows[0], workload="")])) == []


def test_a_workload_files_own_batch_count_is_said_when_plans_draws_its_own(capsys):
    """A workload file's `batches` is a sweep's K (8 for the shipped ones); plans draws 100000 for
    statistics at scale, and said nothing of the file's number: one note line now, none when
    --batches is given."""
    from matrix.scale import plans as plans_cli

    assert plans_cli.main(["--cp", "8", "--no-plot", "--policy", "zigzag", "--engine", "seed_fix"]) == 0
    note = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("note: workload=")]
    assert note == [f"note: workload=lognormal draws 8 batches for a sweep; these plans draw "
                    f"{plans_cli.BATCHES_AT_SCALE} (--batches sets it)"], note
    assert plans_cli.main(["--cp", "8", "--no-plot", "--policy", "zigzag", "--engine", "seed_fix",
                           "--batches", "200"]) == 0
    assert "note: workload=" not in capsys.readouterr().err
