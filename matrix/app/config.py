"""The matrix's configuration: one typed schema with its defaults, validated once.

:class:`MatrixConfig` is the only place a default lives (Hydra's structured
config ``schema``; presets in conf/ override it). :func:`validate` is the one
validation of a point, used by the CLI's preflight on every point of a sweep
before anything starts, and by the point itself (a job on a cluster node);
:func:`validate_value` is its per-key part, also applied to each value of a
command line before Hydra composes anything, so a bad value reads as one line
instead of Hydra's traceback. Both raise :class:`ConfigError`, whose message is
one line naming the key and the value. matrix.app.resolve.resolve then turns a valid
config into the frozen spec the ranks run.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from nsa_cp_comm.harness import calibrate
from nsa_cp_comm.harness.significance import MIN_SAMPLES as MIN_FLAGGABLE
from nsa_cp_comm.harness.spec import MAX_SEED
from nsa_cp_comm.modes import QUANT_GROUP, quant_refusal

from ..store.results import COLUMN_VALUES


class ConfigError(ValueError):
    """A configuration value the matrix cannot run; the message is one line."""


@dataclass
class MatrixConfig:
    """One matrix point (each key's meaning: :data:`MEANING`). Sweep any key with Hydra's multirun (``-m key=a,b``)."""

    cp_size: int = 2
    page_size: int = 1
    seq_lens: list[int] = field(default_factory=lambda: [1000])
    shared_kv: bool = False
    split: str = "zigzag"
    align: Optional[int] = None
    moe_a2a_backend: str = "none"
    mlp_mode: str = "auto"
    impl: str = "both"
    backend: str = "auto"
    device: str = "auto"
    bystanders: int = 0
    hidden_size: int = 7168
    dtype: str = "bfloat16"
    num_experts: Optional[int] = None
    topk: int = 2
    # replicated: as serving code places DeepSeek-V3.2's shared expert at the production shape
    shared_expert: str = "replicated"
    warmup: int = 5
    iters: Any = 20
    seed: int = 0
    flush_l2: bool = False
    timeout_s: float = 120.0
    startup_timeout_s: Optional[float] = None  # null: matrix.app.budget.startup_timeout_s
    results_dir: str = "results/${now:%Y%m%d-%H%M%S}"
    resume: bool = False
    force: bool = False
    allow_skipped: bool = False
    # expanded by matrix.scale.workload.expand_argv; recorded in each row, not in the point's identity
    workload: Optional[Any] = None
    engine: str = "seed_fix"
    engine_model: str = "deepseek_v32"
    # true: a point whose engine refuses CUDA graphs is skipped with its reason; false: eager
    graphs: Any = "auto"
    max_capture_size: Optional[int] = None
    # fp8_block_monolithic: besides what MEANING says, no router masks padding
    moe_quant: str = "none"


KEYS: tuple[str, ...] = tuple(f.name for f in fields(MatrixConfig))

IMPL_KEYWORDS: tuple[str, ...] = ("both", "all", "designs")

# The values a row's column holds (matrix.store.results.COLUMN_VALUES), and "auto" where the key
# resolves to one of them.
RESOLVED: tuple[str, ...] = ("mlp_mode", "backend", "device")
CHOICES: dict[str, tuple[str, ...]] = {k: (("auto",) if k in RESOLVED else ()) + v for k, v in COLUMN_VALUES.items()}
# Every int key's range: far beyond any real point, but not past what the
# machine can represent or start (machine-dependent bounds: matrix.app.budget).
INT_RANGES: dict[str, tuple[int, int]] = {
    "cp_size": (1, 1024),
    "bystanders": (0, 1024),
    "page_size": (1, 1 << 20),
    "hidden_size": (1, 1 << 16),
    "topk": (1, 1024),
    "iters": (1, 100_000),
    "warmup": (0, 100_000),
    "seed": (0, MAX_SEED),
    "align": (1, 1 << 24),
    "num_experts": (1, 1 << 16),
    "max_capture_size": (1, 1 << 20),
}
OPTIONAL_INTS = ("align", "num_experts", "max_capture_size")
SEQ_LEN_MAX = 1 << 24  # tokens in one request
TOTAL_TOKENS_MAX = 1 << 26  # tokens in one batch
# Requests in one batch: every check of a sweep parses seq_lens in time linear in
# its length (install_linear_lists), so this bounds how long the checks take.
SEQ_LENS_MAX_ENTRIES = 1 << 16
# Requests x cp_size: a plan holds a block table per request with 2*cp lengths,
# and a point is planned several times before it runs (the estimate, the dry
# run's listing); 65,530 requests at cp_size=1024 took 72 s and 2.4 GB before
# the machine's refusal of 1024 ranks. Refused first, before any planning.
PLAN_BLOCKS_MAX = 1 << 21
TIMEOUT_MAX_S = 7 * 24 * 3600.0
# A point with iters=auto: room for its timed loop's hard cap and the checks before the loop.
AUTO_TIMEOUT_MIN_S = 2 * calibrate.EXTENDED_CAP_S
BOOLS = ("shared_kv", "flush_l2", "resume", "force", "allow_skipped")

# What each key means, one line each (--help; its range or choices come from the tables above):
# beside the schema, so a new key is written in this file and reaches the help from here.
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

# Config groups and Hydra's own keys that may appear on the command line.
GROUPS = ("matrix", "layout", "workload", "plan_class", "conformance_cp", "field_bugs_at", "engine")


def _is_int(v: object) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _fail(key: str, value: object, why: str) -> ConfigError:
    return ConfigError(f"{key}={override_value(value)}: {why}")


def override_value(value: object) -> str:
    """``value`` as a Hydra override writes it (``[1000,300]``, ``true``,
    ``null``): for error messages and for rows' repro commands."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, str) and (value == "" or any(c in value for c in _HYDRA_SPECIAL)):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)


# Characters that end or change an unquoted Hydra value.
_HYDRA_SPECIAL = " ,[]{}()=:'\"\\$%*?@|<>#~^`&;!"


def validate_value(key: str, value: Any) -> None:
    """Check one key's value on its own; raise ConfigError (one line)."""
    if key not in KEYS:
        raise ConfigError(f"unknown key {key!r}; valid keys: {', '.join(KEYS)}")
    if key in CHOICES:
        if value not in CHOICES[key]:
            raise _fail(key, value, f"must be one of {', '.join(CHOICES[key])}")
    elif key in INT_RANGES:
        lo, hi = INT_RANGES[key]
        if (key in OPTIONAL_INTS and value is None) or (key == "iters" and calibrate.is_auto(value)):
            return
        if not _is_int(value) or not lo <= value <= hi:
            other = " or null" if key in OPTIONAL_INTS else f" or {calibrate.AUTO}" if key == "iters" else ""
            raise _fail(key, value, f"must be an integer in [{lo}, {hi}]{other}")
    elif key == "graphs":
        if value != "auto" and not isinstance(value, bool):
            raise _fail(key, value, "must be auto, true or false")
    elif key == "impl":
        _check_impl(value)
    elif key == "workload":
        _check_workload(value)
    elif key in BOOLS:
        if not isinstance(value, bool):
            raise _fail(key, value, "must be true or false")
    elif key in ("timeout_s", "startup_timeout_s"):
        if key == "startup_timeout_s" and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= TIMEOUT_MAX_S:
            raise _fail(key, value, f"must be a number of seconds in (0, {TIMEOUT_MAX_S:g}]"
                        + (" or null" if key == "startup_timeout_s" else ""))
    elif key == "seq_lens":
        if not isinstance(value, (list, tuple)) or not value:
            raise _fail(key, value, "must be a non-empty list of positive integers, e.g. [1000,300]")
        _check_entries(len(value))
        for i, v in enumerate(value):
            if not _is_int(v) or not 1 <= v <= SEQ_LEN_MAX:
                raise ConfigError(f"seq_lens[{i}]={override_value(v)}: must be an integer in [1, {SEQ_LEN_MAX}]")
        if sum(value) > TOTAL_TOKENS_MAX:
            raise _fail(key, value, f"sums to {sum(value)} tokens, more than {TOTAL_TOKENS_MAX} in one batch")
    elif key == "results_dir":
        if not isinstance(value, str) or not value:
            raise _fail(key, value, "must be a directory path")
        if "\n" in value or "\r" in value:
            # a row keeps one line, so its results_dir cell could not name this path
            raise ConfigError(f"results_dir={value!r}: must not contain a line break")
        if "${" in value:
            # Hydra's job directories interpolate results_dir, and read this as a reference
            raise _fail(key, value, "must not contain '${' (Hydra would read it as an interpolation)")
        check_writable(value)


def check_writable(path_value: str, key: str = "results_dir") -> None:
    """A directory the run will create and write must be creatable and
    writable: found now, in one line, not as a traceback after a sweep."""
    path = Path(path_value)
    try:
        too_long = [part for part in path.parts if len(part.encode(errors="replace")) > 255]
        if too_long:
            raise _fail(key, path_value, f"a name in the path is {len(too_long[0])} characters, over the 255 a file system allows")
        probe = path
        while not probe.exists() and probe.parent != probe:
            probe = probe.parent
        ok = probe.exists() and probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)
        if ok and probe != path and Path("/proc") in (probe, *probe.parents):
            ok = False  # /proc and /sys say writable, and refuse every mkdir
    except OSError as exc:
        raise _fail(key, path_value, f"cannot be used: {exc.strerror or exc}") from None
    if probe.exists():
        if not ok:
            raise _fail(key, path_value, f"{probe} is not a writable directory")
        # Permission bits are not the answer everywhere (/sys says writable to
        # root and refuses every mkdir, as does a read-only mount): make a
        # directory where the run will make its own, and take it away again.
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".nsa-cp-probe-", dir=probe))
        except OSError as exc:
            raise _fail(key, path_value, f"no directory can be created in {probe}: "
                        f"{exc.strerror or exc}") from None


