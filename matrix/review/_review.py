"""Input handling and rendering shared by ``matrix.report`` and ``matrix.compare``.

Both tools take a results argument (a results directory or a CSV file), load it
into a DataFrame of strings, keep one row per point (the last in file order),
and report bad input as one line with exit code 2. Nothing here writes files.

Each file is read by its layout (matrix.store.runs.layout_version): whatever the
layout, the frame has the same columns (:data:`READ_COLUMNS`): a row of
layout 3 gets its run's environment joined from ``runs.jsonl`` by
``run_id``; a row of layout 2 carries it already; a row of layout 1 also
gets the statuses it was written before (:func:`_statuses_of_layout_1`).

Everything runs column-wise (no per-row Python loops over the table), so a
200k-row results file loads and dedupes in about a second.
"""

from __future__ import annotations

import collections
import io
import math
import numbers
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..store import inputs
from ..store.results import (
    BAD_STATUSES, COLUMN_VALUES, CONFIG_COLUMNS, COLUMNS, INT_COLUMNS, RESULTS_FILE, TIMING_COLUMNS, is_int_cell,
    results_path, whole_lines,
)
from ..store.runs import (ADDED_CONFIG_COLUMNS, LAYOUT2_ENV, META_COLUMNS, RUNS_FILE, Runs, cell, layout_version,
                          read_runs)

# A table without these cannot be joined (config) or triaged (status); every
# other schema column is filled with empty cells when absent, so a file from a
# slightly older schema still reports.
REQUIRED_COLUMNS: tuple[str, ...] = tuple(c for c in CONFIG_COLUMNS if c not in ADDED_CONFIG_COLUMNS) + ("status",)
# The columns of a loaded run, whatever the file's layout: the rows' own, and
# the environment of the run each row names.
READ_COLUMNS: tuple[str, ...] = COLUMNS + tuple(c for c in META_COLUMNS if c not in COLUMNS)

# Verdict classes of the status column: GOOD_STATUSES rows did what the point asks
# (measured, refused an uneven plan as it must, or had nothing to move); BAD_STATUSES
# rows fail a sweep; skipped is neither (the point did not run).
NEUTRAL: tuple[str, ...] = ("skipped",)

BOOL_COLUMNS: tuple[str, ...] = ("correct", "even_bitwise_equal", "is_even", "claim_holds")

# Hidden columns: the file a row came from, and its canonical point key.
SOURCE = "_source"
# A row's spread: what report and compare read as its noise.
SPREAD = "roundtrip_iqr_us"
POINT_KEY = "_point"

# A column of files written while the matrix had a test-only key that made a
# rank crash, hang or raise on purpose: such a row measured nothing, and it
# shares its configuration columns with the real point, so it is not read.
_INJECTED_COLUMN = "fault"


class InputError(Exception):
    """Bad command-line input: printed as one ``error: ...`` line, exit code 2."""


