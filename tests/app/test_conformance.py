"""The conformance preset for plug-in authors (``+matrix=conformance``) and
the plan classes it covers (matrix/scale/plan_classes.py):

- the classifier recognises each class, and only where the plan has it;
- each class's batch is that class at every cp from 2 to 8, and the preset,
  expanded as the CLI expands it, runs every class at every cp it runs, with
  and without a bystander, and passes preflight on this machine;
- the three plug-ins right on even plans only (tests/broken_impls.py) fail
  a point of the preset at cp 2 and 3, on warm ranks (``padded`` passes
  them), and the two that fail a check fail at the largest cp through the CLI;
- the report's coverage: the classes per impl and cp, and the loud warning
  for an outside implementation that ran only even plans at some cp.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from matrix.report import cli as report_cli
from matrix.review import _review, coverage, report, report_doc
from matrix.scale import plan_classes
from matrix.scale.plan_classes import CLASSES, batch, classes, classify
from matrix_cli import compose_config, config_of, run_matrix, sweep_here
from nsa_cp_comm import engines, origins
from nsa_cp_comm.plan import plan_split
from report_rows import append, make_row

BROKEN = "tests.broken_impls"
BUGS = ("new_empty_padding", "neighbour_rows", "local_sized_buffer")  # the last errors: its ranks restart


def _plan(plan_class: str, cp: int):
    paged = plan_class == "paged_uneven"
    return plan_split(batch(plan_class, cp), cp, policy="zigzag_page" if paged else "zigzag",
                      page_size=plan_classes.PAGE_SIZE if paged else 1)


@pytest.mark.parametrize("per_rank, policy, page, seq_lens, expect", [
    ((4, 4), "zigzag", 1, [8], {"even"}),
    ((5, 4, 3), "zigzag", 1, [12], {"uneven_by_one"}),
    # two rows from the share: uneven, not by one
    ((6, 4, 2), "zigzag", 1, [12], set()),
    ((4, 4, 0, 0), "zigzag", 1, [8], {"empty_rank"}),
    # one row is not none
    ((3, 2, 1), "zigzag", 1, [6], {"uneven_by_one"}),
    ((2, 1, 0), "zigzag", 1, [2, 1], {"uneven_by_one", "empty_rank"}),
    ((30, 34), "zigzag_page", 16, [64], {"paged_uneven", "longest_not_first"}),
    # page size 1 pages nothing; an even paged plan is not uneven
    ((30, 34), "zigzag_page", 1, [64], {"longest_not_first"}),
    ((32, 32), "zigzag_page", 16, [64], {"even"}),
    ((6, 4), "zigzag", 1, [1, 2, 3, 1, 2, 1], {"uneven_by_one", "many_short"}),
    # three requests at cp 2 are not many; a request of 2*cp tokens is not short
    ((5, 5), "zigzag", 1, [3, 3, 4], {"even"}),
    ((5, 5), "zigzag", 1, [1, 1, 4, 4], {"even"}),
    ((5, 5), "zigzag", 1, [1, 1, 3, 3, 2], {"even", "many_short"}),
    ((3, 5, 4), "zigzag", 1, [12], {"uneven_by_one", "longest_not_first"}),
    ((5, 5, 2), "zigzag", 1, [12], set()),
])
def test_each_class_is_recognised_and_only_there(per_rank, policy, page, seq_lens, expect):
    assert set(classes(per_rank, policy=policy, page_size=page, seq_lens=seq_lens)) == expect


@pytest.mark.parametrize("cp", range(2, 9))
def test_each_class_batch_is_that_class_at_every_cp(cp):
    for plan_class in CLASSES:
        plan = _plan(plan_class, cp)
        found = classify(plan)
        assert plan_class in found, (cp, plan_class, plan.per_rank_tokens, found)
        if plan_class != "bucket_edge":  # the longest shard's rows, even or not
            assert ("even" in found) == (plan_class == "even"), (cp, plan_class, plan.per_rank_tokens)
        assert plan_classes.label(plan) == "+".join(found)
    for bystanders in (0, 1):
        plan = plan_split(batch("bucket_edge", cp, bystanders=bystanders), cp, policy="zigzag")
        assert max(plan.per_rank_tokens) == plan_classes.bucket_edge(cp, bystanders)
    assert _plan("even", 1).is_even
    with pytest.raises(ValueError, match="plan_class=empty_rank: needs cp_size of at least 2"):
        batch("empty_rank", 1)
    with pytest.raises(ValueError, match="plan_class=odd: must be one of even, "):
        batch("odd", 2)


def test_the_preset_runs_every_class_at_every_cp_and_fits_this_machine():
    from matrix.app.preflight import preflight

    points = preflight(["+matrix=conformance", "impl=padded", "results_dir=/nonexistent/never-written"])
    by_world: dict[tuple[int, int], set[str]] = {}
    for p in points:
        cfg, plan = p.cfg, p.resolved.plan()
        found = classify(plan)
        # the point's batch is its class's batch at its cp, and the plan is in that class
        asked = [c for c in CLASSES if cfg["seq_lens"] == batch(c, cfg["cp_size"], bystanders=cfg["bystanders"])]
        assert asked and asked[0] in found, (cfg["cp_size"], cfg["seq_lens"], found)
        by_world.setdefault((cfg["cp_size"], cfg["bystanders"]), set()).update(found)
        assert (cfg["hidden_size"], cfg["iters"]) == (32, 3)
    largest = {b: plan_classes.largest_cp(b) for b in (0, 1)}
    assert set(by_world) == {(cp, b) for b in (0, 1) for cp in (2, 3, 4, largest[b])}
    for world, found in by_world.items():
        assert found == set(CLASSES), (world, set(CLASSES) - found)
    assert len(points) == len(CLASSES) * len(by_world)


# Where an engine's split never makes a class, or the engine runs such a batch without CP:
# the point is skipped with the engine's reason (rows that say the class did not run there).
NOT_IN_SPLIT = {
    ("vllm_ascend", "longest_not_first"): "contiguous slices: rank 0 is never short",
    ("vllm_ascend", "paged_uneven"): "no page-aligned split",
    ("vllm_0_33", "paged_uneven"): "no page-aligned split",
    ("vllm_0_34", "paged_uneven"): "no page-aligned split",
    ("sglang_0_5_23", "paged_uneven"): "no page-aligned split",
    ("sglang_0_5_23", "empty_rank"): "zigzag can_apply refuses requests under 2*cp tokens",
    ("sglang_0_5_23", "many_short"): "zigzag can_apply refuses requests under 2*cp tokens",
}


def _class_point(plan_class: str, engine: str, cp: int, bystanders: int) -> tuple[list[int], str]:
    """``(seq_lens, policy)`` of a class's point, as conf/plan_class/CLASS.yaml resolves them."""
    if plan_class == "paged_uneven":  # split: zigzag with shared_kv: true
        return batch(plan_class, cp, "zigzag_page", engine=engine, bystanders=bystanders), "zigzag_page"
    split = plan_classes.class_split(plan_class, cp, engine=engine, bystanders=bystanders)
    return batch(plan_class, cp, split, engine=engine, bystanders=bystanders), split


