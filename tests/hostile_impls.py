"""Round-trip implementations that are correct but hostile to the harness:
each does something outside code may do (a huge error message, a helper
process left running, a changed global default), and the matrix must keep
its rows true and its processes reaped (tests/test_hostile_sweeps.py runs
them as ``impl=tests.hostile_impls:<name>``)."""

from __future__ import annotations

import subprocess

import torch

from nsa_cp_comm.impls import RoundTripImpl

from tests.broken_impls import _gather, _scatter

LONG_MESSAGE_CHARS = 229_000


def _long_error_gather(local, plan, group):
    # A compiler log: far over the csv module's 131072-character field limit.
    raise RuntimeError("E" * LONG_MESSAGE_CHARS)


long_error = RoundTripImpl("long_error", _long_error_gather, _scatter, doc="raises with a 229 KB message")

SLEEP_MARK = "987654"
_started: list[subprocess.Popen] = []


def _spawning_gather(local, plan, group):
    if not _started:  # a helper daemon, started once per rank and never waited for
        _started.append(subprocess.Popen(["sleep", SLEEP_MARK], start_new_session=False))
    return _gather(local, plan, group)


spawns_helper = RoundTripImpl("spawns_helper", _spawning_gather, _scatter, doc="leaves a sleep running")


def _float64_scatter(full, plan, group):
    out = _scatter(full, plan, group)
    torch.set_default_dtype(torch.float64)  # a global default changed and never restored
    return out


sets_float64 = RoundTripImpl("sets_float64", _gather, _float64_scatter, doc="sets the default dtype to float64")
