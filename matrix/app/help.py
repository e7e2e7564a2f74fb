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
from .config import BOOLS, CHOICES, INT_RANGES, MEANING, OPTIONAL_INTS, TIMEOUT_MAX_S, MatrixConfig, override_value

HELP_FLAGS = ("--help", "-h")

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