@dataclass(frozen=True)
class Run:
    """One results argument, resolved and loaded (cells as strings).

    ``raw`` holds every row as read, with ``POINT_KEY`` (an integer naming the
    row's point within this run); ``config`` the canonical text of its
    configuration columns (same index); ``latest`` one row per point: the last
    in file order, i.e. the newest append (a resumed rerun, a repro written into
    the same file)."""

    arg: str  # the argument's name, e.g. "RESULTS" or "BASE"
    value: str  # as the user gave it
    files: tuple[Path, ...]
    raw: pd.DataFrame
    config: pd.DataFrame
    latest: pd.DataFrame
    upgraded: dict[str, int] = field(default_factory=dict)  # layout-1 rows re-read, by new status
    malformed: int = 0  # lines set aside: not whole rows of the header, or cells of the wrong type
    malformed_at: list[str] = field(default_factory=list)  # where: line numbers (file:line of several files)
    # rows of layout 3 whose run_id has no line in runs.jsonl, by run_id ("" for none)
    unknown_runs: dict[str, int] = field(default_factory=dict)
    runs_skipped: int = 0  # lines of runs.jsonl that are no run's

    @property
    def home(self) -> Path:
        """Where outputs belong by default: next to the CSV, or the given directory
        when several CSVs were concatenated."""
        return self.files[0].parent if len(self.files) == 1 else Path(self.value)

    @property
    def latest_config(self) -> pd.DataFrame:
        return self.config.loc[self.latest.index]

    @property
    def duplicates(self) -> int:
        """Rows dropped because a later row of the same point and impl superseded them."""
        return len(self.raw) - len(self.latest)

    def duplicate_note(self) -> str:
        """One sentence on the duplicate rows, where there are any."""
        keys = self.raw[POINT_KEY]
        # points as configurations: the impls of one point count once
        where = self.config.loc[keys.duplicated(keep=False), [c for c in self.config.columns if c != "impl"]]
        return (f"{self.duplicates} duplicate row(s) of {len(where.drop_duplicates())} point(s) dropped: "
                "the latest run's row of each point and impl is used (within one run, a failing row over a passing "
                "one)")

    def unknown_runs_note(self) -> str:
        """One sentence on rows whose run has no metadata, where there are any."""
        ids = sorted(self.unknown_runs, key=lambda r: (-self.unknown_runs[r], r))
        named = ", ".join(f"{r or '(empty)'}: {self.unknown_runs[r]}" for r in ids[:3])
        more = f", ... {len(ids) - 3} more" if len(ids) > 3 else ""
        return (f"{sum(self.unknown_runs.values())} row(s) name a run_id with no line in {RUNS_FILE} "
                f"(rows by run_id: {named}{more}): their environment ({', '.join(LAYOUT2_ENV)}, ...) is unknown")

    def notes(self) -> list[str]:
        """Lines telling the user what was read and how, when that was not obvious."""
        said = []
        if len(self.files) > 1:
            said.append(f"concatenated {len(self.files)} {RESULTS_FILE} files: {', '.join(str(f) for f in self.files)}")
        if self.duplicates:
            said.append(self.duplicate_note())
        if self.malformed:
            at = ", ".join(self.malformed_at[:5]) + (" ..." if len(self.malformed_at) > 5 else "")
            said.append(f"{self.malformed} malformed row(s) set aside (line {at}: not whole rows of the header, "
                        "cells of the wrong type, or outside their column's values)")
        if self.upgraded:
            parts = ", ".join(f"{n} ok row(s) as {s}" for s, n in sorted(self.upgraded.items()))
            said.append(f"written before the refused/passthrough statuses; read {parts}")
        if self.unknown_runs:
            said.append(self.unknown_runs_note())
        if self.runs_skipped:
            said.append(f"{self.runs_skipped} unreadable line(s) of {RUNS_FILE} skipped")
        return [f"note: {self.arg}={self.value}: {line}" for line in said]


