"""Workloads: batches of request lengths drawn from a distribution or read from a trace.

A workload is a small mapping (``conf/workload/NAME.yaml``):

- ``kind: lognormal``: request lengths ``ceil(X)``, ``X ~ LogNormal`` with the
  given ``mean`` (of the lengths) and ``sigma`` (of their logarithm), at most
  ``max_len`` (and at most ``budget``);
- ``kind: trace``: request lengths read from a CSV file (``path``, relative to
  the repository or absolute) with a ``seq_len`` column and an optional
  ``batch`` column.

Requests are packed in arrival order into batches of at most ``budget``
tokens (a batch takes requests while its total stays within the budget; a
trace's ``batch`` column, where present, groups them instead: one batch
per id, even where an id comes back after other batches). ``batches``
(K) batches are drawn, seeded by ``seed``: the first K of a fresh draw, or K
of the trace's batches picked with replacement. Every value has a range; bad
input raises :class:`WorkloadError` with one line naming the field and value.
"""

from __future__ import annotations

import csv
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..store import inputs
from .. import CONF_DIR, ROOT

KINDS: tuple[str, ...] = ("lognormal", "trace")
WORKLOAD_DIR = CONF_DIR / "workload"
SEQ_LEN_MAX = 1 << 24  # as the matrix's own bound on one request
BUDGET_MAX = 1 << 26
BATCHES_MAX = 2_000_000
MATRIX_BATCHES_MAX = 64  # a matrix point per batch, on real ranks
TRACE_ROWS_MAX = 10_000_000
TRACE_BYTES_MAX = 1 << 30  # ten million requests take ~100 MB
YAML_BYTES_MAX = 1 << 20
TRACE_LINE_MAX = 1 << 16
SIGMA_MAX = 4.0

FIELDS: dict[str, tuple[str, ...]] = {
    "lognormal": ("name", "kind", "mean", "sigma", "budget", "max_len", "batches", "seed"),
    "trace": ("name", "kind", "path", "budget", "batches", "seed"),
}


class WorkloadError(ValueError):
    """A workload value or trace file that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Batches:
    """K batches, ragged: ``lens`` every request's length in batch order,
    ``sizes[b]`` the number of requests of batch ``b`` (each >= 1)."""

    lens: np.ndarray
    sizes: np.ndarray

    def __len__(self) -> int:
        return len(self.sizes)

    def starts(self) -> np.ndarray:
        return np.concatenate(([0], np.cumsum(self.sizes)[:-1])).astype(np.int64)

    def batch(self, b: int) -> list[int]:
        s = int(self.starts()[b])
        return [int(x) for x in self.lens[s : s + int(self.sizes[b])]]

    def totals(self) -> np.ndarray:
        return np.add.reduceat(self.lens, self.starts()) if len(self) else np.zeros(0, np.int64)


@dataclass(frozen=True)
class Workload:
    kind: str
    budget: int
    batches: int
    seed: int = 0
    mean: float = 0.0
    sigma: float = 0.0
    max_len: int = SEQ_LEN_MAX
    path: str = ""

    def describe(self) -> str:
        what = (f"lognormal(mean={self.mean:g}, sigma={self.sigma:g}, max_len={self.max_len})"
                if self.kind == "lognormal" else f"trace {self.path}")
        return f"{what}, budget {self.budget} tokens/batch, {self.batches} batches, seed {self.seed}"


def _int(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise WorkloadError(f"workload.{name}={value!r}: must be an integer in [{lo}, {hi}]")
    return int(value)


def _float(name: str, value: object, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not lo <= value <= hi:
        raise WorkloadError(f"workload.{name}={value!r}: must be a number in [{lo:g}, {hi:g}]")
    return float(value)


def from_mapping(cfg: Mapping[str, Any], *, batches_max: int = BATCHES_MAX) -> Workload:
    """Validate a workload mapping; raise WorkloadError (one line) on bad input."""
    kind = cfg.get("kind")
    if kind not in KINDS:
        raise WorkloadError(f"workload.kind={kind!r}: must be one of {', '.join(KINDS)}")
    unknown = sorted(set(cfg) - set(FIELDS[kind]))
    if unknown:
        raise WorkloadError(f"workload.{unknown[0]}: not a field of kind {kind} ({', '.join(FIELDS[kind])})")
    budget = _int("budget", cfg.get("budget"), 1, BUDGET_MAX)
    k = _int("batches", cfg.get("batches"), 1, batches_max)
    seed = _int("seed", cfg.get("seed", 0), 0, 2**31 - 1)
    if kind == "lognormal":
        return Workload(kind, budget, k, seed, mean=_float("mean", cfg.get("mean"), 1.0, SEQ_LEN_MAX),
                        sigma=_float("sigma", cfg.get("sigma"), 0.0, SIGMA_MAX),
                        max_len=_int("max_len", cfg.get("max_len", SEQ_LEN_MAX), 1, SEQ_LEN_MAX))
    path = cfg.get("path")
    if not isinstance(path, str) or not path:
        raise WorkloadError(f"workload.path={path!r}: must be the path of a CSV trace")
    return Workload(kind, budget, k, seed, path=path)


def _is_file(name: str) -> bool:
    return name.endswith((".yaml", ".yml"))


def _store_file(name: str) -> str:
    """Offer the workload file ``name`` to Hydra's config group ``workload``
    (its config store) under a name derived from its path; returns that name.
    The rows record the file's ``name`` field, else its path."""
    import hashlib

    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    path = Path(name).expanduser().absolute()
    text = inputs.read_text(path, f"workload={name}", YAML_BYTES_MAX, WorkloadError)
    cfg = OmegaConf.to_container(OmegaConf.create(inputs.no_yaml_aliases(text, f"workload={name}", WorkloadError)))
    cfg.setdefault("name", str(path))
    choice = "file_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    ConfigStore.instance().store(group="workload", name=choice, node=cfg)
    _STORED[choice] = str(path)
    return choice


