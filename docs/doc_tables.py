"""The docs' tables that code defines, rendered from that code.

Each table has one home, the code that uses it; the docs quote it between
``<!-- tables:NAME -->`` and ``<!-- /tables -->``:

* ``statuses`` (docs/columns.md): a row's ``status``, its meaning
  (``matrix.review.report.STATUS_MEANING``), how readers class it
  (``matrix.store.results.GOOD_STATUSES`` / ``BAD_STATUSES``) and the sweep's exit
  code with it (``matrix.app.summary.exit_code``);
* ``columns`` (docs/columns.md): every column of ``results.csv``
  (``matrix.store.results.COLUMNS``, in the schema's groups) with its meaning: a
  config key's from ``matrix.app.config.MEANING`` (what ``--help`` prints), the
  others' from :data:`COLUMN_MEANING` below;
* ``checks`` (docs/design.md): every ``failed_check`` name and what passing it
  proves (``nsa_cp_comm.harness.checks.CHECKS``);
* ``verdict_tests`` (docs/design.md): every verdict with the test that breaks the
  thing checked and the one that breaks the checker (``tests/verdicts.py``);
* ``reliability_*`` (RELIABILITY.md): the bad inputs, faults and bounds the
  hardening tests run, from their home ``tests/reliability_table.py`` (``TABLES``).

tests/project/test_docs.py fails when a doc differs from the rendering, or when a
column has no meaning here.

    python docs/doc_tables.py          # rewrite the blocks in place
    python docs/doc_tables.py --check  # exit 1 naming each block out of date
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for _path in (REPO / "src", REPO, REPO / "tests"):  # the app runs from the repository root, not installed
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from matrix.app import config as app_config  # noqa: E402
from matrix.app import summary  # noqa: E402
from matrix.review import report  # noqa: E402
from matrix.scale import plan_classes  # noqa: E402
from matrix.store import results  # noqa: E402
from nsa_cp_comm.harness.checks import CHECKS  # noqa: E402
import reliability_table  # noqa: E402
import verdicts  # noqa: E402

DOCS = {"statuses": REPO / "docs" / "columns.md", "columns": REPO / "docs" / "columns.md",
        "checks": REPO / "docs" / "design.md", "verdict_tests": REPO / "docs" / "design.md",
        **dict.fromkeys(reliability_table.TABLES, REPO / "RELIABILITY.md")}
BLOCK = re.compile(r"(<!-- tables:(\w+) -->\n)(.*?)(<!-- /tables -->)", re.S)

# The schema's groups of columns, in file order: (tuple in matrix.store.results,
# heading, what the group's columns share).
GROUPS = (
    ("CONFIG_COLUMNS", "Configuration", "What was measured: the keys compare joins on (`--help` says the same)."),
    ("RUN_COLUMNS", "Run keys", "How it was run; they do not change the measurement."),
    ("PLAN_COLUMNS", "The plan", "The split, from the configuration alone."),
    ("CHECK_COLUMNS", "Checks", "The outcome and what the checks found."),
    ("TIMING_COLUMNS", "Timings, bytes and bandwidth",
     "Empty unless the row is `ok`. `PHASE_STAT_us` is a percentile (`p10`, `p50`, `p90`; `p99` for the round "
     "trip) or the mean over the timed iterations, in microseconds, each iteration the slowest rank's "
     "([design.md](design.md), section 7)."),
    ("PROVENANCE_COLUMNS", "Provenance", "Where, when and from what the row came; what is the same for a whole run is in `runs.jsonl` (below)."),
)

_PHASE = {
    "local": "the implementation's local work around the collectives (its production form's `stage`: for "
             "`padded`, the copy into the reused buffer and zeroing its padding)",
    "gather": "the gather collective (a dispatch implementation's `dispatch`)",
    "scatter": "the reduce-scatter collective (a dispatch implementation's `combine`)",
    "collective": "gather + scatter, per iteration",
    "roundtrip": "local + gather + scatter, per iteration",
}

def _timing_meanings() -> dict[str, str]:
    out = {}
    for col in results.TIMING_COLUMNS:
        m = re.fullmatch(r"(\w+?)_(p\d+|mean)_us", col)
        if m and m.group(1) in _PHASE:
            out[col] = _PHASE[m.group(1)]
    return out


# What every column that is not a config key means.
COLUMN_MEANING: dict[str, str] = {
    "policy": "the split policy the point ran: `zigzag_page` (shared KV), `zigzag`, `round_robin`, "
              "`dual_chunk_swap` (vLLM) or `contiguous` (vllm-ascend)",
    "effective_page_size": "the page size that shaped the split (1 without shared KV)",
    "effective_id": "hash of what the point measures; a second point with the same one in the same results is "
                    "`skipped`, naming the first",
    "total_tokens": "`T`: the batch's tokens the split divides (after padding to `align` where the engine pads the "
                    "batch: `seed_fix`; the raw total for the others)",
    "max_rank_len": "`m`: the most tokens any rank holds",
    "padded_total": "`m * cp`: the padded gather buffer's rows",
    "padding_frac": "`1 - T / (m * cp)`: the share of the padded buffer that is padding",
    "is_even": "every rank holds the same number of tokens",
    "plan_class": "the plan's classes, `+`-joined: " + ", ".join(f"`{c}`" for c in plan_classes.CLASSES)
                  + " ([plugins.md](plugins.md#plan-classes))",
    "claim_holds": "`m * cp == ceil_align(T, cp)`: the cp alignment alone would size the buffer "
                   "([design.md](design.md), section 2)",
    "status": "the row's outcome (table above); readers go by this column, never by `reason`",
    "reason": "why, in words: the failing check's message, the error, the skip",
    "failed_check": "the first check that failed ([design.md](design.md), section 6), empty otherwise",
    "correct": "every check passed on every rank",
    "max_rel_err": "the MoE round trip's largest relative error against the single-process reference",
    "even_bitwise_equal": "on an even plan: bytes equal to legacy's (empty on uneven plans, or for implementations "
                          "that do not claim it)",
    "roundtrip_iqr_us": "the round trip's p75 - p25 over the timed iterations (the row's spread)",
    "rows_moved": "rows in the gathered buffer (dispatch: rows sent, each token once per destination rank)",
    "bytes_padded": "bytes of those rows: `S`, what the collectives move",
    "bytes_useful": "bytes of the batch's `T` rows",
    "attn_pad_rows": "padding rows per layer in one rank's attention input (max over ranks; `pad_at_split` only)",
    "moe_pad_rows": "padding rows per layer in the gathered buffer every rank's MoE runs on",
    "attn_pad_masked_rows": "of `attn_pad_rows`, those the engine keeps out of attention's output (SGLang 0.5.23 "
                            "zeroes them, as vLLM 0.33 and vllm-ascend mask them: all; `seed_fix`: none, attention computes them)",
    "moe_pad_masked_rows": "of `moe_pad_rows`, those the engine's router keeps from the experts (vLLM's "
                           "DeepSeek-V4: the rows the implementation's `is_padding` marks, all where it has none; "
                           "DeepSeek-V3.2 and GLM-5 on vLLM, and every model on SGLang: none, the experts process "
                           "them)",
    "moe_pad_expert_max_rows": "the most padding rows of the gathered buffer one routed expert got (the checks' "
                               "MoE, routing as the engine's router does for its model: identical padding rows all "
                               "go to the same experts, whose load and statistics carry them; 0 where masked)",
    "graph_pad_rows": "of the gathered rows, those padded past the split's own length because the engine runs "
                      "the step in a CUDA-graph bucket (`graphs`; `pad_at_split` only)",
    "algbw_padded_GBps": "nccl-tests' algorithm bandwidth over the collective time: `2 * S / t`, `S` the padded "
                         "bytes (cp > 1 only)",
    "busbw_padded_GBps": "nccl-tests' bus bandwidth: `algbw * (cp - 1) / cp`, padded bytes",
    "algbw_useful_GBps": "`algbw` over the useful bytes",
    "busbw_useful_GBps": "`busbw` over the useful bytes",
    "impl_origin": ("where the implementation came from: built-in, or a plug-in's module and version (a plug-in "
                    "loaded by reference has `impl` the name it declares, unless that is a built-in's; the "
                    "reference is in `overrides` and `repro`)"),
    "device_name": "the GPU's name, or the CPU model",
    "timestamp": "when the row was written (UTC)",
    "wall_s": "the point's wall time, ranks' start included",
    "point_id": "hash of the requested configuration: what `resume=true` matches on",
    "overrides": "the point's command-line overrides",
    "repro": "the command that reruns the point into the same results directory, appending a row (where a rank "
             "raised, it prints "
             "that rank's traceback after the row)",
    "run_id": "the run (process) that wrote the row: its line in `runs.jsonl` holds the versions, host, git sha, machine and command",
    **_timing_meanings(),
}


def meaning(column: str) -> str:
    """A column's one line (a table cell: pipes escaped): a config key's from
    ``--help``, else ours."""
    text = COLUMN_MEANING.get(column, "")
    if column in results.CONFIG_COLUMNS or column in results.RUN_COLUMNS:
        text = app_config.MEANING.get(column) or text
    return text.replace("|", "\\|")


def undescribed() -> list[str]:
    """Columns without a meaning, and meanings of columns that do not exist."""
    missing = [c for c in results.COLUMNS if not meaning(c)]
    stale = [c for c in COLUMN_MEANING if c not in results.COLUMNS]
    return [f"{c}: no meaning in docs/doc_tables.py" for c in missing] + [f"{c}: not a column" for c in stale]


def _rows(columns: tuple[str, ...]) -> Iterator[str]:
    """One table row per run of consecutive columns that mean the same."""
    run: list[str] = []
    for col in (*columns, None):
        if run and (col is None or meaning(col) != meaning(run[0])):
            yield f"| {', '.join(f'`{c}`' for c in run)} | {meaning(run[0])} |"
            run = []
        if col is not None:
            run.append(col)


def columns_table() -> str:
    lines = []
    for name, heading, note in GROUPS:
        lines += ["", f"### {heading}", "", note, "", "| column | meaning |", "| --- | --- |"]
        lines += _rows(getattr(results, name))
    return "\n".join(lines[1:])


def _exit_with(status: str) -> str:
    mixed = summary.exit_code(Counter({"points": 2, "ok": 1, status: 1}))
    alone = summary.exit_code(Counter({"points": 1, status: 1}))
    return f"{mixed}" + (f" ({alone} when every row is `{status}`)" if alone != mixed else "")


def statuses_table() -> str:
    lines = ["| status | meaning | readers count it | sweep exit |", "| --- | --- | --- | --- |"]
    for s in results.STATUS_VALUES:
        kind = "good" if s in results.GOOD_STATUSES else "bad" if s in results.BAD_STATUSES else "neither"
        lines.append(f"| `{s}` | {report.STATUS_MEANING[s]} | {kind} | {_exit_with(s)} |")
    return "\n".join(lines)


def checks_table() -> str:
    lines = ["| `failed_check` | passing it proves |", "| --- | --- |"]
    lines += [f"| `{name}` | {what} |" for name, what in CHECKS.items()]
    return "\n".join(lines)


def verdict_tests_table() -> str:
    def cell(node: str) -> str:
        path, _, name = node.partition("::")
        return f"`{path.removeprefix('tests/')}::{name}`"

    lines = ["| verdict | the thing broken | the checker broken |", "| --- | --- | --- |"]
    lines += [f"| `{v}` | {cell(thing)} | {cell(checker)} |" for v, (thing, checker) in verdicts.VERDICTS.items()]
    return "\n".join(lines)


RENDER = {"statuses": statuses_table, "columns": columns_table, "checks": checks_table,
          "verdict_tests": verdict_tests_table, **reliability_table.TABLES}


def rendered(text: str) -> str:
    """``text`` with every table block rewritten from the code."""
    return BLOCK.sub(lambda m: m.group(1) + RENDER[m.group(2)]() + "\n" + m.group(4), text)


def out_of_date() -> list[str]:
    """``path: NAME`` of each block that differs from its rendering or is missing."""
    stale = []
    for name, path in DOCS.items():
        found = {m.group(2): m.group(3) for m in BLOCK.finditer(path.read_text())}
        if found.get(name) != RENDER[name]() + "\n":
            stale.append(f"{path.relative_to(REPO)}: {name}")
    return stale


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a block differs from its rendering")
    args = ap.parse_args(argv)
    if args.check:
        stale = out_of_date() + undescribed()
        for line in stale:
            print(f"out of date: {line} (python docs/doc_tables.py rewrites the blocks)", file=sys.stderr)
        return 1 if stale else 0
    for path in sorted(set(DOCS.values())):
        path.write_text(rendered(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
