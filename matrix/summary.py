"""The end-of-sweep summary and the sweep's exit code."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

BAD = ("failed", "error", "timeout")


def point_status(rows: list[Mapping[str, Any]]) -> str:
    """A point is as bad as its worst row; ``skipped`` only if all rows are."""
    statuses = {r["status"] for r in rows}
    for s in BAD:
        if s in statuses:
            return s
    return "ok" if "ok" in statuses else "skipped"


def _describe(row: Mapping[str, Any]) -> str:
    if row["status"] != "ok":
        return f"{row['impl']} {row['status']}" + (f" ({row['reason'][:80]})" if row["reason"] else "")
    if row.get("roundtrip_p50_us") is not None:
        return f"{row['impl']} ok {row['roundtrip_p50_us']:.0f}us"
    return f"{row['impl']} ok ({str(row['reason'])[:48]})"


class Summary:
    """Counts the points of this process's sweep as they finish."""

    def __init__(self) -> None:
        self.points: Counter[str] = Counter()
        self.results_files: set[str] = set()

    def add(self, cfg: Mapping[str, Any], rows: list[Mapping[str, Any]] | None) -> None:
        head = (
            f"[matrix] cp={cfg['cp_size']} {'shared_kv page=' + str(cfg['page_size']) if cfg['shared_kv'] else cfg['split']} "
            f"seq_lens={cfg['seq_lens']} a2a={cfg['moe_a2a_backend']}"
        )
        if rows is None:
            self.points["resumed"] += 1
            print(f"{head}: already in results, skipped (resume=true)", flush=True)
            return
        self.points[point_status(rows)] += 1
        self.results_files.add(str(cfg["results_dir"]))
        print(f"{head}: " + " | ".join(_describe(r) for r in rows), flush=True)

    def render(self) -> str:
        total = sum(self.points.values())
        parts = ", ".join(f"{s} {self.points[s]}" for s in ("ok", "failed", "error", "timeout", "skipped", "resumed"))
        where = ", ".join(f"{d}/results.csv" for d in sorted(self.results_files))
        return f"matrix summary: {total} points: {parts}" + (f"\nresults: {where}" if where else "")

    def exit_code(self) -> int:
        return 1 if any(self.points[s] for s in BAD) else 0
