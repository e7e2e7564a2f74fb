"""Summarise a results table into ``report.md`` and three PNG plots.

    python -m matrix.report RESULTS [--out DIR]

RESULTS is a results directory (its ``results.csv``, or the ``results.csv``
files below it, concatenated) or a CSV file. The report is written next to the
CSV (or into the directory given, when several were concatenated), or into
``--out``; the headline tables are printed. Sections, in order: correctness
(incorrect points first), the claim check, latency, bandwidth and padding, the
environment and the exact sweep overrides.

Bad input is one ``error:`` line on stderr and exit code 2, with nothing written.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from matrix._review import InputError, Run, fmt, frame_md, load_run, one_line, typed
from matrix.results import CONFIG_COLUMNS, STATUS_VALUES

REPORT_FILE = "report.md"
LATENCY_PNG = "roundtrip_latency.png"
PADDING_PNG = "padding_frac.png"
BUSBW_PNG = "busbw.png"

# What a legacy all_gather_into_tensor raises on an uneven plan; a legacy row
# that reproduced it is the expected outcome, not a failure.
LEGACY_UNEVEN_ERROR = "output tensor size must be equal to world_size times input tensor size"

FAILED_STATUSES = ("failed", "error", "timeout")
ENV_FIELDS = ("torch_version", "nccl_version", "host", "device_name", "backend", "device", "git_sha")
POINT = ["impl", "policy", "cp_size", "page_size", "seq_lens", "mlp_mode"]
PLAN_KEY = ["policy", "cp_size", "page_size", "seq_lens", "align"]
STDOUT_ROWS = 20  # long tables are cut on the terminal; report.md has them whole

Section = Callable[[pd.DataFrame, "int | None"], str]


# --- helpers


def _is(series: pd.Series, value: bool) -> pd.Series:
    """Plain-bool mask of cells equal to ``value``; empty cells never match."""
    return series.eq(value).fillna(False).astype(bool)


def _ok(df: pd.DataFrame) -> pd.Series:
    return df["status"].str.strip().eq("ok")


def _moves_rows(df: pd.DataFrame) -> pd.Series:
    """ok rows whose timings are communication: not the SCATTERED-mode
    pass-through of padded/legacy (microseconds of nothing, which would
    drown the medians)."""
    passthrough = df["mlp_mode"].astype(str).eq("SCATTERED") & df["impl"].isin(["padded", "legacy"])
    return _ok(df) & ~passthrough


def _mixed(df: pd.DataFrame) -> list[str]:
    """backend/device when the rows mix several, so tables keep them apart."""
    return [c for c in ("backend", "device") if df[c].nunique() > 1]


def _table(frame: pd.DataFrame, limit: int | None, index: bool = False) -> str:
    if frame.empty:
        return "_(none)_"
    if limit is not None and len(frame) > limit:
        more = len(frame) - limit
        return frame_md(frame.head(limit), index=index) + f"\n\n... {more} more row(s) in {REPORT_FILE}"
    return frame_md(frame, index=index)


def _label(value: object) -> str:
    text = fmt(value)
    return text if text else "(empty)"


# --- sections (each renders markdown; ``limit`` cuts long tables for stdout)


def _incorrect(df: pd.DataFrame) -> pd.DataFrame:
    return df[_is(df["correct"], False) | _is(df["even_bitwise_equal"], False)]


def _correctness(df: pd.DataFrame, limit: int | None) -> str:
    out: list[str] = []
    status = df["status"].str.strip()
    bad = _incorrect(df)
    if len(bad):
        out += [
            f"### !!! INCORRECT RESULTS: {len(bad)} point(s) !!!",
            "",
            "`correct` is False (output differs from the reference) or `even_bitwise_equal` "
            "is False (an even plan where padded and legacy are not bitwise equal):",
            "",
            _table(bad[POINT + ["backend", "device", "status", "correct", "even_bitwise_equal", "max_rel_err",
                                "reason"]], limit),
            "",
        ]
        repros = [r for r in bad["repro"] if r.strip()]
        if repros and limit is None:
            out += ["Reproduce with:", "", "```", *repros, "```", ""]
    else:
        out += ["No incorrect results: no point has `correct` False or a failed even-plan bitwise check.", ""]

    order = list(STATUS_VALUES) + sorted(set(status) - set(STATUS_VALUES))
    counts = pd.crosstab(df["impl"].map(_label), status.map(_label)).reindex(
        columns=[_label(s) for s in order], fill_value=0
    )
    counts.loc["all"] = counts.sum()
    counts["total"] = counts.sum(axis=1)
    counts.index.name, counts.columns.name = "impl", None
    out += ["### Points by status", "", _table(counts, None, index=True), ""]

    unchecked = df[status.eq("ok") & df["correct"].isna()]
    if len(unchecked):
        out += [f"**warning:** {len(unchecked)} ok row(s) carry no correctness verdict (`correct` is empty).", ""]

    expected = df[
        df["impl"].eq("legacy")
        & _is(df["is_even"], False)
        & status.eq("ok")
        & df["reason"].str.contains(LEGACY_UNEVEN_ERROR, regex=False)
    ]
    if len(expected):
        out += [
            f"{len(expected)} legacy row(s) on uneven plans reproduced the expected error "
            f'"{LEGACY_UNEVEN_ERROR}" (expected, not a failure; no timings).',
            "",
        ]

    failing = df[status.isin(FAILED_STATUSES) | ~status.isin(STATUS_VALUES)]
    out += [f"### Failed, error and timeout points ({len(failing)})", ""]
    out += [_table(failing[["status"] + POINT + ["backend", "device", "reason"]], limit), ""]

    skipped = df[status.eq("skipped")]
    if len(skipped):
        reasons = skipped["reason"].map(lambda r: one_line(r, 120) or "(no reason)").value_counts()
        frame = reasons.rename_axis("reason").reset_index(name="points")
        out += [f"### Skipped points ({len(skipped)}) by reason", "", _table(frame, limit), ""]
    return "\n".join(out).rstrip()


def _plans(df: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct split plan (the claim is a property of the plan)."""
    plans = df[df["claim_holds"].notna()].drop_duplicates(subset=PLAN_KEY)
    return plans.assign(padding_rows=plans["padded_total"] - plans["total_tokens"])


