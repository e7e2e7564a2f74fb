"""One matrix point: config -> resolved spec -> checks and timings on real ranks -> rows.

Everything a results row says is assembled here. A point never raises for
what happens on its ranks: an exception, a dead rank or a hang becomes rows
with that status, and the sweep goes on.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from nsa_cp_comm.origins import is_reference, origin
from nsa_cp_comm.harness.fold import ImplResult
from nsa_cp_comm.harness.machine import cpu_model, device_name, gpus, nccl_version, torch_version

from .. import command
from ..progress import Progress
from .config import KEYS, ConfigError, override_value, validate
from ..scale.plan_classes import label as plan_label
from .repro_env import env_prefix, join as repro_join
from .resolve import Resolved, resolve
from ..store.folder import Folder
from ..store.results import CONFIG_COLUMNS
from ..store.runs import ADDED_CONFIG_COLUMNS, STARTED, new_run_id

REPO = Path(__file__).resolve().parents[2]
# The plan's and the result's fields a row holds under their own names (impl is the row's name for it).
PLAN_SAME_NAME = ("total_tokens", "max_rank_len", "padded_total", "padding_frac", "is_even", "claim_holds")
# The result's fields a row holds elsewhere, and where; every other field is a
# column of its own name, so a field added to the result and to no column
# fails the row's write (results.append_rows refuses a key outside the
# schema) instead of vanishing from results.csv.
RESULT_ELSEWHERE: dict[str, str] = {
    "impl": "impl (the name the row gives it)", "origin": "impl_origin",
    "stats": "the <phase>_<stat>_us columns (STATS_ELSEWHERE)", "samples": "samples.jsonl",
    "calibration": "samples.jsonl (its calibration)",
    "traceback": "a single-point run's stderr (show_traceback: a repro prints where its rank raised)",
}
RESULT_SAME_NAME = tuple(f.name for f in fields(ImplResult) if f.name not in RESULT_ELSEWHERE)
# The statistics no column holds: every phase's but the round trip's p99 and
# spread (samples.jsonl holds every iteration's time, whence any statistic).
STATS_ELSEWHERE: frozenset[str] = frozenset({"p99", "iqr"})
# Keys a repro command leaves out: it reruns the point from scratch (no resume) into the
# folder its row is in (results_dir, absolute since the sweep pinned it), appending a row
# beside the one it repeats; the report lists both statuses in file order.
REPRO_OMITS = ("resume", "workload")  # the repro names the batch's seq_lens itself
# Keys that change how a sweep runs, not what a point measures: no column.
NOT_IN_ROWS = ("force", "startup_timeout_s", "allow_skipped")


def _stable_id(key: dict[str, Any], bystanders: int) -> str:
    """``key`` hashed, each configuration column a later results layout added
    (:data:`matrix.store.runs.ADDED_CONFIG_COLUMNS`) left out where it holds
    what every row before it had: those points keep the ids they had."""
    for k, added in ADDED_CONFIG_COLUMNS.items():
        if key.get(k, added.before) == added.before:
            key.pop(k, None)
    if bystanders:  # a world larger than the CP group makes another point
        key["bystanders"] = bystanders
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def point_id(cfg: Mapping[str, Any]) -> str:
    """Stable id of a point's requested configuration (for resume)."""
    return _stable_id({k: cfg[k] for k in CONFIG_COLUMNS if k in cfg}, cfg.get("bystanders", 0))


# What a point measures as resolve decided it (page_size 1 without shared KV, align's default cp_size).
_RESOLVED_IN_ID = ("policy", "page_size", "align", "mode", "impls", "backend", "device")


def effective_id(res: Resolved) -> str:
    """Stable id of what a point measures: two configs that differ only in keys
    without effect (``page_size`` without shared KV, ``split`` with it) share it."""
    spec = res.spec
    # what resolve decided, then every field of the spec the ranks run (a new one is in the id so;
    # tuples hash as the lists they were)
    key: dict[str, Any] = {k: getattr(res, k) for k in _RESOLVED_IN_ID}
    key.update((f.name, getattr(spec, f.name)) for f in fields(spec)
               if f.name not in key and f.name not in ("bystanders", "num_experts"))
    # the experts it runs, not whether the count was left to the default; eager has no capture size
    key.update(experts=spec.experts, max_capture_size=spec.max_capture_size or None)
    return _stable_id(key, spec.bystanders)


