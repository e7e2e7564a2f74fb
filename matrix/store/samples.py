"""Raw per-iteration timings beside the results: ``<results_dir>/samples.jsonl``.

A row of ``results.csv`` keeps percentiles; compare needs the samples behind
them to tell a difference from noise. One JSON line per timed (point, impl):

    {"schema_version": 3, "point_id": ..., "impl": ..., "run_id": ..., "timestamp": ...,
     "roundtrip_us": [...], "control_us": [...], "iters": N, "load_1m": L}

plus, for a point run with ``iters=auto``, ``"calibration": {"iters": N,
"ci_width": W, "target": T, "reached": true}``: how many timed iterations it
took, the widest relative 95% interval of a median paired ratio when it
stopped, the target width, and whether it was reached before a cap
(nsa_cp_comm.harness.calibrate). ``load_1m`` is the machine's 1-minute load
average when the point's lines were written (lines written before it was kept
have none): compare names it beside a regression, the evidence of what the
machine was doing.

(Lines of schema 2 say ``"v": 1`` instead and have no run_id; they read the
same. A line of a schema newer than the reader's is skipped and counted.)

``roundtrip_us`` is the implementation's round trip per timed iteration (the
slowest rank's), ``control_us`` the A/A control's round trip in the same
iterations (nsa_cp_comm.harness.steps.control_steps), so ``roundtrip / control`` per
iteration is a paired ratio that the machine's load moves far less than either
time. Lines are appended whole under a lock, as rows are; the last line of a
(point_id, impl) in file order is the one read, as for rows (a later run of
the point, a resume's, replaces an earlier run's); a second line of the same
run for it is an inconsistency that leaves the row without evidence, never a
silent replacement. A line that is
not such an object is skipped and counted, never fatal to the read; but the
samples are the gate's evidence: a timed row whose line is missing, unusable
or of another run of its point is one compare cannot verify
(:meth:`Samples.evidence` says why).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import inputs
from .results import append_beside
from .runs import SCHEMA_VERSION

SAMPLES_FILE = "samples.jsonl"
SAMPLES_BYTES_MAX = 8 << 30  # a line of up to 100000 timings per (point, impl)
SAMPLE_LINE_MAX = 16 << 20  # one such line: two lists of 100000 timings take ~2 MB


def samples_path(results_dir: str | os.PathLike[str]) -> Path:
    return Path(results_dir) / SAMPLES_FILE


def _us(xs: Sequence[float]) -> list[float]:
    return [round(float(x), 3) for x in xs]


def lines_for(rows: Sequence[Mapping[str, object]], samples: Sequence[Mapping[str, Sequence[float]]],
              calibration: Sequence[Mapping[str, object]] | None = None) -> str:
    """The sidecar lines of one point: ``rows``, ``samples`` and
    ``calibration`` (empty where iters was a number) in the same order (one
    per implementation); rows without samples write nothing."""
    out = []
    for i, (row, s) in enumerate(zip(rows, samples)):
        if not s.get("roundtrip"):
            continue
        line = {
            "schema_version": SCHEMA_VERSION, "point_id": row["point_id"], "impl": row["impl"],
            "run_id": row.get("run_id") or "", "timestamp": row["timestamp"],
            "roundtrip_us": _us(s["roundtrip"]), "control_us": _us(s.get("control") or []),
            "iters": len(s["roundtrip"]),
        }
        if calibration is not None and calibration[i]:
            line["calibration"] = dict(calibration[i])
        line["load_1m"] = round(os.getloadavg()[0], 2)
        out.append(json.dumps(line, separators=(",", ":")) + "\n")
    return "".join(out)


def append_samples(results_dir: str | os.PathLike[str], rows: Sequence[Mapping[str, object]],
                   samples: Sequence[Mapping[str, Sequence[float]]],
                   calibration: Sequence[Mapping[str, object]] | None = None) -> None:
    """Append one point's sample lines in one ``write(2)`` under an exclusive lock.
    Raises OSError as the results append does (the caller reports it)."""
    data = lines_for(rows, samples, calibration).encode()
    if data:
        append_beside(samples_path(results_dir), data, lock=True, sync=False)


@dataclass
class Samples:
    """A run's samples: ``{(point_id, impl): {"roundtrip": array, "control": array, ...}}``.

    ``rejected`` holds, for each (point_id, impl) whose latest line was
    unusable, what was wrong with it; ``skipped_lines`` counts every line set
    aside (those and lines naming no point)."""

    by_key: dict[tuple[str, str], dict[str, object]] = field(default_factory=dict)
    rejected: dict[tuple[str, str], str] = field(default_factory=dict)
    skipped_lines: int = 0
    found: bool = False

    def paired(self, point_id: str, impl: str) -> np.ndarray | None:
        """Per-iteration roundtrip / control, or None where either is absent."""
        return self.evidence(point_id, impl, paired=True)[0]

    def roundtrip(self, point_id: str, impl: str) -> np.ndarray | None:
        return self.evidence(point_id, impl, paired=False)[0]

    def line(self, point_id: str, impl: str) -> Mapping[str, object]:
        """The fields of the (point_id, impl)'s latest usable line (empty where none)."""
        return self.by_key.get((point_id, impl), {})

    def evidence(self, point_id: str, impl: str, paired: bool, timestamp: str = "") -> tuple[np.ndarray | None, str]:
        """A row's samples (the paired ratio per iteration, or the round trip's
        times) and ``""``; or None and what is wrong, in words. ``timestamp``,
        the row's own: a line of another run of the point is not its evidence."""
        key = (point_id, impl)
        s = self.by_key.get(key)
        if s is None:
            if key in self.rejected:
                return None, f"its {SAMPLES_FILE} line is unusable ({self.rejected[key]})"
            if not self.found:
                return None, f"no {SAMPLES_FILE}"
            unread = f"; {self.skipped_lines} unreadable line(s) skipped" if self.skipped_lines else ""
            return None, f"no line in {SAMPLES_FILE}{unread}"
        stamp = str(s.get("timestamp") or "")
        if timestamp and stamp and stamp != timestamp:
            return None, f"its line is another run's (timestamp {stamp}, the row's {timestamp})"
        rt, ctl = s["roundtrip"], s["control"]
        assert isinstance(rt, np.ndarray) and isinstance(ctl, np.ndarray)
        if not len(rt):
            return None, "no round trip samples"
        if not paired:
            return rt, ""
        if not len(ctl):
            return None, "no control samples (control_us empty)"
        if len(ctl) != len(rt):
            return None, f"{len(ctl)} control samples for {len(rt)} round trips"
        with np.errstate(divide="ignore", invalid="ignore"):
            r = rt / ctl
        r = r[np.isfinite(r) & (r > 0)]
        return (r, "") if len(r) else (None, "no finite, positive ratio of round trip over control")