def _claim(df: pd.DataFrame, limit: int | None) -> str:
    plans = _plans(df)
    out = [
        "Claim: the padded gather buffer `max_rank_len * cp` equals `ceil_align(sum(seq_lens), cp)`, "
        "i.e. the existing cp alignment already sizes it. Where it fails, the buffer carries "
        "`padded_total - total_tokens` rows of padding.",
        "",
    ]
    if plans.empty:
        return "\n".join(out + ["_(no row has a claim verdict)_"])
    summary = plans.groupby("policy").agg(
        plans=("claim_holds", "size"),
        holds=("claim_holds", lambda s: int(_is(s, True).sum())),
        fails=("claim_holds", lambda s: int(_is(s, False).sum())),
    )
    fails = plans[_is(plans["claim_holds"], False)].sort_values(
        ["padding_frac", "policy", "cp_size", "page_size"], ascending=[False, True, True, True]
    )
    summary["max_padding_frac_when_failing"] = fails.groupby("policy")["padding_frac"].max()
    out += ["### Plans by policy", "", _table(summary, None, index=True), ""]
    out += [f"### Plans where the claim fails ({len(fails)})", ""]
    cols = ["policy", "cp_size", "page_size", "seq_lens", "total_tokens", "max_rank_len", "padded_total",
            "padding_rows", "padding_frac"]
    out.append(_table(fails[cols], limit))
    return "\n".join(out)


