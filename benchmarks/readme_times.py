"""The README's wall times, measured: the default sweep and the test suite;
and docs/setup.md's time of every nox session.

Times typed by hand went stale (a sweep quoted at 66 s took 152 s on the same
kind of machine). This measures them on this machine, records machine, date
and load average into benchmarks/data/readme_times.json, and renders the
README sentences that quote them between `<!-- readme_times:NAME -->` and
`<!-- /readme_times -->`; tests/project/test_setup.py fails when the README and the
JSON disagree.

    python benchmarks/readme_times.py --write      # measure both, write JSON and README (minutes)
    python benchmarks/readme_times.py --only sweep # measure one and print it; --write keeps the other's figures
    python benchmarks/readme_times.py --render     # README from the committed JSON, no measuring
    python benchmarks/readme_times.py --check      # exit 1 when the README is out of date

Every nox session (`nox -s NAME`, what the noxfile runs for it, read from the
noxfile; without nox's own start) into benchmarks/data/nox_times.json and
docs/setup.md's `<!-- nox_times -->` block, the 1-minute load average sampled
through each run and recorded beside it:

    python benchmarks/readme_times.py --sessions matrix,report,compare,tests --write
    python benchmarks/readme_times.py --sessions slow --write   # adds one; the others keep theirs
    python benchmarks/readme_times.py --sessions all --write    # every session (an hour under load)

A trial that leaves the committed figures alone:
    python benchmarks/readme_times.py --write --json /tmp/t.json --no-readme --pytest-args "tests/lib/test_plan.py -q"
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
# (tests/project/test_setup.py leaves that figure's command unchecked there).
MEASURING = "NSA_README_TIMES_MEASURING"
# Each nox session's time, rendered into docs/setup.md.
SESSIONS_JSON = REPO / "benchmarks" / "data" / "nox_times.json"
SETUP_DOC = REPO / "docs" / "setup.md"
SESSIONS_BLOCK = re.compile(r"(<!-- nox_times -->\n)(.*?)(\n<!-- /nox_times -->)", re.S)
# The order they are measured in with `--sessions all` (report and compare read
# the matrix session's results, so they follow it) and listed in the doc.
SESSION_ORDER = ("matrix", "report", "compare", "tests", "slow", "fuzz", "harness", "bench")
# What a session that needs arguments is given: report and compare read the
# results the matrix session just wrote ({results}).
SESSION_POSARGS = {"report": ["{results}", "--out", "{tmp}/report"], "compare": ["{results}", "{results}"],
                   "matrix": ["results_dir={results}"]}


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


def session_names() -> list[str]:
    """Every session the noxfile registers, in SESSION_ORDER (any new one last)."""
    import nox.registry

    noxfile()
    names = list(nox.registry.get())
    return [n for n in SESSION_ORDER if n in names] + sorted(n for n in names if n not in SESSION_ORDER)


class _Recorder:
    """A stand-in nox session that records what the session would run."""

    def __init__(self, posargs: list[str]) -> None:
        self.posargs = posargs
        self.env: dict[str, str] = {}
        self.calls: list[tuple[tuple[str, ...], dict[str, Any]]] = []

    def run(self, *args: str, **kwargs: Any) -> None:
        self.calls.append((args, kwargs))

    def log(self, *args: Any) -> None:
        pass

    warn = log


def session_command(name: str, posargs: list[str]) -> tuple[list[str], dict[str, str], list[int]]:
    """`(argv, env, success_codes)` of `nox -s NAME -- POSARGS`, as the noxfile
    runs it (this interpreter standing in for the shared environment's)."""
    import nox.registry

    mod = noxfile()
    rec = _Recorder(list(posargs))
    real = mod.shared_python
    mod.shared_python = lambda session: sys.executable
    try:
        nox.registry.get()[name].func(rec)
    finally:
        mod.shared_python = real
    if len(rec.calls) != 1:
        raise SystemExit(f"nox session {name} ran {len(rec.calls)} commands; timing one is all this knows")
    args, kwargs = rec.calls[0]
    return list(args), {**rec.env, **kwargs.get("env", {})}, list(kwargs.get("success_codes", [0]))


class _LoadSampler:
    """The 1-minute load average every few seconds while a command runs."""

    def __init__(self, every_s: float = 5.0) -> None:
        import threading

        self.every_s = every_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(_load())

    def __enter__(self) -> "_LoadSampler":
        self.samples.append(_load())
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(_load())

    def summary(self) -> dict[str, float]:
        xs = sorted(self.samples)
        return {"min": xs[0], "median": xs[len(xs) // 2], "max": xs[-1], "samples": len(xs)}


def _commit() -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    return head + ("+changes" if head and git("status", "--porcelain", "--untracked-files=no") else "")


def measure_session(name: str, tmp: str, results: str) -> dict[str, Any]:
    """Time `nox -s NAME` (its command; the shared environment already built)."""
    posargs = [a.format(tmp=tmp, results=results) for a in SESSION_POSARGS.get(name, [])]
    argv, extra_env, codes = session_command(name, posargs)
    env = {**os.environ, **extra_env}
    # This checkout's library, whichever checkout the environment was built from.
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    if name == "tests":
        env.pop("HYPOTHESIS_PROFILE", None)
        env[MEASURING] = "tests"
    print(f"timing nox -s {name}:", " ".join(argv[1:]), flush=True)
    before = _load()
    with _LoadSampler() as loads:
        t0 = time.perf_counter()
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        wall = round(time.perf_counter() - t0, 1)
    out = proc.stdout + proc.stderr
    shown = [a.replace(results, "TMP/run").replace(tmp, "TMP").replace(f"{REPO}{os.sep}", "") for a in argv[1:]]
    part: dict[str, Any] = {
        "command": "python " + shlex.join(shown),
        "nox": "nox -s " + name + (" -- " + shlex.join(a.replace(results, "TMP/run").replace(tmp, "TMP")
                                                        for a in posargs) if posargs else ""),
        "exit": proc.returncode,
        "ok": proc.returncode in codes,
        "wall_s": wall,
        "load_before": before,
        "load_after": _load(),
        "load_during": loads.summary(),
    }
    counts = parse_pytest_counts(out) if "pytest" in argv else {}
    if counts:
        part["counts"] = counts
    m = re.search(r"matrix summary: (\d+) points?", out)
    if m:
        part["points"] = int(m.group(1))
    if not part["ok"]:
        part["tail"] = out[-1500:]
        # The tail rarely holds every failure of a long run: the whole output beside it.
        whole = Path(tempfile.gettempdir()) / f"readme_times-{name}.log"
        whole.write_text(out)
        print(f"{name}: exit {proc.returncode}; its whole output: {whole}", flush=True)
    return part


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


def _counted(c: dict[str, int]) -> str:
    return ", ".join(f"{c[k]} {k}" for k in ("passed", "failed", "error", "skipped", "xfailed", "deselected") if c.get(k))


def render_sessions(data: dict[str, Any], names: list[str]) -> str:
    """docs/setup.md's table of every nox session's wall time, from the JSON."""
    sessions = data.get("sessions", {})
    rows = ["| session | wall time | 1-minute load during the run (min / median / max) | what ran | measured on |",
            "| --- | --- | --- | --- | --- |"]
    for name in names:
        part = sessions.get(name)
        if part is None:
            rows.append(f"| `nox -s {name}` | not measured yet | | "
                        f"`python benchmarks/readme_times.py --sessions {name} --write` | |")
            continue
        ld = part["load_during"]
        what = [f"`{part['nox']}`"]
        if part.get("points") is not None:
            what.append(words_count(part["points"], "point"))
        if part.get("counts"):
            what.append(_counted(part["counts"]))
        if not part["ok"]:
            what.append(f"**exited {part['exit']}**" + (f" ({exit_why(part)})" if exit_why(part) else ""))
        if part.get("note"):
            what.append(part["note"])
        m = part["machine"]
        rows.append(f"| `nox -s {name}` | {part['wall_s']:.0f} s | {ld['min']:.1f} / {ld['median']:.1f} / {ld['max']:.1f} | "
                    f"{'; '.join(what)} | {m['nproc']}-core {m['cpu']}, torch {m['torch']}, {part['date']}, "
                    f"{part.get('commit') or 'commit not recorded'} |")
    lead = ("Measured with `python benchmarks/readme_times.py --sessions NAME --write` (the command each "
            "session runs, read from noxfile.py, with the shared environment built; TMP is a fresh folder). "
            "The load is the machine's 1-minute load average sampled every 5 s through the run, the "
            "session's own load included; on 2 cores a load above 2 means processes waited for a core, "
            "and the times grow with it.")
    glued = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", "\x00"), lead)
    lead = textwrap.fill(glued, width=78, break_on_hyphens=False, break_long_words=False).replace("\x00", " ")
    return lead + "\n\n" + "\n".join(rows)


def exit_why(part: dict[str, Any]) -> str:
    """What a session that exited otherwise than nox accepts said, in a few
    words: compare's non-zero counts (`unverified=159 of 400 rows`)."""
    m = re.search(r"^summary: (.*) -> FAIL$", part.get("tail", ""), re.M)
    if not m:
        return ""
    counts = dict(re.findall(r"([\w-]+)=(\d+)", m.group(1)))
    bad = [f"{k}={v}" for k, v in counts.items() if v != "0" and k not in ("points", "rows", "joined")]
    return ", ".join(bad) + (f" of {counts['rows']} rows" if "rows" in counts else "")


def words_count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def rendered_setup(doc: str, data: dict[str, Any], names: list[str]) -> str:
    if not SESSIONS_BLOCK.search(doc):
        raise SystemExit("docs/setup.md has no <!-- nox_times --> block")
    return SESSIONS_BLOCK.sub(lambda m: m.group(1) + render_sessions(data, names) + m.group(3), doc)


def sessions_block(doc: str) -> str | None:
    m = SESSIONS_BLOCK.search(doc)
    return m.group(2) if m else None


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
    ap.add_argument("--sessions", help="time these nox sessions (comma-separated, or `all`) into "
                    "nox_times.json and docs/setup.md instead of the README's two figures; the others keep theirs")
    ap.add_argument("--sessions-json", type=Path, default=SESSIONS_JSON)
    ap.add_argument("--setup-doc", type=Path, default=SETUP_DOC)
    ap.add_argument("--no-doc", action="store_true", help="with --sessions --write: the JSON only")
    args = ap.parse_args(argv)

    if args.render or args.check:
        data = json.loads(args.json.read_text())
        old = args.readme.read_text()
        new = rendered_readme(old, data)
        sdata = json.loads(args.sessions_json.read_text()) if args.sessions_json.exists() else {}
        old_setup = args.setup_doc.read_text()
        new_setup = rendered_setup(old_setup, sdata, session_names())
        if args.check:
            stale = [str(p) for p, a, b in ((args.readme, old, new), (args.setup_doc, old_setup, new_setup)) if a != b]
            if stale:
                print(f"{', '.join(stale)} out of date with the committed times: run {Path(__file__).name} --render")
                return 1
            return 0
        args.readme.write_text(new)
        args.setup_doc.write_text(new_setup)
        return 0

    if args.sessions:
        return main_sessions(args)

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


def main_sessions(args: argparse.Namespace) -> int:
    known = session_names()
    wanted = known if args.sessions == "all" else [n.strip() for n in args.sessions.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in known]
    if unknown:
        print(f"no nox session {unknown[0]!r} (noxfile.py has {', '.join(known)})", file=sys.stderr)
        return 2
    # report and compare read the matrix session's results: measured after it,
    # or after an untimed sweep of their own when matrix is not measured now.
    wanted = [n for n in known if n in wanted]
    data: dict[str, Any] = json.loads(args.sessions_json.read_text()) if args.sessions_json.exists() else {}
    data.setdefault("sessions", {})
    where = {"machine": machine(), "date": dt.date.today().isoformat(), "commit": _commit()}
    failed = []
    with tempfile.TemporaryDirectory(prefix="nox-times-") as tmp:
        results = f"{tmp}/run"
        if any(n in ("report", "compare") for n in wanted) and "matrix" not in wanted:
            print("an untimed default sweep first, for report and compare to read", flush=True)
            argv, env, _ = session_command("matrix", [f"results_dir={results}"])
            subprocess.run(argv, cwd=REPO, env={**os.environ, **env}, capture_output=True, check=False)
        for name in wanted:
            part = {**measure_session(name, tmp, results), **where}
            print(f"{name}: {part['wall_s']} s, exit {part['exit']}, load {part['load_during']}", flush=True)
            if not part["ok"]:
                failed.append(name)
                print(part["tail"], flush=True)
            data["sessions"][name] = part
            if args.write:  # each as it is measured: an hour's run cut short keeps what it had
                args.sessions_json.parent.mkdir(parents=True, exist_ok=True)
                args.sessions_json.write_text(json.dumps(data, indent=1) + "\n")
                if not args.no_doc:
                    args.setup_doc.write_text(rendered_setup(args.setup_doc.read_text(), data, known))
    if not args.write:
        print("nothing written (--write records these figures in the JSON and docs/setup.md)")
    if failed:
        print(f"sessions that did not exit as nox accepts: {', '.join(failed)} (recorded, marked in the table)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
