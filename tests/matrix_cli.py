"""Running the real matrix CLI (``python -m matrix``) from tests."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cli_env(**extra: str) -> dict[str, str]:
    """This environment with the checkout first on the path (and ``extra`` set)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO), env.get("PYTHONPATH", "")])
    env.pop("HYDRA_FULL_ERROR", None)
    env.update(extra)
    return env


def under_load(timeout: float) -> tuple[float, str]:
    """``(seconds, why)``: a test's own wait of ``timeout`` idle seconds scaled
    by the machine's load now, as the matrix scales its ranks' start bound
    (matrix.app.budget.load_factor), and the words a timeout's failure says."""
    from matrix.app.budget import load_factor
    from nsa_cp_comm.harness.machine import this_machine

    machine = this_machine()
    factor, load = load_factor(machine)
    return timeout * factor, (f"{timeout:g} s idle x {factor:.1f} for the 1-minute load {load:.1f} on "
                              f"{machine.cores} cores")


def run(argv: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, timeout=...)`` with the wait :func:`under_load`
    scales; running past it fails the test naming the load it ran at."""
    seconds, why = under_load(timeout)
    try:
        return subprocess.run(argv, timeout=seconds, **kwargs)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{' '.join(map(str, argv))[:300]} ran past {seconds:.0f} s ({why})") from None


def run_python(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """``python args`` (this interpreter) in ``cwd``, its output captured; ``env``: :func:`cli_env` unless given;
    ``timeout``: idle seconds, scaled by the load (:func:`run`)."""
    return run([sys.executable, *args], timeout, cwd=cwd, env=cli_env() if env is None else env,
               capture_output=True, text=True)


@dataclass
class CliRun:
    returncode: int
    stdout: str
    stderr: str
    results_dir: Path

    @property
    def csv(self) -> Path:
        return self.results_dir / "results.csv"

    def rows(self) -> list[dict[str, str]]:
        with self.csv.open(newline="") as f:
            return list(csv.DictReader(f))


def config_of(**over) -> dict:
    """One point's config as a job gets it: the schema's defaults, ``over`` set
    (a results_dir nothing writes to, unless given)."""
    from matrix.app.config import MatrixConfig

    return {**asdict(MatrixConfig()), "results_dir": "/tmp/unused-results", **over}


def compose_config(*overrides: str):
    """The app's config composed by Hydra from ``overrides``, Hydra's own part included."""
    from hydra import compose, initialize_config_dir

    from matrix.app.config import register

    register()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def run_matrix(results_dir: Path, *overrides: str, multirun: bool = True, timeout: float = 240, cwd: Path = REPO,
               env: dict[str, str] | None = None) -> CliRun:
    """``python -m matrix [-m] results_dir=... overrides`` in ``cwd`` (the repo root), as :func:`run_python`."""
    args = ["-m", "matrix", *(["-m"] if multirun else []), f"results_dir={results_dir}", *overrides]
    proc = run_python(*args, cwd=cwd, env=env, timeout=timeout)
    return CliRun(proc.returncode, proc.stdout, proc.stderr, Path(results_dir))


def sweep_here(results_dir: Path, *overrides: str, monkeypatch, capsys, multirun: bool = True) -> CliRun:
    """``python -m matrix -m results_dir=... overrides`` (without ``-m``: one
    point, as a row's repro runs it) run in this process
    (the app's ``main``), for tests that check a sweep's rows, console and exit
    code rather than its process: the points run on real ranks as the CLI's
    do, without a fresh interpreter importing torch and Hydra first. The
    signal handlers and stdout guard, the process's own, are left as pytest
    has them (tests/app/test_hostile_sweeps.py drills those through the CLI)."""
    from matrix.app import guards
    from matrix.app.sweep import main

    monkeypatch.setattr(guards, "install", lambda: None)
    monkeypatch.setattr(guards, "guard", lambda: None)
    monkeypatch.setattr(sys, "argv", ["matrix"])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # main sets it; monkeypatch restores it after the test
    capsys.readouterr()
    code = main([*(["-m"] if multirun else []), f"results_dir={results_dir}", *overrides])
    out, err = capsys.readouterr()
    return CliRun(code, out, err, Path(results_dir))


def _sigint_default() -> None:
    # As a terminal's foreground job has it. A shell without job control starts
    # a background job (`cmd &`) with SIGINT ignored, which every child inherits:
    # a sweep started from such a test run would ignore the Ctrl-C under test.
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


# A point of sweep_in_background's takes seconds: its iterations' round trips
# are gloo's latency (about 4 ms at cp 2, whatever the rows), so ~150 of them
# and the checks are 3-4 s idle, longer loaded. A signal sent a second after a
# row lands while the sweep still runs. A test that must land inside one
# point, not between two, asks for MID_POINT_ITERS: with 150, a loaded CI run
# once signalled between points.
BACKGROUND_ITERS = 150
MID_POINT_ITERS = 400


def sweep_in_background(results_dir: Path, timeout: float = 180, iters: int = BACKGROUND_ITERS) -> subprocess.Popen:
    """A three-point sweep of long points started in its own session, returned
    once its first row is written (or it ended, or ``timeout`` passed): for
    tests that stop a sweep mid-point."""
    args = ["-m", "cp_size=2", "seq_lens=[64],[2000],[4000]", "hidden_size=64", f"iters={iters}",
            "warmup=0", f"results_dir={results_dir}"]
    proc = subprocess.Popen([sys.executable, "-m", "matrix", *args], cwd=REPO, env=cli_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=_sigint_default)
    deadline = time.monotonic() + under_load(timeout)[0]
    while not (results_dir / "results.csv").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    return proc


def live_processes(text: str) -> dict[int, str]:
    """``{pid: command line}`` of live (non-zombie) processes, other than this
    one, whose command line contains ``text``."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmd and state != "Z":
            found[int(entry)] = cmd.strip()
    return found


def processes_left(*texts: str, timeout_s: float = 30.0, but: Iterable[int] = ()) -> dict[int, str]:
    """The :func:`live_processes` of any of ``texts``, other than the pids in
    ``but``, still there after up to ``timeout_s``: ``{}`` once all ended."""
    deadline = time.monotonic() + timeout_s
    while (left := {pid: cmd for text in texts for pid, cmd in live_processes(text).items() if pid not in but}) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def read_table(path: Path) -> list[dict[str, str]]:
    """results.csv read strictly: the schema's header, then whole rows only."""
    from matrix.store.results import COLUMNS

    text = path.read_text()
    assert text.endswith("\n"), "a torn last line"
    rows = list(csv.reader(io.StringIO(text)))
    assert tuple(rows[0]) == COLUMNS
    assert all(len(r) == len(COLUMNS) for r in rows[1:]), [len(r) for r in rows[1:]]
    import pandas as pd

    frame = pd.read_csv(path)
    assert list(frame.columns) == list(COLUMNS) and len(frame) == len(rows) - 1
    return [dict(zip(COLUMNS, r)) for r in rows[1:]]
