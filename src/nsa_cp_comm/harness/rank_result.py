"""What one rank gave back for one task, and a failed task's one-line reason.

The pool (:mod:`.ranks`) makes these; the checks that run after a point
(:mod:`.rank_state`) and the point's measure (:mod:`.measure`) read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class RankResult:
    """What one rank gave back for one task.

    ``status``: ``ok`` (``value`` holds the return value), ``error`` (the task
    raised; ``error`` is ``"Type: message"``), ``crashed`` (the process died),
    ``timeout`` (still running at the deadline) or ``aborted`` (killed because
    another rank failed first).
    """

    rank: int
    status: str
    value: Any = None
    error: str = ""
    traceback: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# Ends a timed-out rank's error when its process is stopped (SIGSTOP), not busy.
STOPPED = " (stopped)"


def summarize_failure(results: list[RankResult]) -> tuple[str, str]:
    """``(status, reason)`` of a failed task, with status in error/timeout: the
    first rank that failed by itself names the failure."""
    for kind in ("crashed", "error", "timeout"):
        bad = [r for r in results if r.status == kind]
        if bad:
            ranks = ",".join(str(r.rank) for r in bad)
            detail = bad[0].error.replace(STOPPED, "")
            # a stopped rank is the one that never answered; its peers wait for it
            stopped = [str(r.rank) for r in bad if r.error.endswith(STOPPED)]
            if stopped:
                detail += f"; rank {','.join(stopped)} never answered: its process is stopped (SIGSTOP?)"
            status = "timeout" if kind == "timeout" else "error"
            return status, f"rank {ranks} {kind}: {detail}".strip().rstrip(":")
    return "ok", ""
