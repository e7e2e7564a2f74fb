"""Where in an implementation's own code an exception was raised, for a row's reason.

A plug-in that raises inside the matrix's checks or timed loop gets an
``error`` row whose reason quotes the exception; what a plug-in author needs
next is the line that raised and the step the harness was in. The step is the
hook the harness (or this library) was calling when the exception left it
(``gather``, ``scatter``, ``scatter_replicated``, ...), the line the innermost
frame outside this library, torch and Python's own modules.
"""

from __future__ import annotations

import os
import re
import sysconfig
import traceback
from types import TracebackType

from ..protocol import OPTIONAL_HOOKS, REQUIRED_HOOKS

# The protocol's hooks a harness or library line calls on an implementation: a round trip's
# (protocol), the method that calls its scatters, a send block's stage, a dispatch's two. Longest
# first, so that the pattern below takes gather_side before gather.
HOOKS = tuple(sorted({*REQUIRED_HOOKS, *OPTIONAL_HOOKS, "scatter_moe", "stage", "dispatch", "combine"},
                     key=lambda h: (-len(h), h)))
_CALL = re.compile(r"\.(" + "|".join(HOOKS) + r")\(")


def _roots() -> tuple[str, ...]:
    import torch

    import nsa_cp_comm

    paths = {os.path.dirname(os.path.abspath(nsa_cp_comm.__file__)), os.path.dirname(os.path.abspath(torch.__file__))}
    for key in ("stdlib", "platstdlib"):
        paths.add(os.path.abspath(sysconfig.get_paths()[key]))
    return tuple(p + os.sep for p in paths)


def _shown(path: str) -> str:
    """``path`` relative to the working directory where it is under it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def implementation_site(tb: TracebackType | None) -> str:
    """`` (raised at FILE:LINE in FUNC, in the implementation's STEP)`` for a
    traceback that passed through code outside this library, torch and the
    standard library, or ``''`` where it did not."""
    frames = traceback.extract_tb(tb)
    roots = _roots()
    outside = [not f.filename.startswith("<") and not os.path.abspath(f.filename).startswith(roots) for f in frames]
    if not any(outside):
        return ""
    # the innermost run of outside frames: its last frame raised (or called what raised), and the
    # frame before its first is the library's line that called the implementation
    end = max(i for i, o in enumerate(outside) if o)
    start = end
    while start > 0 and outside[start - 1]:
        start -= 1
    last = frames[end]
    caller = frames[start - 1] if start > 0 else None
    step = _CALL.search(caller.line or "") if caller is not None else None
    return (f" (raised at {_shown(last.filename)}:{last.lineno} in {last.name}"
            + (f", in the implementation's {step.group(1)}" if step else "") + ")")
