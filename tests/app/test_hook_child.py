"""A plug-in's plan hooks asked in the sweep's own process cannot end or hold the sweep.

``supports``, ``row_stride`` and a ``legacy_bits_on_even`` rule are asked where the rows are
folded; asked there directly, ``os._exit(0)`` in ``supports`` ended the sweep with exit 0 and no
row, a ``row_stride`` that sleeps held it past ``timeout_s``, and a ``KeyboardInterrupt`` from a
hook read as the user's Ctrl-C (exit 130). Asked in a child (nsa_cp_comm.harness.hook_child), each
is that plug-in's own ``error`` row naming the hook; the point's other implementations run, and
the sweep ends with its summary and exit 1. Without the child, the same sweep ends as before.
"""

from __future__ import annotations

import contextlib

from matrix_cli import run_python, sweep_here, under_load
from nsa_cp_comm.harness import hook_child

HOSTILE = "tests.hostile_impls"
POINT = ("cp_size=2", "seq_lens=[64]", "hidden_size=32", "iters=1", "warmup=0")


def _timeout_s() -> float:
    # the point's bound, which a sleeping hook waits out and the other rows must finish within
    # (3 s idle: at a load of 10 padded's checks alone took longer)
    return round(under_load(3)[0], 1)


def _rows(run) -> dict[str, dict[str, str]]:
    return {r["impl"]: r for r in run.rows()}


def test_a_hook_that_exits_hangs_or_interrupts_is_its_own_error_row(tmp_path, monkeypatch, capsys):
    names = ("supports_exits", "stride_sleeps", "supports_interrupts")
    impl = ",".join([*(f"{HOSTILE}:{n}" for n in names), "padded"])
    timeout_s = _timeout_s()
    run = sweep_here(tmp_path / "res", f"impl={impl}", *POINT, f"timeout_s={timeout_s}", monkeypatch=monkeypatch,
                     capsys=capsys)
    rows = _rows(run)
    assert run.returncode == 1 and "matrix summary: 1 point, 4 rows: ok 1, failed 0, error 3" in run.stdout, \
        run.stdout[-2000:]
    assert rows["padded"]["status"] == "ok", rows["padded"]
    why = {n: rows[n]["reason"] for n in names}  # rows carry the names the plug-ins declare
    assert why["supports_exits"].endswith("supports(plan) ended its process with exit status 0 (os._exit in the "
                                          "hook)"), why
    assert why["stride_sleeps"].endswith(f"row_stride(plan) gave no answer in {timeout_s:g} s (timeout_s)"), why
    assert why["supports_interrupts"].endswith("supports(plan) raised KeyboardInterrupt"), why
    assert all(rows[n]["status"] == "error" for n in names), rows


# The same sweep with the hooks asked directly, as before: the guard is what keeps the sweep.
UNGUARDED = """\
import contextlib, sys
from matrix.app import sweep
from nsa_cp_comm.harness import hook_child
hook_child.answering = lambda *a, **k: contextlib.nullcontext()
sys.exit(sweep.main(sys.argv[1:]))
"""


def test_without_the_child_the_hooks_end_the_sweep(tmp_path, monkeypatch, capsys):
    # os._exit would end this process too: that sweep runs in a fresh interpreter
    exits = run_python("-c", UNGUARDED, "-m", f"results_dir={tmp_path / 'a'}", f"impl={HOSTILE}:supports_exits,padded",
                       *POINT, f"timeout_s={_timeout_s()}", timeout=300)
    assert exits.returncode == 0 and "matrix summary" not in exits.stdout, exits.stdout[-2000:]
    assert not (tmp_path / "a" / "results.csv").exists() or not (tmp_path / "a" / "results.csv").read_text()
    monkeypatch.setattr(hook_child, "answering", lambda *a, **k: contextlib.nullcontext())
    interrupted = sweep_here(tmp_path / "b", f"impl={HOSTILE}:supports_interrupts,padded", *POINT,
                             f"timeout_s={_timeout_s()}", monkeypatch=monkeypatch, capsys=capsys)
    assert interrupted.returncode == 130 and "interrupted" in interrupted.stdout + interrupted.stderr, \
        interrupted.stdout[-2000:]


def test_a_hook_answering_the_ranks_otherwise_is_an_error_not_columns_of_another_buffer(tmp_path, monkeypatch,
                                                                                         capsys):
    """Its row_stride said m where the rows are folded and m + 1 on the ranks: the row's buffer columns
    described the buffer it was said to use (padded_total 128), not the one its ranks ran (130)."""
    from nsa_cp_comm.harness import fold

    args = (f"impl={HOSTILE}:stride_differs_on_ranks,padded", *POINT, f"timeout_s={_timeout_s()}")
    run = sweep_here(tmp_path / "a", *args, monkeypatch=monkeypatch, capsys=capsys)
    row = _rows(run)["stride_differs_on_ranks"]
    assert row["status"] == "error" and "row_stride(plan) answered 32 where the rows are folded and 33 on the ranks" \
        in row["reason"], row
    monkeypatch.setattr(fold, "_stride_elsewhere", lambda *a: "")
    row = _rows(sweep_here(tmp_path / "b", *args, monkeypatch=monkeypatch, capsys=capsys))["stride_differs_on_ranks"]
    assert (row["status"], row["padded_total"]) == ("ok", "64"), row  # the columns of the buffer it was said to use
