"""Top-level functions the tests send to RankPool ranks (they must be importable
by the rank processes, which inherit the test process's sys.path).

Every task returns plain data (findings, messages, timings); the assertions
live in the test modules. Data is generated on the CPU from (seed, case, rank)
so every rank can rebuild every other rank's shard and the expected buffers
without communicating. :func:`folded` and :func:`by_impl`, on the test's
side, turn the ranks' findings of a point into its rows.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import threading
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from nsa_cp_comm import (
    CPLayerCommunicator,
    ReferenceMoE,
    ScatterMode,
    legacy_gather,
    legacy_scatter,
    mlp_mode,
    padded_buffer,
    padded_gather,
    padded_gather_,
    padded_scatter,
    plan_split,
)
from nsa_cp_comm.moe import max_rel_err, tolerance
from nsa_cp_comm.harness.rank_body import announce, rank_device

# torch's NCCL text for mismatched all-gather sizes (docs/design.md, section 3), spelled out here
# rather than taken from the library, so a changed text fails the tests.
TORCH_UNEVEN_TEXT = "output tensor size must be equal to world_size times input tensor size"

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().cpu().view(torch.uint8)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def make_plan(case: dict):
    return plan_split(case["seq_lens"], case["cp"], policy=case["policy"], page_size=case.get("page", 1),
                      align=case.get("align"))


def shard(case: dict, plan, rank: int, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s [n_r, H] hidden states (CPU)."""
    g = torch.Generator().manual_seed(case["seed"] * 1009 + rank * 31 + salt * 7)
    x = torch.randn(plan.per_rank_tokens[rank], case["H"], generator=g)
    return x.to(DTYPES[case["dtype"]])


def int_partial(case: dict, plan, rank: int) -> torch.Tensor:
    """Rank ``rank``'s [m*cp, H] integer-valued partials: any summation order is exact."""
    g = torch.Generator().manual_seed(case["seed"] * 7919 + rank)
    x = torch.randint(-8, 9, (plan.padded_total, case["H"]), generator=g).to(torch.float32)
    return x.to(DTYPES[case["dtype"]])


def expected_gather(case: dict, plan) -> torch.Tensor:
    m = plan.max_rank_len
    out = torch.zeros(plan.padded_total, case["H"], dtype=DTYPES[case["dtype"]])
    for r in range(plan.cp_size):
        out[r * m : r * m + plan.per_rank_tokens[r]] = shard(case, plan, r)
    return out


def _legacy_refusal(call) -> tuple[str, float]:
    t0 = time.perf_counter()
    try:
        call()
    except ValueError as exc:
        return str(exc), time.perf_counter() - t0
    return "", time.perf_counter() - t0


