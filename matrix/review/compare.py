"""Compare two results tables row by row and gate on what got worse (the
command, its arguments and its listing: :mod:`matrix.compare.cli`).

BASE and NEW are results directories or CSV files (resolved as by
``matrix.report``); a row is one point and one impl, the last in file order
where a file holds several. Exit status 1 when nothing was compared or any
gate trips (:data:`GATE_TABLE`), else 0; 2 on bad input (one line). A row
regresses when it is worse by more than ``--fail-above`` **and** beyond the
noise (:func:`compare`: NEW's samples tested against BASE's, Benjamini-Hochberg
over the rows tested, nsa_cp_comm.harness.significance). What each gate asks,
the noise rules, the default metric (:data:`PAIRED`) and the smoke preset's
exception: docs/review.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import command, doc_url
from ._review import NEUTRAL, SPREAD, InputError, Run, fmt, frame_md, holds, parse_bool, point_codes
from ..store.results import CONFIG_COLUMNS, GOOD_STATUSES, TIMING_COLUMNS
from ..store.inputs import BadInputFile
from ..store.samples import SAMPLES_FILE, Samples, read_beside
from nsa_cp_comm.harness.significance import ALPHA, MIN_SAMPLES, POWER_MIN, adjusted, p_greater, power, resolved_change, smallest_p
from nsa_cp_comm.origins import clean, is_own, is_reference

# The paired, load-independent metric: per iteration, the round trip over the
# A/A control's round trip in the same iteration; read from the samples.
PAIRED = "roundtrip_vs_control"
ABSOLUTE_FALLBACK = "roundtrip_p50_us"
DEFAULT_METRIC = PAIRED
# Measured by benchmarks/compare_power.py on a 2-core machine (docs/review.md): with
# iters=auto the paired metric's run-to-run drift stays under this, and a path
# slowed about 1.3x is beyond it (how often it is caught, point by point, is
# quoted there).
DEFAULT_THRESHOLD = "15%"
METRICS: tuple[str, ...] = (PAIRED, *TIMING_COLUMNS)
# Timings from different machines or stacks are not comparable; say so, don't refuse.
ENV_COLUMNS = ("host", "torch_version", "nccl_version", "device", "device_name")
# Up to this many rows, every one is listed; above, only rows with a mark
# (the rest are unchanged within the threshold), and each list is cut here too.
LIST_LIMIT = 200

# The smoke preset (conf/matrix/smoke.yaml) runs every code path once with a
# few iterations: a check that the paths run and agree, not a timing. Its rows'
# ``overrides`` name it. Where both rows of a joined pair do and they hold too
# few samples for any change to be significant, their times are not gated
# (status and correctness still are): two smoke runs pass an A/A compare. Any
# other row with too few samples, or too little power, stays unverified.
SMOKE_OVERRIDES = frozenset({"+matrix=smoke", "matrix=smoke", "++matrix=smoke"})

@dataclass(frozen=True)
class Gate:
    """A gate: its name (the summary line's count, the FAIL line's), the
    joined frame's column that trips it, and the flag that allows it
    (``--allow-missing``: a row may be missing) or None (always fails)."""

    name: str
    column: str
    allowed_by: str | None = None


# Every gate, once: gating(), the summary's counts and the FAIL line read this table.
GATE_TABLE: tuple[Gate, ...] = (
    Gate("missing", "missing", "allow_missing"),
    Gate("status-worse", "status_worse"),
    Gate("failing-in-new", "failing_new"),
    Gate("correctness-lost", "correctness_lost"),
    Gate("regressed", "regressed"),
    Gate("unverified", "unverified", "allow_unverified"),
)
# The gates, as the summary line names them (the test registry, tests/verdicts.py, reads it).
GATES = tuple(g.name for g in GATE_TABLE)


def sampled(metric: str) -> bool:
    """Metrics whose per-iteration samples are kept: the paired ratio and the round trip's times."""
    return metric == PAIRED or (metric.startswith("roundtrip_") and metric.endswith("_us") and metric != SPREAD)


def higher_is_better(metric: str) -> bool:
    """Bandwidths (``*_GBps``) regress by dropping; times and sizes by rising."""
    return metric.endswith("_GBps")


def spread_rule(metric: str) -> str:
    """How the noise margin of ``metric`` is computed: "absolute", "relative" or "none"."""
    if metric.startswith("roundtrip_") and metric.endswith("_us"):
        return "absolute"
    if metric.endswith("_us") or metric.endswith("_GBps"):
        return "relative"
    return "none"  # sizes and counts are exact, not measured


# The largest --fail-above: a gate that lets a 2x slowdown pass flags nothing
# a review asks for, and a larger one (1e6%) passed a 3x slowdown silently.
MAX_THRESHOLD = 1.0


