"""Plans at scale, without ranks: what each design pads and moves, for many batches at large cp, per engine.

``python -m matrix.plans`` draws batches from a workload (conf/workload/), splits
every batch at every cp size by each engine's rules (nsa_cp_comm.engines: the
seed fix's engine pads the batch to a multiple of cp first, SGLang 0.5.23
splits the raw lengths and refuses some batches) with numpy (the same split
as ``Engine.plan``, vectorised over batches: a property test holds them
equal) and reports, per engine, cp and design, what every layer's MoE round
trip costs as the engine pays it (``Engine.costs``):

- ``legacy_even``: the lower bound, the raw batch moved once with no padding;
- ``padded``: the padded communicator, every shard padded to ``m = max_r n_r``
  inside the gather (``m*cp`` rows; attention sees no padding);
- ``pad_at_split``: every rank padded at the split to the engine's
  ``P = ceil_align(m, align)`` (``2*cp`` for zigzag splits, ``cp``
  otherwise; ``P*cp`` rows).

Per design: the gathered rows over the raw tokens minus one (overhead), the
padding rows in one rank's attention and in the MoE's buffer, each split into
processed and masked as the engine does, the collectives per layer and the
bytes. A batch the engine runs without CP (its ``can_apply`` refusal) moves
nothing: it is counted in ``refused_frac`` and left out of the overheads. The
plot draws mean and p99 overhead against cp per design. With ``--nccl-tests``
JSON files, each design's predicted collective time per layer is added (a
model: nccl-tests' figures interpolated at the design's bytes,
matrix.scale.nccl_tests).

Bad input: one line naming the option and value, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from nsa_cp_comm import engines
from nsa_cp_comm.harness.spec import DTYPE_BYTES, DTYPE_NAMES
from nsa_cp_comm.modes import MOE_QUANTS
from nsa_cp_comm.plan import POLICIES, ceil_align

from .. import command
from ..store.inputs import error_line
from ..store.outputs import check_dir, write_atomic
from .nccl_tests import NcclTestsError, load_model
from .workload import Batches, WorkloadError, draw, load

DESIGNS: tuple[str, ...] = engines.DESIGNS
# Per design: the costs Engine.costs gives, per batch.
COSTS: tuple[str, ...] = ("attn_pad_processed", "attn_pad_masked", "moe_pad_processed", "moe_pad_masked")
CP_MAX = 1024
CHUNK = 8192  # batches per vectorised step: bounds memory at cp=128 to tens of MB
BATCHES_AT_SCALE = 100_000  # batches drawn unless --batches says otherwise: plans' statistics at scale
PLOT = "plans_overhead.png"


def _block_counts(rem: np.ndarray, batch: np.ndarray, nb: int, n: int, cp: int) -> np.ndarray:
    """Per batch and rank ``k``: how many requests' blocks ``k`` and ``n-1-k``
    get the extra unit of an even split with remainder ``rem`` (block ``i``
    gets one more when ``i < rem``). ``[nb, cp]``."""
    hist = np.bincount(batch * (n + 1) + rem, minlength=nb * (n + 1)).reshape(nb, n + 1)
    ge = np.cumsum(hist[:, ::-1], axis=1)[:, ::-1]  # ge[:, j] = #{rem >= j}
    return ge[:, 1 : cp + 1] + ge[:, cp + 1 : n + 1][:, ::-1]


def per_rank_tokens(batches: Batches, cp: int, policy: str, page_size: int = 1,
                    align: int | None = None, pad_batch: bool = True) -> np.ndarray:
    """``[B, cp]``: every batch's tokens per rank, as ``plan_split(batch, cp,
    policy=..., page_size=..., align=..., pad_batch=...).per_rank_tokens``."""
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is not one of {', '.join(POLICIES)}")
    align = cp if align is None else align
    nb = len(batches)
    starts = batches.starts()
    sums = np.add.reduceat(batches.lens, starts)
    total = ceil_align(sums, align) if pad_batch else sums
    if policy == "round_robin":
        q, rem = np.divmod(total, cp)
        return q[:, None] + (np.arange(cp)[None, :] < rem[:, None])
    if policy == "contiguous":  # cp slices of ceil(T / cp): the tail rank(s) short
        size = -(-total // cp)
        return np.clip(total[:, None] - np.arange(cp)[None, :] * size[:, None], 0, size[:, None])
    padded = batches.lens.copy()
    padded[starts + batches.sizes - 1] += total - sums  # the last request takes the batch's padding
    batch = np.repeat(np.arange(nb, dtype=np.int64), batches.sizes)
    n = 2 * cp
    if policy == "dual_chunk_swap":
        # chunks of c = ceil(q / n): chunks 0..f-1 full, chunk f holds the rest
        # p < c (when f < n). Rank k gets chunk k (c if k < f) and chunk
        # n-1-k (c if n-1-k < f), and the partial chunk goes to its owner.
        c = -(-padded // n)
        f, part = np.divmod(padded, c)
        full = np.bincount(batch * (n + 1) + f, weights=c, minlength=nb * (n + 1)).reshape(nb, n + 1)
        ge = np.cumsum(full[:, ::-1], axis=1)[:, ::-1].astype(np.int64)  # ge[:, j]: c summed where f >= j
        k = np.arange(cp)
        out = ge[:, k + 1] + ge[:, n - k]
        has = f < n
        owner = np.where(f < cp, f, n - 1 - f)[has]
        out += np.bincount(batch[has] * cp + owner, weights=part[has], minlength=nb * cp).astype(np.int64).reshape(nb, cp)
        return out
    # zigzag_page: whole pages per block (an even split of the pages); the block
    # holding the last page is short by the page's unused tail, the ones after it empty.
    # zigzag is its split with pages of one token.
    page_size = 1 if policy == "zigzag" else page_size
    pages = -(-padded // page_size)
    qp, remp = np.divmod(pages, n)
    base = 2 * np.bincount(batch, weights=qp, minlength=nb).astype(np.int64)
    out = (base[:, None] + _block_counts(remp, batch, nb, n, cp)) * page_size
    deficit = pages * page_size - padded
    last = np.where(qp > 0, n - 1, remp - 1)
    owner = np.minimum(last, n - 1 - last)
    return out - np.bincount(batch * cp + owner, weights=deficit, minlength=nb * cp).astype(np.int64).reshape(nb, cp)


def _subset(batches: Batches, lo: int, hi: int) -> Batches:
    starts = batches.starts()
    a = int(starts[lo])
    b = int(starts[hi - 1] + batches.sizes[hi - 1])
    return Batches(batches.lens[a:b], batches.sizes[lo:hi])


def plan_stats(batches: Batches, cp: int, policy: str, page_size: int = 1, align: int | None = None,
               engine: str = engines.DEFAULT, model: str = engines.DEFAULT_MODEL, graphs: str | bool = "auto",
               max_capture_size: int | None = None, moe_quant: str = "none") -> dict:
    """Per batch (arrays of length B), by ``engine``'s rules for ``model``
    and its experts' quantization ``moe_quant``:
    ``raw`` tokens, ``total`` T (what the split divides), ``max`` m, ``min``
    min_r n_r, ``physical`` P (the CUDA-graph bucket where the engine runs the
    step in graphs: ``graphs``, ``max_capture_size`` as the matrix's keys),
    ``refused`` (the engine runs the batch without CP), and per design
    (``costs[design]``, :func:`nsa_cp_comm.engines.design_costs`) the gathered
    rows, the padding rows processed and masked, those a graph bucket added,
    the collectives."""
    rules = engines.get(engine, model, moe_quant)
    capture, _ = rules.graphs(graphs, max_capture_size)
    parts = []
    for lo in range(0, len(batches), CHUNK):
        n = per_rank_tokens(_subset(batches, lo, min(lo + CHUNK, len(batches))), cp, policy, page_size, align,
                            pad_batch=rules.pads_batch)
        parts.append(np.stack([n.sum(axis=1), n.max(axis=1), n.min(axis=1)], axis=1))
    tot, mx, mn = np.concatenate(parts).T
    starts = batches.starts()
    raw = np.add.reduceat(batches.lens, starts)
    shortest = np.minimum.reduceat(batches.lens, starts)
    refused = np.asarray(rules.refuses(shortest, raw, cp, policy), dtype=bool) & np.ones(len(raw), dtype=bool)
    costs = engines.design_costs(rules, raw, tot, mx, mn, cp, policy, refused, capture)
    return {
        "raw": raw, "total": tot, "max": mx, "min": mn, "physical": rules.physical_rows(mx, policy, cp, capture),
        "max_capture_size": capture,
        "refused": refused, "costs": costs,
        "rows": {d: costs[d]["rows"] for d in DESIGNS},
        "attn_pad": {d: costs[d]["attn_pad_processed"] + costs[d]["attn_pad_masked"] for d in DESIGNS},
        "moe_pad": {d: costs[d]["moe_pad_processed"] + costs[d]["moe_pad_masked"] for d in DESIGNS},
    }


def _pct(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if len(x) else None


def summarize(stats: dict, cp: int, policy: str, hidden: int, itemsize: int, model=None,
              engine: str = engines.DEFAULT, engine_model: str = engines.DEFAULT_MODEL,
              experts: int = 256, moe_quant: str = "none") -> list[dict]:
    """One row per design: overhead, padding rows (processed, masked; those a
    CUDA-graph bucket added) and the bytes every gather of a layer moves (the
    hidden states', fp8 where the engine quantizes before the gather, and
    each side tensor's, for ``experts`` routed experts), p50 / p99 / mean
    over the batches the engine runs with CP."""
    rules = engines.get(engine, engine_model, moe_quant)
    row_bytes = (hidden * (rules.gather_itemsize or itemsize)
                 + sum(t.row_bytes(hidden, experts, itemsize) for t in rules.side_tensors))
    rows = []
    cp_run = ~stats["refused"]
    raw = stats["raw"][cp_run]
    for d in DESIGNS:
        c = {k: v[cp_run] for k, v in stats["costs"][d].items()}
        over = c["rows"] / raw - 1.0
        gbytes = c["rows"] * row_bytes
        row = {
            "engine": engine, "engine_model": engine_model, "moe_quant": moe_quant, "cp_size": cp, "policy": policy,
            "strategy": engines.get(engine).strategy_names(policy), "design": d, "batches": len(stats["raw"]),
            "padding_at": _padding_at(engine, d),
            "refused_frac": float(stats["refused"].mean()) if len(stats["raw"]) else 0.0,
            "overhead_mean": float(over.mean()) if len(over) else None, "overhead_p50": _pct(over, 50),
            "overhead_p99": _pct(over, 99), "overhead_max": float(over.max()) if len(over) else None,
            "collectives_per_layer": int(c["collectives"].max()) if len(over) else 0,
            "gathered": ", ".join(rules.gathered),
            "max_capture_size": int(stats.get("max_capture_size", 0)),
            "graph_pad_p50": _pct(c["graph_pad"], 50), "graph_pad_p99": _pct(c["graph_pad"], 99),
            "gather_MB_mean": float(gbytes.mean() / 1e6) if len(over) else None,
            "gather_MB_p99": (_pct(gbytes, 99) or 0.0) / 1e6 if len(over) else None,
        }
        for k in COSTS:
            row[f"{k}_p50"], row[f"{k}_p99"] = _pct(c[k], 50), _pct(c[k], 99)
        if model is not None and len(over):
            t = model.predict(gbytes, cp)
            if t is not None:
                row["predicted_collective_us_p50"] = float(np.percentile(t, 50))
                row["predicted_collective_us_p99"] = float(np.percentile(t, 99))
        rows.append(row)
    return rows


def _padding_at(engine: str, design: str) -> str:
    """Where a design's padding rows sit: none moved (legacy_even), inside the
    gather buffer only (padded), or where the engine's split puts them."""
    return {"legacy_even": "none", "padded": "the gather buffer only"}.get(design, engines.get(engine).padding_at)


# Colour is the design, line style the engine's split, the marker the statistic:
# each explained once in the legend (designs + splits + 2 entries, not their product).
DESIGN_COLOURS = {"legacy_even": "tab:gray", "padded": "tab:blue", "pad_at_split": "tab:orange"}
DASHES = ("-", "--", ":", "-.", (0, (5, 1)), (0, (1, 3)), (0, (3, 1, 1, 1)), (0, (5, 3)))
STATS = (("overhead_mean", "mean over batches", "o", 1.0), ("overhead_p99", "p99 over batches", "^", 0.5))


def plot(rows: list[dict], title: str):
    from matplotlib.lines import Line2D

    from ..review.plots import _figure, _finish

    fig, ax = _figure(title)
    splits = sorted({(r["engine"], r["policy"]) for r in rows})
    # one line style per (engine, split); more splits than styles reuse them in order
    styles = {split: DASHES[i % len(DASHES)] for i, split in enumerate(splits)}
    names = {}
    drawn = []
    for eng, pol in splits:
        for d in DESIGNS[1:]:  # legacy_even, the raw batch, is the 0 line
            s = sorted((r for r in rows if (r["engine"], r["policy"], r["design"]) == (eng, pol, d)
                        and r["overhead_mean"] is not None), key=lambda r: r["cp_size"])
            if not s:
                continue
            names[(eng, pol)] = f"{eng} {s[0].get('strategy') or pol}"
            drawn.append(d)
            cps = [r["cp_size"] for r in s]
            for key, _, marker, alpha in STATS:
                ax.plot(cps, [100 * r[key] for r in s], linestyle=styles[(eng, pol)], color=DESIGN_COLOURS[d],
                        marker=marker, alpha=alpha)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("cp size")
    ax.set_ylabel("gathered rows over raw tokens - 1 (%; legacy_even: 0)")
    by_design = [Line2D([], [], color=DESIGN_COLOURS[d], linewidth=3, label=d) for d in DESIGNS[1:] if d in drawn]
    by_split = [Line2D([], [], color="0.2", linestyle=styles[k], label=names[k]) for k in splits if k in names]
    by_stat = [Line2D([], [], color="0.2", linestyle="none", marker=m, alpha=a, label=label)
               for _, label, m, a in STATS]
    return _finish(fig, ax, None, [by_design, by_split, by_stat],
                   title="colour: design\nline: engine, split\nmarker: statistic")


def table(rows: list[dict]) -> str:
    cols = ["engine", "cp_size", "strategy", "design", "padding_at", "refused_frac", "overhead_mean", "overhead_p99",
            "attn_pad_processed_p99", "attn_pad_masked_p99", "moe_pad_processed_p99", "collectives_per_layer",
            "gather_MB_mean"]
    if any(r.get("graph_pad_p99") for r in rows):  # the rows a CUDA-graph bucket pads past the split's own
        cols.insert(cols.index("collectives_per_layer"), "graph_pad_p99")
    if any(r.get("moe_pad_masked_p99") for r in rows):
        cols.insert(cols.index("collectives_per_layer"), "moe_pad_masked_p99")
    if any("predicted_collective_us_p50" in r for r in rows):
        cols += ["predicted_collective_us_p50", "predicted_collective_us_p99"]

    def cell(c: str, v) -> str:
        if v is None:
            return "-"
        if c.startswith("overhead") or c == "refused_frac":
            return f"{100 * v:.2f}%"
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols),
                      *("| " + " | ".join(cell(c, r.get(c, "")) for c in cols) + " |" for r in rows)])


