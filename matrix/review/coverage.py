"""Plan coverage: which plan classes (matrix.scale.plan_classes) each
implementation ran at each cp, and the gaps of an implementation from
outside the project (:func:`gaps`): a cp of the sweep where it ran no plan,
or no uneven plan (its bugs in uneven shards cannot have shown
there: a sweep of even plans passes code that breaks on the first uneven
batch, and one whose every plan is skipped passes anything). A gap is a
loud line of the report and of the sweep's summary, and fails the sweep
unless ``allow_skipped=true``.

The report's table counts a row as run when it is not ``skipped``; a gap is
judged on the rows whose plan the implementation's code ran (:data:`RAN`). Rows of a results file
written before the ``plan_class`` column get their classes from their plan
columns (the plan is rebuilt once per distinct plan).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from nsa_cp_comm.origins import is_outside

from .. import command, doc_url
from ..scale.plan_classes import CLASSES, SEPARATOR, UNEVEN

if TYPE_CHECKING:  # the sweep's summary calls gaps() without pandas
    import pandas as pd

CONFORMANCE = "+matrix=conformance"


def plan_classes(df: pd.DataFrame) -> pd.Series:
    """Each row's ``plan_class`` cell; where it is empty, classified from the
    row's plan (policy, cp_size, effective_page_size, align, seq_lens)."""
    import pandas as pd

    given = df["plan_class"].astype(object).fillna("").astype(str).str.strip()
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

    from ..scale.plan_classes import label

    try:
        lens = json.loads(seq_lens)
        cp_size = int(float(cp))
        plan = plan_split(lens, cp_size, policy=policy, page_size=int(float(page or 1)),
                          align=int(float(align)) if align.strip() not in ("", "nan", "None") else None)
    except (ValueError, TypeError):
        return ""
    return label(plan)


def outside(df: pd.DataFrame) -> pd.Series:
    """Rows of implementations from outside the project (:func:`nsa_cp_comm.origins.is_outside`)."""
    import pandas as pd

    return pd.Series([is_outside(i, o) for i, o in zip(df["impl"], df["impl_origin"])], index=df.index, dtype=bool)


# What a gap is.
RAN_NOTHING = "ran nothing"
NO_UNEVEN = "ran no uneven plan"


# The statuses of a row whose plan the implementation's code ran: passing, or
# failing (the failure is then its verdict); skipped, refused and passthrough
# rows ran none of it.
RAN = ("ok", "failed", "error", "timeout")


def gaps(rows: Iterable[Mapping[str, object]], cps: Iterable[int] = ()) -> list[tuple[str, int, str, str]]:
    """``(impl, cp, what, why)`` for each outside implementation and each cp
    of ``rows`` (the cps any implementation's rows are at, and ``cps``) where no row of it
    ran (:data:`RAN`; ``what`` is :data:`RAN_NOTHING`), or, at cp > 1, none
    that ran is of an uneven plan class (:data:`NO_UNEVEN`). ``why``: the
    first reason one of its rows there that did not run gave, or ''. Pure
    Python: the sweep's summary calls it on the rows it read."""
    swept: set[int] = set(cps)
    uneven: dict[tuple[str, int], bool] = {}  # (impl, cp) -> an uneven plan ran there
    reasons: dict[tuple[str, int], str] = {}
    impls: set[str] = set()
    for row in rows:
        try:
            cp = int(float(str(row.get("cp_size"))))
        except ValueError:
            continue
        swept.add(cp)
        impl = str(row.get("impl", ""))
        if not is_outside(impl, row.get("impl_origin")):
            continue
        impls.add(impl)
        if str(row.get("status", "")).strip() in RAN:
            classes = str(row.get("plan_class") or "").split(SEPARATOR)
            uneven[(impl, cp)] = uneven.get((impl, cp), False) or any(c in UNEVEN for c in classes)
        elif str(row.get("reason") or "").strip() not in ("", "nan"):
            reasons.setdefault((impl, cp), " ".join(str(row.get("reason")).split()))
    out = []
    for impl in sorted(impls):
        for cp in sorted(swept):
            key = (impl, cp)
            if key not in uneven:
                out.append((impl, cp, RAN_NOTHING, reasons.get(key, "")))
            elif cp > 1 and not uneven[key]:
                out.append((impl, cp, NO_UNEVEN, reasons.get(key, "")))
    return out


