"""Bounds from the machine: a sweep beyond it is refused in one line naming
the key, the estimate and the limit, before anything starts."""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re

import pytest

import reliability_table as table
from matrix.app import budget
from matrix.app.budget import check_sweep, estimate, sweep_estimate
from matrix.app.config import ConfigError
from matrix.app.resolve import Resolved, resolve, resolve_remote
from matrix_cli import config_of as cfg
from nsa_cp_comm.harness import RankPool, machine
from nsa_cp_comm.harness.machine import Machine

GIB = 1 << 30
# The CI-sized machine: 2 cores, ~23 GiB, no GPU.
CI = Machine(**table.BOUND_MACHINE)
BIG = dataclasses.replace(CI, memory_bytes=1024.0 * GIB)


def on(m: Machine, *cfgs: dict) -> list[Resolved]:
    """The points resolved as preflight resolves them on ``m``."""
    return [resolve(c, gpus=m.gpus) for c in cfgs]


def refused(cfgs: list[dict], m: Machine = CI, runs_here: bool = True) -> str:
    points = on(m, *cfgs) if runs_here else [resolve_remote(c) for c in cfgs]
    with pytest.raises(ConfigError) as info:
        check_sweep(points, runs_here=runs_here, machine=m)
    msg = str(info.value)
    assert "\n" not in msg and msg.endswith("(set force=true to run anyway)"), msg
    return msg


def test_the_gpu_preset_on_a_cpu_machine_is_refused_with_its_time_estimate():
    """DeepSeek-V3.2's shape (H=7168 bf16, 256 experts, cp 8, 8k-16k tokens),
    8 points: hours on 2 CPU cores; refused even where memory suffices."""
    preset = dict(cp_size=8, hidden_size=7168, dtype="bfloat16", num_experts=256, topk=8, warmup=10, iters=50)
    cfgs = [cfg(**preset, seq_lens=s, shared_kv=kv) for s in ([8192], [16384], [3000, 5000, 8000],
                                                                [1024, 2048, 4096, 7000, 1500]) for kv in (False, True)]
    msg = refused(cfgs, BIG)
    m = re.fullmatch(r"cp_size=8 hidden_size=7168 seq_lens=\[16384\]: the sweep's 8 points would take ~(\d+) min "
                     r"on this machine \(cpu/gloo at ~0\.075 GB/s busbw; this point ~\d+ min\), over the 60 min limit "
                     r"\(set force=true to run anyway\)", msg)
    assert m and int(m.group(1)) > 60, msg
    seconds, desc = sweep_estimate(on(BIG, *cfgs), BIG)
    assert seconds > budget.MAX_SWEEP_S and desc.startswith("cpu/gloo, 1 rank starts, at ~0.075 GB/s busbw; peak 8 ranks")
    # On 8 GPUs with NCCL the same sweep is minutes.
    gpus = dataclasses.replace(BIG, gpus=8, gpu_bytes=141e9)
    check_sweep(on(gpus, *cfgs), runs_here=True, machine=gpus)
    assert sweep_estimate(on(gpus, *cfgs), gpus)[0] < 600


def test_force_skips_the_checks():
    check_sweep(on(CI, cfg(cp_size=1024, hidden_size=64, force=True)), runs_here=True, machine=CI)
    # an unforced point of the same sweep is still checked
    refused([cfg(cp_size=1024, hidden_size=64, force=True), cfg(cp_size=512, hidden_size=64)])


def test_remote_launchers_check_only_what_no_node_holds():
    check_sweep([resolve_remote(cfg(cp_size=1024, hidden_size=64))], runs_here=False)  # the node decides
    msg = refused([cfg(cp_size=1, hidden_size=65536, seq_lens=[16777216])], runs_here=False)
    assert re.fullmatch(r"seq_lens=\[16777216\]: ~[\d.]+ GiB per rank exceed any node's memory \(taken as 2048\.0 GiB\) .*",
                        msg), msg


@pytest.mark.parametrize("preset", ["smoke", "default"])
def test_the_cpu_presets_fit_the_ci_machine(preset):
    from matrix.app.preflight import points

    resolved = on(CI, *(c for c, _ in points(["-m", f"+matrix={preset}", "results_dir=/unused"])))
    check_sweep(resolved, runs_here=True, machine=CI)
    seconds, _ = sweep_estimate(resolved, CI)
    assert seconds < 10 * 60  # "under 5 minutes on a 2-core machine", within the model's slack


def test_rank_starts_count_changes_of_world():
    a, b = cfg(cp_size=2, hidden_size=64), cfg(cp_size=4, hidden_size=64)
    ests = [estimate(r, CI) for r in on(CI, a, a, b, b, a)]
    assert len(budget._starts(ests)) == 3


