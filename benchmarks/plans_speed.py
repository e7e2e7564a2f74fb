"""How fast `python -m matrix.plans` plans 100k batches at cp 8..128, and its figure.

Runs the command as a user does (a fresh process, imports included), records
its wall time, the machine and the load average into
benchmarks/data/plans_speed.json, writes its overhead plot to
docs/plans_overhead.png and the sentence of docs/designs.md between
`<!-- plans_speed -->` and `<!-- /plans_speed -->` (tests/scale/test_plans.py fails
when the doc and the JSON disagree). Exit 1 when the wall time exceeds the target
(30 s), so the claim can fail.

    python benchmarks/plans_speed.py            # measure, write JSON, plot and the doc
    python benchmarks/plans_speed.py --render   # the doc from the committed JSON
    python benchmarks/plans_speed.py --json /tmp/p.json --no-doc   # a trial
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
JSON_PATH = REPO / "benchmarks" / "data" / "plans_speed.json"
PLOT_PATH = REPO / "docs" / "plans_overhead.png"
DOC = REPO / "docs" / "designs.md"
BLOCK = re.compile(r"(<!-- plans_speed -->\n)(.*?)(\n<!-- /plans_speed -->)", re.S)
TARGET_S = 30.0
ARGS = ["--batches", "100000", "--cp", "8,16,32,64,128", "--policy", "zigzag_page,zigzag,round_robin",
        "--engine", "seed_fix,sglang_0_5_23", "--workload", "lognormal"]


def machine() -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "src"))
    from nsa_cp_comm.harness.machine import cpu_model

    import numpy

    return {"nproc": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version(),
            "numpy": numpy.__version__}


def measure() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="plans-speed-") as tmp:
        cmd = [sys.executable, "-m", "matrix.plans", *ARGS, "--out", tmp]
        before = round(os.getloadavg()[0], 2)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        after = round(os.getloadavg()[0], 2)
        if proc.returncode:
            raise SystemExit(f"matrix.plans failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
        out = json.loads((Path(tmp) / "plans.json").read_text())
        PLOT_PATH.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(tmp) / "plans_overhead.png", PLOT_PATH)
    meta = out["meta"]
    overhead = {f"{r['engine']} {r['policy']} cp={r['cp_size']} {r['design']}": round(r["overhead_mean"], 4)
                for r in out["rows"] if r["cp_size"] in (8, 128) and r["overhead_mean"] is not None}
    return {
        "command": "python -m matrix.plans " + " ".join(ARGS),
        "wall_s": round(wall, 2), "draw_s": meta["draw_s"], "plans_s": meta["plans_s"],
        "batches": meta["batches"], "requests": meta["requests"], "cp": meta["cp"], "policies": meta["policies"],
        "splits": meta["splits"],
        "workload": meta["workload"], "target_s": TARGET_S, "load_before": before, "load_after": after,
        "date": dt.date.today().isoformat(), "machine": machine(), "overhead_mean": overhead,
    }


def render(d: dict[str, Any]) -> str:
    m = d["machine"]
    text = (
        f"Measured with `python benchmarks/plans_speed.py`: `{d['command']}` took {d['wall_s']:.1f} s "
        f"(draw {d['draw_s']:.1f} s, plans {d['plans_s']:.1f} s, the rest start-up, imports, statistics and the plot; target {d['target_s']:.0f} s) "
        f"for {d['batches']} batches ({d['requests']} requests) x {len(d['cp'])} cp sizes x "
        f"{len(d['splits'])} engine/split pairs on a {m['nproc']}-core {m['cpu']} machine ({d['date']}); 1-minute load "
        f"average {d['load_before']:.1f} before the run, {d['load_after']:.1f} at its end."
    )
    glued = re.sub(r"`[^`]*`", lambda x: x.group(0).replace(" ", "\x00"), text)
    return textwrap.fill(glued, width=78, break_on_hyphens=False, break_long_words=False).replace("\x00", " ")


def block(text: str) -> str | None:
    m = BLOCK.search(text)
    return m.group(2) if m else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=JSON_PATH)
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--render", action="store_true", help="the doc's block from the JSON, without measuring")
    args = ap.parse_args(argv)
    if args.render:
        data = json.loads(args.json.read_text())
    else:
        data = measure()
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1) + "\n")
        print(json.dumps({k: data[k] for k in ("wall_s", "draw_s", "plans_s", "target_s", "load_before",
                                               "load_after")}))
    if not args.no_doc:
        doc = DOC.read_text()
        if block(doc) is None:
            raise SystemExit(f"{DOC.name} has no <!-- plans_speed --> block")
        DOC.write_text(BLOCK.sub(lambda m: m.group(1) + render(data) + m.group(3), doc))
    if data["wall_s"] > data["target_s"]:
        print(f"FAIL: {data['wall_s']:.1f} s > target {data['target_s']:.0f} s", file=sys.stderr)
        return 1
    print(f"ok: {data['wall_s']:.1f} s <= target {data['target_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