def raised(call) -> str:
    """``"Type: message"`` of what ``call()`` raised, ``""`` if nothing."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return f"{type(exc).__name__}: {exc}"
    return ""


def roundtrip_cases(cases: list[dict]) -> list[dict]:
    """For each case: padded gather (plain and zero-copy) byte-exact, exact
    integer reduce-scatter, MoE round trip vs the single-process reference,
    communicator FULL/SCATTERED, and legacy: bitwise equal on even plans,
    refusing on uneven ones. Returns one findings dict per case."""
    rank = dist.get_rank()
    device = rank_device()
    findings = []
    for i, case in enumerate(cases):
        plan = make_plan(case)
        dtype = DTYPES[case["dtype"]]
        fails: list[str] = []
        n, m, cp = plan.per_rank_tokens[rank], plan.max_rank_len, plan.cp_size
        local = shard(case, plan, rank).to(device)
        local_copy = local.clone()
        expect = expected_gather(case, plan)

        # 1. gather, byte-exact (rank blocks then zero padding).
        full = padded_gather(local, plan)
        if not same_bytes(full, expect):
            fails.append(f"padded_gather differs (shape {tuple(full.shape)} vs {tuple(expect.shape)})")
        if full.device != device:
            fails.append(f"padded_gather result on {full.device}, not {device}")
        if not same_bytes(local, local_copy):
            fails.append("padded_gather modified its input")

        # 1b. zero-copy form: write into the slot, gather in place.
        buf, slot = padded_buffer(plan, case["H"], dtype=dtype, device=device)
        if tuple(slot.shape) != (n, case["H"]) or tuple(buf.shape) != (plan.padded_total, case["H"]):
            fails.append(f"padded_buffer shapes {tuple(buf.shape)}/{tuple(slot.shape)}")
        elif n and slot.data_ptr() != buf[rank * m].data_ptr():
            fails.append("padded_buffer slot is not a view of row block rank*m")
        slot.copy_(local)
        got = padded_gather_(buf, plan)
        if got is not buf:
            fails.append("padded_gather_ did not return its buffer")
        if not same_bytes(buf, expect):
            fails.append("padded_gather_ (zero-copy) differs")

        # 2. reduce-scatter of integer partials: exact in any order.
        part = int_partial(case, plan, rank).to(device)
        want = sum(int_partial(case, plan, q).to(torch.float32) for q in range(cp))[rank * m : rank * m + n]
        got = padded_scatter(part.clone(), plan)
        if not same_bytes(got, want.to(dtype)):
            fails.append(f"padded_scatter of integer partials differs (shape {tuple(got.shape)}, want ({n}, H))")

        # 3. MoE round trip vs the reference, through the communicator.
        moe = ReferenceMoE(case["H"], num_experts=2 * cp, topk=2, seed=case["seed"], dtype=dtype, device=device)
        comm = CPLayerCommunicator(plan, mlp_mode("none"))
        moe_in = comm.prepare_mlp(local)
        if not same_bytes(moe_in, expect):
            fails.append("communicator FULL gather differs")
        partial = moe.partial(moe_in, rank, cp)
        out = comm.postprocess(partial.clone())
        ref = moe.reference(local)
        err = max_rel_err(out, ref) if out.shape == ref.shape else float("inf")
        tol = tolerance(dtype, cp)
        if not err <= tol:
            fails.append(f"MoE round trip max_rel_err {err:.3g} > {tol:.3g} (out {tuple(out.shape)})")
        direct = padded_scatter(partial.clone(), plan)
        if not same_bytes(direct, out):
            fails.append("communicator FULL scatter differs from padded_scatter")

        # 4. SCATTERED (DeepEP-style) and "CP not in use": rows pass through.
        for label, c in (("deepep", CPLayerCommunicator(plan, mlp_mode("deepep"))),
                         ("plan=None", CPLayerCommunicator(None, ScatterMode.FULL))):
            if c.prepare_mlp(local) is not local or c.postprocess(partial) is not partial:
                fails.append(f"{label}: communicator moved rows")

        # 5. legacy: bitwise equal on even plans, refuses on uneven ones.
        legacy = {"even": plan.is_even}
        lcomm = CPLayerCommunicator(plan, ScatterMode.FULL, impl="legacy")
        if plan.is_even:
            lg = legacy_gather(local, plan)
            lo = legacy_scatter(partial.clone(), plan)
            if full.shape[0] != plan.total_tokens:
                fails.append(f"even plan: padded gather allocated {full.shape[0]} rows, T={plan.total_tokens}")
            if not (same_bytes(lg, full) and same_bytes(lo, direct)):
                fails.append("even plan: legacy and padded results differ")
            if not same_bytes(lcomm.postprocess(moe.partial(lcomm.prepare_mlp(local), rank, cp)), out):
                fails.append("even plan: legacy communicator differs from padded")
        else:
            calls = {
                "legacy_gather": lambda: legacy_gather(local, plan),
                "legacy_scatter": lambda: legacy_scatter(
                    torch.zeros(plan.total_tokens, case["H"], dtype=dtype, device=device), plan),
                "communicator": lambda: lcomm.prepare_mlp(local),
            }
            for name, call in calls.items():
                msg, took = _legacy_refusal(call)
                legacy[name] = (msg, took)
                if not msg.startswith(TORCH_UNEVEN_TEXT) or took > 2.0:
                    fails.append(f"uneven plan: {name} gave {msg!r} after {took:.2f}s")
        findings.append({"case": i, "rank": rank, "n": n, "max_rel_err": err, "failures": fails, "legacy": legacy})
    # All ranks ran the same number of collectives and are still in step.
    done = torch.tensor([float(len(findings))], device=device)
    dist.all_reduce(done)
    if int(done.item()) != len(cases) * dist.get_world_size():
        findings.append({"case": -1, "rank": rank, "failures": [f"ranks out of step: {done.item()}"]})
    return findings


def legacy_uneven_caught(case: dict) -> dict:
    """Every rank calls legacy_gather and legacy_scatter on an uneven plan;
    report the messages and how long each took."""
    plan = make_plan(case)
    device = rank_device()
    local = shard(case, plan, dist.get_rank()).to(device)
    g = _legacy_refusal(lambda: legacy_gather(local, plan))
    s = _legacy_refusal(lambda: legacy_scatter(torch.zeros(plan.padded_total, case["H"], device=device), plan))
    return {"gather": g, "scatter": s}


def legacy_uneven_uncaught(case: dict) -> None:
    plan = make_plan(case)
    legacy_gather(shard(case, plan, dist.get_rank()).to(rank_device()), plan)


def padded_roundtrip_sum(case: dict) -> float:
    """A padded round trip whose result depends on every rank: the sum of
    all ranks' shards (gathered), exactly reduced back."""
    plan = make_plan(case)
    rank = dist.get_rank()
    full = padded_gather(shard(case, plan, rank).to(rank_device()), plan)
    out = padded_scatter(full.clone(), plan)
    want = (full.to(torch.float32) * plan.cp_size)[rank * plan.max_rank_len :][: plan.per_rank_tokens[rank]]
    return float((out.to(torch.float32) - want).abs().max().item()) if out.numel() else 0.0


