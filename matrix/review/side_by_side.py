"""What the report may set side by side: implementations compared on the same
points only, each against a reference, one implementation under one name,
and the wall time the runs took.

- :func:`common` marks the points where every implementation timed in their
  group (backend/device and cp size) was timed; only those enter a figure that
  compares implementations. The others are tabled apart, saying which
  implementations were timed there and what the rest did (refused, error, ...).
- :func:`same_origin` finds names of one implementation: a plug-in run once
  from its entry point (``engine_comm``) and once by reference
  (``engine_comm.adapter:impl``) has one ``impl_origin`` (module and version).
  The project's own implementations share their origin and are never merged,
  nor are two references (``module:attribute``) that name different attributes,
  nor two declared names (a module's implementations: a catalog of several).
"""

from __future__ import annotations

import hashlib

import pandas as pd

from nsa_cp_comm.origins import REFERENCE_SEP, clean, is_own, is_reference

from ._review import each_value


def mixed(df: pd.DataFrame) -> list[str]:
    """backend/device when the rows mix several, so tables and plots keep them apart."""
    return [c for c in ("backend", "device") if df[c].nunique() > 1]


def group_keys(df: pd.DataFrame) -> list[str]:
    """The columns a comparison is made within: :func:`mixed`, and cp size."""
    return mixed(df) + ["cp_size"]


def common(rows: pd.DataFrame, pair: str) -> pd.Series:
    """For timed ``rows`` (one per point and impl): True where every impl timed
    anywhere in the row's group (:func:`group_keys`) was timed at the row's point."""
    if rows.empty:
        return pd.Series(False, index=rows.index, dtype=bool)
    keys = group_keys(rows)
    in_group = rows.groupby(keys, dropna=False)["impl"].transform("nunique")
    at_point = rows.groupby(pair)["impl"].transform("nunique")
    return at_point.eq(in_group).astype(bool)


def missing_label(df: pd.DataFrame, rows: pd.DataFrame, apart: pd.Series, pair: str) -> pd.Series:
    """For each point of the timed ``rows`` where ``apart`` (not :func:`common`):
    which impls timed elsewhere in its group were not timed there and why
    (their status there, or ``no row``), e.g. ``legacy refused``; "" elsewhere."""
    out = pd.Series("", index=rows.index, dtype=object)
    if not apart.any():
        return out
    keys = group_keys(rows)
    points = rows.loc[apart, keys + [pair]].drop_duplicates()
    wanted = points.merge(rows[keys + ["impl"]].drop_duplicates(), on=keys)  # each impl of the point's group
    here = rows[[pair, "impl"]].drop_duplicates().assign(_here=True)
    wanted = wanted.merge(here, on=[pair, "impl"], how="left")
    wanted = wanted[wanted["_here"].isna()]
    status = df[[pair, "impl", "status"]].drop_duplicates([pair, "impl"], keep="last")
    wanted = wanted.merge(status, on=[pair, "impl"], how="left").sort_values([pair, "impl"])
    wanted["what"] = wanted["impl"].astype(str) + " " + wanted["status"].fillna("no row").astype(str)
    label = wanted.groupby(pair)["what"].agg(", ".join)
    out[apart] = rows.loc[apart, pair].map(label).fillna("").to_numpy()
    return out


def point_ids(config: pd.DataFrame) -> pd.Series:
    """A short stable id per row from its configuration without impl (the rows
    of one point share it): 12 hex digits of the canonical cells' sha1."""
    cols = [config[c].astype(str) for c in config.columns]
    text = cols[0].str.cat(cols[1:], sep="\x1f")  # column by column, not row by row
    return each_value(text, lambda u: hashlib.sha1(u.encode()).hexdigest()[:12])


