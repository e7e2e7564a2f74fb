"""`python -m matrix.compare`: the join, the gate, warnings and bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from matrix import compare
from matrix.results import COLUMNS, RESULTS_FILE, append_rows

REPO = Path(__file__).resolve().parents[1]


def make_row(impl: str = "padded", cp: int = 2, seq_lens: str = "[512,512]", p50: float | None = 100.0,
             **extra: object) -> dict[str, object]:
    row: dict[str, object] = dict(
        cp_size=cp, page_size=1, seq_lens=seq_lens, shared_kv=False, split="zigzag", align=cp,
        moe_a2a_backend="none", mlp_mode="FULL", impl=impl, backend="gloo", device="cpu", hidden_size=256,
        dtype="float32", num_experts=4, topk=2, warmup=1, iters=5, seed=0, flush_l2=False,
        policy="zigzag", is_even=True, claim_holds=True, status="ok", reason="", correct=True,
        roundtrip_p50_us=p50, busbw_padded_GBps=None if p50 is None else 1e4 / p50,
        torch_version="2.13.0", nccl_version="", device_name="cpu", host="box1", git_sha="abc1234",
        overrides="cp_size=2,4",
    )
    row.update(extra)
    assert set(row) <= set(COLUMNS)
    return row


def base_rows() -> list[dict[str, object]]:
    rows = []
    for cp in (2, 4):
        for impl in ("padded", "legacy"):
            for i, lens in enumerate(("[512,512]", "[2048,2048]")):
                rows.append(make_row(impl, cp, lens, p50=100.0 * cp + 50 * i + (10 if impl == "padded" else 0)))
    rows.append(make_row("legacy", 4, "[1001,300]", p50=None, is_even=False,
                         reason="output tensor size must be equal to world_size times input tensor size"))
    return rows


def write_run(path: Path, rows: list[dict[str, object]]) -> str:
    append_rows(path, rows)
    return str(path)


def changed(index: int, **updates: object) -> list[dict[str, object]]:
    rows = base_rows()
    rows[index] = {**rows[index], **updates}
    return rows


@pytest.fixture
def base(tmp_path: Path) -> str:
    return write_run(tmp_path / "base", base_rows())


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = compare.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def summary(out: str) -> str:
    last = out.strip().splitlines()[-1]
    assert last.startswith("summary: ")
    return last


def test_run_against_itself_passes(base: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([base, base], capsys)
    assert code == 0, out
    assert summary(out) == (
        "summary: joined=9 regressed=0 improved=0 only-in-base=0 only-in-new=0 now-incorrect=0 -> PASS"
    )
    assert err == ""  # same environment: no warning
    assert "+0.0%" in out and "no value" in out  # the legacy uneven row has no timing, shown anyway


def test_20_percent_slower_fails_at_default_threshold(
    base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = write_run(tmp_path / "new", changed(0, roundtrip_p50_us=210.0 * 1.2))
    code, out, _ = run([base, new], capsys)
    assert code == 1
    assert "regressed=1" in summary(out) and summary(out).endswith("FAIL")
    assert "+20.0%" in out and "REGRESSED" in out and "FAIL: these points" in out
    # a looser threshold lets it pass, in either spelling
    for threshold in ("25%", "0.25"):
        assert compare.main([base, new, "--fail-above", threshold]) == 0


def test_4_percent_slower_passes(base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new = write_run(tmp_path / "new", changed(0, roundtrip_p50_us=210.0 * 1.04))
    code, out, _ = run([base, new], capsys)
    assert code == 0 and "+4.0%" in out and "regressed=0" in summary(out)


def test_faster_is_improved_not_failed(base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new = write_run(tmp_path / "new", changed(0, roundtrip_p50_us=210.0 * 0.5))
    code, out, _ = run([base, new], capsys)
    assert code == 0 and "improved=1" in summary(out) and "-50.0%" in out


@pytest.mark.parametrize(
    "updates",
    [dict(correct=False, status="failed"), dict(correct=None, status="error", roundtrip_p50_us=None)],
    ids=["correct_to_incorrect", "ok_to_error"],
)
def test_losing_correctness_fails(base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  updates: dict[str, object]) -> None:
    new = write_run(tmp_path / "new", changed(2, **updates))
    code, out, _ = run([base, new], capsys)
    assert code == 1
    assert "now-incorrect=1" in summary(out) and "regressed=0" in summary(out)
    assert "NOW INCORRECT" in out


def test_points_in_one_run_only_do_not_gate(base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = base_rows()[1:]  # drop one point ...
    rows.append(make_row("padded", 8, p50=1e6, correct=False, status="failed"))  # ... add a slow, broken one
    new = write_run(tmp_path / "new", rows)
    code, out, _ = run([base, new], capsys)
    assert code == 0
    assert "only-in-base=1 only-in-new=1" in summary(out) and "joined=8" in summary(out)
    marks = [line.rsplit("|", 2)[-2].strip() for line in out.splitlines() if line.startswith("|")]
    assert marks.count("only-in-base") == 1 and marks.count("only-in-new") == 1


def test_missing_value_is_shown_but_does_not_gate(
    base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = write_run(tmp_path / "new", changed(0, roundtrip_p50_us=None))
    code, out, _ = run([base, new], capsys)
    assert code == 0 and "no value" in out


def test_bandwidth_regresses_by_dropping(base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slower = write_run(tmp_path / "drop", changed(0, busbw_padded_GBps=1e4 / 210.0 * 0.8))
    faster = write_run(tmp_path / "rise", changed(0, busbw_padded_GBps=1e4 / 210.0 * 1.2))
    assert compare.main([base, slower, "--metric", "busbw_padded_GBps"]) == 1
    assert compare.main([base, faster, "--metric", "busbw_padded_GBps"]) == 0
    assert "improved=1" in summary(capsys.readouterr().out)


def test_environment_difference_warns(base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new = write_run(tmp_path / "new", [{**r, "host": "box2", "torch_version": "2.14.0"} for r in base_rows()])
    code, _, err = run([base, new], capsys)
    assert code == 0
    assert "warning: environments differ: host: BASE box1 vs NEW box2" in err
    assert "torch_version: BASE 2.13.0 vs NEW 2.14.0" in err


def test_csv_files_and_numeric_spelling_join(base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # "[512, 512]" and "2.0" join with "[512,512]" and "2": formatting is not a configuration change
    rows = [
        {**r, "seq_lens": str(r["seq_lens"]).replace(",", ", "), "cp_size": float(r["cp_size"])} for r in base_rows()
    ]
    new = write_run(tmp_path / "new", rows)
    code, out, _ = run([str(Path(base) / RESULTS_FILE), str(Path(new) / RESULTS_FILE)], capsys)
    assert code == 0 and "joined=9" in summary(out)


def _bad(tmp_path: Path, base: str) -> dict[str, tuple[list[str], str]]:
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / RESULTS_FILE).write_text(",".join(COLUMNS) + "\n")
    return {
        "missing_base": ([str(tmp_path / "nope"), base], f"BASE={tmp_path / 'nope'}: no such file or directory"),
        "missing_new": ([base, str(tmp_path / "nope")], f"NEW={tmp_path / 'nope'}: no such file or directory"),
        "no_columns": ([base, str(tmp_path / "other.csv")], f"NEW={tmp_path / 'other.csv'}: not a results table"),
        "empty_run": ([str(tmp_path / "empty"), base], f"BASE={tmp_path / 'empty'}: no rows"),
        "unknown_metric": ([base, base, "--metric", "speed"], "--metric=speed: unknown metric"),
        "bad_threshold": ([base, base, "--fail-above", "abc"], "--fail-above=abc: not a percentage"),
        "negative_threshold": ([base, base, "--fail-above=-5%"], "--fail-above=-5%: must be"),
        "percent_without_sign": ([base, base, "--fail-above", "5"], "--fail-above=5: a bare number"),
    }


@pytest.mark.parametrize(
    "case",
    ["missing_base", "missing_new", "no_columns", "empty_run", "unknown_metric", "bad_threshold",
     "negative_threshold", "percent_without_sign"],
)
def test_bad_input_exits_2_with_one_line(
    base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    argv, expected = _bad(tmp_path, base)[case]
    before = sorted(tmp_path.rglob("*"))
    code, out, err = run(argv, capsys)
    assert code == 2
    assert err.splitlines() == [err.strip()] and err.startswith(f"error: {expected}"), err
    assert out == "" and "Traceback" not in err
    assert sorted(tmp_path.rglob("*")) == before


def test_module_entry_point(base: str, tmp_path: Path) -> None:
    new = write_run(tmp_path / "new", changed(0, roundtrip_p50_us=210.0 * 1.2))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(REPO / "src")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    proc = subprocess.run(
        [sys.executable, "-m", "matrix.compare", base, new], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.strip().splitlines()[-1].endswith("-> FAIL")
    assert "Traceback" not in proc.stderr