def repro_command(cfg: Mapping[str, Any]) -> str:
    """The command line that reruns exactly this point (every key explicit,
    every value quoted for Hydra and the shell) into the same results_dir,
    naming the app as it runs now (:func:`matrix.command`), after the
    environment the point needs (matrix.app.repro_env: ``env PYTHONPATH=... K=V``,
    with the directory an outside implementation was imported from).
    Provenance only: neither ``point_id`` nor resume reads it."""
    parts = [*env_prefix(str(cfg["impl"])), *command()]
    for k in KEYS:
        if k in REPRO_OMITS or (k in (*NOT_IN_ROWS, "bystanders") and cfg[k] in (False, 0, None)):
            continue
        parts.append(f"{k}={override_value(cfg[k])}")
    return repro_join(parts)  # shlex.join's quoting; a newline kept, in bash's $'...' form


def environment() -> dict[str, Any]:
    """This process's run (matrix.store.runs): its ``run_id`` and what is the same
    for every row it writes. Computed once per process; a forked child that
    writes rows is a run of its own."""
    return _environment(os.getpid())


@functools.lru_cache(maxsize=1)
def _environment(pid: int) -> dict[str, Any]:
    try:
        # An installed package is no checkout: no sha (a venv inside some
        # other repository would otherwise report that one's).
        if not (REPO / ".git").exists():
            raise OSError("not a checkout")
        def git(*args: str) -> str:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()

        sha, dirty = git("rev-parse", "--short=12", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
        sha = f"{sha}-dirty" if sha and dirty else sha
    except (OSError, subprocess.SubprocessError):
        sha = ""
    import nsa_cp_comm

    n_gpus = gpus()[0]
    return {
        "run_id": new_run_id(), "started": STARTED, "command": shlex.join(sys.orig_argv), "pid": pid,
        "host": platform.node(), "git_sha": sha, "torch_version": torch_version(), "nccl_version": nccl_version(),
        "python_version": platform.python_version(), "nsa_cp_comm_version": nsa_cp_comm.__version__,
        "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
        "gpu_name": device_name("cuda") if n_gpus else "", "gpu_count": n_gpus,
        # the machine's 1-minute load average as the run's first row was written
        "load_1m": round(os.getloadavg()[0], 2),
    }


def workload_name(value: Any) -> str:
    """A row's ``workload`` cell: the workload's name (its mapping carries it)."""
    if isinstance(value, Mapping):
        return str(value.get("name", ""))
    return "" if value is None else str(value)


def build_rows(
    cfg: Mapping[str, Any], res: Resolved, results: list[ImplResult], overrides: str, wall_s: float
) -> list[dict[str, Any]]:
    """The results rows of one point (shared with matrix.torchrun_point)."""
    spec = res.spec
    plan = spec.plan()
    base: dict[str, Any] = {k: cfg[k] for k in KEYS if k not in NOT_IN_ROWS}
    base.update(
        workload=workload_name(cfg.get("workload")), seq_lens=override_value(cfg["seq_lens"]), align=res.align,
        mlp_mode=res.mode, backend=res.backend, device=res.device, num_experts=spec.experts, policy=res.policy,
        effective_page_size=res.page_size, effective_id=effective_id(res), point_id=point_id(cfg),
        overrides=overrides, repro=repro_command(cfg),
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"), wall_s=round(wall_s, 3),
        device_name=device_name(res.device), run_id=environment()["run_id"],
    )
    base.update({k: getattr(plan, k) for k in PLAN_SAME_NAME}, plan_class=plan_label(plan))
    rows = []
    names = row_names([r.impl for r in results])
    for r in results:
        row = dict(base)
        row.update(_moved_plan(r.impl, plan))
        row.update({k: getattr(r, k) for k in RESULT_SAME_NAME}, impl=names[r.impl], impl_origin=r.origin)
        for phase, st in r.stats.items():
            for stat, value in st.items():
                if phase == "roundtrip" or stat not in STATS_ELSEWHERE:
                    row[f"{phase}_{stat}_us"] = value
        rows.append(row)
    return rows


def declared_name(name: str) -> str:
    """The name a row gives implementation ``name``: for a reference
    (``module:attribute``) the name its object declares, as an entry point's
    rows carry it; the reference itself where that name is not a plain one, is
    a built-in's or a keyword of ``impl``, or is an installed entry point's of
    another origin (the reference stays in the row's ``overrides`` and
    ``repro`` either way)."""
    from nsa_cp_comm import impls, plugins

    from .config import IMPL_KEYWORDS

    if not is_reference(name):
        return name
    try:
        impl = impls.get(name)
        declared = plugins.DECLARED.get(name, "")
        if not declared or is_reference(declared) or declared != declared.strip() or declared in impls.BUILTIN \
                or declared in IMPL_KEYWORDS:
            return name
        impls.discover()
        other = impls.REGISTRY.get(declared)
    except (plugins.ImplError, ValueError):
        return name
    return name if other is not None and origin(other) != origin(impl) else declared


def row_names(names: list[str]) -> dict[str, str]:
    """``{name: the name its rows carry}`` for the implementations of one
    point (:func:`declared_name`); two references of the point that declare
    one name keep their references, so that each has rows of its own."""
    shown = {n: declared_name(n) for n in names}
    taken = [v for v in shown.values()]
    return {n: (v if taken.count(v) == 1 else n) for n, v in shown.items()}


def _moved_plan(name: str, plan: Any) -> dict[str, Any]:
    """``padded_total``, ``padding_frac`` and ``claim_holds`` as implementation
    ``name`` moves the plan (its row stride: ``P`` for one that pads at the
    split); the plan's own (stride ``max_rank_len``) for a dispatch."""
    from nsa_cp_comm import impls
    from nsa_cp_comm.hooks import HookError
    from nsa_cp_comm.protocol import RoundTripImpl

    impl = impls.get(name)
    try:
        return impl.plan_columns(plan) if isinstance(impl, RoundTripImpl) else {}
    except HookError:  # a bad row_stride: the row is that implementation's error (run_point's reason)
        return {}


def every_impl(res: Resolved, status: str, reason: str) -> list[ImplResult]:
    """One result per implementation of the point, all with ``status``: a point
    that did not get as far as its checks."""
    return [ImplResult(name, status, reason=reason) for name in res.impls]


def skipped_results(cfg: Mapping[str, Any], res: Resolved) -> list[ImplResult] | None:
    """``skipped`` results when the point does not run (its mlp_mode contradicts
    its backend, or another point in the same results measured the same
    effective configuration), else None."""
    if res.skip:
        return every_impl(res, "skipped", res.skip)
    earlier = Folder.of(cfg["results_dir"]).earlier_same_effective(effective_id(res), point_id(cfg))
    if earlier is not None:
        return every_impl(res, "skipped", f"same effective configuration as point {earlier.get('point_id')} "
                          f"({earlier.get('overrides') or 'no overrides'}), which ran: policy={res.policy}, "
                          f"page_size={res.page_size}")
    return None


def _results_for(cfg: Mapping[str, Any], res: Resolved, job_dir: str | Path) -> list[ImplResult]:
    from nsa_cp_comm.harness.on_pool import run_point
    from nsa_cp_comm.harness.pools import get_pool
    from nsa_cp_comm.harness.rank_body import one_line_error

    skipped = skipped_results(cfg, res)
    if skipped is not None:
        return skipped
    try:
        # A world's first start imports torch in its fork server: at a high load, a minute said as it passes.
        with Progress("matrix") as progress:
            progress.stage(f"starting {res.spec.world_size} {res.backend}/{res.device} ranks")
            pool = get_pool(res.spec.world_size, backend=res.backend, device=res.device, workdir=job_dir,
                            start_timeout_s=startup_bound(cfg, res), start_retries=1)
    except Exception as exc:  # noqa: BLE001 - a point's failure is a row
        return every_impl(res, "error", one_line_error(exc))
    fresh: list[Any] = []

    def restart() -> Any:
        # A failed implementation's peers are rerun on fresh ranks: the warm
        # pool the next point gets.
        fresh.append(get_pool(res.spec.world_size, backend=res.backend, device=res.device, workdir=job_dir,
                              start_timeout_s=startup_bound(cfg, res), start_retries=1))
        return fresh[-1]

    try:
        results = run_point(res.spec, pool, timeout_s=cfg["timeout_s"], fresh=restart)
    except Exception as exc:  # noqa: BLE001 - a point's failure is a row
        for p in (pool, *fresh):
            p.close(graceful=False)
        return every_impl(res, "error", one_line_error(exc))
    return _after_point_check(fresh[-1] if fresh else pool, results, cfg["timeout_s"])


def startup_bound(cfg: Mapping[str, Any], res: Resolved) -> float:
    """Seconds a point's ranks get to start: ``startup_timeout_s``, or the
    budget's bound for its world on this machine under its current load."""
    if cfg.get("startup_timeout_s") is not None:
        return float(cfg["startup_timeout_s"])
    from .budget import startup_timeout_s

    return startup_timeout_s(res)


def _after_point_check(pool: Any, results: list[ImplResult], timeout_s: float) -> list[ImplResult]:
    """The point's results, unless it left its ranks changed (a destroyed group,
    a torch global setting or a torch.distributed function not as the ranks
    started, :mod:`nsa_cp_comm.harness.rank_state`): then its rows that would
    not say failed, error or timeout say ``failed`` (``rank_state``) with what
    changed, untimed, and the next point gets fresh ranks (the pool is closed).
    Ranks that do not answer the check give ``error``."""
    from dataclasses import replace

    from nsa_cp_comm.harness.rank_state import check_pool

    if not pool.alive:  # a failed point closed it: the next point starts fresh ranks anyway
        return results
    failed_check, problem = check_pool(pool, timeout_s)
    if not problem:
        return results
    status = "failed" if failed_check else "error"
    return [r if r.status in ("failed", "error", "timeout") else
            replace(r, status=status, reason=problem, failed_check=failed_check, correct=None, stats={}, samples={})
            for r in results]


def run(
    cfg: Mapping[str, Any], *, job_dir: str | Path, overrides: str = "", machine_checked: bool = False,
    resolved: Resolved | None = None, show_traceback: bool = False,
) -> list[dict[str, Any]] | None:
    """Run one point and append its rows to ``<results_dir>/results.csv``.

    ``machine_checked``: the caller already checked the point against this
    machine (the CLI's preflight, for the whole sweep, before any rank held
    memory): not again, mid-sweep. Otherwise (a remote launcher's job, on the
    node the point runs on) a point this machine cannot hold gives error rows.
    ``resolved``: the point as the caller validated and resolved it (the
    CLI's preflight, for this very config): the one this run uses.
    ``show_traceback``: where a rank raised, print its traceback to stderr
    after the rows are written (a single point's run: a row's ``repro``).

    Returns the rows, or None when ``resume`` found the point already done
    (rows that are not error/timeout). Raises ConfigError (before anything is
    written) for an invalid config."""
    if resolved is None:
        validate(cfg)
        resolved = resolve(cfg)
    res = resolved
    results_dir = cfg["results_dir"]
    folder = Folder.of(results_dir).refresh()
    if cfg["resume"] and folder.done(point_id(cfg)):
        return None
    from nsa_cp_comm.harness.hook_child import answering

    t0 = time.perf_counter()
    # An outside implementation's answers about the plan, asked once in a child bounded by timeout_s
    # (an exit, a hang or a KeyboardInterrupt in a hook is its own error row, not the sweep's end)
    with answering(res.spec.impls, res.spec.plan(), cfg["timeout_s"]):
        try:
            if not machine_checked:
                from .budget import check_sweep  # only an unchecked job needs the estimates

                check_sweep([res], runs_here=True)
        except ConfigError as exc:
            results = every_impl(res, "error", f"this machine cannot run the point: {exc}")
        else:
            results = _results_for(cfg, res, job_dir)
        rows = build_rows(cfg, res, results, overrides, time.perf_counter() - t0)
    write_point(results_dir, rows, results)
    if show_traceback:
        for r in results:
            if r.traceback and r.status in ("error", "timeout"):
                print(f"traceback of {r.impl}'s {r.status}, {r.traceback}", file=sys.stderr, flush=True)
    return rows


def write_point(results_dir: str | Path, rows: list[dict[str, Any]], results: list[ImplResult]) -> None:
    """A point's raw samples, then its rows, through the folder's index (:meth:`Folder.append`)."""
    Folder.of(results_dir).append(rows, [r.samples for r in results], [r.calibration for r in results],
                                  run=environment())
