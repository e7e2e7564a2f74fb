"""nox sessions, all in one shared environment: `nox -s tests` and `nox -s slow`
(what CI runs), `fuzz`, `matrix`, `report`, `compare`, `harness`, `bench`."""

# Every session runs in ONE environment, `.nox/_shared`: torch is a ~1 GB
# install, and a virtualenv per session made each session's first call pay for
# it again (and the disk hold it once per session). The sessions use
# `venv_backend="none"` and run that environment's python. It is built on first
# use (uv when available: seconds; else venv + pip) and reused while a stamp of
# its inputs (pyproject.toml, the torch spec and index, the interpreter) is
# unchanged, so later sessions start without running an installer. Delete
# `.nox/_shared` to rebuild it from scratch.
#
# torch comes first, from one overridable spec, because an unpinned `torch`
# resolves to a multi-GB CUDA build on a CPU machine:
#   NSA_TORCH_SPEC   what to install (default `torch==2.13.0`); GPU users pick
#                    their build, e.g. NSA_TORCH_SPEC="torch==2.11.0"
#   NSA_TORCH_INDEX  an extra index URL for torch only (default empty: pip's own
#                    configuration); on a CPU-only machine with internet,
#                    PyTorch's CPU wheel index (the `.../whl/cpu` URL of
#                    pytorch.org's install selector) gives the CPU build.
# Installer settings (find-links, indexes, constraints) come from pip's
# configuration (`pip config list`, PIP_* variables); uv, which reads none of
# it, is handed the same ones.

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nox
import nox.command

ROOT = Path(__file__).resolve().parent
# The one environment every session runs in.
SHARED_ENV = ROOT / ".nox" / "_shared"
STAMP = SHARED_ENV / "nsa-env-stamp.json"
# Bump when the build recipe below changes in a way the stamp cannot see.
RECIPE = "3"

TORCH_SPEC = os.environ.get("NSA_TORCH_SPEC", "torch==2.13.0")
TORCH_INDEX = os.environ.get("NSA_TORCH_INDEX", "").strip()
# One set of extras for all sessions: the test extra is small next to torch,
# and one environment means one install.
EXTRAS = "[test]"
# What `nox -s tests` hands pytest when given no arguments (also read by
# benchmarks/readme_times.py, which times exactly this run). -n auto, capped:
# each xdist worker keeps warm rank pools (~225 MB a rank, up to 18 ranks a
# worker), which a 64-core box would multiply past its RAM. `auto` is one more
# worker than CPUs (tests/conftest.py pytest_xdist_auto_num_workers): the
# tests wait on their ranks and fresh interpreters much of the time.
# `--dist loadgroup`: the tests on warm rank pools share one worker
# (tests/conftest.py), so the pools start once.
PYTEST_ARGS = ("-n", "auto", "--maxprocesses=4", "--dist", "loadgroup", "-q", "-m", "not slow")
# `nox -s slow`: the slow set (tests/conftest.py SLOW), which .ci/run runs too.
# Four workers whatever the CPUs: its tests are fresh interpreters, sweeps and
# drills that wait on their children, and the longest (tests/conftest.py
# LONGEST) start first; on 2 cores four finish it sooner than three. `-v`:
# each test's line as it finishes (its minutes are otherwise a row of dots).
SLOW_ARGS = ("-n", "4", "--dist", "loadgroup", "-v", "-m", "slow")

nox.options.sessions = ["tests"]


# --- the shared environment -------------------------------------------------


def _env_python(env: Path = SHARED_ENV) -> Path:
    if os.name == "nt":
        return env / "Scripts" / "python.exe"
    return env / "bin" / "python"


def stamp(pyproject: bytes, torch_spec: str, torch_index: str, interpreter: str) -> str:
    """What the environment was built from; any change means reinstall."""
    h = hashlib.sha256()
    for part in (RECIPE.encode(), pyproject, torch_spec.encode(), torch_index.encode(), interpreter.encode()):
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()


def _current_stamp() -> str:
    return stamp((ROOT / "pyproject.toml").read_bytes(), TORCH_SPEC, TORCH_INDEX, os.path.realpath(sys.executable))


def _pip_config_lines() -> list[str]:
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return out.splitlines()


def pip_settings(config_lines: list[str], environ: dict[str, str]) -> dict[str, list[str]]:
    """pip's effective installer settings: {option: [values]}, from `pip config
    list` lines (`global.find-links='/x'`, `:env:.find-links='/x'`) and PIP_*
    variables. The most specific source wins per option, as in pip: the
    environment, then an [install] section, then [global]."""
    rank = {":env:": 3, "install": 2, "global": 1}
    best: dict[str, tuple[int, str]] = {}
    for line in config_lines:
        key, sep, value = line.partition("=")
        if not sep:
            continue
        section, _, option = key.strip().rpartition(".")
        if section not in rank:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if rank[section] >= best.get(option, (0, ""))[0]:
            best[option] = (rank[section], value)
    for name, value in environ.items():
        if name.startswith("PIP_"):
            best[name[4:].lower().replace("_", "-")] = (rank[":env:"], value)
    return {option: value.split() for option, (_, value) in best.items()}