def _latency(df: pd.DataFrame, limit: int | None) -> str:
    timed = df[_moves_rows(df) & df["roundtrip_p50_us"].notna()]
    if timed.empty:
        return "_(no ok row has a round-trip time)_"
    mixed = _mixed(timed)
    pivot = (
        timed.assign(policy=timed["policy"].map(_label))
        .groupby(mixed + ["cp_size", "impl", "policy"])["roundtrip_p50_us"]
        .median()
        .unstack("policy")
    )
    pivot.columns.name = None
    out = [
        f"### Round-trip p50 (us): median over points, cp size x policy ({len(timed)} timed ok rows)",
        "",
        _table(pivot, limit, index=True),
        "",
    ]

    even = timed[_is(timed["is_even"], True) & timed["impl"].isin(["padded", "legacy"])]
    key = [c for c in CONFIG_COLUMNS if c != "impl"] + ["policy"]
    pairs = even.groupby(key + ["impl"], dropna=False)["roundtrip_p50_us"].median().unstack("impl")
    out += ["### Padded vs legacy on even points (round-trip p50, us; ratio = padded / legacy)", ""]
    if not {"padded", "legacy"} <= set(pairs.columns) or pairs[["padded", "legacy"]].dropna().empty:
        return "\n".join(out + ["_(no even point has both padded and legacy timings)_"])
    pairs = pairs[["padded", "legacy"]].dropna().reset_index()
    pairs["ratio"] = pairs["padded"] / pairs["legacy"]
    summary = pairs.groupby(mixed + ["cp_size", "policy"]).agg(
        points=("ratio", "size"),
        padded_us=("padded", "median"),
        legacy_us=("legacy", "median"),
        ratio_median=("ratio", "median"),
        ratio_min=("ratio", "min"),
        ratio_max=("ratio", "max"),
    )
    out += [_table(summary, None, index=True), ""]
    if limit is None:  # the per-point list is for the file, not the terminal
        shown = ["cp_size", "policy", "page_size", "seq_lens"]
        shown += [c for c in key if c not in shown and pairs[c].nunique(dropna=False) > 1]
        out += ["Per point:", "", _table(pairs[shown + ["padded", "legacy", "ratio"]], None)]
    return "\n".join(out).rstrip()


def _bandwidth(df: pd.DataFrame, limit: int | None) -> str:
    timed = df[_moves_rows(df) & (df["busbw_padded_GBps"].notna() | df["busbw_useful_GBps"].notna())]
    out: list[str] = []
    if timed.empty:
        out += ["_(no ok row has a bus bandwidth)_", ""]
    else:
        bw = timed.groupby(_mixed(timed) + ["impl", "cp_size", "page_size"]).agg(
            points=("busbw_padded_GBps", "size"),
            busbw_padded_GBps=("busbw_padded_GBps", "median"),
            busbw_useful_GBps=("busbw_useful_GBps", "median"),
            padding_frac=("padding_frac", "median"),
        )
        out += ["### Bus bandwidth (GB/s, median over points): padded vs useful bytes", "",
                _table(bw, limit, index=True), ""]
    plans = df[df["padding_frac"].notna()].drop_duplicates(subset=PLAN_KEY)
    if not plans.empty:
        pad = plans.groupby(["policy", "cp_size", "page_size"])["padding_frac"].mean().unstack("page_size")
        pad.columns = [f"page {fmt(c)}" for c in pad.columns]
        out += ["### Mean padding_frac over plans, by policy and cp size (columns: page size)", "",
                _table(pad, limit, index=True)]
    return "\n".join(out).rstrip()


def _environment(df: pd.DataFrame, limit: int | None) -> str:
    rows = []
    for col in ENV_FIELDS:
        counts = df[col].str.strip().replace("", pd.NA).dropna().value_counts()
        if len(counts) <= 1:
            rows.append((col, ", ".join(counts.index) or "(empty)"))
        else:
            rows.append((col, ", ".join(f"{v} ({n} rows)" for v, n in counts.items())))
    stamps = sorted(t for t in df["timestamp"] if t.strip())
    if stamps:
        rows.append(("timestamp", f"{stamps[0]} .. {stamps[-1]}"))
    if df["wall_s"].notna().any():
        rows.append(("wall_s (sum)", fmt(df["wall_s"].sum())))
    out = ["| field | value(s) |", "| --- | --- |"] + [f"| {k} | {v.replace('|', chr(92) + '|')} |" for k, v in rows]
    overrides = df["overrides"].value_counts(sort=False)
    out += ["", f"### Sweep overrides ({len(overrides)} distinct; rows, then the override string)", "", "```"]
    out += [f"{n:>6}  {o if o.strip() else '(empty)'}" for o, n in overrides.items()]
    out.append("```")
    return "\n".join(out)


