"""Rules more than one engine module shares (each module still states its own)."""

from __future__ import annotations

from typing import Any


def unaligned(policy: str, cp: int) -> int:
    """``P = max n_r``: the physical length carries no alignment."""
    return 1


def only_one_rank(min_len: Any, total: Any, cp: int, policy: str) -> Any:
    """Runs every batch with CP but at cp = 1 (scalars or numpy arrays)."""
    if cp <= 1:
        return min_len >= 0  # always (True, or an all-True array)
    return min_len < 0  # never
