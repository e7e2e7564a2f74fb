"""Input handling and rendering shared by ``matrix.report`` and ``matrix.compare``.

Both tools take a results argument (a results directory or a CSV file), load it
into a DataFrame of strings, and report bad input as one line with exit code 2.
Nothing here writes files.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from matrix.results import CONFIG_COLUMNS, COLUMNS, RESULTS_FILE, TIMING_COLUMNS, results_path

# A table without these cannot be joined (config) or triaged (status); every
# other schema column is filled with empty cells when absent, so a file from a
# slightly older schema still reports.
REQUIRED_COLUMNS: tuple[str, ...] = CONFIG_COLUMNS + ("status",)

NUMERIC_COLUMNS: tuple[str, ...] = TIMING_COLUMNS + (
    "cp_size",
    "page_size",
    "hidden_size",
    "num_experts",
    "topk",
    "warmup",
    "iters",
    "seed",
    "timeout_s",
    "total_tokens",
    "max_rank_len",
    "padded_total",
    "padding_frac",
    "max_rel_err",
    "wall_s",
)

BOOL_COLUMNS: tuple[str, ...] = ("correct", "even_bitwise_equal", "is_even", "claim_holds")

# Hidden column naming the file a row came from (several results.csv below a dir).
SOURCE = "_source"

_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


class InputError(Exception):
    """Bad command-line input: printed as one ``error: ...`` line, exit code 2."""


@dataclass(frozen=True)
class Run:
    """One results argument, resolved and loaded (all cells as strings)."""

    arg: str  # the argument's name, e.g. "RESULTS" or "BASE"
    value: str  # as the user gave it
    files: tuple[Path, ...]
    raw: pd.DataFrame

    @property
    def home(self) -> Path:
        """Where outputs belong by default: next to the CSV, or the given directory
        when several CSVs were concatenated."""
        if len(self.files) == 1:
            return self.files[0].parent
        return Path(self.value)

    def notes(self) -> list[str]:
        """Lines telling the user which files were read, when that was not obvious."""
        if len(self.files) == 1:
            return []
        listed = ", ".join(str(f) for f in self.files)
        return [f"note: {self.arg}={self.value}: concatenated {len(self.files)} {RESULTS_FILE} files: {listed}"]


def one_line(text: object, limit: int = 300) -> str:
    """``text`` squeezed onto one line and cut at ``limit`` characters."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def resolve_csvs(arg: str, value: str) -> list[Path]:
    """The CSV file(s) a results argument names (see module docstring)."""
    path = Path(value)
    if not path.exists():
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


def _read_one(arg: str, value: str, path: Path) -> pd.DataFrame:
    where = f"{arg}={value}" if Path(value) == path else f"{arg}={value}: {path}"
    try:
        # Strings throughout: the writer's exact text is what `compare` joins on,
        # and empty cells stay "" instead of becoming NaN in half the columns.
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        return pd.DataFrame({c: pd.Series(dtype=str) for c in COLUMNS})
    except (OSError, ValueError) as exc:  # ParserError and UnicodeDecodeError are ValueErrors
        raise InputError(f"{where}: cannot read as CSV: {one_line(exc, 200)}") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        shown = ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else "")
        raise InputError(
            f"{where}: not a results table: {len(missing)} required column(s) missing ({shown})"
        )
    for col in COLUMNS:
        if col not in frame.columns:
            frame[col] = ""
    frame[SOURCE] = str(path)
    return frame


def load_run(arg: str, value: str) -> Run:
    """Resolve and read a results argument; raise InputError on anything unusable."""
    files = resolve_csvs(arg, value)
    frames = [_read_one(arg, value, f) for f in files]
    raw = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    if raw.empty:
        where = "" if len(files) == 1 else f" in any of {len(files)} {RESULTS_FILE} files"
        raise InputError(f"{arg}={value}: no rows{where} (empty run)")
    return Run(arg=arg, value=value, files=tuple(files), raw=raw.reset_index(drop=True))


def parse_bool(series: pd.Series) -> pd.Series:
    """``True``/``False`` text as a nullable boolean; anything else is <NA>."""
    low = series.astype(str).str.strip().str.lower()
    out = pd.Series(pd.NA, index=series.index, dtype="boolean")
    out[low.isin(_TRUE)] = True
    out[low.isin(_FALSE)] = False
    return out


def typed(raw: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``raw`` with numeric and boolean columns converted (bad cells -> NA)."""
    frame = raw.copy()
    for col in NUMERIC_COLUMNS:
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
    if math.isfinite(f) and f == int(f):
        return str(int(f))
    return repr(f)


# --- markdown tables (pandas' to_markdown needs tabulate, which is not a dependency)


def is_missing(value: object) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, (float, np.floating)) and math.isnan(value)


def fmt(value: object) -> str:
    """One cell as text: floats rounded for reading, missing as empty."""
    if is_missing(value):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        v = float(value)
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
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
    return one_line(value, 160)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, (bool, np.bool_)) and not is_missing(value)


def md_table(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub markdown table, padded so it also reads well in a terminal.

    Columns whose non-empty cells are all numbers are right-aligned."""
    rows = [list(r) for r in rows]
    numeric = [
        any(_is_number(r[i]) for r in rows) and all(_is_number(r[i]) or is_missing(r[i]) for r in rows)
        for i in range(len(columns))
    ]
    cells = [[fmt(v).replace("|", "\\|") for v in r] for r in rows]
    head = [str(c).replace("|", "\\|") for c in columns]
    widths = [max([3, len(head[i])] + [len(r[i]) for r in cells]) for i in range(len(columns))]

    def line(values: Sequence[str]) -> str:
        padded = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "| " + " | ".join(padded) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if num else "-" * w for w, num in zip(widths, numeric)) + " |"
    return "\n".join([line(head), rule] + [line(r) for r in cells])


def frame_md(frame: pd.DataFrame, index: bool = False) -> str:
    """``frame`` as a markdown table (optionally with its index as leading columns)."""
    if index:
        frame = frame.reset_index()
    return md_table([str(c) for c in frame.columns], frame.itertuples(index=False, name=None))
