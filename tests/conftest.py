"""Fixtures of the distributed tests: warm gloo RankPools, one per world size,
shared by the tests of one xdist worker (starting ranks costs seconds)."""

from __future__ import annotations

import pytest

from nsa_cp_comm import RankPool


@pytest.fixture(scope="session")
def rank_pool(tmp_path_factory):
    """``rank_pool(cp)``: a live gloo/CPU pool of ``cp`` ranks, started on first
    use and restarted if a failed task closed it. All are closed at session end."""
    pools: dict[int, RankPool] = {}

    def get(cp: int) -> RankPool:
        pool = pools.get(cp)
        if pool is None or not pool.alive:
            if pool is not None:
                pool.close()
            pool = RankPool(cp, backend="gloo", device="cpu", workdir=tmp_path_factory.mktemp(f"pool{cp}"))
            pools[cp] = pool
        return pool

    yield get
    for pool in pools.values():
        pool.close()


@pytest.fixture
def pool_workdir(tmp_path):
    """Rendezvous directory of a test's own, short-lived pool."""
    return tmp_path