def one_line(text: object, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def resolve_csvs(arg: str, value: str) -> list[Path]:
    """The CSV file(s) a results argument names (see module docstring)."""
    path = Path(value)
    if not os.path.exists(path):  # False, never an OSError, for a name too long to exist
        raise InputError(f"{arg}={value}: no such file or directory")
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise InputError(f"{arg}={value}: not a file or directory")
    direct = results_path(path)
    if direct.is_file():
        return [direct]
    try:
        found = sorted(p for p in path.rglob(RESULTS_FILE) if p.is_file())
    except OSError as exc:
        raise InputError(f"{arg}={value}: cannot search the directory: {one_line(exc)}") from None
    if not found:
        raise InputError(f"{arg}={value}: no {RESULTS_FILE} in or below this directory")
    return found


def _statuses_of_layout_1(frame: pd.DataFrame) -> dict[str, int]:
    """The statuses of a layout-1 file's rows, written before refused/passthrough existed.

    Such files say ``ok`` for a legacy row that refused an uneven plan (no
    timings) and for padded/legacy in SCATTERED mode (a timed no-op). Both are
    recognised from the configuration and the plan, never from the reason text,
    and get today's status, so old baselines report and compare like new runs."""
    frame["status"] = frame["status"].astype(object)  # categories would refuse the new values
    ok = frame["status"].str.strip().eq("ok")
    untimed = frame["roundtrip_p50_us"].str.strip().eq("")
    refused = ok & frame["impl"].eq("legacy") & frame["is_even"].str.strip().str.lower().eq("false") & untimed
    passthrough = ok & frame["mlp_mode"].str.strip().eq("SCATTERED") & frame["impl"].isin(["padded", "legacy"])
    frame.loc[refused, "status"] = "refused"
    frame.loc[passthrough, "status"] = "passthrough"
    # a pass-through moved nothing: its microseconds of copying are not a measurement
    frame.loc[passthrough, [c for c in TIMING_COLUMNS if c in frame.columns]] = ""
    return {k: int(v) for k, v in (("refused", refused.sum()), ("passthrough", passthrough.sum())) if v}


# What no configuration value holds (the app validates every one): a control
# character in a key cell (a NUL, a stray escape) is a damaged row, which would
# otherwise read as a point of its own.
_CONTROL = r"[\x00-\x1f\x7f]"
# The same bytes in a file's text, the line break aside: a file without one
# has no cell to look at (most files; the per-column look is then skipped).
_CONTROL_BYTE = re.compile(rb"(?!\n)" + _CONTROL.encode())


def _control_chars(series: pd.Series) -> np.ndarray:
    """Cells of ``series`` holding a control character, per row (a category's text read once)."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        bad = np.asarray(series.cat.categories.astype(str).str.contains(_CONTROL, regex=True), dtype=bool)
        codes = series.cat.codes.to_numpy()
        return np.where(codes >= 0, bad[np.clip(codes, 0, None)] if len(bad) else False, False)
    return series.astype(str).str.contains(_CONTROL, regex=True).to_numpy(dtype=bool)


def _type_problems(frame: pd.DataFrame, data: bytes | None = None) -> pd.Series:
    """Rows whose cells cannot be the writer's: an integer column's cell that is
    no writer's integer (:func:`matrix.store.results.is_int_cell`: a row shifted
    by a lost or extra field, a 1e400), an enumerated configuration cell
    outside its column's values (:data:`matrix.store.results.COLUMN_VALUES`), a
    configuration cell holding a control character. An unknown status is
    kept: the tools count it as bad (a row set aside could hide a failure).
    ``data``: the file's text the frame was read from, when at hand."""
    bad = pd.Series(False, index=frame.index)
    for col in (c for c in INT_COLUMNS if c in frame.columns):
        bad |= ~each_value(frame[col], lambda v, c=col: is_int_cell(c, v)).astype(bool)
    for col, values in COLUMN_VALUES.items():
        if col in frame.columns:
            bad |= ~frame[col].astype(str).isin(("", *values))
    if data is not None and not _CONTROL_BYTE.search(data):
        return bad
    for col in CONFIG_COLUMNS:
        if col in frame.columns:
            bad |= _control_chars(frame[col])
    return bad


@dataclass
class _File:
    """One results file as read: its rows in the reader's columns, and what
    the reading found (see :class:`Run`)."""

    frame: pd.DataFrame
    upgraded: dict[str, int] = field(default_factory=dict)
    malformed: int = 0
    unknown_runs: dict[str, int] = field(default_factory=dict)
    runs_skipped: int = 0
    malformed_lines: list[int] = field(default_factory=list)  # the file's line numbers set aside


def join_runs(frame: pd.DataFrame, runs: Runs, columns: Iterable[str]) -> dict[str, int]:
    """Give each row of ``frame`` the ``columns`` (fields of matrix.store.runs.META_COLUMNS)
    of the run its ``run_id`` names, as text; empty where that run has no line.
    Returns the rows of each run_id that has no line."""
    ids = frame["run_id"].astype(str).str.strip()
    codes, uniques = pd.factorize(ids, use_na_sentinel=False)
    for col in columns:
        values = np.array([cell(runs.by_id.get(u, {}).get(col)) for u in uniques], dtype=object)
        frame[col] = pd.Categorical(values[codes])
    unknown = ids[~ids.isin(list(runs.by_id))]
    return {str(k): int(v) for k, v in unknown.value_counts().items()}