def to_reference(rows: pd.DataFrame, reference: str, pair: str, metric: str, spread: str,
                 info: list[str]) -> pd.DataFrame:
    """One row per point and impl other than ``reference`` where both were
    timed: the impl's ``metric``, the reference's, their ratio, the spread
    (mean ``spread`` of the two rows; NaN when neither has one) and ``noise``
    (the difference is within the spread)."""
    ref = rows[rows["impl"].eq(reference)].set_index(pair)
    ref = ref[~ref.index.duplicated(keep="last")]
    other = rows[rows["impl"].ne(reference) & rows[pair].isin(ref.index)]
    cols = [c for c in info if c in other.columns]
    out = other[[pair, "impl", *cols, metric, spread]].rename(columns={metric: "value", spread: "_spread_impl"})
    out = out.assign(reference=ref.loc[out[pair], metric].to_numpy(),
                     _spread_ref=ref.loc[out[pair], spread].to_numpy())
    out["ratio"] = out["value"] / out["reference"]
    out["spread"] = out[["_spread_impl", "_spread_ref"]].mean(axis=1)
    out["noise"] = out["spread"].notna() & ((out["value"] - out["reference"]).abs() <= out["spread"])
    return out.drop(columns=["_spread_impl", "_spread_ref"]).reset_index(drop=True)


def same_origin(df: pd.DataFrame) -> dict[str, list[str]]:
    """{the name kept: every name of that implementation} for each
    implementation that ran under several names (see the module docstring).
    The name kept is one that is not a reference, else the shortest."""
    rows = df[["impl", "impl_origin"]].astype(str)
    rows = rows[[bool(clean(o)) and not is_own(o) for o in rows["impl_origin"]]]
    out: dict[str, list[str]] = {}
    for _, names in rows.drop_duplicates().groupby("impl_origin")["impl"]:
        names = sorted(set(names))
        refs = [n for n in names if is_reference(n)]
        if len(names) < 2 or len({r.partition(REFERENCE_SEP)[2] for r in refs}) > 1 or len(names) - len(refs) > 1:
            # one name, references to different attributes, or two names declared in one module (its
            # implementations each declare their own): different implementations
            continue
        kept = min(names, key=lambda n: (is_reference(n), len(n), n))
        out[kept] = names
    return out


def _times(text: pd.Series) -> pd.Series:
    return pd.to_datetime(text.astype(str).str.strip(), errors="coerce", utc=True, format="ISO8601")


def wall_time(df: pd.DataFrame) -> dict:
    """How long the runs that wrote ``df`` took: each run (``run_id``; rows
    without one are one run) from its ``started`` in runs.jsonl, or else its
    first row's start (timestamp less ``wall_s``), to its last row's
    timestamp; ``seconds`` counts the time inside any run once (runs that
    overlapped ran at once), ``span`` is the first start to the last end."""
    ends = _times(df["timestamp"])
    # a wall_s no point took (inf, 1e300) is none, as an empty one; in the timestamps' own unit
    # (microseconds: nanoseconds hold no year before 1677)
    took = pd.to_timedelta(df["wall_s"], unit="s", errors="coerce").fillna(pd.Timedelta(0))
    begins = ends - took.dt.as_unit(ends.dt.unit)
    started = _times(df["started"]) if "started" in df else pd.Series(pd.NaT, index=df.index)
    frame = pd.DataFrame({"run": df["run_id"].astype(str).str.strip(), "end": ends, "begin": begins,
                          "started": started})
    frame = frame[frame["end"].notna()]
    if frame.empty:
        return {"runs": 0}
    runs = frame.groupby("run").agg(started=("started", "min"), begin=("begin", "min"), end=("end", "max"))
    from_record = runs["started"].notna() & runs["started"].le(runs["end"])
    runs["start"] = runs["started"].where(from_record, runs["begin"])
    runs = runs.sort_values("start")
    # runs that overlap (a run starting before the ones begun earlier all ended) join one interval
    joined = runs.groupby((runs["start"] > runs["end"].cummax().shift()).cumsum()).agg(
        start=("start", "min"), end=("end", "max"))
    seconds = sum((end - start).total_seconds() for start, end in zip(joined["start"], joined["end"]))
    return {"runs": len(runs), "from_runs_jsonl": int(from_record.sum()), "seconds": seconds,
            "span": (runs["end"].max() - runs["start"].min()).total_seconds(),
            "first": runs["start"].min().isoformat(), "last": runs["end"].max().isoformat()}
