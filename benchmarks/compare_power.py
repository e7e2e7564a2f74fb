"""How often compare's gate cries wolf, and how often it catches a 1.3x slowdown.

On this machine, at compare's documented defaults (its default metric and
threshold), on the README's review flow (its sweep, ``iters=auto``):

* false alarms: ``--pairs`` pairs of runs of identical code, each pair
  compared; any exit other than 0 is a false alarm;
* detection: for each pair, a third run with the padded path about 1.3x
  slower at every point in the paired metric (a test-only sleep on every
  rank before each padded reduce-scatter of FAULT_FRACTION times what that
  rank's round trip took, benchmarks/slow_padded/), compared against the pair's base;
  detected when compare exits 1 with **every** padded point regressed. Each
  trial records the slowdown the gate saw at each padded point (the paired
  metric's median, NEW over BASE) and their median.

Runs of a trial are interleaved (base, A/A, slowed) so the machine's drift
hits all three alike; each trial records the 1-minute load average, the
iterations ``iters=auto`` ran and, for every compare that failed, the rows
and reasons it failed on (a false alarm explained). ``--load L`` holds the
machine's 1-minute load average at L during the trials (busy-loop processes
that make up what the machine's own work does not, as
benchmarks/steady_main_job.py holds it). The JSON is written after every
trial (a cut run keeps what it measured). ``--default-pair`` also runs the
default preset twice and compares them. The figures go to
benchmarks/data/compare_power.json (with ``--load L``,
compare_power_loadL.json) and the block of docs/review.md between
``<!-- compare_power -->`` and ``<!-- /compare_power -->`` (with a load,
``<!-- compare_power:loadL -->``); tests/project/test_setup.py checks they agree.

    python benchmarks/compare_power.py                   # 10 pairs (about 1 h on 2 loaded cores)
    python benchmarks/compare_power.py --load 20         # the same with the load held at 20
    python benchmarks/compare_power.py --pairs 2 --json /tmp/p.json --no-doc   # a trial
    python benchmarks/compare_power.py --render          # every doc block from the committed JSONs
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
JSON_PATH = REPO / "benchmarks" / "data" / "compare_power.json"
DOC = REPO / "docs" / "review.md"
BLOCK = re.compile(r"(<!-- compare_power -->\n)(.*?)(\n<!-- /compare_power -->)", re.S)


def json_path(load: float | None) -> Path:
    """The measurement's file: the machine as it is, or with the load held at ``load``."""
    return JSON_PATH if load is None else JSON_PATH.with_name(f"compare_power_load{load:g}.json")


def block(load: float | None) -> re.Pattern[str]:
    """The doc block quoting :func:`json_path`'s figures."""
    if load is None:
        return BLOCK
    tag = f"compare_power:load{load:g}"
    return re.compile(rf"(<!-- {tag} -->\n)(.*?)(\n<!-- /{tag} -->)", re.S)


def measured_loads() -> list[float | None]:
    """The loads with a committed measurement: None (as the machine is) first."""
    held = sorted(float(p.stem.removeprefix("compare_power_load"))
                  for p in JSON_PATH.parent.glob("compare_power_load*.json"))
    return [None, *held]
SLOW_DIR = REPO / "benchmarks" / "slow_padded"
# The README's review flow (tests/project/test_setup.py checks it is the README's).
SWEEP = ("-m", "cp_size=2,4", "seq_lens=[1000],[1001,300]", "hidden_size=256", "iters=auto")
# The slowdown asked for, in the gate's own (paired) metric, and the fault
# that gives it: every rank sleeps this fraction of its own padded phase
# times before the reduce-scatter, which starts when the last one is back
# (benchmarks/slow_padded/). 0.3 read 1.26x-1.38x at the four points of one
# trial under load 4; rank 0 alone waiting read 1.12x-1.2x at cp 4 for 0.4
# (the other ranks' phases ran above its own); 0.35 keeps the point that
# reads least above compare's 15%. Each trial records what the gate saw at
# each point.
SLOWDOWN = 1.3
FAULT_FRACTION = 0.35
FAULT = "a test-only sleep on every rank, before its reduce-scatter, of {:.0%} of its own time in each round trip"


def _env(slow: float | None = None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO / "src"), str(REPO)]
    if slow is not None:
        paths.insert(0, str(SLOW_DIR))
        env["NSA_SLOW_PADDED"] = str(slow)
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    return env


