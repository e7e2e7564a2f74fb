"""nox sessions: `nox -s tests` (what CI runs), `nox -s matrix`, `report`, `compare`, `bench`.

torch comes first, from one overridable spec, because an unpinned `torch`
resolves to a multi-GB CUDA build on a CPU machine. GPU users pick their build:
  NSA_TORCH_SPEC="torch==2.11.0" nox -s matrix -- ...
(with pip's index options in PIP_INDEX_URL / PIP_EXTRA_INDEX_URL as needed).
"""

from __future__ import annotations

import os

import nox

TORCH_SPEC = os.environ.get("NSA_TORCH_SPEC", "torch==2.13.0")

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True


def _install(session: nox.Session, extras: str = "") -> None:
    session.install(TORCH_SPEC)
    # Editable: the Hydra app finds conf/ next to its sources.
    session.install("-e", f".{extras}")


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite on CPU (gloo ranks); posargs go to pytest."""
    _install(session, "[test]")
    # -n auto, capped: each xdist worker keeps warm rank pools (~225 MB a rank,
    # up to 18 ranks a worker), which a 64-core box would multiply past its RAM.
    args = session.posargs or ["-n", "auto", "--maxprocesses=4", "-q"]
    code = session.run("pytest", *args, success_codes=[0, 5])
    # Exit 5 = pytest collected nothing: fine for a filtered run (-k/-m),
    # a broken suite for the bare one that CI runs.
    if code == 5 and not session.posargs:
        session.error("pytest collected no tests")


@nox.session
def matrix(session: nox.Session) -> None:
    """The default sweep on CPU, results under results/; posargs are Hydra overrides."""
    _install(session)
    overrides = session.posargs or ["+matrix=default"]
    if not any(o.startswith(("+matrix=", "matrix=")) for o in overrides):
        overrides = ["+matrix=default", *overrides]
    session.run("python", "-m", "matrix", "-m", *overrides)


@nox.session
def report(session: nox.Session) -> None:
    """`nox -s report -- RESULTS [--out DIR]`: tables and plots of a results run."""
    _install(session)
    session.run("python", "-m", "matrix.report", *session.posargs)


@nox.session
def compare(session: nox.Session) -> None:
    """`nox -s compare -- BASE NEW [--metric M] [--fail-above 5%]`: the regression gate."""
    _install(session)
    session.run("python", "-m", "matrix.compare", *session.posargs)


@nox.session
def harness(session: nox.Session) -> None:
    """Points per minute of the matrix harness, cold vs warm ranks."""
    _install(session)
    session.run("python", "benchmarks/harness_speed.py", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """`nox -s bench -- [--quick] [--device cpu|cuda] [--out FILE.json]`: the comm benchmark (PERF.md)."""
    _install(session)
    session.run("python", "benchmarks/bench_comm.py", *session.posargs)