# Names :func:`_store_file` gave workload files in this process: {name: path}.
_STORED: dict[str, str] = {}


def load(name: str, overrides: Mapping[str, Any] | None = None, **kw) -> Workload:
    """``conf/workload/NAME.yaml`` (or a YAML path), with ``overrides`` on top."""
    from omegaconf import OmegaConf

    name = _STORED.get(name, name)
    path = Path(name).expanduser() if _is_file(name) else WORKLOAD_DIR / f"{name}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in WORKLOAD_DIR.glob("*.yaml"))
        raise WorkloadError(f"workload={name}: no such workload (one of {', '.join(names)}, or a .yaml path)")
    text = inputs.no_yaml_aliases(inputs.read_text(path, f"workload={name}", YAML_BYTES_MAX, WorkloadError),
                                  f"workload={name}", WorkloadError)
    try:
        cfg = OmegaConf.to_container(OmegaConf.create(text))
    except Exception as exc:  # noqa: BLE001 - any YAML error is one line
        raise WorkloadError(f"workload={name}: cannot read {path}: {type(exc).__name__}") from None
    if not isinstance(cfg, dict):
        raise WorkloadError(f"workload={name}: {path} is not a mapping")
    cfg.update(overrides or {})
    return from_mapping(cfg, **kw)


def _pack(lens: np.ndarray, budget: int, limit: int) -> tuple[np.ndarray, int]:
    """Greedy packing in arrival order: ``sizes`` of at most ``limit`` batches of
    at most ``budget`` tokens each (every request <= budget), and the number of
    requests they hold."""
    cum = np.concatenate(([0], np.cumsum(lens, dtype=np.int64)))
    sizes = []
    s = 0
    n = len(lens)
    while s < n and len(sizes) < limit:
        e = int(np.searchsorted(cum, cum[s] + budget, side="right")) - 1  # last end index within budget
        e = max(e, s + 1)
        sizes.append(e - s)
        s = e
    return np.asarray(sizes, dtype=np.int64), s


def draw(w: Workload) -> Batches:
    """The workload's K batches."""
    rng = np.random.default_rng(w.seed)
    if w.kind == "trace":
        lens, sizes = read_trace(_trace_path(w.path), w.budget)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        pick = rng.integers(0, len(sizes), size=w.batches)
        out_sizes = sizes[pick]
        idx = np.repeat(starts[pick] - np.concatenate(([0], np.cumsum(out_sizes)[:-1])), out_sizes)
        idx += np.arange(int(out_sizes.sum()))
        return Batches(lens[idx], out_sizes)
    cap = min(w.max_len, w.budget)
    mu = math.log(w.mean) - w.sigma**2 / 2  # so that E[X] = mean
    per_batch = max(1.0, w.budget / min(w.mean, cap))
    got_lens: list[np.ndarray] = []
    got_sizes: list[np.ndarray] = []
    need = w.batches
    carry = np.zeros(0, dtype=np.int64)
    while need > 0:
        n = int(need * per_batch * 1.3) + 16
        fresh = np.minimum(np.ceil(rng.lognormal(mu, w.sigma, size=n)), cap).astype(np.int64)
        lens = np.concatenate((carry, np.maximum(fresh, 1)))
        sizes, used = _pack(lens, w.budget, need)
        if used == len(lens):
            # the draw ran out inside the last batch: it may be short, so it
            # goes back and is packed again with the next draw
            sizes = sizes[:-1]
        kept = int(sizes.sum())
        got_lens.append(lens[:kept])
        got_sizes.append(sizes)
        carry = lens[kept:]
        need -= len(sizes)
    return Batches(np.concatenate(got_lens), np.concatenate(got_sizes))


