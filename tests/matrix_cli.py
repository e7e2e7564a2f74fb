"""Running the real matrix CLI (``python -m matrix``) from tests."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO), env.get("PYTHONPATH", "")])
    env.pop("HYDRA_FULL_ERROR", None)
    return env


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


def run_matrix(results_dir: Path, *overrides: str, multirun: bool = True, timeout: float = 240) -> CliRun:
    """``python -m matrix [-m] results_dir=... overrides`` in the repo root."""
    cmd = [sys.executable, "-m", "matrix", *(["-m"] if multirun else []), f"results_dir={results_dir}", *overrides]
    proc = subprocess.run(cmd, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=timeout)
    return CliRun(proc.returncode, proc.stdout, proc.stderr, Path(results_dir))


def _sigint_default() -> None:
    # As a terminal's foreground job has it. A shell without job control starts
    # a background job (`cmd &`) with SIGINT ignored, which every child inherits:
    # a sweep started from such a test run would ignore the Ctrl-C under test.
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def sweep_in_background(results_dir: Path, timeout: float = 180) -> subprocess.Popen:
    """A three-point sweep of long points started in its own session, returned
    once its first row is written (or it ended, or ``timeout`` passed): for
    tests that stop a sweep mid-point."""
    import time

    args = ["-m", "cp_size=2", "seq_lens=[64],[2000],[4000]", "hidden_size=64", "iters=400", "warmup=0",
            f"results_dir={results_dir}"]
    proc = subprocess.Popen([sys.executable, "-m", "matrix", *args], cwd=REPO, env=cli_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=_sigint_default)
    deadline = time.monotonic() + timeout
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
