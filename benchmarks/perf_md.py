#!/usr/bin/env python
"""PERF.md, rendered from the committed benchmark JSON: no figure typed by hand.

    python benchmarks/perf_md.py           # write PERF.md from benchmarks/data/perf_*.json
    python benchmarks/perf_md.py --check   # exit 1 when PERF.md is not what the JSON gives

``benchmarks/bench_comm.py --out benchmarks/data/perf_cpu.json`` (or
``perf_gpu.json`` from ``benchmarks/gpu_check.sh``) writes the JSON; this
script turns every run it finds into tables, each headed by the machine,
versions, date, load average and exact command it came from, and says which
runs are still missing. tests/project/test_bench.py fails when PERF.md and the JSON
disagree. The table builders are shared with bench_comm.py's console output,
so the terminal and PERF.md show the same columns.

Only json and tabulate are imported: rendering needs neither torch nor ranks.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from tabulate import tabulate

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA_DIR = HERE / "data"
PERF_MD = REPO / "PERF.md"

# The runs PERF.md knows about, in the order it shows them. Other JSON files
# in the data folder belong to other tools.
RUNS: tuple[tuple[str, str], ...] = (("perf_cpu.json", "CPU"), ("perf_gpu.json", "GPU"))


# ---------------------------------------------------------------------------
# formatting
# ---------------------------------------------------------------------------


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def ms(us) -> str:
    """Microseconds as milliseconds, three significant decimals below 1 ms."""
    if _missing(us):
        return ""
    x = us / 1e3
    return f"{x:.3f}" if abs(x) < 1 else f"{x:.2f}"


def num(x, fmt: str = ".3f") -> str:
    return "" if _missing(x) else format(x, fmt)


def pct(x) -> str:
    return "" if _missing(x) else f"{100 * x:.2f} %"


def plan_label(p: dict) -> str:
    lens = ",".join(map(str, p["seq_lens"]))
    page = f"/p{p['page_size']}" if p["policy"] == "zigzag_page" else ""
    return f"{p['policy']}{page} [{lens}]"


def _stat(impl: dict | None, phase: str, key: str = "p50"):
    if not impl:
        return None
    return (impl.get("stats") or {}).get(phase, {}).get(key)


def markdown(headers: list[str], rows: list[list[str]], align: list[str]) -> str:
    return tabulate(rows, headers=headers, tablefmt="pipe", colalign=align, disable_numparse=True)


# ---------------------------------------------------------------------------
# tables: (headers, rows, alignment) from a section's entries
# ---------------------------------------------------------------------------


def _with_interval(e: dict) -> str:
    """The paired ratio, with its 95% interval where the run kept one."""
    lo, hi = e.get("ratio_lo"), e.get("ratio_hi")
    if lo is None or hi is None or lo != lo or hi != hi:  # absent, or NaN (too few iterations)
        return num(e.get("ratio"))
    return f"{num(e.get('ratio'))} ({num(lo)}-{num(hi)})"


def even_table(entries: list[dict]) -> tuple[list[str], list[list[str]], list[str]]:
    headers = ["plan", "cp", "T", "S MB", "iters", "legacy rt ms", "padded local ms", "padded coll. ms",
               "padded rt ms", "in-place rt ms", "paired ratio", "in-place ratio", "A/A ratio", "A/A ceiling",
               "padded busbw GB/s", "verdict"]
    rows = []
    for e in entries:
        imps = e.get("impls", {})
        leg, pad, zc = imps.get("legacy"), imps.get("padded"), imps.get("padded_zero_copy")
        rows.append([plan_label(e["plan"]), str(e["plan"]["cp"]), str(e["plan"]["tokens"]),
                     f"{e['plan']['bytes'] / 1e6:.1f}", f"{e['warmup']}+{e['iters']}",
                     ms(_stat(leg, "roundtrip")), ms(_stat(pad, "local")), ms(_stat(pad, "collective")),
                     ms(_stat(pad, "roundtrip")), ms(_stat(zc, "roundtrip")), _with_interval(e),
                     num(e.get("ratio_in_place")), num(e.get("aa_ratio")), num(e.get("aa_ceiling")),
                     num((pad or {}).get("busbw_GBps")), e.get("verdict", "")])
    return headers, rows, ["left"] + ["right"] * 14 + ["left"]


def uneven_table(entries: list[dict]) -> tuple[list[str], list[list[str]], list[str]]:
    headers = ["plan", "cp", "mode", "pad frac", "impl", "status", "local ms", "coll. ms", "rt ms", "rt p90 ms",
               "rt IQR ms", "rows moved", "MB moved", "algbw GB/s", "busbw GB/s", "busbw useful", "rt vs padded"]
    rows = []
    for e in entries:
        p = e["plan"]
        base = _stat(e["impls"].get("padded"), "roundtrip")
        for k, (name, r) in enumerate(e["impls"].items()):
            rt = _stat(r, "roundtrip")
            status = r["status"] + (f" ({r['failed_check']})" if r.get("failed_check") else "")
            rows.append([plan_label(p) if k == 0 else "", str(p["cp"]) if k == 0 else "",
                         e["mode"] if k == 0 else "", f"{p['padding_frac']:.3f}" if k == 0 else "", name, status,
                         ms(_stat(r, "local")), ms(_stat(r, "collective")), ms(rt), ms(_stat(r, "roundtrip", "p90")),
                         ms(_stat(r, "roundtrip", "iqr")), "" if r.get("rows_moved") is None else str(r["rows_moved"]),
                         "" if r.get("bytes_moved") is None else f"{r['bytes_moved'] / 1e6:.1f}",
                         num(r.get("algbw_GBps")), num(r.get("busbw_GBps")), num(r.get("busbw_useful_GBps")),
                         f"{rt / base:.2f}x" if rt and base and e["mode"] == "FULL" else ""])
    return headers, rows, ["left", "right", "left", "right", "left", "left"] + ["right"] * 11


def local_table(entries: list[dict]) -> tuple[list[str], list[list[str]], list[str]]:
    headers = ["plan", "cp", "backend", "T", "buffer", "iters", "impl", "local ms", "gather ms", "scatter ms",
               "rt ms", "rt IQR ms", "local share", "busbw GB/s"]
    rows = []
    for e in entries:
        p = e["plan"]
        for k, (name, r) in enumerate(e["impls"].items()):
            first = k == 0
            share = e.get("local_share") if name == "padded" else (0.0 if r.get("stats") else None)
            rows.append([plan_label(p) if first else "", str(p["cp"]) if first else "",
                         f"{e['backend']}/{e['device']}" if first else "", str(p["tokens"]) if first else "",
                         f"{p['padded_total']} rows, {p['bytes'] / 1e6:.1f} MB" if first else "",
                         f"{e['warmup']}+{e['iters']}" if first else "",
                         name if r["status"] == "ok" else f"{name}: {r['status']}",
                         ms(_stat(r, "local")), ms(_stat(r, "gather")), ms(_stat(r, "scatter")),
                         ms(_stat(r, "roundtrip")), ms(_stat(r, "roundtrip", "iqr")), pct(share),
                         num(r.get("busbw_GBps"))])
    return headers, rows, ["left", "right", "left", "right", "right", "right", "left"] + ["right"] * 7


def alone_markdown(entries: list[dict]) -> str:
    """The padded path's staging on one rank alone on the device, per plan that stages: each
    column says whether it was measured here or is a model (with its inputs)."""
    headers = ["plan", "cp", "rank", "rows staged", "MB staged", "stage us (measured, one rank alone)",
               "copy GB/s (measured, plain copy)", "stage us at copy GB/s (derived)",
               "collectives us (model)", "local share (model)"]
    rows = []
    for e in entries:
        a, m = e.get("alone"), e.get("model")
        if not a:
            continue
        p = e["plan"]
        rows.append([plan_label(p), str(p["cp"]), str(a["rank"]), str(a["rows"]), f"{a['bytes'] / 1e6:.1f}",
                     f"{a['stage_us']:.1f}", f"{a['copy_GBps']:.0f}", f"{a['predicted_us']:.1f}",
                     f"{m['collectives_us']:.0f}" if m else "", pct(m["local_share"]) if m else ""])
    if not rows:
        return ""
    out = markdown(headers, rows, ["left", "right", "right"] + ["right"] * 7)
    model = next((e["model"] for e in entries if e.get("model")), None)
    if model:
        out += (f"\n\nModel: the gather and the reduce-scatter of one layer on an NVLink node, each "
                f"`bytes x (cp-1)/cp / {model['busbw_GBps']:.0f} GB/s + {model['latency_us']:.0f} us` (a published "
                "8-GPU NVLink 4 ring's busbw and fixed cost), beside the stage measured on one rank alone: "
                "not a measurement of a multi-GPU node.")
    return out


TABLES = {"even": even_table, "single": even_table, "uneven": uneven_table, "local": local_table}


def section_markdown(name: str, entries: list[dict]) -> str:
    headers, rows, align = TABLES[name](entries)
    return markdown(headers, rows, align)


# ---------------------------------------------------------------------------
# PERF.md
# ---------------------------------------------------------------------------

INTRO = """\
# Performance of the padded CP round trip

