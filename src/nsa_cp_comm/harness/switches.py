"""On/off environment switches, read as booleans the same way everywhere.

``0``/``false``/``no``/``off`` and ``1``/``true``/``yes``/``on``, any case,
surrounding blanks ignored; unset or empty is the default. Anything else is a
``ValueError`` in one line naming the variable: a switch set to ``flase`` must
not quietly mean its default. Standard library only (the fork server's
starter and the rank's first statements read them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

OFF = ("0", "false", "no", "off")
ON = ("1", "true", "yes", "on")
# The harness's switches, checked together up front (check_switches).
SWITCHES = ("NSA_CP_COMM_FORK_RANKS", "NSA_CP_COMM_BIND_RANKS", "NSA_CP_COMM_REUSE_RANKS")


def env_switch(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """The boolean value of switch ``name`` (``default`` when unset or empty)."""
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or not raw.strip():
        return default
    word = raw.strip().lower()
    if word in OFF:
        return False
    if word in ON:
        return True
    raise ValueError(f"{name}={raw!r}: must be one of {', '.join(OFF)} (off) or {', '.join(ON)} (on)")


def check_switches(environ: Mapping[str, str] | None = None) -> None:
    """Every switch of :data:`SWITCHES` readable (ValueError, one line, else)."""
    for name in SWITCHES:
        env_switch(name, True, environ)
