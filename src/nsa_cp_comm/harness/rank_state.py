"""A warm rank's state after a point: what the next point on it relies on.

Ranks are reused across points, so a point that leaves a rank changed would
fail, or silently change, the next, unrelated point (a plug-in that wraps the
all-gather, or ``production.all_gather_into``, slows every later point on
those ranks: padded about 2.2x, and ``ok``). :func:`remember` records the
state a rank starts with. During a point, :class:`Watch` compares after each
implementation's steps, so the implementation after whose step a change was
first found gets the ``failed`` row (``failed_check`` ``rank_state``) and the
others are rerun on fresh ranks (:func:`.blame.state_change`); after every
point :func:`check_pool` asks each rank for its differences again, and a pool
with any is closed so the next point starts fresh ranks. The RNG is not
compared but reset (:func:`begin_point`).

What is compared (torch's settings, the functions the harness calls, and in
a full look the process a plug-in shares with the built-ins), why a full look
need not be complete, and what a look costs: docs/design.md, "Warm ranks",
and the ``rank_state`` check's text (:data:`.checks.CHECKS`).
"""

from __future__ import annotations

import contextlib
import operator
import os
from typing import Any

from .rank_result import summarize_failure

# torch.distributed functions the harness and the built-in implementations
# call (with :data:`nsa_cp_comm.collectives.COLLECTIVES`), looked up in both
# ``torch.distributed`` and ``distributed_c10d``: a plug-in may wrap either.
DIST_FUNCTIONS: tuple[str, ...] = (
    "get_rank", "get_world_size", "get_backend", "is_initialized", "new_group", "_new_group_with_tag",
    "destroy_process_group", "broadcast_object_list",
)
# A float32 denormal: multiplied by 1.0 it stays itself unless flush-denormal is on.
_DENORMAL = 1e-40
# (seed, rank) is mixed as the shard data's seed is (spec.shard_seed), then
# moved off that stream: a plug-in's torch.randn must not replay the inputs.
RNG_OFFSET = 1 << 62
# The rank :func:`begin_point` mixes in on a bystander (no CP group rank).
BYSTANDER_RANK = (1 << 20) - 1

_START: dict[str, Any] = {}
_START_FUNCTIONS: dict[str, Any] = {}
_LIBRARY: list[tuple[str, Any, str, Any]] = []
# torch's own namespaces, grouped per namespace for a fast look:
# ``(prefix, namespace, attributes, values)``; see :func:`_torch_places`.
_TORCH: list[tuple[str, Any, tuple[str, ...], tuple[Any, ...]]] = []
# ``(name, function, code)``: a Python function whose code object was swapped
# keeps its identity (``fn.__code__ = other.__code__``).
_CODES: list[tuple[str, Any, Any]] = []
# The process itself: what a plug-in can change that no torch getter shows.
_PROCESS: dict[str, Any] = {}
_THREADS: list[Any] = []  # the Python threads alive at start (objects: an ident is reused)
_TENSOR_OWN: list[int] = [0]  # how many attributes torch.Tensor itself defines at start
# The environment prefix whose variables the harness and the sweep read.
ENV_PREFIX = "NSA_"


def _settings() -> dict[str, Any]:
    """torch's global settings a point could change, compared by value."""
    import torch

    state = {
        "intra-op threads": torch.get_num_threads(),
        "inter-op threads": torch.get_num_interop_threads(),
        "grad mode": torch.is_grad_enabled(),
        "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic algorithms warn-only": torch.is_deterministic_algorithms_warn_only_enabled(),
        # no getter: probe it (explicit dtype and device, whatever the defaults now are)
        "flush-denormal": torch.full((1,), _DENORMAL, dtype=torch.float32, device="cpu").mul_(1.0).item() == 0.0,
        "default dtype": torch.get_default_dtype(),
    }
    get_device = getattr(torch, "get_default_device", None)
    if get_device is not None:
        state["default device"] = get_device()
    state["float32 matmul precision"] = torch.get_float32_matmul_precision()
    # readable in a CPU build too; a plug-in may set them whatever the device
    for name, read in _BACKEND_SWITCHES:
        with contextlib.suppress(AttributeError, RuntimeError):
            state[name] = read(torch.backends)
    return state


