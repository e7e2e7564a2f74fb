"""The runs that wrote a results folder (``runs.jsonl``) and the schema version of its files.

A results folder can receive rows from several processes: a sweep, its
resume, a second sweep, SLURM jobs on other nodes appending to one shared
folder. What is the same for every row of one process (the versions, the
host, the git sha, the machine, the command line) is written once, as one
JSON line of ``runs.jsonl`` beside ``results.csv``; each row names its line
by ``run_id``. The line goes in before the process's first row, under the
results file's lock (``matrix.store.results.append_rows``), so no row names a run
that has no line, and parallel writers never interleave.

Readers tell a results.csv's layout by its header (:func:`layout_version`):

- 1: no ``effective_id`` column: written before the ``refused`` and
  ``passthrough`` statuses (such rows say ``ok``);
- 2: the environment repeated in every row (``torch_version``,
  ``nccl_version``, ``host``, ``git_sha``), no ``run_id``;
- 3: a ``run_id`` in every row, the environment once per run in
  ``runs.jsonl``; no ``engine`` column: every row was planned by the
  ``seed_fix`` engine's rules (nsa_cp_comm.engines);
- 4: as 3, with ``engine`` (a configuration column) and
  ``attn_pad_masked_rows``; no ``shared_expert`` column: the reference MoE
  had no shared expert (``none``);
- 5: as 4, with ``shared_expert`` (a configuration column); no
  ``engine_model``, ``graphs``, ``max_capture_size``: every row was planned
  eager, for DeepSeek-V3.2;
- 6: as 5, with those three configuration columns and
  ``moe_pad_masked_rows``, ``graph_pad_rows``; no ``moe_quant``: the experts
  computed on the rows' own dtype (``none``);
- 7 (:data:`SCHEMA_VERSION`): as 6, with ``moe_quant``.

:data:`ADDED_CONFIG_COLUMNS` holds the configuration columns' part of this
list: which layout added each, and what every row of an older file had.

Every line of ``runs.jsonl`` and of ``samples.jsonl`` carries the
``schema_version`` that wrote it.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from nsa_cp_comm import engines
from nsa_cp_comm.modes import MOE_QUANTS, SHARED_EXPERTS

from . import inputs
from .outputs import append_whole

SCHEMA_VERSION = 7
RUNS_FILE = "runs.jsonl"
RUNS_BYTES_MAX = 256 << 20  # a line of about 1 kB per run: a quarter of a million runs
RUN_LINE_MAX = 16 << 20  # a run's line: its command line can list a long seq_lens

# The fields of a run's line that readers join onto each of its rows, as
# columns of these names: a row of layout 2 carries the first four itself.
META_COLUMNS: tuple[str, ...] = (
    "torch_version", "nccl_version", "host", "git_sha", "python_version", "nsa_cp_comm_version", "cpu_model",
    "cpu_count", "gpu_name", "gpu_count", "command", "started", "load_1m",
)
# The environment a row of layout 2 carries in its own columns.
LAYOUT2_ENV: tuple[str, ...] = META_COLUMNS[:4]

# When this process loaded the matrix: the start of its run.
STARTED = datetime.now(timezone.utc).isoformat(timespec="seconds")


def runs_path(results_dir: str | os.PathLike[str]) -> Path:
    return Path(results_dir) / RUNS_FILE


class Added(NamedTuple):
    """A configuration column a layout after 3 added."""

    layout: int  # the layout that added it
    before: str | None  # what every row of an older file had (None: no one value; read as an empty cell)
    values: tuple[str, ...] = ()  # the values a cell may hold, where they are enumerated (readers refuse others)


# The configuration columns added after layout 3, one entry each. A file's layout is the newest
# that added a column its header holds; a reader fills an older file's rows; the ids leave a
# column at its old value out; a column with values has them checked by every reader.
ADDED_CONFIG_COLUMNS: dict[str, Added] = {
    "engine": Added(4, "seed_fix", engines.NAMES),  # every row was planned by the seed fix's rules
    "shared_expert": Added(5, "none", SHARED_EXPERTS),  # the reference MoE had no shared expert
    # planned for DeepSeek-V3.2 with the graphs key's default (the engines modelled then ran eager;
    # their rows join today's rows of the same point)
    "engine_model": Added(6, "deepseek_v32", engines.MODELS), "graphs": Added(6, "auto"),
    "max_capture_size": Added(6, None),
    "moe_quant": Added(7, "none", MOE_QUANTS),  # the experts computed on the rows' own dtype
}


def layout_version(header: Iterable[str]) -> int:
    """The layout (1 to :data:`SCHEMA_VERSION`; see the module docstring) of a results.csv with ``header``."""
    names = set(header)
    if "run_id" in names:
        return max((a.layout for c, a in ADDED_CONFIG_COLUMNS.items() if c in names), default=3)
    return 2 if "effective_id" in names else 1


def new_run_id() -> str:
    """An id no other process writes: ``run-`` and 64 random bits in hex (the
    prefix keeps pandas from reading an all-digit id as a number)."""
    return "run-" + uuid.uuid4().hex[:16]


def run_line(meta: Mapping[str, object]) -> bytes:
    """The line of ``runs.jsonl`` for a run's metadata (which names its ``run_id``)."""
    if not str(meta.get("run_id") or ""):
        raise ValueError("a run's metadata needs a run_id")
    return (json.dumps({"schema_version": SCHEMA_VERSION, **meta}) + "\n").encode()