def _read_one(arg: str, value: str, path: Path, wanted: frozenset[str]) -> _File:
    where = f"{arg}={value}" if Path(value) == path else f"{arg}={value}: {path}"
    # Strings throughout: the writer's exact text is what `compare` joins on,
    # and empty cells stay "" instead of becoming NaN in half the columns.
    # Only the columns a tool uses are read: a 200k-row file has 15M cells.
    options = dict(dtype=_DTYPES, keep_default_na=False, usecols=lambda c: c in wanted or c == _INJECTED_COLUMN)
    try:
        # every row is one line: a stray quote must not join lines into a record,
        # and a line of another width is not a row (read_csv would pad it)
        data, dropped, header, kept = whole_lines(path, where, InputError)
        frame = pd.read_csv(io.BytesIO(data), **options)
    except pd.errors.EmptyDataError:
        return _File(pd.DataFrame({c: pd.Series(dtype=str) for c in READ_COLUMNS if c in wanted}))
    except (OSError, ValueError) as exc:  # ParserError and UnicodeDecodeError are ValueErrors
        raise InputError(f"{where}: cannot read as CSV: {one_line(exc, 200)}") from None
    for col in frame.columns:
        categories = getattr(frame[col].dtype, "categories", None)
        if categories is not None and not pd.api.types.is_string_dtype(categories.dtype):
            # read_csv types the categories (True, 2, 1.0); the tools work on text
            frame[col] = frame[col].cat.rename_categories([str(v) for v in categories])
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        shown = ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else "")
        raise InputError(f"{where}: not a results table: {len(missing)} required column(s) missing ({shown})")
    lines = np.asarray(kept, dtype=np.int64)  # each row's line in the file
    if _INJECTED_COLUMN in frame.columns:
        injected = ~frame[_INJECTED_COLUMN].astype(str).str.strip().isin(["", "none"]).to_numpy()
        frame = frame[~injected].drop(columns=_INJECTED_COLUMN).reset_index(drop=True)
        lines = lines[~injected]
    aside = list(dropped)
    if len(frame):
        bad = _type_problems(frame, data).to_numpy()
        if bad.any():
            aside += lines[bad].tolist()
            frame = frame[~bad].reset_index(drop=True)
    layout = layout_version(header)
    for col, added in ADDED_CONFIG_COLUMNS.items():
        if layout < added.layout and added.before is not None:  # what every row of the older layout had
            frame[col] = pd.Categorical([added.before] * len(frame))
    for col in READ_COLUMNS:
        if col in wanted and col not in frame.columns and not (layout >= 3 and col in META_COLUMNS):
            frame[col] = ""
    file = _File(frame, malformed=len(aside), malformed_lines=sorted(aside))
    try:
        runs = read_runs(path.parent) if layout >= 3 else Runs()
    except inputs.BadInputFile as exc:
        raise InputError(f"{where}: {exc}") from None
    # How a file of each layout (matrix.store.runs.layout_version) becomes rows of READ_COLUMNS: layout 1 was written
    # before refused/passthrough, layout 2 carries the environment in its rows, 3 and on join it from runs.jsonl.
    if layout == 1 and len(frame):
        file.upgraded = _statuses_of_layout_1(frame)
    elif layout >= 3:
        file.unknown_runs = join_runs(frame, runs, [c for c in META_COLUMNS if c in wanted])
        file.runs_skipped = runs.skipped_lines
    file.frame[SOURCE] = str(path)
    return file


def each_value(series: pd.Series, fn: Callable[[object], object]) -> pd.Series:
    """``fn`` of every cell, computed once per distinct value."""
    codes, uniques = pd.factorize(series, use_na_sentinel=False)
    table = np.array([fn(u) for u in uniques], dtype=object)
    return pd.Series(table[codes], index=series.index, dtype=object)


def point_codes(config: pd.DataFrame) -> np.ndarray:
    """An integer per row, equal for rows whose every column is equal (exact:
    the columns' codes are combined one at a time and renumbered, no hashing)."""
    code = np.zeros(len(config), dtype=np.int64)
    for col in config.columns:
        part, uniques = pd.factorize(config[col], use_na_sentinel=False)
        code, _ = pd.factorize(code * max(len(uniques), 1) + part)
    return code.astype(np.int64)


# Text columns with few distinct values are read as categories: a 200k-row
# file then holds each distinct string once instead of once per cell (a tenth
# of the memory), and factorising them is nearly free. Everything else is text.
_CATEGORIES: frozenset[str] = frozenset(CONFIG_COLUMNS) | {
    "timeout_s", "results_dir", "resume", _INJECTED_COLUMN, "policy", "effective_page_size", "is_even", "claim_holds",
    "plan_class",
    "status", "reason", "failed_check", "correct", "even_bitwise_equal", "impl_origin", "device_name", "overrides",
    "run_id", *LAYOUT2_ENV,
}
_DTYPES = collections.defaultdict(lambda: str, {c: "category" for c in _CATEGORIES})

