"""One matrix point: config -> plan, checks and timings on real ranks -> rows.

Everything a results row says is assembled here. A point never raises for
what happens on its ranks: an exception, a dead rank or a hang becomes rows
with that status, and the sweep goes on.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import shlex
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from nsa_cp_comm import impls as impl_registry
from nsa_cp_comm.alternatives import A2A_IMPLS  # SCATTERED-only; the other impls are FULL-mode
from nsa_cp_comm.machine import device_name, nccl_version
from nsa_cp_comm.measure import ImplResult, PointSpec, run_point
from nsa_cp_comm.modes import ScatterMode, mlp_mode
from nsa_cp_comm.ranks import get_pool, one_line_error

from .config import KEYS, ConfigError, override_value, validate_point
from .results import COLUMNS, CONFIG_COLUMNS, append_rows, check_schema, completed_point_ids, results_path

REPO = Path(__file__).resolve().parent.parent
COLUMN_SET = frozenset(COLUMNS)


@dataclass(frozen=True)
class Resolved:
    """What ``auto`` and the derived keys mean for one point on this machine."""

    policy: str
    mode: str
    backend: str
    device: str
    impls: tuple[str, ...]
    align: int
    skip: str  # non-empty: the point is skipped, for this reason


def resolve(cfg: Mapping[str, Any], *, gpus: int | None = None) -> Resolved:
    """Resolve ``auto`` values; raise ConfigError for a point this machine cannot run.

    ``gpus``: GPUs the point's ranks can use, one per rank (default: this
    machine's; matrix.torchrun_point passes the whole allocation's)."""
    cp = cfg["cp_size"]
    if gpus is None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device, backend = cfg["device"], cfg["backend"]
    if backend == "nccl" and gpus < cp:
        raise ConfigError(f"backend=nccl with cp_size={cp} needs {cp} GPUs, this machine has {gpus}")
    if device == "cuda" and gpus == 0:
        raise ConfigError("device=cuda but no CUDA device is available")
    if device == "auto":
        device = "cuda" if backend == "nccl" or (backend == "auto" and gpus >= cp) else "cpu"
    if backend == "auto":
        # NCCL needs one GPU per rank; several ranks on one GPU go through gloo.
        backend = "nccl" if device == "cuda" and gpus >= cp else "gloo"

    policy = "zigzag_page" if cfg["shared_kv"] else cfg["split"]
    derived = mlp_mode(cfg["moe_a2a_backend"]).value
    mode = derived if cfg["mlp_mode"] == "auto" else cfg["mlp_mode"]

    impl = cfg["impl"]
    if impl == "both":
        impls: tuple[str, ...] = ("padded", "legacy")
    elif impl == "all":
        impls = tuple(
            n for n in impl_registry.REGISTRY if (n in A2A_IMPLS) == (mode == ScatterMode.SCATTERED.value)
        )
        if mode == ScatterMode.SCATTERED.value:
            impls = ("padded", "legacy", *impls)
    else:
        impls = (impl,)

    skip = ""
    if mode != derived:
        skip = (
            f"mlp_mode={mode} contradicts moe_a2a_backend={cfg['moe_a2a_backend']}, "
            f"which needs {derived}"
        )
    elif not cfg["shared_kv"] and cfg["page_size"] != 1:
        skip = f"page_size={cfg['page_size']} has no effect with shared_kv=false (same point as page_size=1)"
    elif cfg["shared_kv"] and cfg["split"] != "zigzag":
        skip = f"split={cfg['split']} has no effect with shared_kv=true (the split is zigzag_page)"
    align = cfg["align"] if cfg["align"] is not None else cp
    return Resolved(policy, mode, backend, device, impls, align, skip)


def point_id(cfg: Mapping[str, Any]) -> str:
    """Stable id of a point's requested configuration (for resume)."""
    key = {k: cfg[k] for k in CONFIG_COLUMNS if k in cfg}
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def repro_command(cfg: Mapping[str, Any]) -> str:
    """The command line that reruns exactly this point (every key explicit)."""
    parts = ["python", "-m", "matrix"]
    parts += [f"{k}={override_value(cfg[k])}" for k in KEYS if k not in ("resume", "fault") or cfg[k] not in (False, "none")]
    return shlex.join(parts)