def _check_entries(n: int) -> None:
    if n > SEQ_LENS_MAX_ENTRIES:
        raise ConfigError(f"seq_lens=[...]: {n} entries, more than the {SEQ_LENS_MAX_ENTRIES} requests one batch may hold")


def _check_list_lengths(overrides: list[str]) -> None:
    """Refuse an over-long seq_lens from its text, before any parser reads it."""
    for arg in overrides:
        key, _, text = arg.partition("=")
        if key.lstrip("+~") != "seq_lens":
            continue
        for body in re.findall(r"\[([^\]]*)\]", text) or [text]:
            _check_entries(body.count(",") + 1)


# The most points one sweep may hold: each is composed and checked before the first runs (about
# 15 ms each on a CPU core), and a product of a few ranges is soon past anything that can run.
MAX_POINTS = 100_000


def sweep_count(ov: Any) -> int:
    """How many values an override gives its key (1 unless it sweeps), without
    listing them: ``range(0, 10**9)`` would be a billion values before any check."""
    from hydra.core.override_parser.types import RangeSweep

    if not ov.is_sweep_override():
        return 1
    value = ov.value()
    if isinstance(value, RangeSweep) and value.step:
        return max(0, math.ceil((value.stop - value.start) / value.step))
    return len(list(ov.sweep_string_iterator()))


