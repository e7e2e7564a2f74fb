"""Plots a reviewer reads at a glance: rendered here, every title lies inside
its figure, a cp size has one colour in every plot of a report, and a legend
explains each colour, line style and marker once (entries bounded by their
sum, never their product)."""

from __future__ import annotations

from matplotlib.colors import to_hex

from matrix.review import plots
from matrix.scale import plans

from report_rows import _frame, append, plot_rows


def titles_inside(fig) -> list[str]:
    """Every non-empty axes title and suptitle, each asserted to lie inside ``fig``."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    texts = [t for ax in fig.axes for t in (ax.title, ax._left_title, ax._right_title)]
    if fig._suptitle is not None:
        texts.append(fig._suptitle)
    shown = []
    for t in texts:
        if not t.get_text():
            continue
        b = t.get_window_extent(renderer)
        assert box.x0 <= b.x0 and b.x1 <= box.x1 and box.y0 <= b.y0 and b.y1 <= box.y1, (
            f"title {t.get_text()!r} at {b} runs outside the figure {box}")
        shown.append(t.get_text())
    assert shown, "no title drawn"
    return shown


def legend(fig) -> dict[str, object]:
    """``{label: handle}`` of the legend's entries (blank spacers left out)."""
    leg = fig.axes[0].get_legend()
    return {t.get_text(): h for t, h in zip(leg.get_texts(), leg.legend_handles) if t.get_text()}


def test_plans_plot_title_inside_and_one_legend_entry_per_meaning():
    rows, meta = plans.run(["--batches", "300", "--cp", "8,16,128", "--policy", "zigzag_page,zigzag,round_robin",
                            "--engine", "seed_fix,sglang_0_5_23", "--workload", "lognormal"])
    # the title plans._write gives the plot: a second line naming the workload
    fig = plans.plot(rows, f"Gathered rows over tokens per design and cp\n{meta['workload']}")
    (title,) = titles_inside(fig)
    assert "lognormal" in title  # the workload's line is drawn, whole
    entries = legend(fig)
    splits = {(r["engine"], r["policy"]) for r in rows}
    designs = set(plans.DESIGNS[1:])
    drawn = [ln for ln in fig.axes[0].get_lines() if len(ln.get_xdata())]
    # colour: design, line style: split, marker: statistic, each once
    assert len(entries) == len(designs) + len(splits) + len(plans.STATS), list(entries)
    assert len(drawn) == len(designs) * len(splits) * len(plans.STATS)
    assert designs <= set(entries)
    colours = {to_hex(ln.get_color()) for ln in drawn}
    assert colours == {to_hex(plans.DESIGN_COLOURS[d]) for d in designs}  # colour is the design alone


def test_report_plots_give_each_cp_one_colour_and_titles_inside(tmp_path):
    append(tmp_path, plot_rows())  # cp 1, 2, 4: the bandwidth plot leaves cp=1 out
    df = _frame(tmp_path)
    figs = {name: plot(df) for name, plot in plots.PLOTS}
    for fig in figs.values():
        titles_inside(fig)
    colour_of: dict[str, set[str]] = {}
    for name in (plots.LATENCY_PNG, plots.BUSBW_PNG):
        for label, handle in legend(figs[name]).items():
            if label.startswith("cp="):
                colour_of.setdefault(label, set()).add(to_hex(handle.get_color()))
    assert set(colour_of) == {"cp=1", "cp=2", "cp=4"}
    assert all(len(c) == 1 for c in colour_of.values()), colour_of  # one colour per cp, whichever plot
    assert len({next(iter(c)) for c in colour_of.values()}) == 3  # and cps apart
    # the padding plot colours layouts, with none of the cps' colours
    cp_colours = {next(iter(c)) for c in colour_of.values()}
    bars = {to_hex(p.get_facecolor()) for p in figs[plots.PADDING_PNG].axes[0].patches}
    assert bars and not bars & cp_colours, bars
    # the drawn series wear their legend's colour: busbw's cp=2 markers are latency's cp=2 line
    lat_lines = {to_hex(ln.get_color()) for ln in figs[plots.LATENCY_PNG].axes[0].get_lines() if len(ln.get_xdata())}
    bw = {to_hex(c.get_edgecolor()[0]) for c in figs[plots.BUSBW_PNG].axes[0].collections if len(c.get_offsets())}
    assert bw <= lat_lines, (bw, lat_lines)


def test_a_long_title_is_wrapped_inside_the_figure():
    fig, _ = plots._figure("Gathered rows over tokens per design and cp\n" + "a long workload description, " * 6)
    assert len(titles_inside(fig)) == 1


def test_a_cp_size_wears_one_colour_in_every_report():
    """cp=4 beside cp=2 in one run and beside cp=8 in another: the same colour (numbered over one
    report's cps, it was C2 in the first and C0 in the second); a second backend at one cp size takes
    the next free colour, never another cp's."""
    import pandas as pd

    first = plots.cp_colours(pd.DataFrame({"cp_size": [1, 2, 4], "backend": "gloo", "device": "cpu"}))[1]
    second = plots.cp_colours(pd.DataFrame({"cp_size": [4, 8], "backend": "gloo", "device": "cpu"}))[1]
    assert first["cp=4"] == second["cp=4"] and first["cp=2"] != first["cp=4"] != second["cp=8"]
    mixed = plots.cp_colours(pd.DataFrame({"cp_size": [2, 2, 4], "backend": ["gloo", "nccl", "gloo"],
                                           "device": ["cpu", "cuda", "cpu"]}))[1]
    assert len(set(mixed.values())) == 3, mixed


def test_a_failed_point_is_marked_as_failed_on_the_latency_and_bandwidth_plots(tmp_path):
    """A failing row has no time; it was left out unseen, its batch's other rows hollow as "timed by
    only some impls". Now a red x along the bottom marks each batch where a row failed, and the legend
    says so; a run with none has neither."""
    from matplotlib.colors import to_hex

    rows = plot_rows()
    append(tmp_path, rows)
    clean = plots.latency(_frame(tmp_path))
    assert "x along the bottom" not in " ".join(legend(clean))
    bad = dict(rows[-1], status="error", roundtrip_p50_us=None)
    append(tmp_path / "bad", [*rows[:-1], bad])
    fig = plots.latency(_frame(tmp_path / "bad"))
    assert any(label.startswith("x along the bottom: failed") for label in legend(fig)), list(legend(fig))
    reds = [c for c in fig.axes[0].collections if len(c.get_offsets()) and to_hex(c.get_edgecolor()[0]) == "#ff0000"]
    assert reds and float(reds[0].get_offsets()[0][0]) == float(bad["total_tokens"])
    # the bandwidth plot alike, at the bytes its plan gathers (it has no bandwidth)
    assert "x along the bottom" not in " ".join(legend(plots.busbw(_frame(tmp_path))))
    fig = plots.busbw(_frame(tmp_path / "bad"))
    assert any(label.startswith("x along the bottom: failed") for label in legend(fig)), list(legend(fig))
    reds = [c for c in fig.axes[0].collections if len(c.get_offsets()) and to_hex(c.get_edgecolor()[0]) == "#ff0000"]
    gathered = float(bad["padded_total"]) * float(bad["hidden_size"]) * {"bfloat16": 2, "float32": 4}[bad["dtype"]]
    assert reds and float(reds[0].get_offsets()[0][0]) == gathered, (reds[0].get_offsets(), gathered)
