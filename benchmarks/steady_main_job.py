"""Is the main job steady under load: the default sweep, N times, with the machine kept busy.

Runs what `nox -s matrix` runs (`python -m matrix -m +matrix=default`, into a
scratch results folder) ``--runs`` times while ``--burners`` busy-loop
processes hold the machine's load up (0: as the machine is), and prints each
run's exit status, wall time, closing summary and the 1-minute load average
before and after it. With ``--write`` the figures go to
``benchmarks/data/steady_main_job.json`` (the README's figure quotes it).

    python benchmarks/steady_main_job.py [--runs 10] [--burners 10] [--write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JSON_PATH = REPO / "benchmarks" / "data" / "steady_main_job.json"
COMMAND = ["-m", "matrix", "-m", "+matrix=default"]


def _burn(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--burners", type=int, default=10, help="busy-loop processes held during the runs")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds a run may take")
    ap.add_argument("--write", action="store_true", help=f"record the figures in {JSON_PATH.relative_to(REPO)}")
    args = ap.parse_args()
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=_burn, args=(stop,), daemon=True) for _ in range(args.burners)]
    for b in burners:
        b.start()
    runs = []
    try:
        if burners:
            time.sleep(60)  # let the 1-minute load average reach the burners
        for k in range(args.runs):
            out = Path(tempfile.mkdtemp(prefix="steady-"))
            before = os.getloadavg()[0]
            t0 = time.perf_counter()
            try:
                proc = subprocess.run([sys.executable, *COMMAND, f"results_dir={out}"], cwd=REPO, capture_output=True,
                                      text=True, timeout=args.timeout)
                rc, text = proc.returncode, proc.stdout + proc.stderr
            except subprocess.TimeoutExpired:
                rc, text = "timeout", ""
            wall = time.perf_counter() - t0
            summary = re.search(r"matrix summary: .*", text)
            runs.append({"exit": rc, "wall_s": round(wall, 1), "load_before": round(before, 1),
                         "load_after": round(os.getloadavg()[0], 1), "summary": summary.group(0) if summary else ""})
            print(f"run {k + 1}: exit {rc} in {wall:.0f} s, load {before:.1f} -> {runs[-1]['load_after']:.1f}: "
                  f"{runs[-1]['summary']}", flush=True)
    finally:
        stop.set()
        for b in burners:
            b.join(timeout=5)
    ok = sum(r["exit"] == 0 for r in runs)
    print(f"{ok} of {len(runs)} runs exited 0 with {args.burners} busy processes on {os.cpu_count()} cores")
    if args.write:
        JSON_PATH.write_text(json.dumps({
            "command": "python " + " ".join(COMMAND), "burners": args.burners, "cores": os.cpu_count(),
            "machine": platform.processor() or platform.machine(), "date": dt.date.today().isoformat(),
            "runs": runs, "exit_0": ok,
        }, indent=1) + "\n")
        print(f"wrote {JSON_PATH}")
    return 0 if ok == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
