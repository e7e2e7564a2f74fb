"""`python -m matrix.report`: like with like. Implementations are set side by
side on the points all of them were timed; what only some ran is its own
table; each impl has a ratio to ``--reference``; the words follow what ran;
one impl under two names is one; wall time comes from the runs' records;
report.md is rendered from report.json."""

from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd
import pytest

from matrix.report import cli as report_cli
from matrix.review import plots, report, report_doc, side_by_side
from report_rows import _frame, append, make_row, run_report, section, table_row

DESIGN = dict(attn_pad_rows=0, moe_pad_rows=0)  # what a designs run's rows carry
UNEVEN = dict(policy="zigzag_page", page=64, seq_lens=(1001, 300), padded_total=1536)


@pytest.fixture(autouse=True)
def no_pngs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plots are tested on their own: here they would only cost time."""
    monkeypatch.setattr(report.plots, "render_all", lambda df: {})


def even_and_uneven(tmp_path: Path) -> Path:
    """cp=2: two even points (padded 110, legacy 100) and two uneven points
    padded timed at 5000 us that legacy refused."""
    rows = []
    for n in (512, 1024):
        rows += [make_row("padded", seq_lens=(n, n), p50=110.0), make_row("legacy", seq_lens=(n, n), p50=100.0)]
    for first in (1001, 1002):
        uneven = {**UNEVEN, "seq_lens": (first, 300)}
        rows += [make_row("padded", cp=2, p50=5000.0, **uneven),
                 make_row("legacy", cp=2, status="refused", reason="refused", **uneven)]
    append(tmp_path, rows)
    return tmp_path


def test_side_by_side_figures_are_over_the_points_every_impl_was_timed(tmp_path, capsys):
    """padded's median over its own points would be 2555 us, half of them the
    uneven points legacy refused: the tables and the ratio hold the two even
    points only, and the uneven ones are a table of their own saying why."""
    md, appendix, doc = run_report(even_and_uneven(tmp_path))
    latency = section(md, "Latency")
    assert table_row(latency, "2")[1:] == ["2", "100", "110", "0.909"]  # points, legacy, padded, legacy/padded
    assert "Timed by only some impls, so in no comparison: 2 points (legacy refused 2)" in latency
    assert table_row(latency, "2", 1) == ["2", "legacy refused", "2", "5000"]
    lat = doc["tables"]["latency"]
    assert lat["points"] == 2 and len(lat["point_ids"]) == 2
    apart = doc["tables"]["latency_only_some"]
    assert apart["points"] == 2 and not set(apart["point_ids"]) & set(lat["point_ids"])
    bw = doc["tables"]["bandwidth"]
    padded_bw = [r["padded"] for r in bw["records"]]
    even_bw = statistics.median(make_row("padded", seq_lens=(n, n), p50=110.0)["busbw_padded_GBps"]
                                for n in (512, 1024))
    assert bw["points"] == 2 and padded_bw == [pytest.approx(even_bw)]
    assert "legacy/padded 0.91 (quartiles 0.91-0.91 over 2 points)" in md.splitlines()[2]
    assert doc["summary"]["compared_points"] == 2 and doc["summary"]["timed_points"] == 4


def test_a_plug_in_gets_its_ratio_to_the_reference(tmp_path, capsys):
    plug = "my_plug.comm:impl"
    rows = []
    for n in (512, 1024):
        rows += [make_row("padded", seq_lens=(n, n), p50=100.0),
                 make_row(plug, seq_lens=(n, n), p50=150.0, impl_origin="my_plug.comm 1.0")]
    rows += [make_row("padded", p50=200.0, **UNEVEN), make_row(plug, p50=300.0, impl_origin="my_plug.comm 1.0",
                                                               **UNEVEN)]
    md, appendix, doc = run_report(tmp_path, rows=rows)
    assert f"{plug}/padded 1.50 (quartiles 1.50-1.50 over 3 points)" in md.splitlines()[2]
    header = table_row(section(md, "Latency"), "cp_size")
    assert header[-1] == f"{plug}/padded" and table_row(section(md, "Latency"), "2")[-1] == "1.50"
    assert doc["summary"]["ratio_to_reference"][plug]["median"] == pytest.approx(1.5)
    # the plug-in ran every point: nothing is said to be refused, and legacy, which never ran, is not named
    said = md.splitlines()[2] + section(md, "Latency") + section(md, "Bandwidth and padding") + section(md, "Plots")
    assert "legacy" not in said and "refus" not in said
    # any impl can be the reference
    md, _, doc = run_report(tmp_path, "--reference", plug)
    assert f"padded/{plug} 0.67 (quartiles 0.67-0.67 over 3 points)" in md.splitlines()[2]
    assert doc["summary"]["reference"] == plug and doc["tables"]["ratios"]["reference"] == plug


def test_an_unknown_reference_is_one_line_exit_2(tmp_path, capsys):
    append(tmp_path, [make_row()])
    assert report_cli.main([str(tmp_path), "--reference", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["error: --reference=nope: no row of RESULTS has this impl (impls: padded)"]
    assert not (tmp_path / "report.md").exists()


def test_the_words_follow_what_ran(tmp_path, capsys):
    """A designs run (padded and pad_at_split on every point, legacy never run)
    names no legacy refusal; a run where legacy refused says so, with the count."""
    designs = tmp_path / "designs"
    rows = []
    for lens, extra in (((512, 512), {}), ((1001, 300), dict(padded_total=1536, policy="zigzag_page", page=64))):
        rows += [make_row("padded", seq_lens=lens, p50=100.0, **extra, **DESIGN),
                 make_row("pad_at_split", seq_lens=lens, p50=120.0, **extra, **DESIGN)]
    md, _, _ = run_report(designs, rows=rows)
    said = md.splitlines()[2] + section(md, "Latency") + section(md, "Bandwidth and padding") + section(md, "Plots")
    assert "legacy" not in said and "refus" not in said
    assert "pad_at_split/padded 1.20 (quartiles 1.20-1.20 over 2 points)" in md.splitlines()[2]
    md, _, _ = run_report(even_and_uneven(tmp_path / "legacy"))
    assert "2 points timed by only some impls (legacy refused 2)" in section(md, "Plots")
    # only the reference timed: nothing compared, said as such
    only = tmp_path / "only"
    md, _, _ = run_report(only, rows=[make_row("padded", seq_lens=(n, n)) for n in (512, 1024)])
    assert "only padded was timed: nothing to compare" in md.splitlines()[2]


def test_one_impl_under_two_names_is_one_column(tmp_path, capsys):
    origin = "engine_comm.adapter 1.0"
    rows = [make_row("padded", seq_lens=(n, n), p50=100.0) for n in (512, 1024)]
    rows += [make_row("engine_comm", seq_lens=(512, 512), p50=130.0, impl_origin=origin),
             make_row("engine_comm.adapter:impl", seq_lens=(1024, 1024), p50=130.0, impl_origin=origin)]
    rows += [make_row("legacy", seq_lens=(n, n), p50=90.0) for n in (512, 1024)]  # same origin as padded: not merged
    md, _, doc = run_report(tmp_path, rows=rows)
    header = table_row(section(md, "Verdicts"), "status")
    assert header[1:-2] == ["engine_comm", "legacy", "padded"]
    assert ("One implementation under 2 names, `engine_comm`, `engine_comm.adapter:impl` (one `impl_origin`: "
            "`engine_comm.adapter 1.0`): reported as `engine_comm`.") in md
    assert table_row(section(md, "Latency"), "2")[1:] == ["2", "130", "90", "100", "1.30", "0.9"]
    assert doc["summary"]["merged_impls"] == {"engine_comm": ["engine_comm", "engine_comm.adapter:impl"]}
    # the reference may be given by either name
    md, _, doc = run_report(tmp_path, "--reference", "engine_comm.adapter:impl")
    assert doc["summary"]["reference"] == "engine_comm"


def test_same_origin_never_merges_the_built_ins_or_two_attributes():
    df = pd.DataFrame({"impl": ["padded", "legacy", "m.x:a", "m.x:b", "e", "m.y:c"],
                       "impl_origin": ["nsa_cp_comm 0.1.0", "nsa_cp_comm 0.1.0", "m.x 1", "m.x 1", "m.y 2", "m.y 2"]})
    assert side_by_side.same_origin(df) == {"e": ["e", "m.y:c"]}


def test_same_origin_never_merges_two_names_a_module_declares():
    """A catalog of implementations in one module (examples/field_bugs: a twin and its twelve bugs, each
    declaring its own name) has one origin: merged as one implementation, the report kept one row per
    point, the twin's where it came last, and said PASS-like counts over the bugs' failures."""
    df = pd.DataFrame({"impl": ["twin", "ceil_pad", "m.z:twin"], "impl_origin": ["m.z 1"] * 3})
    assert side_by_side.same_origin(df) == {}
    assert side_by_side.same_origin(df.iloc[[0, 2]]) == {"twin": ["m.z:twin", "twin"]}


def test_wall_time_is_the_runs_span(tmp_path, capsys):
    """One run started at 00:00:00 (runs.jsonl) whose rows were written from
    00:00:30 to 00:01:27: 87 s, not the 58.5 s from its first row's start; a
    second run from 00:02:00 to 00:02:10 adds 10 s, the gap between not."""
    stamps = ["2025-01-01T00:00:30", "2025-01-01T00:01:00", "2025-01-01T00:01:27"]
    append(tmp_path, [make_row(seq_lens=(n, n), timestamp=t) for n, t in zip((256, 512, 1024), stamps)],
           run_id="run-a", started="2025-01-01T00:00:00+00:00")
    md, _, doc = run_report(tmp_path)
    assert "wall time 87 s (1 run, each from its start in runs.jsonl to its last row's timestamp)" in md
    assert doc["summary"]["wall_time"]["seconds"] == 87
    append(tmp_path, [make_row(seq_lens=(2048, 2048), timestamp="2025-01-01T00:02:10")],
           run_id="run-b", started="2025-01-01T00:02:00+00:00")
    md, _, doc = run_report(tmp_path)
    assert ("wall time 97 s (2 runs, each from its start in runs.jsonl to its last row's timestamp; 130 s from "
            "the first start to the last row)") in md
    # a run beside the first (another node appending to the same folder) adds no time
    append(tmp_path, [make_row(seq_lens=(4096, 4096), timestamp="2025-01-01T00:01:20")],
           run_id="run-c", started="2025-01-01T00:00:10+00:00")
    md, _, doc = run_report(tmp_path)
    assert "wall time 97 s (3 runs," in md and doc["summary"]["wall_time"]["seconds"] == 97


def test_a_wall_s_no_timedelta_holds_or_a_year_before_1677_still_gives_a_wall_time(tmp_path, capsys):
    """A wall_s of inf and a row stamped in year 1 (a hand edit, a clock gone wrong) raised out of the
    report (OutOfBoundsTimedelta, OutOfBoundsDatetime): that wall_s is read as none, as an empty one,
    and the times are subtracted in the timestamps' own unit."""
    append(tmp_path, [make_row(seq_lens=(256, 256), wall_s=float("inf"), timestamp="2025-01-01T00:00:30"),
                      make_row(seq_lens=(512, 512), timestamp="0001-01-01T00:00:00")], started="")
    wall = run_report(tmp_path)[2]["summary"]["wall_time"]
    assert (wall["first"], wall["last"]) == ("0000-12-31T23:59:58.500000+00:00", "2025-01-01T00:00:30+00:00")