def validation_messages(cp: int) -> dict:
    """Bad inputs of the round trips, raised on every rank.
    Returns ``{label: "Type: message"}`` (``""`` if nothing was raised)."""
    rank = dist.get_rank()
    device = rank_device()
    uneven = plan_split([10] if cp > 1 else [3], cp, policy="zigzag_page", page_size=64)
    even = plan_split([8 * cp], cp, policy="round_robin")
    other = plan_split([8], cp + 1, policy="round_robin")
    H = 16
    n_e, n_u = even.per_rank_tokens[rank], uneven.per_rank_tokens[rank]
    calls = {
        "padded_gather_rows": lambda: padded_gather(torch.zeros(n_u + 1, H, device=device), uneven),
        "padded_gather_1d": lambda: padded_gather(torch.zeros(n_u, device=device), uneven),
        "padded_gather_group": lambda: padded_gather(torch.zeros(other.per_rank_tokens[0], H, device=device), other),
        "padded_scatter_rows": lambda: padded_scatter(torch.zeros(uneven.total_tokens + 1, H, device=device), uneven),
        "padded_scatter_group": lambda: padded_scatter(torch.zeros(other.padded_total, H, device=device), other),
        "padded_gather__rows": lambda: padded_gather_(torch.zeros(uneven.padded_total + 1, H, device=device), uneven),
        "padded_buffer_group": lambda: padded_buffer(other, H, dtype=torch.float32, device=device),
        "legacy_gather_rows": lambda: legacy_gather(torch.zeros(n_e + 1, H, device=device), even),
        "legacy_scatter_rows": lambda: legacy_scatter(torch.zeros(even.total_tokens - 1, H, device=device), even),
        "legacy_gather_group": lambda: legacy_gather(torch.zeros(1, H, device=device), other),
        "legacy_gather_uneven": lambda: legacy_gather(torch.zeros(n_u, H, device=device), uneven),
        "legacy_scatter_uneven": lambda: legacy_scatter(torch.zeros(uneven.total_tokens, H, device=device), uneven),
        "communicator_impl": lambda: CPLayerCommunicator(even, ScatterMode.FULL, impl="fast"),
    }
    out = {label: raised(call) for label, call in calls.items()}
    # Nobody entered a collective above: this one completes on every rank.
    t = torch.ones(1, device=device)
    dist.all_reduce(t)
    out["in_step"] = int(t.item())
    out["n_uneven"] = n_u
    return out