def _valid(values: object) -> np.ndarray | None:
    if not isinstance(values, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return None
    arr = np.asarray(values, dtype=float)
    return arr if all(math.isfinite(v) and v >= 0 for v in arr) else None


def _newer(version: object) -> bool:
    return version is not None and not (isinstance(version, int) and version <= SCHEMA_VERSION)


def _parsed(obj: Mapping[str, object]) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    """A line's round trips and controls, and '' ; or what makes the line
    unusable as its point's samples (the arrays then None)."""
    if _newer(obj.get("schema_version")):
        return None, None, f"schema_version {obj.get('schema_version')!r}, newer than this reader's {SCHEMA_VERSION}"
    rt, ctl = _valid(obj.get("roundtrip_us")), _valid(obj.get("control_us", []))
    for name, arr in (("roundtrip_us", rt), ("control_us", ctl)):
        if arr is None:
            return None, None, f"{name} is not a list of finite numbers >= 0 (a NaN, a string or a negative)"
    return rt, ctl, ""


def read_samples(path: Path) -> Samples:
    """The samples of ``path`` (a ``samples.jsonl``); empty when there is none."""
    out = Samples()
    if not os.path.lexists(path):
        return out
    f = inputs.open_binary(path, str(path), SAMPLES_BYTES_MAX, inputs.BadInputFile)
    out.found = True
    runs: dict[tuple[str, str], str] = {}  # the run of each (point_id, impl)'s latest line
    with f:
        for line in inputs.lines(f, str(path), SAMPLE_LINE_MAX, inputs.BadInputFile):
            try:
                obj = inputs.loads_json(line, str(path), inputs.BadInputFile)
            except ValueError:
                out.skipped_lines += bool(line.strip())
                continue
            pid, impl = (obj.get("point_id"), obj.get("impl")) if isinstance(obj, dict) else (None, None)
            if not isinstance(pid, str) or not isinstance(impl, str):
                out.skipped_lines += 1
                continue
            # the latest line of a point and impl decides, usable or not; but two lines of one run for it
            # are an inconsistency, never a silent replacement (which of them timed the row is not known)
            key = (pid, impl)
            # a run by its id; a line of before run ids (schema 2) by its timestamp
            run = f"run {obj['run_id']}" if obj.get("run_id") else (
                f"one run (timestamp {obj['timestamp']})" if obj.get("timestamp") else "")
            rt, ctl, why = _parsed(obj)
            if run and runs.get(key) == run:
                why = f"two lines of {run} for this point and impl: which one timed the row is not known"
            runs[key] = run
            if why:
                out.skipped_lines += 1
                out.rejected[key] = why
                out.by_key.pop(key, None)
                continue
            out.rejected.pop(key, None)
            out.by_key[key] = {"roundtrip": rt, "control": ctl, "timestamp": obj.get("timestamp"),
                               "load_1m": obj.get("load_1m"), "calibration": obj.get("calibration")}
    return out


def read_beside(results_files: Iterable[Path], skip_bad: bool = False) -> Samples:
    """The samples beside each results file, merged in order: a later file's
    line of a point decides, usable or not. A file that cannot be read raises
    inputs.BadInputFile, or is passed over with ``skip_bad``."""
    merged = Samples()
    for f in results_files:
        try:
            one = read_samples(f.parent / SAMPLES_FILE)
        except inputs.BadInputFile:
            if skip_bad:
                continue
            raise
        merged.found |= one.found
        merged.skipped_lines += one.skipped_lines
        for key in one.rejected:
            merged.by_key.pop(key, None)
        for key in one.by_key:
            merged.rejected.pop(key, None)
        merged.by_key.update(one.by_key)
        merged.rejected.update(one.rejected)
    return merged


def missed_target_line(label: str, samples: Samples, keys: Iterable[tuple[str, str]]) -> str:
    """One line on the rows of ``keys`` (point_id, impl) that ``iters=auto``
    stopped at a cap before its interval reached the target width (their
    samples line's ``calibration`` says ``reached: false``): how many of the
    calibrated rows, and the widest interval they stopped at. ``''`` when
    every calibrated row reached its target, or none was calibrated."""
    cals = [samples.line(pid, impl).get("calibration") for pid, impl in keys]
    auto = [c for c in cals if isinstance(c, Mapping) and c]
    missed = [c for c in auto if c.get("reached") is False]
    if not missed:
        return ""
    widths = [float(w) for c in missed if isinstance(w := c.get("ci_width"), (int, float)) and math.isfinite(w)]
    targets = {float(t) for c in missed if isinstance(t := c.get("target"), (int, float)) and math.isfinite(t)}
    target = f" of {'/'.join(f'{t * 100:g}%' for t in sorted(targets))}" if targets else ""
    widest = f" (the widest stopped at {max(widths) * 100:.0f}%)" if widths else ""
    return (f"{label}: iters=auto missed its interval width target{target} on {len(missed)} of {len(auto)} "
            f"calibrated row(s), stopped at its cap{widest}: their medians are less certain than iters=auto aims for")
