"""Check every point of a command line's sweep before Hydra starts anything.

Hydra composes a job's config only when the job starts, so a value that is
fine alone but wrong with another key (``align=3`` with ``cp_size=2``), a
point this machine cannot run (``backend=nccl`` with more ranks than GPUs), a
sweep beyond the machine's memory or time (matrix.app.budget) or a results file of
another schema would otherwise surface mid-sweep, after other points wrote
rows. :func:`points` expands the sweep as Hydra's basic sweeper does (the
cartesian product of every swept key, in command-line order, through Hydra's
public override parser; one compose per distinct choice of config groups;
plain keys set on a copy, as Hydra applies them after the defaults) and
:func:`preflight` resolves each once (matrix.app.resolve) and runs
:func:`matrix.app.point.run`'s checks on it: the sweep fails in one line, with
nothing written. With a remote launcher (``hydra/launcher=slurm``) the
machine checks are left to the job, on the machine that runs the point.
"""

from __future__ import annotations

import copy
import itertools
import os
from datetime import datetime
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from .config import KEYS, ConfigError, check_point_count, register, validate
from .. import CONF_DIR
from ..store.folder import Folder

if TYPE_CHECKING:
    from .resolve import Resolved

# Launchers whose jobs run on this machine: the machine checks apply here.
LOCAL_LAUNCHERS = (
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
)
MULTIRUN_FLAGS = ("-m", "--multirun")


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    msg = lines[0] if lines else type(exc).__name__
    hint = next((ln for ln in lines[1:] if ln.startswith("To append")), "")
    msg += f" ({hint[0].lower()}{hint[1:]})" if hint else ""
    if "Available options" in str(exc):
        start = next(i for i, ln in enumerate(lines) if ln.startswith("Available options"))
        opts = [ln for ln in lines[start + 1 :] if ":" not in ln and "=" not in ln]
        msg += f" (options: {', '.join(opts)})" if opts else ""
    if "submitit" in msg:
        msg += " (the SLURM launcher is optional: pip install -e '.[slurm]')"
    return msg


@contextmanager
def _hydra_errors(what: str) -> Iterator[None]:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"{what}: {_one_line(exc)}") from None


def _is_plain(ov: Any) -> bool:
    return ov.package is None and ov.key_or_group in KEYS and not ov.is_delete()


def sweep_clock(start: datetime) -> None:
    """Make ``${now:...}`` resolve to one instant for every point composed from
    here on: the sweep's ``start``. Hydra's own resolver reads the clock anew for
    every config it resolves, so the points of one sweep straddling a second
    would name different results folders."""
    OmegaConf.register_new_resolver("now", lambda pattern: start.strftime(pattern), use_cache=False, replace=True)