def _ints(name: str, text: str, lo: int, hi: int) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(_usage(f"{name}={text}: must be a comma-separated list of integers")) from None
    bad = [v for v in vals if not lo <= v <= hi]
    if bad or not vals:
        raise SystemExit(_usage(f"{name}={text}: every value must be in [{lo}, {hi}]"))
    return vals


def _usage(msg: str) -> int:
    print(f"error: {error_line(msg)}", file=sys.stderr)
    return 2


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=" ".join(command("plans")), description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="lognormal", help="conf/workload/NAME.yaml or a .yaml path")
    ap.add_argument("--batches", type=int, default=None,
                    help=f"batches to draw (the workload's K; default {BATCHES_AT_SCALE}, whatever the file says)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--cp", default="8,16,32,64,128", help="cp sizes, comma-separated")
    ap.add_argument("--policy", default=",".join(POLICIES),
                    help="split policies, comma-separated (each engine plans those it has; round_robin is SGLang's "
                         "interleave, dual_chunk_swap vLLM's, contiguous vllm-ascend's)")
    ap.add_argument("--engine", default=",".join(engines.NAMES),
                    help=f"engines whose rules plan the batches, comma-separated ({', '.join(engines.NAMES)})")
    ap.add_argument("--model", default=engines.DEFAULT_MODEL, choices=engines.MODELS,
                    help="the model the engines serve (its router's masking, CUDA graphs, side tensors)")
    ap.add_argument("--graphs", default="auto", choices=("auto", "true", "false"),
                    help="CUDA graphs for the CP prefill, as the matrix's graphs key (auto: where the engine "
                         "runs them)")
    ap.add_argument("--max-capture-size", type=int, default=None,
                    help="the largest capture size (default: each engine's)")
    ap.add_argument("--moe-quant", default="none", choices=MOE_QUANTS,
                    help="the experts' activation quantization, as the matrix's moe_quant (an engine that does "
                         "not model it is not planned)")
    ap.add_argument("--experts", type=int, default=256,
                    help="routed experts (router logits' columns; DeepSeek-V3.2: 256)")
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--hidden-size", type=int, default=7168)
    ap.add_argument("--dtype", default="bfloat16", choices=DTYPE_NAMES)
    ap.add_argument("--nccl-tests", action="append", default=[], metavar="JSON",
                    help="nccl-tests -J output (all_gather_perf / reduce_scatter_perf); repeatable")
    ap.add_argument("--out", type=Path, default=None, help="write plans.json and the plot here")
    ap.add_argument("--no-plot", action="store_true")

    def error(message: str) -> None:  # argparse's own errors: one line, exit 2
        raise SystemExit(_usage(message))

    ap.error = error  # type: ignore[method-assign]
    return ap.parse_args(argv)