def test_report_md_is_rendered_from_report_json(tmp_path, capsys):
    md, appendix, doc = run_report(even_and_uneven(tmp_path))
    assert report_doc.markdown(doc) == (md, appendix)
    # every table of the report's own sections is a table of report.json, as records
    own = md[:md.index("## Plots")]
    shown = [b for b in doc["report"] if isinstance(b, dict)]
    assert own.count("\n|:") + own.count("\n|-") == len(shown)
    for block in shown:
        t = doc["tables"][block["table"]]
        assert t["records"] and set(t["records"][0]) == set(t["columns"])


def test_the_padding_column_is_the_mean_over_the_points_it_sits_beside(tmp_path, capsys):
    """Three even points and one that pads 15% (both designs ran all four): the
    median padding fraction is 0, the mean (as the padding table says) 0.038."""
    rows = []
    for lens, extra in (((256, 256), {}), ((512, 512), {}), ((1024, 1024), {}),
                        ((1001, 300), dict(padded_total=1536))):
        rows += [make_row(impl, cp=4, seq_lens=lens, p50=100.0, **extra, **DESIGN) for impl in ("padded", "pad_at_split")]
    md, _, doc = run_report(tmp_path, rows=rows)
    (bw,) = doc["tables"]["bandwidth"]["records"]
    (pad,) = doc["tables"]["padding"]["records"]
    assert bw["mean padding_frac"] == pytest.approx((1 - 1301 / 1536) / 4) == pytest.approx(pad["zigzag"])