def test_the_config_group_resolves_a_class_as_the_rule_does():
    """Through Hydra, as a point composes it (vLLM's engine, whose split is not zigzag): the
    group's split and batch are :func:`_class_point`'s at every cp and bystander count."""
    for plan_class in CLASSES:
        cfg = compose_config(f"+plan_class={plan_class}", "engine=vllm_0_33")
        for cp, bystanders in ((2, 0), (3, 1), (8, 1)):
            # the group's values are interpolations, resolved as they are read: per point
            cfg.cp_size, cfg.bystanders = cp, bystanders
            policy = "zigzag_page" if cfg.shared_kv else cfg.split
            assert (list(cfg.seq_lens), policy) == _class_point(plan_class, "vllm_0_33", cp, bystanders)


@pytest.mark.parametrize("engine", engines.NAMES)
def test_each_class_is_made_in_the_split_the_engine_makes(engine):
    """Every class at cp 2 to 8 is a plan of that class by the engine's own rules and split
    (vLLM's DualChunkSwap of the raw lengths, vllm-ascend's contiguous slices), or a point the
    engine refuses, for the reason the engine has."""
    rules = engines.get(engine)
    for plan_class in CLASSES:
        for cp, bystanders in ((cp, b) for cp in range(2, 9) for b in (0, 1)):
            seq_lens, policy = _class_point(plan_class, engine, cp, bystanders)
            page = plan_classes.PAGE_SIZE if policy == "zigzag_page" else 1
            where = (engine, cp, plan_class, bystanders, seq_lens, policy)
            if (engine, plan_class) in NOT_IN_SPLIT:
                assert rules.refusal(seq_lens, cp, policy), where
                continue
            assert policy in rules.strategies and not rules.refusal(seq_lens, cp, policy), where
            plan = rules.plan(seq_lens, cp, policy=policy, page_size=page)
            assert plan_class in classify(plan), (where, plan.per_rank_tokens)
            if plan_class == "bucket_edge":
                assert max(plan.per_rank_tokens) == plan_classes.bucket_edge(cp, bystanders), where