<!-- Generated by benchmarks/perf_md.py from benchmarks/data/perf_*.json. Do not edit:
rerun the benchmark (or change the script) and regenerate; tests/project/test_bench.py checks
that this file is what the JSON gives. -->

Figures from `benchmarks/bench_comm.py` (`nox -s bench`), on real ranks (one process per
rank: gloo on CPU; on CUDA, NCCL where every rank has its own GPU, else gloo with CUDA
tensors). The benchmark checks correctness before it times anything and exits 1 on a
wrong result, like nccl-tests' `#wrong` column; its even-plan ratio target also sets the
exit code (the gate below). Every table below is rendered from a committed JSON file
and names the machine, versions, date, load average and exact command it came from."""

SEMANTICS = """\
## What the columns mean

Defined once here, and in the code in `nsa_cp_comm.harness.timing` (the one timed loop that the
matrix and the benchmark share) and `nsa_cp_comm.harness.steps` (what each implementation runs per
iteration).

- **Production buffers.** The gather buffer (`[m*cp, H]` for the padded path, `[T, H]` for
  legacy) and the reduce-scatter's input are allocated once per point and reused, as the
  serving code reuses its buffer: no timed phase pays the allocator or first-touch page
  faults. The alternatives (`sumlen_allreduce`, `allgatherv`) are timed as their calls,
  allocation included; `a2a` (the DeepEP stand-in) as its dispatch and combine.
