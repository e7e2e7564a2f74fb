"""Bounds from the machine: a sweep beyond it is refused in one line naming
the key, the estimate and the limit, before anything starts."""

from __future__ import annotations

import dataclasses
import re

import pytest

import reliability_table as table
from matrix import budget
from matrix.budget import Machine, check_sweep, estimate, sweep_estimate
from matrix.config import ConfigError, MatrixConfig

GIB = 1 << 30
# The CI-sized machine: 2 cores, ~23 GiB, no GPU.
CI = Machine(**table.BOUND_MACHINE)
BIG = dataclasses.replace(CI, memory_bytes=1024.0 * GIB)


def cfg(**over) -> dict:
    c = dataclasses.asdict(MatrixConfig())
    c.update(results_dir="/unused")
    c.update(over)
    return c


def refused(cfgs: list[dict], machine: Machine = CI, runs_here: bool = True) -> str:
    with pytest.raises(ConfigError) as info:
        check_sweep(cfgs, runs_here=runs_here, machine=machine)
    msg = str(info.value)
    assert "\n" not in msg and msg.endswith("(set force=true to run anyway)"), msg
    return msg


def test_more_ranks_than_the_machine_may_start():
    msg = refused([cfg(cp_size=1024, hidden_size=64)])
    assert msg == ("cp_size=1024: 1024 rank processes exceed this machine's limit of 8 (4 per core, 2 cores) "
                   "(set force=true to run anyway)")


@pytest.mark.parametrize("over, key", [
    (dict(cp_size=2, hidden_size=65536, seq_lens=[100000]), "hidden_size=65536"),
    (dict(cp_size=2, hidden_size=64, seq_lens=[16000000]), "seq_lens=[16000000]"),
    (dict(cp_size=8, hidden_size=4096, num_experts=65536, seq_lens=[100]), "num_experts=65536"),
    (dict(cp_size=2, hidden_size=4096, seq_lens=[100], align=1 << 24), "align=16777216"),
])
def test_more_memory_than_the_machine_has_names_the_key(over, key):
    msg = refused([cfg(**over)])
    pattern = rf"{re.escape(key)}: \d+ ranks x ~[\d.]+ GiB exceed this machine's 23\.4 GiB available memory .*"
    assert re.fullmatch(pattern, msg), msg


def test_the_gpu_preset_on_a_cpu_machine_is_refused_with_its_time_estimate():
    """DeepSeek-V3.2's shape (H=7168 bf16, 256 experts, cp 8, 8k-16k tokens),
    8 points: hours on 2 CPU cores; refused even where memory suffices."""
    preset = dict(cp_size=8, hidden_size=7168, dtype="bfloat16", num_experts=256, topk=8, warmup=10, iters=50)
    cfgs = [cfg(**preset, seq_lens=s, shared_kv=kv) for s in ([8192], [16384], [3000, 5000, 8000],
                                                                [1024, 2048, 4096, 7000, 1500]) for kv in (False, True)]
    msg = refused(cfgs, machine=BIG)
    m = re.fullmatch(r"cp_size=8 hidden_size=7168 seq_lens=\[16384\]: the sweep's 8 points would take ~(\d+) min "
                     r"on this machine \(cpu/gloo at ~0\.075 GB/s busbw; this point ~\d+ min\), over the 60 min limit "
                     r"\(set force=true to run anyway\)", msg)
    assert m and int(m.group(1)) > 60, msg
    seconds, desc = sweep_estimate(cfgs, BIG)
    assert seconds > budget.MAX_SWEEP_S and desc.startswith("cpu/gloo, 1 rank starts, at ~0.075 GB/s busbw; peak 8 ranks")
    # On 8 GPUs with NCCL the same sweep is minutes.
    gpus = dataclasses.replace(BIG, gpus=8, gpu_bytes=141e9)
    check_sweep(cfgs, runs_here=True, machine=gpus)
    assert sweep_estimate(cfgs, gpus)[0] < 600


