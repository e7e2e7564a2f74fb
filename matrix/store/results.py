"""The results table: its schema, atomic appends, and resume.

One row per (point, impl). The file is always valid CSV: each append is one
``write(2)`` of whole lines under an exclusive lock, so a sweep killed at any
moment leaves only whole rows, and parallel sweeps into one directory do not
interleave. A write that fails (disk full) is undone; a torn last line left
by anything else is set aside before the next append. Each row names the
run that wrote it (``run_id``); the run's versions, host and machine are one
line of ``runs.jsonl`` beside the table (matrix.store.runs), written under the same
lock before the run's first row.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import fcntl
import functools
import io
import json
import os
import re
import stat
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from nsa_cp_comm.harness.spec import DTYPE_NAMES
from nsa_cp_comm.modes import BACKENDS

from . import inputs
from .outputs import append_whole, write_atomic
from .runs import ADDED_CONFIG_COLUMNS, SCHEMA_VERSION, layout_version, record_run, runs_path

RESULTS_FILE = "results.csv"
# Beside results.csv: the whole text of cells cut to MAX_CELL_CHARS, one JSON object a line.
FULL_TEXT_FILE = "results.full-text.jsonl"
# The longest cell of a free-text column (reason, overrides, ...): a plug-in's error
# can be a compiler log. Configuration columns are bounded by the config's own limits.
MAX_CELL_CHARS = 4096
# The largest results file the readers take: a million rows of a wide schema.
RESULTS_BYTES_MAX = 4 << 30
# The longest line a reader takes: a row whose seq_lens lists millions of
# requests (free-text cells are cut to MAX_CELL_CHARS). A longer line is no
# row of ours: it is refused with the file's size, never read whole.
ROW_BYTES_MAX = 64 << 20
# Readers accept any row the writer can write: Python's csv module refuses fields over
# 131072 characters by default, and a long seq_lens is longer than that.
csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))

# The configuration of a point: every key of conf's schema that can change a
# measurement. Joined on by `compare`, hashed into `point_id` for `resume`.
# The first layouts' columns, then those a later layout added (runs.ADDED_CONFIG_COLUMNS: a new
# configuration column goes there, with the value every older row had).
CONFIG_COLUMNS: tuple[str, ...] = (
    "cp_size", "page_size", "seq_lens", "shared_kv", "split", "align", "moe_a2a_backend", "mlp_mode", "impl",
    "backend", "device", "hidden_size", "dtype", "num_experts", "topk", "warmup", "iters", "seed", "flush_l2",
) + tuple(ADDED_CONFIG_COLUMNS)

# The values each enumerated configuration column's cells hold (a row's resolved values: the
# config's choices add "auto" where a key resolves, matrix.app.config.CHOICES). A cell outside
# them (an empty one aside: a column an older layout lacked) is no row of the writer's: the
# readers set it aside and name its line.
COLUMN_VALUES: dict[str, tuple[str, ...]] = {
    "split": ("zigzag", "round_robin", "dual_chunk_swap", "contiguous"),
    "moe_a2a_backend": ("none", "deepep"),
    "mlp_mode": ("FULL", "SCATTERED"),
    "backend": BACKENDS,
    "device": ("cpu", "cuda"),
    "dtype": DTYPE_NAMES,
} | {col: added.values for col, added in ADDED_CONFIG_COLUMNS.items() if added.values}
# The columns of integers (matrix.app.config.INT_RANGES' keys; its widest value, MAX_SEED, has 10
# digits): a cell that is no such integer (iters may say auto) is no row of the writer's either.
INT_COLUMNS: tuple[str, ...] = ("cp_size", "bystanders", "page_size", "hidden_size", "topk", "iters", "warmup", "seed",
                                "align", "num_experts", "max_capture_size")
_INT_CELL = re.compile(r"\s*(\d{1,10}(\.0)?|)\s*")


@functools.lru_cache(maxsize=4096)  # per row of every column when a folder is read: the cells repeat
def is_int_cell(col: str, cell: object) -> bool:
    """Whether ``cell`` of :data:`INT_COLUMNS`' ``col`` can be the writer's: an
    integer of at most 10 digits, or empty (a column an older layout lacked);
    ``iters`` also ``auto``. What no cast takes (1e400, 400 digits) is not."""
    text = str(cell)
    return bool(_INT_CELL.fullmatch(text)) or (col == "iters" and text.strip() == "auto")

# Keys of the schema that steer the run rather than the measurement.
RUN_COLUMNS: tuple[str, ...] = ("timeout_s", "results_dir", "resume", "workload", "bystanders")

PLAN_COLUMNS: tuple[str, ...] = (
    "policy", "effective_page_size", "effective_id", "total_tokens", "max_rank_len", "padded_total", "padding_frac",
    "is_even", "plan_class", "claim_holds",
)

# What each status means: matrix.review.report.STATUS_MEANING (docs/columns.md renders
# it with these classes).
STATUS_VALUES: tuple[str, ...] = ("ok", "failed", "error", "timeout", "skipped", "refused", "passthrough")
GOOD_STATUSES: tuple[str, ...] = ("ok", "refused", "passthrough")
BAD_STATUSES: tuple[str, ...] = ("failed", "error", "timeout")

CHECK_COLUMNS: tuple[str, ...] = (
    "status", "reason", "failed_check", "correct", "max_rel_err", "even_bitwise_equal",
)

# What each column means: docs/columns.md (docs/doc_tables.py renders it).
TIMING_COLUMNS: tuple[str, ...] = (
    "gather_p10_us", "gather_p50_us", "gather_p90_us", "gather_mean_us",
    "scatter_p10_us", "scatter_p50_us", "scatter_p90_us", "scatter_mean_us",
    "roundtrip_p10_us", "roundtrip_p50_us", "roundtrip_p90_us", "roundtrip_p99_us", "roundtrip_mean_us",
    "roundtrip_iqr_us",
    "local_p10_us", "local_p50_us", "local_p90_us", "local_mean_us",
    "collective_p10_us", "collective_p50_us", "collective_p90_us", "collective_mean_us",
    "rows_moved", "bytes_padded", "bytes_useful",
    "attn_pad_rows", "moe_pad_rows",
    "attn_pad_masked_rows",
    "moe_pad_masked_rows", "moe_pad_expert_max_rows", "graph_pad_rows",
    "algbw_padded_GBps", "busbw_padded_GBps", "algbw_useful_GBps", "busbw_useful_GBps",
)

# Where a row came from. What is the same for every row of one process (versions,
# host, git sha, machine, command) is not here: it is the run's line in
# runs.jsonl, which ``run_id`` names (matrix.store.runs). device_name varies with the
# point's device, so it stays in the row.
PROVENANCE_COLUMNS: tuple[str, ...] = (
    "impl_origin", "device_name", "timestamp", "wall_s", "point_id", "overrides", "repro", "run_id",
)

COLUMNS: tuple[str, ...] = (
    CONFIG_COLUMNS + RUN_COLUMNS + PLAN_COLUMNS + CHECK_COLUMNS + TIMING_COLUMNS + PROVENANCE_COLUMNS
)


class SchemaError(ValueError):
    """A results file whose header is not this version's schema."""


