"""What a sweep's points cost its results folder: a resume of N points, linear in N.

Writes a results folder of N points (one row each, as a default sweep's
rows), then times what the sweep asks of it, without ranks: the preflight's
check (every file held to the store's rules, results.csv read once), and a
resume in which every point asks the store whether it is done and for an
earlier point of its effective configuration, as ``matrix.app.point.run``
does. Before the store each point read the whole file three times
(``check_schema``, ``completed_point_ids``, ``earlier_same_effective``), so a
sweep's reads grew with the square of its points.

    python benchmarks/store_resume.py            # 1,250 / 2,500 / 5,000 points; JSON and the doc block
    python benchmarks/store_resume.py --render   # the doc block from the committed JSON
"""

from __future__ import annotations

import argparse
import json
import re
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


def render(data: dict[str, Any]) -> str:
    lines = ["| points | results.csv | preflight check (one read) | resume: every point asks | per point | bytes read |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in data["runs"]:
        lines.append(f"| {r['points']:,} | {r['file_bytes'] / 1e6:.1f} MB | {r['check_s']:.2f} s | {r['resume_s']:.2f} s "
                     f"| {r['resume_us_per_point']:.0f} us | {r['bytes_read']:,} |")
    return "\n".join(lines) + f"\n\n(load average {data['load_1m']} on {data['cpus']} cores, commit {data['commit']})\n"


def block(text: str) -> str | None:
    m = BLOCK.search(text)
    return m.group(2) if m else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--render", action="store_true", help="only rewrite the doc block from the committed JSON")
    args = ap.parse_args(argv)
    if not args.render:
        import os
        import subprocess

        with tempfile.TemporaryDirectory() as tmp:
            runs = [measure(n, Path(tmp)) for n in SIZES]
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True,
                             text=True).stdout.strip()
        data = {"runs": runs, "load_1m": round(os.getloadavg()[0], 1), "cpus": os.cpu_count(), "commit": sha}
        JSON_PATH.write_text(json.dumps(data, indent=1) + "\n")
        for r in runs:
            print(r)
    data = json.loads(JSON_PATH.read_text())
    DOC.write_text(BLOCK.sub(lambda m: m.group(1) + render(data) + m.group(3), DOC.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