# Columns every load reads: the key (configuration and bystanders), the verdict, what layout 1 needs for its
# statuses, and the run each row names.
BASE_COLUMNS: frozenset[str] = frozenset(CONFIG_COLUMNS + REQUIRED_COLUMNS + ("is_even", "roundtrip_p50_us", "run_id",
                                                                       "bystanders"))


def _summed(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    return dict(sum(map(collections.Counter, counts), collections.Counter()))  # every count is positive


def load_run(arg: str, value: str, columns: Iterable[str] | None = None) -> Run:
    """Resolve and read a results argument; raise InputError on anything unusable.

    ``columns``: the columns of :data:`READ_COLUMNS` the caller uses (default:
    all); only those (and the key and status columns) are read, the others
    are absent."""
    wanted = frozenset(READ_COLUMNS) if columns is None else BASE_COLUMNS | frozenset(columns)
    files = resolve_csvs(arg, value)
    read = [_read_one(arg, value, f, wanted) for f in files]
    raw = pd.concat([f.frame for f in read], ignore_index=True) if len(read) > 1 else read[0].frame
    malformed = sum(f.malformed for f in read)
    malformed_at = [f"{path}:{line}" if len(files) > 1 else str(line)
                    for path, f in zip(files, read) for line in f.malformed_lines]
    if raw.empty:
        where = "" if len(files) == 1 else f" in any of {len(files)} {RESULTS_FILE} files"
        aside = f"; {malformed} malformed row(s) set aside" if malformed else ""
        raise InputError(f"{arg}={value}: no rows{where} (empty run{aside})")
    config = pd.DataFrame({c: each_value(raw[c], canonical) for c in CONFIG_COLUMNS})
    raw[POINT_KEY] = point_codes(config.assign(_world=world(raw)))
    latest = raw.loc[latest_rows(raw)]
    return Run(arg=arg, value=value, files=tuple(files), raw=raw, config=config, latest=latest,
               upgraded=_summed(f.upgraded for f in read), malformed=malformed, malformed_at=malformed_at,
               unknown_runs=_summed(f.unknown_runs for f in read), runs_skipped=sum(f.runs_skipped for f in read))


def latest_rows(raw: pd.DataFrame) -> pd.Index:
    """The row kept for each point and name: the last run's (file order), and
    within one run the last failing row if any failed, else its last. Two rows
    of one run are no rerun of each other (one implementation swept twice,
    or two that declared one name): keeping the last would drop the other's
    failure as a duplicate."""
    rows = pd.DataFrame({"key": raw[POINT_KEY].to_numpy(), "run": raw["run_id"].astype(str).str.strip().to_numpy(),
                         "bad": raw["status"].astype(str).str.strip().isin(BAD_STATUSES).to_numpy(),
                         "order": np.arange(len(raw))}, index=raw.index)
    per_run = rows.sort_values(["key", "run", "bad", "order"]).groupby(["key", "run"], sort=False).tail(1)
    return per_run.sort_values("order").drop_duplicates("key", keep="last").index


def world(rows: pd.DataFrame) -> pd.Series:
    """Each row's bystander count, canonical ("0" where the file has none):
    a world larger than the CP group makes another point (as point_id says),
    so it is part of a point's key beside the configuration columns."""
    return each_value(rows["bystanders"].astype(object), canonical).replace("", "0")


def parse_bool(series: pd.Series) -> pd.Series:
    """``True``/``False`` text as a nullable boolean; anything else is <NA>."""
    low = series.astype(str).str.strip().str.lower()
    out = pd.Series(pd.NA, index=series.index, dtype="boolean")
    out[low.isin(["true", "1", "yes"])] = True
    out[low.isin(["false", "0", "no"])] = False
    return out


def typed(raw: pd.DataFrame, numeric: Iterable[str]) -> pd.DataFrame:
    """A copy of ``raw`` with the ``numeric`` and boolean columns converted (bad
    cells -> NA) and ``status`` stripped."""
    frame = raw.copy()
    frame["status"] = frame["status"].str.strip()  # once per category, before they go
    for col in frame.columns:
        if isinstance(frame[col].dtype, pd.CategoricalDtype):  # plain values for groupby/crosstab
            frame[col] = frame[col].astype(object)
    for col in numeric:
        if col in frame.columns:
            frame[col] = pd.to_numeric(frame[col], errors="coerce")
    for col in BOOL_COLUMNS:
        if col in frame.columns:
            frame[col] = parse_bool(frame[col])
    return frame


def canonical(value: object) -> str:
    """A cell's text normalised for joining: ``4`` == ``4.0``, ``true`` ==
    ``True``, ``[1, 2]`` == ``[1,2]``."""
    s = str(value).strip()
    low = s.lower()
    if low in ("true", "false"):
        return low.capitalize()
    try:
        f = float(s)
    except ValueError:
        return "".join(s.split())
    return str(int(f)) if math.isfinite(f) and f == int(f) else repr(f)


# --- markdown tables (tabulate through DataFrame.to_markdown; cells pre-formatted)


def is_missing(value: object) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, (float, np.floating)) and math.isnan(value)


