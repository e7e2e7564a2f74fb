"""A plug-in loaded by reference (``impl=package.module:attribute``) is named in
its rows, on the console and in the report by the name its implementation
declares, as an entry point's is; the reference stays in the rows' overrides
and repro, resume finds its points again, and compare joins an older run's
reference-named rows with a newer run's declared name."""

from __future__ import annotations

from matrix.compare import cli as compare_cli
from matrix.review import compare
from matrix.app.point import declared_name, row_names
from nsa_cp_comm import impls, plugins

from compare_rows import make_row, write_run
from matrix_cli import run_matrix

BROKEN = "tests.broken_impls"


def test_a_reference_is_named_as_it_declares_itself_unless_that_name_is_taken(monkeypatch):
    assert declared_name(f"{BROKEN}:wrong_order") == "wrong_order"
    # declares "padded", a built-in's name: its rows keep the reference
    assert impls.get(f"{BROKEN}:offset_by_one") and plugins.DECLARED[f"{BROKEN}:offset_by_one"] == "padded"
    assert declared_name(f"{BROKEN}:offset_by_one") == f"{BROKEN}:offset_by_one"
    assert declared_name("padded") == "padded"
    monkeypatch.setitem(plugins.DECLARED, f"{BROKEN}:wrong_order", "all")  # a keyword of impl
    assert declared_name(f"{BROKEN}:wrong_order") == f"{BROKEN}:wrong_order"
    # two references of one point that declare one name: each keeps its own
    monkeypatch.setitem(plugins.DECLARED, f"{BROKEN}:wrong_order", "same")
    impls.get(f"{BROKEN}:dirty_padding")
    monkeypatch.setitem(plugins.DECLARED, f"{BROKEN}:dirty_padding", "same")
    refs = [f"{BROKEN}:wrong_order", f"{BROKEN}:dirty_padding", "padded"]
    assert row_names(refs) == {ref: ref for ref in refs}


def test_rows_console_and_resume_of_a_plugin_by_reference(tmp_path):
    ref = f"{BROKEN}:wrong_order"
    res = tmp_path / "res"
    args = (f"impl={ref},padded", "cp_size=2", "seq_lens=[3,3]", "hidden_size=32", "iters=1", "warmup=0")
    run = run_matrix(res, *args)
    assert run.returncode == 1, run.stderr[-2000:]  # wrong_order fails its gather check
    rows = run.rows()
    assert sorted(r["impl"] for r in rows) == ["padded", "wrong_order"]
    mine = next(r for r in rows if r["impl"] == "wrong_order")
    # the reference, kept (Hydra's override escapes its colon)
    assert f"impl={ref}" in mine["overrides"].replace("\\", "") and ref in mine["repro"]
    assert mine["impl_origin"].startswith(BROKEN)
    assert "wrong_order failed [gather_rows]" in run.stdout and f"{ref} failed" not in run.stdout
    again = run_matrix(res, *args, "resume=true")
    assert again.stdout.count("already in results, not rerun") == 2, again.stdout[-2000:]
    assert len(again.rows()) == 2


def _rows(impl: str, origin: str) -> list[dict[str, object]]:
    return [make_row(impl, impl_origin=origin), make_row("padded", impl_origin="nsa_cp_comm 0.1.0")]


def test_compare_joins_a_reference_named_run_with_a_declared_named_one(tmp_path, capsys):
    origin = "engine_comm.adapter 0.3.1"
    old = write_run(tmp_path / "old", _rows("engine_comm.adapter:impl", origin))
    new = write_run(tmp_path / "new", _rows("engine_comm", origin))
    for base, newer in ((old, new), (new, old)):
        compare_cli.main([base, newer, "--metric", "roundtrip_p50_us", "--fail-above", "25%"])
        line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("summary:"))
        assert "joined=2 missing=0 only-in-new=0" in line, line
    # another module's implementation of that name is not the same one
    other = write_run(tmp_path / "other", _rows("engine_comm", "someone_else 1.0"))
    compare_cli.main([old, other, "--metric", "roundtrip_p50_us", "--fail-above", "25%", "--allow-missing"])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("summary:"))
    assert "joined=1 missing=1 (allowed) only-in-new=1" in line, line


def test_two_plugins_that_declare_one_name_are_refused_and_their_rows_never_merged(tmp_path, monkeypatch, capsys):
    """Two references that declare one name, swept as two jobs: their rows carried one name, and
    the report kept one row per point and name, the last: PASS over the other's failed row (exit
    0). The sweep is refused up front in one line; of a folder that holds such rows (written before,
    or by another tool) the readers keep, within one run, the failing row over the passing one."""
    from matrix.app import preflight
    from matrix.report import cli as report_cli
    from matrix.review import _review

    from matrix_cli import sweep_here

    both = "impl=tests.hostile_impls:one_name_wrong,tests.hostile_impls:one_name_right"
    point = ("cp_size=2", "seq_lens=[3,3]", "hidden_size=32", "iters=1", "warmup=0")
    refused = sweep_here(tmp_path / "a", both, *point, monkeypatch=monkeypatch, capsys=capsys)
    assert refused.returncode == 2 and not (tmp_path / "a").exists(), refused.stdout[-1500:]
    assert ("impl=tests.hostile_impls:one_name_right,tests.hostile_impls:one_name_wrong: each declares the name "
            "'one_name', so their rows would carry one name") in refused.stderr, refused.stderr
    # the sweep's check taken out: the rows are written, and the report keeps the failed one
    monkeypatch.setattr(preflight, "check_declared_names", lambda points: None)
    ran = sweep_here(tmp_path / "b", both, *point, monkeypatch=monkeypatch, capsys=capsys)
    assert ran.returncode == 1, ran.stdout[-1500:]  # one_name_wrong failed its gather check
    assert report_cli.main([str(tmp_path / "b")]) == 1
    # and the readers' rule taken out too (the last row wins): the right one's is kept, and it passes
    monkeypatch.setattr(_review, "latest_rows", lambda raw: raw.index[~raw[_review.POINT_KEY].duplicated(keep="last")])
    assert report_cli.main([str(tmp_path / "b")]) == 0