def test_the_preset_crosses_every_graph_bucket_edge_for_vllm():
    """With vLLM's engine the preset's bucket_edge points put the longest
    shard at 255, 256, 257, 511, 512 and 513 rows: P is the capture size
    holding it (256, 256, 272, 512, 512) and, past the largest, the rows
    themselves (513, eager)."""
    from matrix.app.preflight import preflight

    points = preflight(["+matrix=conformance", "+plan_class=bucket_edge", "engine=vllm_0_33", "impl=padded",
                        "results_dir=/nonexistent/never-written"])
    assert len(points) == 8  # the preset's (cp, bystanders) cells, this class only
    edges = {}
    for p in points:
        plan, spec = p.resolved.plan(), p.resolved.spec
        assert not p.resolved.skip or plan.policy == "zigzag_page", (plan.seq_lens, p.resolved.skip)
        if "bucket_edge" in classify(plan):
            assert plan.policy == "dual_chunk_swap" and spec.max_capture_size == 512
            edges[max(plan.per_rank_tokens)] = engines.get("vllm_0_33").physical_len(plan)
    assert edges == {255: 256, 256: 256, 257: 272, 511: 512, 512: 512, 513: 513}


def _cfg(cp: int, plan_class: str, impl: str) -> dict:
    paged = plan_class == "paged_uneven"
    return config_of(cp_size=cp, seq_lens=batch(plan_class, cp), shared_kv=paged, impl=impl, hidden_size=32,
                     page_size=plan_classes.PAGE_SIZE if paged else 1, dtype="bfloat16", warmup=1, iters=3)


@pytest.mark.parametrize("cp", [2, 3])
def test_plugins_right_on_even_plans_only_fail_the_preset_at_each_cp(rank_pool, cp):
    """The preset's own batches (as the test above holds them to the preset),
    on warm ranks: each buggy plug-in passes the even point and fails the
    first uneven one; padded passes both."""
    from matrix.app.resolve import resolve
    from nsa_cp_comm.harness.measure import run_point

    impls = [f"{BROKEN}:{name}" for name in BUGS]
    even = resolve({**_cfg(cp, "even", "padded")}).spec
    results = run_point(replace(even, impls=(*impls, "padded")), rank_pool(cp), timeout_s=60)
    assert [(r.impl, r.status) for r in results] == [(i, "ok") for i in (*impls, "padded")], \
        [(r.impl, r.status, r.reason) for r in results]
    for impl in ("padded", *impls):
        spec = resolve(_cfg(cp, "uneven_by_one", impl)).spec
        (r,) = run_point(spec, rank_pool(cp), timeout_s=60)
        assert r.status in (("ok",) if impl == "padded" else ("failed", "error")), (impl, r.status, r.reason)


# --- the report --------------------------------------------------------------------


def _rows(plugin_classes: dict[int, list[str]], impl: str = f"{BROKEN}:neighbour_rows",
          origin: str = "tests.broken_impls (no installed distribution)") -> list[dict]:
    rows = []
    for cp, kinds in plugin_classes.items():
        for kind in kinds:
            plan = _plan(kind, cp)
            common = dict(cp=cp, seq_lens=tuple(plan.seq_lens), padded_total=plan.padded_total, policy=plan.policy,
                          plan_class=plan_classes.label(plan), page=plan.page_size, is_even=plan.is_even)
            rows += [make_row(impl, impl_origin=origin, **common), make_row("padded", **common)]
    return rows


def _loaded(path):
    run = _review.load_run("RESULTS", str(path), report.READ)
    return run, report.prepare(run)


def _report(tmp_path, rows) -> str:
    append(tmp_path, rows)
    return report_doc.markdown(report.render(*_loaded(tmp_path)))[0]  # without the plots


