"""The checks' collectives wait longer on a loaded machine, by the one load rule.

A correct form's checks timed out at timeout 60 s at load 50-65 on two cores (fine at load 4):
their collectives' bound was fixed where a rank's start bound scales with the load. It now
scales by the same rule (nsa_cp_comm.harness.machine.load_factor, which the matrix's start bound
and the tests' waits read too), read once per rank process: the groups it makes are made once.
"""

from __future__ import annotations

from matrix.app import budget
from nsa_cp_comm.harness import machine, measure


def test_the_checks_bound_scales_with_the_load_once_per_process(monkeypatch):
    cores = machine._cores()
    monkeypatch.setattr(machine.os, "getloadavg", lambda: (cores * 5.0, 0.0, 0.0))
    measure.check_bound.cache_clear()
    try:
        assert measure.check_bound() == measure.CHECK_TIMEOUT_S * 5
        monkeypatch.setattr(machine.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
        assert measure.check_bound() == measure.CHECK_TIMEOUT_S * 5  # the process's groups keep their bound
        # the matrix's own scaling reads the same rule
        assert budget.load_factor(budget.this_machine(), cores * 5.0)[0] == machine.load_factor(cores, cores * 5.0)[0]
    finally:
        measure.check_bound.cache_clear()
    assert measure.check_bound() == measure.CHECK_TIMEOUT_S  # idle: the bound as written
    measure.check_bound.cache_clear()
