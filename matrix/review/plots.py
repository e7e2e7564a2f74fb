"""The report's three plots, rendered in memory as PNG bytes (matplotlib, Agg).

Input: the report's typed frame, one row per point. Contracts every plot keeps:
- implementations are set side by side on the same points only: where the
  frame has the report's ``_common`` column, lines (latency) and markers
  (bandwidth) are over the points every impl of the cp size was timed at; a
  point timed by only some impls is a hollow marker without a line (latency)
  or faded (bandwidth); a batch where a row failed, errored or timed out is
  marked with a red x along the latency plot's bottom (it has no time);
- timing plots use only rows with status ``ok`` and a value (refused,
  passthrough, skipped and failing rows carry no measurement), of the round
  trip (the MoE all-to-all at SCATTERED points is another operation);
- each series is drawn once (one line or marker set per cp size and impl);
- the legend names colours, markers and fills as drawn, through proxy artists,
  each once: N + M entries for N colours by M markers;
- a cp size has one colour in every plot of every report (:data:`CP_SLOTS`:
  cp=4 is the same colour beside cp=2 in one report and beside cp=8 in
  another, and in a plot that leaves cp=1 out); where a run mixes backends or
  devices, a second group of one cp size takes the next free colour; the
  padding plot's layouts take colours of another palette, so no colour means
  two things;
- titles are wrapped to the axes' width, so that they lie inside the figure;
- bandwidth leaves out cp=1, where nothing moves;
- series that would coincide (e.g. zero padding) are kept apart or annotated.
A plot with nothing to draw says so in its frame instead of failing.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
import pandas as pd

from nsa_cp_comm.harness.spec import DTYPE_BYTES

from ..store.results import BAD_STATUSES
from ._review import fmt, layout_label, m_stride
from .side_by_side import group_keys

LATENCY_PNG = "roundtrip_latency.png"
PADDING_PNG = "padding_frac.png"
BUSBW_PNG = "busbw.png"
COMMON = "_common"  # matrix.review.report.COMMON: a point every impl of its cp size was timed at

# Filled-capable markers only: the bandwidth plot draws each one hollow too.
MARKERS = "osD^vP*h"
STYLES = ("-", "--", ":", "-.")
# The padding plot's layouts: not the C0..C9 cycle, which means cp sizes here.
LAYOUT_COLOURS = ("#8c6d31", "#7b4173", "#637939", "#843c39", "#393b79", "#bd9e39", "#ad494a", "#8ca252")


# Characters a title line keeps at the default size: the axes of a 10-inch
# figure beside its legend are about 7 inches, some 85 characters; wrapped
# shorter, a title never runs past the figure's edge.
TITLE_CHARS = 75


def wrapped(title: str, width: int = TITLE_CHARS) -> str:
    """``title`` with each of its lines wrapped at ``width`` characters."""
    import textwrap

    return "\n".join(textwrap.fill(line, width=width, break_on_hyphens=False) or line
                     for line in title.split("\n"))


def _figure(title: str):  # -> (Figure, Axes); matplotlib imported lazily, bad input stays fast
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 5.5), layout="constrained")
    FigureCanvasAgg(fig)  # explicit Agg canvas: no display, no pyplot global state
    ax = fig.add_subplot()
    ax.set_title(wrapped(title))
    ax.grid(True, alpha=0.3)
    return fig, ax


# The colour (of matplotlib's ten, C0..C9) of each usual cp size, the same in
# every report; another cp size takes cp % 10, or the next free one.
CP_SLOTS: dict[int, int] = {cp: i for i, cp in enumerate((1, 2, 4, 8, 16, 32, 64, 128, 3, 6))}


def cp_colours(df: pd.DataFrame) -> tuple[list[str], dict[str, str]]:
    """``(keys, {label: colour})``: the colour of each cp size (and backend,
    device where the frame mixes them), by the cp size (:data:`CP_SLOTS`), so
    that every plot of every report gives a cp one colour; a group whose
    colour another group of the frame took (another backend at that cp, or
    an unusual cp) takes the next free one."""
    keys = group_keys(df)
    groups = _keys(df[df["cp_size"].notna()], keys)
    taken: set[int] = set()
    colours = {}
    for k in groups:
        cp = int(k[keys.index("cp_size")])
        slot = CP_SLOTS.get(cp, cp % 10)
        # the next free colour, when ten are not all taken
        slot = next((s % 10 for s in range(slot, slot + 10) if s % 10 not in taken), slot)
        taken.add(slot)
        colours[_group_label(k, keys)] = f"C{slot}"
    return keys, colours


def _drawn(colors: dict[str, str], d: pd.DataFrame, keys: list[str]) -> dict[str, str]:
    """The entries of ``colors`` that ``d`` draws (the legend's), in order."""
    here = {_group_label(k, keys) for k in _keys(d, keys)}
    return {label: c for label, c in colors.items() if label in here}


def _finish(fig, ax, empty: str | None, groups: list[list] | None = None, title: str | None = None):
    """The figure, with its legend, or a note saying that nothing was drawn.

    The legend sits outside the axes, right of them, so it never hides a point;
    its ``groups`` (colours, markers, fills) are stacked with a gap between."""
    if empty:
        ax.text(0.5, 0.5, f"no {empty} in this run", ha="center", va="center", transform=ax.transAxes)
    elif groups:
        from matplotlib.lines import Line2D

        gap = Line2D([], [], linestyle="none", label="")
        handles = [h for i, g in enumerate(groups) for h in ([gap] if i else []) + g]
        ax.legend(handles=handles, fontsize="small", title=title, title_fontsize="small", loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig


def png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _log_if_wide(ax, values: pd.Series, axis: str, base: int = 10) -> None:
    values = values.dropna()
    if len(values) and values.min() > 0 and values.max() / values.min() >= 10:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=base)


def _keys(df: pd.DataFrame, columns: list[str]) -> list[tuple]:
    return sorted(map(tuple, df[columns].drop_duplicates().to_numpy().tolist()))


def _colour_title(keys: list[str]) -> str:
    return ", ".join("cp size" if k == "cp_size" else k for k in keys)


def _group_label(keys: tuple, names: list[str]) -> str:
    return " ".join(f"{n}={fmt(k)}" if n == "cp_size" else str(k) for n, k in zip(names, keys)).replace("cp_size", "cp")


def _markers(rows: pd.DataFrame) -> dict[str, str]:
    """A marker per impl of ``rows``, in name order."""
    return {impl: MARKERS[j % len(MARKERS)] for j, impl in enumerate(sorted(rows["impl"].unique()))}


def _series(frame: pd.DataFrame, colour_keys: list[str], colors: dict[str, str], markers: dict[str, str]):
    """Each (colour key, impl) series of ``frame``: its rows, colour, marker and impl."""
    for keys, s in frame.groupby(colour_keys + ["impl"]):
        keys = keys if isinstance(keys, tuple) else (keys,)
        yield s, colors[_group_label(keys[:-1], colour_keys)], markers[keys[-1]], keys[-1]


def _proxies(colors: dict[str, str], markers: dict[str, str], styles: dict[str, str] | None = None) -> list[list]:
    """Legend entries: one coloured line per colour key, one dark marker (and
    line style) per marker key, so N + M entries explain N x M series."""
    from matplotlib.lines import Line2D

    by_colour = [Line2D([], [], color=c, linewidth=3, label=k) for k, c in colors.items()]
    by_marker = [Line2D([], [], color="0.2", marker=m, linestyle=(styles or {}).get(k, "none"), label=k)
                 for k, m in markers.items()]
    return [by_colour, by_marker]


def latency(df: pd.DataFrame):  # -> Figure
    fig, ax = _figure("Round-trip (gather + reduce-scatter) p50 vs tokens: median per cp size and impl")
    ax.set_xlabel("tokens in the batch (total_tokens)")
    ax.set_ylabel("round-trip latency p50 (µs)")
    # round trips only: the MoE all-to-all (SCATTERED) is another operation, tabled apart
    d = df[df["status"].eq("ok") & df["roundtrip_p50_us"].notna() & df["total_tokens"].notna()
           & df["mlp_mode"].ne("SCATTERED")]
    if d.empty:
        return _finish(fig, ax, "timed ok points")
    colour_keys, colors = cp_colours(df)
    colors = _drawn(colors, d, colour_keys)
    same = d[COMMON].astype(bool) if COMMON in d else pd.Series(True, index=d.index)
    g, g_apart = (d[part].groupby(colour_keys + ["impl", "total_tokens"])["roundtrip_p50_us"].median().reset_index()
                  for part in (same, ~same))
    markers = _markers(d)
    styles = {impl: STYLES[j % len(STYLES)] for j, impl in enumerate(markers)}
    for s, color, marker, impl in _series(g, colour_keys, colors, markers):
        s = s.sort_values("total_tokens")
        ax.plot(s["total_tokens"], s["roundtrip_p50_us"], color=color, linestyle=styles[impl], marker=marker,
                markersize=6)
    for s, color, marker, _ in _series(g_apart, colour_keys, colors, markers):
        ax.scatter(s["total_tokens"], s["roundtrip_p50_us"], facecolors="none", edgecolors=color, marker=marker,
                   s=36, linewidths=1.2)
    both = pd.concat([g, g_apart])
    _log_if_wide(ax, both["total_tokens"], "x")
    _log_if_wide(ax, both["roundtrip_p50_us"], "y")
    groups_ = _proxies(colors, markers, styles)
    extra = []
    if len(g_apart):
        from matplotlib.patches import Patch

        extra.append(Patch(facecolor="none", edgecolor="0.2", label="hollow, no line: timed by\nonly some impls"))
    extra += _mark_failed(ax, failed_at(df, df["total_tokens"]), "no time")
    if extra:
        groups_.append(extra)
    return _finish(fig, ax, None, groups_, title=f"colour: {_colour_title(colour_keys)}\nmarker: impl")


def failed_at(df: pd.DataFrame, x: pd.Series) -> list[float]:
    """The values of ``x`` (a plot's x axis, per row) of the round-trip rows that failed, errored
    or timed out, each once: a failing row has no time nor bandwidth, and is marked there."""
    bad = df["status"].isin(BAD_STATUSES) & x.notna() & df["mlp_mode"].ne("SCATTERED")
    return sorted(set(pd.to_numeric(x[bad], errors="coerce").dropna().tolist()))


def _mark_failed(ax, xs: list[float], lacks: str) -> list:
    """A red x along the bottom of ``ax`` at each of ``xs`` (where a row failed, not left out
    unseen), and its legend entry; nothing where none failed."""
    if not xs:
        return []
    from matplotlib.lines import Line2D

    ax.scatter(xs, [0.02] * len(xs), marker="x", color="red", s=40, linewidths=1.5, clip_on=False,
               transform=ax.get_xaxis_transform())
    return [Line2D([], [], linestyle="none", marker="x", color="red",
                   label=f"x along the bottom: failed,\nerror or timeout ({lacks})")]


def padding(df: pd.DataFrame):  # -> Figure
    fig, ax = _figure("Padding fraction of the gather buffer per cp size and layout")
    ax.set_xlabel("cp size")
    ax.set_ylabel("padding fraction 1 − T / (m·cp)   (bar: mean over batches, tick: max)")
    # the buffer of m = max_rank_len rows per rank, as the axis says; a fraction outside [0, 1] (an inf:
    # a hand edit) is no plan's, and no axis holds it
    plans = m_stride(df[df["padding_frac"].between(0, 1) & df["cp_size"].notna()]).drop_duplicates(
        subset=["policy", "cp_size", "page_size", "seq_lens", "align"])
    if plans.empty:
        return _finish(fig, ax, "plans with a padding fraction")
    plans = plans.assign(layout=layout_label(plans))
    g = plans.groupby(["cp_size", "layout"])["padding_frac"].agg(["mean", "max"]).reset_index()
    cps, layouts = sorted(g["cp_size"].unique()), sorted(g["layout"].unique())
    top = float(g["max"].max()) or 0.05  # all zero: any visible scale
    width = 0.8 / len(layouts)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = []
    for j, layout in enumerate(layouts):
        s = g[g["layout"].eq(layout)]
        x = np.array([cps.index(c) for c in s["cp_size"]]) + (j - (len(layouts) - 1) / 2) * width
        color = LAYOUT_COLOURS[j % len(LAYOUT_COLOURS)]
        ax.bar(x, s["mean"], width=width * 0.9, color=color)
        ax.plot(x, s["max"], linestyle="none", marker="_", markersize=12, color="0.1")
        # a bar too short to see is labelled with its value, so no layout silently vanishes
        for xi, mean, peak in zip(x, s["mean"], s["max"]):
            if mean < 0.02 * top:  # above the max tick, so the two do not cross
                ax.text(xi, peak, f" {fmt(mean)}", ha="center", va="bottom", rotation=90, fontsize=7, color=color)
        handles.append(Patch(color=color, label=layout))
    zero = g.groupby("layout")["max"].max()
    zero = [k for k, v in zero.items() if v == 0]
    if zero:
        ax.text(0.01, 0.98, "padding 0 at every cp size for: " + ", ".join(zero), transform=ax.transAxes,
                va="top", fontsize="small")
    handles.append(Line2D([], [], linestyle="none", marker="_", markersize=12, color="0.1", label="max over batches"))
    ax.set_xticks(range(len(cps)), [fmt(c) for c in cps])
    ax.set_ylim(0, top * 1.15)
    return _finish(fig, ax, None, [handles[:-1], handles[-1:]], title="layout")


def busbw(df: pd.DataFrame):  # -> Figure
    fig, ax = _figure("Bus bandwidth vs gathered bytes, cp > 1 (filled: padded bytes, hollow: useful bytes)")
    ax.set_xlabel("gathered bytes (padded buffer for filled markers, the tokens' bytes for hollow ones)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    # cp=1 moves nothing: a bus bandwidth of 0 there is a definition, not a point
    d = df[df["status"].eq("ok") & df["busbw_padded_GBps"].notna() & df["bytes_padded"].notna() & df["cp_size"].gt(1)
           & df["mlp_mode"].ne("SCATTERED")]
    # a failing row moved no timed bytes: its gathered buffer's size, from its plan, is where it is marked
    itemsize = df["dtype"].astype(str).str.strip().map(DTYPE_BYTES)
    gathered = pd.to_numeric(df["padded_total"], errors="coerce") * pd.to_numeric(df["hidden_size"], errors="coerce")
    wide = df["cp_size"].gt(1)
    failed = failed_at(df[wide], (gathered * itemsize)[wide])
    if d.empty:  # as the latency plot: a run that timed nothing says so
        return _finish(fig, ax, "timed ok points with cp > 1 and a bandwidth")
    # side by side on the same points: the points timed by only some impls faded
    same = d[COMMON].astype(bool) if COMMON in d else pd.Series(True, index=d.index)
    colour_keys, colors = cp_colours(df)
    colors = _drawn(colors, d, colour_keys)
    markers = _markers(d)
    # hollow markers only where padding exists: elsewhere they would sit on the filled ones
    pads = d["busbw_useful_GBps"].notna() & d["bytes_useful"].notna() & d["bytes_useful"].lt(d["bytes_padded"])
    drawn = []
    for part, alpha in ((same, 1.0), (~same, 0.35)):
        padded = d[part].groupby(colour_keys + ["impl", "bytes_padded"])["busbw_padded_GBps"].median().reset_index()
        useful = d[part & pads].groupby(colour_keys + ["impl", "bytes_useful"])["busbw_useful_GBps"].median()
        useful = useful.reset_index()
        for s, color, marker, _ in _series(padded, colour_keys, colors, markers):
            ax.scatter(s["bytes_padded"], s["busbw_padded_GBps"], color=color, marker=marker, s=30, alpha=alpha)
        for s, color, marker, _ in _series(useful, colour_keys, colors, markers):
            ax.scatter(s["bytes_useful"], s["busbw_useful_GBps"], facecolors="none", edgecolors=color, marker=marker,
                       s=30, linewidths=1.2, alpha=alpha)
        drawn += [padded["bytes_padded"], useful["bytes_useful"]]
    from matplotlib.patches import Patch

    # fill is shown by patches, a shape no impl uses, so it cannot be read as an impl
    fills = [
        Patch(facecolor="0.4", edgecolor="0.2", label="filled: padded bytes"),
        Patch(facecolor="none", edgecolor="0.2", label="hollow: useful bytes\n(plans with padding)"),
    ]
    if not same.all():
        ax.set_title(wrapped(f"{ax.get_title()}\nfaded: points timed by only some impls, none beside them"))
        fills.append(Patch(facecolor="0.4", edgecolor="0.2", alpha=0.35, label="faded: timed by\nonly some impls"))
    fills += _mark_failed(ax, failed, "no bandwidth")
    _log_if_wide(ax, pd.concat([*drawn, pd.Series(failed, dtype=float)]), "x")
    return _finish(fig, ax, None, [*_proxies(colors, markers), fills],
                   title=f"colour: {_colour_title(colour_keys)}\nmarker: impl\nfill: bytes counted")


PLOTS: tuple[tuple[str, Callable[[pd.DataFrame], object]], ...] = (
    (LATENCY_PNG, latency),
    (PADDING_PNG, padding),
    (BUSBW_PNG, busbw),
)


def render_all(df: pd.DataFrame) -> dict[str, bytes]:
    return {name: png(plot(df)) for name, plot in PLOTS}
