"""`python -m matrix.report`: sections, plots, input resolution and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from matrix import report
from matrix.results import COLUMNS, RESULTS_FILE, append_rows

LEGACY_ERROR = "output tensor size must be equal to world_size times input tensor size"
PNGS = ("roundtrip_latency.png", "padding_frac.png", "busbw.png")


def make_row(
    impl: str = "padded",
    policy: str = "zigzag",
    cp: int = 2,
    page: int = 1,
    seq_lens: tuple[int, ...] = (512, 512),
    p50: float | None = 100.0,
    status: str = "ok",
    correct: bool | None = True,
    padded_total: int | None = None,
    **extra: object,
) -> dict[str, object]:
    """One schema row; plan numbers are given, not computed (keeps the test independent of the planner)."""
    total = sum(seq_lens)
    padded = total if padded_total is None else padded_total
    even = padded == total
    row: dict[str, object] = dict(
        cp_size=cp, page_size=page, seq_lens="[" + ",".join(map(str, seq_lens)) + "]", shared_kv=False,
        split=policy, align=cp, moe_a2a_backend="none", mlp_mode="FULL", impl=impl, backend="gloo",
        device="cpu", hidden_size=256, dtype="float32", num_experts=4, topk=2, warmup=1, iters=5, seed=0,
        flush_l2=False, timeout_s=60, results_dir="r", resume=False, fault="",
        policy=policy, total_tokens=total, max_rank_len=padded // cp, padded_total=padded,
        padding_frac=1.0 - total / padded, is_even=even, claim_holds=even,
        status=status, reason="", correct=correct, max_rel_err=0.0,
        even_bitwise_equal=(True if even and impl == "padded" and status == "ok" else None),
        torch_version="2.13.0", nccl_version="", device_name="cpu", host="box1", git_sha="abc1234",
        timestamp="2025-01-01T00:00:00", wall_s=1.5, point_id=f"{impl}-{policy}-{cp}-{page}-{seq_lens}",
        overrides="cp_size=2,4 policy=zigzag,round_robin", repro=f"python -m matrix impl={impl} cp_size={cp}",
    )
    if p50 is not None:
        bp = padded * 256 * 4
        row.update(
            roundtrip_p10_us=p50 * 0.9, roundtrip_p50_us=p50, roundtrip_p90_us=p50 * 1.1, roundtrip_p99_us=p50 * 1.2,
            roundtrip_mean_us=p50, gather_p50_us=p50 / 2, scatter_p50_us=p50 / 2, rows_moved=padded,
            bytes_padded=bp, bytes_useful=total * 256 * 4,
            busbw_padded_GBps=bp / p50 / 1e3, busbw_useful_GBps=total * 1024 / p50 / 1e3,
        )
    row.update(extra)
    assert set(row) <= set(COLUMNS)
    return row


def mixed_rows() -> list[dict[str, object]]:
    rows = []
    for cp in (2, 4):
        for policy in ("zigzag", "round_robin"):
            for n, (pad_us, leg_us) in {512: (110.0, 100.0), 2048: (220.0, 200.0)}.items():
                lens = (n, n)
                rows.append(make_row("padded", policy, cp, seq_lens=lens, p50=pad_us * cp / 2))
                rows.append(make_row("legacy", policy, cp, seq_lens=lens, p50=leg_us * cp / 2))
    # uneven, claim-failing zigzag_page plan; legacy reproduces the expected error
    uneven = dict(policy="zigzag_page", cp=4, page=64, seq_lens=(1001, 300), padded_total=1536)
    rows.append(make_row("padded", p50=300.0, **uneven))
    rows.append(make_row("legacy", p50=None, reason=f"RuntimeError: {LEGACY_ERROR}", **uneven))
    # the incorrect points
    rows.append(make_row("allgatherv", "zigzag", 2, seq_lens=(777, 333), status="failed", correct=False,
                         max_rel_err=0.5, reason="max_rel_err 0.5 > tol"))
    rows.append(make_row("padded", "round_robin", 4, seq_lens=(999, 1), even_bitwise_equal=False))
    rows.append(make_row("a2a", "zigzag", 2, p50=None, status="error", correct=None, reason="ValueError: boom"))
    rows.append(make_row("a2a", "zigzag", 4, p50=None, status="timeout", correct=None, reason="timed out after 60 s"))
    rows.append(make_row("sumlen_allreduce", "zigzag", 8, p50=None, status="skipped", correct=None,
                         reason="cp_size=8 > world size 4"))
    return rows


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    append_rows(tmp_path / "run", mixed_rows())
    return tmp_path / "run"


def test_report_writes_markdown_and_pngs(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([str(run_dir)]) == 0
    md = (run_dir / "report.md").read_text()
    for name in PNGS:
        data = (run_dir / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 1000
    out = capsys.readouterr().out
    assert "wrote " in out and "report.md" in out
    # section order: correctness first, environment last
    titles = ("## Correctness", "## Claim check", "## Latency", "## Bandwidth", "## Environment")
    heads = [md.index(h) for h in titles]
    assert heads == sorted(heads)
    for text in (md, out):
        assert "!!! INCORRECT RESULTS: 2 point(s) !!!" in text
        assert "[777,333]" in text and "[999,1]" in text


def test_correctness_section_is_loud_and_first(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([str(run_dir)]) == 0
    md = (run_dir / "report.md").read_text()
    banner = md.index("INCORRECT RESULT(S)")
    loud = md.index("### !!! INCORRECT RESULTS")
    assert banner < md.index("## Correctness") < loud < md.index("### Points by status") < md.index("### Failed")
    failed = md[md.index("### Failed, error and timeout points (3)"):md.index("## Claim check")]
    assert "ValueError: boom" in failed and "timed out after 60 s" in failed and "max_rel_err 0.5" in failed
    # the legacy error on the uneven plan is expected, not a failure
    assert "1 legacy row(s) on uneven plans reproduced the expected error" in md
    assert LEGACY_ERROR not in failed
    assert "cp_size=8 > world size 4" in md  # skipped reason
    assert "python -m matrix impl=allgatherv cp_size=2" in md  # repro of the incorrect point


def test_clean_run_says_no_incorrect_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    append_rows(tmp_path, [make_row(), make_row("legacy", p50=90.0)])
    assert report.main([str(tmp_path / RESULTS_FILE)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "No incorrect results" in md and "INCORRECT" not in md


def test_claim_latency_bandwidth_environment(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([str(run_dir)]) == 0
    md = (run_dir / "report.md").read_text()
    claim = md[md.index("## Claim check"):md.index("## Latency")]
    assert "### Plans where the claim fails (1)" in claim
    # zigzag_page cp=4 page=64 [1001,300]: 1536 padded - 1301 tokens = 235 rows of padding
    fail_row = next(line for line in claim.splitlines() if "[1001,300]" in line)
    assert [c.strip() for c in fail_row.strip("| ").split("|")] == [
        "zigzag_page", "4", "64", "[1001,300]", "1301", "384", "1536", "235", "0.153"
    ]
    latency = md[md.index("## Latency"):md.index("## Bandwidth")]
    assert "ratio = padded / legacy" in latency
    assert "1.10" in latency  # every even pair is padded = 1.1 x legacy
    assert "round_robin" in latency and "zigzag" in latency
    bandwidth = md[md.index("## Bandwidth"):md.index("## Environment")]
    assert "busbw_padded_GBps" in bandwidth and "busbw_useful_GBps" in bandwidth and "page 64" in bandwidth
    env = md[md.index("## Environment"):]
    assert "2.13.0" in env and "box1" in env and "abc1234" in env
    assert "cp_size=2,4 policy=zigzag,round_robin" in env


def test_out_dir_and_nested_lookup(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    append_rows(tmp_path / "sweep" / "multirun" / "0", [make_row()])
    out = tmp_path / "elsewhere"
    assert report.main([str(tmp_path / "sweep"), "--out", str(out)]) == 0
    assert (out / "report.md").is_file() and all((out / p).stat().st_size > 0 for p in PNGS)
    assert not list((tmp_path / "sweep").rglob("report.md"))


def test_several_nested_csvs_are_concatenated_and_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    append_rows(tmp_path / "a", [make_row(cp=2)])
    append_rows(tmp_path / "b", [make_row(cp=4)])
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "concatenated 2 results.csv files" in out
    assert str(tmp_path / "a" / RESULTS_FILE) in out and str(tmp_path / "b" / RESULTS_FILE) in out
    md = (tmp_path / "report.md").read_text()
    assert "2 files under" in md and "(2 rows)" in md


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """argv and the start of the expected error line, per case."""
    (tmp_path / "header_only").mkdir()
    (tmp_path / "header_only" / RESULTS_FILE).write_text(",".join(COLUMNS) + "\n")
    (tmp_path / "zero.csv").write_text("")
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    (tmp_path / "nothing").mkdir()
    (tmp_path / "notdir").write_text("x")
    append_rows(tmp_path / "good", [make_row()])
    t = tmp_path
    return {
        "missing": ([f"{t}/nope"], f"RESULTS={t}/nope: no such file or directory"),
        "no_columns": ([f"{t}/other.csv"], f"RESULTS={t}/other.csv: not a results table"),
        "header_only": ([f"{t}/header_only"], f"RESULTS={t}/header_only: no rows (empty run)"),
        "zero_bytes": ([f"{t}/zero.csv"], f"RESULTS={t}/zero.csv: no rows (empty run)"),
        "no_results_below": ([f"{t}/nothing"], f"RESULTS={t}/nothing: no results.csv in or below"),
        "out_is_file": ([f"{t}/good", "--out", f"{t}/notdir"], f"--out={t}/notdir: exists and is not a directory"),
    }


@pytest.mark.parametrize(
    "case", ["missing", "no_columns", "header_only", "zero_bytes", "no_results_below", "out_is_file"]
)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    argv, expected = _bad_inputs(tmp_path)[case]
    before = sorted(tmp_path.rglob("*"))
    assert report.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [captured.err.strip()], captured.err
    assert captured.err.startswith(f"error: {expected}"), captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


def test_usage_error_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([]) == 2
    assert "usage:" in capsys.readouterr().err
