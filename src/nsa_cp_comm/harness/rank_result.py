"""What one rank gave back for one task, and a failed task's one-line reason.

The pool (:mod:`.ranks`) makes these; the checks that run after a point
(:mod:`.rank_state`) and the point's measure (:mod:`.measure`) read them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class RankResult:
    """What one rank gave back for one task.

    ``status``: ``ok`` (``value`` holds the return value), ``error`` (the task
    raised; ``error`` is ``"Type: message"``), ``crashed`` (the process died),
    ``timeout`` (still running at the deadline) or ``aborted`` (killed because
    another rank failed first). ``doing``: on a failed task, what the rank
    last said it was about to run (:func:`.rank_body.announce`), or ''; on a
    timed-out rank, ``waiting``: where its task waited (:func:`.hangs.waiting_in`).
    """

    rank: int
    status: str
    value: Any = None
    error: str = ""
    traceback: str = ""
    doing: str = ""
    waiting: str = ""
    # The warnings the task raised on the rank, one line each (.rank_warnings), not printed there.
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# Ends a timed-out rank's error when its process is stopped (SIGSTOP), not busy.
STOPPED = " (stopped)"


def rank_list(ranks: list[int]) -> str:
    return f"rank {','.join(map(str, ranks))}"


def summarize_failure(results: list[RankResult], label: Callable[[list[int]], str] = rank_list) -> tuple[str, str]:
    """``(status, reason)`` of a failed task, with status in error/timeout: the
    first rank that failed by itself names the failure. ``label`` names a
    list of ranks (``results``' own numbers) in the reason."""
    for kind in ("crashed", "error", "timeout"):
        bad = [r for r in results if r.status == kind]
        if bad:
            detail = bad[0].error.replace(STOPPED, "")
            # a stopped rank is the one that never answered; its peers wait for it
            stopped = [r.rank for r in bad if r.error.endswith(STOPPED)]
            if stopped:
                detail += f"; {label(stopped)} never answered: its process is stopped (SIGSTOP?)"
            status = "timeout" if kind == "timeout" else "error"
            return status, f"{label([r.rank for r in bad])} {kind}: {detail}".strip().rstrip(":")
    return "ok", ""
