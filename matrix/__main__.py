"""``python -m matrix [-m] key=value ...``: run matrix points (a Hydra app).

Thin on purpose: the CLI checks every override before Hydra starts, each job
runs one point (matrix.point), and the process exits non-zero only if some
point failed, errored or timed out.
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from .config import ConfigError, register, validate_overrides
from .point import run as run_point
from .preflight import preflight
from .results import SchemaError
from .summary import Summary

register()
SUMMARY = Summary()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def app(cfg: DictConfig) -> None:
    # Plain Python values from here on: ranks get pickled dataclasses, never
    # OmegaConf nodes.
    plain = OmegaConf.to_container(cfg, resolve=True)
    hc = HydraConfig.get()
    try:
        rows = run_point(plain, job_dir=hc.runtime.output_dir, overrides=" ".join(hc.overrides.task))
    except (ConfigError, SchemaError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    SUMMARY.add(plain, rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        validate_overrides([a for a in argv if "=" in a and not a.startswith("-")])
        preflight(argv)  # issue 6: every point of the sweep, before Hydra writes anything
    except (ConfigError, SchemaError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.argv = [sys.argv[0], *argv]
    app()
    if SUMMARY.points:
        print(SUMMARY.render(), flush=True)
    return SUMMARY.exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