def parse_threshold(text: str) -> float:
    """``5%`` or ``0.05`` -> 0.05. A bare number must be a fraction below 1, so a
    forgotten ``%`` (``5``) is an error rather than a 500 % threshold."""
    s = text.strip()
    try:
        value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise InputError(f"--fail-above={text}: not a percentage (5%) or a fraction (0.05)") from None
    if not math.isfinite(value) or value < 0:
        raise InputError(f"--fail-above={text}: must be a finite, non-negative percentage (5%) or fraction (0.05)")
    if not s.endswith("%") and value >= 1:
        raise InputError(f"--fail-above={text}: a bare number must be a fraction below 1 (0.05); write {s}% for a "
                         "percentage")
    if value > MAX_THRESHOLD:
        raise InputError(f"--fail-above={text}: over {MAX_THRESHOLD * 100:g}%, the gate could flag nothing sensible (a "
                         f"time more than {1 + MAX_THRESHOLD:g}x slower; no bandwidth drops by more than 100%); use at "
                         f"most {MAX_THRESHOLD * 100:g}%")
    return value


def run_samples(run: Run) -> Samples:
    """The samples beside each of the run's results files, merged (store.samples.read_beside)."""
    try:
        return read_beside(run.files)
    except BadInputFile as exc:
        raise InputError(f"{run.arg}={run.value}: {exc}") from None


def _column(lat: pd.DataFrame, name: str) -> list[str]:
    return lat[name].astype(str).str.strip().tolist()


def _number(value: object) -> float:
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
    return out if math.isfinite(out) else math.nan


def keyed(run: Run, metric: str, samples: Samples | None = None) -> pd.DataFrame:
    """One row per point and impl (the run's latest rows): its canonical config, the
    metric, status, correctness, the round trip's spread and median, the row's
    samples of the metric (``samples``, None where absent, and ``samples_why``,
    what is wrong with them then), whether ``iters=auto`` timed it (``auto``)
    and the machine's 1-minute load when it was timed (``load``: its samples
    line's, else its run's in runs.jsonl)."""
    lat = run.latest
    frame = run.latest_config.copy()
    samples = samples or Samples()
    pids, impls, stamps = _column(lat, "point_id"), _column(lat, "impl"), _column(lat, "timestamp")
    found = [samples.evidence(pid, impl, metric == PAIRED, stamp) if sampled(metric) else (None, "")
             for pid, impl, stamp in zip(pids, impls, stamps)]
    per_point = [x for x, _ in found]
    if metric == PAIRED:
        frame["value"] = [float(np.median(x)) if x is not None else np.nan for x in per_point]
    else:
        frame["value"] = pd.to_numeric(lat[metric], errors="coerce").to_numpy()
    frame["samples"] = per_point
    frame["samples_why"] = [why for _, why in found]
    lines = [samples.line(pid, impl) for pid, impl in zip(pids, impls)]
    frame["auto"] = [bool(line.get("calibration")) for line in lines]
    frame["smoke"] = [not SMOKE_OVERRIDES.isdisjoint(str(o).split()) for o in _column(lat, "overrides")]
    run_load = pd.to_numeric(lat["load_1m"], errors="coerce").to_numpy()
    frame["load"] = [_number(line.get("load_1m")) if line.get("load_1m") is not None else _number(rl)
                     for line, rl in zip(lines, run_load)]
    frame["status"] = lat["status"].str.strip().astype(object)
    frame["correct"] = parse_bool(lat["correct"])
    frame["iqr"] = pd.to_numeric(lat[SPREAD], errors="coerce")
    frame["p50"] = pd.to_numeric(lat["roundtrip_p50_us"], errors="coerce")
    frame["origin"] = lat["impl_origin"].astype(str).str.strip().to_numpy()
    return frame.reset_index(drop=True)