def points(argv: list[str], *, start: datetime | None = None) -> Iterator[tuple[dict[str, Any], bool]]:
    """``(config, runs_here)`` of every point ``python -m matrix ARGV`` would run,
    composed without running anything; ``runs_here``: the launcher is local.
    ``${now:...}`` resolves to ``start`` (default: the first call's time) in
    every point. Raises ConfigError for a command line Hydra cannot compose.
    Yields nothing for flags it does not model (``--help``, ``--cfg``,
    ``-cn``...): Hydra's."""
    start = start or datetime.now()
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    flags = [a for a in argv if a.startswith("-")]
    if any(f not in MULTIRUN_FLAGS for f in flags):
        return
    parser = OverridesParser.create()
    with _hydra_errors("cannot parse overrides"):
        parsed = parser.parse_overrides([a for a in argv if not a.startswith("-")])
    hydra_ovs = [ov for ov in parsed if ov.is_hydra_override()]
    task_ovs = [ov for ov in parsed if not ov.is_hydra_override()]
    if any(ov.is_sweep_override() for ov in hydra_ovs):
        return  # Hydra refuses these itself, in its own words
    hydra_lines = [ov.input_line for ov in hydra_ovs]

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="matrix"):
        sweep_clock(start)  # after Hydra registered its own resolvers
        fixed = [ov.input_line for ov in parsed if not ov.is_sweep_override()]
        with _hydra_errors("cannot compose the config"):
            primary = compose("config", overrides=fixed, return_hydra_config=True)
        # A sweep: -m, or a preset that sets Hydra's own hydra.mode: MULTIRUN.
        multirun = bool(flags) or str(OmegaConf.select(primary, "hydra.mode", default="")).endswith("MULTIRUN")
        if not multirun:
            swept = next((ov for ov in task_ovs if ov.is_sweep_override()), None)
            if swept is not None:
                raise ConfigError(f"{swept.input_line}: a sweep needs -m (--multirun)")
        target = OmegaConf.select(primary, "hydra.launcher._target_", default="")
        runs_here = target in LOCAL_LAUNCHERS
        params = OmegaConf.select(primary, "hydra.sweeper.params", default=None) or {}
        lines = [f"{k}={v}" for k, v in params.items()] if multirun else []
        lines += [ov.input_line for ov in task_ovs]
        _one_source_of_the_split(lines)
        with _hydra_errors("cannot parse the sweep"):
            jobs = expand(parser.parse_overrides(lines))
        composed: dict[tuple[str, ...], DictConfig] = {}
        for job in jobs:
            with _hydra_errors("cannot compose the config"):
                job_ovs = parser.parse_overrides(job)
                groups = tuple(hydra_lines + [ov.input_line for ov in job_ovs if not _is_plain(ov)])
                if groups not in composed:
                    composed[groups] = compose("config", overrides=list(groups))
                cfg = copy.deepcopy(composed[groups])
                for ov in job_ovs:
                    if _is_plain(ov):
                        OmegaConf.update(cfg, ov.key_or_group, ov.value(), merge=False)
                plain = OmegaConf.to_container(cfg, resolve=True)
            assert isinstance(plain, dict)
            yield plain, runs_here


JOB_ENV = "hydra.job.env_set."


def job_env(argv: list[str]) -> dict[str, str]:
    """The variables the command line sets for its jobs (``hydra.job.env_set.K=V``)."""
    sets = (a.lstrip("+").removeprefix(JOB_ENV) for a in argv if a.lstrip("+").startswith(JOB_ENV))
    return dict(entry.split("=", 1) for entry in sets if "=" in entry)


def _one_source_of_the_split(lines: list[str]) -> None:
    """ConfigError (one line) where a plan class and a layout would both set
    the split: the plan class sets ``split``, ``page_size`` and ``seq_lens``
    for its class in the point's engine's own split, and replaced the
    layout's without a word."""
    groups = {line.split("=", 1)[0].lstrip("+~"): line for line in lines if "=" in line}
    if "plan_class" in groups and "layout" in groups:
        raise ConfigError(f"{groups['plan_class']} and {groups['layout']}: a plan class sets the split, page size "
                          "and request lengths of its class (in the engine's own split), so the layout would be "
                          "replaced: drop one (engine= picks the split a plan class uses)")


def expand(overrides: list[Any]) -> list[list[str]]:
    """The sweep's jobs: each job's override lines. The cartesian product of
    every swept key's values, the first key varying slowest and a later
    override of the same key replacing an earlier one, as Hydra's basic
    sweeper orders its jobs. ConfigError (one line) for a sweep of more than
    :data:`.config.MAX_POINTS`, counted before any job is listed."""
    for ov in overrides:
        if ov.is_sweep_override() and not ov.is_discrete_sweep():
            raise ConfigError(f"{ov.input_line}: only discrete sweeps (a,b,c or range(...)) can be run")
    check_point_count(overrides)
    by_key: dict[str, list[str]] = {}
    for ov in overrides:
        key = ov.get_key_element()
        if ov.is_sweep_override():
            by_key[key] = [f"{key}={v}" for v in ov.sweep_string_iterator()]
        else:
            by_key[key] = [f"{key}={ov.get_value_element_as_str()}"]
    return [list(combo) for combo in itertools.product(*by_key.values())]


@dataclass(frozen=True)
class Point:
    """One point of a sweep as preflight sees it."""

    cfg: dict[str, Any]
    runs_here: bool
    resolved: Resolved  # for this machine where the point runs here, else for a node (resolve_remote)