# (runs.jsonl, run_id) pairs this process already wrote.
_RECORDED: set[tuple[str, str]] = set()


def _listed(fd: int, run_id: str) -> bool:
    """Whether the open runs file already holds a line of ``run_id``: looked
    for block by block (a run_id is 64 random bits, so its text is its line's),
    never the whole file in memory."""
    needle, block, offset, tail = json.dumps(run_id).encode(), 1 << 20, 0, b""
    while data := os.pread(fd, block, offset):
        if needle in tail + data:
            return True
        offset, tail = offset + len(data), data[-len(needle):]
    return False


def record_run(results_dir: str | os.PathLike[str], meta: Mapping[str, object]) -> None:
    """Append ``meta``'s line to ``runs.jsonl`` unless it is there already.

    Called with the results file's lock held: one process at a time. The line
    goes in as :func:`.outputs.append_whole` appends (it raises OSError)."""
    path = runs_path(results_dir)
    run_id = str(meta.get("run_id") or "")
    key = (os.path.realpath(path), run_id)
    if key in _RECORDED:
        return
    data = run_line(meta)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if not _listed(fd, run_id):
            append_whole(fd, data)
    finally:
        os.close(fd)
    _RECORDED.add(key)


def read_line(line: bytes | str) -> dict[str, object]:
    """One line of ``runs.jsonl`` as a dict; ``{}`` for a line that is not a JSON object."""
    try:
        obj = inputs.loads_json(line, "runs.jsonl", inputs.BadInputFile)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


@dataclass
class Runs:
    """The runs of one ``runs.jsonl``: ``by_id`` maps a run_id to its fields
    (the last line of an id wins); ``skipped_lines`` counts lines that are not
    a run's (not JSON, no run_id, or a newer schema than this reader's)."""

    by_id: dict[str, dict[str, object]] = field(default_factory=dict)
    skipped_lines: int = 0


def read_runs(results_dir: str | os.PathLike[str]) -> Runs:
    """The runs written beside the results in ``results_dir`` (none when there is no ``runs.jsonl``)."""
    out = Runs()
    path = runs_path(results_dir)
    if not os.path.lexists(path):
        return out
    with inputs.open_binary(path, str(path), RUNS_BYTES_MAX, inputs.BadInputFile) as f:
        found = list(inputs.lines(f, str(path), RUN_LINE_MAX, inputs.BadInputFile))
    for line in found:
        if not line.strip():
            continue
        obj = read_line(line)
        version = obj.get("schema_version")
        run_id = obj.get("run_id")
        if not isinstance(run_id, str) or not run_id or not isinstance(version, int) or version > SCHEMA_VERSION:
            out.skipped_lines += 1
            continue
        out.by_id[run_id] = obj
    return out


def cell(value: object) -> str:
    """A metadata field as the text a results cell would hold."""
    if value is None:
        return ""
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