def uv_args(settings: dict[str, list[str]]) -> list[str]:
    """pip's installer settings as `uv pip install` options. uv reads none of
    pip's configuration, so without these it would miss a wheel folder or a
    mirror that pip uses here."""
    args: list[str] = []
    for option, flag in (
        ("index-url", "--index-url"),
        ("extra-index-url", "--extra-index-url"),
        ("find-links", "--find-links"),
        ("constraint", "--constraint"),
        ("trusted-host", "--allow-insecure-host"),
    ):
        for value in settings.get(option, []):
            args += [flag, value]
    if settings.get("no-index", ["0"])[0].lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
    # pip picks the best version over all its sources; uv's default takes the
    # first index that has the package, which can be a mirror holding only a
    # CUDA torch while the wheel folder has the CPU build.
    args += ["--index-strategy", "unsafe-best-match"]
    return args


def _find_uv() -> str | None:
    found = shutil.which("uv")
    if found:
        return found
    with contextlib.suppress(Exception):  # nox[uv] puts uv next to nox
        from nox.virtualenv import find_uv

        ok, path = find_uv()[:2]
        if ok and path and Path(path).exists():
            return str(path)
    return None


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Two nox calls at once (two terminals, two engineers) must not build the
    environment over each other: the second waits, then finds it up to date."""
    SHARED_ENV.parent.mkdir(parents=True, exist_ok=True)
    with open(SHARED_ENV.parent / "_shared.lock", "w") as fh:
        try:
            import fcntl
        except ImportError:  # no flock on Windows: unguarded
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _torch_args() -> list[str]:
    args = shlex.split(TORCH_SPEC)
    return [*args, "--extra-index-url", TORCH_INDEX] if TORCH_INDEX else args


def _build_with_uv(session: nox.Session, uv: str, fresh: bool) -> None:
    py = str(_env_python())
    if fresh:
        session.run(uv, "venv", "--quiet", "--python", sys.executable, str(SHARED_ENV), external=True)
    settings = pip_settings(_pip_config_lines(), dict(os.environ))
    extra = uv_args(settings)
    env = {}
    if settings.get("cert") and "SSL_CERT_FILE" not in os.environ:
        env["SSL_CERT_FILE"] = settings["cert"][0]
    # Bytecode at install, as pip does: uv leaves it to the first import, and
    # where PYTHONDONTWRITEBYTECODE is set (CI images) every rank process would
    # compile torch from source at each start (slower, and a higher peak RSS).
    install = [uv, "pip", "install", "--python", py, *extra, "--compile-bytecode"]
    # torch first, alone: the project's `torch>=2.4` must find it installed
    # rather than resolve a build of its own.
    session.run(*install, *_torch_args(), external=True, env=env)
    # pip too, as venv gives it: the docs' `pip install` must reach this
    # environment once it is activated, not another Python.
    session.run(*install, "-e", f"{ROOT}{EXTRAS}", "pip", external=True, env=env)


def _build_with_pip(session: nox.Session, fresh: bool) -> None:
    py = str(_env_python())
    if fresh:
        shutil.rmtree(SHARED_ENV, ignore_errors=True)
        session.run(sys.executable, "-m", "venv", str(SHARED_ENV), external=True)
    # pip reads its own configuration (find-links, indexes, constraints).
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    session.run(*pip, *_torch_args(), external=True)
    session.run(*pip, "-e", f"{ROOT}{EXTRAS}", external=True)


def _read_stamp() -> dict:
    try:
        return json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return {}


def shared_python(session: nox.Session) -> str:
    """The shared environment's python, built or updated first when its stamp
    is stale. Also puts the environment first on the session's PATH."""
    want = _current_stamp()
    interpreter = os.path.realpath(sys.executable)
    py = _env_python()
    with _locked():
        old = _read_stamp()
        if old.get("stamp") == want and py.exists():
            session.log(f"shared environment {SHARED_ENV.relative_to(ROOT)} is up to date")
        else:
            # Same interpreter and recipe: install over what is there (pip and
            # uv skip what is already satisfied). Another interpreter or
            # recipe, or a build that never finished (no stamp): start clean.
            fresh = not py.exists() or old.get("interpreter") != interpreter or old.get("recipe") != RECIPE
            STAMP.unlink(missing_ok=True)
            if fresh and SHARED_ENV.exists():
                shutil.rmtree(SHARED_ENV)
            uv = _find_uv()
            built_by = "pip"
            if uv:
                try:
                    _build_with_uv(session, uv, fresh)
                    built_by = "uv"
                except nox.command.CommandFailed:
                    session.warn("uv could not build the shared environment; falling back to venv + pip")
                    fresh = True
            if built_by == "pip":
                # uv makes environments without pip: one it built cannot be
                # updated in place by pip.
                _build_with_pip(session, fresh or old.get("built_by") != "pip")
            record = {"stamp": want, "recipe": RECIPE, "interpreter": interpreter, "torch_spec": TORCH_SPEC,
                      "torch_index": TORCH_INDEX, "built_by": built_by}
            STAMP.write_text(json.dumps(record, indent=1) + "\n")
    session.env["VIRTUAL_ENV"] = str(SHARED_ENV)
    session.env["PATH"] = os.pathsep.join([str(py.parent), os.environ.get("PATH", "")])
    return str(py)