SECTIONS: tuple[tuple[str, Section], ...] = (
    ("Correctness", _correctness),
    ("Claim check", _claim),
    ("Latency", _latency),
    ("Bandwidth and padding", _bandwidth),
    ("Environment", _environment),
)


# --- plots (rendered in memory with Agg, so a failure writes nothing)


def _figure(title: str):  # -> matplotlib Figure; imported lazily, bad input stays fast
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), layout="constrained")
    FigureCanvasAgg(fig)  # explicit Agg canvas: no display, no pyplot global state
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _png(fig, ax, empty: bool, what: str) -> bytes:
    if empty:
        ax.text(0.5, 0.5, f"no {what} in this run", ha="center", va="center", transform=ax.transAxes)
    elif ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", ncol=2)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _log_if_wide(ax, values: pd.Series, axis: str, base: int = 10) -> None:
    values = values.dropna()
    if len(values) and values.min() > 0 and values.max() / values.min() >= 10:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=base)


MARKERS = "os^Dvx*P"
STYLES = ("-", "--", ":", "-.")


def _plot_latency(df: pd.DataFrame) -> bytes:
    fig, ax = _figure("Round-trip (gather + reduce-scatter) p50 vs tokens, per CP size")
    ax.set_xlabel("tokens in the batch (total_tokens)")
    ax.set_ylabel("round-trip latency p50 (µs)")
    d = df[_moves_rows(df) & df["roundtrip_p50_us"].notna() & df["total_tokens"].notna()]
    mixed = _mixed(d) if len(d) else []
    g = d.groupby(mixed + ["cp_size", "impl", "total_tokens"])["roundtrip_p50_us"].median().reset_index()
    cps, impls = sorted(g["cp_size"].unique()), sorted(g["impl"].unique())
    for (keys, s) in g.groupby(mixed + ["cp_size", "impl"]):
        keys = keys if isinstance(keys, tuple) else (keys,)
        cp, impl = keys[-2], keys[-1]
        i, j = cps.index(cp), impls.index(impl)
        s = s.sort_values("total_tokens")
        label = " ".join([*map(str, keys[:-2]), f"cp={fmt(cp)}", impl])
        ax.plot(s["total_tokens"], s["roundtrip_p50_us"], color=f"C{i % 10}", linestyle=STYLES[j % 4],
                marker=MARKERS[j % len(MARKERS)], label=label)
    _log_if_wide(ax, g["total_tokens"], "x")
    _log_if_wide(ax, g["roundtrip_p50_us"], "y")
    return _png(fig, ax, g.empty, "timed ok rows")


def _plot_padding(df: pd.DataFrame) -> bytes:
    fig, ax = _figure("Padding fraction of the gather buffer vs page size (mean over lengths)")
    ax.set_xlabel("page size (tokens)")
    ax.set_ylabel("padding fraction 1 − T / (m·cp)  (0–1)")
    plans = df[df["padding_frac"].notna() & df["page_size"].notna()].drop_duplicates(subset=PLAN_KEY)
    g = plans.groupby(["policy", "cp_size", "page_size"])["padding_frac"].mean().reset_index()
    cps, policies = sorted(g["cp_size"].unique()), sorted(g["policy"].unique())
    for (policy, cp), s in g.groupby(["policy", "cp_size"]):
        i, j = cps.index(cp), policies.index(policy)
        s = s.sort_values("page_size")
        ax.plot(s["page_size"], s["padding_frac"], color=f"C{i % 10}", linestyle=STYLES[j % 4],
                marker=MARKERS[j % len(MARKERS)], label=f"{policy} cp={fmt(cp)}")
    _log_if_wide(ax, g["page_size"], "x", base=2)
    ax.set_ylim(bottom=0)
    return _png(fig, ax, g.empty, "plans with a padding fraction")


