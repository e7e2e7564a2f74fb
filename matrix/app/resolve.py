"""A valid config resolved for a machine: the one resolution of a point.

:func:`resolve` says what ``auto`` and the derived keys mean on a machine
with so many GPUs (backend, device, split policy, page size, mode, the
implementations ``impl`` names) and builds the frozen spec the ranks run.
Preflight resolves every point of a sweep once; the budget
(matrix.app.budget) estimates from the result, the dry run prints it and the point
(matrix.app.point) runs it. This module imports neither of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from nsa_cp_comm import engines
from nsa_cp_comm import impls as impl_registry
from nsa_cp_comm.harness.machine import gpus as machine_gpus
from nsa_cp_comm.harness.spec import PointSpec
from nsa_cp_comm.modes import ScatterMode, mlp_mode
from nsa_cp_comm.plan import CPPlan

from .config import ConfigError


@dataclass(frozen=True)
class Resolved:
    """A valid config resolved for a machine: what ``auto`` and the derived
    keys mean, and the frozen spec the ranks run."""

    policy: str
    mode: str
    backend: str
    device: str
    impls: tuple[str, ...]
    align: int
    page_size: int  # the page size the plan uses (1 unless zigzag_page)
    skip: str  # non-empty: the point is skipped, for this reason
    spec: PointSpec
    force: bool = False  # force=true: the machine checks (matrix.app.budget) leave the point out

    def plan(self) -> CPPlan:
        return self.spec.plan()


def impls_for(impl: str, mode: str) -> tuple[str, ...]:
    """The implementations ``impl`` names at a point of ``mode``: ``both`` is the
    fix and the old path, plus the MoE all-to-all at SCATTERED points (where
    the communicator passes rows through); ``designs`` is the fix beside
    pad-at-split; ``all`` adds every registered one."""
    scattered = mode == ScatterMode.SCATTERED.value
    if impl == "both":
        return ("padded", "legacy", "a2a") if scattered else ("padded", "legacy")
    if impl == "designs":  # the serving engine's two answers to uneven shards, on the same plan
        return ("padded", "pad_at_split", "a2a") if scattered else ("padded", "pad_at_split")
    if impl == "all":
        own = impl_registry.all_of_mode(mode)
        return (*[n for n in ("padded", "legacy") if n not in own], *own) if scattered else own
    return (impl,)


def resolve(cfg: Mapping[str, Any], *, gpus: int | None = None) -> Resolved:
    """Resolve a validated config; raise ConfigError for a point this machine cannot run.

    ``gpus``: GPUs the point's ranks can use, one per rank (default: this
    machine's; matrix.torchrun_point passes the whole allocation's)."""
    cp = cfg["cp_size"]
    gpus = machine_gpus()[0] if gpus is None else gpus
    device, backend = cfg["device"], cfg["backend"]
    world = cp + cfg.get("bystanders", 0)  # every rank of the world holds a GPU
    if backend == "nccl" and gpus < world:
        extra = f" bystanders={world - cp}" if world > cp else ""
        raise ConfigError(f"backend=nccl with cp_size={cp}{extra} needs {world} GPUs, this machine has {gpus}")
    if device == "cuda" and gpus == 0:
        raise ConfigError("device=cuda but no CUDA device is available")
    if device == "auto":
        device = "cuda" if backend == "nccl" or (backend == "auto" and gpus >= world) else "cpu"
    if backend == "auto":
        # NCCL needs one GPU per rank; several ranks on one GPU go through gloo.
        backend = "nccl" if device == "cuda" and gpus >= world else "gloo"

    policy = "zigzag_page" if cfg["shared_kv"] else cfg["split"]
    derived = mlp_mode(cfg["moe_a2a_backend"]).value
    mode = derived if cfg["mlp_mode"] == "auto" else cfg["mlp_mode"]
    impls = impls_for(cfg["impl"], mode)
    skip = (f"mlp_mode={mode} contradicts moe_a2a_backend={cfg['moe_a2a_backend']}, which needs {derived}"
            if mode != derived else "")
    page = cfg["page_size"] if policy == "zigzag_page" else 1
    align = cfg["align"] if cfg["align"] is not None else cp
    model = cfg.get("engine_model", engines.DEFAULT_MODEL)
    quant = cfg.get("moe_quant", "none")
    engine = engines.get(cfg.get("engine", engines.DEFAULT), model, quant)
    # A strategy or batch the engine does not run with CP: a skipped point with
    # the engine's reason. Without the strategy there is no split of the
    # engine's to describe: the row's plan columns are the default engine's.
    skip = skip or engine.refusal(cfg["seq_lens"], cp, policy, cfg["align"])
    planner = (engine if not engine.strategy_refusal(policy, cfg["align"])
               else engines.get(engines.DEFAULT, model, quant))
    # a quantization whose MoE path the engine's module does not model: skipped with that reason
    skip = skip or planner.quant_refusal
    # graphs=auto: where the engine runs this model's CP prefill in CUDA graphs (its default);
    # graphs=true where it refuses them: the engine would not start, the point is skipped
    capture, why = planner.graphs(cfg.get("graphs", "auto"), cfg.get("max_capture_size"))
    skip = skip or why
    try:
        resolved = dict(
            seq_lens=tuple(cfg["seq_lens"]), cp_size=cp, policy=policy, page_size=page, align=cfg["align"],
            mode=mode, impls=impls, engine=planner.name, shared_expert=cfg.get("shared_expert", "none"),
            engine_model=model, max_capture_size=capture, moe_quant=quant)
        # every other field of the spec is the key of its name as given: a new key reaches the ranks so
        spec = PointSpec(**resolved, **{f.name: cfg[f.name] for f in fields(PointSpec) if f.name not in resolved})
    except ValueError as exc:  # validate() checks the same relations; this is the library's guard
        raise ConfigError(str(exc)) from None
    return Resolved(policy, mode, backend, device, impls, align, page, skip, spec, bool(cfg.get("force", False)))


def resolve_remote(cfg: Mapping[str, Any]) -> Resolved:
    """A config resolved for a node not seen from here (a remote launcher's):
    a GPU per rank where the config asks for CUDA or NCCL, else none (its
    buffers then count as host memory: the budget's cautious side)."""
    wants_gpus = cfg["backend"] == "nccl" or cfg["device"] == "cuda"
    return resolve(cfg, gpus=cfg["cp_size"] + cfg.get("bystanders", 0) if wants_gpus else 0)
