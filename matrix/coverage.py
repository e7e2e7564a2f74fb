"""The report's plan coverage: which plan classes (matrix.plan_classes) each
implementation ran at each cp, and a loud warning where an implementation
from outside the project ran no uneven plan at some cp (its bugs in uneven
shards cannot have shown there: a sweep of even plans passes code that
breaks on the first uneven batch).

A row counts as run when it is not ``skipped``. Rows of a results file
written before the ``plan_class`` column get their classes from their plan
columns (the plan is rebuilt once per distinct plan).
"""

from __future__ import annotations

import pandas as pd

from ._review import frame_md
from .plan_classes import CLASSES, SEPARATOR, UNEVEN

CONFORMANCE = "+matrix=conformance"
# The origin of the project's own implementations (nsa_cp_comm.impls.origin): "nsa_cp_comm VERSION".
BUILTIN_ORIGIN = "nsa_cp_comm "


def plan_classes(df: pd.DataFrame) -> pd.Series:
    """Each row's ``plan_class`` cell; where it is empty, classified from the
    row's plan (policy, cp_size, effective_page_size, align, seq_lens)."""
    given = df["plan_class"].astype(object).fillna("").astype(str).str.strip() if "plan_class" in df else \
        pd.Series("", index=df.index)
    empty = given.eq("")
    if not empty.any():
        return given
    keys = ["policy", "cp_size", "effective_page_size", "align", "seq_lens"]
    plans = df.loc[empty, keys].astype(str)
    found = {key: _classify(*key) for key in set(map(tuple, plans.to_numpy()))}
    return given.where(~empty, pd.Series([found[tuple(k)] for k in plans.to_numpy()], index=plans.index))


def _classify(policy: str, cp: str, page: str, align: str, seq_lens: str) -> str:
    import json

    from nsa_cp_comm.plan import plan_split

    from .plan_classes import label

    try:
        lens = json.loads(seq_lens)
        cp_size = int(float(cp))
        plan = plan_split(lens, cp_size, policy=policy, page_size=int(float(page or 1)),
                          align=int(float(align)) if align.strip() not in ("", "nan", "None") else None)
    except (ValueError, TypeError):
        return ""
    return label(plan)


def outside(df: pd.DataFrame) -> pd.Series:
    """Rows of implementations from outside the project (a plug-in, by
    reference or entry point): their origin is not nsa_cp_comm's own."""
    origin = df["impl_origin"].astype(object).fillna("").astype(str).str.strip()
    return ~origin.str.startswith(BUILTIN_ORIGIN) & (origin.ne("") | df["impl"].astype(str).str.contains(":"))


def _ran(df: pd.DataFrame) -> pd.DataFrame:
    rows = df[df["status"].ne("skipped")]
    return rows.assign(_classes=plan_classes(rows).str.split(SEPARATOR, regex=False))


def without_uneven(df: pd.DataFrame) -> list[tuple[str, int]]:
    """``(impl, cp)`` of each outside implementation and cp > 1 where it ran
    only even plans."""
    rows = _ran(df[outside(df)])
    if rows.empty:
        return []
    uneven = rows["_classes"].map(lambda cs: any(c in UNEVEN for c in cs))
    has = uneven.groupby([rows["impl"].astype(str), rows["cp_size"]]).any()
    return [(impl, int(cp)) for (impl, cp), any_uneven in has.items() if cp > 1 and not any_uneven]


def warnings(df: pd.DataFrame) -> list[str]:
    """The report's loud lines, one per outside implementation with a cp it
    ran only even plans at; none otherwise."""
    by_impl: dict[str, list[int]] = {}
    for impl, cp in without_uneven(df):
        by_impl.setdefault(impl, []).append(cp)
    return [
        f"**WARNING: `{impl}` ran no uneven plan at cp={', '.join(map(str, sorted(cps)))}**: its rows there "
        f"cannot show a bug in uneven shards (an empty rank, padding, a short rank before a long one). Run "
        f"`python -m matrix {CONFORMANCE} impl={impl},padded` (docs/plugins.md)."
        for impl, cps in by_impl.items()
    ]


def table(df: pd.DataFrame) -> pd.DataFrame:
    """Per implementation and cp: the rows that ran each plan class, the
    bystander counts they ran with, and whether any plan was uneven."""
    rows = _ran(df)
    if rows.empty:
        return pd.DataFrame()
    flat = rows[["impl", "cp_size", "_classes"]].explode("_classes")
    counts = pd.crosstab([flat["impl"].astype(str), flat["cp_size"]], flat["_classes"])
    counts = counts.reindex(columns=list(CLASSES), fill_value=0)
    counts.columns.name = None
    zero = counts.eq(0).to_numpy()
    missing = [", ".join(c for c, z in zip(CLASSES, row) if z) or "-" for row in zero]
    key = [rows["impl"].astype(str), rows["cp_size"]]
    bystanders = rows["bystanders"].astype(object).fillna("").astype(str).str.strip().replace("", "0")
    counts["bystanders"] = bystanders.groupby(key).agg(lambda s: ",".join(sorted(set(s), key=float)))
    counts["missing"] = missing
    return counts


def section(df: pd.DataFrame, appendix_file: str) -> tuple[list[str], list[str]]:
    """(report lines, appendix lines) of the coverage section: where an
    outside implementation ran, a line of totals and its table by cp; every
    impl's table in the appendix."""
    frame = table(df)
    if frame.empty:
        return [], []
    frame = frame.rename_axis(["impl", "cp_size"])
    appendix = ["## Plan classes run, by impl and cp", "", frame_md(frame, index=True), ""]
    ours = frame[frame.index.get_level_values("impl").isin(set(df.loc[outside(df), "impl"].astype(str)))]
    if ours.empty:
        return [], appendix
    totals = frame[list(CLASSES)].sum()
    main = [f"Rows that ran each plan class (docs/plugins.md, \"Plan classes\"; a plan may be in several; "
            f"`{CONFORMANCE}` runs each at every cp): "
            + ", ".join(f"{c} {int(n)}" for c, n in totals.items())
            + f"; by impl and cp in the [appendix]({appendix_file})."]
    bad = without_uneven(df)
    main += ["", f"Outside implementations, by cp (`missing`: the classes not run there; "
                 f"{len(bad)} cp(s) of even plans only{', warned at the top' if bad else ''}):", ""]
    main.append(frame_md(ours.head(8), index=True))
    if len(ours) > 8:
        main += ["", f"... {len(ours) - 8} more: all in the [appendix]({appendix_file})"]
    return main, appendix

