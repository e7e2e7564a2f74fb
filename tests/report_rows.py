"""Rows and readers shared by the report's tests: one schema row with its plan
numbers given (not computed, so the tests stay independent of the planner),
the run that appends it, a mixed run of every status, the report run in-process,
its markdown sections and its frame."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd

from matrix.report import cli as report_cli
from matrix.review import _review, report
from matrix.store.results import COLUMNS, append_rows
from matrix_cli import REPO


def bench_review():
    """benchmarks/bench_review.py as a module (its synthesiser makes whole sweeps)."""
    spec = importlib.util.spec_from_file_location("bench_review", REPO / "benchmarks" / "bench_review.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_row(impl: str = "padded", policy: str = "zigzag", cp: int = 2, page: int = 1,
             seq_lens: tuple[int, ...] = (512, 512), p50: float | None = 100.0, status: str = "ok",
             correct: bool | None = True, padded_total: int | None = None, iqr: float | None = None,
             **extra: object) -> dict[str, object]:
    """One schema row; plan numbers are given, not computed (keeps the test independent of the planner)."""
    total = sum(seq_lens)
    padded = total if padded_total is None else padded_total
    even = padded == total
    row: dict[str, object] = dict(
        cp_size=cp, page_size=page, seq_lens="[" + ",".join(map(str, seq_lens)) + "]",
        # as the writer records a page-aligned split: the config's split with shared KV on
        shared_kv=policy == "zigzag_page", split="zigzag" if policy == "zigzag_page" else policy, align=cp, moe_a2a_backend="none", mlp_mode="FULL", impl=impl, backend="gloo",
        device="cpu", hidden_size=256, dtype="float32", num_experts=4, topk=2, warmup=1, iters=5, seed=0,
        flush_l2=False, timeout_s=60, results_dir="r", resume=False,
        policy=policy, effective_page_size=page, effective_id=f"{impl}{cp}{page}{seq_lens}", total_tokens=total,
        max_rank_len=padded // cp, padded_total=padded, padding_frac=1.0 - total / padded, is_even=even,
        claim_holds=even, status=status, reason="", correct=correct, max_rel_err=0.0,
        even_bitwise_equal=(True if even and impl == "padded" and status == "ok" else None),
        impl_origin="nsa_cp_comm 0.1.0", device_name="cpu", timestamp="2025-01-01T00:00:00", wall_s=1.5,
        point_id=f"{impl}-{policy}-{cp}-{page}-{seq_lens}",
        overrides="cp_size=2,4 policy=zigzag,round_robin", repro=f"python -m matrix impl={impl} cp_size={cp}",
    )
    if p50 is not None and status == "ok":
        bp = padded * 256 * 4
        bus = (cp - 1) / cp
        row.update(
            roundtrip_p10_us=p50 * 0.9, roundtrip_p50_us=p50, roundtrip_p90_us=p50 * 1.1, roundtrip_p99_us=p50 * 1.2,
            roundtrip_mean_us=p50, roundtrip_iqr_us=iqr, gather_p50_us=p50 / 2, scatter_p50_us=p50 / 2,
            local_p50_us=p50 * 0.1 if impl == "padded" else None, rows_moved=padded,
            bytes_padded=bp, bytes_useful=total * 256 * 4,
            busbw_padded_GBps=bp / p50 / 1e3 * bus, busbw_useful_GBps=total * 1024 / p50 / 1e3 * bus,
        )
    row.update(extra)
    assert set(row) <= set(COLUMNS)
    return row


# The run that writes a test's rows: its line of runs.jsonl.
RUN = dict(run_id="run00001", torch_version="2.13.0", nccl_version="", host="box1", git_sha="abc1234",
           python_version="3.12.1", nsa_cp_comm_version="0.1.0", started="2025-01-01T00:00:00+00:00",
           command="python -m matrix -m cp_size=2,4")


def append(results_dir: Path, rows: list[dict[str, object]], **meta: object) -> None:
    """``rows`` appended by one run: ``RUN``, with ``meta`` changed."""
    append_rows(results_dir, rows, run={**RUN, **meta})


def md_of(path: Path) -> tuple[str, str]:
    return (path / "report.md").read_text(), (path / "report_appendix.md").read_text()


def run_report(path: Path, *args: str, code: int = 0,
               rows: list[dict[str, object]] | None = None) -> tuple[str, str, dict]:
    """The report of ``path`` (``rows``, where given, appended to it first by
    one run): report.md, its appendix and report.json; ``code``: its exit code
    (1 where a row fails)."""
    if rows is not None:
        append(path, rows)
    assert report_cli.main([str(path), *args]) == code
    md, appendix = md_of(path)
    return md, appendix, json.loads((path / "report.json").read_text())


def section(md: str, title: str) -> str:
    start = md.index(f"## {title}")
    nxt = md.find("\n## ", start + 3)
    return md[start:] if nxt < 0 else md[start:nxt]


def table_row(text: str, first_cell: str, nth: int = 0) -> list[str]:
    """The cells of the ``nth`` (from 0) markdown table row of ``text`` whose first cell is ``first_cell``."""
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in text.splitlines() if ln.startswith("|")]
    return [r for r in rows if r[0] == first_cell][nth]


def _frame(path: Path) -> pd.DataFrame:
    return report.prepare(_review.load_run("RESULTS", str(path), report.READ))


TORCH_TEXT = "output tensor size must be equal to world_size times input tensor size"


def mixed_rows() -> list[dict[str, object]]:
    rows = []
    for cp in (2, 4):
        for policy in ("zigzag", "round_robin"):
            for n, (pad_us, leg_us) in {512: (110.0, 100.0), 2048: (220.0, 200.0)}.items():
                lens = (n, n)
                rows.append(make_row("padded", policy, cp, seq_lens=lens, p50=pad_us * cp / 2))
                rows.append(make_row("legacy", policy, cp, seq_lens=lens, p50=leg_us * cp / 2))
    # uneven, claim-failing zigzag_page plan: legacy refuses it
    uneven = dict(policy="zigzag_page", cp=4, page=64, seq_lens=(1001, 300), padded_total=1536)
    rows.append(make_row("padded", p50=300.0, **uneven))
    rows.append(make_row("legacy", status="refused", reason=f"refused: {TORCH_TEXT}", **uneven))
    # SCATTERED: the communicator passes rows through
    rows.append(make_row("padded", status="passthrough", mlp_mode="SCATTERED", moe_a2a_backend="deepep"))
    # the incorrect and failing points
    rows.append(make_row("allgatherv", "zigzag", 2, seq_lens=(777, 333), status="failed", correct=False,
                         max_rel_err=0.5, failed_check="reference_moe", reason="max_rel_err 0.5 > tol"))
    rows.append(make_row("padded", "round_robin", 4, seq_lens=(999, 1), even_bitwise_equal=False))
    rows.append(make_row("a2a", "zigzag", 2, status="error", correct=None, reason="ValueError: boom"))
    rows.append(make_row("a2a", "zigzag", 4, status="timeout", correct=None, reason="timed out after 60 s"))
    rows.append(make_row("sumlen_allreduce", "zigzag", 8, status="skipped", correct=None,
                         reason="same effective configuration as point 3"))
    return rows


def plot_rows() -> list[dict[str, object]]:
    rows = []
    for cp in (1, 2, 4):
        for impl, pad in (("padded", 1.1), ("legacy", 1.0)):
            for n in (512, 2048):
                rows.append(make_row(impl, cp=cp, seq_lens=(n, n), p50=pad * n * cp / 10))
    uneven = dict(policy="zigzag_page", cp=4, page=64, seq_lens=(1001, 300), padded_total=1536)
    rows.append(make_row("padded", p50=400.0, **uneven))
    rows.append(make_row("legacy", status="refused", **uneven))
    # passthrough rows with stray timings: never plotted
    rows.append(make_row("padded", cp=2, seq_lens=(7, 7), status="passthrough", mlp_mode="SCATTERED",
                         roundtrip_p50_us=0.01, busbw_padded_GBps=999.0, bytes_padded=10))
    rows.append(make_row("padded", "round_robin", cp=2, seq_lens=(512, 512), p50=100.0))
    return rows
