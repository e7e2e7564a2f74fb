"""A model of the CP collectives' time from nccl-tests measurements.

nccl-tests' ``all_gather_perf`` / ``reduce_scatter_perf`` write, with ``-J
FILE``, a JSON object: ``args`` (the command line; ``args[0]`` names the
test), ``config`` (``nthreads``, ``ngpus``, ``devices``: one entry per
process) and ``results``, one per message size: ``size`` (bytes of the whole
buffer: the gathered output of an all-gather, the input of a reduce-scatter),
and ``out_of_place`` / ``in_place`` objects with ``time`` (microseconds),
``alg_bw``, ``bus_bw`` (GB/s) and ``nwrong``. The model takes the
out_of_place times (in_place only in a file without them), one per size, at
least three sizes (:func:`curve_points`).

:class:`Model` predicts a collective's time at any buffer size ``S`` by
interpolating the measured times linearly in log(size)-log(time) (below the
smallest size: its time, a latency floor; above the largest: linear in bytes
at the largest size's bandwidth). For another rank count ``cp`` than the
file's ``n`` it keeps the bus bandwidth at that size (``t * ((cp-1)/cp) /
((n-1)/n)``), the usual ring-algorithm assumption. It is a model, and every
output that uses it says so.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..store import inputs

OPS: dict[str, str] = {"all_gather": "all_gather_perf", "reduce_scatter": "reduce_scatter_perf"}
PLACEMENTS = ("in_place", "out_of_place")
MAX_BYTES = 16 << 20  # an nccl-tests JSON of a full sweep is tens of kB


class NcclTestsError(ValueError):
    """A file that is not usable nccl-tests JSON; the message is one line naming it."""


@dataclass(frozen=True)
class Curve:
    """One collective's measured times: ``sizes`` (bytes, ascending), ``times_us``."""

    op: str
    nranks: int
    placement: str
    sizes: np.ndarray
    times_us: np.ndarray
    path: str

    def time_us(self, size, cp: int | None = None) -> np.ndarray:
        s = np.asarray(size, dtype=float)
        ls, lt = np.log(self.sizes), np.log(self.times_us)
        t = np.exp(np.interp(np.log(np.maximum(s, 1.0)), ls, lt))
        t = np.where(s > self.sizes[-1], self.times_us[-1] * s / self.sizes[-1], t)
        if cp is not None and cp != self.nranks:
            if cp <= 1:
                return np.zeros_like(t)
            t = t * ((cp - 1) / cp) / ((self.nranks - 1) / self.nranks)
        return t

    def describe(self) -> str:
        return (f"{OPS[self.op]} {self.nranks} ranks, {self.placement} time, {len(self.sizes)} sizes "
                f"{_bytes(self.sizes[0])}..{_bytes(self.sizes[-1])} ({Path(self.path).name})")


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024


def _fail(path: Path, why: str) -> NcclTestsError:
    return NcclTestsError(f"--nccl-tests={path}: {why}")


def _op(path: Path, data: dict) -> str:
    args = data.get("args")
    names = [Path(str(args[0])).name] if isinstance(args, list) and args else []
    names.append(path.name)
    for name in names:
        for op, binary in OPS.items():
            if binary in name or op in name.replace("-", "_"):
                return op
    raise _fail(path, "names neither all_gather_perf nor reduce_scatter_perf (args[0] or the file name)")