def test_this_machine_is_read():
    m = machine.this_machine()
    assert m.cores >= 1 and m.memory_bytes > 0
    assert m.memory_source in ("available memory", "cgroup memory limit", "physical memory")
    per_core = max(machine.MIN_RANK_LIMIT, machine.RANKS_PER_CORE * m.cores)
    if m.max_ranks_source == f"{machine.RANKS_PER_CORE} per core, {m.cores} cores":
        assert m.max_ranks == per_core
    else:  # a task limit leaves room for fewer
        assert 0 <= m.max_ranks < per_core and "leaves room for" in m.max_ranks_source, m


def test_the_gpus_are_read_once_per_process(monkeypatch):
    """Resolving a sweep reads the devices once, not once per point."""
    import torch

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(1) or False)
    monkeypatch.setattr(machine, "gpu_driver_absent", lambda: False)  # a GPU machine's answer: torch's
    machine.gpus.cache_clear()
    try:
        on_this = [resolve(cfg(cp_size=cp, hidden_size=64)) for cp in (1, 2, 4)]
        assert [r.backend for r in on_this] == ["gloo"] * 3 and machine.this_machine().gpus == 0
        assert len(asked) == 1
    finally:
        machine.gpus.cache_clear()  # the next caller reads the real devices


@pytest.mark.parametrize("nodes, platform, absent", [
    ((), "linux", True),
    (("/dev/nvidia0",), "linux", False),
    (("/dev/kfd",), "linux", False),
    (("/dev/dxg",), "linux", False),
    ((), "win32", False),  # no device nodes to read there: torch is asked
])
def test_without_a_gpu_drivers_device_node_no_gpu_is_seen_and_torch_is_not_asked(monkeypatch, nodes, platform,
                                                                                  absent):
    """A sweep's own process reads the GPUs of the machine; where Linux has no GPU driver's
    device node it answers none without torch (whose import is seconds of a CLI's start)."""
    import torch

    monkeypatch.setattr(machine.glob, "glob", lambda pattern: [n for n in nodes if fnmatch.fnmatch(n, pattern)])
    monkeypatch.setattr(machine.sys, "platform", platform)
    assert machine.gpu_driver_absent() is absent
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(1) or False)
    machine.gpus.cache_clear()
    try:
        assert machine.gpus() == (0, 0.0) and len(asked) == (0 if absent else 1)
    finally:
        machine.gpus.cache_clear()


CGROUP_V2 = {"/proc/self/cgroup": "0::/job\n", "/proc/meminfo": "MemTotal: 64000000 kB\nMemAvailable: 32000000 kB\n"}


@pytest.mark.parametrize("files, expect", [
    # a v2 cgroup: half a CPU, 4 GiB, 100 tasks of which 60 are used
    ({**CGROUP_V2, "/sys/fs/cgroup/job/cpu.max": "50000 100000", "/sys/fs/cgroup/job/memory.max": "4294967296",
      "/sys/fs/cgroup/job/pids.max": "100", "/sys/fs/cgroup/job/pids.current": "60"},
     (1, 4.0 * GIB, "cgroup memory limit", 5, "the cgroup's pids.max=100 leaves room for 5 ranks of ~8 threads")),
    # a cgroup that sets no limit: "max" everywhere
    ({**CGROUP_V2, "/sys/fs/cgroup/job/cpu.max": "max 100000", "/sys/fs/cgroup/job/memory.max": "max",
      "/sys/fs/cgroup/job/pids.max": "max"},
     (None, 32000000 * 1024, "available memory", None, None)),
    # v1: CPU quota files, and the near-2**63 "unlimited" memory
    ({"/proc/self/cgroup": "4:cpu,cpuacct:/j\n3:memory:/j\n", "/proc/meminfo": CGROUP_V2["/proc/meminfo"],
      "/sys/fs/cgroup/cpu,cpuacct/j/cpu.cfs_quota_us": "100000", "/sys/fs/cgroup/cpu,cpuacct/j/cpu.cfs_period_us": "100000",
      "/sys/fs/cgroup/memory/j/memory.limit_in_bytes": "9223372036854771712"},
     (1, 32000000 * 1024, "available memory", None, None)),
])
def test_the_machine_is_read_through_its_cgroup(monkeypatch, files, expect):
    """The one cgroup reader, on a simulated /proc and /sys/fs/cgroup."""
    monkeypatch.setattr(machine, "_read", lambda path: files.get(path, ""))
    monkeypatch.setattr(machine.resource, "getrlimit", lambda _: (machine.resource.RLIM_INFINITY,) * 2)
    m = machine.this_machine()
    cores, memory, source, ranks, why = expect
    assert (m.memory_bytes, m.memory_source) == (memory, source)
    assert m.cores == (cores or m.cores) and m.cores <= max(1, len(os.sched_getaffinity(0)))
    per_core = max(machine.MIN_RANK_LIMIT, machine.RANKS_PER_CORE * m.cores)
    assert (m.max_ranks, m.max_ranks_source) == (ranks or per_core, why or f"4 per core, {m.cores} cores")


