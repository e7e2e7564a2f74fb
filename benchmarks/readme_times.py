"""The README's wall times, measured: the default sweep and the test suite.

Times typed by hand went stale (a sweep quoted at 66 s took 152 s on the same
kind of machine). This measures them on this machine, records machine, date
and load average into benchmarks/data/readme_times.json, and renders the
README sentences that quote them between `<!-- readme_times:NAME -->` and
`<!-- /readme_times -->`; tests/test_setup.py fails when the README and the
JSON disagree.

    python benchmarks/readme_times.py --write      # measure both, write JSON and README (minutes)
    python benchmarks/readme_times.py --only sweep # measure one and print it; --write keeps the other's figures
    python benchmarks/readme_times.py --render     # README from the committed JSON, no measuring
    python benchmarks/readme_times.py --check      # exit 1 when the README is out of date

A trial that leaves the committed figures alone:
    python benchmarks/readme_times.py --write --json /tmp/t.json --no-readme --pytest-args "tests/test_plan.py -q"
Run it on a machine doing nothing else: the load average is recorded so a
reader can tell, not corrected for.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
JSON_PATH = REPO / "benchmarks" / "data" / "readme_times.json"
README = REPO / "README.md"
BLOCK = re.compile(r"(<!-- readme_times:(\w+) -->\n)(.*?)(\n<!-- /readme_times -->)", re.S)
NAMES = ("sweep", "tests")
# Blocks rendered from another script's committed figures, not measured here.
STEADY_JSON = REPO / "benchmarks" / "data" / "steady_main_job.json"
RENDERED = (*NAMES, "steady")
# Set to the name being measured in the run that measures it
# (tests/test_setup.py leaves that figure's command unchecked there).
MEASURING = "NSA_README_TIMES_MEASURING"


def noxfile() -> Any:
    """The noxfile as a module: the commands timed here are the ones its
    sessions run, read from it rather than copied. Loaded once per process
    (loading registers its sessions with nox, which warns on a second time)."""
    name = "_nsa_noxfile"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "noxfile.py")
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def sweep_argv() -> list[str]:
    """`python -m matrix` arguments of `nox -s matrix` with no posargs."""
    return list(noxfile().matrix_overrides([]))


def pytest_argv() -> list[str]:
    """pytest arguments of `nox -s tests` with no posargs."""
    return list(noxfile().PYTEST_ARGS)


def machine() -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "src"))
    import torch

    from nsa_cp_comm.harness.machine import cpu_model

    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _timed(cmd: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float, float, float]:
    before = _load()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    return proc, round(wall, 1), before, _load()


def measure_sweep() -> dict[str, Any]:
    args = sweep_argv()
    with tempfile.TemporaryDirectory(prefix="readme-times-") as tmp:
        cmd = [sys.executable, "-m", "matrix", *args, f"results_dir={tmp}/run"]
        print("timing:", " ".join(cmd[1:]), flush=True)
        proc, wall, before, after = _timed(cmd, dict(os.environ))
    if proc.returncode != 0:
        sys.exit(f"the sweep failed (exit {proc.returncode}); no figures written:\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    m = re.search(r"matrix summary: (\d+) points", proc.stdout)
    if not m:
        sys.exit("the sweep printed no summary line; no figures written")
    return {
        "command": "python -m matrix " + " ".join(args),
        "points": int(m.group(1)),
        "wall_s": wall,
        "load_before": before,
        "load_after": after,
    }


def parse_pytest_counts(output: str) -> dict[str, int]:
    """Counts of pytest's closing line: `924 passed, 3 skipped in 100.2s`."""
    lines = [ln for ln in output.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
    if not lines:
        return {}
    counts = {}
    for n, word in re.findall(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?|deselected)", lines[-1]):
        counts[word.rstrip("s") if word.startswith("error") else word] = int(n)
    return counts


def measure_tests(args: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    # `nox -s tests` runs the bounded default profile.
    env.pop("HYPOTHESIS_PROFILE", None)
    env[MEASURING] = "tests"
    cmd = [sys.executable, "-m", "pytest", *args]
    print("timing:", " ".join(cmd[1:]), flush=True)
    proc, wall, before, after = _timed(cmd, env)
    counts = parse_pytest_counts(proc.stdout)
    if proc.returncode != 0 or not counts.get("passed"):
        sys.exit(f"the test suite failed (exit {proc.returncode}); no figures written:\n{proc.stdout[-2000:]}")
    return {
        "command": "pytest " + shlex.join(args),  # quoted: runs as printed
        "counts": counts,
        "wall_s": wall,
        "load_before": before,
        "load_after": after,
    }


def _on(part: dict[str, Any]) -> str:
    m = part["machine"]
    return f"a {m['nproc']}-core {m['cpu']} machine (torch {m['torch']}, {part['date']})"


def _load_text(part: dict[str, Any]) -> str:
    return (f"1-minute load average {part['load_before']:.1f} before the run, "
            f"{part['load_after']:.1f} at its end (its own load included)")


def render(name: str, data: dict[str, Any]) -> str:
    """The README text of one block, from the recorded figures."""
    if name == "sweep":
        s = data["sweep"]
        text = (
            f"Measured with `python benchmarks/readme_times.py --write`: {s['points']} points in "
            f"{s['wall_s']:.0f} s on {_on(s)}; {_load_text(s)}; not counting the "
            f"shared environment's first set-up."
        )
    elif name == "tests":
        t = data["tests"]
        c = t["counts"]
        counted = ", ".join(f"{c[k]} {k}" for k in ("passed", "failed", "error", "skipped", "xfailed", "deselected") if c.get(k))
        text = (
            f"Measured with `python benchmarks/readme_times.py --write`: `{t['command']}` "
            f"({counted}) took {t['wall_s']:.0f} s on {_on(t)}; {_load_text(t)}."
        )
    elif name == "steady":
        text = steady_text(json.loads(STEADY_JSON.read_text()))
    else:
        raise KeyError(name)
    # Code spans stay on one line: a wrapped one could start a line with `-`.
    glued = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", "\x00"), text)
    return textwrap.fill(glued, width=78, break_on_hyphens=False, break_long_words=False).replace("\x00", " ")


def steady_text(s: dict[str, Any]) -> str:
    """The main job under load, from benchmarks/steady_main_job.py's figures."""
    runs = s["runs"]
    walls = [r["wall_s"] for r in runs]
    held = (f"the 1-minute load held at {s['load_target']:g} or more (each run's median load "
            f"{min(r['load_during']['median'] for r in runs):.0f}-{max(r['load_during']['median'] for r in runs):.0f})"
            if s.get("load_target") is not None else f"{s['burners']} busy processes")
    return (f"Under load (`python benchmarks/steady_main_job.py --load {s.get('load_target') or 0:g} --write`): "
            f"{s['exit_0']} of {len(runs)} default sweeps exited 0 with {held}, in {min(walls):.0f}-{max(walls):.0f} s "
            f"each ({s.get('commit') or 'commit not recorded'}, {s['date']}).")


def blocks(readme: str) -> dict[str, str]:
    """`{name: text}` of the README's measured blocks."""
    return {m.group(2): m.group(3) for m in BLOCK.finditer(readme)}


def rendered_readme(readme: str, data: dict[str, Any]) -> str:
    missing = [n for n in RENDERED if n not in blocks(readme)]
    if missing:
        raise SystemExit(f"README has no <!-- readme_times:{missing[0]} --> block")
    return BLOCK.sub(lambda m: m.group(1) + render(m.group(2), data) + m.group(4), readme)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=NAMES, help="measure one; the other keeps its recorded figures")
    ap.add_argument("--json", type=Path, default=JSON_PATH, help="where the figures go (default: the committed file)")
    ap.add_argument("--readme", type=Path, default=README)
    ap.add_argument("--write", action="store_true",
                    help="record the figures: the JSON, and the README (without it, measure and print only)")
    ap.add_argument("--no-readme", action="store_true", help="with --write: the JSON only")
    ap.add_argument("--render", action="store_true", help="README from the JSON, without measuring")
    ap.add_argument("--check", action="store_true", help="exit 1 when the README differs from the JSON")
    ap.add_argument("--pytest-args", help="instead of what `nox -s tests` runs (for a trial)")
    args = ap.parse_args(argv)

    if args.render or args.check:
        data = json.loads(args.json.read_text())
        old = args.readme.read_text()
        new = rendered_readme(old, data)
        if args.check:
            if new != old:
                print(f"{args.readme} is out of date with {args.json}: run {Path(__file__).name} --render")
                return 1
            return 0
        args.readme.write_text(new)
        return 0

    data: dict[str, Any] = json.loads(args.json.read_text()) if args.only and args.json.exists() else {}
    # Machine and date per figure: --only may keep one measured elsewhere.
    where = {"machine": machine(), "date": dt.date.today().isoformat()}
    if args.only in (None, "sweep"):
        data["sweep"] = {**measure_sweep(), **where}
        print(f"sweep: {data['sweep']}", flush=True)
    if args.only in (None, "tests"):
        test_args = shlex.split(args.pytest_args) if args.pytest_args else pytest_argv()
        data["tests"] = {**measure_tests(test_args), **where}
        print(f"tests: {data['tests']}", flush=True)
    if not args.write:
        print("nothing written (--write records these figures in the JSON and the README)")
        return 0
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.json}")
    if not args.no_readme:
        args.readme.write_text(rendered_readme(args.readme.read_text(), data))
        print(f"updated {args.readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