# torch.backends switches that change what a kernel computes or how fast.
_BACKEND_SWITCHES: tuple[tuple[str, Any], ...] = (
    ("cuda matmul allow_tf32", lambda b: b.cuda.matmul.allow_tf32),
    ("cuda matmul fp16 reduced-precision reduction", lambda b: b.cuda.matmul.allow_fp16_reduced_precision_reduction),
    ("cuda matmul bf16 reduced-precision reduction", lambda b: b.cuda.matmul.allow_bf16_reduced_precision_reduction),
    ("cudnn enabled", lambda b: b.cudnn.enabled),
    ("cudnn allow_tf32", lambda b: b.cudnn.allow_tf32),
    ("cudnn benchmark", lambda b: b.cudnn.benchmark),
    ("cudnn deterministic", lambda b: b.cudnn.deterministic),
    ("mkldnn enabled", lambda b: b.mkldnn.enabled),
)


def _functions() -> dict[str, Any]:
    """The torch.distributed functions the harness calls, compared by identity
    (``is``): its module functions, their ``distributed_c10d`` originals and
    the process group's methods they end in; and the clocks (:data:`CLOCKS`,
    and the harness's own, bound at import): a clock replaced would time every
    later point with it."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    from ..collectives import COLLECTIVES

    found: dict[str, Any] = {}
    for prefix, module in (("torch.distributed", dist), ("torch.distributed.distributed_c10d", distributed_c10d)):
        for name in (*COLLECTIVES, *DIST_FUNCTIONS):
            fn = getattr(module, name, None)
            if fn is not None:
                found[f"{prefix}.{name}"] = fn
    for name, fn in vars(dist.ProcessGroup).items():
        if callable(fn) and not name.startswith("__"):
            found[f"torch.distributed.ProcessGroup.{name}"] = fn
    # the clocks: the standard library's, and the harness's own (bound at its import)
    import time

    from . import calibrate, timing

    for name in CLOCKS:
        found[f"time.{name}"] = getattr(time, name)
    for module in (timing, calibrate):
        found[f"{module.__name__}._clock"] = module._clock
    return found


# The standard library's clocks a task could replace (timing reads its own, bound at import).
CLOCKS: tuple[str, ...] = ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns")


def _library_places() -> list[tuple[str, Any, str, Any]]:
    """``(name, namespace, attribute, value)`` for every function and class of
    this library's loaded modules and every method those classes define, as
    their module holds them (a module that imported ``all_gather_into`` holds
    its own name for it, which a wrapper can replace alone), and for the
    registry's built-in implementations; a namespace is the live ``vars()``
    of a module or class, or the registry itself. Walked once, at
    :func:`remember`: a look after every timed turn reads only these places."""
    import importlib
    import inspect
    import sys

    import nsa_cp_comm
    import nsa_cp_comm.harness

    # The packages load their public names on first use: load every one, so
    # that what a task may replace is recorded whether or not it was used yet.
    for package in (nsa_cp_comm, nsa_cp_comm.harness):
        for name in package.__all__:
            getattr(package, name)
    importlib.import_module("nsa_cp_comm.impls").load_builtins()
    found: list[tuple[str, Any, str, Any]] = []
    classes: set[int] = set()  # a class's methods once, under its own module's name
    for modname, module in list(sys.modules.items()):
        if not (modname == "nsa_cp_comm" or modname.startswith("nsa_cp_comm.")) or module is None:
            continue
        for name, value in list(vars(module).items()):
            if name.startswith("__") or not (inspect.isfunction(value) or inspect.isclass(value)):
                continue
            if not str(getattr(value, "__module__", "")).startswith("nsa_cp_comm"):
                continue
            found.append((f"{modname}.{name}", vars(module), name, value))
            if inspect.isclass(value) and id(value) not in classes:
                classes.add(id(value))
                own = f"{value.__module__}.{value.__qualname__}"
                found += [(f"{own}.{attr}", vars(value), attr, member) for attr, member in vars(value).items()
                          if not attr.startswith("__") and inspect.isfunction(member)]
    impls = sys.modules.get("nsa_cp_comm.impls")
    if impls is not None:
        from .. import origins

        found += [(f"nsa_cp_comm.impls.REGISTRY[{name!r}]", impls.REGISTRY, name, impl)
                  for name, impl in list(impls.REGISTRY.items()) if origins.origin(impl) == origins.own()]
    return found


# Names torch itself rebinds with a setting the settings already compare
# (``torch.Storage`` follows the default dtype).
_DERIVED = frozenset({"torch.Storage"})


def _torch_places() -> list[tuple[str, Any, tuple[str, ...], tuple[Any, ...]]]:
    """Every function and class of ``torch``, ``torch.distributed`` and
    ``distributed_c10d`` (its helpers too: a slowed ``_check_single_tensor``
    costs every collective) and every attribute of ``torch.Tensor`` and its
    base (``zero_``, ``copy_``, ...), as each namespace holds it: what the
    harness and the built-ins call, whatever a plug-in may replace. Modules
    are left out (torch adds its lazy submodules on first use); a name torch
    adds later is not compared (it was not called before it existed), except
    on ``torch.Tensor``, where a new attribute shadows its base's
    (:func:`_process_differences`)."""
    import types
    import warnings

    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    found = []
    with warnings.catch_warnings():  # callable() on a deprecated alias warns
        warnings.simplefilter("ignore")
        for prefix, module in (("torch", torch), ("torch.distributed", dist),
                               ("torch.distributed.distributed_c10d", distributed_c10d)):
            items = [(k, v) for k, v in list(vars(module).items())
                     if not k.startswith("__") and not isinstance(v, types.ModuleType) and callable(v)
                     and f"{prefix}.{k}" not in _DERIVED]
            found.append((prefix, vars(module), tuple(k for k, _ in items), tuple(v for _, v in items)))
        for prefix, cls in (("torch.Tensor", torch.Tensor), ("torch._C.TensorBase", torch._C.TensorBase)):
            items = [(k, v) for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__", "__doc__")]
            found.append((prefix, vars(cls), tuple(k for k, _ in items), tuple(v for _, v in items)))
    return found


def _codes(places: list[tuple[str, Any, str, Any]],
           torch_places: list[tuple[str, Any, tuple[str, ...], tuple[Any, ...]]]) -> list[tuple[str, Any, Any]]:
    """``(name, function, code)`` for every Python function among the places."""
    import inspect

    found = [(name, value, value.__code__) for name, _, _, value in places if inspect.isfunction(value)]
    for prefix, _, attrs, values in torch_places:
        found += [(f"{prefix}.{a}", v, v.__code__) for a, v in zip(attrs, values) if inspect.isfunction(v)]
    return found


def _process() -> dict[str, Any]:
    """The process's own state a point could change, compared by value:
    the task thread's niceness (``os.nice``) and CPU affinity, torch's active
    function and dispatch modes (a ``TorchFunctionMode`` left entered sees
    every later torch call) and the ``NSA_*`` environment (``NSA_CP_AUTO_MAX_S``
    caps later ``iters=auto`` points)."""
    import torch

    state: dict[str, Any] = {}
    with contextlib.suppress(AttributeError, OSError):
        state["niceness"] = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(AttributeError, OSError):
        state["CPU affinity"] = _cpus(os.sched_getaffinity(0))
    # the default device is a mode of torch's own (compared as a setting)
    state["torch function modes"] = _listed(m for m in _function_modes() if type(m).__name__ != "DeviceContext")
    state["torch dispatch modes"] = torch._C._len_torch_dispatch_stack()
    state["torch function enabled"] = torch._C._is_torch_function_enabled()
    state["NSA_* environment"] = _env_text()
    with contextlib.suppress(ImportError, OSError, ValueError):
        import resource

        # a point that lowers the open-file limit leaves the next one unable to open its rendezvous
        state["RLIMIT_NOFILE"] = resource.getrlimit(resource.RLIMIT_NOFILE)
    return state


def _function_modes() -> list[Any]:
    """The torch function modes entered now, outermost first."""
    import torch

    return [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]


def _listed(modes: Any) -> str:
    return "[" + ", ".join(_name(type(m)) for m in modes) + "]"


def _cpus(cpus: set[int]) -> str:
    """A CPU set as ranges: ``0-3,6``."""
    out: list[str] = []
    for c in sorted(cpus):
        if out and out[-1].split("-")[-1] == str(c - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out) or "none"


def _env_text() -> str:
    """The ``NSA_*`` variables, ``NAME=value`` in name order (``{}``: none)."""
    data = getattr(os.environ, "_data", None)  # CPython's encoded store: no decoding of every variable
    if isinstance(data, dict) and all(isinstance(k, bytes) for k in list(data)[:1]):
        prefix = ENV_PREFIX.encode()
        kept = sorted((os.fsdecode(k), os.fsdecode(v)) for k, v in data.items() if k.startswith(prefix))
    else:
        kept = sorted((k, v) for k, v in os.environ.items() if k.startswith(ENV_PREFIX))
    return "{" + ", ".join(f"{k}={v!r}" for k, v in kept) + "}"


def _process_differences() -> list[str]:
    """How the process, its threads and torch's namespaces differ from the start."""
    import threading

    import torch

    found = [f"{key} is {value} (was {_PROCESS[key]})" for key, value in _process().items()
             if key in _PROCESS and value != _PROCESS[key]]
    new = [t for t in threading.enumerate() if not any(t is s for s in _THREADS) and t.is_alive()]
    if new:
        found.append(f"{len(new)} thread{'s' if len(new) > 1 else ''} started by the point still running ("
                     + ", ".join(repr(t.name) for t in new[:5]) + ("" if len(new) <= 5 else ", ...") + ")")
    for prefix, space, attrs, values in _TORCH:
        if not all(map(operator.is_, map(space.get, attrs), values)):
            found += [f"{prefix}.{a} is {_name(space.get(a))} (was {_name(v)})"
                      for a, v in zip(attrs, values) if space.get(a) is not v and not _torchs_own(space.get(a), v)]
    if len(vars(torch.Tensor)) != _TENSOR_OWN[0]:
        start = {a for prefix, _, attrs, _ in _TORCH if prefix == "torch.Tensor" for a in attrs}
        found += [f"torch.Tensor.{k} is {_name(v)} (was inherited)" for k, v in vars(torch.Tensor).items()
                  if k not in start and not k.startswith("__")]
    if _CODES and not all(map(operator.is_, map(_CODE_OF, _CODE_FNS), _CODE_WAS)):
        found += [f"{name}.__code__ is {code_now.co_qualname} of {code_now.co_filename} (was its own)"
                  for name, fn, code in _CODES if (code_now := fn.__code__) is not code]
    return found


