"""A plug-in whose exit handler never returns, registered when it is imported
(in the sweep's own process too, where the implementation is looked up):
the sweep must still end after its summary. Only ever loaded by a subprocess
(``impl=tests.hostile_exit:hangs_at_exit``): a test process importing it would
not exit."""

from __future__ import annotations

import atexit
import threading

from nsa_cp_comm.impls import RoundTripImpl

from tests.broken_impls import _gather, _scatter

atexit.register(threading.Event().wait)

hangs_at_exit = RoundTripImpl("hangs_at_exit", _gather, _scatter, doc="an atexit handler that never returns")
