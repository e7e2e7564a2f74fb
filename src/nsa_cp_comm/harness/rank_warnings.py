"""Warnings the ranks' tasks raise, gathered where the sweep can say each once.

A plug-in's ranks run every point afresh (outside code never reuses a warm
rank), so a deprecation warning in its code, which Python prints once per
process, printed once per rank per point: 178 warning lines against 96 rows
in one sweep. A rank records the warnings each task raises instead of
printing them (:func:`recording`) and sends them with its answer; the pool
counts them here (:func:`count`), and the sweep prints each distinct one
once, with how often it came, after its summary (:func:`lines`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator

# The distinct warnings a sweep prints; the rest are counted in one line.
SHOWN = 5

_COUNTS: Counter[str] = Counter()


def one_line(w: warnings.WarningMessage) -> str:
    """A recorded warning as the sweep prints it: its category, text and place."""
    text = " ".join(str(w.message).split())
    return f"{w.category.__name__}: {text} ({w.filename}:{w.lineno})"


@contextlib.contextmanager
def recording() -> Iterator[list[str]]:
    """Within: every warning raised is recorded (one line each, in the list
    yielded) instead of printed; the filters are the process's, and the
    warnings module is as it was after."""
    with warnings.catch_warnings(record=True) as caught:
        found: list[str] = []
        try:
            yield found
        finally:
            found.extend(one_line(w) for w in caught)


def count(found: Iterable[str]) -> None:
    _COUNTS.update(found)


def clear() -> None:
    _COUNTS.clear()


def lines(shown: int = SHOWN) -> list[str]:
    """Each distinct warning the ranks raised since :func:`clear`, once, most frequent first."""
    common = _COUNTS.most_common()
    if not common:
        return []
    total = sum(_COUNTS.values())
    out = [f"warnings raised on the ranks: {total} ({len(common)} distinct), each shown once:"]
    out += [f"  {n} x {text}" for text, n in common[:shown]]
    if len(common) > shown:
        out.append(f"  ... {len(common) - shown} more distinct warning(s), {sum(n for _, n in common[shown:])} in all")
    return out