def test_report_warns_loudly_of_a_plugin_with_only_even_plans_at_a_cp(tmp_path):
    md = _report(tmp_path / "a", _rows({2: ["even", "empty_rank"], 3: ["even"], 4: ["even", "many_short"]}))
    head = md.split("## Verdicts")[0]
    warning = [ln for ln in head.splitlines() if ln.startswith("**WARNING")]
    assert warning == [f"**WARNING: `{BROKEN}:neighbour_rows` ran no uneven plan at cp=3**: its rows there cannot "
                       "show a bug in uneven shards (an empty rank, padding, a short rank before a long one). Run "
                       f"`python -m matrix +matrix=conformance impl={BROKEN}:neighbour_rows,padded` "
                       "(https://github.com/nsa-cp-comm/nsa-cp-comm/blob/main/docs/plugins.md)."], head
    section = md.split("## Plan classes covered")[1].split("\n## ")[0]
    # cp=3: one even row, nothing else
    assert re.search(r"\| tests.broken_impls:neighbour_rows +\| +3 \| +1 \| +0 \| +0 \| +0 \| +0 \| +0 \|", section)
    assert "1 cp(s) of nothing run or even plans only, warned at the top" in section


def test_no_warning_where_every_cp_had_an_uneven_plan_or_the_impl_is_built_in(tmp_path):
    md = _report(tmp_path / "a", _rows({2: ["even", "empty_rank"], 3: ["longest_not_first"]}))
    assert "WARNING" not in md
    assert "0 cp(s) of nothing run or even plans only)" in md.split("## Plan classes covered")[1]
    # the project's own implementation on even plans only: its uneven paths have their own tests
    md = _report(tmp_path / "b", _rows({3: ["even"]}, impl="legacy", origin="nsa_cp_comm 0.1.0"))
    assert "WARNING" not in md
    # no outside implementation: the classes in the appendix only
    assert "## Plan classes covered" not in md
    appendix = report_doc.markdown(report.render(*_loaded(tmp_path / "b")))[1]
    assert re.search(r"\| legacy +\| +3 \| +1 \| +0 \|", appendix)


def test_the_report_shows_an_outside_impls_status_by_class_the_classes_it_never_passed_first(tmp_path):
    """A plug-in right on even plans only: `ok` on even at every cp, `error` on every uneven
    class. The report's table by class and status puts the classes it never passed first,
    with the cps where its rows did not pass; the verdict line quotes it no speed ratio."""
    rows = _rows({2: ["even", "empty_rank", "longest_not_first"], 3: ["even", "empty_rank", "many_short"]})
    mine = f"{BROKEN}:neighbour_rows"
    for r in rows:
        if r["impl"] == mine and r["plan_class"] != "even":
            r.update(status="error", reason="RuntimeError: The size of tensor a (17) must match", correct=None,
                     roundtrip_p50_us=None)
        if r["impl"] == mine and "many_short" in r["plan_class"]:
            r.update(status="skipped", reason="not this engine's")  # did not run: not a class it failed
    append(tmp_path, rows)
    _, df = _loaded(tmp_path)
    table = coverage.by_status(df)
    classes = [c for impl, c in table.index]
    # failed and never passed first (in the classes' order), then the rest: the one it passed, the one only skipped
    assert set(classes[:3]) == {"uneven_by_one", "empty_rank", "longest_not_first"}, classes
    assert set(classes[3:]) == {"even", "many_short"}, classes
    assert table.loc[(mine, "many_short"), "skipped"] == 1
    assert table.loc[(mine, "even"), "ok"] == 2 and table.loc[(mine, "even"), "cps not ok"] == "-"
    assert table.loc[(mine, "empty_rank"), "error"] == 2 and table.loc[(mine, "empty_rank"), "cps not ok"] == "2,3"
    assert list(table.columns) == ["error", "ok", "skipped", "cps not ok"]  # what went wrong first
    md = report_doc.markdown(report.render(*_loaded(tmp_path)))[0]
    assert f"`{mine}` never passed some class." in md
    verdict = md.splitlines()[[i for i, ln in enumerate(md.splitlines()) if ln.startswith("**Verdict")][0]]
    assert f"{mine}/padded: no ratio quoted, it has failing rows" in verdict, verdict
    assert "correct everywhere checked" not in verdict and "no incorrect result among the rows whose checks ran" \
        in verdict


def test_rows_without_a_plan_class_are_classified_from_their_plan(tmp_path):
    rows = _rows({3: ["empty_rank"]})
    for r in rows:
        r["plan_class"] = ""
    append(tmp_path, rows)
    _, df = _loaded(tmp_path)
    assert set(coverage.plan_classes(df)) == {"uneven_by_one+empty_rank"}
    assert coverage.warnings(df) == []


