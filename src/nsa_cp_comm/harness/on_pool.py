"""One matrix point on a pool of ranks, from the process that holds the pool.

:func:`run_point` sends :func:`.measure.point_on_rank` to every rank, names
the implementation a failure belongs to (:mod:`.blame`), reruns the point's
other implementations without it on fresh ranks, and folds the ranks'
reports into one :class:`~.fold.ImplResult` per implementation. Torch is the
ranks' business: this module, and what it imports, never imports it (a
sweep's own process, seconds of imports on a loaded machine, runs it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .. import hooks
from .. import impls as impl_registry
from .._lazy import Deferred
from ..modes import ScatterMode
from .blame import Failure, culprit_row, diagnose, every_row, not_run_row, state_change
from .cpgroup import GROUP_RANK_KEY
from .fold import ImplResult, fold_reports, origin_of
from .rank_body import one_line_error
from .ranks import RankPool
from .spec import PointSpec

# How much a point checks before it is timed (run_point's ``checks``).
CHECKS: tuple[str, ...] = ("full", "light")
# What every rank runs, named: the ranks import it, this process need not.
POINT_ON_RANK = Deferred("nsa_cp_comm.harness.measure:point_on_rank")


def run_point(spec: PointSpec, pool: RankPool, *, timeout_s: float, checks: str = "full", verify: bool = True,
              fresh: Callable[[], RankPool] | None = None) -> list[ImplResult]:
    """Run one point on a warm pool. A rank that raises, dies or hangs yields
    an ``error``/``timeout`` row (the pool is then closed); never raises for
    what happens on the ranks. The row is that of the implementation whose
    turn it was (its checks, its timed form, its turn in the timed loop, the
    verification of its timed outputs: :func:`diagnose`); the point's other
    implementations are rerun without it on fresh ranks from ``fresh`` (by
    default a new pool like ``pool``, closed after the rerun; the matrix
    passes its warm-pool cache's, which keeps them for the next point). A
    failure that is no implementation's (the point's setup) is every row's.

    ``checks="full"`` (the matrix's): every check of :mod:`.checks`, then the
    timed loop with the A/A control, every iteration's outputs checked
    (``production_form``). ``checks="light"`` (FULL mode only; the
    benchmark's production shapes): :func:`.checks.check_light`'s checks and
    every timed iteration's, and no A/A control either, so that a point holds
    only its implementations' buffers (a failed check's row is ``failed`` as
    with full checks; ``samples`` has no ``control``)."""
    if checks not in CHECKS:
        raise ValueError(f"checks={checks!r} is not one of {', '.join(CHECKS)}")
    if checks == "light" and spec.mode != ScatterMode.FULL.value:
        raise ValueError(f"checks='light' covers mode FULL only, not mode={spec.mode}")
    if pool.world_size != spec.world_size:
        raise ValueError(f"pool has {pool.world_size} ranks, cp_size={spec.cp_size} + bystanders={spec.bystanders}")
    plan = spec.plan()
    # Every plan-level answer of an implementation (supports, row_stride, a
    # legacy_bits_on_even rule) is data: asked here first, where the rows are
    # folded; a bad one is that implementation's error row, and the point's
    # other implementations run without it.
    refused = {name: why for name in spec.impls if (why := hooks.hook_error(
        impl_registry.get(name), pool.backend, plan))}
    if refused:
        others = tuple(name for name in spec.impls if name not in refused)
        rows = {name: ImplResult(name, "error", reason=why, origin=origin_of(name)) for name, why in refused.items()}
        if others:
            rows.update((r.impl, r) for r in run_point(replace(spec, impls=others), pool, timeout_s=timeout_s,
                                                       checks=checks, verify=verify, fresh=fresh))
        return [rows[name] for name in spec.impls]
    if any(impl_registry.get(name).origin for name in spec.impls):
        # A plug-in runs on these ranks: no later point may (pools.get_pool),
        # proven clean or not (the checks after each step put the blame on
        # what they see; the fresh ranks cover what they do not).
        pool.ran_outside_code = True
    results = pool.run(POINT_ON_RANK, spec, pool.backend, checks, verify, timeout_s=timeout_s)
    if not all(r.ok for r in results):
        return _rerun_without_culprit(spec, diagnose(spec, results), pool, timeout_s, checks, verify, fresh)
    changed = state_change(spec, results)
    if changed is not None:
        # The ranks are not as they started: no later point may run on them.
        pool.close(graceful=False)
        return _rerun_without_culprit(spec, changed, pool, timeout_s, checks, verify, fresh)
    # In the CP group's rank order (as each rank reported it), bystanders (an empty report) left out.
    by_group = {r.value[GROUP_RANK_KEY]: r.value for r in results if r.value}
    return fold_reports(spec, plan, [by_group[r] for r in range(spec.cp_size)])


def _rerun_without_culprit(spec: PointSpec, failure: Failure, pool: RankPool, timeout_s: float, checks: str,
                           verify: bool, fresh: Callable[[], RankPool] | None) -> list[ImplResult]:
    if not failure.culprit:
        return every_row(spec, failure)
    others = tuple(name for name in spec.impls if name != failure.culprit)
    rows = {failure.culprit: culprit_row(failure)}
    if others:
        owned = fresh is None
        try:
            new = (fresh() if fresh is not None else
                   RankPool(pool.world_size, backend=pool.backend, device=pool.device, workdir=pool.workdir))
        except Exception as exc:  # noqa: BLE001 - a point's failure is a row
            rows.update((name, not_run_row(name, failure, f"fresh ranks to rerun it on did not start: "
                                                       f"{one_line_error(exc)}")) for name in others)
        else:
            try:
                # A failure of the rerun is blamed the same way (each rerun has one implementation fewer).
                rerun = run_point(replace(spec, impls=others), new, timeout_s=timeout_s, checks=checks, verify=verify,
                                  fresh=fresh)
            finally:
                if owned:
                    new.close()
            for r in rerun:
                if r.status in ("error", "timeout") and not r.reason.startswith("not run"):
                    r.reason = f"rerun on fresh ranks without {failure.culprit}, which failed first: {r.reason}"
                rows[r.impl] = r
    return [rows[name] for name in spec.impls]