def declared_names(base: pd.DataFrame, new: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``base`` and ``new`` with a plug-in's reference (``engine_comm.adapter:impl``,
    as rows written before they carried the declared name have it) renamed to
    the declared name the other run's rows give the same implementation (one
    ``impl_origin``), so that the two runs' rows of it join. Only where the
    run has no row of that name already and the other names it one way."""
    def names(frame: pd.DataFrame) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for impl, origin in zip(frame["impl"].astype(str), frame["origin"].astype(str)):
            text = clean(origin)
            if text and not is_own(text):  # a recorded origin, another's: the names to join
                out.setdefault(text, set()).add(impl)
        return out

    def renamed(frame: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
        mine, theirs = names(frame), names(other)
        mapping = {}
        for origin, here in mine.items():
            plain = {n for n in theirs.get(origin, set()) if not is_reference(n)}
            refs = {n for n in here if is_reference(n) and n not in theirs.get(origin, set())}
            if len(plain) == 1 and len(refs) == 1 and not (plain & here):
                mapping[refs.pop()] = plain.pop()
        return frame.assign(impl=frame["impl"].astype(str).map(lambda n: mapping.get(n, n))) if mapping else frame

    return renamed(base, new), renamed(new, base)


def check_metric(run: Run, metric: str) -> None:
    """InputError (one line) when a row's metric is text but not a finite,
    non-negative number: a NaN compares as neither better nor worse and a
    negative latency as a gain, so either would pass unmarked. Empty cells
    (an untimed row) are not data, and are left alone."""
    text = run.latest[metric].astype(str).str.strip()
    value = pd.to_numeric(text, errors="coerce")
    bad = text.ne("") & ~(np.isfinite(value) & value.ge(0))
    if bad.any():
        first = run.latest_config.loc[bad[bad].index[0]]
        where = f"cp_size={first['cp_size']} seq_lens={first['seq_lens']} impl={first['impl']}"
        raise InputError(f"{run.arg}={run.value}: bad data: {metric}={text[bad].iloc[0]} in {int(bad.sum())} "
                         f"row(s) (first: {where}); a time or size is a finite number >= 0")


def _spread(j: pd.DataFrame, metric: str) -> pd.Series:
    """The noise margin of each joined row in the metric's unit (NaN: none known).

    Mean of the two rows' spreads, or the one that exists (a BASE written before
    the spread column still gets NEW's)."""
    rule = spread_rule(metric)
    if rule == "absolute":
        return pd.concat([j["iqr_base"], j["iqr_new"]], axis=1).mean(axis=1)
    if rule == "relative":
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = pd.concat([j["iqr_base"] / j["p50_base"], j["iqr_new"] / j["p50_new"]], axis=1)
        rel = rel.replace([np.inf, -np.inf], np.nan).mean(axis=1)
        return rel * j["value_base"].abs()
    return pd.Series(np.nan, index=j.index)


def _present(col: pd.Series) -> pd.Series:
    """Cells holding a sample array (not None, not the NaN of an unjoined side)."""
    return col.map(lambda x: isinstance(x, np.ndarray)).astype(bool)


def _side(has_b: pd.Series, has_n: pd.Series) -> np.ndarray:
    """Which side lacks a thing, for a mark: "BASE", "NEW" or "BASE and NEW"."""
    return np.where(~has_b & ~has_n, "BASE and NEW", np.where(~has_b, "BASE", "NEW"))


def _missing_why(j: pd.DataFrame, sampled_b: pd.Series, sampled_n: pd.Series) -> pd.Series:
    """Per row, which side's samples are missing and why (``samples_why`` of that side)."""
    wb = j["samples_why_base"].fillna("").astype(str)
    wn = j["samples_why_new"].fillna("").astype(str)
    return "samples missing, " + _join_marks([pd.Series(np.where(~sampled_b, "BASE: " + wb, ""), index=j.index),
                                              pd.Series(np.where(~sampled_n, "NEW: " + wn, ""), index=j.index)])


def _unchecked_why(j: pd.DataFrame, metric: str) -> pd.Series:
    """Why a timed row no rule could check is unverified: for the paired
    metric, neither run kept samples and the fallback has no spread; for
    another, a value on one side only."""
    if metric != PAIRED:
        vb, vn = j["value_base"].notna(), j["value_new"].notna()
        return pd.Series("no " + metric + " in " + _side(vb, vn), index=j.index, dtype=object)
    pb, pn = j["p50_base"].notna(), j["p50_new"].notna()
    absolute = np.where(pb & pn, f"{ABSOLUTE_FALLBACK} without a spread",
                        f"no {ABSOLUTE_FALLBACK} in " + _side(pb, pn))
    return pd.Series(f"neither run kept {SAMPLES_FILE}; " + absolute, index=j.index, dtype=object)


def fewest_samples(j: pd.DataFrame) -> pd.Series:
    """Per joined row, the smaller side's number of samples (0 where a side has none)."""
    size = lambda x: len(x) if isinstance(x, np.ndarray) else 0  # noqa: E731
    return pd.concat([j["samples_base"].map(size), j["samples_new"].map(size)], axis=1).min(axis=1)


def _too_few_why(j: pd.DataFrame) -> pd.Series:
    fewest = fewest_samples(j)
    return pd.Series([f"{k} sample(s) a side: no difference can be significant at {ALPHA:g} with so few (the "
                      f"smallest p-value is {smallest_p(k):.2g}); time with iters={MIN_SAMPLES} or more, or "
                      "iters=auto" if k < MIN_SAMPLES else "" for k in fewest], index=j.index, dtype=object)


def _spread_of(x: object) -> float:
    """A sample's IQR over its median (NaN where it has none)."""
    if not isinstance(x, np.ndarray) or len(x) < 2 or not np.median(x) > 0:
        return math.nan
    q1, q3 = np.percentile(x, [25, 75])
    return float((q3 - q1) / np.median(x))


