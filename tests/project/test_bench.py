"""The benchmark keeps its promises: it runs, it fails when the padded path is
wrong or slow, and PERF.md is what the committed JSON says.

The benchmark runs in a subprocess, as a user runs it, on real gloo ranks; a
broken padded path is one of the catalogue's broken implementations
(tests/broken_impls.py) in the padded path's place (``--padded``). No
wall-time assertion: a loaded 2-core machine only gets slower, and the
subprocess timeouts are generous.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from matrix_cli import REPO

BENCH = REPO / "benchmarks" / "bench_comm.py"
# A quick run takes ~15 s on an idle 2-core machine; several times that under load.
RUN_TIMEOUT_S = 900


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


perf_md = _load("perf_md")


def run_bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tmp_path)
    data = json.loads(out.read_text()) if out.exists() else {}
    return proc, data


def _log(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout[-4000:] + proc.stderr[-4000:]


def test_bench_quick_runs(tmp_path):
    proc, data = run_bench(tmp_path)
    assert proc.returncode == 0, _log(proc)
    text = proc.stdout
    for header in ("even plans: padded / legacy round trip", "uneven plans: padded vs alternatives",
                   "local work at production shape", "paired ratio", "A/A ceiling", "busbw GB/s", "local share",
                   "in-place rt ms", "correctness: all checks passed", "exit 0"):
        assert header in text, header
    assert data["complete"] and data["exit_code"] == 0 and data["failures"] == []
    assert {"env", "params", "gate", "even", "uneven", "local_work", "sections"} <= set(data)
    assert {"cpu_model", "nproc", "ram_gib", "torch", "date", "loadavg_start", "loadavg_end", "command"} <= set(
        data["env"])
    # Gated only on full runs: a --quick run reports its verdict without gating.
    assert data["gate"]["on"] is False
    for e in data["even"]:
        assert e["verdict"] in ("PASS", "within noise", "FAIL"), e["verdict"]
        assert e["impls"]["padded"]["even_bitwise_equal"] is True
        stats = e["impls"]["padded"]["stats"]
        assert {"gather", "scatter", "collective", "roundtrip"} <= set(stats)
        assert "local" not in stats  # on an even plan padded stages nothing: legacy's call
        assert "local" not in e["impls"]["padded_zero_copy"]["stats"]  # the in-place form stages nothing
        assert "local" not in e["impls"]["legacy"]["stats"]
    statuses = {(e["mode"], n): r["status"] for e in data["uneven"] for n, r in e["impls"].items()}
    assert statuses == {
        ("FULL", "padded"): "ok", ("FULL", "padded_zero_copy"): "ok", ("FULL", "legacy"): "refused",
        ("FULL", "sumlen_allreduce"): "ok", ("FULL", "allgatherv"): "skipped",
        ("SCATTERED", "padded"): "passthrough", ("SCATTERED", "a2a"): "ok",
    }
    assert data["local_work"] and all(0 < e["local_share"] < 1 for e in data["local_work"])
    # The same JSON renders into PERF.md's tables.
    md = perf_md.render({"perf_cpu.json": data})
    assert "| zigzag [512]" in md and "refused" in md and "GPU run is still open" in md


BROKEN = "tests.broken_impls"


@pytest.mark.parametrize(
    ("broken", "section", "check"),
    [("offset_by_one", "even", "gather_rows"), ("dirty_padding", "uneven", "padding_zero"),
     ("chunk_off_by_one", "local", "scatter_chunk")],
)
def test_a_broken_padded_path_exits_1(tmp_path, broken, section, check):
    proc, data = run_bench(tmp_path, "--sections", section, "--padded", f"{BROKEN}:{broken}")
    assert proc.returncode == 1, _log(proc)
    assert "FAILED" in proc.stdout and f"[{check}]" in proc.stdout, _log(proc)
    assert data["exit_code"] == 1 and any(f"[{check}]" in f for f in data["failures"])


def test_a_rank_that_raises_exits_1(tmp_path):
    proc, data = run_bench(tmp_path, "--sections", "even", "--padded", f"{BROKEN}:raise_rank")
    assert proc.returncode == 1, _log(proc)
    assert "rank 0 error: RuntimeError: injected fault on rank 1 (raised at " in proc.stdout, _log(proc)
    assert "in _raise, in the implementation's gather) (ranks numbered as in the CP group)" in proc.stdout, _log(proc)
    assert data["exit_code"] == 1 and data["even"] == []


@pytest.mark.parametrize(("gate", "code"), [("--gate", 1), (None, 0)])
def test_a_slow_padded_path_fails_the_gate(tmp_path, gate, code):
    # A quarter-second sleep in the staging copy: far beyond any A/A noise.
    args = ["--sections", "even", "--padded", f"{BROKEN}:slow_stage"] + ([gate] if gate else [])
    proc, data = run_bench(tmp_path, *args)
    assert proc.returncode == code, _log(proc)
    assert data["failures"] == [] and [e["verdict"] for e in data["even"]] == ["FAIL"]
    assert "RATIO FAIL" in proc.stdout


def test_a_slow_padded_path_fails_the_one_rank_gate(tmp_path):
    """The one-rank rows (``single``, cp 1) are gated at their own target where they are gated (on a
    GPU by default, here with --gate): a FAIL there is exit 1."""
    bench = _load("bench_comm")
    proc, data = run_bench(tmp_path, "--sections", "single", "--padded", f"{BROKEN}:slow_stage", "--gate")
    assert proc.returncode == 1, _log(proc)
    assert data["failures"] == [] and [e["verdict"] for e in data["single"]] == ["FAIL"], data["single"]
    assert [e["target"] for e in data["single"]] == [bench.SINGLE_TARGET]
    assert f"> target {bench.SINGLE_TARGET} and" in proc.stdout, _log(proc)


def test_the_staging_is_timed_on_one_rank_alone_beside_the_copy_bandwidth():
    """What an uneven plan's staging costs on one rank with the device to itself, and what the
    device's copy bandwidth predicts for it; none on an even plan (nothing staged)."""
    bench = _load("bench_comm")
    from nsa_cp_comm.plan import plan_split

    uneven = plan_split((1000,), 4, policy="zigzag_page", page_size=64)  # ranks of 192..256 rows
    got = bench.stage_alone(uneven, 256, torch.bfloat16, "cpu", warmup=1, iters=3)
    staging = [r for r, n in enumerate(uneven.per_rank_tokens) if n < uneven.max_rank_len]
    assert got["rank"] in staging and got["rows"] == max(uneven.per_rank_tokens[r] for r in staging)
    assert got["bytes"] == got["rows"] * 256 * 2 and got["copy_bytes"] == uneven.padded_total * 256 * 2
    assert got["stage_us"] > 0 and got["copy_GBps"] > 0
    assert got["predicted_us"] == pytest.approx(got["bytes"] / got["copy_GBps"] / 1e3)
    assert bench.stage_alone(plan_split((1024,), 4, policy="zigzag"), 256, torch.bfloat16, "cpu") is None


