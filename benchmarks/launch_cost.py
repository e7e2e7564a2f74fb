"""What Hydra costs the main process per point of a sweep, with no rank started.

The main process composes and launches every job between points while the
ranks wait, so its seconds add to the sweep's wall time one for one. This runs
a preset's sweep through ``python -m matrix``'s own path (preflight, Hydra's
sweeper and launcher, each job's records) with every point's work replaced by
nothing, and prints this process's CPU seconds: preflight, the launcher's
composes (``load_sweep_config``), and the rest of Hydra's per-job work (job
folder, its ``.hydra`` records, logging); with ``--compose-every-job`` Hydra
composes every job from scratch (matrix.app.compose_cache off), as it did before.
CPU seconds, not wall: they hold up on a loaded machine.

    python benchmarks/launch_cost.py [--preset default] [--compose-every-job]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="default", help="conf/matrix/NAME.yaml (default: default)")
    ap.add_argument("--compose-every-job", action="store_true",
                    help="Hydra composes every job from scratch (matrix.app.compose_cache off)")
    args = ap.parse_args()
    sys.path[:0] = [str(REPO / "src"), str(REPO)]
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core import utils as hydra_utils

    import matrix.app.sweep as cli
    from matrix.app import compose_cache, point, preflight, summary

    spent = {"preflight": 0.0, "composes": 0.0, "jobs": 0.0, "points": 0.0}
    counts = {"jobs": 0}

    def clocked(name, fn):
        def run(*a, **k):
            t0 = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.process_time() - t0
        return run

    if args.compose_every_job:
        compose_cache.reuse_composes = contextlib.nullcontext  # type: ignore[assignment]
    cli.preflight = clocked("preflight", cli.preflight)
    load = ConfigLoaderImpl.load_sweep_config
    ConfigLoaderImpl.load_sweep_config = clocked("composes", load)  # type: ignore[method-assign]
    run_job = hydra_utils.run_job

    def job(*a, **k):
        counts["jobs"] += 1
        return clocked("jobs", run_job)(*a, **k)

    # Hydra's plugin scan executes the launcher's module again: it binds run_job then.
    hydra_utils.run_job = job  # type: ignore[assignment]
    point.run = clocked("points", lambda cfg, **k: None)  # type: ignore[assignment]
    cli.run_point = point.run
    summary.live_line = lambda *a: ""  # type: ignore[assignment]
    out = Path(tempfile.mkdtemp(prefix="launch-cost-"))
    t0, wall = time.process_time(), time.perf_counter()
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
        cli.main([f"+matrix={args.preset}", f"results_dir={out}", "hydra.verbose=false"])
    total = time.process_time() - t0
    n = max(counts["jobs"], 1)
    jobs_only = spent["jobs"] - spent["points"]
    print(f"{args.preset}: {counts['jobs']} jobs, Hydra composing "
          f"{'every job' if args.compose_every_job else 'each choice of groups once'}; "
          f"1-minute load {os.getloadavg()[0]:.1f}; CPU seconds of the main process:")
    print(f"  preflight                  {spent['preflight']:6.2f}")
    print(f"  launcher's composes        {spent['composes']:6.2f}  ({spent['composes'] / n * 1e3:.0f} ms a job)")
    print(f"  Hydra's other per-job work {jobs_only:6.2f}  ({jobs_only / n * 1e3:.0f} ms a job)")
    print(f"  all (imports, summary...)  {total:6.2f}  (wall {time.perf_counter() - wall:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
