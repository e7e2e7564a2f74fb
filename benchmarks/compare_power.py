"""How often compare's gate cries wolf, and how often it catches a real slowdown.

On this machine, at compare's documented defaults (its default metric and
threshold), over a ~12-point sweep:

* false alarms: ``--pairs`` pairs of runs of identical code, each pair
  compared; any exit other than 0 is a false alarm;
* detection: for each pair, a third run with the padded path slowed about 2x
  (a test-only busy wait in its local stage, benchmarks/slow_padded/, sized
  from the base run's padded round trip at each point), compared against the
  pair's base; detected when compare exits 1 with padded points regressed.

Runs of a trial are interleaved (base, A/A, slowed) so the machine's drift
hits all three alike. ``--default-pair`` also runs the default preset twice
and compares them. The figures go to benchmarks/data/compare_power.json and
the block of docs/review.md between ``<!-- compare_power -->`` and
``<!-- /compare_power -->`` (tests/test_setup.py checks they agree).

    python benchmarks/compare_power.py                   # 10 pairs (about 20 min on 2 idle cores)
    python benchmarks/compare_power.py --pairs 2 --json /tmp/p.json --no-doc   # a trial
    python benchmarks/compare_power.py --render          # the doc from the committed JSON
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
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
SLOW_DIR = REPO / "benchmarks" / "slow_padded"
# Two ranks a point: a pair of 4-rank runs costs the 2-core machine more than
# the point of this benchmark (the gate's statistics) is worth.
SWEEP = ("-m", "cp_size=2", "+layout=zigzag,shared_page64",
         "seq_lens=[1000],[1001,300],[4096],[2048,17],[64],[3000,1000]",
         "hidden_size=256", "dtype=bfloat16", "warmup=2", "iters=12")
SLOWDOWN = 2.0  # the padded round trip becomes about this many times its base


def _env(slow_map: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO / "src"), str(REPO)]
    if slow_map is not None:
        paths.insert(0, str(SLOW_DIR))
        env["NSA_SLOW_PADDED"] = str(slow_map)
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    return env


def sweep(results: Path, argv: tuple[str, ...] = SWEEP, slow_map: Path | None = None) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "matrix", *argv, f"results_dir={results}"], cwd=REPO,
                          env=_env(slow_map), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"sweep into {results} failed (exit {proc.returncode}):\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    return time.perf_counter() - t0


def compare(base: Path, new: Path) -> dict[str, Any]:
    """compare at its defaults: exit code, its summary counts and noise line."""
    proc = subprocess.run([sys.executable, "-m", "matrix.compare", str(base), str(new), "--all"], cwd=REPO,
                          env=_env(), capture_output=True, text=True, check=False)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    counts = dict(w.split("=", 1) for w in last.removeprefix("summary: ").split(" -> ")[0].split() if "=" in w)
    regressed_impls = sorted({m.group(1) for m in re.finditer(r"\|\s*(\w+)\s*\|[^\n]*REGRESSED", proc.stdout)})
    noise = next((ln for ln in proc.stdout.splitlines() if ln.startswith("noise measured:")), "")
    return {"exit": proc.returncode, "regressed": int(counts.get("regressed", 0) or 0),
            "regressed_lines": [ln for ln in proc.stdout.splitlines() if "REGRESSED" in ln][:20],
            "noise": noise, "stderr": proc.stderr.strip()[-500:]}


def _rows(results: Path) -> list[dict[str, str]]:
    import csv

    with (results / "results.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def slow_map(base: Path, out: Path) -> None:
    """Per point of ``base``: the delay that makes padded's round trip SLOWDOWN times its base."""
    delays: dict[str, float] = {}
    for r in _rows(base):
        if r["impl"] == "padded" and r["status"] == "ok" and r["roundtrip_p50_us"]:
            key = f"{r['cp_size']}:{r['total_tokens']}:{r['max_rank_len']}:{r['hidden_size']}"
            delays[key] = max(delays.get(key, 0.0), (SLOWDOWN - 1) * float(r["roundtrip_p50_us"]))
    out.write_text(json.dumps(delays))


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
    from matrix import compare as cmp

    return {"metric": cmp.DEFAULT_METRIC, "threshold": cmp.DEFAULT_THRESHOLD}


