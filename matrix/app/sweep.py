"""``python -m matrix [-m] [--dry-run] key=value ...``: run matrix points (a Hydra app).

Thin on purpose: preflight expands and checks every point before Hydra starts
(one line and exit 2 for a bad value), ``--dry-run`` lists the points and
their estimated cost without starting a rank, each job runs one point
(matrix.app.point), and the closing summary is read back from the results files:
exit 1 when a point failed, errored, timed out or wrote no row, else 0.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from .. import command, count
from ..progress import Progress
from . import summary
from .config import ConfigError, register, validate_overrides
from ..store.inputs import error_line
from .preflight import CONF_DIR, MULTIRUN_FLAGS, Point, check_machine, composed_once, preflight
from ..store.results import SchemaError
from ..scale.workload import WorkloadError, expand_argv

register()
DRY_RUN_FLAG = "--dry-run"
SHOW_FLAGS = ("--cfg", "-c", "--info", "-i")
_ACTIVE: dict[str, object] = {}


def _config_key(cfg: Mapping[str, Any]) -> str:
    """One text per configuration: a job's config finds the point preflight resolved for it."""
    return json.dumps(cfg, sort_keys=True, default=str)


def task(machine_checked: bool, points: Sequence[Point] = ()) -> Callable[[], None]:
    """The Hydra app: each job runs one point. ``machine_checked``: preflight
    checked the sweep against the machine the jobs run on (a local launcher),
    so a job does not check again mid-sweep; a remote launcher's job checks
    the node it runs on."""

    # An absolute config path: the app also runs imported (matrix.__main__.main), not only as __main__.
    from .point import run as run_point  # imports torch: here, so that --help does not

    resolved = {_config_key(p.cfg): p.resolved for p in points if p.runs_here}

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
    def app(cfg: DictConfig) -> None:
        # Plain Python values from here on: ranks get pickled dataclasses, never
        # OmegaConf nodes.
        plain = OmegaConf.to_container(cfg, resolve=True)
        hc = HydraConfig.get()
        _ACTIVE["cfg"] = plain
        try:
            # the point as preflight validated and resolved it, where this job's config is one it checked
            rows = run_point(plain, job_dir=hc.runtime.output_dir, overrides=" ".join(hc.overrides.task),
                             machine_checked=machine_checked, resolved=resolved.get(_config_key(plain)),
                             show_traceback=single_point(points, _ACTIVE.get("argv", [])))
        except (ConfigError, SchemaError) as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        except OSError as exc:  # the results file could not be written (disk full, ...)
            print(f"error: {' '.join(str(exc).split())}; {_resume_hint()}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None
        _ACTIVE.pop("cfg", None)
        print(summary.live_line(plain, rows), flush=True)

    return app


def single_point(points: Sequence[Point], argv: Sequence[str]) -> bool:
    """One point run without -m, as a row's repro runs it: its summary says so, and where a rank
    raised, the traceback follows the row."""
    return len(points) == 1 and not any(a in MULTIRUN_FLAGS for a in argv)


def _resume_hint() -> str:
    argv = [a for a in _ACTIVE.get("argv", []) if not a.startswith("resume=")]  # type: ignore[union-attr]
    return "finish the sweep with: " + shlex.join([*command(), *argv, "resume=true"])


def _pin_results_dir(argv: list[str], points: list[Point]) -> list[str]:
    """Pin the results_dir preflight resolved, absolute: the default holds a
    timestamp, and a relative one would move with ``hydra.job.chdir=true``;
    so Hydra's jobs, the summary and a resume all use the same directory."""
    dirs = {p.cfg["results_dir"] for p in points}
    if len(dirs) != 1:
        return argv
    from pathlib import Path

    from .config import override_value

    given = dirs.pop()
    absolute = str(Path(given).expanduser().absolute())
    if absolute == given and any(a.split("=", 1)[0].lstrip("+~") == "results_dir" for a in argv if "=" in a):
        return argv
    for p in points:
        p.cfg["results_dir"] = absolute
    kept = [a for a in argv if not ("=" in a and a.split("=", 1)[0].lstrip("+~") == "results_dir")]
    return [*kept, f"results_dir={override_value(absolute)}"]


_NOW = re.compile(r"\$\{now:([^}]*)\}")


def freeze_now(argv: list[str], start: datetime) -> list[str]:
    """``${now:FORMAT}`` in the command line, written out at the sweep's start:
    Hydra resolves it anew in every job, so a sweep running past a second
    boundary would otherwise spread over several folders."""
    return [_NOW.sub(lambda m: start.strftime(m.group(1)), a) for a in argv]


def dry_run(points: list[Point]) -> str:
    """The sweep as it would run: one line per point, and the estimate."""
    from .point import effective_id

    lines = []
    seen: dict[str, int] = {}
    for i, p in enumerate(points):
        cfg, res = p.cfg, p.resolved
        what = summary.head(cfg).removeprefix("[matrix] ")
        if not p.runs_here:
            lines.append(f"{i:4d}  {what}: runs remotely ({cfg['impl']})")
            continue
        if res.skip:
            note = f"  -> skipped: {res.skip}"
        else:
            first = seen.setdefault(effective_id(res), i)
            note = f"  -> skipped: same effective configuration as point {first}" if first != i else ""
        lines.append(f"{i:4d}  {what}: {res.backend}/{res.device} {res.policy} page={res.page_size} {res.mode} "
                     f"impls={','.join(res.impls)}{note}")
    from .budget import load_factor, past_timeout, sweep_estimate, this_machine

    # Points as the summary and the report count them (a configuration, its
    # impls apart); the lines above are jobs, one per point and swept impl.
    n = len({summary.config_key(p.cfg) for p in points})
    size = count(n, "point") + (f" ({count(len(points), 'job')}: one per point and impl)" if n != len(points) else "")
    if points and points[0].runs_here:
        machine = this_machine()
        seconds, detail = sweep_estimate([p.resolved for p in points], machine)
        line = f"estimate: {size}, about {seconds / 60:.1f} min on this machine ({detail})"
        factor, load = load_factor(machine)
        if factor > 1:  # the sweep's time bound reads the idle figure; a user waiting now reads this one
            line += f"; at its load now ({load:.1f} on {machine.cores} cores) about {seconds * factor / 60:.1f} min"
        lines.append(line)
        late = past_timeout(points, machine)
        if late:
            lines.append(late)
    else:
        lines.append(f"{size}, run by a remote launcher")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from .help import HELP_FLAGS, text as help_text

    if any(a in HELP_FLAGS for a in argv):
        print(help_text())
        return 0
    dry = DRY_RUN_FLAG in argv
    argv = [a for a in argv if a != DRY_RUN_FLAG]
    shows = [a for a in argv if a in SHOW_FLAGS]
    if shows and any(a in MULTIRUN_FLAGS for a in argv):
        print(f"error: {shows[0]} shows one composed config and cannot be combined with -m; "
              f"list the points of a sweep with {DRY_RUN_FLAG}", file=sys.stderr)
        return 2
    # One instant names the sweep's results folder, in preflight, in every job,
    # in the summary and in the resume hint.
    start = datetime.now()
    argv = freeze_now(argv, start)
    try:
        given = argv  # the resume hint repeats workload=NAME, not the seq_lens it expands to
        argv = expand_argv(argv)  # workload=NAME: a sweep over its batches' seq_lens
        validate_overrides([a for a in argv if ("=" in a or a.startswith("~")) and not a.startswith("-")])
        # every point of the sweep, before Hydra writes anything (a large sweep: minutes, said as they pass)
        with Progress("matrix") as progress:
            progress.stage("composing, checking and resolving every point of the sweep before it starts")
            points = preflight(argv, budget=not dry, start=start)
    except (ConfigError, SchemaError, WorkloadError) as exc:
        print(f"error: {error_line(exc)}", file=sys.stderr)
        return 2
    if dry:
        print(dry_run(points))
        try:
            check_machine(points)
        except ConfigError as exc:
            print(f"error: the sweep would be refused: {exc}", file=sys.stderr)
            return 2
        return 0
    if points and points[0].runs_here:  # said before the sweep, as the dry run says it
        from .budget import past_timeout, this_machine

        late = past_timeout(points, this_machine())
        if late:
            print(late, file=sys.stderr, flush=True)
    from nsa_cp_comm.harness import rank_warnings

    from . import guards

    rank_warnings.clear()  # this sweep's: each distinct one said once after its summary
    guards.install()
    guards.guard()
    app = task(machine_checked=bool(points) and points[0].runs_here, points=points)
    argv = _pin_results_dir(argv, points)
    _ACTIVE["argv"] = argv if given == argv else _pin_results_dir(given, points)
    sys.argv = [sys.argv[0], *argv]
    # Hydra prints a job's exception as a traceback; here it comes to the handlers below
    os.environ["HYDRA_FULL_ERROR"] = "1"
    if points and points[0].runs_here and points[0].resolved.device == "cpu":
        from nsa_cp_comm.harness.ranks import prestart

        # Its environment as the jobs' ranks will have it (after the line above):
        # the fork server imports torch while Hydra composes the first jobs.
        prestart("cpu")
    try:
        with composed_once(points):
            app()
    except KeyboardInterrupt as exc:  # SIGINT, SIGTERM, SIGHUP
        how = guards.name(exc)
        cfg = _ACTIVE.get("cfg")
        if isinstance(cfg, dict):
            print(f"\n{summary.head(cfg)}: {how}, no row written", file=sys.stderr)
        print(f"{how}; {_resume_hint()}", file=sys.stderr, flush=True)
        return guards.exit_code(exc)
    except OSError as exc:  # Hydra's own files (a job folder on a full disk)
        print(f"error: {' '.join(str(exc).split())}; {_resume_hint()}", file=sys.stderr, flush=True)
        return 1
    if not points:  # --help, --cfg and other Hydra flags: Hydra's own output
        return 0
    from .point import point_id

    try:
        counts, files, gaps = summary.summarize((p.cfg, point_id(p.cfg)) for p in points)
    except SchemaError as exc:  # the results file was damaged during the sweep
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(summary.render(counts, files, single=single_point(points, argv)), flush=True)
    for line in summary.gap_report(gaps, counts):
        print(line, flush=True)
    for line in rank_warnings.lines():
        print(line, file=sys.stderr, flush=True)
    why = summary.nothing_checked_line(counts)
    if why:
        print(why, file=sys.stderr, flush=True)
    if guards.closed():
        print("warning: stdout was closed (broken pipe); its output was dropped, the rows are in results.csv",
              file=sys.stderr, flush=True)
    return summary.exit_code(counts)


if __name__ == "__main__":
    raise SystemExit(main())