def check_point_count(parsed: list[Any]) -> None:
    """ConfigError (one line) for parsed overrides whose sweeps make more than
    :data:`MAX_POINTS` points (a later override of a key replaces an earlier one)."""
    counts = {ov.get_key_element(): sweep_count(ov) for ov in parsed}
    total = math.prod(counts.values())
    if total > MAX_POINTS:
        swept = " x ".join(f"{k} {n}" for k, n in counts.items() if n > 1)
        raise ConfigError(f"the sweep has {total} points ({swept}), over the {MAX_POINTS} one sweep may hold: split it "
                          "into smaller sweeps (each into the same results_dir)")


def validate_overrides(overrides: list[str]) -> None:
    """Check every ``key=value`` (and each value of ``key=a,b`` sweeps) of a
    Hydra command line before Hydra composes anything."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep
    from hydra.errors import HydraException

    _check_list_lengths(overrides)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = (" (quote a value with spaces or non-ASCII characters: key='value')"
                if any(not a.isascii() or " " in a.split("=", 1)[-1] for a in overrides) else "")
        raise ConfigError(f"cannot parse overrides: {first}{hint}") from None
    check_point_count([ov for ov in parsed if not ov.is_delete() and not ov.key_or_group.startswith("hydra")])
    for ov in parsed:
        key = ov.key_or_group
        if ov.is_delete() and key in KEYS:
            raise ConfigError(f"~{key}: a key of the schema cannot be deleted; set it instead ({key}=VALUE)")
        if key in ("hydra.sweep.dir", "hydra.run.dir") and not ov.is_sweep_override():
            check_writable(str(ov.value()), key)
            continue
        if key in GROUPS and not ov.is_delete():
            for v in (list(ov.value().list) if isinstance(ov.value(), ChoiceSweep) else [ov.value()]):
                if key == "engine":  # a group whose choices are the engines: checked here
                    validate_value(key, v)
                elif ".." in str(v).replace("\\", "/").split("/"):
                    # Hydra resolves it against the group's folder: +layout=../matrix/smoke composes a preset
                    raise ConfigError(f"{key}={v}: a {key} is named by its file in conf/{key}/, not by a path out "
                                      "of that folder (which composes another group's config)")
            continue
        if key.startswith("hydra") or key in GROUPS or ov.is_delete():
            continue
        if key not in KEYS:
            raise ConfigError(f"unknown key {key!r}; valid keys: {', '.join(KEYS)}")
        value = ov.value()
        if isinstance(value, ChoiceSweep):
            values = list(value.list)
        elif isinstance(value, RangeSweep):
            values = list(ov.sweep_iterator())
        elif ov.is_sweep_override():
            continue  # interval/glob sweeps: checked per point
        else:
            values = [value]
        for v in values:
            validate_value(key, v)


def _check_workload(value: object) -> None:
    if value is None:
        return
    from ..scale.workload import MATRIX_BATCHES_MAX, WorkloadError, from_mapping, load

    try:
        if isinstance(value, Mapping):  # the composed group: conf/workload/NAME.yaml's mapping
            from_mapping(value, batches_max=MATRIX_BATCHES_MAX)
        elif isinstance(value, str) and value:
            load(value, batches_max=MATRIX_BATCHES_MAX)
        else:
            raise _fail("workload", value, "must be the name of a workload in conf/workload or null")
    except WorkloadError as exc:
        raise ConfigError(str(exc)) from None


def _check_impl(value: object) -> None:
    """``impl``: a keyword, a registered name, or package.module:attribute
    (imported here, so a bad reference is one line before any rank starts)."""
    from nsa_cp_comm import impls, plugins
    from nsa_cp_comm.origins import is_reference

    if not isinstance(value, str) or not value:
        raise _fail("impl", value, "must be both, all, an implementation name or package.module:attribute")
    if value == "all" or (value not in IMPL_KEYWORDS and not is_reference(value) and value not in impls.REGISTRY):
        try:
            impls.discover()  # an installed plugin that cannot load: one line naming its entry point
        except plugins.ImplError as exc:
            raise ConfigError(str(exc)) from None
    if value in IMPL_KEYWORDS:
        return
    try:
        impls.get(value)
    except ValueError as exc:
        if is_reference(value):
            raise ConfigError(str(exc)) from None
        names = ", ".join((*IMPL_KEYWORDS, *impls.REGISTRY))
        raise _fail("impl", value, f"must be one of {names}, or package.module:attribute") from None


def validate(cfg: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> None:
    """Check one point: every value, then the relations between keys;
    ``environ``: the environment its job will run in (default: this process's)."""
    missing = [k for k in KEYS if k not in cfg]
    if missing:
        raise ConfigError(f"config lacks key(s) {', '.join(missing)}")
    for key in KEYS:
        validate_value(key, cfg[key])
    cp = cfg["cp_size"]
    if len(cfg["seq_lens"]) * cp > PLAN_BLOCKS_MAX:
        raise ConfigError(f"seq_lens=[...]: {len(cfg['seq_lens'])} requests at cp_size={cp} make "
                          f"{len(cfg['seq_lens']) * cp} request-rank blocks to plan, more than {PLAN_BLOCKS_MAX} "
                          "(fewer requests, or a smaller cp_size)")
    if cfg["align"] is not None and cfg["align"] % cp:
        raise _fail("align", cfg["align"], f"must be a multiple of cp_size={cp}")
    experts = cfg["num_experts"] if cfg["num_experts"] is not None else 2 * cp
    if experts % cp:
        raise _fail("num_experts", experts, f"must be a multiple of cp_size={cp} (experts are split evenly)")
    if cfg["topk"] > experts:
        raise _fail("topk", cfg["topk"], f"must be at most num_experts={experts}")
    if cfg["backend"] == "nccl" and cfg["device"] == "cpu":
        raise _fail("backend", "nccl", "needs device=cuda (NCCL has no CPU tensors)")
    if quant_refusal(cfg["hidden_size"], cfg["moe_quant"]):  # the library's rule; said here as the key's line
        raise _fail("hidden_size", cfg["hidden_size"], f"must be a multiple of {QUANT_GROUP} with "
                    f"moe_quant={cfg['moe_quant']} (a row quantizes in groups of {QUANT_GROUP} columns)")
    if calibrate.is_auto(cfg["iters"]):
        try:
            calibrate.time_cap(os.environ if environ is None else environ)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if cfg["timeout_s"] < AUTO_TIMEOUT_MIN_S:
            raise _fail("timeout_s", cfg["timeout_s"], f"must be at least {AUTO_TIMEOUT_MIN_S:g} with iters=auto "
                        f"(its timed loop runs up to {calibrate.EXTENDED_CAP_S:g} s, and the checks before it take time "
                        "too)")
    if cfg["align"] is not None and sum(cfg["seq_lens"]) + cfg["align"] > TOTAL_TOKENS_MAX:
        raise _fail("align", cfg["align"], f"pads the batch past {TOTAL_TOKENS_MAX} tokens")


def register() -> None:
    ConfigStore.instance().store(name="schema", node=MatrixConfig)
    register_resolvers()


# --- cluster launchers: resolvers of conf/hydra/launcher/slurm.yaml ---
# A launcher such as submitit submits a whole sweep as one job array with one
# resource request, resolved from the sweep's primary config (which holds the
# schema defaults, not the swept values): these resolvers read the sweep.


def _sweep_overrides(root: Any) -> list[Any]:
    """The sweep's overrides, parsed: the preset's ``hydra.sweeper.params``,
    then the command line (later ones win, as in Hydra's basic sweeper)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    hydra = root.get("hydra") if hasattr(root, "get") else None
    lines: list[str] = []
    if hydra is not None:
        params = hydra.sweeper.get("params") if "sweeper" in hydra else None
        lines += [f"{k}={v}" for k, v in (params or {}).items()]
        lines += list(hydra.overrides.task) if "overrides" in hydra else []
    return OverridesParser.create().parse_overrides(lines)


def sweep_values(root: Any, key: str) -> list[Any]:
    """Every value ``key`` takes in the sweep (command line over the preset's
    ``hydra.sweeper.params``, as Hydra's basic sweeper does), else its value."""
    last = next((ov for ov in reversed(_sweep_overrides(root))
                 if ov.key_or_group.lstrip("+~") == key and not ov.is_delete()), None)
    if last is None:
        return [root[key]]
    return list(last.sweep_iterator()) if last.is_sweep_override() else [last.value()]


def _group_cp_sizes(root: Any) -> list[int]:
    """The cp sizes that swept config groups set (e.g. the conformance
    preset's ``+conformance_cp``): each chosen option's file read for its
    ``cp_size``; one resolved per point on the node (the largest the node
    starts) counts as :data:`~.plan_classes.LARGEST_CP`."""
    from omegaconf import OmegaConf

    from .. import CONF_DIR
    from ..scale.plan_classes import LARGEST_CP

    sizes: list[int] = []
    seen: set[str] = set()
    for ov in reversed(_sweep_overrides(root)):
        group = ov.key_or_group.lstrip("+~")
        if group in seen or ov.is_delete() or not (CONF_DIR / group).is_dir():
            continue
        seen.add(group)
        for option in (ov.sweep_iterator() if ov.is_sweep_override() else [ov.value()]):
            path = CONF_DIR / group / f"{option}.yaml"
            if not path.is_file():
                continue
            node = OmegaConf.load(path)
            if "cp_size" in node:
                value = OmegaConf.to_container(node, resolve=False)["cp_size"]
                sizes.append(value if isinstance(value, int) else LARGEST_CP)
    return sizes


def _sweep_world(*, _root_: Any) -> int:
    """The largest world a point of the sweep starts: cp_size (swept, or set
    by a swept config group) plus bystanders, one device per rank."""
    cps = [*map(int, sweep_values(_root_, "cp_size")), *_group_cp_sizes(_root_)]
    return max(cps) + max(int(b or 0) for b in sweep_values(_root_, "bystanders"))


def _sweep_max(key: str, *, _root_: Any) -> Any:
    return max(sweep_values(_root_, key))


def job_minutes(timeout_s: float) -> int:
    """A cluster job's time limit for a point of ``timeout_s``: the point, plus
    10 minutes for the interpreter and the ranks to start (and some slack)."""
    return math.ceil(float(timeout_s) / 60) + 10


# Hydra's records of one command (multirun.yaml, each job's .hydra folder) go to
# a folder of its own under results_dir/hydra: two sweeps into one results_dir
# (a resume, a second sweep) keep each other's records.
_RUN_FOLDER = f"{datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}"


def run_folder() -> str:
    """This process's folder name under ``<results_dir>/hydra`` (its start and pid)."""
    return _RUN_FOLDER


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    from ..scale.plan_classes import RESOLVERS as PLAN_CLASS_RESOLVERS

    own = {"matrix.sweep_max": _sweep_max, "matrix.sweep_world": _sweep_world, "matrix.run_folder": run_folder,
           "matrix.job_minutes": job_minutes}
    for name, resolver in {**own, **PLAN_CLASS_RESOLVERS}.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


# Registered on import: a launcher's job (e.g. a SLURM node) imports this
# module through matrix.app.point before anything resolves the config.
register_resolvers()
# --- end cluster launchers ---


def _visit_list_container(self: Any, ctx: Any) -> list[Any]:
    return [self.visitElement(element) for element in ctx.element()]


def install_linear_lists() -> None:
    """Hydra's override parser reads a list in time linear in its length.

    Its visitor fetches list element ``i`` with ``ctx.element(i)``, which walks
    the list's children from the start each time: a ``seq_lens`` of 16,000
    entries took over a minute, and it is parsed several times per sweep (the
    checks, every composition, Hydra's own launch). This replaces that one
    method with one that takes every element in a single walk; the values it
    returns are the same."""
    from hydra.core.override_parser.overrides_visitor import HydraOverrideVisitor

    HydraOverrideVisitor.visitListContainer = _visit_list_container


# Lists parse in linear time, in the checks and in every Hydra job alike.
install_linear_lists()