def _trace_path(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() or p.exists() else ROOT / p


def read_trace(path: Path, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """``(lens, sizes)`` of a CSV trace: a header with ``seq_len`` (and
    optionally ``batch``), one request a line. Raises WorkloadError naming the
    file, the line and the value. The file is read as matrix.store.inputs reads
    every input (a regular file of at most :data:`TRACE_BYTES_MAX` bytes,
    a byte-order mark read past). A batch id that comes back after other
    batches gathers its requests into one batch, in file order (one note
    line on stderr)."""
    label = f"workload.path={path}"
    f = inputs.open_text(path, label, TRACE_BYTES_MAX, WorkloadError)
    lens: list[int] = []
    batch_ids: list[str] = []
    hi = min(SEQ_LEN_MAX, budget)
    with f:
        try:
            reader = csv.reader(_lines(f, label))
            header = next(reader, None)
            if header is None:
                raise WorkloadError(f"{label}: empty file (expected a header with seq_len)")
            header = [h.strip() for h in header]
            if "seq_len" not in header:
                raise WorkloadError(f"{label}: line 1: no seq_len column in header {inputs.cut(header)}")
            col = header.index("seq_len")
            bcol = header.index("batch") if "batch" in header else None
            for lineno, rec in enumerate(reader, start=2):
                if not rec or all(not c.strip() for c in rec):
                    continue
                if len(rec) != len(header):
                    raise WorkloadError(f"{label}: line {lineno}: {len(rec)} fields, the header has {len(header)}")
                raw = rec[col].strip()
                value = inputs.parse_int(raw, 1, hi)
                if value is None:
                    raise WorkloadError(f"{label}: line {lineno}: seq_len={inputs.cut(raw)} must be an integer "
                                        f"in [1, {hi}] (the budget)")
                lens.append(value)
                if bcol is not None:
                    batch_ids.append(rec[bcol].strip())
                if len(lens) > TRACE_ROWS_MAX:
                    raise WorkloadError(f"{label}: more than {TRACE_ROWS_MAX} requests")
        except UnicodeDecodeError:
            raise WorkloadError(f"{label}: not UTF-8 text") from None
        except csv.Error as exc:
            raise WorkloadError(f"{label}: not a CSV file: {inputs.cut(str(exc))}") from None
    if not lens:
        raise WorkloadError(f"{label}: no requests (only a header)")
    arr = np.asarray(lens, dtype=np.int64)
    if bcol is None:
        sizes, _ = _pack(arr, budget, len(arr))
        return arr, sizes
    arr, sizes, ids = _group(arr, batch_ids, label)
    totals = Batches(arr, sizes).totals()
    over = np.flatnonzero(totals > budget)
    if len(over):
        b = int(over[0])
        raise WorkloadError(f"{label}: batch {inputs.cut(ids[b])} holds {int(totals[b])} tokens, "
                            f"over the budget {budget}")
    return arr, sizes


def _lines(f, label: str):
    """The lines of a trace, each at most :data:`TRACE_LINE_MAX` characters
    (read so, whatever the line's length): a request is a number or two."""
    n = 0
    while line := f.readline(TRACE_LINE_MAX + 1):
        n += 1
        if len(line) > TRACE_LINE_MAX and not line.endswith("\n"):
            raise WorkloadError(f"{label}: line {n} is longer than {TRACE_LINE_MAX} characters: not a trace "
                                "(a header with seq_len, then one request a line)")
        yield line


def _group(lens: np.ndarray, batch_ids: list[str], label: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Requests grouped by batch id, batches in order of first appearance and
    requests in file order within each: ``(lens, sizes, ids)``. An id that
    comes back after another batch (``a, b, a``) is one batch all the same;
    a note on stderr says so, naming the first such line."""
    first: dict[str, int] = {}
    codes = np.fromiter((first.setdefault(b, len(first)) for b in batch_ids), dtype=np.int64, count=len(batch_ids))
    back = np.flatnonzero(codes[1:] < np.maximum.accumulate(codes)[:-1])
    if len(back):
        i = int(back[0]) + 1
        print(f"note: {label}: batch {inputs.cut(batch_ids[i])} comes back at request {i + 1} after other "
              f"batches; its requests are taken as one batch ({len(back)} request(s) regrouped)",
              file=sys.stderr, flush=True)
        order = np.argsort(codes, kind="stable")
        lens, codes = lens[order], codes[order]
    sizes = np.bincount(codes, minlength=len(first)).astype(np.int64)
    return lens, sizes, list(first)


def expand_argv(argv: list[str]) -> list[str]:
    """``python -m matrix`` arguments with ``workload=NAME`` turned into a sweep
    of ``seq_lens`` over the workload's K batches (distinct, in drawing order),
    run as a multirun; ``workload=NAME`` stays, so every row records it.
    Raises WorkloadError (one line) on bad input."""
    given = [a for a in argv if a.startswith("workload=")]
    if not given or given[-1] in ("workload=null", "workload="):
        return list(argv)
    name = given[-1].split("=", 1)[1]
    if "," in name:
        raise WorkloadError(f"{given[-1]}: one workload per command line (its batches are the sweep)")
    if any(a.startswith(("seq_lens=", "+seq_lens=")) for a in argv):
        raise WorkloadError(f"{given[-1]}: the workload sets seq_lens (its batches); drop seq_lens=")
    w = load(name, batches_max=MATRIX_BATCHES_MAX)
    batches = draw(w)
    values = list(dict.fromkeys("[" + ",".join(map(str, batches.batch(i))) + "]" for i in range(len(batches))))
    if _is_file(name):
        # Hydra reads workload=NAME as conf/workload/NAME: a file's mapping is
        # offered to it under a name of its own
        choice = _store_file(name)
        argv = [f"workload={choice}" if a.startswith("workload=") else a for a in argv]
    out = [*argv, "seq_lens=" + ",".join(values)]
    return out if any(a in ("-m", "--multirun") for a in argv) else ["-m", *out]


def report_lines(df, table=None) -> list:
    """The report's workload section: per workload, cp, layout and impl, the
    spread over its batches (ok rows) of padding fraction, gathered bytes and
    round-trip time. Empty when no row names a workload. ``table``: how a
    table becomes a block (default: markdown text; the report keeps it as records)."""
    import pandas as pd

    from ..review._review import frame_md

    if "workload" not in df.columns:
        return []
    w = df[df["workload"].fillna("").astype(str).str.strip().ne("") & df["status"].eq("ok")]
    if w.empty:
        return []
    # the design's own padding: the share of its gathered bytes that is padding
    w = w.assign(pad=1 - w["bytes_useful"] / w["bytes_padded"])
    w = w.assign(layout=w["policy"].astype(str).where(
        w["policy"].ne("zigzag_page"), "zigzag_page/" + w["page_size"].astype("Int64").astype(str)))
    g = w.groupby(["workload", "cp_size", "layout", "impl"], observed=True)

    def q(col, p):
        return g[col].quantile(p)

    t = pd.DataFrame({
        "batches": g.size(),
        "padding p50": q("pad", 0.5).map(lambda v: f"{100 * v:.2f}%"),
        "padding p99": q("pad", 0.99).map(lambda v: f"{100 * v:.2f}%"),
        "gather MB p50": (q("bytes_padded", 0.5) / 1e6).round(3),
        "gather MB p99": (q("bytes_padded", 0.99) / 1e6).round(3),
        "roundtrip us p50": q("roundtrip_p50_us", 0.5).round(1),
        "roundtrip us p99": q("roundtrip_p50_us", 0.99).round(1),
    }).reset_index()
    return ["Each batch of a workload is a point; per workload, cp, layout and impl, over its batches (`ok` "
            "rows): the padding fraction of the gathered buffer (`1 - bytes_useful/bytes_padded`), the bytes gathered per layer and the round "
            "trip's median time, at their p50 and p99.", "", (table or frame_md)(t)]