_CODE_OF = operator.attrgetter("__code__")
_CODE_FNS: list[Any] = []
_CODE_WAS: list[Any] = []


def _torchs_own(new: Any, old: Any) -> bool:
    """Whether ``new`` is torch's own wrapper of ``old``: torch rebinds a few
    of its names when a part of it first loads (``torch._dynamo`` wraps
    ``torch.manual_seed``). Its ``__wrapped__`` chain reaches ``old`` and its
    code is torch's (a plug-in's ``functools.wraps`` copies the name and the
    module, not the file)."""
    import torch

    home = os.path.dirname(torch.__file__) + os.sep
    seen = 0
    while new is not None and seen < 8:
        code = getattr(new, "__code__", None)
        if code is None or not code.co_filename.startswith(home):
            return False
        new = getattr(new, "__wrapped__", None)
        if new is old:
            return True
        seen += 1
    return False


def _name(fn: Any) -> str:
    if fn is None:
        return "missing"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__name__
    module = getattr(fn, "__module__", None)
    return f"{module}.{qualname}" if module else qualname


def remember() -> None:
    """Record this rank's state as it starts (once its group is up)."""
    import threading

    import torch

    _START.update(_settings())
    _START_FUNCTIONS.update(_functions())
    _LIBRARY[:] = _library_places()
    _TORCH[:] = _torch_places()
    _TENSOR_OWN[0] = len(vars(torch.Tensor))
    _CODES[:] = _codes(_LIBRARY, _TORCH)
    _CODE_FNS[:] = [fn for _, fn, _ in _CODES]
    _CODE_WAS[:] = [code for _, _, code in _CODES]
    _LIBRARY_SPACES[:] = _by_space(_LIBRARY)
    _PROCESS.update(_process())
    _THREADS[:] = threading.enumerate()