def _powers(j: pd.DataFrame, tested: pd.Series, threshold: float, higher_better: bool) -> pd.Series:
    """Per tested row, the test's power to flag the change the gate must
    resolve at this threshold (NaN elsewhere)."""
    out = pd.Series(np.nan, index=j.index)
    change = -resolved_change(threshold) if higher_better else resolved_change(threshold)
    for i in np.flatnonzero(tested.to_numpy()):
        out.iat[i] = power(j["samples_base"].iat[i], j["samples_new"].iat[i], change)
    return out


def _low_power_why(j: pd.DataFrame, threshold: float) -> pd.Series:
    """What a row too noisy for the gate to judge lacks, and what to run instead."""
    pct = f"{resolved_change(threshold) * 100:g}%"

    def one(k: int, pw: float, sb: object, sn: object, auto_b: object, auto_n: object) -> str:
        spread = np.nanmax([_spread_of(sb), _spread_of(sn)])
        head = (f"P(flag a {pct} change) = {pw:.2f} < {POWER_MIN:g} with {k} samples a side"
                + (f", spread {spread * 100:.0f}%" if math.isfinite(spread) else ""))
        if auto_b is True and auto_n is True:
            return f"too noisy: {head}, at iters=auto's cap; rerun both on a quieter machine"
        return f"low power: {head}; time both runs with iters=auto"

    return pd.Series([one(int(k), pw, sb, sn, ab, an) if pd.notna(pw) else "" for k, pw, sb, sn, ab, an in zip(
        fewest_samples(j), j["power"], j["samples_base"], j["samples_new"], j["auto_base"], j["auto_new"])],
        index=j.index, dtype=object)


