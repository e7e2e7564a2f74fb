"""The report's design comparison (padded vs pad_at_split) and its nccl-tests model section.

Both read the report's typed frame, one row per point and impl. A design pair
is the ``padded`` and ``pad_at_split`` rows of one point (same plan, same
ranks, same run, same engine), both ``ok``. "Cheaper" is judged as the
point's engine pays it (nsa_cp_comm.engines), each from the rows alone: bytes
each layer's gather moves (``bytes_padded``), padding rows per layer in
attention (``attn_pad_rows``; computed or zeroed as the engine does) and in
the MoE (``moe_pad_rows``; computed, or masked by the router where the
engine's model masks them, vLLM's DeepSeek-V4), the collectives per layer,
and round-trip time, where a difference within the rows' spread
(``roundtrip_iqr_us``) is a tie.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from nsa_cp_comm import engines
from nsa_cp_comm.modes import MOE_QUANTS

from ..store.results import STATUS_VALUES
from ._review import frame_md

A, B = "padded", "pad_at_split"
PAIR_KEEP = ["engine", "cp_size", "policy", "page_size", "seq_lens", "bytes_padded", "attn_pad_rows", "moe_pad_rows",
             "roundtrip_p50_us", "roundtrip_iqr_us", "collective_p50_us"]
KEYS = 5  # PAIR_KEEP's leading columns: the same in both rows of a pair


def pairs(df: pd.DataFrame, pair_key: str) -> pd.DataFrame:
    """One row per point with both designs ``ok``: ``X_a`` (padded) beside ``X_b`` (pad_at_split)."""
    ok = df[df["status"].eq("ok")]
    a = ok[ok["impl"].eq(A)].set_index(pair_key)
    b = ok[ok["impl"].eq(B)].set_index(pair_key)
    common = a.index.intersection(b.index)
    cols = [c for c in PAIR_KEEP if c in df.columns]
    keys = [c for c in cols if c in PAIR_KEEP[:KEYS]]
    values = [c for c in cols if c not in keys]
    out = pd.concat([a.loc[common, keys], a.loc[common, values].add_suffix("_a"),
                     b.loc[common, values].add_suffix("_b")], axis=1)
    return out.reset_index(drop=True)


def _cells_or(p: pd.DataFrame, column: str, default: str) -> pd.Series:
    """``column`` as text, ``default`` where it is empty or the rows have none (an older layout)."""
    if column not in p:
        return pd.Series(default, index=p.index)
    return p[column].astype(object).fillna("").astype(str).replace("", default)


def _engine_of(p: pd.DataFrame) -> pd.Series:
    return _cells_or(p, "engine", engines.DEFAULT)


def _layout(p: pd.DataFrame) -> pd.Series:
    """The split as the row's engine names it (SGLang's round_robin is its interleave)."""
    named = [engines.get(e).strategy_names(pol) if e in engines.NAMES else pol
             for e, pol in zip(_engine_of(p), p["policy"].astype(str))]
    out = pd.Series(named, index=p.index)
    return out.where(p["policy"].ne("zigzag_page"), "zigzag_page/" + p["page_size"].astype("Int64").astype(str))


def section(df: pd.DataFrame, pair_key: str, table=frame_md) -> list:
    """Markdown lines answering "which design is cheaper, where, by how much",
    per engine (``table``: how a table becomes a block; the report keeps it as records)."""
    if "impl" not in df or not df["impl"].eq(B).any():
        return []
    p = pairs(df, pair_key)
    lines = ["`padded` pads each shard to `m = max n_r` inside the gather only; `pad_at_split` pads every "
             "rank to the engine's `P = ceil_align(m, 2*cp zigzag | cp)` at the split, so the padding rows pass "
             "through every layer: attention computes them (the seed fix's engine) or zeroes their output "
             "(SGLang 0.5.23, vLLM 0.33, vllm-ascend: masked), the MoE computes them (vLLM 0.33's router masks "
             "them: `topk_ids = -1`). Each "
             "design issues one all-gather and one reduce-scatter per layer. Per point: both `ok` on the same "
             "plan, ranks and engine.", ""]
    if p.empty:
        return lines + ["No point has both designs `ok`: nothing to compare (see Verdicts)."]
    p = p.assign(layout=_layout(p), engine=_engine_of(p))
    masked = _engine_of(p).map(lambda e: engines.get(e).attn_pad_masked if e in engines.NAMES else False)
    p["attn_processed_b"] = p["attn_pad_rows_b"].where(~masked, 0)
    p["attn_masked_b"] = p["attn_pad_rows_b"].where(masked, 0)
    spread = np.fmax(p["roundtrip_iqr_us_a"].fillna(0), p["roundtrip_iqr_us_b"].fillna(0))
    diff = p["roundtrip_p50_us_b"] - p["roundtrip_p50_us_a"]
    p["time"] = np.where(diff.abs() <= spread, "tie", np.where(diff < 0, B, A))
    p["bytes"] = np.where(p["bytes_padded_b"] > p["bytes_padded_a"], A,
                          np.where(p["bytes_padded_b"] < p["bytes_padded_a"], B, "tie"))
    p["extra_bytes"] = p["bytes_padded_b"] / p["bytes_padded_a"] - 1
    p["extra_moe"] = p["moe_pad_rows_b"] - p["moe_pad_rows_a"]
    p["time_ratio"] = p["roundtrip_p50_us_b"] / p["roundtrip_p50_us_a"]
    g = p.groupby(["engine", "cp_size", "layout"], observed=True)
    summary = pd.DataFrame({
        "points": g.size(),
        "fewer bytes": g["bytes"].agg(lambda s: _tally(s)),
        "pad_at_split extra bytes (max)": g["extra_bytes"].max().map(lambda v: f"{100 * v:+.2f}%"),
        "pad_at_split extra MoE pad rows, processed (max)": g["extra_moe"].max().astype("Int64"),
        "attn pad rows, pad_at_split: processed (max)": g["attn_processed_b"].max().astype("Int64"),
        "masked (max)": g["attn_masked_b"].max().astype("Int64"),
        "faster (beyond spread)": g["time"].agg(lambda s: _tally(s)),
        "time pad_at_split/padded (median)": g["time_ratio"].median().map(lambda v: f"{v:.3f}"),
    }).reset_index()
    n = len(p)
    fewer_a, fewer_b = int((p["bytes"] == A).sum()), int((p["bytes"] == B).sum())
    fast_a, fast_b = int((p["time"] == A).sum()), int((p["time"] == B).sum())
    worst = p.loc[p["extra_bytes"].idxmax()]
    attn = (f"`pad_at_split` also holds up to {int(p['attn_pad_rows_b'].max())} padding rows in each rank's "
            f"attention per layer (computed: up to {int(p['attn_processed_b'].max())}, zeroed by the engine: up to "
            f"{int(p['attn_masked_b'].max())}), `padded` none.")
    answer = (
        f"**Which is cheaper, where:** over {n} point(s) ({', '.join(sorted(p['engine'].unique()))}), `padded` "
        f"moves fewer bytes on {fewer_a}, `pad_at_split` on {fewer_b}, the same on {n - fewer_a - fewer_b} "
        f"(`P >= m`, so never fewer for `pad_at_split`); the largest difference is "
        f"{100 * worst['extra_bytes']:+.2f}% at {worst['engine']} cp={worst['cp_size']} {worst['layout']} "
        f"{worst['seq_lens']}. {attn} "
        f"In time, `padded` is faster beyond the spread on {fast_a}, `pad_at_split` on {fast_b}, a tie on "
        f"{n - fast_a - fast_b} (median ratio pad_at_split/padded {p['time_ratio'].median():.3f}; on CPU/gloo "
        f"the time is this machine's, not a GPU's: the bytes and rows carry over, the times do not).")
    lines += [answer, "", "By engine, cp size and layout:", "", table(summary)]
    return lines


def _tally(s: pd.Series) -> str:
    c = s.value_counts()
    return ", ".join(f"{k} {int(c[k])}" for k in (A, B, "tie") if k in c)


def model_section(df: pd.DataFrame, model, table=frame_md) -> list:
    """Predicted (nccl-tests model) beside measured collective time, per timed round-trip row
    (``table``: as in :func:`section`)."""
    lines = [f"**This is {model.describe()}.**", ""]
    t = df[df["status"].eq("ok") & df["bytes_padded"].notna() & df["collective_p50_us"].notna()
           & df["cp_size"].gt(1) & ~df["impl"].eq("a2a")]
    if t.empty:
        return lines + ["No timed round trip with cp > 1 in this run."]
    pred = np.concatenate([model.predict(np.array([b]), int(c)) for b, c in zip(t["bytes_padded"], t["cp_size"])])
    out = pd.DataFrame({
        "impl": t["impl"].values, "cp_size": t["cp_size"].values, "policy": t["policy"].values,
        "seq_lens": t["seq_lens"].values, "bytes": t["bytes_padded"].astype("Int64").values,
        "measured collective p50 (us)": t["collective_p50_us"].round(1).values,
        "model (us)": np.round(pred, 1), "measured/model": np.round(t["collective_p50_us"].values / pred, 2),
    })
    by_impl = out.groupby("impl")["model (us)"].median().round(1)
    lines += ["Predicted gather + reduce-scatter time at each row's buffer bytes beside the measured collective "
              "time (`collective_p50_us`):", "", table(out.head(12))]
    if len(out) > 12:
        lines += ["", f"({len(out) - 12} more rows not shown)"]
    lines += ["", "Median modelled time per design: " + ", ".join(f"`{k}` {v} us" for k, v in by_impl.items())]
    return lines


def engines_section(df: pd.DataFrame, table=frame_md) -> list:
    """Per engine the run followed: its rules (where its split puts the padding,
    what attention and the MoE do with it), the splits and cp sizes it planned,
    and each implementation run under its rules with its rows by status, so an
    engine's plug-ins read beside that engine's plans. Empty where every row
    followed the default engine."""
    if "impl" not in df or df.empty:
        return []
    p = df.assign(engine=_engine_of(df), layout=_layout(df),
                  engine_model=_cells_or(df, "engine_model", engines.DEFAULT_MODEL),
                  moe_quant=_cells_or(df, "moe_quant", "none"))
    if set(p["engine"]) == {engines.DEFAULT}:
        return []
    out = []
    for (eng, model, quant, impl), g in p.groupby(["engine", "engine_model", "moe_quant", "impl"], sort=True,
                                                   observed=True):
        rules = (engines.get(eng, model, quant) if eng in engines.NAMES and model in engines.MODELS
                 and quant in MOE_QUANTS else None)
        counts = g["status"].value_counts()
        graph_rows = pd.to_numeric(g.get("graph_pad_rows", pd.Series(dtype=float)), errors="coerce").fillna(0)
        out.append({
            "engine": eng, "model": model, "experts' quantization": quant, "impl": impl,
            "rows": ", ".join(f"{s} {int(counts[s])}" for s in STATUS_VALUES if s in counts),
            "splits": ", ".join(sorted(g["layout"].astype(str).unique())),
            "cp": ", ".join(str(c) for c in sorted(pd.to_numeric(g["cp_size"]).astype(int).unique())),
            "padding at": rules.padding_at if rules else "",
            "attention": ("masked" if rules.attn_pad_masked else "processed") if rules else "",
            "MoE": ("masked" if rules.moe_pad_masked else "processed") if rules else "",
            "rows padded by graph buckets": int(graph_rows.sum()),
            "gathered": ", ".join(rules.gathered) if rules else "",
        })
    frame = pd.DataFrame(out)
    return [f"Each engine's rules and the implementations run under them ({len(frame['engine'].unique())} "
            "engine(s)): a plug-in written from an engine reads beside that engine's plans, `skipped` rows "
            "carrying the engine's or the plug-in's reason.", "", table(frame)]