def begin_point(seed: int, rank: int | None) -> None:
    """Seed torch's global RNG (CPU and every CUDA device) from the point's
    ``seed`` and this rank's CP group ``rank`` (None: a bystander), so a point
    draws the same numbers whatever ran before it on this warm rank."""
    import torch

    from .spec import shard_seed

    torch.manual_seed(shard_seed(seed, BYSTANDER_RANK if rank is None else rank) + RNG_OFFSET)


def differences(full: bool = True) -> list[str]:
    """How this rank's settings and functions differ from its start, one item
    each; ``full=False``: torch's settings, the torch.distributed functions
    and the library's only (about a tenth of the cost), not the process, the
    torch namespaces and the code objects."""
    found = [f"{key} is {value} (was {_START[key]})" for key, value in _settings().items()
             if key in _START and value != _START[key]]
    now = _functions()
    found += [f"{key} is {_name(now.get(key))} (was {_name(fn)})" for key, fn in _START_FUNCTIONS.items()
              if now.get(key) is not fn]
    if not all(all(map(operator.is_, map(space.get, attrs), values)) for space, attrs, values in _LIBRARY_SPACES):
        found += [f"{name} is {_name(space.get(attr))} (was {_name(value)})" for name, space, attr, value in _LIBRARY
                  if space.get(attr) is not value]
    if full:
        found += [f for f in _process_differences() if f not in found]
    return found