def test_force_skips_the_checks():
    check_sweep([cfg(cp_size=1024, hidden_size=64, force=True)], runs_here=True, machine=CI)
    # an unforced point of the same sweep is still checked
    refused([cfg(cp_size=1024, hidden_size=64, force=True), cfg(cp_size=512, hidden_size=64)])


def test_remote_launchers_check_only_what_no_node_holds():
    check_sweep([cfg(cp_size=1024, hidden_size=64)], runs_here=False)  # the node decides
    msg = refused([cfg(cp_size=1, hidden_size=65536, seq_lens=[16777216])], runs_here=False)
    assert re.fullmatch(r"seq_lens=\[16777216\]: ~[\d.]+ GiB per rank exceed any node's memory \(taken as 2048\.0 GiB\) .*",
                        msg), msg


@pytest.mark.parametrize("preset", ["smoke", "default"])
def test_the_cpu_presets_fit_the_ci_machine(preset):
    from matrix.preflight import points

    cfgs = [c for c, _ in points(["-m", f"+matrix={preset}", "results_dir=/unused"])]
    check_sweep(cfgs, runs_here=True, machine=CI)
    seconds, _ = sweep_estimate(cfgs, CI)
    assert seconds < 10 * 60  # "under 5 minutes on a 2-core machine", within the model's slack


def test_rank_starts_count_changes_of_world():
    a, b = cfg(cp_size=2, hidden_size=64), cfg(cp_size=4, hidden_size=64)
    ests = [estimate(c, CI) for c in (a, a, b, b, a)]
    assert len(budget._starts(ests)) == 3


def test_this_machine_is_read():
    m = budget.this_machine()
    assert m.cores >= 1 and m.memory_bytes > 0 and m.max_ranks >= budget.MIN_RANK_LIMIT or m.max_ranks >= 0
    assert m.memory_source in ("available memory", "cgroup memory limit", "physical memory")


def test_the_memory_estimate_bounds_a_real_points_peak(tmp_path):
    """Estimate vs the peak resident memory of real ranks at one point: an
    upper bound (within the libraries' variation), and not a loose one."""
    from matrix.point import resolve
    from nsa_cp_comm.harness import RankPool
    from nsa_cp_comm.harness.measure import run_point

    c = cfg(cp_size=2, hidden_size=1024, seq_lens=[12000], dtype="float32", warmup=0, iters=1)
    est = estimate(c, CI)
    with RankPool(2, workdir=tmp_path) as pool:
        out = run_point(resolve(c, gpus=0).spec, pool, timeout_s=600)
        assert [r.status for r in out] == ["ok", "ok"], [r.reason for r in out]
        peaks = []
        for pid in pool.pids:
            status = open(f"/proc/{pid}/status").read()
            peaks.append(int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024)
    # Within 10 %: the shared libraries' resident pages vary by some tens of MB
    # between environments (a freshly installed one maps more); the estimate
    # is there to catch order-of-magnitude mistakes, not to predict the peak.
    assert max(peaks) <= 1.1 * est.rank_bytes and est.rank_bytes <= 2 * max(peaks), (peaks, est.rank_bytes)


def test_preflight_refuses_the_gpu_preset_on_this_cpu_machine(tmp_path):
    import torch

    from matrix.preflight import preflight

    if torch.cuda.is_available():
        pytest.skip("a GPU machine runs the preset")
    argv = ["-m", "+matrix=deepseek_v32", f"results_dir={tmp_path / 'r'}"]
    with pytest.raises(ConfigError, match=r"\(set force=true to run anyway\)$"):
        preflight(argv)
    preflight([*argv, "force=true"])
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("case", table.BOUNDS, ids=lambda b: " ".join(b.args))
def test_the_bound_rows_of_reliability_md(case):
    """The rows RELIABILITY.md shows: each sweep composed as the CLI composes
    it, checked for the CI-sized machine."""
    from matrix.preflight import points

    cfgs = [c for c, _ in points(["-m", "results_dir=/unused", *case.args])]
    if not case.expect:
        check_sweep(cfgs, runs_here=True, machine=CI)
        return
    msg = refused(cfgs)
    assert table.matches(msg, case.expect), msg