def compare(base: pd.DataFrame, new: pd.DataFrame, metric: str, threshold: float,
            samples_kept: bool = True) -> pd.DataFrame:
    """The outer join of two keyed runs, sorted by configuration, with one boolean
    column per verdict (see the module docstring) and ``change_pct``/``spread``.
    ``samples_kept``: either run has a samples file (its rows' samples are
    then their evidence, and a row without them is unverified)."""
    base, new = declared_names(base, new)
    # one integer per configuration, numbered over both runs at once, to join on
    config = pd.concat([base[list(CONFIG_COLUMNS)], new[list(CONFIG_COLUMNS)]], ignore_index=True)
    codes = point_codes(config)
    base, new = base.assign(key=codes[: len(base)]), new.assign(key=codes[len(base):])
    values = ["key", "value", "status", "correct", "iqr", "p50", "samples", "samples_why", "auto", "load", "smoke"]
    j = base[values].merge(new[values], on="key", how="outer", suffixes=("_base", "_new"), indicator=True)
    config = config.assign(key=codes).drop_duplicates("key")
    j = j.merge(config, on="key", how="left")
    both = j["_merge"].eq("both")
    j["missing"] = j["_merge"].eq("left_only")
    j["only_new"] = j["_merge"].eq("right_only")

    sb, sn = j["status_base"].fillna(""), j["status_new"].fillna("")
    new_skipped = sn.isin(NEUTRAL)
    # Correctness is absolute: a failing row of NEW gates whatever BASE had
    # (good: status worse; failing too, skipped or absent: failing in NEW).
    failing = j["status_new"].notna() & ~sn.isin(GOOD_STATUSES) & ~new_skipped
    j["status_worse"] = both & sb.isin(GOOD_STATUSES) & failing
    j["failing_new"] = failing & ~j["status_worse"]
    j["status_changed"] = both & sb.ne(sn)
    j["correctness_lost"] = both & holds(j["correct_base"]) & ~holds(j["correct_new"]) & ~new_skipped

    both_ok = both & sb.eq("ok") & sn.eq("ok")
    sampled_b, sampled_n = _present(j["samples_base"]), _present(j["samples_new"])
    with_samples = sampled_b & sampled_n
    # Samples too few for any difference to be significant: the test could
    # never flag the row, so it does not count as tested.
    few = both_ok & with_samples & (fewest_samples(j) < MIN_SAMPLES)
    # ... unless both rows are the smoke preset's: not a timing, so not gated on time
    j["smoke_untimed"] = few & holds(j["smoke_base"]) & holds(j["smoke_new"])
    b, n = j["value_base"], j["value_new"]
    p50b, p50n = j["p50_base"], j["p50_new"]
    if metric == PAIRED:
        # timed: a time on either side (its samples or its round trip's median)
        timed_any = sampled_b | sampled_n | p50b.notna() | p50n.notna()
    else:
        # A metric measured on one side only cannot be compared; on neither
        # (bandwidth at cp 1, where nothing moves) there is nothing to compare.
        timed_any = b.notna() & n.notna()
        no_value = both_ok & (b.notna() ^ n.notna())
    # The samples are the evidence: where either run kept them, a timed row
    # without them on a side is unverified. Only runs that both predate the
    # samples (no samples file at all) are gated on the CSV's values and
    # their spread, which move with the load.
    tested = both_ok & timed_any & with_samples & ~few if sampled(metric) else pd.Series(False, index=j.index)
    lacking = both_ok & timed_any & ~with_samples & sampled(metric) & samples_kept
    if metric == PAIRED:
        abs_spread = _spread(j, ABSOLUTE_FALLBACK)
        fallback = both_ok & ~tested & ~few & ~lacking & p50b.notna() & p50n.notna() & abs_spread.notna()
        no_rule = both_ok & timed_any & ~tested & ~fallback & ~few & ~lacking
        # shown in the table: the absolute times of rows without the paired samples
        absolute = fallback | no_rule | lacking
        b, n = b.where(~absolute, p50b), n.where(~absolute, p50n)
        spread = abs_spread.where(fallback)
        timed = tested | fallback
    else:
        # the spread rule: metrics without samples (bandwidths, sizes), or
        # sampled ones where neither run kept samples
        by_spread = both_ok & timed_any & ~tested & ~few & ~lacking
        no_rule = no_value
        fallback = pd.Series(False, index=j.index)
        spread = _spread(j, metric).where(by_spread)
        timed = tested | by_spread
    j["value_base"], j["value_new"] = b, n
    # what the values are, for a regression's evidence
    j["basis"] = np.where(absolute, ABSOLUTE_FALLBACK, "median paired ratio") if metric == PAIRED else metric
    worse_by = (b - n) if higher_is_better(metric) else (n - b)
    beyond_threshold = worse_by.abs() > threshold * b.abs()
    beyond_spread = spread.isna() | (worse_by.abs() > spread)
    p_worse, p_better = _pvalues(j, tested, higher_is_better(metric))
    supported_worse = (tested & pd.Series(p_worse < ALPHA, index=j.index)) | (~tested & beyond_spread)
    supported_better = (tested & pd.Series(p_better < ALPHA, index=j.index)) | (~tested & beyond_spread)
    j["timed"], j["tested"], j["fallback"] = timed, tested, fallback
    j["regressed"] = timed & (worse_by > 0) & beyond_threshold & supported_worse
    j["improved"] = timed & (worse_by < 0) & beyond_threshold & supported_better
    # A tested row the gate could not have flagged at its threshold is no pass.
    j["power"] = _powers(j, tested & ~j["regressed"] & ~j["improved"], threshold, higher_is_better(metric))
    low_power = j["power"].lt(POWER_MIN)
    few_gated = few & ~j["smoke_untimed"]
    j["unverified"] = lacking | no_rule | few_gated | low_power
    why = pd.Series("", index=j.index, dtype=object)
    why = why.where(~no_rule, _unchecked_why(j, metric))
    why = why.where(~lacking, _missing_why(j, sampled_b, sampled_n))
    why = why.where(~few_gated, _too_few_why(j))
    why = why.where(~low_power, _low_power_why(j, threshold))
    j["unverified_why"] = why.where(j["unverified"], "")
    j["p_value"] = pd.Series(np.where(worse_by > 0, p_worse, p_better), index=j.index).where(tested)
    j["spread"] = spread
    j["within_noise"] = timed & beyond_threshold & ~j["regressed"] & ~j["improved"] & ~low_power
    with np.errstate(divide="ignore", invalid="ignore"):
        # a zero base (possible only for sizes) gives +-inf for any change, 0 for none
        change = np.where(b.eq(0) & n.eq(0), 0.0, (n - b) / b * 100)
    j["change_pct"] = pd.Series(change, index=j.index).where(timed | (both & b.notna() & n.notna()))
    return _sorted(j)


def _pvalues(j: pd.DataFrame, tested: pd.Series, higher_better: bool) -> tuple[np.ndarray, np.ndarray]:
    """Adjusted p-values (NaN where not tested) that the metric got worse, and
    that it got better, per joined row; each family adjusted on its own."""
    worse, better = np.full(len(j), np.nan), np.full(len(j), np.nan)
    for i in np.flatnonzero(tested.to_numpy()):
        base, new = j["samples_base"].iat[i], j["samples_new"].iat[i]
        up, down = p_greater(base, new), p_greater(new, base)
        worse[i], better[i] = (down, up) if higher_better else (up, down)
    return adjusted(worse), adjusted(better)


