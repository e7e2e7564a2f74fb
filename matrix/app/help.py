"""``nsa-cp-matrix --help`` (``python -m matrix --help`` in a checkout): the app's own help, generated from the schema.

Every key with its default, its range or choices and what it means; the
presets and layouts found in conf/ with the first line of their comment; the
``+matrix=NAME`` form. Built from :class:`matrix.app.config.MatrixConfig` and the
validation tables, so it cannot disagree with what the app accepts. Hydra's
own help stays at ``--hydra-help``.
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from nsa_cp_comm.harness import calibrate

from .. import CONF_DIR, command, console
from .config import (
    BOOLS, CHOICES, INT_RANGES, OPTIONAL_INTS, SEQ_LEN_MAX, TIMEOUT_MAX_S, TOTAL_TOKENS_MAX, MatrixConfig,
    override_value,
)
from nsa_cp_comm.harness.significance import MIN_SAMPLES as MIN_FLAGGABLE

HELP_FLAGS = ("--help", "-h")

# What each key means: one line each (ranges and choices come from validation).
MEANING: dict[str, str] = {
    "cp_size": "CP ranks (one process each)",
    "page_size": "KV page size of the page-aligned split (shared_kv=true only)",
    "seq_lens": "request extend lengths of the batch, e.g. '[1001,300]' (each in [1, "
                f"{SEQ_LEN_MAX}], at most {TOTAL_TOKENS_MAX} in all)",
    "shared_kv": "true: page-aligned split zigzag_page; false: the split below",
    "split": "split policy when shared_kv=false",
    "align": "pad the batch to a multiple of this (a multiple of cp_size); null: cp_size",
    "moe_a2a_backend": "none: all-gather MoE path (FULL); deepep: all-to-all path (SCATTERED)",
    "mlp_mode": "auto derives it from moe_a2a_backend; a contradicting explicit mode gives a skipped row",
    "impl": "both (padded, legacy, + a2a at SCATTERED points), designs (padded, pad_at_split), all, "
            "one registered name, or package.module:attribute",
    "backend": "auto: NCCL with one GPU per rank where cp_size GPUs exist, else gloo",
    "device": "auto follows backend",
    "bystanders": "world ranks outside the CP group (CP inside TP/DP); the CP group is in reverse world order",
    "hidden_size": "hidden size H of the rows gathered",
    "dtype": "dtype of the hidden states",
    "num_experts": "experts of the reference MoE (a multiple of cp_size); null: two per rank",
    "topk": "experts per token (at most num_experts)",
    "shared_expert": "the reference MoE's shared expert: none; sharded (each rank a share of its units, summed by "
                     "the reduce-scatter); replicated (whole on every rank, added once after the reduce-scatter)",
    "warmup": "untimed iterations before the timed ones",
    "iters": (f"timed iterations (fewer than {MIN_FLAGGABLE}: compare can flag nothing), or auto: until each "
              f"implementation's median round trip over the A/A control's is known within "
              f"{calibrate.CI_WIDTH:.0%} (95% interval), at least {calibrate.MIN_ITERS}, at most "
              f"{calibrate.MAX_ITERS} or {calibrate.TIME_CAP_S:g} s ({calibrate.EXTENDED_CAP_S:g} s while compare's "
              "test lacks the power to flag 1.3x)"),
    "seed": "data seed; each rank's rows come from (seed, rank)",
    "flush_l2": "evict caches between iterations",
    "timeout_s": "per point, once its ranks are up",
    "startup_timeout_s": "for a point's ranks to start (a timed-out start is retried once); null: ten times the "
                         "estimate for its world, scaled by the machine's load",
    "results_dir": "where results.csv and samples.jsonl go; ${now:...} is taken once per sweep",
    "resume": "rerun only points without a row or whose rows are error/timeout",
    "force": "run a sweep preflight estimates beyond this machine (ranks, memory, time)",
    "allow_skipped": "exit 0 although an outside implementation ran nothing ok, or no uneven plan ok, at a cp "
                     "of the sweep (listed after the summary either way)",
    "workload": "a config group, workload=NAME: sweep seq_lens over the workload's K seeded batches",
    "engine": "a config group, engine=NAME: the serving engine whose split and padding rules the plans follow",
    "engine_model": "the model the engine serves: whether its router masks padding rows, whether the engine runs "
                    "its CP prefill in CUDA graphs, what it gathers beside the hidden states",
    "graphs": "auto | true | false: CUDA graphs for the CP prefill (auto: where the engine runs them for the model; "
              "the padded length is then the capture bucket that holds the longest rank)",
    "max_capture_size": "the largest CUDA-graph capture size, past which the step runs eager; null: the engine's",
    "moe_quant": "none | fp8_block | fp8_block_monolithic: the experts' activation quantization (block fp8 on a "
                 "modular or a monolithic kernel); where the engine quantizes before the gather (vLLM 0.34, "
                 "monolithic) it gathers the fp8 rows and their scales in place of the rows",
}


def _allowed(key: str) -> str:
    if key in CHOICES:
        return " | ".join(CHOICES[key])
    if key in INT_RANGES:
        lo, hi = INT_RANGES[key]
        other = " or null" if key in OPTIONAL_INTS else f" or {calibrate.AUTO}" if key == "iters" else ""
        return f"int in [{lo}, {hi}]{other}"
    if key in BOOLS:
        return "true | false"
    if key in ("timeout_s", "startup_timeout_s"):
        return f"seconds in (0, {TIMEOUT_MAX_S:g}]" + (" or null" if key == "startup_timeout_s" else "")
    return ""


def _comment(path: Path) -> str:
    """The first sentence of a conf file's first comment (Hydra's package line
    left out), whole even when it runs over several lines."""
    words: list[str] = []
    for line in path.read_text().splitlines():
        text = line.strip()
        if not text.startswith("#") or "@package" in text:
            if words:
                break
            continue
        words.extend(text.lstrip("#").split())
        sentence = " ".join(words)
        if re.search(r"[.!?](\s|$)", sentence):
            return re.split(r"(?<=[.!?])\s", sentence, maxsplit=1)[0]
    return " ".join(words)


def _group(name: str) -> list[str]:
    plus = "" if name in ("workload", "engine") else "+"  # in the defaults list: set, not added
    return [f"  {plus}{name}={p.stem:<16} {_comment(p)}" for p in sorted((CONF_DIR / name).glob("*.yaml"))]


# The config groups help lists, each under its heading.
LISTED_GROUPS: tuple[tuple[str, str], ...] = (
    ("matrix", "presets (sweeps; run without -m):"),
    ("layout", "layouts (split settings; sweep several with -m +layout=a,b):"),
    ("plan_class",
     "plan classes (seq_lens and split giving a plan of that class at the point's cp; -m +plan_class=a,b):"),
    ("workload", "workloads (request lengths drawn or read; each batch a point):"),
    ("engine", "engines (whose split and padding rules the plans follow; sweep with -m engine=a,b):"),
)


def text() -> str:
    defaults = MatrixConfig()
    width = max(len(f.name) for f in fields(MatrixConfig))
    keys = []
    for f in fields(MatrixConfig):
        allowed = _allowed(f.name)
        keys.append(f"  {f.name:<{width}}  {MEANING.get(f.name, '')}")
        keys.append(f"  {'':<{width}}  default {override_value(getattr(defaults, f.name))}"
                    + (f"; {allowed}" if allowed else ""))
    app, cli = " ".join(command()), console()
    # The installed command throughout; the module form, which a checkout
    # without the install runs, once.
    here = "" if app == "python -m matrix" else f"; this one runs as {app}"
    usage = [
        (f"{cli} [key=value ...]", "one point"),
        (f"{cli} -m key=a,b [key=value ...]", "a sweep: every combination of the swept keys"),
        (f"{cli} +matrix=NAME [key=value ...]", "a preset sweep (note the +: presets are added)"),
        (f"{cli} ... --dry-run", "list the points and the estimate; start nothing"),
    ]
    column = max(50, *(len(u) for u, _ in usage))
    return "\n".join([
        f"{cli}: check and time CP communicators on real torch.distributed ranks (a Hydra app)",
        f"(in a checkout without the install: python -m matrix, from the repository root{here})",
        "",
        "usage:",
        *(f"  {u:<{column}}  {what}" for u, what in usage),
        "",
        "Every value is checked before anything starts: one line naming the key and value, exit 2.",
        "Exit status: 0 every point wrote its rows and none is failed/error/timeout; 1 otherwise;",
        "5 nothing was checked (every row skipped); 2 bad input; 130 interrupted (the resume command is printed).",
        "",
        "keys:",
        *keys,
        "",
        *(line for name, heading in LISTED_GROUPS for line in (heading, *_group(name), "")),
        f"review: {console('report')} RESULTS_DIR; {console('compare')} BASE_DIR NEW_DIR",
        f"Hydra's own help: {cli} --hydra-help",
    ])