def sweep(results: Path, argv: tuple[str, ...] = SWEEP, slow: float | None = None) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "matrix", *argv, f"results_dir={results}"], cwd=REPO,
                          env=_env(slow), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"sweep into {results} failed (exit {proc.returncode}):\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    return time.perf_counter() - t0


def compare(base: Path, new: Path) -> dict[str, Any]:
    """compare at its defaults: exit code, its summary counts, the rows it
    flagged (each once) and its noise line."""
    proc = subprocess.run([sys.executable, "-m", "matrix.compare", str(base), str(new), "--all"], cwd=REPO,
                          env=_env(), capture_output=True, text=True, check=False)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    counts = dict(w.split("=", 1) for w in last.removeprefix("summary: ").split(" -> ")[0].split() if "=" in w)
    # the table lists every row, the FAIL listing the failing ones again
    flagged = list(dict.fromkeys(" ".join(ln.split()) for ln in proc.stdout.splitlines() if "REGRESSED" in ln))
    noise = next((ln for ln in proc.stdout.splitlines() if ln.startswith("noise measured:")), "")
    # why it failed, in compare's own words: its FAIL lines and every row it marks in capitals
    failing = [" ".join(ln.split()) for ln in proc.stdout.splitlines()
               if ln.startswith("FAIL") or (ln.startswith("|") and FAILING_MARK.search(ln))]
    return {"exit": proc.returncode, "regressed": int(counts.get("regressed", 0) or 0),
            "unverified": int(counts.get("unverified", 0) or 0),
            "padded_flagged": sum("| padded |" in ln for ln in flagged),
            "regressed_lines": flagged[:20], "noise": noise,
            "reasons": list(dict.fromkeys(failing))[:20] if proc.returncode else [],
            "stderr": proc.stderr.strip()[-500:]}


# The marks of compare's rows that fail the gate.
FAILING_MARK = re.compile(r"REGRESSED|UNVERIFIED|MISSING in NEW|STATUS WORSE|FAILING in NEW|CORRECTNESS LOST")


def _rows(results: Path) -> list[dict[str, str]]:
    import csv

    with (results / "results.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def padded_points(results: Path) -> int:
    """Points where the padded path was timed (ok)."""
    return len({r["point_id"] for r in _rows(results) if r["impl"] == "padded" and r["status"] == "ok"})


def iterations(results: Path) -> dict[str, Any]:
    """What iters=auto ran: iterations per timed row (min, median, max), the
    rows whose target width was reached, and those whose loop went past its
    soft cap for the gate's power (``extended``)."""
    import statistics

    lines = [json.loads(ln) for ln in (results / "samples.jsonl").read_text().splitlines() if ln.strip()]
    cal = [ln.get("calibration") or {} for ln in lines]
    iters = sorted(len(ln["roundtrip_us"]) for ln in lines)
    return {"rows": len(lines), "min": iters[0] if iters else 0, "median": statistics.median(iters) if iters else 0,
            "max": iters[-1] if iters else 0, "reached": sum(bool(c.get("reached")) for c in cal),
            "extended": sum("gate_power" in c for c in cal)}


def paired_medians(results: Path) -> dict[str, float]:
    """Per padded point, its median round trip over the control's in the same iteration (what the gate reads)."""
    import statistics

    out = {}
    for ln in (results / "samples.jsonl").read_text().splitlines():
        line = json.loads(ln) if ln.strip() else {}
        if line.get("impl") == "padded" and line.get("control_us"):
            out[line["point_id"]] = statistics.median(r / c for r, c in zip(line["roundtrip_us"], line["control_us"]))
    return out


def per_point(base: Path, new: Path) -> dict[str, float]:
    """Per padded point (``cp=2 [1000]``), NEW's median paired ratio over BASE's: the slowdown the gate sees there."""
    names = {r["point_id"]: f"cp={r['cp_size']} {r['seq_lens']}" for r in _rows(base)}
    b, n = paired_medians(base), paired_medians(new)
    return {names.get(k, k): round(n[k] / b[k], 3) for k in sorted(b, key=lambda k: names.get(k, k)) if k in n}


def paired_ratio(base: Path, new: Path) -> float:
    """Median over padded points of NEW's median paired ratio over BASE's."""
    import statistics

    return round(statistics.median(per_point(base, new).values()), 3)


def padded_ratio(base: Path, new: Path) -> float:
    """Median over points of NEW's padded round trip over BASE's: the slowdown achieved."""
    import statistics

    def p50(path: Path) -> dict[str, float]:
        return {r["point_id"]: float(r["roundtrip_p50_us"]) for r in _rows(path)
                if r["impl"] == "padded" and r["status"] == "ok" and r["roundtrip_p50_us"]}

    b, n = p50(base), p50(new)
    return round(statistics.median(n[k] / b[k] for k in b if k in n), 3)


def machine() -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "src"))
    import platform

    import torch

    from nsa_cp_comm.harness.machine import cpu_model

    return {"nproc": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version(),
            "torch": torch.__version__}