def noise(j: pd.DataFrame, metric: str) -> dict[str, float]:
    """What the two runs can resolve, measured on them: ``within``, the median
    row's relative spread of its samples (IQR over median, both runs);
    ``between``, the median and 90th percentile of the absolute change of the
    metric over the timed rows the gate found unchanged: the drift of the
    runs themselves; ``points``, how many rows that is. NaN where not known."""
    out = {"within": math.nan, "between_p50": math.nan, "between_p90": math.nan, "points": 0}
    # rows the gate found unchanged: the drift of the runs themselves (all
    # timed rows when every one changed), in one unit: the tested rows where
    # any were, not beside the absolute times of rows that fell back
    pool = j["tested"] if j["tested"].any() else j["timed"]
    timed = j[pool & ~j["regressed"] & ~j["improved"]]
    if timed.empty:
        timed = j[pool]
    if timed.empty:
        return out
    with np.errstate(divide="ignore", invalid="ignore"):
        change = (timed["value_new"] / timed["value_base"] - 1).abs().replace([np.inf], np.nan).dropna()
    if len(change):
        out.update(between_p50=float(change.median()), between_p90=float(change.quantile(0.9)), points=len(change))
    rel = [v for col in ("samples_base", "samples_new") for v in map(_spread_of, timed[col]) if math.isfinite(v)]
    if rel:
        out["within"] = float(np.median(rel))
    return out


def noise_lines(j: pd.DataFrame, metric: str, threshold: float) -> list[str]:
    """The noise compare measured, and a warning when the threshold is finer."""
    nz = noise(j, metric)
    if not nz["points"]:
        return []
    pct = lambda v: "n/a" if math.isnan(v) else f"{v * 100:.1f}%"  # noqa: E731
    lines = [f"noise measured: between the runs the median unchanged row moved {pct(nz['between_p50'])} "
             f"(90th percentile {pct(nz['between_p90'])}, {nz['points']} rows); within a run a row's "
             f"samples spread {pct(nz['within'])} (median IQR/median)"]
    lines += _wide_but_powered(j, nz["within"], threshold)
    if threshold < nz["between_p50"] * 2:
        lines.append(f"warning: --fail-above={threshold * 100:g}% is finer than these runs resolve (twice the median "
                     f"drift between them is {pct(2 * nz['between_p50'])}): differences that small are not told "
                     "apart from the machine's drift; use the paired metric (default), quieter runs, more iters, "
                     "or a larger threshold")
    return lines


def _wide_but_powered(j: pd.DataFrame, within: float, threshold: float) -> list[str]:
    """Why a spread wider than the change the gate must flag still let every
    tested row judge it (one line), or nothing: the rank test's power grows
    with the samples a side, so a sample's spread alone does not decide it."""
    powered = j["power"].dropna()  # set by compare() on every row (NaN where untested)
    change = resolved_change(threshold)
    if not within > change or powered.empty or powered.lt(POWER_MIN).any():
        return []
    k = int(fewest_samples(j).loc[powered.index].min())
    return [f"the spread within a run ({within * 100:.1f}%) is wider than the {change * 100:g}% change the gate must "
            f"flag, yet every tested row has the power to flag it (least P = {powered.min():.2f} >= {POWER_MIN:g}, "
            f"{k} or more samples a side): the rank test weighs all the samples of both runs, and its power grows "
            "with their number, not only with one sample's spread"]


def _sorted(j: pd.DataFrame) -> pd.DataFrame:
    """Rows in configuration order, numbers numerically (2 before 10), then text.

    Each column's few distinct values are ranked once; the rows sort on the ranks."""
    ranks = []
    for col in CONFIG_COLUMNS:
        codes, uniques = pd.factorize(j[col], use_na_sentinel=False)
        order = sorted(range(len(uniques)), key=lambda i: _sort_key(uniques[i]))
        rank = np.empty(len(uniques), dtype=np.int64)
        rank[order] = np.arange(len(uniques))
        ranks.append(rank[codes])
    order = np.lexsort(ranks[::-1]) if ranks else np.arange(len(j))
    return j.iloc[order].reset_index(drop=True)


def _sort_key(value: object) -> tuple[int, float, str]:
    try:
        return (0, float(str(value)), "")
    except ValueError:
        return (1, 0.0, str(value))


def gating(j: pd.DataFrame, allow_missing: bool, allow_unverified: bool = False) -> pd.Series:
    """Rows that make the exit status 1: any gate's (:data:`GATE_TABLE`) not allowed."""
    allowed = {"allow_missing": allow_missing, "allow_unverified": allow_unverified}
    gate = pd.Series(False, index=j.index)
    for g in GATE_TABLE:
        if not (g.allowed_by and allowed[g.allowed_by]):
            gate |= j[g.column].astype(bool)
    return gate


def remarkable(j: pd.DataFrame) -> pd.Series:
    """Rows that get a mark other than "no timing": something changed, or could not be verified."""
    flags = ["missing", "only_new", "status_changed", "failing_new", "correctness_lost", "regressed", "within_noise",
             "improved", "unverified", "smoke_untimed"]
    return j[flags].any(axis=1)


def compared(j: pd.DataFrame) -> pd.Series:
    """Rows that ran in both runs (joined, skipped in neither): what the gate can compare."""
    return j["_merge"].eq("both") & ~j["status_base"].isin(NEUTRAL) & ~j["status_new"].isin(NEUTRAL)


