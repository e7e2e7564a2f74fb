"""The launcher's composes reused across a sweep's jobs (matrix.app.compose_cache):
each job's config, Hydra's records of it included, is the one Hydra composes."""

from __future__ import annotations

import contextlib

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import OmegaConf

from matrix.app import compose_cache
from matrix.app.config import register
from matrix.app.preflight import expand

from matrix_cli import REPO

# A plain key swept, two groups swept (``engine`` is a key and a group), a
# preset's group and plain keys fixed: 8 jobs, 4 choices of groups.
SWEEP = ["cp_size=1,2", "+layout=zigzag,shared_page16", "engine=seed_fix,sglang_0_5_23", "seq_lens=[1001,300]",
         "+matrix=smoke", "warmup=3"]


def _configs(lines: list[str], reuse: bool) -> tuple[list[dict], int]:
    register()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3", job_name="matrix"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("config", overrides=["hydra.job.chdir=false"], run_mode=RunMode.MULTIRUN)
        # without reuse: Hydra's own compose, and no composes kept
        with compose_cache.reuse_composes() if reuse else contextlib.nullcontext({}) as kept:
            got = [OmegaConf.to_container(loader.load_sweep_config(master, job))
                   for job in expand(OverridesParser.create().parse_overrides(lines))]
    return got, len(kept)


@pytest.fixture(scope="module")
def honest():
    return _configs(SWEEP, reuse=False)[0]


def test_every_job_is_hydras_own_compose(honest):
    """Every job's config, Hydra's records of it included (its overrides, the
    groups chosen), equal to Hydra's own compose; one compose per choice of groups."""
    got, composes = _configs(SWEEP, reuse=True)
    assert composes == 4
    assert len(got) == len(honest) == 8
    for mine, theirs in zip(got, honest):
        assert mine == theirs
    # the jobs differ where they should: the plain keys and the records
    assert {c["cp_size"] for c in got} == {1, 2}
    assert len({c["hydra"]["job"]["override_dirname"] for c in got}) == 8


def test_a_plain_key_also_touched_otherwise_is_composed_alone():
    """A plain key another override of the job also touches (a delete, an
    add): no reuse, the copy's assignment would undo it; a group or a
    mapping value is no plain override."""
    parse = OverridesParser.create().parse_overrides
    groups = {"engine", "workload", "layout", "matrix"}.__contains__
    for lines in (["seq_lens=[5]", "~seq_lens"], ["cp_size=2", "++cp_size=4"]):
        parsed = parse(lines)
        plain = [compose_cache.is_plain(ov, groups) for ov in parsed]
        assert plain == [True, False]
        assert compose_cache._key((), parsed, plain) is None
    parsed = parse(["cp_size=2", "engine=seed_fix", "+layout=zigzag", "seq_lens=[5]"])
    plain = [compose_cache.is_plain(ov, groups) for ov in parsed]
    assert plain == [True, False, False, True]
    assert compose_cache._key(("hydra.job.chdir=false",), parsed, plain) == (
        ("hydra.job.chdir=false",), ("cp_size", "engine=seed_fix", "+layout=zigzag", "seq_lens"))