# Through the CLI: the two bugs that fail a check (wrong rows, dirty padding).
# The third errors, and each of its points restarts the ranks: its verdict
# flips at cp 2 and 3 on warm ranks above, and an erroring plug-in's row
# through a sweep is tests/app/test_plugins.py's.
CLI_BUGS = BUGS[:2]


def test_the_preset_through_the_cli_fails_each_bug_at_its_largest_cp(tmp_path):
    """The real sweep, restricted to one uneven class and to the cp that only
    a job resolves (the largest this machine starts, with and without a
    bystander: conf/conformance_cp/largest.yaml); every class and cp of the
    preset is held to it in-process above, and cp 2 and 3 fail each bug on
    warm ranks. Each buggy plug-in that fails a check fails there, and the
    report warns of none of them."""
    impls = ",".join(f"{BROKEN}:{name}" for name in CLI_BUGS)
    run = run_matrix(tmp_path / "res", "+matrix=conformance", f"impl={impls}", "+plan_class=uneven_by_one",
                     "+conformance_cp=largest", multirun=False, timeout=600)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "missing" not in run.stdout.split("matrix summary:")[1].splitlines()[0], run.stdout[-2000:]
    rows = run.rows()
    assert {r["impl"] for r in rows} == set(CLI_BUGS)  # the names they declare
    for name in CLI_BUGS:
        mine = [r for r in rows if r["impl"] == name]
        assert {(int(r["cp_size"]), int(r["bystanders"])) for r in mine} == {(plan_classes.largest_cp(b), b)
                                                                             for b in (0, 1)}
        for r in mine:
            assert r["status"] in ("failed", "error"), (name, r["cp_size"], r["status"], r["reason"])
            assert r["plan_class"].split("+")[0] == "uneven_by_one", r["plan_class"]
    assert report_cli.main([str(tmp_path / "res")]) == 1  # every row failed or errored: verdict FAIL
    md = (tmp_path / "res" / "report.md").read_text()
    assert "WARNING" not in md and "## Plan classes covered" in md


def test_a_bystander_point_is_a_point_of_its_own(tmp_path):
    # The same configuration with and without a bystander: two points (as
    # point_id says), neither read as a duplicate of the other.
    rows = _rows({2: ["even", "uneven_by_one"]})
    append(tmp_path, rows + [{**r, "bystanders": 1} for r in rows])
    run, df = _loaded(tmp_path)
    assert (len(run.latest), run.duplicates, df[report.PAIR].nunique()) == (8, 0, 4)
    assert set(coverage.table(df)["bystanders"]) == {"0,1"}


# --- the sweep's coverage verdict: what ran, not what was kept


def _cov_row(impl: str, cp: int, status: str, plan_class: str = "even", origin: str = "tests.broken_impls",
             reason: str = "") -> dict[str, object]:
    return {"impl": impl, "cp_size": str(cp), "status": status, "plan_class": plan_class, "impl_origin": origin,
            "reason": reason}


def test_gaps_count_the_rows_an_outside_impl_ran():
    """Skipped, refused and passthrough rows ran none of its code; ok and
    failing rows did. The project's own impls have no gaps; cp 1 needs no
    uneven plan."""
    mine = "tests.broken_impls:x"
    rows = [_cov_row("padded", cp, "ok", "uneven_by_one", "nsa_cp_comm 0.1.0") for cp in (1, 2, 3, 4)]
    rows += [_cov_row(mine, 1, "ok"), _cov_row(mine, 2, "ok"), _cov_row(mine, 2, "failed", "empty_rank")]
    rows += [_cov_row(mine, 3, s, "uneven_by_one", reason="not built for cp=3")
             for s in ("skipped", "refused", "passthrough")]
    rows += [_cov_row(mine, 4, "ok"), _cov_row(mine, 4, "skipped", "empty_rank", reason="uneven not supported")]
    assert coverage.gaps(rows) == [(mine, 3, coverage.RAN_NOTHING, "not built for cp=3"),
                                   (mine, 4, coverage.NO_UNEVEN, "uneven not supported")]
    # every cp covered: no gap
    rows += [_cov_row(mine, 3, "ok", "empty_rank"), _cov_row(mine, 4, "timeout", "longest_not_first")]
    assert coverage.gaps(rows) == []
    # the project's own implementation skipping everything is not an outside gap
    assert coverage.gaps([_cov_row("legacy", 3, "skipped", origin="nsa_cp_comm 0.1.0")]) == []


