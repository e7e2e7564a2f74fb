"""What a sweep's points cost its results folder and its dry run: linear in N points.

Writes a results folder of N points (one row each, as a default sweep's
rows), then times what the sweep asks of it, without ranks: the preflight's
check (every file held to the store's rules, results.csv read once), and a
resume in which every point asks the store whether it is done and for an
earlier point of its effective configuration, as ``matrix.app.point.run``
does. Before the store each point read the whole file three times
(``check_schema``, ``completed_point_ids``, ``earlier_same_effective``), so a
sweep's reads grew with the square of its points. Last, the real dry run of
an N-point sweep (``python -m matrix -m --dry-run seed=range(0,N)``, in a fresh
interpreter: Hydra's sweep expanded, every point composed and resolved, the
estimate), less the same command's start for one point.

    python benchmarks/store_resume.py            # 1,250 / 2,500 / 5,000 points; JSON and the doc block
    python benchmarks/store_resume.py --render   # the doc block from the committed JSON
"""

from __future__ import annotations

import argparse
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
for _path in (REPO / "src", REPO):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from matrix.store.folder import Folder  # noqa: E402
from matrix.store.results import append_rows  # noqa: E402

JSON_PATH = REPO / "benchmarks" / "data" / "store_resume.json"
DOC = REPO / "docs" / "benchmarks.md"
BLOCK = re.compile(r"(<!-- store_resume -->\n)(.*?)(<!-- /store_resume -->)", re.S)
SIZES = (1250, 2500, 5000)


def folder_of(root: Path, n: int) -> Path:
    d = root / str(n)
    rows = [{"point_id": f"p{i:05d}", "effective_id": f"e{i:05d}", "impl": impl, "status": "ok", "cp_size": 2,
             "seq_lens": f"[{1000 + i},300]", "repro": "python -m matrix " + "k=v " * 40}
            for i in range(n) for impl in ("legacy", "padded")]
    append_rows(d, rows)
    return d


def measure(n: int, root: Path) -> dict[str, Any]:
    d = folder_of(root, n)
    t0 = time.perf_counter()
    folder = Folder(d)
    folder.check()
    check_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    done = sum(folder.done(f"p{i:05d}") and folder.earlier_same_effective(f"e{i:05d}", f"p{i:05d}") is None
               for i in range(n))
    resume_s = time.perf_counter() - t0
    assert done == n
    size = (d / "results.csv").stat().st_size
    return {"points": n, "file_bytes": size, "check_s": round(check_s, 4), "resume_s": round(resume_s, 4),
            "resume_us_per_point": round(resume_s / n * 1e6, 1), "bytes_read": folder.bytes_read}


def dry_run_s(n: int, root: Path) -> float:
    """Wall seconds of the real dry run of an n-point sweep (its lines checked)."""
    # force=true: thousands of default points exceed the time budget, which the
    # dry run would otherwise report as a refusal before printing them.
    argv = [sys.executable, "-m", "matrix", "-m", "--dry-run", f"seed=range(0,{n})", "force=true",
            f"results_dir={root / 'dry'}"]
    t0 = time.perf_counter()
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=1800)
    took = time.perf_counter() - t0
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == n + 1 and lines[-1].startswith(f"estimate: {n} point"), lines[-1:]
    return took


def render(data: dict[str, Any]) -> str:
    lines = ["| points | results.csv | preflight check (one read) | resume: every point asks | per point | bytes read "
             "| dry run (start aside) | per point |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in data["runs"]:
        lines.append(f"| {r['points']:,} | {r['file_bytes'] / 1e6:.1f} MB | {r['check_s']:.2f} s | {r['resume_s']:.2f} s "
                     f"| {r['resume_us_per_point']:.0f} us | {r['bytes_read']:,} | {r['dry_run_s']:.1f} s "
                     f"| {r['dry_run_ms_per_point']:.1f} ms |")
    return "\n".join(lines) + (f"\n\nThe dry run's start (one point, its interpreter and imports) took "
                               f"{data['dry_run_start_s']:.1f} s. (load average {data['load_1m']} on {data['cpus']} "
                               f"cores, commit {data['commit']})\n")


def block(text: str) -> str | None:
    m = BLOCK.search(text)
    return m.group(2) if m else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--render", action="store_true", help="only rewrite the doc block from the committed JSON")
    args = ap.parse_args(argv)
    if not args.render:
        with tempfile.TemporaryDirectory() as tmp:
            runs = [measure(n, Path(tmp)) for n in SIZES]
            start_s = dry_run_s(1, Path(tmp))
            for r in runs:
                r["dry_run_s"] = round(dry_run_s(r["points"], Path(tmp)) - start_s, 2)
                r["dry_run_ms_per_point"] = round(r["dry_run_s"] / r["points"] * 1e3, 2)
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True,
                             text=True).stdout.strip()
        data = {"runs": runs, "dry_run_start_s": round(start_s, 2), "load_1m": round(os.getloadavg()[0], 1),
                "cpus": os.cpu_count(), "commit": sha}
        JSON_PATH.write_text(json.dumps(data, indent=1) + "\n")
        for r in runs:
            print(r)
    data = json.loads(JSON_PATH.read_text())
    DOC.write_text(BLOCK.sub(lambda m: m.group(1) + render(data) + m.group(3), DOC.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
