"""A results folder as a sweep sees it: checked once, read once, then appended to.

Every point of a sweep asks one :class:`Folder` (:meth:`Folder.of`, one per
folder and process) whether it is done (resume), for the latest row of each
point and implementation, and for an earlier point of the same effective
configuration; it writes its rows through it. The folder reads results.csv
once and afterwards only the bytes appended since, by this process or by
another writer (a second sweep, SLURM jobs on other nodes), so what a sweep
reads of its folder grows with its rows, not with their square. A file
replaced or cut short (a resume that set malformed lines aside, a user's
edit) is read again whole.

Every file of the folder is held to one set of rules (:meth:`Folder.check`,
before any point runs): a regular file or absent (a FIFO would wait for a
writer forever, rows written to a link to /dev/null are lost), writable, and
within its size; every line read is bounded (:func:`matrix.store.inputs.lines`),
so a file of one 1 GiB line is refused with its size, never loaded whole.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from . import inputs
from .outputs import check_dir
from .results import (
    FULL_TEXT_FILE, RERUN_STATUSES, RESULTS_BYTES_MAX, ROW_BYTES_MAX, ResultsPathError, Rows, append_rows,
    check_schema, parse_line, path_error, results_path, row_problem, set_aside_malformed, torn_path,
)
from .runs import RUNS_BYTES_MAX, RUNS_FILE
from .samples import SAMPLES_BYTES_MAX, SAMPLES_FILE, append_samples

# The files of a results folder and the most each may hold.
FILES: tuple[tuple[str, int], ...] = (
    ("results.csv", RESULTS_BYTES_MAX), (RUNS_FILE, RUNS_BYTES_MAX), (SAMPLES_FILE, SAMPLES_BYTES_MAX),
    (FULL_TEXT_FILE, RESULTS_BYTES_MAX), (torn_path(Path("results.csv")).name, RESULTS_BYTES_MAX),
)


def check_file(path: Path, limit: int) -> None:
    """ResultsPathError (one line) unless ``path`` is absent, or a regular
    file of at most ``limit`` bytes this process can append to."""
    where = f"results_dir={path.parent}: {path.name}"
    try:
        st = path.stat()
    except FileNotFoundError:
        if os.path.islink(path):
            raise ResultsPathError(f"{where} is a link to {os.path.realpath(path)}, which does not exist") from None
        return
    except OSError as exc:
        raise ResultsPathError(f"{where}: cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        target = f" (a link to {os.path.realpath(path)})" if path.is_symlink() else ""
        raise ResultsPathError(f"{where}{target} is {inputs.kind(st.st_mode)}, not a regular file")
    if st.st_size > limit:
        raise ResultsPathError(f"{where} is {st.st_size} bytes, over the {inputs.mib(limit)} it may hold")
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
    except OSError as exc:
        raise ResultsPathError(f"{where} is not writable ({exc.strerror or exc})") from None


class Folder:
    """The index of one results folder: ``latest[point_id][impl]`` is the last
    row of each point and implementation in file order; ``malformed`` the line
    numbers that are not whole rows of the header; ``bytes_read`` what was
    read of results.csv so far."""

    _OPEN: ClassVar[dict[str, Folder]] = {}

    def __init__(self, results_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(results_dir)
        self.path = results_path(self.dir)
        self.bytes_read = 0
        self._reset(None)

    @classmethod
    def of(cls, results_dir: str | os.PathLike[str]) -> Folder:
        """The folder's one index in this process (a sweep's points share it)."""
        key = os.path.realpath(results_dir)
        if key not in cls._OPEN:
            # absolute now: a job that Hydra runs in another directory (hydra.job.chdir)
            # reads the same folder
            cls._OPEN[key] = cls(os.path.abspath(results_dir))
        return cls._OPEN[key]

    def _reset(self, ident: tuple[int, int] | None) -> None:
        self.latest: dict[str, dict[str, dict[str, str]]] = {}
        self.malformed: list[int] = []
        self._effective: dict[str, dict[str, None]] = {}  # effective_id -> the points that measured it
        self._ident, self._offset, self._lines, self._header = ident, 0, 0, None
        self._last = b""  # the last line indexed: a file rewritten in place no longer ends in it
        self._set_aside = False

    def check(self) -> None:
        """Before any point runs: every file of the folder a regular file (or
        none yet), within its size and writable, the folder writable, and
        results.csv of this schema. ResultsPathError or SchemaError, one line."""
        check_schema(self.path)
        check_dir(self.dir, f"results_dir={self.dir}", ResultsPathError)
        for name, limit in FILES:
            check_file(self.dir / name, limit)
        self.refresh()

    def refresh(self) -> Folder:
        """Index what was appended to results.csv since the last look (all of
        it when the file is new to this index, replaced or cut short)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._reset(None)
            return self
        except OSError as exc:
            raise path_error(self.path, exc) from None
        if not stat.S_ISREG(st.st_mode):  # refused, without waiting on a FIFO
            check_schema(self.path)
            check_file(self.path, RESULTS_BYTES_MAX)
        ident = (st.st_dev, st.st_ino)
        if ident != self._ident or st.st_size < self._offset or not self._still_ends_in_last():
            check_schema(self.path)
            self._reset(ident)
        if st.st_size > self._offset:
            self._read_from(self._offset)
        return self

    def _still_ends_in_last(self) -> bool:
        start = self._offset - len(self._last)
        try:
            with self.path.open("rb") as f:
                f.seek(start)
                return f.read(len(self._last)) == self._last
        except OSError:
            return False

    def _read_from(self, offset: int) -> None:
        label = f"results_dir={self.dir}: {self.path.name}"
        with inputs.open_binary(self.path, label, RESULTS_BYTES_MAX, ResultsPathError) as f:
            f.seek(offset)
            for line in inputs.lines(f, label, ROW_BYTES_MAX, ResultsPathError):
                if not line.endswith(b"\n"):
                    break  # a line still being written (or torn): read once it is whole
                self._offset += len(line)
                self.bytes_read += len(line)
                self._lines += 1
                self._last = line
                self._index(line)

    def _index(self, line: bytes) -> None:
        fields = parse_line(line, first=self._lines == 1)
        if self._header is None:
            self._header = fields or []
            return
        if fields is None or len(fields) != len(self._header) or row_problem(row := dict(zip(self._header, fields))):
            self.malformed.append(self._lines)
            return
        pid = row.get("point_id")
        if pid:
            self.latest.setdefault(pid, {})[row.get("impl") or ""] = row
            if row.get("effective_id"):
                self._effective.setdefault(row["effective_id"], {})[pid] = None

    def warning(self) -> str:
        return Rows(self._header or [], [], self.malformed).warning(self.path)

    def _settled(self) -> Folder:
        """The index, malformed lines moved aside first (once), so that pandas
        reads the file; the warning line says what became of them."""
        self.refresh()
        if self.malformed and not self._set_aside:
            self._set_aside = True
            if set_aside_malformed(self.path):
                self._reset(self._ident)  # the rewritten file is read again, once
                self._set_aside = True
                self.refresh()
        return self

    def done(self, pid: str) -> bool:
        """Whether ``resume=true`` skips point ``pid``: its latest row of every
        impl has a status other than error/timeout (:data:`RERUN_STATUSES`)."""
        rows = self._settled().latest.get(pid)
        return bool(rows) and all((s := row.get("status") or "") and s not in RERUN_STATUSES for row in rows.values())

    def completed(self) -> set[str]:
        return {pid for pid in self._settled().latest if self.done(pid)}

    def earlier_same_effective(self, eid: str, pid: str) -> dict[str, str] | None:
        """A row of another point that measured the effective configuration
        ``eid`` and was not skipped (the first such point in file order)."""
        self.refresh()
        for other in self._effective.get(eid, ()):
            if other != pid:
                for row in self.latest[other].values():
                    if row.get("effective_id") == eid and row.get("status") != "skipped":
                        return row
        return None

    def append(self, rows: list[dict[str, Any]], samples: Sequence[Mapping[str, Sequence[float]]] = (),
               calibration: Sequence[Mapping[str, object]] | None = None,
               run: Mapping[str, object] | None = None) -> Path:
        """A point's raw samples, then its rows (a kill between them leaves
        samples that no row reads, never a row whose samples compare would
        miss); the index takes the rows in (reading only what was appended)."""
        if samples:
            append_samples(self.dir, rows, samples, calibration)
        path = append_rows(self.dir, rows, run=run)
        self.refresh()
        return path


def latest_rows(results_dir: str | os.PathLike[str]) -> dict[str, dict[str, dict[str, str]]]:
    """``{point_id: {impl: row}}`` of the folder (:attr:`Folder.latest`); one
    warning line on stderr for malformed rows."""
    folder = Folder.of(results_dir).refresh()
    if folder.malformed:
        print(folder.warning(), file=sys.stderr, flush=True)
    return folder.latest


def completed_point_ids(results_dir: str | os.PathLike[str]) -> set[str]:
    return Folder.of(results_dir).completed()
