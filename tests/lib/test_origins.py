"""One rule for where an implementation comes from (nsa_cp_comm.origins), read by
the registry, the config, the repro line, the report's coverage, compare and the
side-by-side table alike."""

from __future__ import annotations

import pytest

from nsa_cp_comm import impls, origins


@pytest.mark.parametrize("impl, origin, outside", [
    ("padded", origins.own(), False),
    ("padded", "", False),  # an older row without origins: a registered name is the project's
    ("pkg.mod:impl", "", True),  # ... and a reference is not
    ("pkg.mod:impl", float("nan"), True),  # pandas' empty cell
    ("engine_comm", "engine-comm 0.1.0", True),  # an entry point: no colon, another origin
    ("engine_comm", " nan ", False),
    ("mine", "nsa_cp_comm_fork 1.0", True),  # a distribution whose name starts like ours is not ours
])
def test_outside_or_the_projects_own(impl, origin, outside):
    assert origins.is_outside(impl, origin) is outside


def test_the_registrys_built_ins_carry_the_projects_own_origin():
    assert {origins.origin(impls.get(name)) for name in impls.BUILTIN} == {origins.own()}
    assert origins.is_own(origins.own()) and origins.is_reference("a.b:c") and not origins.is_reference("padded")
