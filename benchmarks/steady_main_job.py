"""Is the main job steady under load: the default sweep, N times, with the machine kept busy.

Runs what `nox -s matrix` runs (`python -m matrix -m +matrix=default`, into a
scratch results folder) ``--runs`` times while busy-loop processes hold the
machine's load up (``--load L``: the 1-minute load average held at L, the
machine's other work counted; or ``--burners N`` of them; 0: as the machine
is), and prints each run's exit status, wall time, closing summary and the
1-minute load average before, during (sampled every 5 s) and after it. With ``--write`` the figures go to
``benchmarks/data/steady_main_job.json`` (the README's figure quotes it).

    python benchmarks/steady_main_job.py [--runs 10] [--load 10 | --burners 10] [--write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JSON_PATH = REPO / "benchmarks" / "data" / "steady_main_job.json"
COMMAND = ["-m", "matrix", "-m", "+matrix=default"]


def _burn(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


class LoadHolder:
    """Holds the machine's 1-minute load average at ``target`` or above.

    Every few seconds it reads the load, takes away its own burners to
    estimate what the rest of the machine puts there, and starts or stops
    busy-loop processes to make up the difference: other work on the machine
    counts towards the target, so the figure is the load the run saw, not the
    burners added on top. ``fixed`` burners instead hold a set count."""

    PERIOD_S = 5.0

    def __init__(self, target: float | None, fixed: int) -> None:
        self.target, self.fixed = target, fixed
        self.burners: list[tuple[multiprocessing.Process, object]] = []
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _resize(self, n: int) -> None:
        while len(self.burners) < n:
            stop = multiprocessing.Event()
            proc = multiprocessing.Process(target=_burn, args=(stop,), daemon=True)
            proc.start()
            self.burners.append((proc, stop))
        while len(self.burners) > n:
            proc, stop = self.burners.pop()
            stop.set()
            proc.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.PERIOD_S):
            load = os.getloadavg()[0]
            self.samples.append(load)
            if self.target is not None:
                others = max(0.0, load - len(self.burners))
                self._resize(max(0, min(4 * self.target, round(self.target - others + 0.5))))

    def start(self) -> None:
        self._resize(self.fixed if self.target is None else max(0, round(self.target - os.getloadavg()[0])))
        self._thread.start()

    def take_samples(self) -> list[float]:
        out, self.samples = self.samples, []
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._resize(0)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _write(args, runs: list[dict]) -> None:
    ok = sum(r["exit"] == 0 for r in runs)
    JSON_PATH.write_text(json.dumps({
        "command": "python " + " ".join(COMMAND), "commit": _commit(),
        "load_target": args.load, "burners": None if args.load is not None else args.burners,
        "cores": os.cpu_count(), "machine": platform.processor() or platform.machine(),
        "date": dt.date.today().isoformat(), "runs": runs, "exit_0": ok,
    }, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--load", type=float, default=None,
                    help="hold the 1-minute load average at this value, counting the machine's other work")
    ap.add_argument("--burners", type=int, default=10, help="busy-loop processes held during the runs (without --load)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds a run may take")
    ap.add_argument("--write", action="store_true",
                    help=f"record the figures in {JSON_PATH.relative_to(REPO)} (after every run)")
    args = ap.parse_args()
    holder = LoadHolder(args.load, args.burners)
    holder.start()
    runs: list[dict] = []
    try:
        if args.load is not None or args.burners:
            time.sleep(60)  # let the 1-minute load average reach the target
        for k in range(args.runs):
            out = Path(tempfile.mkdtemp(prefix="steady-"))
            holder.take_samples()
            before = os.getloadavg()[0]
            t0 = time.perf_counter()
            try:
                proc = subprocess.run([sys.executable, *COMMAND, f"results_dir={out}"], cwd=REPO, capture_output=True,
                                      text=True, timeout=args.timeout)
                rc, text = proc.returncode, proc.stdout + proc.stderr
            except subprocess.TimeoutExpired:
                rc, text = "timeout", ""
            wall = time.perf_counter() - t0
            during = holder.take_samples() or [before]
            summary = re.search(r"matrix summary: .*", text)
            runs.append({"exit": rc, "wall_s": round(wall, 1), "load_before": round(before, 1),
                         "load_after": round(os.getloadavg()[0], 1),
                         "load_during": {"min": round(min(during), 1), "median": round(statistics.median(during), 1),
                                         "max": round(max(during), 1)},
                         "summary": summary.group(0) if summary else ""})
            print(f"run {k + 1}: exit {rc} in {wall:.0f} s, load during {runs[-1]['load_during']}: "
                  f"{runs[-1]['summary']}", flush=True)
            if args.write:
                _write(args, runs)
    finally:
        holder.close()
    ok = sum(r["exit"] == 0 for r in runs)
    held = f"the load held at {args.load:g}" if args.load is not None else f"{args.burners} busy processes"
    print(f"{ok} of {len(runs)} runs exited 0 with {held} on {os.cpu_count()} cores")
    if args.write:
        print(f"wrote {JSON_PATH}")
    return 0 if ok == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
