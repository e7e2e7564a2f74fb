"""Write the small synthetic request trace that ships in data/traces/synthetic.csv.

Synthetic, not recorded traffic: a seeded mixture of short chat turns
(lognormal around 600 tokens) and long documents (lognormal around 9000
tokens, one request in eight), with Poisson arrivals. Columns:
``request_id,arrival_s,seq_len`` (the workload reader uses ``seq_len`` only).

    python benchmarks/make_trace.py [--out data/traces/synthetic.csv] [--requests 400]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "data" / "traces" / "synthetic.csv")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--seed", type=int, default=19)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    n = args.requests
    doc = rng.random(n) < 0.125
    short = rng.lognormal(np.log(600) - 0.8**2 / 2, 0.8, n)
    long = rng.lognormal(np.log(9000) - 0.5**2 / 2, 0.5, n)
    lens = np.clip(np.ceil(np.where(doc, long, short)), 1, 16384).astype(int)
    arrival = np.cumsum(rng.exponential(0.05, n))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["request_id", "arrival_s", "seq_len"])
        for i, (t, L) in enumerate(zip(arrival, lens)):
            w.writerow([i, f"{t:.4f}", int(L)])
    print(f"wrote {n} requests to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
