"""Bounds before work: a size too large is refused before anything costs time
or memory in proportion to it (the plan, the points' resolution), in one
line naming the key and the value; a results folder no directory can be
made in is refused up front (RELIABILITY.md's CLI rows; here, the check
broken); iters=auto's estimate counts its warm-up."""

from __future__ import annotations

import os
import tempfile
import types
from collections.abc import Sequence

import pytest

from matrix.app import config
from matrix_cli import config_of as _cfg
from nsa_cp_comm import plan as plan_mod
from nsa_cp_comm.plan import MAX_CP_SIZE, MAX_PLAN_BLOCKS, plan_split


class Untouchable(Sequence):
    """A batch of ``n`` requests whose lengths must not be read."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        raise AssertionError("a length was read before the sizes were checked")


def test_plan_split_refuses_a_cp_size_over_its_bound_before_reading_the_batch():
    with pytest.raises(ValueError, match=f"cp_size=10000000 is over the {MAX_CP_SIZE} ranks a plan may have"):
        plan_split(Untouchable(1), 10**7, policy="zigzag")
    assert plan_split([10], MAX_CP_SIZE // 64, policy="zigzag").cp_size == MAX_CP_SIZE // 64


def test_plan_split_refuses_too_many_request_rank_blocks_before_reading_the_batch():
    n = MAX_PLAN_BLOCKS // 1024 + 1
    with pytest.raises(ValueError, match=f"seq_lens has {n} requests: at cp_size=1024"):
        plan_split(Untouchable(n), 1024, policy="zigzag")


def test_without_the_bound_the_batch_is_read(monkeypatch):
    """The checker broken: the plan starts reading (and building) the batch."""
    monkeypatch.setattr(plan_mod, "MAX_CP_SIZE", 1 << 40)
    with pytest.raises(AssertionError, match="a length was read"):
        plan_split(Untouchable(1), 10**7, policy="zigzag")


def test_config_refuses_a_batch_too_large_to_plan_at_its_cp():
    with pytest.raises(config.ConfigError, match=r"seq_lens=\[\.\.\.\]: 65530 requests at cp_size=1024 make 67102720 "
                                                 f"request-rank blocks to plan, more than {config.PLAN_BLOCKS_MAX}"):
        config.validate(_cfg(cp_size=1024, seq_lens=[3] * 65530))
    config.validate(_cfg(cp_size=1024, seq_lens=[3] * (config.PLAN_BLOCKS_MAX // 1024)))


def test_a_dry_run_beyond_the_machines_ranks_is_refused_before_any_point_is_planned(tmp_path, capsys, monkeypatch):
    """65,530 requests at cp_size=1024 took 72 s and 2.4 GB of planning before
    the refusal of 1024 ranks; the rank limit is now checked from the config."""
    from matrix.app import sweep as cli
    from matrix.app import budget, resolve

    def planned(*a, **k):
        raise AssertionError("a point was resolved (planned) before the rank limit was checked")

    monkeypatch.setattr(resolve, "resolve", planned)
    lens = "[" + ",".join(["3"] * 2000) + "]"
    argv = ["--dry-run", "cp_size=1024", f"seq_lens={lens}", f"results_dir={tmp_path / 'res'}"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cp_size=1024: 1024 rank processes exceed this machine's limit of ")
    assert len(err.strip().splitlines()) == 1 and "force=true" in err
    # the checker broken: the point is resolved first
    monkeypatch.setattr(budget, "check_world", lambda cfg, machine=None: None)
    with pytest.raises(AssertionError, match="resolved"):
        cli.main(argv)


def test_without_the_probe_sys_passes_the_check(monkeypatch):
    """The checker broken (permission bits only): /sys says writable to root."""
    if os.geteuid() != 0:
        pytest.skip("as another user /sys is refused by its permission bits")
    real = tempfile.mkdtemp
    monkeypatch.setattr(config, "tempfile", types.SimpleNamespace(mkdtemp=lambda prefix, dir: real(prefix=prefix)))
    config.check_writable("/sys/nsa-results")


def test_iters_auto_estimate_counts_its_warmup():
    """iters=auto's timed iterations stop at the cap; its warm-up runs before
    them, outside it: the estimate of a capped point grows with warmup."""
    from matrix.app.budget import estimate
    from matrix.app.resolve import resolve
    from nsa_cp_comm.harness import calibrate
    from nsa_cp_comm.harness.machine import Machine

    import reliability_table as table

    m = Machine(**table.BOUND_MACHINE)
    shape = dict(cp_size=2, hidden_size=4096, seq_lens=[8000], iters="auto", timeout_s=600.0)
    cold = estimate(resolve(_cfg(warmup=0, **shape)), m)
    warm = estimate(resolve(_cfg(warmup=1000, **shape)), m)
    per_iter = (estimate(resolve(_cfg(warmup=0, **{**shape, "iters": 2000})), m).seconds
                - estimate(resolve(_cfg(warmup=0, **{**shape, "iters": 1000})), m).seconds) / 1000
    assert cold.seconds > calibrate.time_cap()  # capped: the timed loop alone is at the cap
    assert warm.seconds - cold.seconds == pytest.approx(1000 * per_iter, rel=0.01)