def defaults() -> dict[str, str]:
    sys.path.insert(0, str(REPO))
    from matrix.review import compare as cmp

    return {"metric": cmp.DEFAULT_METRIC, "threshold": cmp.DEFAULT_THRESHOLD}


def measure(pairs: int, default_pair: bool, out: Path, held: float | None = None,
            fraction: float = FAULT_FRACTION, earlier: dict[str, Any] | None = None) -> dict[str, Any]:
    """``pairs`` trials into ``out``; with ``earlier`` (a measurement of the
    same sweep, fault and load), its trials are kept and the new ones follow
    them, each trial naming the commit it ran."""
    from steady_main_job import LoadHolder, _commit

    data: dict[str, Any] = {"date": dt.date.today().isoformat(), "machine": machine(), "defaults": defaults(),
                            "sweep": "python -m matrix " + " ".join(SWEEP), "slowdown": SLOWDOWN, "fault_fraction": fraction,
                            "fault": FAULT.format(fraction), "load_target": held, "commit": _commit(),
                            "pairs_asked": pairs, "load_before": round(os.getloadavg()[0], 2), "trials": []}
    if earlier is not None:
        for t in earlier["trials"]:
            t.setdefault("commit", earlier.get("commit"))
        data["trials"] = list(earlier["trials"])
        data["pairs_asked"] = len(data["trials"]) + pairs
        data["dates"] = sorted({*earlier.get("dates", [earlier["date"]]), data["date"]})
    holder = LoadHolder(held, 0)
    if held is not None:
        holder.start()
        time.sleep(60)  # let the 1-minute load average reach the target
    try:
        _trials(data, pairs, default_pair, out, holder, fraction)
    finally:
        holder.close()
    write(data, out)
    return data


def _trials(data: dict[str, Any], pairs: int, default_pair: bool, out: Path, holder: Any, fraction: float) -> None:
    with tempfile.TemporaryDirectory(prefix="compare-power-") as tmp:
        for i in range(len(data["trials"]), len(data["trials"]) + pairs):
            base, aa, slow = Path(tmp, f"base{i}"), Path(tmp, f"aa{i}"), Path(tmp, f"slow{i}")
            holder.take_samples()
            load = [os.getloadavg()[0]]
            t_base = sweep(base)
            load.append(os.getloadavg()[0])
            sweep(aa)
            load.append(os.getloadavg()[0])
            sweep(slow, slow=fraction)
            load.append(os.getloadavg()[0])
            load += holder.take_samples()  # every 5 s while the load is held
            data["points"] = len({r["point_id"] for r in _rows(base)})
            trial = {"sweep_s": round(t_base, 1), "load": round(max(load), 2), "load_min": round(min(load), 2),
                     "load_median": round(statistics.median(load), 2),
                     "padded_points": padded_points(base), "iterations": iterations(base),
                     "aa": compare(base, aa), "slowed": compare(base, slow),
                     "achieved_slowdown": padded_ratio(base, slow), "paired_slowdown": paired_ratio(base, slow),
                     "paired_aa": paired_ratio(base, aa), "slowdown_per_point": per_point(base, slow),
                     "aa_per_point": per_point(base, aa), "commit": data["commit"]}
            data["trials"].append(trial)
            print(f"trial {i}: A/A exit {trial['aa']['exit']} ({trial['aa']['regressed']} regressed); "
                  f"slowed x{trial['achieved_slowdown']} (paired x{trial['paired_slowdown']}, "
                  f"per point {trial['slowdown_per_point']}): "
                  f"exit {trial['slowed']['exit']} "
                  f"({trial['slowed']['padded_flagged']} of {trial['padded_points']} padded points flagged); "
                  f"iters {trial['iterations']}; load {trial['load_min']}-{trial['load']}", flush=True)
            write(data, out)
        if default_pair:
            a, b = Path(tmp, "default_a"), Path(tmp, "default_b")
            sweep(a, ("+matrix=default",))
            sweep(b, ("+matrix=default",))
            data["default_pair"] = compare(a, b)
            print(f"default preset A/A: exit {data['default_pair']['exit']}", flush=True)


