"""How fast the matrix harness gets through points: cold ranks vs warm ranks.

Starting rank processes (each imports torch) dominates a CPU sweep. The matrix
keeps ranks warm across consecutive points of the same world (cp size,
backend, device). This runs the same sweep twice through the real CLI, once
with a fresh set of ranks per point (NSA_CP_COMM_REUSE_RANKS=0) and once
warm, and prints points per minute.

    python benchmarks/harness_speed.py [--keep DIR] [extra Hydra overrides]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SWEEP = [
    "cp_size=2,4",
    "+layout=zigzag,shared_page64",
    "seq_lens=[64],[1000],[1001,300]",
    "moe_a2a_backend=none",
    "hidden_size=64",
    "dtype=float32",
    "warmup=1",
    "iters=3",
]


def run(mode: str, results_dir: Path, extra: list[str]) -> tuple[int, float]:
    env = dict(os.environ, NSA_CP_COMM_REUSE_RANKS="0" if mode == "cold" else "1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "matrix", "-m", f"results_dir={results_dir}", *SWEEP, *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{mode} sweep failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    m = re.search(r"matrix summary: (\d+) points", proc.stdout)
    return int(m.group(1)) if m else 0, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="keep the two results dirs here")
    args, extra = ap.parse_known_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="harness-speed-"))
    print(f"sweep: {' '.join(SWEEP + extra)}")
    print(f"host: {platform.node()}, {os.cpu_count()} cores, python {platform.python_version()}")
    print(f"{'mode':<6} {'points':>6} {'wall_s':>8} {'points/min':>11}")
    rates = {}
    try:
        for mode in ("cold", "warm"):
            n, wall = run(mode, base / mode, extra)
            rates[mode] = n / wall * 60
            print(f"{mode:<6} {n:>6} {wall:>8.1f} {rates[mode]:>11.1f}")
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    print(f"warm/cold speed-up: {rates['warm'] / rates['cold']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
