"""What the example plug-ins' rank tasks share (tests/sglang_plugin_tasks.py,
tests/vllm_plugin_tasks.py): the plug-in's folder on the path, and matrix
points of the plug-in as it is or with one part broken; and, on the test's
side (tests/lib/test_sglang_plugin.py, tests/lib/test_vllm_plugin.py), the
points their tests run and how they run them."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def on_path(plugin: Path) -> None:
    """The plug-in's package on this process's path (it is not installed)."""
    if str(plugin) not in sys.path:
        sys.path.insert(0, str(plugin))


def rank_rows(plan, group) -> int:
    """This rank's rows, by its rank in the CP group (a broken copy's helper)."""
    import torch.distributed as dist

    return plan.per_rank_tokens[dist.get_rank(group)]


def points(plugin: Path, ref: str, broken: Callable[[str, Any], Any], runs, backend) -> list:
    """``point_on_rank`` of each ``(spec, variant)``: the plug-in registered as
    ``ref``, or ``broken(variant, impl)`` in its place for that point."""
    on_path(plugin)
    from nsa_cp_comm import impls
    from nsa_cp_comm.harness.measure import point_on_rank

    saved = impls.get(ref)
    out = []
    for spec, variant in runs:
        impls.REGISTRY[ref] = saved if variant == "as_is" else broken(variant, saved)
        try:
            out.append(point_on_rank(spec, backend))
        finally:
            impls.REGISTRY[ref] = saved
    return out


# -- on the test's side ---------------------------------------------------------------

def spec(ref: str, lens, cp: int, policy: str, engine: str, iters: int = 2):
    """A small point of the plug-in ``ref`` alone: [T, 32] bfloat16, one warm-up."""
    from nsa_cp_comm.harness.spec import PointSpec

    return PointSpec(tuple(lens), cp, policy=policy, impls=(ref,), hidden_size=32, dtype="bfloat16", warmup=1,
                     iters=iters, engine=engine)


def rows(rank_pool, tasks, cp: int, runs) -> list[dict]:
    """Each ``(spec, variant)`` of ``runs``, all in one task (``tasks.points``, a
    plug-in's rank task) on the warm pool of ``cp`` ranks: each point's rows by impl."""
    from rank_tasks import folded

    results = rank_pool(cp).run(tasks.points, runs, "gloo", timeout_s=300)
    return [folded(spec, results, k) for k, (spec, _) in enumerate(runs)]


def ok_points_of_sweep(rank_pool, tasks, cp: int, cases, point) -> list[tuple]:
    """A sweep of the plug-in ``tasks.REF`` as it is: each ``(lens, policy,
    engine, want)`` of ``cases`` run as ``point(lens, cp, policy, engine)``. A
    point whose ``want`` is not ``"ok"`` is checked here: skipped, with a reason
    that names the plug-in and says ``want``, and nothing timed; the others are
    ok, correct and timed, and the rest is the caller's: ``(row, plan, where)`` each."""
    specs = [point(lens, cp, policy, engine) for lens, policy, engine, _ in cases]
    found = rows(rank_pool, tasks, cp, [(s, "as_is") for s in specs])
    out = []
    for s, (lens, policy, engine, want), res in zip(specs, cases, found):
        r = res[tasks.REF]
        where = (lens, cp, policy, engine, r.status, r.reason)
        if want == "ok":
            assert r.status == "ok" and r.correct and r.failed_check == "", where
            assert r.stats["roundtrip"]["p50"] > 0, where
            out.append((r, s.plan(), where))
        else:
            assert r.status == "skipped" and r.reason.startswith(f"impl={tasks.REF}: ") and want in r.reason, where
            assert not r.stats
    return out
