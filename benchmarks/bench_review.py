"""How long the review tools take on a big results file.

Synthesises a results.csv of N rows (default 200000) with the schema's columns
(``matrix.store.results.COLUMNS``), shaped like repeated default sweeps: every cp
size, layout, batch and MoE backend, padded/legacy/a2a rows with the statuses a
real run writes (ok, refused, passthrough, a few errors, reruns appended as
duplicates). A second file (NEW) is the same run re-timed with a few points made
slower. Then, each in a fresh process, it times ``matrix.compare.cli.main(BASE NEW)``
and ``matrix.report.cli.main(BASE)`` and prints the seconds of each call, the
process's wall time (imports included) and its peak RSS (resource.getrusage).

    python benchmarks/bench_review.py [--rows 200000] [--keep DIR]

``synthesise`` is also what the review tools' tests use for big inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
for _p in (REPO, REPO / "src"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from matrix.scale.plan_classes import label  # noqa: E402
from matrix.store.results import COLUMNS, RESULTS_FILE  # noqa: E402
from matrix.store.runs import RUNS_FILE, run_line  # noqa: E402

# (split, shared_kv, page_size, policy) as conf/layout/*.yaml give them
LAYOUTS = (
    ("zigzag", False, 1, "zigzag"),
    ("round_robin", False, 1, "round_robin"),
    ("zigzag", True, 1, "zigzag_page"),
    ("zigzag", True, 16, "zigzag_page"),
    ("zigzag", True, 64, "zigzag_page"),
)
SEQ_LENS = ((1000,), (1001, 300), (17,), (37, 512, 129, 900, 64, 3, 700, 250, 1, 333, 96, 180))
CP_SIZES = (1, 2, 4, 8)
HIDDEN = 256
# The one run that "wrote" a synthetic file: its line of runs.jsonl.
RUN = dict(run_id="0123456789abcdef", started="2026-01-01T00:00:00+00:00", host="bench", git_sha="0123abcd",
           torch_version="2.13.0+cpu", nccl_version="", command="python -m matrix +matrix=default")
# the resume that reran the points that errored: a run of its own, as resume=true makes one
RERUN = {**RUN, "run_id": "fedcba9876543210", "started": "2026-01-01T06:00:00+00:00",
         "command": "python -m matrix +matrix=default resume=true"}
BYTES_PER_ELEM = 2  # bfloat16


def _sweep() -> pd.DataFrame:
    """One default sweep: a row per (point, impl), with its plan and status."""
    from nsa_cp_comm.plan import plan_split

    rows = []
    for cp in CP_SIZES:
        for split, shared, page, policy in LAYOUTS:
            for lens in SEQ_LENS:
                try:
                    plan = plan_split(lens, cp, policy=policy, page_size=page)
                except ValueError:
                    plan = None
                for backend, mode, impls in (("none", "FULL", ("padded", "legacy")),
                                             ("deepep", "SCATTERED", ("padded", "legacy", "a2a"))):
                    for impl in impls:
                        if plan is None:
                            status = "skipped"
                        elif mode == "SCATTERED" and impl != "a2a":
                            status = "passthrough"
                        elif impl == "legacy" and not plan.is_even:
                            status = "refused"
                        else:
                            status = "ok"
                        rows.append(dict(
                            cp_size=cp, page_size=page, seq_lens="[" + ",".join(map(str, lens)) + "]",
                            shared_kv=shared, split=split, align=cp, moe_a2a_backend=backend, mlp_mode=mode,
                            impl=impl, policy=policy, effective_page_size=page if policy == "zigzag_page" else 1,
                            total_tokens=plan.total_tokens if plan else np.nan,
                            max_rank_len=plan.max_rank_len if plan else np.nan,
                            padded_total=plan.padded_total if plan else np.nan,
                            padding_frac=plan.padding_frac if plan else np.nan,
                            is_even=plan.is_even if plan else None, claim_holds=plan.claim_holds if plan else None,
                            plan_class=label(plan) if plan else "", status=status,
                        ))
    return pd.DataFrame(rows)


def synthesise(n: int = 200_000, seed: int = 0, dup_frac: float = 0.01, error_frac: float = 0.002) -> pd.DataFrame:
    """``n`` rows of the results schema (strings; empty where not applicable).

    Sweeps are repeated with distinct ``seed`` values so every row is its own
    point, except ``dup_frac`` of them: those points first got an ``error`` row
    and were rerun (resume: a run of its own), the ok row appended at the end of the file."""
    rng = np.random.default_rng(seed)
    sweep = _sweep()
    reruns = int(n * dup_frac)
    base_n = n - reruns
    idx = np.arange(base_n)
    df = sweep.iloc[idx % len(sweep)].reset_index(drop=True)
    df["seed"] = idx // len(sweep)
    for key, value in dict(hidden_size=HIDDEN, dtype="bfloat16", num_experts=8, topk=2, warmup=2, iters=8,
                           flush_l2=False, backend="gloo", device="cpu", timeout_s=120, results_dir="results/big",
                           resume=False, device_name="AMD EPYC", impl_origin="nsa_cp_comm 0.1.0",
                           run_id=RUN["run_id"]).items():
        df[key] = value
    df["effective_id"] = [f"{i:012x}" for i in rng.integers(0, 2**48, base_n)]
    df["point_id"] = df["effective_id"]
    df["timestamp"] = "2026-01-01T00:00:00+00:00"
    df["wall_s"] = rng.uniform(0.2, 3.0, base_n).round(3)
    df["overrides"] = "cp_size=1,2,4,8 +layout=zigzag,round_robin,shared_page1,shared_page16,shared_page64"
    df["repro"] = "python -m matrix cp_size=" + df["cp_size"].astype(str) + " impl=" + df["impl"]

    status = df["status"].to_numpy(dtype=object)
    status[(status == "ok") & (rng.random(base_n) < error_frac)] = "error"
    df["status"] = status
    ok = df["status"].eq("ok").to_numpy()
    tokens = df["total_tokens"].fillna(0).to_numpy()
    padded = df["padded_total"].fillna(0).to_numpy()
    cp = df["cp_size"].to_numpy()
    p50 = (30.0 + 40.0 * cp + 0.25 * tokens * (cp > 1)) * rng.lognormal(0.0, 0.15, base_n)
    iqr = p50 * rng.uniform(0.05, 0.4, base_n)
    moved = np.where(df["impl"].eq("legacy"), tokens, padded)
    bytes_padded = moved * HIDDEN * BYTES_PER_ELEM
    bytes_useful = tokens * HIDDEN * BYTES_PER_ELEM
    bus = (cp - 1) / cp
    local = np.where(df["impl"].eq("padded"), p50 * rng.uniform(0.02, 0.15, base_n), 0.0)
    timings = dict(
        roundtrip_p10_us=p50 * 0.9, roundtrip_p50_us=p50, roundtrip_p90_us=p50 * 1.2, roundtrip_p99_us=p50 * 1.5,
        roundtrip_mean_us=p50 * 1.05, roundtrip_iqr_us=iqr,
        gather_p10_us=p50 * 0.45, gather_p50_us=p50 * 0.5, gather_p90_us=p50 * 0.6, gather_mean_us=p50 * 0.52,
        scatter_p10_us=p50 * 0.45, scatter_p50_us=p50 * 0.5, scatter_p90_us=p50 * 0.6, scatter_mean_us=p50 * 0.52,
        local_p10_us=local * 0.9, local_p50_us=local, local_p90_us=local * 1.2, local_mean_us=local,
        collective_p10_us=(p50 - local) * 0.9, collective_p50_us=p50 - local, collective_p90_us=(p50 - local) * 1.2,
        collective_mean_us=p50 - local, rows_moved=moved, bytes_padded=bytes_padded, bytes_useful=bytes_useful,
        algbw_padded_GBps=bytes_padded / p50 / 1e3, busbw_padded_GBps=bytes_padded / p50 / 1e3 * bus,
        algbw_useful_GBps=bytes_useful / p50 / 1e3, busbw_useful_GBps=bytes_useful / p50 / 1e3 * bus,
    )
    for key, values in timings.items():
        df[key] = np.where(ok, values, np.nan)
    checked = df["status"].isin(["ok", "refused", "passthrough"]).to_numpy()
    df["correct"] = np.where(checked, "True", "")
    df["max_rel_err"] = np.where(ok, 0.0, np.nan)
    even_pair = ok & df["impl"].eq("padded").to_numpy() & df["is_even"].eq(True).to_numpy()
    df["even_bitwise_equal"] = np.where(even_pair, "True", "")
    df["reason"] = np.select(
        [df["status"].eq(s).to_numpy() for s in ("error", "refused", "passthrough", "skipped")],
        ["rank 0 error: RuntimeError: connection reset", "legacy refuses an uneven plan",
         "SCATTERED: rows pass through, no collective", "plan_split: invalid plan"], "")
    df["failed_check"] = ""

    if reruns:
        # the rerun rows: error in place, the ok rerun appended at the end
        pick = rng.choice(np.flatnonzero(ok), size=min(reruns, int(ok.sum())), replace=False)
        rerun = df.iloc[pick].copy()
        df.loc[pick, "status"] = "error"
        df.loc[pick, "reason"] = "timed out after 120 s"
        df.loc[pick, "correct"] = ""
        df.loc[pick, list(timings)] = np.nan
        rerun["run_id"] = RERUN["run_id"]
        df = pd.concat([df, rerun], ignore_index=True)
    return df.reindex(columns=list(COLUMNS))


def write(df: pd.DataFrame, results_dir: Path) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / RESULTS_FILE
    df.to_csv(path, index=False, na_rep="", float_format="%.6g")
    (results_dir / RUNS_FILE).write_bytes(run_line(RUN) + run_line(RERUN))
    return path


def slower(df: pd.DataFrame, seed: int = 1, frac: float = 0.005, factor: float = 1.5) -> pd.DataFrame:
    """The same run re-timed (a few percent of jitter), ``frac`` of the ok rows ``factor`` slower."""
    rng = np.random.default_rng(seed)
    out = df.copy()
    jitter = rng.lognormal(0.0, 0.03, len(out))
    jitter[rng.random(len(out)) < frac] = factor
    for col in ("roundtrip_p50_us", "roundtrip_p10_us", "roundtrip_p90_us", "roundtrip_mean_us"):
        out[col] = out[col] * jitter
    return out


_CHILD = r"""
import contextlib, io, json, resource, sys, time
sys.path[:0] = [{repo!r}, {src!r}]
from matrix.{tool}.cli import main
start, cpu = time.perf_counter(), time.process_time()
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    code = main({argv!r})
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps(dict(code=code, seconds=seconds, cpu_s=cpu, maxrss_kb=usage.ru_maxrss)))
"""


def time_tool(tool: str, argv: list[str]) -> dict[str, float]:
    """``matrix.<tool>.cli.main(argv)`` in a fresh process: its wall and CPU seconds
    (CPU time is what a loaded machine does not inflate), exit code, the
    process's wall time and peak RSS."""
    code = _CHILD.format(repo=str(REPO), src=str(REPO / "src"), tool=tool, argv=argv)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - start
    return result