_LIBRARY_SPACES: list[tuple[Any, tuple[str, ...], tuple[Any, ...]]] = []


def _by_space(places: list[tuple[str, Any, str, Any]]) -> list[tuple[Any, tuple[str, ...], tuple[Any, ...]]]:
    """``places`` grouped by namespace, for a look that maps ``is`` over each."""
    spaces: dict[int, tuple[Any, list[str], list[Any]]] = {}
    for _, space, attr, value in places:
        entry = spaces.setdefault(id(space), (space, [], []))
        entry[1].append(attr)
        entry[2].append(value)
    return [(space, tuple(attrs), tuple(values)) for space, attrs, values in spaces.values()]


# A rank's report carries, under this key, where its state first changed.
STATE_KEY = "_rank_state"


class Watch:
    """Where this rank's state first changed during a point. :meth:`after`
    runs after each implementation's checks, its timed form's building and
    each of its turns in the timed loop (untimed); the first change
    found is kept with whose it was (later calls cost nothing), so the
    blame lands on that implementation's row, not on every row of the point."""

    def __init__(self, outside: frozenset[str] | set[str] = frozenset()) -> None:
        self.calls = 0
        self.found: dict[str, Any] | None = None
        # The implementations from outside the project: after their steps the
        # look is full (the process, torch's namespaces, code objects, about
        # 0.3-1 ms); after a built-in's, the settings and functions (~0.1 ms).
        # What a built-in's step would change beyond those is found by the
        # next full look or the pool's check after the point.
        self.outside = frozenset(outside)

    def after(self, impl: str, where: str) -> None:
        self.calls += 1
        if self.found is None:
            found = differences(full=impl in self.outside)
            if found:
                # ``seq``: the same count on every rank (they run the same steps), to order their finds.
                self.found = {"impl": impl, "where": where, "what": "; ".join(found), "seq": self.calls}


def changes() -> str:
    """Rank task: how this rank differs from its start ("" when it does not);
    its group alive is proven by one all-reduce over every rank, through the
    functions it started with (a wrapper left behind is not trusted)."""
    import torch
    from torch.distributed import distributed_c10d

    def original(name: str):
        return _START_FUNCTIONS.get(f"torch.distributed.distributed_c10d.{name}") or getattr(distributed_c10d, name)

    found = differences()
    if not original("is_initialized")():
        return "; ".join(["its default process group was destroyed", *found])
    # dtype and device said: a rank whose defaults changed must still send what its peers expect
    # (gloo aborts the process on a size mismatch)
    device = "cuda" if original("get_backend")() == "nccl" else "cpu"
    t = torch.ones(1, dtype=torch.float32, device=device)
    original("all_reduce")(t)
    world = original("get_world_size")()
    if int(t.item()) != world:
        found.append(f"an all-reduce of ones gave {int(t.item())}, not {world}")
    return "; ".join(found)


def check_pool(pool: Any, timeout_s: float) -> tuple[str, str]:
    """``(failed_check, reason)`` of ``pool``'s ranks after a point:
    ``("", "")`` when every rank is as it started; ``("rank_state", what
    changed, per global rank)``; ``("", why)`` when the ranks did not answer
    (an error, not a check). The pool is closed unless every rank is as it
    started, and after outside code ran on it (``pool.ran_outside_code``)
    whatever the check found: what no check looks at must not reach the next
    point either."""
    results = pool.run(changes, timeout_s=timeout_s)
    if not all(r.ok for r in results):  # the pool closed itself
        _, reason = summarize_failure(results)
        return "", f"the ranks did not answer a state check after the point ({reason})"
    by_change: dict[str, list[int]] = {}
    for r in results:
        if r.value:
            by_change.setdefault(r.value, []).append(r.rank)
    if not by_change:
        if getattr(pool, "ran_outside_code", False):
            pool.close()
        return "", ""
    pool.close(graceful=False)
    bad = [f"global rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}: {change}"
           for change, ranks in by_change.items()]
    return "rank_state", "the point left its ranks changed: " + "; ".join(bad)
