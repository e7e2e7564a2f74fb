"""Rows shared by compare's tests: a sparse schema row, the base run of ten
rows, the run that appends them, compare's CLI, and readers of its console
(its summary line, counts and marks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from matrix.compare import cli as compare_cli
from matrix.review import compare
from matrix.store.results import COLUMNS, append_rows


def make_row(impl: str = "padded", cp: int = 2, seq_lens: str = "[512,512]", p50: float | None = 100.0,
             status: str = "ok", **extra: object) -> dict[str, object]:
    timed = status == "ok" and p50 is not None
    row: dict[str, object] = dict(
        cp_size=cp, page_size=1, seq_lens=seq_lens, shared_kv=False, split="zigzag", align=cp,
        moe_a2a_backend="none", mlp_mode="FULL", impl=impl, backend="gloo", device="cpu", hidden_size=256,
        dtype="float32", num_experts=4, topk=2, warmup=1, iters=5, seed=0, flush_l2=False, engine="seed_fix",
        shared_expert="none", engine_model="deepseek_v32", graphs="auto", moe_quant="none",
        policy="zigzag", is_even=True,
        claim_holds=True, status=status, reason="",
        correct={"ok": True, "refused": True, "passthrough": True, "failed": False}.get(status),
        roundtrip_p50_us=p50 if timed else None, busbw_padded_GBps=1e4 / p50 if timed else None,
        roundtrip_iqr_us=1.0 if timed else None, device_name="cpu", overrides="cp_size=2,4",
    )
    row.update(extra)
    assert set(row) <= set(COLUMNS)
    return row


# index of each point in base_rows()
FIRST = 0  # padded cp=2 [512,512]: 210 us
REFUSED = 8  # legacy cp=4 [1001,300]: refused, no timing
PASSTHROUGH = 9  # padded cp=4 SCATTERED: passthrough, no timing


def base_rows() -> list[dict[str, object]]:
    rows = []
    for cp in (2, 4):
        for impl in ("padded", "legacy"):
            for i, lens in enumerate(("[512,512]", "[2048,2048]")):
                rows.append(make_row(impl, cp, lens, p50=100.0 * cp + 50 * i + (10 if impl == "padded" else 0)))
    rows.append(make_row("legacy", 4, "[1001,300]", status="refused", is_even=False, reason="legacy refuses"))
    rows.append(make_row("padded", 4, "[1001,300]", status="passthrough", mlp_mode="SCATTERED",
                         moe_a2a_backend="deepep", is_even=False))
    return rows


def changed(index: int, **updates: object) -> list[dict[str, object]]:
    rows = base_rows()
    rows[index] = {**rows[index], **updates}
    return rows


# The run that writes a test's rows: its line of runs.jsonl.
RUN = dict(run_id="base0001", torch_version="2.13.0", nccl_version="", host="box1", git_sha="abc1234",
           command="python -m matrix -m cp_size=2,4")


def write_run(path: Path, rows: list[dict[str, object]], **meta: object) -> str:
    """``rows`` appended to ``path`` by one run: ``RUN``, with ``meta`` changed."""
    append_rows(path, rows, run={**RUN, **meta})
    return str(path)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """compare's CLI; these cases gate at 5% unless they name a threshold."""
    if not any(a.startswith("--fail-above") for a in argv):
        argv = [*argv, "--fail-above=5%"]
    code = compare_cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def summary(out: str) -> str:
    last = out.strip().splitlines()[-1]
    assert last.startswith("summary: ")
    return last


def counts(out: str) -> dict[str, str]:
    words = summary(out).removeprefix("summary: ").split(" -> ")[0].split()
    return dict(w.split("=", 1) for w in words if "=" in w)


def marks(out: str) -> list[str]:
    """The mark column of every table row printed."""
    cells = [line.rsplit("|", 2)[-2].strip() for line in out.splitlines() if line.startswith("|")]
    return [c for c in cells if c != "mark" and not (c and set(c) <= set(":-"))]
