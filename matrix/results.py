"""The results table: its schema, atomic appends, and resume.

One row per (point, impl). The file is always valid CSV: each append is one
``write(2)`` of whole lines under an exclusive lock, so a sweep killed at any
moment leaves only whole rows, and parallel sweeps into one directory do not
interleave.
"""

from __future__ import annotations

import csv
import fcntl
import io
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

RESULTS_FILE = "results.csv"

# The configuration of a point: every key of conf's schema that can change a
# measurement. Joined on by `compare`, hashed into `point_id` for `resume`.
CONFIG_COLUMNS: tuple[str, ...] = (
    "cp_size",
    "page_size",
    "seq_lens",
    "shared_kv",
    "split",
    "align",
    "moe_a2a_backend",
    "mlp_mode",
    "impl",
    "backend",
    "device",
    "hidden_size",
    "dtype",
    "num_experts",
    "topk",
    "warmup",
    "iters",
    "seed",
    "flush_l2",
)

# Keys of the schema that steer the run rather than the measurement.
RUN_COLUMNS: tuple[str, ...] = ("timeout_s", "results_dir", "resume", "fault")

PLAN_COLUMNS: tuple[str, ...] = (
    "policy",
    "effective_page_size",
    "effective_id",
    "total_tokens",
    "max_rank_len",
    "padded_total",
    "padding_frac",
    "is_even",
    "claim_holds",
)

# ok: checked and timed. refused: the legacy path declined an uneven plan on every
# rank before any collective (what it must do). passthrough: SCATTERED mode, the
# communicator moves nothing (no timings). skipped: not run (a contradiction, or the
# same effective configuration already ran). failed: a check failed. error/timeout:
# a rank raised, died or hung.
STATUS_VALUES: tuple[str, ...] = ("ok", "failed", "error", "timeout", "skipped", "refused", "passthrough")
GOOD_STATUSES: tuple[str, ...] = ("ok", "refused", "passthrough")
BAD_STATUSES: tuple[str, ...] = ("failed", "error", "timeout")

CHECK_COLUMNS: tuple[str, ...] = (
    "status",
    "reason",
    "failed_check",
    "correct",
    "max_rel_err",
    "even_bitwise_equal",
)

TIMING_COLUMNS: tuple[str, ...] = (
    "gather_p10_us",
    "gather_p50_us",
    "gather_p90_us",
    "gather_mean_us",
    "scatter_p10_us",
    "scatter_p50_us",
    "scatter_p90_us",
    "scatter_mean_us",
    "roundtrip_p10_us",
    "roundtrip_p50_us",
    "roundtrip_p90_us",
    "roundtrip_p99_us",
    "roundtrip_mean_us",
    "roundtrip_iqr_us",
    "local_p10_us",
    "local_p50_us",
    "local_p90_us",
    "local_mean_us",
    "collective_p10_us",
    "collective_p50_us",
    "collective_p90_us",
    "collective_mean_us",
    "rows_moved",
    "bytes_padded",
    "bytes_useful",
    "algbw_padded_GBps",
    "busbw_padded_GBps",
    "algbw_useful_GBps",
    "busbw_useful_GBps",
)

ENV_COLUMNS: tuple[str, ...] = (
    "impl_origin",
    "torch_version",
    "nccl_version",
    "device_name",
    "host",
    "git_sha",
    "timestamp",
    "wall_s",
    "point_id",
    "overrides",
    "repro",
)

COLUMNS: tuple[str, ...] = (
    CONFIG_COLUMNS + RUN_COLUMNS + PLAN_COLUMNS + CHECK_COLUMNS + TIMING_COLUMNS + ENV_COLUMNS
)


class SchemaError(ValueError):
    """A results file whose header is not this version's schema."""


def results_path(results_dir: str | os.PathLike[str]) -> Path:
    return Path(results_dir) / RESULTS_FILE


def _encode(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # round-trips exactly
    return value


def _render(rows: Iterable[Mapping[str, object]], header: bool) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="raise", lineterminator="\n")
    if header:
        writer.writeheader()
    for row in rows:
        writer.writerow({k: _encode(row.get(k)) for k in COLUMNS})
    return buf.getvalue()


def read_header(path: Path) -> list[str] | None:
    """The header of an existing results file, or None when there is none yet."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    with path.open(newline="") as f:
        return next(csv.reader(f), None)


def check_schema(path: Path) -> None:
    """Raise SchemaError (one line) when ``path`` holds another schema's rows."""
    header = read_header(path)
    if header is None or tuple(header) == COLUMNS:
        return
    missing = [c for c in COLUMNS if c not in header]
    extra = [c for c in header if c not in COLUMNS]
    parts = []
    if missing:
        parts.append(f"missing {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    if extra:
        parts.append(f"unknown {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
    detail = "; ".join(parts) or "columns in another order"
    raise SchemaError(
        f"results_dir={path.parent}: {path.name} has another schema ({detail}); "
        "use a new results_dir or move the old file away"
    )


def append_rows(results_dir: str | os.PathLike[str], rows: list[Mapping[str, object]]) -> Path:
    """Append whole rows to ``<results_dir>/results.csv`` atomically.

    The header is written with the first rows. Every row must use only schema
    columns (a typo raises before anything is written).
    """
    path = results_path(results_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    for row in rows:
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise ValueError(f"row has columns outside the schema: {sorted(unknown)}")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        needs_header = os.fstat(fd).st_size == 0
        if not needs_header:
            check_schema(path)
        data = _render(rows, header=needs_header).encode()
        # One write(2): a kill lands before or after it, never inside a line.
        written = os.write(fd, data)
        if written != len(data):  # pragma: no cover - disk full
            raise OSError(f"short write to {path}: {written} of {len(data)} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def completed_point_ids(results_dir: str | os.PathLike[str]) -> set[str]:
    """point_ids already in the results file, for ``resume=true``.

    Any row counts, whatever its status: resume never writes a point twice
    (rerun a failed point into a fresh results_dir)."""
    path = results_path(results_dir)
    if read_header(path) is None:
        return set()
    check_schema(path)
    done: set[str] = set()
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row.get("point_id"):
                done.add(row["point_id"])
    return done