- **Phases.** Each iteration times each phase on its own, after a device sync and a
  barrier: `local` is the padded path's local work (copy the shard into its slot of the
  buffer, zero its padding rows), `gather` the all-gather, `scatter` the reduce-scatter.
  `coll.` = gather + scatter; `rt` (round trip) = local + gather + scatter. Legacy has no
  local phase: it gathers straight from the shard. The slice of the scatter's output is a
  view and costs nothing.
- **Time.** A phase's time in an iteration is the *slowest rank's* (a collective ends for
  the job when its last rank leaves it); the tables show the median (p50) over the timed
  iterations after warm-up, `p90`, and `IQR` = p75 - p25 (the spread). nccl-tests' `time`
  is instead the mean of back-to-back launches averaged over ranks (`-a 1`, its default;
  `-a 3` takes the max): without per-iteration barriers and with the rank skew averaged
  away, it reads lower than our figure for the same collective. Device time from CUDA
  events on the rank's own device on GPU; `perf_counter` on CPU, where gloo collectives
  are synchronous. `iters` = warm-up + timed iterations.
- **Bandwidth**, as nccl-tests defines it: `S` = bytes of the gathered buffer (rows x H x
  element size), `algbw = S / t` and `busbw = algbw * (cp - 1) / cp` for an all-gather and
  for a reduce-scatter alike. A round trip is two collectives over `S`, so its
  `algbw = 2 S / t_coll`, over the collectives' time only: the local work moves nothing
  between ranks. `busbw useful` counts only the `T` real rows (what the padding costs);
  for `a2a`, `S` = bytes per rank (nccl-tests' alltoall). 1 MB = 1e6 B, GB/s = 1e9 B/s.
- **In-place and out-of-place.** nccl-tests prints every collective twice: out-of-place
  (send and receive buffers apart) and in-place (the send buffer is this rank's slice of
  the receive buffer). Here `legacy` gathers out-of-place; `padded` stages the shard into
  its slot (the `local` phase) and then gathers in place; `padded_zero_copy` is the
  in-place column: the producer has written its rows into the slot already (untimed, before
  each iteration), so it has no local phase. The reduce-scatter is in place in all three
  (the output is this rank's chunk of the input), as the serving code runs it.
- **Ratios.** `paired ratio` = median over iterations of padded rt / legacy rt, the two
  measured back to back in the same iteration (drift hits both alike); `in-place ratio`
  the same for `padded_zero_copy`. `A/A ratio` = the same median for legacy against a
  second copy of itself timed in the same loop (the control): identical paths, so its
  distribution is this machine's noise. `A/A ceiling` = max(p75, 1/p25) of the control's
  per-iteration ratios: the upper edge of the middle half of what noise alone produces.
- **Local share** = median over iterations of the padded path's local / rt."""

GPU_PENDING = """\
**Not run yet: the GPU run is still open.** No GPU was available to the sessions that
produced the tables above. `benchmarks/gpu_check.sh` is the prepared run (under 8 minutes
on one GPU, no hydra-core or nox needed); it writes `perf_gpu.json`, which goes to
`benchmarks/data/` and is rendered here by `python benchmarks/perf_md.py`. This section
will then hold, on CUDA with CUDA-event timing:

- **Local work at production shape**: H = 7168, bf16, cp 8, 8k and 16k tokens (the
  padded path's local share with the ranks sharing the GPU, and the staging timed on one
  rank alone beside the device's copy bandwidth; NVLink collectives only as a labelled model);
- **NCCL, cp 1**: the padded / legacy / in-place round trip on the GPU's own NCCL, the
  even-plan paired ratio gated at 1.03;
- **gloo on CUDA tensors, cp > 1**: the even-plan ratio and the uneven-plan table;
- the `requires_gpu` tests and a `run_point` smoke (its log, not a table).

NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so on one GPU every cp > 1
figure is host-staged gloo, not NVLink. Multi-GPU NCCL figures (cp 2 to 8 over NVLink,
`allgatherv` included) can only come from users' nodes:
`python benchmarks/bench_comm.py --device cuda --out perf_gpu.json` on a node with a GPU
per rank uses NCCL for every section."""


def _loads(env: dict) -> str:
    parts = [env.get("loadavg_start", ""), env.get("loadavg_end", "")]
    return f"{parts[0] or '?'} at start, {parts[1] or '?'} at end"


def provenance(data: dict, section: str | None = None) -> str:
    """One paragraph: the machine, versions, date, load and command of a run
    (and of the section's start, when the run recorded it)."""
    env = data["env"]
    gpu = f"; GPU {env['gpu']} x{env['gpu_count']}" if env.get("gpu") else "; no GPU"
    ram = f", {env['ram_gib']:.1f} GiB RAM" if env.get("ram_gib") else ""
    versions = f"Python {env['python']}, torch {env['torch']}"
    if env.get("cuda"):
        versions += f", CUDA {env['cuda']}"
    versions += f", NCCL {env['nccl']}" if env.get("nccl") else ", no NCCL"
    sec = (data.get("sections") or {}).get(section or "", {})
    when = env["date"]
    load = _loads(env)
    if sec:
        when = f"{sec.get('start', env['date'])} (this table; run started {env['date']})"
        load = f"{sec.get('loadavg', '?')} when this table started (run: {load})"
    return (f"*Machine*: {env['cpu_model']}, {env['nproc']} CPUs{ram}{gpu}; {env.get('os', '')}.  \n"
            f"*Versions*: {versions}.  \n"
            f"*Date (UTC)*: {when}; *load average* (1, 5, 15 min): {load}.  \n"
            f"*Command*: `{env['command']}`; wall {data.get('wall_s', float('nan')):.0f} s for the run"
            f"{'' if data.get('complete', True) else ' (INCOMPLETE: the run stopped early)'}.")


SECTION_TEXT = {
    "even": ("Even plans: padded / legacy round trip",
             "Padded, legacy, the in-place form and the A/A control take turns in every iteration "
             "(rotating which goes first). The target is a paired ratio at or below {target}; the "
             "verdict follows the gate rule above."),
    "single": ("One rank: padded / legacy round trip on the device's own backend",
               "cp 1 at production shape: the collectives of one rank are local copies, so this isolates "
               "the device-side cost of each form (on CUDA, through NCCL). {single_gate}"),
    "uneven": ("Uneven plans: padded vs the alternatives",
               "The matrix's own point (`nsa_cp_comm.harness.measure.point_on_rank`: every check, then the timed "
               "loop). `legacy` refuses an uneven plan on every rank before any collective (`refused`); "
               "`allgatherv` needs NCCL (gloo refuses uneven list all-gathers) and is `skipped` on gloo; in "
               "SCATTERED mode the communicator moves nothing (`passthrough`) and `a2a` is the DeepEP "
               "stand-in's dispatch and combine. `rt vs padded` < 1 is faster than padded."),
    "local": ("The padded path's local work at production shape",
              "H = {hidden}, {dtype}. Checks here are the byte-exact ones (rows at their offsets, zero padding, "
              "the scatter's chunk); the reference-MoE check runs in the sections above. `local share` is "
              "the padded path's; the in-place form has no local work by construction."),
}


def _gloo_note(data: dict) -> str:
    """What the uneven table's ordering means on gloo, from the run's own figures."""
    faster = []
    for e in [e for e in data.get("uneven", []) if e["backend"] == "gloo"]:
        base = _stat(e["impls"].get("padded"), "roundtrip")
        alt = _stat(e["impls"].get("sumlen_allreduce"), "roundtrip")
        if base and alt:
            faster.append(alt / base)
    if not faster:
        return ""
    return (f"\n\nOn gloo, `sumlen_allreduce` took {min(faster):.2f}x to {max(faster):.2f}x the padded round "
            "trip here. gloo's reduce-scatter is an all-reduce followed by a slice, so the padded scatter "
            "already pays an all-reduce on gloo; on NCCL a ring all-reduce moves twice the bytes of a "
            "reduce-scatter, so the ordering there needs the GPU run (see below).")


def _even_note(entries: list[dict]) -> str:
    """What share of the padded round trip its staging copy took, per plan."""
    parts = []
    for e in entries:
        pad = e.get("impls", {}).get("padded")
        local, rt = _stat(pad, "local"), _stat(pad, "roundtrip")
        if local is not None and rt:
            parts.append(f"{100 * local / rt:.2f} % for {plan_label(e['plan'])} cp {e['plan']['cp']}")
    if not parts:
        return ""
    # an even plan stages nothing since the padded gather issues legacy's call there: local work on
    # one is a run from before that
    return ("\n\nThe padded path's local work (p50) was " + ", ".join(parts) + " of its round trip (p50): this "
            "run predates the padded gather's even-plan form, which copied every shard into the padded buffer "
            "first; on an even plan it now issues legacy's call from the shard, nothing staged, and a new run "
            "shows that cost. The rest of any difference from legacy lies in the collectives (in-place vs "
            "out-of-place gather) or in the noise the A/A columns show.")


def _local_note(data: dict) -> str:
    entries = data.get("local_work", [])
    shares = [(e["plan"]["tokens"], e["plan"]["cp"], e.get("local_share")) for e in entries
              if e.get("local_share") is not None]
    if not shares:
        return ""
    listed = ", ".join(f"{pct(s)} at {t} tokens" for t, _, s in shares)
    cp = max(c for _, c, _ in shares)
    text = (f"\n\nOn this machine the padded path's local work was this share of its round trip: {listed}, "
            f"measured with the point's {cp} ranks sharing this machine's "
            + ("one GPU (contended) and its collectives host-staged gloo: " if data["env"].get("device") == "cuda"
               else "CPUs: ") + "neither is a figure of a node with a device per rank.")
    if not any(e.get("alone") for e in entries):
        text += (" No multi-GPU estimate is made from this run: its local work was timed with ranks sharing the "
                 "device, and no one-rank staging was timed (the benchmark now times it; a new run shows it "
                 "below this table).")
    return text


def run_markdown(title: str, data: dict) -> str:
    kind = "" if data["params"]["mode"] == "full" else f"; {data['params']['mode']} run"
    worlds = sorted({f"{e['backend']}/{e['device']}" for key in ("even", "single", "uneven", "local_work")
                     for e in data.get(key) or []})
    out = [f"## {title} figures ({', '.join(worlds) or data['env']['device']}{kind})"]
    gate = data.get("gate", {})
    if data.get("failures"):
        out.append("**Correctness failures in this run:** " + "; ".join(data["failures"]))
    out.append(f"Exit code {data.get('exit_code', '?')}; gate {'on' if gate.get('on') else 'off'}; "
               f"verdicts: {data.get('summary', '')}.")
    loads = [data["env"].get("loadavg_start", ""), data["env"].get("loadavg_end", "")]
    loads += [sec.get("loadavg", "") for sec in (data.get("sections") or {}).values()]
    peak = max((float(x.split()[0]) for x in loads if x), default=0.0)
    ranks = max((e["plan"]["cp"] for key in ("even", "single", "uneven", "local_work")
                 for e in data.get(key) or []), default=1)
    if peak > max(ranks, data["env"]["nproc"]):
        out.append(f"**A shared machine:** the 1-minute load average reached {peak:.1f} on "
                   f"{data['env']['nproc']} CPUs during this run, more than the benchmark's own {ranks} ranks "
                   "account for. Read differences between rows against the `A/A` and `IQR` columns, which show "
                   "that noise.")
    n = 0
    for key, section in (("even", "even"), ("single", "single"), ("uneven", "uneven"), ("local_work", "local")):
        entries = data.get(key) or []
        if not entries:
            continue
        n += 1
        head, text = SECTION_TEXT[section]
        single_gate = (f"On a GPU its paired ratio is gated at {gate['single_target']} (the rule above)."
                       if gate.get("single_target") and data["env"].get("device") == "cuda"
                       else "Reported, not gated" + ("." if gate.get("single_target")
                                                     else " (this run predates that gate)."))
        body = text.format(target=gate.get("target", ""), hidden=data["params"]["hidden_size"],
                           dtype=data["params"]["dtype"], single_gate=single_gate)
        if section == "uneven":
            body += _gloo_note(data)
        if section == "local":
            body += _local_note(data)
        if section in ("even", "single"):
            body += _even_note(entries)
        out += [f"### {title} {n}. {head}", provenance(data, key), body, section_markdown(section, entries)]
        if section == "local" and alone_markdown(entries):
            out += ["The staging on one rank alone on the device: the rank that stages the most rows copies "
                    "them into a reused send block, timed with nothing else on the device; beside it, what a "
                    "plain copy's bandwidth predicts for the same bytes.", alone_markdown(entries)]
    return "\n\n".join(out)


def render(runs: dict[str, dict]) -> str:
    """PERF.md's text for ``{file name: benchmark JSON}``."""
    parts = [INTRO, SEMANTICS]
    gate = next((d.get("gate") for d in runs.values() if d.get("gate")), None)
    if gate:
        parts.append(f"## The gate\n\n{gate['rule']}")
    parts.append(status_markdown(runs))
    parts.append(REPRODUCE)
    for fname, title in RUNS:
        if fname in runs:
            parts.append(run_markdown(title, runs[fname]))
        elif title == "GPU":
            parts.append(f"## GPU\n\n{GPU_PENDING}")
    return "\n\n".join(parts) + "\n"


def status_markdown(runs: dict[str, dict]) -> str:
    rows = []
    cpu, gpu = runs.get("perf_cpu.json"), runs.get("perf_gpu.json")
    rows.append(["CPU, gloo ranks", f"ran {cpu['env']['date'][:10]}" if cpu else "not run",
                 "even, uneven, production-shape local work"])
    rows.append(["one GPU: NCCL cp 1, gloo on CUDA tensors cp > 1",
                 f"ran {gpu['env']['date'][:10]}" if gpu else "**open**: not run yet (gpu_check.sh)",
                 "the same sections on CUDA, plus NCCL cp 1"])
    rows.append(["several GPUs: NCCL cp 2-8", "not run here: needs a GPU per rank",
                 "users' nodes (`bench_comm.py --device cuda`)"])
    return "## What has run where\n\n" + markdown(["run", "status", "tables"], rows, ["left", "left", "left"])


REPRODUCE = """\
## Reproduce

```sh
python benchmarks/bench_comm.py --out benchmarks/data/perf_cpu.json   # CPU, gloo ranks (minutes)
python benchmarks/bench_comm.py --quick                               # tiny shapes, a smoke
OUT=/tmp/gpu_check bash benchmarks/gpu_check.sh                       # the GPU run (< 8 min)
cp /tmp/gpu_check/perf_gpu.json benchmarks/data/                      # then commit it
python benchmarks/perf_md.py                                          # regenerate this file
```

Options: `--sections even,uneven,local[,single]`, `--prod-tokens 8000,16000`, `--prod-cp 8`,
`--prod-iters N`, `--flush-l2`, `--timeout S`, `--no-gate` (exploratory runs: the ratio
target does not set the exit code; correctness still does), `--gate` (gate a `--quick`
run too). Without a virtual environment that installs the project, prefix
`PYTHONPATH=src`."""


def load(data_dir: Path = DATA_DIR) -> dict[str, dict]:
    return {f: json.loads((data_dir / f).read_text()) for f, _ in RUNS if (data_dir / f).exists()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when PERF.md differs from the JSON's rendering")
    ap.add_argument("--data", type=Path, default=DATA_DIR)
    ap.add_argument("--out", type=Path, default=PERF_MD)
    args = ap.parse_args(argv)
    text = render(load(args.data))
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'differs from the JSON: run python benchmarks/perf_md.py'}")
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