def json_value(v: object) -> object:
    """A cell as a JSON value: numbers as numbers (NaN as null, infinities as
    text), bools as bools, everything else as text."""
    if is_missing(v):
        return None
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        f = float(v)
        return f if math.isfinite(f) else ("inf" if f > 0 else "-inf")
    return str(v)


def fmt(value: object) -> str:
    """One cell as text (its :func:`json_value`): floats rounded for reading, missing as empty."""
    v = json_value(value)
    if v is None:
        return ""
    if isinstance(v, str):
        return one_line(v, 160)
    if not isinstance(v, float):  # a bool or an int
        return str(v)
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    a = abs(v)
    if a >= 1000:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def _numeric(col: pd.Series) -> bool:
    """Whether a column reads as numbers (right-aligned): non-bool numbers and gaps only."""
    if pd.api.types.is_bool_dtype(col.dtype):
        return False
    if pd.api.types.is_numeric_dtype(col.dtype):
        return True
    values = [v for v in col if not is_missing(v)]
    return bool(values) and all(isinstance(v, numbers.Number) and not isinstance(v, (bool, np.bool_)) for v in values)


def frame_md(frame: pd.DataFrame, index: bool = False) -> str:
    """``frame`` as a GitHub markdown table (optionally with its index as leading
    columns). Cells go through :func:`fmt`; numeric columns are right-aligned."""
    if index:
        frame = frame.reset_index()
    align = ["right" if _numeric(frame[c]) else "left" for c in frame.columns]
    names = [str(c) for c in frame.columns]
    text = pd.DataFrame({n: [fmt(v).replace("|", "\\|") for v in frame[c]] for n, c in zip(names, frame.columns)})
    return text.to_markdown(index=False, disable_numparse=True, colalign=align)


def holds(series: pd.Series, value: bool = True) -> pd.Series:
    """Plain-bool mask of cells equal to ``value``; empty cells never match."""
    return series.eq(value).fillna(False).astype(bool)


def layout_label(plans: pd.DataFrame) -> pd.Series:
    """A plan's split layout as one label: the policy, and the page size where it matters."""
    paged = plans["policy"].eq("zigzag_page")
    policy = plans["policy"].map(lambda v: fmt(v) or "(empty)")
    return policy.where(~paged, plans["policy"] + " p" + plans["page_size"].map(fmt))


def m_stride(df: pd.DataFrame) -> pd.DataFrame:
    """The rows whose buffer is the plan's own, ``max_rank_len`` rows per rank:
    a row of an implementation with another stride (padded at the split to
    ``P``) describes its own buffer (the designs section compares them)."""
    if not {"padded_total", "max_rank_len", "cp_size"} <= set(df.columns):
        return df
    other = pd.to_numeric(df["padded_total"], errors="coerce").ne(
        pd.to_numeric(df["max_rank_len"], errors="coerce") * pd.to_numeric(df["cp_size"], errors="coerce"))
    return df[~(other & df["padded_total"].notna() & df["max_rank_len"].notna())]