def nothing_compared(j: pd.DataFrame) -> str:
    """Why no row was compared (the gate then fails: a pass would vouch for nothing), or ''."""
    joined = int(j["_merge"].eq("both").sum())
    if compared(j).any():
        return ""
    if not joined:
        return ("nothing compared: no row of NEW is at a point and impl of BASE (different configurations, "
                "e.g. other iters or seq_lens)")
    return f"nothing compared: each of the {joined} joined row(s) is skipped in BASE or NEW"


def _join_marks(parts: list[pd.Series]) -> pd.Series:
    """Non-empty parts of each row joined with "; " (column-wise, no row loop)."""
    out = parts[0]
    for p in parts[1:]:
        out = pd.Series(np.where(out.eq(""), p, np.where(p.eq(""), out, out + "; " + p)), index=out.index)
    return out


def marks(j: pd.DataFrame, threshold: float, allow_missing: bool, allow_unverified: bool = False) -> pd.Series:
    """The mark column: what happened to each row, and which rule applied."""
    pct = f"{threshold * 100:g}%"

    def when(mask: pd.Series, text: pd.Series | str) -> pd.Series:
        return pd.Series(np.where(mask, text, ""), index=j.index, dtype=object)

    sb, sn = j["status_base"].fillna("-"), j["status_new"].fillna("-")
    cb, cn = (j[c].astype(object).map(fmt).replace("", "-") for c in ("correct_base", "correct_new"))
    spread = j["spread"].map(fmt)
    pval = j["p_value"].map(lambda v: "" if pd.isna(v) else f"{v:.2g}")
    no_timing = j["_merge"].eq("both") & ~j["timed"] & ~j["unverified"] & ~j["smoke_untimed"]
    # rows of the paired metric gated on their absolute time name it
    fb = j["fallback"]
    basis = f"{ABSOLUTE_FALLBACK}, neither run kept samples: "
    base_was = pd.Series(np.where(j["_merge"].eq("right_only"), "no row", sb), index=j.index)
    by_spread = ~j["tested"] & ~fb
    parts = [
        when(j["missing"], "MISSING in NEW (allowed)" if allow_missing else "MISSING in NEW"),
        when(j["only_new"], "only in NEW"),
        when(j["status_worse"], "STATUS WORSE " + sb + "->" + sn),
        when(j["failing_new"], "FAILING in NEW: " + sn + " (BASE: " + base_was + ")"),
        when(j["status_changed"] & ~j["status_worse"] & ~j["failing_new"], "status " + sb + "->" + sn),
        when(j["correctness_lost"], "CORRECTNESS LOST (correct " + cb + "->" + cn + ")"),
        when(j["regressed"] & j["tested"], "REGRESSED (beyond " + pct + ", significant: p=" + pval + ")"),
        # the spread rule's
        when(j["regressed"] & fb, f"REGRESSED ({basis}beyond {pct} and the spread)"),
        when(j["regressed"] & by_spread & j["spread"].notna(), f"REGRESSED (beyond {pct} and the spread)"),
        when(j["regressed"] & by_spread & j["spread"].isna(), f"REGRESSED (beyond {pct}; no spread)"),
        when(j["within_noise"] & fb, f"within noise ({basis}beyond {pct} but not the spread " + spread + ")"),
        when(j["within_noise"] & by_spread, "within noise (beyond " + pct + " but not the spread " + spread + ")"),
        when(j["within_noise"] & j["tested"], "within noise (beyond " + pct + " but not significant: p=" + pval + ")"),
        when(j["regressed"], evidence(j)),
        when(j["improved"] & fb, f"improved ({ABSOLUTE_FALLBACK}, neither run kept samples)"),
        when(j["improved"] & ~fb, "improved"),
        when(j["unverified"], ("unverified (allowed: " if allow_unverified else "UNVERIFIED (")
             + j["unverified_why"].astype(str) + ")"),
        when(j["smoke_untimed"], "time not gated (smoke preset: " + fewest_samples(j).astype(str)
             + " sample(s) a side)"),
        when(no_timing, "no timing"),
    ]
    return _join_marks(parts)