# What every session's command runs with. Bytecode for the checkout (its
# __pycache__ folders are ignored by git) where PYTHONDONTWRITEBYTECODE is set
# (CI images): without it pytest rewrites every test module's asserts in every
# xdist worker at every run (3-4 CPU-s a worker, about 5% of the fast set on 2
# cores) and each fresh interpreter compiles the project's modules again.
# Empty is unset.
SESSION_ENV = {"PYTHONDONTWRITEBYTECODE": ""}


def _run(session: nox.Session, *args: str, env: dict[str, str] | None = None, **kwargs) -> None:
    session.run(shared_python(session), *args, external=True, env={**SESSION_ENV, **(env or {})}, **kwargs)


# --- sessions ---------------------------------------------------------------


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Run the test suite on CPU (gloo ranks), hypothesis on its bounded `ci`
    profile; posargs go to pytest."""
    # pytest's exit 5 (collected nothing) is a broken suite for the bare run
    # that CI does, but fine for a run the user filtered (-k/-m).
    codes = [0, 5] if session.posargs else [0]
    _run(session, "-m", "pytest", *(session.posargs or PYTEST_ARGS), success_codes=codes)


@nox.session(venv_backend="none")
def slow(session: nox.Session) -> None:
    """The slow set: fault drills, torch's own behaviour, whole sweeps in fresh
    interpreters (tests/conftest.py SLOW); posargs go to pytest."""
    codes = [0, 5] if session.posargs else [0]
    _run(session, "-m", "pytest", *(session.posargs or SLOW_ARGS), success_codes=codes)


@nox.session(venv_backend="none")
def fuzz(session: nox.Session) -> None:
    """The hypothesis property tests (marker `fuzz`) on the long `fuzz` profile,
    one process, stopping at the first counterexample; posargs go to pytest."""
    codes = [0, 5] if session.posargs else [0]
    args = ("-m", "pytest", "-m", "fuzz", "-p", "no:xdist", "-x", "-q", *session.posargs)
    _run(session, *args, env={"HYPOTHESIS_PROFILE": "fuzz"}, success_codes=codes)


def matrix_overrides(posargs: list[str]) -> list[str]:
    """`python -m matrix` arguments of `nox -s matrix -- POSARGS`: the default
    preset unless one is named."""
    overrides = list(posargs) or ["+matrix=default"]
    if not any(o.startswith(("+matrix=", "matrix=")) for o in overrides):
        overrides = ["+matrix=default", *overrides]
    # The presets set hydra.mode=MULTIRUN themselves; -m on top is harmless to
    # Hydra and still sweeps a preset of the user's own that does not set it.
    # Once only: a user's own -m is kept as given.
    if not any(o in ("-m", "--multirun") for o in overrides):
        overrides = ["-m", *overrides]
    return overrides


@nox.session(venv_backend="none")
def matrix(session: nox.Session) -> None:
    """The default sweep on CPU, results under results/; posargs are Hydra overrides."""
    _run(session, "-m", "matrix", *matrix_overrides(session.posargs))


@nox.session(venv_backend="none")
def report(session: nox.Session) -> None:
    """`nox -s report -- RESULTS [--out DIR]`: tables and plots of a results run."""
    _run(session, "-m", "matrix.report", *session.posargs)


@nox.session(venv_backend="none")
def compare(session: nox.Session) -> None:
    """`nox -s compare -- BASE NEW [--metric M] [--fail-above 5%] [--allow-missing] [--all]`: the regression gate."""
    _run(session, "-m", "matrix.compare", *session.posargs)


@nox.session(venv_backend="none")
def harness(session: nox.Session) -> None:
    """Points per minute of the matrix harness, cold vs warm ranks."""
    _run(session, str(ROOT / "benchmarks" / "harness_speed.py"), *session.posargs)


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """`nox -s bench -- [--quick] [--device cpu|cuda] [--out FILE.json]`: the comm benchmark (PERF.md)."""
    _run(session, str(ROOT / "benchmarks" / "bench_comm.py"), *session.posargs)