def run(argv: list[str] | None = None) -> tuple[list[dict], dict]:
    args = parse(argv)
    cps = _ints("--cp", args.cp, 1, CP_MAX)
    policies, names = [p.strip() for p in args.policy.split(",")], [e.strip() for e in args.engine.split(",")]
    for flag, given, known in (("--policy", policies, POLICIES), ("--engine", names, engines.NAMES)):
        for v in given:
            if v not in known:
                raise SystemExit(_usage(f"{flag}={v}: must be one of {', '.join(known)}"))
    quant = args.moe_quant
    pairs = [(e, p) for e in names for p in policies
             if p in engines.get(e).strategies and not engines.get(e, args.model, quant).quant_refusal]
    if not pairs:
        raise SystemExit(_usage(f"--policy={args.policy}: no engine of --engine={args.engine} has any of these splits"))
    for name, v, hi in (("--page-size", args.page_size, 1 << 20), ("--hidden-size", args.hidden_size, 1 << 16),
                        ("--experts", args.experts, 1 << 16),
                        *((("--max-capture-size", args.max_capture_size, 1 << 20),) if args.max_capture_size else ())):
        if not 1 <= v <= hi:
            raise SystemExit(_usage(f"{name}={v}: must be an integer in [1, {hi}]"))
    if args.out is not None:  # before the work: a place the results cannot go is found now
        try:
            check_dir(args.out, f"--out={args.out}", ValueError)
        except ValueError as exc:
            raise SystemExit(_usage(str(exc))) from None
    overrides = {"batches": BATCHES_AT_SCALE if args.batches is None else args.batches}
    if args.seed is not None:
        overrides["seed"] = args.seed
    try:
        own = load(args.workload).batches if args.batches is None else None
        w = load(args.workload, overrides)
        model = load_model(args.nccl_tests) if args.nccl_tests else None
        t0 = time.perf_counter()
        batches = draw(w)  # a trace is read here: its errors are bad input too
    except (WorkloadError, NcclTestsError) as exc:
        raise SystemExit(_usage(str(exc))) from None
    if own is not None and own != BATCHES_AT_SCALE:  # a workload file's K is a sweep's: said, not silently replaced
        print(f"note: workload={args.workload} draws {own} batches for a sweep; these plans draw {BATCHES_AT_SCALE} "
              "(--batches sets it)", file=sys.stderr)
    t_draw = time.perf_counter() - t0
    graphs = args.graphs  # auto | true | false: Engine.graphs reads the words as the config's values
    rows = []
    for eng, pol in pairs:
        for cp in cps:
            st = plan_stats(batches, cp, pol, page_size=args.page_size, engine=eng, model=args.model,
                            graphs=graphs, max_capture_size=args.max_capture_size, moe_quant=quant)
            rows.extend(summarize(st, cp, pol, args.hidden_size, DTYPE_BYTES[args.dtype], model, engine=eng,
                                  engine_model=args.model, experts=args.experts, moe_quant=quant))
    t_plans = time.perf_counter() - t0 - t_draw
    meta = {"workload": w.describe(), "batches": len(batches), "requests": int(batches.sizes.sum()),
            "engines": {e: _engine_meta(engines.get(e, args.model, quant), graphs, args.max_capture_size)
                        for e in names},
            "engine_model": args.model, "moe_quant": quant, "experts": args.experts,
            "splits": [f"{e}/{p}" for e, p in pairs],
            "not_planned": [f"{e}/{p}: " + (engines.get(e).strategy_refusal(p)
                                             or engines.get(e, args.model, quant).quant_refusal)
                            for e in names for p in policies if (e, p) not in pairs],
            "cp": cps, "policies": policies, "page_size": args.page_size, "hidden_size": args.hidden_size,
            "dtype": args.dtype, "draw_s": round(t_draw, 3), "plans_s": round(t_plans, 3),
            "model": model.describe() if model is not None else None}
    if args.out is not None:
        try:
            _write(args.out, meta, rows, None if args.no_plot else w.describe())
        except OSError as exc:
            raise SystemExit(_usage(f"--out={args.out}: {' '.join(str(exc.strerror or exc).split())}")) from None
    return rows, meta