def gap_lines(found: list[tuple[str, int, str, str]]) -> list[tuple[str, str]]:
    """``(head, detail)`` per outside implementation and kind of gap: the
    head names it and the cps, the detail says what follows and what to run."""
    by: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for impl, cp, what, why in found:
        by.setdefault((impl, what), []).append((cp, why))
    out = []
    for (impl, what), where in by.items():
        why = next((w for _, w in where if w), "")
        parts = ["every row of it there is skipped, refused or passthrough"] if what == RAN_NOTHING else []
        parts += [f"first reason: {why}"] if why else []
        parts.append("its rows there cannot show a bug in uneven shards (an empty rank, padding, a short rank "
                     f"before a long one). Run `{' '.join(command())} {CONFORMANCE} impl={impl},padded` "
                     f"({doc_url('plugins.md')})")
        out.append((f"`{impl}` {what} at cp={', '.join(str(cp) for cp, _ in where)}", "; ".join(parts)))
    return out


def warnings(df: pd.DataFrame) -> list[str]:
    """The report's loud lines, one per outside implementation and kind of
    gap (:func:`gaps`); none otherwise."""
    return [f"**WARNING: {head}**: {detail}." for head, detail in gap_lines(_gaps(df))]


def _gaps(df: pd.DataFrame) -> list[tuple[str, int, str, str]]:
    """:func:`gaps` of a loaded run: the outside rows' cells, column by
    column, and every cp of the run."""
    mine = df[outside(df)]
    cols = {"impl": mine["impl"], "cp_size": mine["cp_size"], "status": mine["status"],
            "plan_class": plan_classes(mine), "impl_origin": mine["impl_origin"], "reason": mine["reason"]}
    rows = [dict(zip(cols, cells)) for cells in zip(*(c.astype(object).tolist() for c in cols.values()))]
    cps = {int(cp) for cp in df["cp_size"].dropna().unique()}
    return gaps(rows, cps)


def table(df: pd.DataFrame) -> pd.DataFrame:
    """Per implementation and cp: the rows that ran each plan class, the
    bystander counts they ran with, and whether any plan was uneven."""
    import pandas as pd

    rows = df[df["status"].ne("skipped")]
    rows = rows.assign(_classes=plan_classes(rows).str.split(SEPARATOR, regex=False))
    if rows.empty:
        return pd.DataFrame()
    flat = rows[["impl", "cp_size", "_classes"]].explode("_classes")
    counts = pd.crosstab([flat["impl"].astype(str), flat["cp_size"]], flat["_classes"])
    counts = counts.reindex(columns=list(CLASSES), fill_value=0)
    counts.columns.name = None
    missing = [", ".join(c for c, z in zip(CLASSES, row) if z) or "-" for row in counts.eq(0).to_numpy()]
    key = [rows["impl"].astype(str), rows["cp_size"]]
    bystanders = rows["bystanders"].astype(object).fillna("").astype(str).str.strip().replace("", "0")
    counts["bystanders"] = bystanders.groupby(key).agg(lambda s: ",".join(sorted(set(s), key=float)))
    counts["missing"] = missing
    return counts


# A status-by-class table's columns, in the order a reader scans them: what went wrong first.
STATUS_ORDER = ("failed", "error", "timeout", "ok", "skipped", "refused", "passthrough")