def warnings_of_roundtrip(case: dict) -> list[str]:
    """A padded and (when even) legacy round trip with every warning recorded."""
    plan = make_plan(case)
    rank = dist.get_rank()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        local = shard(case, plan, rank).to(rank_device())
        padded_scatter(padded_gather(local, plan).clone(), plan)
        buf, slot = padded_buffer(plan, case["H"], dtype=local.dtype, device=local.device)
        slot.copy_(local)
        padded_gather_(buf, plan)
        even = plan_split([4 * plan.cp_size], plan.cp_size, policy="round_robin")
        e_local = shard(case, even, rank).to(rank_device())
        legacy_scatter(legacy_gather(e_local, even).clone(), even)
    return [f"{w.category.__name__}: {w.message}" for w in caught
            if issubclass(w.category, (DeprecationWarning, FutureWarning))]


# -- RankPool behaviour ------------------------------------------------------

def whoami(tag: str, *, extra: int = 0) -> tuple:
    return (dist.get_rank(), dist.get_world_size(), tag, extra, os.getpid(), str(rank_device()))


def environment_variable(name: str) -> str | None:
    return os.environ.get(name)


def installed_packages_read() -> int:
    """Whether this rank holds the installed packages' table without having read it (1) or not (0)."""
    from nsa_cp_comm import plugins

    return plugins.installed_packages.cache_info().currsize


def cpus() -> list[int]:
    """The CPUs this rank may run on."""
    return sorted(os.sched_getaffinity(0))