def _machine() -> str:
    try:
        from nsa_cp_comm.harness.machine import cpu_model

        cpu = cpu_model()
    except Exception:  # noqa: BLE001 - a label only
        cpu = platform.processor() or platform.machine()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    versions = f"python {platform.python_version()}, pandas {pd.__version__}"
    return f"{cpu}, {os.cpu_count()} cores, load average {load}; {versions}"


def make_inputs(rows: int, root: Path) -> tuple[Path, Path]:
    """BASE and NEW results files under ``root``."""
    base = synthesise(rows)
    return write(base, root / "base"), write(slower(base), root / "new")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the synthetic results file")
    parser.add_argument("--keep", metavar="DIR", help="write the files here and keep them (default: a temp dir)")
    parser.add_argument("--inputs-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error("--rows must be positive")
    if args.inputs_only:
        make_inputs(args.rows, Path(args.keep))
        return 0

    with tempfile.TemporaryDirectory(prefix="bench_review_") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        # The inputs are made in a process of their own: a child forked from a
        # parent holding the synthetic frames would report the parent's peak RSS.
        start = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--inputs-only", "--rows", str(args.rows), "--keep", str(root)],
                       check=True)
        made = time.perf_counter() - start
        base_csv, new_csv = root / "base" / RESULTS_FILE, root / "new" / RESULTS_FILE
        size = base_csv.stat().st_size / 2**20
        with base_csv.open() as f:
            lines = sum(1 for _ in f) - 1
        print(f"machine: {_machine()}")
        print(f"input: {lines} rows x {len(COLUMNS)} columns ({size:.0f} MiB), synthesised in {made:.1f} s")
        runs = (
            ("compare", "matrix.compare BASE NEW", [str(base_csv), str(new_csv)]),
            ("report", "matrix.report BASE", [str(base_csv), "--out", str(root / "report")]),
        )
        for tool, label, tool_argv in runs:
            r = time_tool(tool, tool_argv)
            print(f"{label}: main() {r['seconds']:.2f} s wall, {r['cpu_s']:.2f} s CPU; process {r['process_s']:.2f} s "
                  f"(imports included); peak RSS {r['maxrss_kb'] / 1024:.0f} MiB; exit {r['code']}")
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
