"""Live per-point lines, the end-of-sweep summary, and the sweep's exit code.

The summary is read back from the results files after the sweep, for the
points preflight expanded: it is the same whichever launcher ran the points
(in this process, or as jobs on other machines), and a point that never wrote
a row counts as ``missing``. The exit code is :func:`exit_code`'s; each
coverage gap (matrix.review.coverage: a plug-in that skips everything is no
pass) is a line after the summary. Timed rows with too few samples for compare to flag a change (iters
below MIN_SAMPLES) are named on a line of their own: compare, not the sweep,
fails them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from .. import count
from ..review.coverage import gap_lines, gaps
from ..store.folder import latest_rows
from ..store.results import BAD_STATUSES, STATUS_VALUES, results_path
from nsa_cp_comm.harness.significance import MIN_SAMPLES

ORDER = ("ok", "refused", "passthrough", "failed", "error", "timeout", "skipped", "missing")


def head(cfg: Mapping[str, Any]) -> str:
    split = f"shared_kv page={cfg['page_size']}" if cfg["shared_kv"] else cfg["split"]
    engine = f" engine={cfg['engine']}" if cfg.get("engine", "seed_fix") != "seed_fix" else ""
    return f"[matrix] cp={cfg['cp_size']} {split} seq_lens={cfg['seq_lens']} a2a={cfg['moe_a2a_backend']}{engine}"


def describe(row: Mapping[str, Any]) -> str:
    status = row["status"]
    if status == "ok" and row.get("roundtrip_p50_us") not in (None, ""):
        return f"{row['impl']} ok {float(row['roundtrip_p50_us']):.0f}us"
    reason = str(row.get("reason") or "")
    if status in ("ok", "refused", "passthrough"):
        return f"{row['impl']} {status}"
    check = f" [{row['failed_check']}]" if row.get("failed_check") else ""
    return f"{row['impl']} {status}{check}" + (f" ({clipped(reason)})" if reason else "")


# A console line keeps a reason this long; past it, the line says it was cut.
REASON_CHARS = 120
# Of a cut reason, the end kept: a message's numbers come last ("the size of tensor a (17) must match
# the size of tensor b (18) at non-singleton dimension 0").
TAIL_CHARS = 75
GAP_MARK = " [...] "
CUT_MARK = " [cut; whole in results.csv's reason]"


def clipped(reason: str, limit: int = REASON_CHARS) -> str:
    """``reason`` on one line, whole when short; else its start and its end
    (where a message's numbers are), each cut at a word, the gap and the
    cut marked, pointing to the row, which keeps it whole."""
    text = " ".join(reason.split())
    if len(text) <= limit:
        return text
    head = text[: limit - TAIL_CHARS]
    head = head.rsplit(" ", 1)[0] if " " in head else head
    tail = text[-TAIL_CHARS:]
    tail = tail.split(" ", 1)[1] if " " in tail and not text[-TAIL_CHARS - 1].isspace() else tail
    return head + GAP_MARK + tail + CUT_MARK


def live_line(cfg: Mapping[str, Any], rows: list[Mapping[str, Any]] | None) -> str:
    """The line printed as a point finishes."""
    if rows is None:
        return f"{head(cfg)}: already in results, not rerun (resume=true)"
    return f"{head(cfg)}: " + " | ".join(describe(r) for r in rows)


def summarize(points: Iterable[tuple[Mapping[str, Any], str]]
              ) -> tuple[Counter[str], list[str], list[tuple[str, str]]]:
    """``points``: (config, point_id). Counts of the points' latest rows by
    status, read from the results files, the results files read, and the
    coverage gaps of outside implementations (matrix.review.coverage.gap_lines);
    counts of points (a point: a configuration, its impls apart, so that a
    sweep over impls, a job per point and impl, counts each point once):
    ``points``, ``missing`` (points with a job that wrote no row) and
    ``failing points`` (points with a failed, error or timeout row);
    ``jobs``, the (config, point_id) pairs given; of gaps:
    ``coverage gaps``, those not allowed (``allow_skipped`` false at a point
    of the sweep)."""
    pts = list(points)
    latest = {d: latest_rows(d) for d in dict.fromkeys(str(cfg["results_dir"]) for cfg, _ in pts)}
    counts: Counter[str] = Counter()
    swept: list[dict[str, str]] = []
    # A point is one configuration of the sweep, its implementations apart (as
    # the report and compare count them): `impl=mine,padded` under -m makes two
    # jobs of each point, one per impl, and they count once.
    seen: set[tuple[str, str]] = set()
    missing: set[tuple[str, str]] = set()
    failing: set[tuple[str, str]] = set()
    for cfg, pid in pts:
        key = (str(cfg["results_dir"]), config_key(cfg))
        seen.add(key)
        got = list(latest[str(cfg["results_dir"])].get(pid, {}).values())
        if not got:
            missing.add(key)
        swept += got
        for row in got:
            counts[row.get("status") or "missing"] += 1
        if any(row.get("status") in BAD_STATUSES for row in got):
            failing.add(key)
        counts["unflaggable rows"] += sum(unflaggable(row) for row in got)
    counts["points"], counts["missing"], counts["failing points"] = len(seen), len(missing), len(failing)
    counts["jobs"] = len(pts)
    files = [str(results_path(d)) for d in sorted(latest)]
    found = gaps(swept)
    counts["coverage gaps"] = 0 if all(cfg.get("allow_skipped") for cfg, _ in pts) else len(found)
    return counts, files, gap_lines(found)


def config_key(cfg: Mapping[str, Any]) -> str:
    """A point's key: its configuration without ``impl`` (every impl of a point shares it)."""
    from .point import point_id

    return point_id({k: v for k, v in cfg.items() if k != "impl"})


def unflaggable(row: Mapping[str, Any]) -> bool:
    """A timed row with too few samples for compare to tell any change from
    noise (fewer than MIN_SAMPLES: the smallest p-value is not below its alpha)."""
    try:
        iters = int(str(row.get("iters")))
    except ValueError:
        return False  # iters=auto: at least calibrate.MIN_ITERS
    return row.get("status") == "ok" and row.get("roundtrip_p50_us") not in (None, "") and iters < MIN_SAMPLES


def render(counts: Counter[str], files: list[str], *, single: bool = False) -> str:
    """``matrix summary: 4 points, 8 rows: ok 6, refused 2, failed 0, ...``: rows
    by status, then points: those with a failing row, those with none."""
    points = counts["points"]
    rows = sum(counts[s] for s in ORDER if s != "missing")
    parts = ", ".join(f"{s} {counts[s]}" for s in ORDER
                      if s != "missing" and (counts[s] or s in ("ok", "failed", "error", "timeout")))
    line = f"matrix summary: {count(points, 'point')}, {count(rows, 'row')}: {parts}"
    failing_rows = sum(counts[s] for s in BAD_STATUSES)
    if failing_rows:
        line += (f"; failed, error or timeout: {count(failing_rows, 'row')} of "
                 f"{count(counts['failing points'], 'point')}")
    if counts["missing"]:
        line += f"; missing {count(counts['missing'], 'point')} (wrote no row)"
    if single:
        line += " (a single point: sweep with -m key=a,b or a preset such as +matrix=smoke)"
    if counts["unflaggable rows"]:
        line += (f"\nsamples too few: {count(counts['unflaggable rows'], 'timed row')} with fewer than {MIN_SAMPLES} "
                 f"iterations: no change in them can be significant, and compare fails them as unverified "
                 f"(between two runs of the smoke preset it gates their status and correctness only); "
                 f"time with iters={MIN_SAMPLES} or more, or iters=auto")
    return line + (f"\nresults: {', '.join(files)}" if files else "")


# What the sweep's exit status says (pytest's codes where they mean the same).
EXIT_OK, EXIT_BAD, EXIT_NOTHING_CHECKED = 0, 1, 5


def checked_rows(counts: Counter[str]) -> int:
    """Rows that checked something: every status but ``skipped``."""
    return sum(counts[s] for s in STATUS_VALUES if s != "skipped")


def exit_code(counts: Counter[str]) -> int:
    """1 when a point is failed, error, timeout or wrote no row; else 5 when no
    row checked anything (every row skipped: a sweep that proves nothing
    must not pass); else 1 when an outside implementation has a coverage gap
    not allowed; else 0."""
    if any(counts[s] for s in (*BAD_STATUSES, "missing")):
        return EXIT_BAD
    if counts["points"] and not checked_rows(counts):
        return EXIT_NOTHING_CHECKED
    if counts["coverage gaps"]:
        return EXIT_BAD
    return EXIT_OK


def gap_report(lines: list[tuple[str, str]], counts: Counter[str]) -> list[str]:
    """The lines after the summary naming each coverage gap, and what they do to the exit."""
    if not lines:
        return []
    verdict = ("exit 1 (allow_skipped=true passes them)" if counts["coverage gaps"]
               else "allowed (allow_skipped=true)")
    return [f"coverage: {head}: {detail}" for head, detail in lines] + [f"coverage: {len(lines)} gap(s): {verdict}"]


def nothing_checked_line(counts: Counter[str]) -> str:
    """The one line that explains exit 5, or ''."""
    if exit_code(counts) != EXIT_NOTHING_CHECKED:
        return ""
    return (f"error: nothing was checked: all {counts['skipped']} rows are skipped (each row's reason says why, "
            f"e.g. an mlp_mode that contradicts moe_a2a_backend, or an implementation this backend lacks); exit 5")


assert set(ORDER) >= set(STATUS_VALUES)
