"""The per-rank harness: run one matrix point on real torch.distributed ranks.

:func:`run_point` checks every implementation, then times it, then folds every
rank's findings into one :class:`ImplResult` per implementation;
:class:`RankPool` keeps the ranks warm between points. Nothing here is needed
to serve: a serving engine imports :mod:`nsa_cp_comm` alone.
"""

from .fold import ImplResult
from .measure import run_point
from .rank_result import RankResult
from .ranks import RankPool, run_on_ranks
from .spec import PointSpec

__all__ = ["ImplResult", "PointSpec", "RankPool", "RankResult", "run_on_ranks", "run_point"]