def test_rlimit_nproc_bounds_the_ranks(monkeypatch):
    monkeypatch.setattr(machine, "_read", lambda path: "")
    monkeypatch.setattr(machine.resource, "getrlimit", lambda _: (100, 200))
    monkeypatch.setattr(machine.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(machine, "_user_tasks", lambda: 76)
    m = machine.this_machine()
    assert (m.max_ranks, m.max_ranks_source) == (3, "RLIMIT_NPROC=100 leaves room for 3 ranks of ~8 threads")
    monkeypatch.setattr(machine.os, "geteuid", lambda: 0)  # root: RLIMIT_NPROC does not apply
    assert machine.this_machine().max_ranks == max(machine.MIN_RANK_LIMIT, machine.RANKS_PER_CORE * m.cores)


def test_the_oom_counter_is_read_from_this_cgroup_first(monkeypatch):
    from nsa_cp_comm.harness import exits

    monkeypatch.setattr(machine, "_read", lambda path: "0::/job\n" if path == "/proc/self/cgroup" else "")
    files = exits.oom_counter_files()
    assert files[0] == "/sys/fs/cgroup/job/memory.events" and files[-1] == "/proc/vmstat"


def test_the_memory_estimate_bounds_a_real_points_peak(tmp_path):
    """Estimate vs the peak resident memory of real ranks at one point: an
    upper bound (within the libraries' variation), and not a loose one."""
    from nsa_cp_comm.harness.measure import run_point

    (point,) = on(CI, cfg(cp_size=2, hidden_size=1024, seq_lens=[12000], dtype="float32", warmup=0, iters=1))
    est = estimate(point, CI)
    with RankPool(2, workdir=tmp_path) as pool:
        out = run_point(point.spec, pool, timeout_s=600)
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

    from matrix.app.preflight import preflight

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
    from matrix.app.preflight import points

    cfgs = [c for c, _ in points(["-m", "results_dir=/unused", *case.args])]
    if not case.expect:
        check_sweep(on(CI, *cfgs), runs_here=True, machine=CI)
        return
    msg = refused(cfgs)
    assert table.matches(msg, case.expect), msg


def test_a_padded_shard_implementation_is_sized_by_the_engines_physical_length():
    """An implementation that takes the split's [P_r, H] shard gathers P_r*cp
    rows (P_r by the plan's engine, at least max_rank_len): its memory
    estimate counts them."""
    from nsa_cp_comm import impls, protocol

    probe = impls.RoundTripImpl("padded_shard_probe", lambda *a: None, lambda *a: None, shard="padded")
    impls.register(probe)
    try:
        point = dict(cp_size=8, seq_lens=[9], policy="round_robin", engine="sglang_0_5_23", hidden_size=4096)
        plan = on(CI, cfg(**point))[0].plan()
        assert protocol.shard_len(plan) * 8 > plan.padded_total  # P = 8 rows a rank, m = 2
        padded, shard = (estimate(r, CI) for r in on(CI, cfg(**point, impl="padded"),
                                                     cfg(**point, impl="padded_shard_probe")))
        assert shard.rank_bytes > padded.rank_bytes
    finally:
        impls.REGISTRY.pop("padded_shard_probe", None)


def test_a_point_estimated_past_its_timeout_is_said_before_it_runs(tmp_path, capsys):
    """A point whose estimate is past its timeout_s would end as a timeout row: the dry run and the
    sweep's start say so in one line, naming the point, the estimate and the bound; none otherwise."""
    from matrix.app import sweep

    big = ["-m", f"results_dir={tmp_path / 'r'}", "cp_size=2", "seq_lens=[100000]", "hidden_size=2048", "timeout_s=5"]
    assert sweep.main([*big, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "warning: 1 point(s) estimated past their timeout_s, e.g. point 0: ~" in out, out
    assert "against timeout_s=5: they would end as timeout rows; raise timeout_s" in out, out
    assert sweep.main(["-m", f"results_dir={tmp_path / 'r'}", "cp_size=2", "seq_lens=[64]", "--dry-run"]) == 0
    assert "estimated past their timeout_s" not in capsys.readouterr().out