def test_latency_plot_lines_only_over_the_points_every_impl_was_timed(tmp_path):
    even_and_uneven(tmp_path)
    fig = plots.latency(report.mark_common(_frame(tmp_path)))
    ax = fig.axes[0]
    lines = [ln for ln in ax.get_lines() if len(ln.get_xdata())]
    assert max(max(ln.get_ydata()) for ln in lines) < 5000  # the refused point is no line's
    hollow = [c for c in ax.collections if not c.get_facecolors().size]
    assert sorted(tuple(xy) for c in hollow for xy in c.get_offsets()) == [(1301, 5000), (1302, 5000)]


def test_bandwidth_plot_fades_the_points_timed_by_only_some(tmp_path):
    even_and_uneven(tmp_path)
    ax = plots.busbw(report.mark_common(_frame(tmp_path))).axes[0]
    faded = [c for c in ax.collections if (c.get_alpha() or 1.0) < 1]
    assert {x for c in faded for x, _ in c.get_offsets()} == {1536 * 256 * 4, 1301 * 256 * 4, 1302 * 256 * 4}
    solid = {x for c in ax.collections if (c.get_alpha() or 1.0) == 1 for x, _ in c.get_offsets()}
    assert solid == {2 * n * 256 * 4 for n in (512, 1024)}  # the even points, both impls