def test_perf_md_labels_what_is_measured_and_what_is_a_model():
    """The one-rank table says which columns were measured and which are a model (and its
    inputs); the old estimate that mixed contended local work with modelled NVLink is gone."""
    bench = _load("bench_comm")
    alone = dict(rank=0, rows=960, bytes=960 * 7168 * 2, stage_us=14.0, copy_bytes=1, copy_us=1.0, copy_GBps=1000.0,
                 predicted_us=13.8, iters=20)
    model = dict(busbw_GBps=bench.NVLINK_BUSBW_GBPS, latency_us=bench.NVLINK_LATENCY_US, collectives_us=600.0,
                 local_share=14 / 614)
    plan = dict(policy="zigzag_page", page_size=64, seq_lens=[8000], cp=8, tokens=8000)
    text = perf_md.alone_markdown([dict(plan=plan, alone=alone, model=model)])
    assert "stage us (measured, one rank alone)" in text and "collectives us (model)" in text, text
    assert "local share (model)" in text and "2.28 %" in text and "600" in text, text
    assert f"/ {bench.NVLINK_BUSBW_GBPS:.0f} GB/s + {bench.NVLINK_LATENCY_US:.0f} us" in text, text
    assert "not a measurement of a multi-GPU node" in text
    without = perf_md.alone_markdown([dict(plan=plan, alone=alone)])
    assert "Model:" not in without and "14.0" in without
    gpu = perf_md.load().get("perf_gpu.json")
    if gpu is not None:  # the committed GPU run: no estimate printed from ranks that shared the GPU
        assert "Estimated for" not in perf_md.render({"perf_gpu.json": gpu})
    assert f"gated at {bench.SINGLE_TARGET}" in perf_md.GPU_PENDING


