"""The catalog of the engines' CP bugs (examples/field_bugs): each bug caught with its check where
its mechanism shows and ``ok`` where it does not, the correct twin ``ok`` everywhere; each check
turned off lets its bugs past it; the catalog's own judge fails a row that is not as expected.

The fast tests run on warm ranks at cp 3 (an even plan, where half the mechanisms cannot show, and
a page-aligned uneven one with the longest shard last) every bug whose ranks return their findings;
the three whose ranks raise or wait (a size mismatch in the residual's add, in the gather's
collective, a rank skipping the gather) become rows through the app's diagnosis, which the slow
test runs: the preset at cp 2 through the app, judged as docs/field_bugs.md was rendered.
"""

from __future__ import annotations

import pandas as pd
import pytest

from examples.field_bugs import BUGS, BY_NAME, NOT_YET, RAISED
from examples.field_bugs import table as fb_table
from matrix_cli import REPO, sweep_here
from nsa_cp_comm.harness.spec import PointSpec
from rank_tasks import folded, point_without_check

MODULE = "examples.field_bugs.bugs"
EVEN = dict(seq_lens=(96,), cp_size=3, policy="zigzag")  # n = (32, 32, 32)
UNEVEN = dict(seq_lens=(216, 99), cp_size=3, policy="zigzag_page", page_size=16)  # n = (96, 110, 112)
# vLLM's DualChunkSwap of the raw lengths, serving DeepSeek-V4: the router logits gathered beside the
# rows, and the router masks the padding rows it is told of: n = (17, 18, 18)
VLLM_UNEVEN = dict(seq_lens=(53,), cp_size=3, policy="dual_chunk_swap", engine="vllm_0_33", engine_model="deepseek_v4")
# The bugs whose mechanism needs vLLM's points: a side tensor gathered, a router that masks what it is told.
VLLM_ONLY = ("side_layout", "padding_unmarked")
# Ranks that raise or hang are diagnosed into rows by the app (the slow test's).
DIAGNOSED = ("empty_rank_returns", "ceil_pad", "residual_gathered_rows")
ON_WARM_RANKS = tuple(b.name for b in BUGS if b.name not in DIAGNOSED)


def ref(name: str) -> str:
    return f"{MODULE}:{name}"


def rows(rank_pool, where: dict, names, check: str = "") -> dict:
    spec = PointSpec(**where, impls=tuple(ref(n) for n in names), hidden_size=32, warmup=0, iters=1)
    got = folded(spec, rank_pool(spec.cp_size).run(point_without_check, spec, "gloo", check, timeout_s=120))
    return {name: got[ref(name)] for name in names}, spec.plan()


@pytest.mark.parametrize("where", [EVEN, UNEVEN, VLLM_UNEVEN], ids=["even", "uneven", "vllm_uneven"])
def test_each_bug_is_caught_where_its_mechanism_shows_and_ok_elsewhere(rank_pool, where):
    got, plan = rows(rank_pool, where, ("twin", *ON_WARM_RANKS))
    assert got["twin"].status == "ok", got["twin"].reason
    shown = []
    for name in ON_WARM_RANKS:
        bug, row = BY_NAME[name], got[name]
        if not bug.shows(plan):
            assert row.status == "ok", (name, row.status, row.reason)
            continue
        shown.append(name)
        if bug.check == RAISED:
            assert row.status == "error" and "error:" in row.reason, (name, row.status, row.reason)
        else:
            assert row.status in ("failed", "error") and row.failed_check == bug.check, (name, row.status,
                                                                                        row.failed_check, row.reason)
    # the seed fix's uneven plan shows every mechanism but vLLM's (its engine gathers no side tensor and
    # its MoE masks no padding), vLLM's shows those too; the even plan hides some
    if where is EVEN:
        assert len(shown) < len(ON_WARM_RANKS), shown
    elif where is UNEVEN:
        assert set(ON_WARM_RANKS) - set(shown) == set(VLLM_ONLY), shown
    else:
        assert set(VLLM_ONLY) <= set(shown), shown


# The checks an implementation's report names (the pool's collective checks, collective_shapes and
# collective_skipped, are held to their own broken checkers in tests/harness).
REPORTED = sorted({b.check for b in BUGS if b.check not in (RAISED, "collective_shapes", "collective_skipped")})


