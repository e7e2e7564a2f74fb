"""Fixtures of the distributed tests: warm gloo RankPools, one per world size,
shared by the tests of one xdist worker (starting ranks costs seconds); and
the hypothesis profiles of the property tests.

Profiles (``HYPOTHESIS_PROFILE=...``, default ``ci``):

* ``ci``: bounded and deterministic, what ``nox -s tests`` runs: the same
  examples on every run and machine (derandomized), no deadline (a loaded
  2-core CI box is slow, not wrong), no example database written.
* ``fuzz``: thousands of random examples per property, for ``nox -s fuzz``
  (``pytest -m fuzz``); a failure prints the shrunk counterexample and the
  blob that replays it (``@reproduce_failure``).
"""

from __future__ import annotations

import os

import pytest

from nsa_cp_comm.harness import RankPool

try:  # a GPU node may lack hypothesis: its GPU tests must still start
    from hypothesis import HealthCheck, Verbosity, settings
except ImportError:  # pragma: no cover - the property tests importorskip it
    settings = None
else:
    settings.register_profile("ci", max_examples=50, deadline=None, derandomize=True, database=None,
                              print_blob=True)
    settings.register_profile("fuzz", max_examples=3000, deadline=None, database=None, print_blob=True,
                              verbosity=Verbosity.normal, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


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


@pytest.fixture
def column_wise(monkeypatch):
    """``column_wise(module, name)``: from now on in the test, row-wise
    iteration over any DataFrame raises, and the calls of ``module.name`` (a
    per-cell helper) are counted in the returned dict under ``name``."""
    import pandas as pd

    def forbidden(*_a, **_k):
        raise AssertionError("row-wise iteration over the results")

    def start(module, name: str) -> dict[str, int]:
        monkeypatch.setattr(pd.DataFrame, "iterrows", forbidden)
        monkeypatch.setattr(pd.DataFrame, "itertuples", forbidden)
        calls = {name: 0}
        real = getattr(module, name)

        def counted(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
        return calls

    return start