def preflight(argv: list[str], *, budget: bool = True, start: datetime | None = None) -> list[Point]:
    """Check every point of the command line; raise ConfigError or SchemaError
    (one line) for the first bad one, or (``budget``) for a sweep beyond this
    machine (:func:`check_machine`). Returns the points, resolved, with
    ``${now:...}`` taken at ``start`` (default: now) in all of them."""
    from nsa_cp_comm.harness.switches import check_switches

    from .resolve import resolve, resolve_remote  # imports torch: after the cheap checks

    try:  # the harness's on/off switches: one line before anything runs, not an error row per point
        check_switches()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    found: list[Point] = []
    schemas: set[str] = set()
    machine = None
    # the jobs run with Hydra's hydra.job.env_set on top of this environment: checked as they will see it
    environ = {**os.environ, **job_env(argv)}
    for cfg, runs_here in points(argv, start=start):
        validate(cfg, environ)
        if runs_here:  # the machine's rank limit, before the point is planned
            from .budget import check_world, this_machine

            machine = machine or this_machine()
            check_world(cfg, machine)
        found.append(Point(cfg, runs_here, resolve(cfg) if runs_here else resolve_remote(cfg)))
        if cfg["results_dir"] not in schemas:
            schemas.add(cfg["results_dir"])
            Folder.of(cfg["results_dir"]).check()
    check_declared_names(found)
    if budget:
        check_machine(found)
    return found


def check_declared_names(points: list[Point]) -> None:
    """Refuse (ConfigError, one line) a sweep in which two implementations'
    rows would carry one name: two references that declare it, run in
    different jobs (within one point their rows keep their references,
    :func:`.point.row_names`). A reader keeps one row per point and name
    (the last): the other's verdict, a failure included, would be lost."""
    from nsa_cp_comm import impls

    from .point import row_names

    def steps(name: str) -> tuple:  # what it runs: one implementation asked by two names runs the same
        impl = impls.get(name)
        return tuple(id(getattr(impl, part, None)) for part in ("gather", "scatter", "dispatch", "combine"))

    refs: dict[str, set[str]] = {}
    for p in points:
        for ref, shown in row_names(list(p.resolved.impls)).items():
            refs.setdefault(shown, set()).add(ref)
    for shown, named in refs.items():
        if len({steps(n) for n in named}) > 1:
            raise ConfigError(f"impl={','.join(sorted(named))}: each declares the name {shown!r}, so their rows would "
                              "carry one name and a reader could not tell them apart; give each its own name "
                              "(RoundTripImpl(name=...))")


@contextmanager
def composed_once(points: list[Point]) -> Iterator[None]:
    """Within: Hydra's sweeper launches the jobs without composing each one
    first, when preflight has composed every one of them (``points``).

    Hydra's sweepers compose every job of a batch before launching any
    (``Sweeper.validate_batch_is_legal``), and the launcher composes each
    again as it starts: two composes a job, ~0.2 s each on a CPU core (about
    30 s of the default sweep's 160 points). Preflight composed the same jobs
    already, failing in one line before anything ran; the second check only
    costs time. The launcher's composes are reused across jobs that differ
    only in plain keys (:mod:`.compose_cache`). With no points (flags
    preflight does not model: Hydra's own), nothing changes."""
    from hydra.plugins.sweeper import Sweeper

    from .compose_cache import reuse_composes

    if not points:
        yield
        return
    checked = Sweeper.validate_batch_is_legal
    Sweeper.validate_batch_is_legal = lambda self, batch: None  # type: ignore[method-assign]
    try:
        with reuse_composes():
            yield
    finally:
        Sweeper.validate_batch_is_legal = checked  # type: ignore[method-assign]


def check_machine(points: list[Point]) -> None:
    """Refuse (ConfigError, one line) a sweep beyond the machine its points run
    on: this one, or with a remote launcher what no node holds (matrix.app.budget)."""
    if points:
        from .budget import check_sweep

        check_sweep([p.resolved for p in points], runs_here=points[0].runs_here)