def test_runs_of_two_backends_are_compared_within_each(tmp_path, capsys):
    """gloo and nccl rows are never side by side; a point only padded ran on
    nccl is apart, said with its backend."""
    rows = []
    for backend, device, legacy_us in (("gloo", "cpu", 100.0), ("nccl", "cuda", 50.0)):
        for n in (512, 1024):
            rows += [make_row("padded", seq_lens=(n, n), p50=110.0, backend=backend, device=device),
                     make_row("legacy", seq_lens=(n, n), p50=legacy_us, backend=backend, device=device)]
    rows.append(make_row("padded", p50=500.0, backend="nccl", device="cuda", **UNEVEN))
    _, _, doc = run_report(tmp_path, rows=rows)
    lat = {r["backend"]: r for r in doc["tables"]["latency"]["records"]}
    assert (lat["gloo"]["legacy/padded"], lat["nccl"]["legacy/padded"]) == (pytest.approx(100 / 110),
                                                                           pytest.approx(50 / 110))
    (apart,) = doc["tables"]["latency_only_some"]["records"]
    assert (apart["backend"], apart["not timed there"], apart["padded"]) == ("nccl", "legacy no row", 500)


def test_a_workloads_batches_are_compared_where_every_impl_ran(tmp_path, capsys):
    """Per workload the impls' times are over the same batches: a batch
    pad_at_split failed is left out for padded too, and said."""
    rows = []
    for n, failed in ((512, False), (1024, False), (4096, True)):
        rows += [make_row("padded", seq_lens=(n, n), p50=float(n), workload="lognormal", **DESIGN),
                 make_row("pad_at_split", seq_lens=(n, n), workload="lognormal", **DESIGN,
                          **(dict(status="error", correct=None) if failed else dict(p50=float(n))))]
    md, _, doc = run_report(tmp_path, code=1, rows=rows)  # the error row: verdict FAIL
    by_impl = {r["impl"]: r for r in doc["tables"]["workloads"]["records"]}
    assert by_impl["padded"]["batches"] == by_impl["pad_at_split"]["batches"] == 2
    assert by_impl["padded"]["roundtrip us p50"] == 768.0
    assert "Left out: 1 batch timed by only some impls (pad_at_split error 1)." in md