def test_a_plugin_that_ran_nothing_at_one_cp_fails_the_sweep_with_the_cp_named(tmp_path, monkeypatch, capsys,
                                                                               plots_not_drawn):
    """At cp 3, where it refused every plan, there was no warning and the
    sweep exited 0; the one that refused every uneven plan was warned about
    in the report only."""
    res = tmp_path / "res"
    sweep = (f"impl={BROKEN}:skips_cp3,{BROKEN}:even_only", "cp_size=2,3", "seq_lens=[100],[1,1]", "hidden_size=32",
             "iters=2", "warmup=0", "dtype=float32")
    run = sweep_here(res, *sweep, monkeypatch=monkeypatch, capsys=capsys)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    summary_line = next(ln for ln in run.stdout.splitlines() if ln.startswith("matrix summary:"))
    assert "failed 0, error 0, timeout 0" in summary_line, summary_line
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("coverage: ")]
    assert any(ln.startswith(f"coverage: `{BROKEN}:skips_cp3` ran nothing at cp=3: every row of it there is "
                             "skipped, refused or passthrough; first reason: ") and "not built for cp=3" in ln
               for ln in lines), lines
    assert any(ln.startswith(f"coverage: `{BROKEN}:even_only` ran no uneven plan at cp=2, 3") for ln in lines), lines
    assert not any("skips_cp3` ran no uneven" in ln or "cp=2" in ln and "skips_cp3" in ln for ln in lines), lines
    assert lines[-1] == "coverage: 2 gap(s): exit 1 (allow_skipped=true passes them)"
    # the same sweep, finished, allowed: exit 0, the gaps still listed
    again = sweep_here(res, *sweep, "resume=true", "allow_skipped=true", monkeypatch=monkeypatch, capsys=capsys)
    assert again.returncode == 0, again.stdout[-3000:]
    assert "coverage: 2 gap(s): allowed (allow_skipped=true)" in again.stdout
    # and the report warns of both
    assert report_cli.main([str(res)]) == 0
    head = (res / "report.md").read_text().split("## Verdicts")[0]
    assert f"**WARNING: `{BROKEN}:skips_cp3` ran nothing at cp=3**" in head, head
    assert f"**WARNING: `{BROKEN}:even_only` ran no uneven plan at cp=2, 3**" in head, head


def test_a_plan_of_several_classes_counts_as_uneven_by_any_of_them():
    """A row whose plan is even and many short requests (``even+many_short``: the first label even) ran
    an uneven plan class; the coverage rule reads every label, not the first."""
    mine = "tests.broken_impls:x"
    assert coverage.gaps([_cov_row(mine, 2, "ok", "even+many_short")]) == []
    assert coverage.gaps([_cov_row(mine, 2, "ok", "even")]) == [(mine, 2, coverage.NO_UNEVEN, "")]


@pytest.mark.parametrize("rule, broken, gone", [
    ("RAN", ("ok", "failed", "error", "timeout", "skipped", "refused", "passthrough"), coverage.RAN_NOTHING),
    ("UNEVEN", CLASSES, coverage.NO_UNEVEN),
])
def test_each_coverage_rule_broken_lets_its_gap_pass(monkeypatch, rule, broken, gone):
    """What counts as having run (a skipped row ran nothing) and what counts as uneven (an
    even plan is not): each rule widened, the gap it finds is no longer found."""
    mine = "tests.broken_impls:x"
    rows = [_cov_row(mine, 2, "ok", "even"), _cov_row(mine, 3, "skipped", "uneven_by_one", reason="no")]
    assert {what for _, _, what, _ in coverage.gaps(rows)} == {coverage.RAN_NOTHING, coverage.NO_UNEVEN}
    monkeypatch.setattr(coverage, rule, broken)
    assert gone not in {what for _, _, what, _ in coverage.gaps(rows)}


def test_an_entry_point_plugin_is_outside_though_its_name_has_no_colon():
    """A plug-in installed by entry point is named without ``module:attr``; its origin (its
    distribution) says it is not the project's, and its gaps are reported as any plug-in's."""
    assert coverage.is_outside("engine_comm", "engine-comm 0.1.0")
    assert not coverage.is_outside("padded", origins.own())
    rows = [_cov_row("engine_comm", 2, "ok", "even", origin="engine-comm 0.1.0")]
    assert coverage.gaps(rows) == [("engine_comm", 2, coverage.NO_UNEVEN, "")]