def _engine_meta(rules: engines.Engine, graphs: str | bool, max_capture_size: int | None) -> dict:
    """What an engine does with the padding and its graphs, for the model it serves."""
    capture, why = rules.graphs(graphs, max_capture_size)
    return {"title": rules.title, "source": rules.source, "padding_at": rules.padding_at,
            "attention_padding": "masked" if rules.attn_pad_masked else "processed",
            "moe_padding": "masked" if rules.moe_pad_masked else "processed",
            "cuda_graphs": f"up to {capture} rows per rank" if capture else f"eager: {why or rules.graph_refusal}",
            "gathered": list(rules.gathered)}


def _write(out: Path, meta: dict, rows: list[dict], plot_title: str | None) -> None:
    """plans.json and (with a title) the plot, each whole or not at all."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "plans.json", json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    if plot_title is not None:
        from ..review.plots import png

        fig = plot(rows, f"Gathered rows over tokens per design and cp\n{plot_title}")
        write_atomic(out / PLOT, png(fig))


def main(argv: list[str] | None = None) -> int:
    try:
        rows, meta = run(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    print(f"workload: {meta['workload']} ({meta['requests']} requests)")
    print(f"{meta['batches']} batches x cp {meta['cp']} x {', '.join(meta['splits'])}: "
          f"drawn in {meta['draw_s']:.2f} s, planned in {meta['plans_s']:.2f} s")
    for line in meta["not_planned"]:
        print(f"not planned: {line}")
    if meta["model"]:
        print(f"predicted collective times: {meta['model']}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