def write(data: dict[str, Any], out: Path) -> None:
    """The figures so far, totals counted from the trials."""
    data["load_after"] = round(os.getloadavg()[0], 2)
    data["false_alarms"], data["detected"] = verdicts(data["trials"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")


def detected(trial: dict[str, Any]) -> bool:
    """The slowed run failed the gate with every padded point regressed."""
    slowed = trial["slowed"]
    return slowed["exit"] == 1 and slowed["padded_flagged"] >= trial["padded_points"] > 0


def verdicts(trials: list[dict[str, Any]]) -> tuple[int, int]:
    """(false alarms, slowdowns detected on every padded point) over the
    trials: what the text says is counted from the trials themselves, never
    copied from a stored total."""
    return sum(t["aa"]["exit"] != 0 for t in trials), sum(detected(t) for t in trials)


# What the JSON files written before the fault was recorded in them ran.
OLD_FAULT = "a test-only busy wait on one rank of {:.0%} of its own time in each round trip"


def render(data: dict[str, Any]) -> str:
    trials = data["trials"]
    n = len(trials)
    m = data["machine"]
    d = data["defaults"]
    slow = sorted(t["paired_slowdown"] for t in trials)
    # each padded point's own slowdown where the trials recorded it, else the median over a trial's points
    points_seen = sorted(v for t in trials for v in t.get("slowdown_per_point", {}).values())
    aa_seen = sorted(v for t in trials for v in t.get("aa_per_point", {}).values())
    false_alarms, found = verdicts(trials)
    padded = sum(t["padded_points"] for t in trials)
    flagged = sum(min(t["slowed"]["padded_flagged"], t["padded_points"]) for t in trials)
    its = [t["iterations"] for t in trials]
    loads = sorted(x for t in trials for x in (t["load_min"], t["load"]))
    held = data.get("load_target")
    command = ("python benchmarks/compare_power.py" + (f" --load {held:g}" if held is not None else "")
               + (f" --fault-fraction {data['fault_fraction']:g}" if data["fault_fraction"] != FAULT_FRACTION else ""))
    load_text = (f"1-minute load average held at {held:g}: {loads[0]:.1f}-{loads[-1]:.1f} during the trials, "
                 f"median {statistics.median(t.get('load_median', t['load']) for t in trials):.1f}"
                 if held is not None else f"1-minute load average {loads[0]:.1f}-{loads[-1]:.1f} during the trials")
    text = (
        f"Measured with `{command}` on a {m['nproc']}-core {m['cpu']} machine "
        f"(torch {m['torch']}, {data['date']}; {load_text}), at the defaults (`--metric {d['metric']}`, `--fail-above {d['threshold']}`) on the "
        f"README's review flow (`{data['sweep']}`, {data['points']} points): **{false_alarms} false alarms "
        f"in {n} pairs** of runs of identical code, and the padded path slowed "
        + (f"about {data['slowdown']:g}x " if data.get("load_target") is None else "")
        + (f"({data.get('fault') or OLD_FAULT.format(data['fault_fraction'])}, "
           f"which the paired metric saw as {points_seen[0]:.2f}x-{points_seen[-1]:.2f}x at each point, median "
           f"{statistics.median(points_seen):.2f}x; between identical runs a point moved "
           f"{aa_seen[0]:.2f}x-{aa_seen[-1]:.2f}x) " if points_seen and aa_seen else
           f"(a test-only busy wait of {data['fault_fraction']:.0%} of each of its round trips, which the paired "
           f"metric saw as {slow[0]:.2f}x-{slow[-1]:.2f}x, median over the padded points) ")
        + f"**flagged on every padded point "
        f"in {found} of {n} runs** ({flagged} of {padded} padded points). `iters=auto` ran "
        f"{min(i['min'] for i in its)}-{max(i['max'] for i in its)} iterations a point and reached its target "
        f"width on {sum(i['reached'] for i in its)} of {sum(i['rows'] for i in its)} rows"
        + (" (the rest stopped at a cap)" if sum(i["reached"] for i in its) < sum(i["rows"] for i in its) else "")
        + (f"; {sum(i['extended'] for i in its)} rows met the 30 s cap short of it and went on while compare's "
           "test lacked 0.9 power to flag 1.3x (to 60 s at most)"
           if any("extended" in i for i in its) else "")
        + f"; one sweep of the review flow took {min(t['sweep_s'] for t in trials):.0f}-"
        f"{max(t['sweep_s'] for t in trials):.0f} s."
    )
    alarms = [(i, t) for i, t in enumerate(trials) if t["aa"]["exit"] != 0]
    if alarms:
        text += " Why each A/A pair failed, in compare's words: " + "; ".join(
            f"pair {i + 1}: " + (" / ".join(t["aa"].get("reasons", [])[:3]) or "(not recorded)") for i, t in alarms) + "."
    rerun = sum("aa_note" in t for t in trials)
    if rerun:
        text += (f" In {rerun} pair(s) compare itself raised (an overflow since fixed) and was run again on the "
                 "same two runs (`aa_note` in the JSON).")
    if n < data.get("pairs_asked", n):
        text += f" ({data['pairs_asked']} pairs were asked; the run was cut after {n}.)"
    if "default_pair" in data:
        dp = data["default_pair"]
        text += (f" The default preset run twice: compare exit {dp['exit']} "
                 f"({dp['regressed']} regressed).")
    return text


def rendered_doc(doc: str, data: dict[str, Any]) -> str:
    pattern = block(data.get("load_target"))
    if not pattern.search(doc):
        raise SystemExit(f"{DOC.name} has no block for {json_path(data.get('load_target')).name}: "
                         f"{pattern.pattern.split(chr(92))[0]}")
    return pattern.sub(lambda mt: mt.group(1) + render(data) + mt.group(3), doc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--load", type=float, default=None,
                    help="hold the 1-minute load average at this value during the trials (the machine's work counted)")
    ap.add_argument("--fault-fraction", type=float, default=FAULT_FRACTION,
                    help="the sleep, as a fraction of each rank's own round trip (default %(default)s); under a held "
                    "load the same fraction slows the paired metric less: at load 20 with bound ranks 0.35 read "
                    "1.07x-1.24x")
    ap.add_argument("--default-pair", action="store_true", help="also compare two runs of the default preset")
    ap.add_argument("--json", type=Path, default=None, help="default: benchmarks/data/compare_power[_loadL].json")
    ap.add_argument("--doc", type=Path, default=DOC, help="the markdown file holding the block")
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--append", action="store_true",
                    help="keep the trials already in the JSON and add --pairs more (same sweep, fault and load)")
    ap.add_argument("--render", action="store_true",
                    help="the doc's blocks from the committed JSONs (or --json's), without measuring")
    args = ap.parse_args(argv)
    if args.render:
        paths = [args.json] if args.json else [json_path(load) for load in measured_loads()]
        measured = [json.loads(p.read_text()) for p in paths]
    else:
        if not 1 <= args.pairs <= 100:
            print(f"error: --pairs={args.pairs}: must be in [1, 100]", file=sys.stderr)
            return 2
        if args.load is not None and not 0 < args.load <= 64:
            print(f"error: --load={args.load:g}: must be in (0, 64]", file=sys.stderr)
            return 2
        out = args.json or json_path(args.load)
        if not args.no_doc and not block(args.load).search(args.doc.read_text()):
            print(f"error: {args.doc} has no block for {out.name} to quote it in", file=sys.stderr)
            return 2
        if not 0 < args.fault_fraction <= 5:
            print(f"error: --fault-fraction={args.fault_fraction:g}: must be in (0, 5]", file=sys.stderr)
            return 2
        earlier = None
        if args.append:
            earlier = json.loads(out.read_text()) if out.is_file() else None
            if earlier is None:
                print(f"error: --append: {out} does not exist", file=sys.stderr)
                return 2
            same = {"sweep": "python -m matrix " + " ".join(SWEEP), "fault_fraction": args.fault_fraction,
                    "load_target": args.load}
            differ = [f"{k} {earlier.get(k)!r} (now {v!r})" for k, v in same.items() if earlier.get(k) != v]
            if differ:
                print(f"error: --append: {out} measured another setting: {', '.join(differ)}", file=sys.stderr)
                return 2
        measured = [measure(args.pairs, args.default_pair, out, args.load, args.fault_fraction, earlier)]
        print(f"wrote {out}: {measured[0]['false_alarms']} false alarms, {measured[0]['detected']} of "
              f"{len(measured[0]['trials'])} detected")
    if not args.no_doc:
        doc = args.doc.read_text()
        for data in measured:
            doc = rendered_doc(doc, data)
        args.doc.write_text(doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