@functools.lru_cache(maxsize=1)
def environment() -> dict[str, str]:
    """Versions and host, computed once per process."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        sha = f"{sha}-dirty" if sha and dirty else sha
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return {"torch_version": torch.__version__, "nccl_version": nccl_version(), "host": platform.node(), "git_sha": sha}


def build_rows(
    cfg: Mapping[str, Any], res: Resolved, results: list[ImplResult], spec: PointSpec | None, overrides: str, wall_s: float
) -> list[dict[str, Any]]:
    """The results rows of one point (shared with matrix.torchrun_point)."""
    plan = spec.plan() if spec is not None else None
    base: dict[str, Any] = {k: cfg[k] for k in KEYS}
    base.update(
        seq_lens=override_value(cfg["seq_lens"]),
        align=res.align,
        mlp_mode=res.mode,
        backend=res.backend,
        device=res.device,
        num_experts=spec.experts if spec else cfg["num_experts"],
        policy=res.policy,
        point_id=point_id(cfg),
        overrides=overrides,
        repro=repro_command(cfg),
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        wall_s=round(wall_s, 3),
        device_name=device_name(res.device),
        **environment(),
    )
    if plan is not None:
        base.update(
            total_tokens=plan.total_tokens,
            max_rank_len=plan.max_rank_len,
            padded_total=plan.padded_total,
            padding_frac=plan.padding_frac,
            is_even=plan.is_even,
            claim_holds=plan.claim_holds,
        )
    rows = []
    for r in results:
        row = dict(base)
        row.update(
            impl=r.impl,
            status=r.status,
            reason=r.reason,
            correct=r.correct,
            max_rel_err=r.max_rel_err,
            even_bitwise_equal=r.even_bitwise_equal,
            rows_moved=r.rows_moved,
            bytes_padded=r.bytes_padded,
            bytes_useful=r.bytes_useful,
            algbw_padded_GBps=r.algbw_padded_GBps,
            busbw_padded_GBps=r.busbw_padded_GBps,
            algbw_useful_GBps=r.algbw_useful_GBps,
            busbw_useful_GBps=r.busbw_useful_GBps,
        )
        for phase, st in r.stats.items():
            for stat, value in st.items():
                col = f"{phase}_{stat}_us"
                if col in COLUMN_SET:
                    row[col] = value
        rows.append(row)
    return rows


def point_spec(cfg: Mapping[str, Any], res: Resolved) -> PointSpec:
    """What the ranks of a (validated, resolved) point run."""
    return PointSpec(
        seq_lens=tuple(cfg["seq_lens"]),
        cp_size=cfg["cp_size"],
        policy=res.policy,
        page_size=cfg["page_size"],
        align=cfg["align"],
        mode=res.mode,
        impls=res.impls,
        hidden_size=cfg["hidden_size"],
        dtype=cfg["dtype"],
        num_experts=cfg["num_experts"],
        topk=cfg["topk"],
        warmup=cfg["warmup"],
        iters=cfg["iters"],
        seed=cfg["seed"],
        flush_l2=cfg["flush_l2"],
        fault=cfg["fault"],
    )


def run(cfg: Mapping[str, Any], *, job_dir: str | Path, overrides: str = "") -> list[dict[str, Any]] | None:
    """Run one point and append its rows to ``<results_dir>/results.csv``.

    Returns the rows, or None when ``resume`` found the point already done.
    Raises ConfigError (before anything is written) for an invalid config."""
    validate_point(cfg)
    res = resolve(cfg)
    results_dir = cfg["results_dir"]
    check_schema(results_path(results_dir))
    if cfg["resume"] and point_id(cfg) in completed_point_ids(results_dir):
        return None
    t0 = time.perf_counter()
    spec = point_spec(cfg, res)
    if res.skip:
        results = [ImplResult(name, "skipped", reason=res.skip) for name in res.impls]
    else:
        try:
            pool = get_pool(cfg["cp_size"], backend=res.backend, device=res.device, workdir=job_dir)
        except Exception as exc:  # noqa: BLE001 - a point's failure is a row
            results = [ImplResult(name, "error", reason=str(exc)) for name in res.impls]
        else:
            try:
                results = run_point(spec, pool, timeout_s=cfg["timeout_s"])
            except Exception as exc:  # noqa: BLE001 - a point's failure is a row
                pool.close(graceful=False)
                results = [ImplResult(name, "error", reason=one_line_error(exc)) for name in res.impls]
    rows = build_rows(cfg, res, results, spec, overrides, time.perf_counter() - t0)
    append_rows(results_dir, rows)
    return rows