class ResultsPathError(SchemaError):
    """A results path that cannot hold the results file (a directory, a name
    too long, no permission); the message is one line."""


# Errors of a write that found no room: the disk, the quota, the file size limit.
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class ResultsWriteError(OSError):
    """Appending rows failed (disk full, quota, a short write, an I/O error);
    the results file holds exactly what it held before. ``str()`` is one line
    naming the file; ``path`` is the file."""

    def __init__(self, path: Path, cause: OSError | str) -> None:
        code = cause.errno if isinstance(cause, OSError) else None
        why = (cause.strerror or str(cause)) if isinstance(cause, OSError) else cause
        super().__init__(code, f"cannot append to {path}: {why}; the file is as it was before this point")
        self.path = path

    def __str__(self) -> str:
        return str(self.strerror)


def results_path(results_dir: str | os.PathLike[str]) -> Path:
    return Path(results_dir) / RESULTS_FILE


def _encode(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # round-trips exactly
    if isinstance(value, str) and ("\n" in value or "\r" in value):
        # one row, one line: readers tell a damaged line from a row by that
        value = " ".join(value.splitlines())
    if isinstance(value, str) and not value.isascii():
        value = _undecodable_escaped(value)
    return value


def _undecodable_escaped(text: str) -> str:
    """``text`` with each byte that was not UTF-8 where it came from (an
    environment variable's or a path's, read by Python as a lone surrogate)
    written as ``\\xHH``: the file stays UTF-8 and the row is written, where
    encoding it raised and lost the row."""
    try:
        text.encode()
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def bound_cells(rows: list[Mapping[str, object]]) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """``rows`` with every free-text cell over :data:`MAX_CELL_CHARS` cut, its
    length stated; and the whole texts (records of :data:`FULL_TEXT_FILE`)."""
    bounded, full = [], []
    for row in rows:
        out = dict(row)
        for col, value in row.items():
            if col in CONFIG_COLUMNS or not isinstance(value, str) or len(value) <= MAX_CELL_CHARS:
                continue
            note = f" ... [cut: {len(value)} characters; the whole text is in {FULL_TEXT_FILE}]"
            out[col] = value[: MAX_CELL_CHARS - len(note)] + note
            full.append({"point_id": row.get("point_id"), "impl": row.get("impl"), "column": col,
                         "chars": len(value), "text": value})
        bounded.append(out)
    return bounded, full


def append_beside(side: Path, data: bytes, *, lock: bool = False, sync: bool = True) -> int:
    """Append ``data`` to a file beside the results (outputs.append_whole; ``lock``:
    under an exclusive lock of the file's own), creating its directory; return its
    former size, for undoing. ResultsWriteError, with the file as it was, when that fails."""
    try:
        side.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(side, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if lock:
                fcntl.flock(fd, fcntl.LOCK_EX)
            return append_whole(fd, data, sync=sync)
        finally:
            os.close(fd)
    except OSError as exc:
        raise ResultsWriteError(side, exc) from None


def _render(rows: Iterable[Mapping[str, object]], header: bool) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="raise", lineterminator="\n")
    if header:
        writer.writeheader()
    for row in rows:
        writer.writerow({k: _encode(row.get(k)) for k in COLUMNS})
    return buf.getvalue()


def path_error(path: Path, exc: OSError) -> ResultsPathError:
    """The one-line error for a results path that cannot be used as a file."""
    where = f"results_dir={path.parent}"
    if isinstance(exc, IsADirectoryError):
        return ResultsPathError(f"{where}: {path} is a directory, not a results file")
    if exc.errno == errno.ENAMETOOLONG:
        return ResultsPathError(f"{where}: a name in the path is too long for the file system")
    if isinstance(exc, NotADirectoryError):
        return ResultsPathError(f"{where}: a component of {path.parent} is not a directory")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ResultsPathError(f"{where}: {path} is not writable ({exc.strerror})")
    return ResultsPathError(f"{where}: cannot open {path} ({exc.strerror or exc})")


def _check_regular(path: Path) -> None:
    """ResultsPathError (one line) when ``path`` exists and is not a regular
    file: reading a FIFO waits for a writer forever, and rows written to a
    device (a link to /dev/null) are lost."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise path_error(path, exc) from None
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        target = f" (a link to {os.path.realpath(path)})" if path.is_symlink() else ""
        raise ResultsPathError(f"results_dir={path.parent}: {path}{target} is not a regular file")


def read_header(path: Path) -> list[str] | None:
    """The header of an existing results file, or None when there is none yet
    (no file, an empty one, or no whole first line: a torn first write, which
    the next append sets aside). ResultsPathError (one line) for a path that
    cannot be read as a file."""
    _check_regular(path)
    try:
        with path.open("rb") as f:
            first = f.readline(ROW_BYTES_MAX + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise path_error(path, exc) from None
    if len(first) > ROW_BYTES_MAX and not first.endswith(b"\n"):
        raise ResultsPathError(f"results_dir={path.parent}: {path.name}: its first line is longer than "
                               f"{inputs.mib(ROW_BYTES_MAX)} (the file is {path.stat().st_size} bytes): no results header")
    return next(csv.reader([first.decode("utf-8-sig", "replace")]), None) if first.endswith(b"\n") else None


def _first_five(items: list) -> str:
    """The first five of ``items``, and `` ...`` when there are more."""
    return ", ".join(map(str, items[:5])) + (" ..." if len(items) > 5 else "")


def check_schema(path: Path) -> None:
    """Raise SchemaError (one line) when ``path`` holds another schema's rows."""
    header = read_header(path)
    if header is None or tuple(header) == COLUMNS:
        return
    missing = [c for c in COLUMNS if c not in header]
    extra = [c for c in header if c not in COLUMNS]
    parts = [f"{what} {_first_five(cols)}" for what, cols in (("missing", missing), ("unknown", extra)) if cols]
    detail = "; ".join(parts) or "columns in another order"
    version = layout_version(header)
    older = (f", schema {version} of an earlier version (this one writes {SCHEMA_VERSION}; report and compare "
             "still read it)") if version < SCHEMA_VERSION else ""
    raise SchemaError(f"results_dir={path.parent}: {path.name} has another schema ({detail}{older}); "
                      "use a new results_dir or move the old file away")


def torn_path(path: Path) -> Path:
    """Where an append sets aside a torn last line of ``path``."""
    return path.with_name(path.name + ".torn")


def _open_for_append(path: Path) -> int:
    """``path`` opened read-write for appending (created with its directory)."""
    _check_regular(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:
            raise ResultsWriteError(path, exc) from None
        raise path_error(path, exc) from None


def _replaced(fd: int, path: Path) -> bool:
    """Whether ``path`` no longer names the open file ``fd`` (a resume set
    malformed lines aside and renamed a rewritten file into place)."""
    try:
        st = path.stat()
    except OSError:  # cannot tell: the open file it is
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) != (own.st_dev, own.st_ino)


def _locked(path: Path) -> int:
    """``path`` opened for appending under an exclusive lock: the file the name
    holds once the lock is held (a rewrite may have replaced it meanwhile)."""
    while True:
        fd = _open_for_append(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not _replaced(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _last_line_start(fd: int, size: int) -> int:
    """Offset just past the last newline of the file's first ``size`` bytes (0 if none)."""
    end = size
    while end > 0:
        start = max(0, end - (64 << 10))
        block = os.pread(fd, end - start, start)
        i = block.rfind(b"\n")
        if i >= 0:
            return start + i + 1
        end = start
    return 0


def _is_whole_row(fragment: bytes, first_line: bool) -> bool:
    """Whether an unterminated last line is a complete record that only lacks
    its newline: the schema's header (as the first line), or a row with every
    column and balanced quotes."""
    fields = parse_line(fragment, first=first_line)  # None for what csv cannot read (a bare CR in a field)
    if fields is None:
        return False
    return tuple(fields) == COLUMNS if first_line else len(fields) == len(COLUMNS)


def _truncate(fd: int, size: int) -> None:
    """Cut the file back to ``size``; nothing to do for what is not a regular file."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, size)


def _cut_side(path: Path, size: int) -> None:
    """Cut :func:`torn_path` of ``path`` back to ``size``, undoing what was set aside in it."""
    side = os.open(torn_path(path), os.O_WRONLY)
    try:
        _truncate(side, size)
    finally:
        os.close(side)


@dataclass(frozen=True)
class _Tail:
    """How an append continues a file: rows go at ``keep``, after ``prefix``;
    ``torn`` was cut off the end and appended to the side file, which was
    ``side_size`` bytes long before (both for undoing)."""

    keep: int
    prefix: bytes = b""
    torn: bytes = b""
    side_size: int = 0


def _mend_tail(fd: int, path: Path, size: int) -> _Tail:
    """Make the file end at a line boundary before an append.

    An unterminated last line that is a whole record gets its newline;
    anything else after the last newline (a torn write) is appended to
    :func:`torn_path` and cut off, so the next row starts a line of its own
    and the file stays valid CSV."""
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return _Tail(size)
    start = _last_line_start(fd, size)
    if size - start > ROW_BYTES_MAX:
        raise ResultsWriteError(path, f"its last line is {size - start} bytes, longer than any row; "
                                "the file is as it was")
    fragment = os.pread(fd, size - start, start)
    if _is_whole_row(fragment, first_line=start == 0):
        return _Tail(size, prefix=b"\n")
    side_size = append_beside(torn_path(path), fragment + b"\n")
    os.ftruncate(fd, start)
    return _Tail(start, torn=fragment, side_size=side_size)


def _undo(fd: int, path: Path, tail: _Tail) -> None:
    """Put the file (and the side file) back as they were before the append."""
    _truncate(fd, tail.keep)
    if tail.torn:
        os.write(fd, tail.torn)  # the space it held was just freed
        with contextlib.suppress(OSError):
            _cut_side(path, tail.side_size)


def _write_or_undo(fd: int, path: Path, data: bytes, tail: _Tail) -> None:
    """Append ``data`` in one ``write(2)`` and sync it; on any failure (an
    error, a short write) put the files back as they were and raise
    ResultsWriteError."""
    try:
        written = os.write(fd, data)
        if written != len(data):
            raise ResultsWriteError(path, f"short write ({written} of {len(data)} bytes; is the disk full?)")
        os.fsync(fd)
    except OSError as exc:
        _undo(fd, path, tail)
        raise (exc if isinstance(exc, ResultsWriteError) else ResultsWriteError(path, exc)) from None


def _with_run_id(rows: list[Mapping[str, object]], run: Mapping[str, object] | None) -> list[Mapping[str, object]]:
    """``rows`` checked against the schema, each naming ``run``'s id (when a run is given)."""
    run_id = "" if run is None else str(run.get("run_id") or "")
    if run is not None and not run_id:
        raise ValueError("a run's metadata needs a run_id")
    out = []
    for row in rows:
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise ValueError(f"row has columns outside the schema: {sorted(unknown)}")
        if run_id and row.get("run_id") not in (None, "", run_id):
            raise ValueError(f"row names run_id={row['run_id']}, written by run {run_id}")
        out.append({**row, "run_id": run_id} if run_id else row)
    return out


def append_rows(results_dir: str | os.PathLike[str], rows: list[Mapping[str, object]],
                run: Mapping[str, object] | None = None) -> Path:
    """Append whole rows to ``<results_dir>/results.csv`` atomically.

    The header is written with the first rows. Every row must use only schema
    columns (a typo raises before anything is written). Under an exclusive
    lock: a file of another schema raises SchemaError, untouched; ``run``'s
    metadata (matrix.store.runs) goes into runs.jsonl unless this process put it
    there already, and each row gets its ``run_id``; a torn last line is set
    aside (:func:`_mend_tail`, one warning line on stderr); the rows go in
    one ``write(2)``. A failed write (disk full, a short write) raises
    ResultsWriteError with the file exactly as it was; a path that cannot
    hold the file raises ResultsPathError.
    """
    path = results_path(results_dir)
    rows = _with_run_id(rows, run)
    rows, full_texts = bound_cells(rows)
    fd = _locked(path)
    try:
        size = os.fstat(fd).st_size
        if size:
            check_schema(path)  # before changing anything
        if run is not None:
            # the run's line before its first row: no row names a run without one
            try:
                record_run(results_dir, run)
            except OSError as exc:
                raise ResultsWriteError(runs_path(results_dir), exc) from None
        if full_texts:  # the whole texts of cut cells, beside the results file
            append_beside(path.with_name(FULL_TEXT_FILE), "".join(json.dumps(r) + "\n" for r in full_texts).encode())
        tail = _mend_tail(fd, path, size)
        data = tail.prefix + _render(rows, header=tail.keep == 0).encode()
        # One write(2): a kill lands before or after it, never inside a line.
        _write_or_undo(fd, path, data, tail)
        if tail.torn:
            print(f"warning: {path} ended in a torn line ({len(tail.torn)} bytes); it was moved to {torn_path(path)}",
                  file=sys.stderr, flush=True)
    finally:
        os.close(fd)
    return path


# Statuses that resume runs again: the point did not finish on its ranks.
RERUN_STATUSES: tuple[str, ...] = ("error", "timeout")


def row_problem(row: dict[str, str]) -> str:
    """Why a parsed row cannot be this writer's (a cell of the wrong type, or
    outside its column's values), or ""."""
    if row.get("status", "ok") not in STATUS_VALUES:
        return "status"
    for col in INT_COLUMNS:
        if not is_int_cell(col, row.get(col, "")):
            return col
    for col, values in COLUMN_VALUES.items():
        if row.get(col, "") not in values and row.get(col, ""):
            return col
    return ""


def parse_line(line: bytes, first: bool = False) -> list[str] | None:
    """The fields of one line of a results file (``[]`` for a blank one; a
    byte-order mark skipped on the ``first``), or None for a line that is not
    one CSV record on its own. The writer puts every row on one line
    (:func:`_encode`), so a stray quote marks its own line bad, never the
    lines after it."""
    text = line.decode("utf-8-sig" if first else "utf-8", "replace").removesuffix("\n").removesuffix("\r")
    if text.count('"') % 2:
        return None
    try:
        return next(csv.reader([text]), [])
    except csv.Error:
        return None


def records(path: Path, label: str, error: type[Exception]) -> Iterable[tuple[int, bytes, list[str] | None]]:
    """``(line number, line, fields)`` of each line of results file ``path``
    (:func:`parse_line`), read in lines of at most :data:`ROW_BYTES_MAX`."""
    with inputs.open_binary(path, label, RESULTS_BYTES_MAX, error) as f:
        inputs.refuse_other_encoding(f, label, error)
        for i, line in enumerate(inputs.lines(f, label, ROW_BYTES_MAX, error), start=1):
            yield i, line, parse_line(line, first=i == 1)


@dataclass(frozen=True)
class Rows:
    """A results file read line by line: ``rows`` (with their 1-based line
    numbers) are whole rows of the header's shape with cells of the right
    types; ``malformed`` holds the line numbers set aside."""

    header: list[str]
    rows: list[tuple[int, dict[str, str]]]
    malformed: list[int]

    def warning(self, path: Path) -> str:
        """One line on the rows set aside, or "" when there are none."""
        if not self.malformed:
            return ""
        return (f"warning: {path}: {len(self.malformed)} malformed row(s) set aside "
                f"(line {_first_five(self.malformed)}): not whole rows of this schema")


def whole_lines(path: Path, label: str, error: type[Exception]) -> tuple[bytes, list[int], list[str], list[int]]:
    """The header and the lines of results file ``path`` that are each one
    record of the header's width (a stray quote would join lines into one
    record, and pandas would pad a short line), as CSV for pandas; the line
    numbers left out; the header's names; and the line number of each row
    kept, in order."""
    keep: list[str] = []
    header: list[str] = []
    dropped: list[int] = []
    kept: list[int] = []
    for i, line, fields in records(path, label, error):
        if fields == []:
            continue
        if not keep:
            if fields is None:
                raise ValueError("the header is not one CSV line")
            header = fields
        elif fields is None or len(fields) != len(header):
            dropped.append(i)
            continue
        else:
            kept.append(i)
        keep.append(line.decode("utf-8" if keep else "utf-8-sig", "replace").removesuffix("\n").removesuffix("\r"))
    return ("\n".join(keep) + "\n").encode(), dropped, header, kept


def read_rows(path: Path) -> Rows:
    """Every row of ``path`` that is a whole row of its header (field count and
    cell types checked); the others are counted, never merged into a row.
    Bytes that are not UTF-8 are read as U+FFFD; a byte-order mark is skipped."""
    header: list[str] = []
    rows: list[tuple[int, dict[str, str]]] = []
    malformed: list[int] = []
    try:
        for i, _, fields in records(path, f"results_dir={path.parent}: {path.name}", ResultsPathError):
            if fields == []:
                continue
            if not header:
                if fields is None:
                    return Rows([], [], [])
                header = fields
            elif fields is None or len(fields) != len(header) or row_problem(row := dict(zip(header, fields))):
                malformed.append(i)
            else:
                rows.append((i, row))
    except OSError as exc:
        raise path_error(path, exc) from None
    return Rows(header, rows, malformed)


def set_aside_malformed(path: Path) -> list[int]:
    """Move the lines of ``path`` that are not whole rows (:func:`read_rows`'s
    ``malformed``) to :func:`torn_path` and rewrite ``path`` without them, under
    the append lock: the rest is written to a temporary file and renamed into
    place, so ``pandas.read_csv`` reads the file again and a kill leaves the old
    file or the new one. Returns the line numbers moved (one warning line on
    stderr). Where the rewrite cannot be done (a full disk) the file stays as it
    was and the warning says so; readers still skip the lines."""
    read = read_rows(path)
    if not read.malformed:
        return []
    fd = _locked(path)
    try:
        read = read_rows(path)  # again, under the lock: an append may have come first
        if not read.malformed:
            return []
        bad = set(read.malformed)
        kept, moved = [], []
        for i, line, _ in records(path, f"results_dir={path.parent}: {path.name}", ResultsPathError):
            (moved if i in bad else kept).append(line)
        moved = b"".join(line.removesuffix(b"\n").removesuffix(b"\r") + b"\n" for line in moved)
        kept = b"".join(kept)
        warning = read.warning(path)
        try:
            side_size = append_beside(torn_path(path), moved)
            try:
                write_atomic(path, kept)
            except OSError:
                _cut_side(path, side_size)
                raise
        except OSError as exc:
            print(f"{warning}; they stay in the file: cannot rewrite it ({' '.join(str(exc).split())})",
                  file=sys.stderr, flush=True)
            return []
        print(f"{warning}; moved to {torn_path(path)}", file=sys.stderr, flush=True)
        return read.malformed
    finally:
        os.close(fd)
