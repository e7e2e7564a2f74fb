"""The per-rank harness: run one matrix point on real torch.distributed ranks.

:func:`run_point` checks every implementation, then times it, then folds every
rank's findings into one :class:`ImplResult` per implementation;
:class:`RankPool` keeps the ranks warm between points. Nothing here is needed
to serve: a serving engine imports :mod:`nsa_cp_comm` alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import names as _names

# Each name and its module, imported on first use (PEP 562), as the library's
# package does: its pure-Python modules (calibrate's limits, spec's names) load
# without torch.
_WHERE = {"ImplResult": "fold", "run_point": "on_pool", "RankResult": "rank_result", "RankPool": "ranks",
          "run_on_ranks": "ranks", "PointSpec": "spec"}

if TYPE_CHECKING:
    from .fold import ImplResult
    from .on_pool import run_point
    from .rank_result import RankResult
    from .ranks import RankPool, run_on_ranks
    from .spec import PointSpec


__getattr__, __dir__ = _names(__name__, _WHERE, globals())


__all__ = ["ImplResult", "PointSpec", "RankPool", "RankResult", "run_on_ranks", "run_point"]