def by_status(df: pd.DataFrame) -> pd.DataFrame:
    """Per outside implementation and plan class: its rows by status, and the cps of those
    that did not pass; per implementation, the classes it never passed first (where a bug
    shows: `ok` on `even` at every cp, `error` on every uneven class)."""
    import pandas as pd

    mine = df[outside(df)]
    rows = mine.assign(_class=plan_classes(mine).str.split(SEPARATOR, regex=False)).explode("_class")
    rows = rows[rows["_class"].astype(str).str.strip().ne("")]
    if rows.empty:
        return pd.DataFrame()
    key = [rows["impl"].astype(str).rename("impl"), rows["_class"].rename("plan_class")]
    counts = pd.crosstab(key, rows["status"].astype(str))
    counts = counts[[s for s in STATUS_ORDER if s in counts] + [s for s in counts if s not in STATUS_ORDER]]
    counts.columns.name = None
    bad = rows["status"].astype(str).ne("ok")
    cps = rows[bad].groupby([k[bad] for k in key])["cp_size"].agg(
        lambda s: ",".join(str(int(float(c))) for c in sorted(set(s), key=float)))
    counts["cps not ok"] = [cps.get(ic, "-") for ic in counts.index]
    rank = {c: i for i, c in enumerate(CLASSES)}
    failing = never_passed(counts)
    order = sorted(counts.index, key=lambda ic: (ic[0], not failing[ic], rank.get(ic[1], len(rank))))
    return counts.loc[order]


def never_passed(counts: pd.DataFrame) -> pd.Series:
    """Of a :func:`by_status` table: the (impl, class) rows that failed, errored or timed out
    and were never ok (a class only skipped or refused there did not run: coverage's to say)."""
    import pandas as pd

    bad = [s for s in ("failed", "error", "timeout") if s in counts]
    ran_bad = counts[bad].sum(axis=1).gt(0) if bad else pd.Series(False, index=counts.index)
    passed = counts["ok"].gt(0) if "ok" in counts else pd.Series(False, index=counts.index)
    return ran_bad & ~passed


def section(df: pd.DataFrame, appendix_file: str) -> tuple[list[str], list[str]]:
    """(report lines, appendix lines) of the coverage section: where an
    outside implementation ran, a line of totals and its table by cp; every
    impl's table in the appendix."""
    from ._review import frame_md

    frame = table(df)
    if frame.empty:
        return [], []
    frame = frame.rename_axis(["impl", "cp_size"])
    appendix = ["## Plan classes run, by impl and cp", "", frame_md(frame, index=True), ""]
    ours = frame[frame.index.get_level_values("impl").isin(set(df.loc[outside(df), "impl"].astype(str)))]
    if ours.empty:
        return [], appendix
    totals = frame[list(CLASSES)].sum()
    main = [f"Rows that ran each plan class ({doc_url('plugins.md#plan-classes')}; a plan may be in several; "
            f"`{CONFORMANCE}` runs each at every cp): "
            + ", ".join(f"{c} {int(n)}" for c, n in totals.items())
            + f"; by impl and cp in the [appendix]({appendix_file})."]
    bad = _gaps(df)
    main += ["", f"Outside implementations, by cp (`missing`: the classes not run there; "
                 f"{len(bad)} cp(s) of nothing run or even plans only{', warned at the top' if bad else ''}):", ""]
    main.append(frame_md(ours.head(8), index=True))
    if len(ours) > 8:
        main += ["", f"... {len(ours) - 8} more: all in the [appendix]({appendix_file})"]
    statuses = by_status(df)
    if not statuses.empty:
        never = sorted({impl for impl, _ in statuses.index[never_passed(statuses).to_numpy()]})
        shown = frame_md(statuses, index=True)
        main += ["", "Outside implementations, rows by plan class and status (first the classes an impl failed "
                     "and never passed; `cps not ok`: where its rows there did not pass)"
                 + (f": {', '.join(f'`{i}`' for i in never)} never passed some class." if never else "."), "", shown]
        appendix += ["## Outside implementations, rows by plan class and status", "", shown, ""]
    return main, appendix

