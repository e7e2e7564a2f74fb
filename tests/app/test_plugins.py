"""Implementations from outside the project, through the real CLI.

- Each deliberately broken implementation (tests/broken_impls.py) is flagged
  with a row naming the check, and the sweep goes on to the next points.
- The worked example (examples/engine_comm) is installed as a plugin and runs
  by entry-point name, by ``module:attribute`` and within ``impl=all``, with
  its origin in the rows and its name in the report beside ``padded``.
- A bad reference is one line naming it, exit code 2, nothing written.
- The plug-in doc's adapter is the example's file.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

import broken_impls
from matrix_cli import REPO, CliRun, cli_env, run_matrix, run_python, sweep_here
from nsa_cp_comm.impls import RoundTripImpl
from nsa_cp_comm.plugins import ImplError, load_reference
from nsa_cp_comm.plan import plan_split

EXAMPLE = REPO / "examples" / "engine_comm"
SMALL = ("hidden_size=32", "iters=1", "warmup=0")
BROKEN = "tests.broken_impls"


def _by_point(run: CliRun) -> dict[tuple[str, str], dict[str, str]]:
    return {(r["impl"], r["seq_lens"]): r for r in run.rows()}


def _verdict(row: dict[str, str]) -> tuple[str, str]:
    return row["status"], row["failed_check"]


def _swept_before_padded(tmp_path, names, *args: str) -> tuple[CliRun, dict[tuple[str, str], dict[str, str]]]:
    """The broken ``names``, then padded, swept over ``args``: failed rows make a
    failing sweep (exit 1), not a crash, and padded passes every point after them.
    Returns the run and its rows by (impl, seq_lens)."""
    impl = ",".join([*(f"{BROKEN}:{n}" for n in names), "padded"])
    run = run_matrix(tmp_path / "res", f"impl={impl}", *args)
    assert run.returncode == 1, run.stderr[-2000:]
    rows = _by_point(run)
    for lens in {lens for _, lens in rows}:
        padded = rows[("padded", lens)]
        assert _verdict(padded) == ("ok", "") and float(padded["roundtrip_p50_us"]) > 0, padded["reason"]
    return run, rows


def test_broken_impls_are_flagged_and_the_sweep_goes_on(tmp_path):
    # [3,3] splits (2,4): rank 0 is short, so padding exists and the packed
    # offset of rank 1 (2) is not its padded one (4). [1,1] splits (2,0): an
    # empty shard. padded comes last in the sweep: it must still run after
    # the points whose ranks errored.
    names = ("wrong_order", "dirty_padding", "wrong_chunk", "mutates_input", "skip_empty")
    run, rows = _swept_before_padded(tmp_path, names, "cp_size=2", "seq_lens=[3,3],[1,1]", "timeout_s=30", *SMALL)
    assert len(run.rows()) == 12
    expect = {
        "wrong_order": {"[3,3]": ("failed", "gather_rows"), "[1,1]": ("failed", "gather_rows")},
        "dirty_padding": {"[3,3]": ("failed", "padding_zero"), "[1,1]": ("failed", "padding_zero")},
        # A plan where no earlier rank is short hides the packed-offset slice.
        "wrong_chunk": {"[3,3]": ("failed", "scatter_chunk"), "[1,1]": ("ok", "")},
        "mutates_input": {"[3,3]": ("failed", "input_mutated"), "[1,1]": ("failed", "input_mutated")},
        # Only a plan with an empty shard exposes the branch on the local shape.
        "skip_empty": {"[3,3]": ("ok", "")},
    }
    for name, points in expect.items():
        for lens, verdict in points.items():
            row = rows[(name, lens)]
            assert _verdict(row) == verdict, (name, lens, row["reason"])
            assert row["impl_origin"].startswith(BROKEN), row["impl_origin"]
            if verdict[0] == "failed":
                assert row["correct"] == "False" and row["roundtrip_p50_us"] == "", row
    # Rank 1 holds no rows and skips the all-gather; the correctness group's
    # consistency check finds it in another collective instead of a hang.
    skipped = rows[(f"skip_empty", "[1,1]")]
    assert skipped["status"] in ("error", "timeout") and skipped["failed_check"] == "collective_skipped", skipped
    assert "rank 0" in skipped["reason"] and "rank 1" in skipped["reason"], skipped["reason"]
    assert skipped["impl_origin"].startswith(BROKEN)
    # The sweep went on: the points after it ran, on fresh ranks.
    order = [(r["impl"], r["seq_lens"]) for r in run.rows()]
    assert order.index(("padded", "[3,3]")) > order.index(("skip_empty", "[1,1]"))


def test_even_bits_and_a_rank_that_never_enters(tmp_path):
    # Three ranks, one expert each, every token to all three experts: each
    # output element sums three non-zero partials, where summation order and
    # precision show in the bits (two summands round the same either way).
    # [300] is even; [1,1] splits (2,1,0).
    _, rows = _swept_before_padded(tmp_path, ("even_shortcut", "skip_empty_both"), "cp_size=3", "seq_lens=[300],[1,1]",
                                   "num_experts=3", "topk=3", "timeout_s=30", *SMALL)
    shortcut = rows[(f"even_shortcut", "[300]")]
    assert _verdict(shortcut) == ("failed", "even_bitwise"), shortcut["reason"]
    assert shortcut["even_bitwise_equal"] == "False"
    assert _verdict(rows[(f"even_shortcut", "[1,1]")]) == ("ok", "")  # uneven: no bits promised
    assert _verdict(rows[(f"skip_empty_both", "[300]")]) == ("ok", "")
    # Rank 2 skips the gather and the scatter and waits in the next collective
    # of the point; ranks 0 and 1 wait in the all-gather.
    hung = rows[(f"skip_empty_both", "[1,1]")]
    assert hung["status"] in ("error", "timeout") and hung["failed_check"] == "collective_skipped", hung
    assert re.search(r"\brank 2 never entered\b", hung["reason"]), hung["reason"]
    assert rows[("padded", "[300]")]["even_bitwise_equal"] == "True"


def test_what_outside_code_slips_past_is_named(tmp_path):
    # [3,3] splits (2,4) on two ranks. The CP group runs in reverse world
    # order, so the default group and the global rank put rows elsewhere.
    names = ("refuses_late_c10d", "refuses_late_functional", "default_group", "global_rank", "raw_allgather",
             "own_rows_scatter", "float64_scatter")
    _, rows = _swept_before_padded(tmp_path, names, "cp_size=2", "seq_lens=[3,3],[4,4]", "timeout_s=30", *SMALL)
    expect = {
        # A collective through distributed_c10d or the functional collectives
        # before the refusal: seen on the group's sequence number.
        "refuses_late_c10d": ("failed", "refusal", "raised only after issuing 1 collective(s) on the CP group"),
        "refuses_late_functional": ("failed", "refusal", "raised only after issuing 1 collective(s) on the CP group"),
        "default_group": ("failed", "group", "on the default group"),
        "global_rank": ("failed", "group", "dist.get_rank()"),
        # The unfixed serving communicator: the same all-gather, other shapes.
        "raw_allgather": ("error", "collective_shapes", "rank 0 [2, 32] BFloat16 on cpu; rank 1 [4, 32] BFloat16"),
        "own_rows_scatter": ("error", "collective_shapes", "(_REDUCE_SCATTER_BASE) with different shapes"),
        "float64_scatter": ("failed", "scatter_chunk", "dtype float64, not bfloat16"),
    }
    for name, (status, check, text) in expect.items():
        row = rows[(name, "[3,3]")]
        assert _verdict(row) == (status, check), (name, row["reason"])
        assert text in row["reason"], (name, row["reason"])
    assert "on gloo" in rows[(f"raw_allgather", "[3,3]")]["reason"]
    assert "on NCCL" in rows[(f"raw_allgather", "[3,3]")]["reason"]
    # Even shards hide every one of them but the default group and the dtype;
    # an even-only implementation runs there.
    for name in ("refuses_late_c10d", "refuses_late_functional", "global_rank", "raw_allgather", "own_rows_scatter"):
        assert _verdict(rows[(name, "[4,4]")]) == ("ok", ""), (name, rows[(name, "[4,4]")])
    assert _verdict(rows[(f"default_group", "[4,4]")]) == ("failed", "group")
    assert _verdict(rows[(f"float64_scatter", "[4,4]")]) == ("failed", "scatter_chunk")


def test_a_timed_form_that_diverges_from_the_checked_one_fails(tmp_path):
    # Both give a production form with reused buffers and the same checked
    # calls; one stages its rows at the packed offset. [3,3] splits (2,4):
    # rank 1's packed offset (2) is not its padded one (4); [4,4] hides it.
    impl = f"{BROKEN}:diverging_form,{BROKEN}:reused_buffer"
    run = run_matrix(tmp_path / "res", f"impl={impl}", "cp_size=2", "seq_lens=[3,3],[4,4]", "timeout_s=30",
                     "hidden_size=32", "iters=3", "warmup=1")
    assert run.returncode == 1, run.stderr[-2000:]
    rows = _by_point(run)
    bad = rows[(f"diverging_form", "[3,3]")]
    assert _verdict(bad) == ("failed", "production_form"), bad["reason"]
    assert bad["roundtrip_p50_us"] == "" and bad["correct"] == "False"
    # Every iteration (warm-up included) against the rows every rank contributed.
    assert "wrong in 4 of 4 iterations of the timed loop" in bad["reason"], bad["reason"]
    assert "gathered rows of rank 1 (at row 4) are not rank 1's rows of this iteration" in bad["reason"]
    assert _verdict(rows[(f"diverging_form", "[4,4]")]) == ("ok", "")
    for lens in ("[3,3]", "[4,4]"):
        ok = rows[(f"reused_buffer", lens)]
        assert _verdict(ok) == ("ok", ""), ok["reason"]
        assert float(ok["local_p50_us"]) > 0  # its stage is timed as the local phase


def test_prepare_must_be_callable_and_return_a_production():
    with pytest.raises(ValueError, match="prepare is not callable"):
        RoundTripImpl("x", broken_impls._gather, broken_impls._scatter, prepare=3)
    impl = RoundTripImpl("x", broken_impls._gather, broken_impls._scatter, prepare=lambda *a: "buffers")
    with pytest.raises(TypeError, match="impl 'x': prepare returned str, not a nsa_cp_comm.production.Production"):
        impl.production(plan_split([4], 2, policy="zigzag"), 8, None, "cpu", None)


def test_bystanders_catch_the_default_group(tmp_path):
    # One rank in the world outside the CP group: a collective on the default
    # group cannot complete (gloo's size check raises on the CP ranks, or they
    # wait for the bystander); the correct implementation runs as before.
    _, rows = _swept_before_padded(tmp_path, ("default_group",), "cp_size=2", "bystanders=1", "seq_lens=[3,3]",
                                   "timeout_s=10", *SMALL)
    hung = rows[(f"default_group", "[3,3]")]
    assert hung["status"] in ("error", "timeout"), hung["reason"]
    if hung["status"] == "timeout":
        assert hung["failed_check"] == "group" and "bystander" in hung["reason"], hung["reason"]
    ok = rows[("padded", "[3,3]")]
    assert ok["bystanders"] == "1" and "bystanders=1" in ok["repro"]


# --- the worked example, installed as a plugin --------------------------------


def install_plugin(project: Path, site: Path) -> dict:
    """What ``pip install --target site project`` leaves, without building a
    wheel: the package and a ``.dist-info`` with its metadata and entry points
    (read from the project's pyproject.toml, so a wrong entry point there fails
    here). Returns the [project] table."""
    meta = tomllib.loads((project / "pyproject.toml").read_text())
    proj, packages = meta["project"], meta["tool"]["setuptools"]["packages"]
    dist = site / f"{re.sub(r'[-_.]+', '_', proj['name'])}-{proj['version']}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {proj['name']}\nVersion: {proj['version']}\n")
    groups = proj.get("entry-points", {})
    (dist / "entry_points.txt").write_text(
        "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for g, eps in groups.items())
    )
    (dist / "top_level.txt").write_text("".join(f"{p}\n" for p in packages))
    for p in packages:
        shutil.copytree(project / p, site / p, ignore=shutil.ignore_patterns("__pycache__"))
    return proj


def _with_site(site: Path) -> dict[str, str]:
    """cli_env() with ``site`` first on the path (the ranks inherit it)."""
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    return env


def test_example_plugin_by_entry_point_and_by_reference(tmp_path):
    site = tmp_path / "site"
    proj = install_plugin(EXAMPLE, site)
    ep_name, ref = next(iter(proj["entry-points"]["nsa_cp_comm.impls"].items()))
    assert (ep_name, ref) == ("engine_comm", "engine_comm.adapter:impl")
    results = tmp_path / "res"
    # [1001,300] is uneven (padding), [1000] even (legacy's bits promised).
    run = run_matrix(results, f"impl={ep_name},{ref},all", "cp_size=2", "seq_lens=[1001,300],[1000]", *SMALL,
                     env=_with_site(site))
    assert run.returncode == 0, run.stderr[-2000:]
    rows = run.rows()
    origin = f"engine_comm.adapter {proj['version']}"
    mine = [r for r in rows if r["impl"] in (ep_name, ref)]
    # by name, by reference, and inside impl=all: 3 points x 2 plans.
    assert len(mine) == 6
    for r in mine:
        assert (r["status"], r["correct"], r["impl_origin"]) == ("ok", "True", origin), r
        assert float(r["roundtrip_p50_us"]) > 0
        assert r["even_bitwise_equal"] == ("True" if r["seq_lens"] == "[1000]" else "")
    in_all = {r["impl"] for r in rows if " impl=all " in f" {r['overrides']} "}
    assert {"padded", "legacy", ep_name} <= in_all, in_all  # discovered beside the built-in ones
    assert all(r["impl_origin"] == "nsa_cp_comm 0.1.0" for r in rows if r["impl"] == "padded")

    report = run_python("-m", "matrix.report", str(results), env=_with_site(site), timeout=240)
    assert report.returncode == 0, report.stderr[-2000:]
    md = (results / "report.md").read_text()
    assert ep_name in md and "padded" in md


def test_broken_plugin_is_one_line_naming_its_entry_point(tmp_path):
    site = tmp_path / "site"
    project = tmp_path / "broken_plugin"
    (project / "broken_plugin").mkdir(parents=True)
    (project / "broken_plugin" / "__init__.py").write_text("import nope_dependency  # not installed\n")
    (project / "pyproject.toml").write_text(
        '[project]\nname = "broken-plugin"\nversion = "1.0"\n'
        '[project.entry-points."nsa_cp_comm.impls"]\nbroken = "broken_plugin:impl"\n'
        '[tool.setuptools]\npackages = ["broken_plugin"]\n'
    )
    install_plugin(project, site)
    results = tmp_path / "res"
    run = run_matrix(results, "impl=all", "cp_size=2", *SMALL, multirun=False, timeout=120, env=_with_site(site))
    assert run.returncode == 2, run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "entry point broken = broken_plugin:impl" in lines[0], run.stderr
    assert "nope_dependency" in lines[0]
    assert not results.exists()


@pytest.mark.parametrize(
    "ref, says",
    [
        ("nope.mod:x", "cannot import nope.mod"),
        ("os:path", "is not a RoundTripImpl or DispatchImpl"),
        (f"{BROKEN}:raising_factory", "calling the factory raised RuntimeError"),
        (f"{BROKEN}:no_such_attribute", "has no attribute no_such_attribute"),
        # a factory that exits must not end the sweep with status 0
        ("sys:exit", "calling the factory raised SystemExit"),
    ],
)
def test_bad_reference_is_one_line_exit_2_nothing_written(tmp_path, capsys, ref, says):
    from matrix.app.sweep import main

    results = tmp_path / "res"
    # In a sweep after a good implementation: nothing runs, not even the good one.
    # In-process: preflight refuses before Hydra or any rank starts
    # (tests/app/test_hardening.py::test_cli_bad_input_through_the_real_cli runs the same path as a command).
    assert main(["-m", f"results_dir={results}", f"impl=padded,{ref}", "cp_size=2", *SMALL]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: impl={ref}:") and says in lines[0], err
    assert not results.exists()


# --- the plug-in doc ------------------------------------------------------------


def test_doc_adapter_is_the_example_file():
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "plugins.md").read_text(), re.S)
    adapter = (EXAMPLE / "engine_comm" / "adapter.py").read_text()
    assert adapter in blocks, "docs/plugins.md's adapter differs from examples/engine_comm/engine_comm/adapter.py"
    assert len(adapter.splitlines()) <= 30


def test_doc_registration_and_checks_are_current():
    section = (REPO / "docs" / "plugins.md").read_text()
    toml = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    assert toml.strip() in (EXAMPLE / "pyproject.toml").read_text()
    # What each check catches is one table (docs/design.md, rendered from the
    # checks; tests/project/test_docs.py holds it to them); the section links to it.
    assert "](design.md#6-what-each-check-proves" in section


def test_every_bad_hook_answer_is_its_own_error_row_and_the_sweep_ends_with_its_summary(tmp_path, monkeypatch, capsys):
    """A row_stride of 0 was a ZeroDivisionError in the sweep's own process:
    no row for the point, no summary, exit 1. Every plan-level hook's answer
    is now data: each bad one is that implementation's error row, one line
    naming the hook and the value, and padded after them still runs."""
    # In this process (sweep_here): each hook here raises or answers; one that
    # ends its process belongs in a sweep through the CLI.
    names = [*broken_impls.BAD_ANSWERS, "prepare_raises"]
    impl = ",".join([*(f"{BROKEN}:{n}" for n in names), "padded"])
    run = sweep_here(tmp_path / "res", f"impl={impl}", "cp_size=2", "seq_lens=[64]", "timeout_s=60", *SMALL,
                     monkeypatch=monkeypatch, capsys=capsys)
    assert run.returncode == 1, run.stderr[-3000:]  # error rows: a failing sweep, not a crash
    assert "Traceback" not in run.stderr and "Traceback" not in run.stdout, run.stderr[-3000:]
    # one configuration swept over 11 impls: one point, a row each
    assert "matrix summary: 1 point, 11 rows: ok 1, failed 0, error 10" in run.stdout, run.stdout[-3000:]
    rows = {r["impl"]: r for r in run.rows()}
    for name, says in broken_impls.BAD_ANSWERS.items():
        row = rows[f"{BROKEN}:{name}"]
        assert row["status"] == "error" and says in row["reason"] and "\n" not in row["reason"], (name, row["reason"])
    assert rows[f"{BROKEN}:prepare_raises"]["status"] == "error"
    assert "prepare" in rows[f"{BROKEN}:prepare_raises"]["reason"]
    assert rows["padded"]["status"] == "ok" and float(rows["padded"]["roundtrip_p50_us"]) > 0


def test_a_module_in_the_working_directory_the_command_cannot_import_is_named_so(tmp_path, monkeypatch):
    """An installed console command does not import from the working directory:
    the refusal says so when the module is there, and only then."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    with pytest.raises(ImplError) as absent:
        load_reference("mycomm_beside:impl")
    assert "working directory" not in str(absent.value), absent.value
    (tmp_path / "mycomm_beside.py").write_text("impl = None\n")
    with pytest.raises(ImplError) as beside:
        load_reference("mycomm_beside:impl")
    msg = str(beside.value)
    assert msg == ("impl=mycomm_beside:impl: cannot import mycomm_beside: ModuleNotFoundError: No module named "
                   "'mycomm_beside' (mycomm_beside is in the working directory, which this command does not import "
                   "from: set PYTHONPATH=$PWD, or run python -m nsa_cp_matrix)"), msg
    # where the working directory is on the path, the module imports and no hint is owed
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImplError) as imported:
        load_reference("mycomm_beside:impl")
    assert "is not a RoundTripImpl" in str(imported.value)