def _nranks(path: Path, config: object) -> int:
    if not isinstance(config, dict) or not isinstance(config.get("devices"), list) or not config["devices"]:
        raise _fail(path, "config.devices is missing: cannot tell the number of ranks")
    per = 1
    for key in ("nthreads", "ngpus"):
        v = config.get(key, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise _fail(path, f"config.{key}={v!r} is not a positive integer")
        per *= v
    n = len(config["devices"]) * per
    if n < 2:
        raise _fail(path, f"{n} rank: a collective over one rank moves nothing to model")
    return n


def read(path: Path | str) -> Curve:
    """One nccl-tests JSON file as a :class:`Curve`; NcclTestsError (one line) otherwise."""
    path, label = Path(path), f"--nccl-tests={path}"
    # read as matrix.store.inputs reads every input: a regular file of at most MAX_BYTES (a FIFO
    # or /dev/zero refused, not waited on), nesting and numbers bounded
    data = inputs.loads_json(inputs.read_bytes(path, label, MAX_BYTES, NcclTestsError), label, NcclTestsError)
    if not isinstance(data, dict) or not isinstance(data.get("results"), list) or not data["results"]:
        raise _fail(path, "no results list (write it with nccl-tests' -J FILE)")
    op = _op(path, data)
    nranks = _nranks(path, data.get("config"))
    points: dict[str, list[tuple[int, float]]] = {p: [] for p in PLACEMENTS}
    for i, r in enumerate(data["results"]):
        size = r.get("size") if isinstance(r, dict) else None
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise _fail(path, f"results[{i}].size={size!r} is not a positive integer")
        for placement in PLACEMENTS:
            m = r.get(placement)
            if m is None:
                continue
            t = m.get("time", m.get("cpu_time")) if isinstance(m, dict) else None
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
                raise _fail(path, f"results[{i}].{placement}.time={t!r} is not a positive number")
            wrong = m.get("nwrong")
            if isinstance(wrong, (int, float)) and not isinstance(wrong, bool) and wrong > 0:
                raise _fail(path, f"results[{i}].{placement}.nwrong={wrong:g}: nccl-tests saw wrong results")
            points[placement].append((size, float(t)))
    placement, sizes, times = curve_points(path, points)
    return Curve(op, nranks, placement, sizes, times, str(path))


MIN_SIZES = 3  # a curve, not a point or a line: the model interpolates and extrapolates from it


def curve_points(path: Path, points: dict[str, list[tuple[int, float]]]) -> tuple[str, np.ndarray, np.ndarray]:
    """The placement a model is built from and its (sizes, times), ascending.

    ``points``: per placement, ``(size, time_us)`` in file order. out_of_place
    is used, in_place only when no result has out_of_place: out_of_place is
    nccl-tests' first column and the one a run measures at every size, and a
    curve must not be taken from a placement present at a few sizes only (one
    in_place size would make the whole model). A size measured twice is
    refused, not merged: two times for one size are two runs (other settings,
    another machine) that one curve cannot hold; and fewer than
    :data:`MIN_SIZES` sizes are refused: no curve to interpolate."""
    placement = "out_of_place" if points["out_of_place"] else "in_place"
    pts = points[placement]
    if not pts:
        raise _fail(path, "no result has an in_place or out_of_place time")
    seen = Counter(size for size, _ in pts)
    repeated = [s for s, n in seen.items() if n > 1]
    if repeated:
        raise _fail(path, f"size {repeated[0]} has {seen[repeated[0]]} {placement} times (results repeat "
                          f"{len(repeated)} size(s)): one measurement per size; keep one run's results")
    if len(pts) < MIN_SIZES:
        raise _fail(path, f"{len(pts)} size(s) with an {placement} time: a model needs at least {MIN_SIZES} "
                          "(run nccl-tests over a range, e.g. -b 8 -e 128M -f 2)")
    pts = sorted(pts)
    return placement, np.array([s for s, _ in pts], dtype=float), np.array([t for _, t in pts], dtype=float)


@dataclass(frozen=True)
class Model:
    """Gather + reduce-scatter time of one round trip, from one curve per collective."""

    curves: dict[str, Curve]

    def predict(self, nbytes, cp: int) -> np.ndarray | None:
        """Predicted collective time (us) of a round trip whose gathered buffer
        has ``nbytes``: all-gather plus reduce-scatter, each from its curve (a
        missing one is taken as the other's)."""
        if not self.curves:
            return None
        ag = self.curves.get("all_gather") or self.curves["reduce_scatter"]
        rs = self.curves.get("reduce_scatter") or self.curves["all_gather"]
        return ag.time_us(nbytes, cp) + rs.time_us(nbytes, cp)

    def describe(self) -> str:
        missing = [op for op in OPS if op not in self.curves]
        note = f"; {missing[0]} taken as the other's" if missing else ""
        return ("a model, not a measurement: nccl-tests times interpolated at the round trip's buffer bytes "
                "(log-log), bus bandwidth kept for other rank counts: "
                + "; ".join(c.describe() for c in self.curves.values()) + note)


def load_model(paths: Iterable[Path | str]) -> Model:
    curves: dict[str, Curve] = {}
    for p in paths:
        c = read(p)
        if c.op in curves:
            raise _fail(Path(p), f"a second {OPS[c.op]} file (first: {curves[c.op].path})")
        curves[c.op] = c
    return Model(curves)