def _plot_busbw(df: pd.DataFrame) -> bytes:
    fig, ax = _figure("Bus bandwidth vs gathered bytes (filled: padded, hollow: useful)")
    ax.set_xlabel("gathered buffer size (bytes; padded for filled, useful for hollow markers)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    d = df[_moves_rows(df) & df["busbw_padded_GBps"].notna() & df["bytes_padded"].notna()]
    cps, impls = sorted(d["cp_size"].unique()), sorted(d["impl"].unique())
    for (cp, impl), s in d.groupby(["cp_size", "impl"]):
        i, j = cps.index(cp), impls.index(impl)
        color, marker = f"C{i % 10}", MARKERS[j % len(MARKERS)]
        ax.scatter(s["bytes_padded"], s["busbw_padded_GBps"], color=color, marker=marker, s=22,
                   label=f"cp={fmt(cp)} {impl}")
        u = s[s["busbw_useful_GBps"].notna() & s["bytes_useful"].notna()]
        if marker == "x":  # unfilled marker: hollow would be invisible, use a lighter tone
            ax.scatter(u["bytes_useful"], u["busbw_useful_GBps"], color=color, marker=marker, s=22, alpha=0.4)
        else:
            ax.scatter(u["bytes_useful"], u["busbw_useful_GBps"], facecolors="none", edgecolors=color,
                       marker=marker, s=22)
    _log_if_wide(ax, pd.concat([d["bytes_padded"], d["bytes_useful"]]), "x")
    return _png(fig, ax, d.empty, "timed ok rows with bandwidth")


PLOTS: tuple[tuple[str, Callable[[pd.DataFrame], bytes]], ...] = (
    (LATENCY_PNG, _plot_latency),
    (PADDING_PNG, _plot_padding),
    (BUSBW_PNG, _plot_busbw),
)


# --- assembly


def render(run: Run, df: pd.DataFrame, limit: int | None = None) -> str:
    """The report as markdown; ``limit`` cuts long tables (for the terminal)."""
    if len(run.files) == 1:
        source = f"Source: `{run.files[0]}` ({len(df)} rows)"
    else:
        source = f"Source: {len(run.files)} files under `{run.value}` ({len(df)} rows): " + ", ".join(
            f"`{f}`" for f in run.files
        )
    lines = ["# nsa-cp-comm matrix report", "", source, ""]
    bad = len(_incorrect(df))
    if bad:
        lines += [f"> **!!! {bad} INCORRECT RESULT(S): see Correctness below !!!**", ""]
    for title, section in SECTIONS:
        lines += [f"## {title}", "", section(df, limit), ""]
    if limit is None:
        lines += ["## Plots", ""] + [f"![{name}]({name})" for name, _ in PLOTS] + [""]
    return "\n".join(lines)


def build(run: Run) -> tuple[str, str, dict[str, bytes]]:
    """(report.md text, stdout text, PNG bytes by file name), all in memory."""
    df = typed(run.raw)
    return render(run, df), render(run, df, STDOUT_ROWS), {name: plot(df) for name, plot in PLOTS}


def write(out: Path, markdown: str, plots: dict[str, bytes]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in plots.items():
        (out / name).write_bytes(data)
        written.append(out / name)
    (out / REPORT_FILE).write_text(markdown, encoding="utf-8")
    return [out / REPORT_FILE, *written]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m matrix.report",
        description="Summarise a results table: correctness, claim check, latency, bandwidth, environment.",
    )
    parser.add_argument("results", metavar="RESULTS", help="results directory or results CSV file")
    parser.add_argument(
        "--out", metavar="DIR", help="directory for report.md and the PNGs (default: next to the CSV)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns 0, or 2 on bad input (one line on stderr, nothing written)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # usage error (2, already printed) or --help (0): return, don't raise
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
            raise InputError(f"--out={args.out}: exists and is not a directory")
        run = load_run("RESULTS", args.results)
        out = Path(args.out) if args.out is not None else run.home
        markdown, brief, plots = build(run)
        try:
            written = write(out, markdown, plots)
        except OSError as exc:
            where = f"--out={args.out}" if args.out is not None else f"RESULTS={args.results}"
            raise InputError(f"{where}: cannot write the report to {out}: {one_line(exc, 200)}") from None
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note in run.notes():
        print(note)
    print(brief)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