@pytest.mark.parametrize("check", REPORTED)
def test_each_check_turned_off_lets_its_bugs_past_it(rank_pool, check):
    names = [b.name for b in BUGS if b.check == check and b.name in ON_WARM_RANKS]
    where = VLLM_UNEVEN if set(names) <= set(VLLM_ONLY) else UNEVEN
    got, plan = rows(rank_pool, where, names, check)
    for name in names:
        assert BY_NAME[name].shows(plan), name  # where the check, on, catches it
        assert got[name].failed_check != check, (name, got[name].status, got[name].reason)


def _row(bug: str, status: str, failed_check: str = "", reason: str = "", **plan) -> dict:
    where = {"seq_lens": "[216,99]", "cp_size": "3", "policy": "zigzag_page", "effective_page_size": "16",
             "align": "3", "engine": "seed_fix", **plan}
    return {"bug": bug, "impl": f"field_bugs_{bug}", "status": status, "failed_check": failed_check,
            "reason": reason, "plan_class": "paged_uneven", **where}


@pytest.mark.parametrize("row,needle", [
    (_row("twin", "failed", "scatter_chunk"), "twin cp=3"),  # the twin blamed
    (_row("ceil_pad", "ok"), "ok, expected failed"),  # a bug missed where it shows
    (_row("ceil_pad", "failed", "scatter_chunk"), "expected the check collective_shapes"),  # another check named
    (_row("ceil_pad", "failed", "collective_shapes", seq_lens="[96]", policy="zigzag", effective_page_size="1"),
     "expected ok"),  # blamed where its mechanism cannot show
    (_row("residual_gathered_rows", "failed", "scatter_chunk"), "expected error"),
    # skipped by the plug-in itself, not by the engine's refusal: judged, and wrong
    (_row("side_layout", "skipped", reason="not built for cp=3"), "skipped, expected ok"),
])
def test_the_catalogs_judge_fails_a_row_that_is_not_as_expected(row, needle):
    right = {**row, "status": "ok", "failed_check": ""} if row["bug"] == "twin" else None
    if right is not None:
        assert fb_table.wrong(pd.DataFrame([right])) == []
    got = fb_table.wrong(pd.DataFrame([row]))
    assert len(got) == 1 and needle in got[0], got


def test_a_point_the_engine_refuses_is_not_judged():
    """vLLM has no page-aligned split: every row of such a point is skipped with the engine's
    reason, the twin's too; the judge leaves them out, and the doc counts them apart."""
    refused = _row("side_layout", "skipped", reason="engine=vllm_0_33: vLLM 0.33 has no zigzag_page split",
                   engine="vllm_0_33", engine_model="deepseek_v32")
    assert fb_table.wrong(pd.DataFrame([refused, {**refused, "bug": "twin", "impl": "field_bugs_twin"}])) == []
    assert "so its rows there are `skipped` (2 rows)" in fb_table.render(
        pd.DataFrame([refused, {**refused, "bug": "twin", "impl": "field_bugs_twin"}])).replace("\n", " ")


def test_the_doc_lists_every_bug_and_every_one_not_yet_caught():
    doc = (REPO / "docs" / "field_bugs.md").read_text()
    assert all(f"| `{b.name}` |" in doc for b in BUGS)
    assert all(t in doc for t, _, _ in NOT_YET)
    assert "python -m examples.field_bugs.table" in doc


def test_the_table_says_what_it_lacks_in_one_line(tmp_path, capsys):
    assert fb_table.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().startswith(f"error: {tmp_path}: no results.csv")


def test_the_preset_at_cp_2_catches_the_bugs_ranks_raise_or_wait_on(tmp_path, monkeypatch, capsys):
    """The preset through the app, narrowed to cp 2 and to the bugs the warm-rank tests cannot
    fold (each raises or waits on some rank) beside the twin: the app's diagnosis makes them
    rows, judged as docs/field_bugs.md was."""
    impls = ",".join(ref(n) for n in ("twin", *DIAGNOSED))
    run = sweep_here(tmp_path / "fb", "+matrix=field_bugs", "+field_bugs_at=seed_fix_cp2", f"impl={impls}",
                     monkeypatch=monkeypatch, capsys=capsys)
    assert run.returncode == 1, run.stdout + run.stderr  # the bugs' rows fail the sweep
    df = fb_table.load(tmp_path / "fb")
    assert set(df["bug"]) == {"twin", *DIAGNOSED} and set(df["cp_size"]) == {"2"}
    assert fb_table.wrong(df) == []
    doc = fb_table.render(df)
    assert "| `empty_rank_returns` |" in doc and " 1 / 1 | 4 / 4 |" in doc  # caught on the one empty-rank plan