def measure(pairs: int, default_pair: bool) -> dict[str, Any]:
    data: dict[str, Any] = {"date": dt.date.today().isoformat(), "machine": machine(), "defaults": defaults(),
                            "sweep": "python -m matrix " + " ".join(SWEEP), "slowdown": SLOWDOWN,
                            "load_before": round(os.getloadavg()[0], 2), "trials": []}
    with tempfile.TemporaryDirectory(prefix="compare-power-") as tmp:
        for i in range(pairs):
            base, aa, slow = Path(tmp, f"base{i}"), Path(tmp, f"aa{i}"), Path(tmp, f"slow{i}")
            t_base = sweep(base)
            sweep(aa)
            slow_map(base, Path(tmp, f"slow{i}.json"))
            sweep(slow, slow_map=Path(tmp, f"slow{i}.json"))
            data["points"] = len({r["point_id"] for r in _rows(base)})
            trial = {"sweep_s": round(t_base, 1), "load": round(os.getloadavg()[0], 2),
                     "aa": compare(base, aa), "slowed": compare(base, slow),
                     "achieved_slowdown": padded_ratio(base, slow)}
            data["trials"].append(trial)
            print(f"trial {i}: A/A exit {trial['aa']['exit']} ({trial['aa']['regressed']} regressed); "
                  f"slowed x{trial['achieved_slowdown']}: exit {trial['slowed']['exit']} "
                  f"({trial['slowed']['regressed']} regressed); load {trial['load']}", flush=True)
        if default_pair:
            a, b = Path(tmp, "default_a"), Path(tmp, "default_b")
            sweep(a, ("+matrix=default",))
            sweep(b, ("+matrix=default",))
            data["default_pair"] = compare(a, b)
            print(f"default preset A/A: exit {data['default_pair']['exit']}", flush=True)
    data["load_after"] = round(os.getloadavg()[0], 2)
    trials = data["trials"]
    data["false_alarms"], data["detected"] = verdicts(trials)
    return data


def verdicts(trials: list[dict[str, Any]]) -> tuple[int, int]:
    """(false alarms, slowdowns detected) over the trials: what the text says
    is counted from the trials themselves, never copied from a stored total."""
    false_alarms = sum(t["aa"]["exit"] != 0 for t in trials)
    detected = sum(t["slowed"]["exit"] == 1 and t["slowed"]["regressed"] > 0 for t in trials)
    return false_alarms, detected


def render(data: dict[str, Any]) -> str:
    n = len(data["trials"])
    m = data["machine"]
    d = data["defaults"]
    slow = sorted(t["achieved_slowdown"] for t in data["trials"])
    false_alarms, detected = verdicts(data["trials"])
    text = (
        f"Measured with `python benchmarks/compare_power.py` on a {m['nproc']}-core {m['cpu']} machine "
        f"(torch {m['torch']}, {data['date']}; 1-minute load average {data['load_before']:.1f} before, "
        f"{data['load_after']:.1f} after), at the defaults (`--metric {d['metric']}`, "
        f"`--fail-above {d['threshold']}`) on a {data['points']}-point sweep: "
        f"**{false_alarms} false alarms in {n} pairs** of runs of identical code, and the padded "
        f"path slowed {slow[0]:.2f}x-{slow[-1]:.2f}x (a test-only delay) **flagged in {detected} "
        f"of {n} runs**."
    )
    if "default_pair" in data:
        dp = data["default_pair"]
        text += (f" The default preset run twice: compare exit {dp['exit']} "
                 f"({dp['regressed']} regressed).")
    return text


def rendered_doc(doc: str, data: dict[str, Any]) -> str:
    if not BLOCK.search(doc):
        raise SystemExit(f"{DOC.name} has no <!-- compare_power --> block")
    return BLOCK.sub(lambda mt: mt.group(1) + render(data) + mt.group(3), doc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--default-pair", action="store_true", help="also compare two runs of the default preset")
    ap.add_argument("--json", type=Path, default=JSON_PATH)
    ap.add_argument("--doc", type=Path, default=DOC, help="the markdown file holding the block")
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--render", action="store_true", help="the doc's block from the JSON, without measuring")
    args = ap.parse_args(argv)
    if args.render:
        data = json.loads(args.json.read_text())
    else:
        if not 1 <= args.pairs <= 100:
            print(f"error: --pairs={args.pairs}: must be in [1, 100]", file=sys.stderr)
            return 2
        data = measure(args.pairs, args.default_pair)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.json}: {data['false_alarms']} false alarms, {data['detected']} of "
              f"{len(data['trials'])} detected")
    if not args.no_doc:
        args.doc.write_text(rendered_doc(args.doc.read_text(), data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
