"""What the example plug-ins' rank tasks share (tests/sglang_plugin_tasks.py,
tests/vllm_plugin_tasks.py): the plug-in's folder on the path, and matrix
points of the plug-in as it is or with one part broken."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def on_path(plugin: Path) -> None:
    """The plug-in's package on this process's path (it is not installed)."""
    if str(plugin) not in sys.path:
        sys.path.insert(0, str(plugin))


def points(plugin: Path, ref: str, broken: Callable[[str, Any], Any], runs, backend) -> list:
    """``point_on_rank`` of each ``(spec, variant)``: the plug-in registered as
    ``ref``, or ``broken(variant, impl)`` in its place for that point."""
    on_path(plugin)
    from nsa_cp_comm import impls
    from nsa_cp_comm.harness.measure import point_on_rank

    saved = impls.get(ref)
    out = []
    for spec, variant in runs:
        impls.REGISTRY[ref] = saved if variant == "as_is" else broken(variant, saved)
        try:
            out.append(point_on_rank(spec, backend))
        finally:
            impls.REGISTRY[ref] = saved
    return out
