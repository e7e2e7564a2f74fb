"""docs/field_bugs.md from a ``+matrix=field_bugs`` sweep, and the catalog's verdict on it.

    python -m examples.field_bugs.table RESULTS_DIR                 # judge, print the table
    python -m examples.field_bugs.table RESULTS_DIR --write docs/field_bugs.md

Each bug's row must be failed, error or timeout with its check (:data:`examples.field_bugs.BUGS`)
on every point where its mechanism shows, and ``ok`` elsewhere; the twin ``ok`` everywhere. Exit
0 when every row is as expected, 1 naming each that is not, 2 on bad input (one line).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from nsa_cp_comm import engines
from nsa_cp_comm.plan import CPPlan

from . import BUGS, BY_NAME, NOT_YET, RAISED

PREFIX = "field_bugs_"
TWIN = "twin"
BAD = ("failed", "error", "timeout")
REASON_CHARS = 360  # room for an error's site (file:line, step); the collective checks' long texts cut


def load(results_dir: str | Path) -> pd.DataFrame:
    """The catalog's rows of a results folder (ValueError, one line, when there are none)."""
    path = Path(results_dir) / "results.csv"
    if not path.is_file():
        raise ValueError(f"{results_dir}: no results.csv (run python -m matrix +matrix=field_bugs first)")
    df = pd.read_csv(path, keep_default_na=False, dtype=str)
    df = df[df["impl"].str.startswith(PREFIX)].copy()
    if df.empty:
        raise ValueError(f"{path}: no row of the catalog ({PREFIX}*)")
    df["bug"] = df["impl"].str[len(PREFIX):]
    return df.reset_index(drop=True)


def plan_of(row) -> CPPlan:
    """The plan a row ran, rebuilt from its columns by its engine's rules, for its model (the
    default engine's where the engine has no such split: the row is the engine's refusal)."""
    rules = engines.get(row["engine"] or engines.DEFAULT, row.get("engine_model") or engines.DEFAULT_MODEL)
    if rules.strategy_refusal(row["policy"]):
        rules = engines.get(engines.DEFAULT, rules.model)
    align = int(row["align"]) if rules.pads_batch and row["align"] else None
    return rules.plan(json.loads(row["seq_lens"]), int(row["cp_size"]), policy=row["policy"],
                      page_size=int(row["effective_page_size"] or 1), align=align)


def refused(row) -> bool:
    """Whether the row's point is one its engine does not run with CP (every row of it ``skipped``
    with the engine's reason): nothing ran there, nothing to judge."""
    return row["status"] == "skipped" and row["reason"].startswith("engine=")


def expected(bug: str, plan: CPPlan) -> tuple[str, ...]:
    """The statuses a row of ``bug`` may have on ``plan``."""
    if bug == TWIN or not BY_NAME[bug].shows(plan):
        return ("ok",)
    return ("error",) if BY_NAME[bug].check == RAISED else BAD


def wrong(df: pd.DataFrame) -> list[str]:
    """Each row not as the catalog expects, one line each."""
    out = []
    for _, row in df.iterrows():
        where = f"{row['bug']} cp={row['cp_size']} seq_lens={row['seq_lens']} ({row['plan_class']})"
        if row["bug"] not in BY_NAME and row["bug"] != TWIN:
            out.append(f"{where}: not in the catalog")
            continue
        if refused(row):
            continue
        want = expected(row["bug"], plan_of(row))
        if row["status"] not in want:
            out.append(f"{where}: {row['status']}, expected {' or '.join(want)}: {row['reason'][:REASON_CHARS]}")
        elif want != ("ok",):
            check = BY_NAME[row["bug"]].check
            named = row["failed_check"] == check if check != RAISED else "error:" in row["reason"]
            if not named:
                out.append(f"{where}: {row['status']} [{row['failed_check']}], expected the check {check}")
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(df: pd.DataFrame) -> str:
    """The doc: per bug, where its mechanism shows, what caught it there, the reason as the row gives it."""
    lines = ["# The CP bugs the engines shipped, caught", "",
             "Rendered by `python -m examples.field_bugs.table RESULTS_DIR --write docs/field_bugs.md` from",
             "`python -m matrix +matrix=field_bugs` (the implementations: `examples/field_bugs/bugs.py`, each a",
             "correct padded round trip, `twin`, broken as the tracker's bug broke its engine). A bug must be",
             "caught on every point where its mechanism shows and `ok` elsewhere; the twin `ok` everywhere.",
             "Points: the plan classes even, uneven by one, an empty rank, page-aligned uneven and the longest",
             "shard not first, at cp 2, 3 and 4 split by the seed fix (zigzag), at cp 3 by vLLM 0.33",
             "(DualChunkSwap of the raw lengths, its router logits gathered beside the rows) and at cp 2 by vLLM",
             "0.34 serving DeepSeek-V4 (whose router masks the padding rows it is told of); vLLM has no page-aligned split,",
             f"so its rows there are `skipped` ({int(df.apply(refused, axis=1).sum()) if len(df) else 0} rows).", "",
             "| bug | tracker | engine | mechanism | caught by | points caught / where it shows | ok elsewhere "
             "| the reason, as the row gives it |", "|---|---|---|---|---|---|---|---|"]
    ran = df[~df.apply(refused, axis=1)] if len(df) else df
    for bug in BUGS:
        rows = ran[ran["bug"].eq(bug.name)]
        shows = rows.apply(lambda r: bug.shows(plan_of(r)), axis=1) if len(rows) else pd.Series(dtype=bool)
        hit = rows[shows.astype(bool)] if len(rows) else rows
        miss = rows[~shows.astype(bool)] if len(rows) else rows
        caught = hit[hit["status"].isin(BAD)]
        example = caught.iloc[0] if len(caught) else None
        reason = "" if example is None else (
            f"cp={example['cp_size']} `seq_lens={example['seq_lens']}`: {example['status']}"
            + (f" [{example['failed_check']}]" if example["failed_check"] else "") + ": "
            + example["reason"][:REASON_CHARS] + ("..." if len(example["reason"]) > REASON_CHARS else ""))
        check = "an error raised in the round trip" if bug.check == RAISED else f"`{bug.check}`"
        lines.append(f"| `{bug.name}` | {bug.trackers} | {bug.engine} | {_cell(bug.mechanism)} | {check} | "
                     f"{len(caught)} / {len(hit)} | {int(miss['status'].eq('ok').sum())} / {len(miss)} | "
                     f"{_cell(reason)} |")
    twin = ran[ran["bug"].eq(TWIN)]
    lines += ["", f"The twin (`examples.field_bugs.bugs:twin`): `ok` on {int(twin['status'].eq('ok').sum())} of "
              f"{len(twin)} points."]
    if NOT_YET:
        lines += ["", "## Filed, not caught by this preset", "", "| tracker | mechanism | where it stands |",
                  "|---|---|---|", *(f"| {t} | {_cell(m)} | {_cell(why)} |" for t, m, why in NOT_YET)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.field_bugs.table", description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--write", type=Path, default=None, help="write the doc here (else print it)")
    args = ap.parse_args(argv)
    try:
        df = load(args.results_dir)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    doc = render(df)
    if args.write is not None:
        args.write.write_text(doc)
    else:
        print(doc, end="")
    bad = wrong(df)
    for line in bad:
        print(f"not as the catalog expects: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