def evidence(j: pd.DataFrame) -> pd.Series:
    """What a regressed row's verdict rests on, beside its p-value: NEW over
    BASE in the metric gated on, and the 1-minute load each run was timed at."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (j["value_new"] / j["value_base"]).map(lambda v: f"x{v:.3g}" if math.isfinite(v) else "n/a")
    load = lambda v: "unknown" if pd.isna(v) else f"{v:.1f}"  # noqa: E731
    return pd.Series("evidence: " + j["basis"] + " NEW/BASE " + ratio + ", 1-minute load BASE "
                     + j["load_base"].map(load) + " NEW " + j["load_new"].map(load), index=j.index, dtype=object)


def _cells(col: pd.Series) -> pd.Series:
    """A canonical key column shown as numbers when every cell is one (right-aligned)."""
    num = pd.to_numeric(col, errors="coerce")
    if num.notna().all():
        return num.astype("int64") if (num == num.round()).all() else num
    return col


def table(j: pd.DataFrame, mark: pd.Series, columns: list[str]) -> str:
    """The markdown table of ``j``'s rows: the configuration ``columns``, base,
    new, change, spread, mark."""
    shown = pd.DataFrame({c: _cells(j[c]) for c in columns}, index=j.index)
    change = j["change_pct"].map(lambda v: "" if pd.isna(v) else f"{v:+.1f}%")  # +inf% and -inf% too
    return frame_md(shown.assign(base=j["value_base"], new=j["value_new"], change=change, spread=j["spread"],
                                 mark=mark))


def rule_line(metric: str, threshold: float, j: pd.DataFrame) -> str:
    """How rows were gated on the metric, naming only the rules that applied to ``j``'s rows."""
    direction = "higher" if higher_is_better(metric) else "lower"
    pct = f"{threshold * 100:g}%"
    what = (f"{metric} (per iteration: round trip / the A/A control's round trip in the same iteration; median)"
            if metric == PAIRED else metric)
    head = (f"metric: {what} ({direction} is better); a row regresses when it is timed in both runs "
            f"and worse by more than {pct}")
    tested, fallback, unverified = int(j["tested"].sum()), int(j["fallback"].sum()), int(j["unverified"].sum())
    by_spread = int((j["timed"] & ~j["tested"] & ~j["fallback"]).sum())
    rules = []
    if tested:
        rules.append(f"{tested} row(s) with samples on both sides: AND significantly (one-sided Mann-Whitney U "
                     f"on the per-iteration samples, Benjamini-Hochberg false discovery rate {ALPHA * 100:g}% "
                     "over those rows)")
    if fallback:
        rules.append(f"{fallback} row(s) without samples on both sides: on {ABSOLUTE_FALLBACK} (absolute, moves "
                     f"with the load) AND by more than its spread (mean {SPREAD} of the two rows)")
    if by_spread:
        rule = spread_rule(metric)
        if rule == "absolute":
            rules.append(f"{by_spread} row(s) without samples on both sides: AND by more than the spread "
                         f"(mean {SPREAD} of the two rows; none: {pct} alone)")
        elif rule == "relative":
            rules.append(f"{by_spread} row(s): AND by more than the spread ({SPREAD} / roundtrip_p50_us of the two "
                         f"rows, times BASE; none: {pct} alone)")
        else:
            rules.append(f"{by_spread} row(s): {pct} alone (a size: exact, no spread)")
    if unverified:
        rules.append(f"{unverified} timed row(s) that neither rule could check: unverified, failing unless "
                     "--allow-unverified")
    smoke = int(j["smoke_untimed"].sum())
    if smoke:
        rules.append(f"{smoke} row(s) of the smoke preset in both runs, with fewer than {MIN_SAMPLES} samples a "
                     "side: not gated on time (status and correctness are)")
    if not rules:
        return head + "; no row is timed in both runs: none was gated on the metric"
    return head + "; " + "; ".join(rules)


def smoke_note(rows: int) -> str:
    """What two smoke runs' compare vouches for, and what to run to gate on time."""
    run = " ".join(command())
    return (f"note: {rows} timed row(s) are the smoke preset's in both runs (+matrix=smoke: every code path once, "
            f"a few iterations): too few samples for any change to be significant, so their times are not gated; "
            f"status and correctness are. To gate on time, time both runs with iters=auto (e.g. `{run} "
            f"+matrix=smoke iters=auto results_dir=...`, up to 30 s a point; {doc_url('review.md')})")


def points(j: pd.DataFrame) -> int:
    """Distinct points (configurations; the impl apart) among ``j``'s rows."""
    cols = [c for c in CONFIG_COLUMNS if c != "impl"]
    return int(len(j[cols].drop_duplicates())) if len(j) else 0


def _no_samples_note(run: Run) -> str:
    """Why a run has no samples file, as far as its rows tell, and what compare does instead."""
    timed = int((run.latest["status"].astype(str).str.strip().eq("ok")
                 & pd.to_numeric(run.latest[ABSOLUTE_FALLBACK], errors="coerce").notna()).sum())
    if not timed:
        return f"note: {run.arg}={run.value} has no {SAMPLES_FILE}, and none of its rows is timed"
    return (f"note: {run.arg}={run.value} has no {SAMPLES_FILE} although {timed} of its rows are timed (written "
            f"before samples were kept, or not copied with its results): those rows are gated on "
            f"{ABSOLUTE_FALLBACK}, absolute times that move with the machine's load, where a spread is known, "
            "else unverified")