@pytest.mark.parametrize(("ref", "says"), [(f"{BROKEN}:nope", "has no attribute nope"),
                                           ("a2a", "a SCATTERED-mode implementation")])
def test_a_bad_padded_implementation_is_refused(capsys, ref, says):
    bench = _load("bench_comm")
    with pytest.raises(SystemExit) as info:
        bench.parse_args(["--padded", ref])
    assert info.value.code == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert f": error: --padded {ref}: " in err and says in err, err


def test_gate_rule():
    bench = _load("bench_comm")
    tight = [0.99, 1.0, 1.0, 1.01]
    wide = [0.8, 0.95, 1.05, 1.25]
    assert bench.gate_verdict([1.0, 1.01, 1.02], tight)["verdict"] == "PASS"
    assert bench.gate_verdict([1.1] * 3, tight)["verdict"] == "FAIL"
    assert bench.gate_verdict([1.1] * 3, wide)["verdict"] == "within noise"
    # Noise is symmetric: a control that reads fast widens the ceiling as much as one that reads slow.
    low = bench.gate_verdict([1.1] * 3, [0.85, 0.85, 0.9, 1.0])
    assert low["aa_ceiling"] == pytest.approx(1 / 0.85) and low["verdict"] == "within noise"
    # the paired ratio's 95% interval: order statistics of the iterations' ratios (none from three)
    ratios = [1.0 + i / 100 for i in range(20)]  # 1.00 .. 1.19
    got = bench.gate_verdict(ratios, tight)
    assert (got["ratio_lo"], got["ratio_hi"]) == (pytest.approx(1.05), pytest.approx(1.14)), got
    assert perf_md._with_interval({"ratio": got["ratio"], **got}) == "1.095 (1.050-1.140)"
    assert perf_md._with_interval(bench.gate_verdict([1.1] * 3, tight)) == "1.100"


def test_perf_md_is_rendered_from_the_committed_json():
    runs = perf_md.load()
    assert "perf_cpu.json" in runs, "benchmarks/data/perf_cpu.json is missing: run the benchmark"
    text = (REPO / "PERF.md").read_text()
    assert text == perf_md.render(runs), "PERF.md is stale: run python benchmarks/perf_md.py"
    for table in ("even", "uneven", "local_work"):
        assert runs["perf_cpu.json"][table], table
    if "perf_gpu.json" not in runs:
        assert "GPU run is still open" in text


def test_perf_md_check_sees_drift(tmp_path):
    stale = tmp_path / "PERF.md"
    stale.write_text((REPO / "PERF.md").read_text().replace("Performance", "Perf", 1))
    assert perf_md.main(["--check", "--out", str(stale)]) == 1
    assert perf_md.main(["--out", str(stale)]) == 0
    assert perf_md.main(["--check", "--out", str(stale)]) == 0


def test_perf_md_renders_a_gpu_run_in_place_of_the_open_note():
    cpu = perf_md.load()["perf_cpu.json"]
    gpu = json.loads(json.dumps(cpu))
    gpu["env"].update(device="cuda", gpu="NVIDIA H200", gpu_count=1, cuda="13.0", nccl="2.27.7")
    text = perf_md.render({"perf_cpu.json": cpu, "perf_gpu.json": gpu})
    assert "## GPU figures" in text and "GPU NVIDIA H200 x1" in text and "NCCL 2.27.7" in text
    assert "GPU run is still open" not in text