def parent_pid(pid: int) -> int:
    """A live process's parent (read in the test process, not a rank task)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def raise_on_last_others_in_collective() -> int:
    if dist.get_rank() == dist.get_world_size() - 1:
        time.sleep(0.2)
        raise KeyError("injected failure")
    t = torch.ones(1)
    dist.all_reduce(t)
    return dist.get_rank()


def hang_on_one_and_stop_the_last() -> int:
    """Rank 1 hangs (sleeps), the last rank stops itself (SIGSTOP) and rank 0
    waits in an all-reduce that neither joins."""
    if dist.get_rank() == 1:
        while True:
            time.sleep(3600)
    if dist.get_rank() == dist.get_world_size() - 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    t = torch.ones(1)
    dist.all_reduce(t)  # blocks: the other ranks never join
    return dist.get_rank()


def exit_on_last(code: int) -> int:
    if dist.get_rank() == dist.get_world_size() - 1:
        time.sleep(0.1)
        os._exit(code)
    return dist.get_rank()


def leave_rank_changed(*hows: str, helper_s: int = 987653) -> None:
    """Change this rank the way a careless plug-in would, and return: each of
    ``hows`` on every rank, or as ``"how@R"`` on rank R only. ``start_helper``
    leaves a ``sleep helper_s`` process running."""
    rank = dist.get_rank()
    for item in hows:
        how, _, only = item.partition("@")
        if only and int(only) != rank:
            continue
        if how == "destroy_group":
            dist.destroy_process_group()
        elif how == "default_dtype":
            torch.set_default_dtype(torch.float64)
        elif how == "default_device":
            torch.set_default_device("meta")
        elif how == "start_helper":
            subprocess.Popen(["sleep", str(helper_s)])
        elif how == "interop_threads":
            torch.set_num_interop_threads(torch.get_num_interop_threads() + 3)  # once per process: no way back
        else:
            raise ValueError(f"how={how!r}")


def _wrapped(fn, name: str):
    """A wrapper of ``fn`` that lies where it can: an all-reduce applied twice,
    a world one larger (a check that calls what it checks would be fooled)."""
    def wrapped(*args, **kwargs):
        out = fn(*args, **kwargs)
        if name == "all_reduce":
            fn(*args, **kwargs)
        return out + 1 if name == "get_world_size" else out

    return wrapped


def _wrap_in_place(owner, name: str):
    """``owner.name`` (its own, not inherited) replaced by its :func:`_wrapped`; returns the undo."""
    saved = vars(owner)[name]
    setattr(owner, name, _wrapped(getattr(owner, name), name))
    return lambda: setattr(owner, name, saved)


def _state_change(how: str):
    """Apply one change of a rank's recorded state; returns its undo."""
    from torch.distributed import distributed_c10d

    if how.startswith("wrap:"):  # wrap:<where>.<name>, where: dist, c10d or ProcessGroup
        where, _, name = how.removeprefix("wrap:").partition(".")
        return _wrap_in_place({"dist": dist, "c10d": distributed_c10d, "ProcessGroup": dist.ProcessGroup}[where], name)
    determinism = torch._C._set_deterministic_algorithms
    threads, precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    priority, cpus = os.getpriority(os.PRIO_PROCESS, 0), os.sched_getaffinity(0)
    # one CPU; a rank already bound to one moves to the next
    one_cpu = {min(cpus)} if len(cpus) > 1 else {(min(cpus) + 1) % (os.cpu_count() or 1)}
    toggles = {  # how: (change, undo)
        "intra_threads": (lambda: torch.set_num_threads(threads + 1), lambda: torch.set_num_threads(threads)),
        "grad_mode": (lambda: torch.set_grad_enabled(False), lambda: torch.set_grad_enabled(True)),
        # the flags torch.use_deterministic_algorithms sets, without the seconds it
        # spends importing inductor's config on its first call
        "deterministic": (lambda: determinism(True), lambda: determinism(False)),
        "deterministic_warn_only": (lambda: determinism(False, warn_only=True), lambda: determinism(False)),
        "flush_denormal": (lambda: torch.set_flush_denormal(True), lambda: torch.set_flush_denormal(False)),
        "default_dtype": (lambda: torch.set_default_dtype(torch.float64),
                          lambda: torch.set_default_dtype(torch.float32)),
        "default_device": (lambda: torch.set_default_device("meta"), lambda: torch.set_default_device(None)),
        "matmul_precision": (lambda: torch.set_float32_matmul_precision("medium" if precision != "medium" else "high"),
                             lambda: torch.set_float32_matmul_precision(precision)),
        "nice": (lambda: os.nice(1), lambda: os.setpriority(os.PRIO_PROCESS, 0, priority)),
        "affinity": (lambda: os.sched_setaffinity(0, one_cpu), lambda: os.sched_setaffinity(0, cpus)),
        "env": (lambda: os.environ.update(NSA_CP_AUTO_MAX_S="0.5"), lambda: os.environ.pop("NSA_CP_AUTO_MAX_S")),
    }
    if how in toggles:
        change, undo = toggles[how]
        change()
        return undo
    if how.startswith("backend:"):  # backend:cudnn.benchmark, backend:cuda.matmul.allow_tf32
        *path, name = how.removeprefix("backend:").split(".")
        owner = torch.backends
        for part in path:
            owner = getattr(owner, part)
        saved = getattr(owner, name)
        setattr(owner, name, not saved)
        return lambda: setattr(owner, name, saved)
    if how.startswith("lib:"):  # lib:module.attribute, or lib:module.Class.method
        module_name, _, rest = how.removeprefix("lib:").rpartition(".")
        try:
            owner, name = importlib.import_module(module_name), rest
        except ModuleNotFoundError:  # module.Class.method
            module_name, _, cls = module_name.rpartition(".")
            owner, name = getattr(importlib.import_module(module_name), cls), rest
        return _wrap_in_place(owner, name)
    if how == "thread":
        stop = threading.Event()
        t = threading.Thread(target=stop.wait, name="spinner", daemon=True)
        t.start()
        return lambda: (stop.set(), t.join())
    if how.startswith("tensor:"):  # tensor:<method>, shadowed on torch.Tensor
        name = how.removeprefix("tensor:")
        setattr(torch.Tensor, name, _wrapped(getattr(torch.Tensor, name), name))
        return lambda: delattr(torch.Tensor, name)
    if how.startswith("torch:"):  # torch:<function>
        return _wrap_in_place(torch, how.removeprefix("torch:"))
    if how.startswith("code:"):  # code:<module>.<function>: its code object swapped, the function kept
        module_name, _, name = how.removeprefix("code:").rpartition(".")
        fn = getattr(importlib.import_module(module_name), name)
        saved = fn.__code__
        fn.__code__ = (lambda *a, **k: None).__code__.replace(co_name=name)
        return lambda: setattr(fn, "__code__", saved)
    if how in ("function_mode", "dispatch_mode"):  # a mode that passes every call through, entered
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode

        class Tracing(TorchFunctionMode if how == "function_mode" else TorchDispatchMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))

            __torch_dispatch__ = __torch_function__  # the same pass-through, as the dispatch mode's hook

        mode = Tracing()
        mode.__enter__()
        return lambda: mode.__exit__(None, None, None)
    raise ValueError(f"how={how!r}")


def state_changes_seen(how: str) -> tuple[str, str]:
    """``rank_state.changes()`` with one item of this rank's state changed,
    then again once it is undone (the pool stays usable)."""
    from nsa_cp_comm.harness.rank_state import changes

    undo = _state_change(how)
    try:
        seen = changes()
    finally:
        undo()
    return seen, changes()


def rand_after_point(spec, backend: str, noise: str) -> list[float]:
    """What torch's global RNG draws right after a point (point_on_rank) that
    followed ``noise``: draws, a fixed seed, or nothing."""
    from nsa_cp_comm.harness.measure import point_on_rank

    if noise == "draws":
        torch.rand(1000)
    elif noise == "seed":
        torch.manual_seed(1234)
    point_on_rank(spec, backend)
    return torch.rand(4).tolist()


def part_in_two_groups() -> int:
    """Rank 0 announces one place and waits in an all-reduce on a second group,
    the others another place and an all-reduce on the world: each waits in a
    collective its peers never enter (no mismatch check sees it)."""
    other = dist.new_group(list(range(dist.get_world_size())))
    t = torch.ones(1)
    if dist.get_rank() == 0:
        announce("place b")
        dist.all_reduce(t, group=other)
    else:
        announce("place a")
        dist.all_reduce(t)
    return dist.get_rank()


def slow_rank_then_join(seconds: float) -> int:
    """Rank 0 computes (sleeps) at its own place while the others wait in an
    all-reduce at the next one, then joins them: slow, not parted."""
    if dist.get_rank() == 0:
        announce("place a")
        time.sleep(seconds)
    announce("place b")
    t = torch.ones(1)
    dist.all_reduce(t)
    return int(t.item())


def daemonize_sleep(seconds: int) -> int:
    """Start ``sleep SECONDS`` as a daemon does: in a session of its own, its
    parent (a shell) gone at once, so it is nobody's child but a subreaper's."""
    subprocess.run(["sh", "-c", f"setsid sleep {seconds} </dev/null >/dev/null 2>&1 &"], check=True)
    return os.getpid()


def answered(results) -> list:
    """Each rank's answer; every rank of the two must have answered."""
    assert [r.status for r in results] == ["ok", "ok"], [(r.status, r.error) for r in results]
    return [r.value for r in results]


def by_impl(rows) -> dict:
    """A point's ``rows`` by their implementation."""
    return {r.impl: r for r in rows}


def folded(spec, results, k: int | None = None) -> dict:
    """The point's row of each implementation, by impl, from every rank's
    ``point_on_rank`` findings in ``results`` (the ``k``-th of each rank's
    answers where a task ran several points); every rank must have answered."""
    from nsa_cp_comm.harness.fold import fold_reports

    assert all(r.ok for r in results), [(r.status, r.error) for r in results]
    values = [r.value if k is None else r.value[k] for r in results]
    return by_impl(fold_reports(spec, spec.plan(), values))


def point_without_check(spec, backend: str, check: str = ""):
    """``point_on_rank`` with the check ``check`` turned off on this rank (its failures dropped):
    a broken checker, to show what the check alone catches."""
    from nsa_cp_comm.harness.measure import point_on_rank

    return without_check(point_on_rank, spec, backend, check)


def without_check(runner, spec, backend: str, check: str = "", *args):
    """``runner(spec, backend, *args)`` (a rank task: ``point_on_rank``, or one with a mutation)
    with the check ``check`` turned off on this rank: every failure it names is dropped."""
    from unittest import mock

    from nsa_cp_comm.harness import checks

    if not check:
        return runner(spec, backend, *args)
    fail = checks.ImplReport.fail

    def fail_but(self, name, message):
        if name != check:
            fail(self, name, message)

    with mock.patch.object(checks.ImplReport, "fail", fail_but):
        return runner(spec, backend, *args)
