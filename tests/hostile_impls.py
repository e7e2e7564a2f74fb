"""Round-trip implementations that are correct but hostile to the harness:
each does something outside code may do (a huge error message, a helper
process left running, a changed global default or thread count, a wrapped
collective), and the matrix must keep its rows true and its processes reaped
(tests/app/test_hostile_sweeps.py runs them as ``impl=tests.hostile_impls:<name>``;
tests/harness/test_rank_state.py runs the state-changing ones on a warm pool)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time

import torch

from nsa_cp_comm import impls
from nsa_cp_comm.impls import RoundTripImpl

from tests.broken_impls import _gather, _scatter, wrong_order

LONG_MESSAGE_CHARS = 229_000


def _gathering(effect, *, after=False):
    """The padded gather, with ``effect()`` called before it (or after it)."""

    def gather(local, plan, group):
        if not after:
            effect()
        out = _gather(local, plan, group)
        if after:
            effect()
        return out

    return gather


def _long_error_gather(local, plan, group):
    # A compiler log: far over the csv module's 131072-character field limit.
    raise RuntimeError("E" * LONG_MESSAGE_CHARS)


long_error = RoundTripImpl("long_error", _long_error_gather, _scatter, doc="raises with a 229 KB message")

SLEEP_MARK = "987654"
_started: list[subprocess.Popen] = []


def _sleep_once(mark: str, new_session: bool) -> None:
    if not _started:  # a helper daemon, started once per rank and never waited for
        _started.append(subprocess.Popen(["sleep", mark], start_new_session=new_session))


spawns_helper = RoundTripImpl("spawns_helper", _gathering(lambda: _sleep_once(SLEEP_MARK, False)), _scatter,
                              doc="leaves a sleep running")


def _float64_scatter(full, plan, group):
    out = _scatter(full, plan, group)
    torch.set_default_dtype(torch.float64)  # a global default changed and never restored
    return out


sets_float64 = RoundTripImpl("sets_float64", _gather, _float64_scatter, doc="sets the default dtype to float64")


_THREADS: list[int] = []


def _set_threads() -> None:
    if not _THREADS:  # 7, unless the rank started with 7
        _THREADS.append(5 if torch.get_num_threads() == 7 else 7)
    torch.set_num_threads(_THREADS[0])  # a global changed and never restored


sets_threads = RoundTripImpl("sets_threads", _gathering(_set_threads), _scatter,
                             doc="sets torch's intra-op threads to 7")


def _wrap_all_gather() -> None:
    """Wrap the all-gather of torch.distributed and of distributed_c10d, as a
    tracing or profiling plug-in would, and leave the wrappers installed."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    from nsa_cp_comm.collectives import ALL_GATHER_NAME

    for module in (dist, distributed_c10d):
        fn = getattr(module, ALL_GATHER_NAME)
        if not getattr(fn, "traced", False):
            def traced(*args, _fn=fn, **kwargs):
                return _fn(*args, **kwargs)

            traced.traced = True
            setattr(module, ALL_GATHER_NAME, traced)


wraps_all_gather = RoundTripImpl("wraps_all_gather", _gathering(_wrap_all_gather), _scatter,
                                 doc="wraps torch.distributed's all-gather on its first call")
# TF32-class matmuls from now on, never restored
sets_matmul_precision = RoundTripImpl("sets_matmul_precision",
                                      _gathering(lambda: torch.set_float32_matmul_precision("medium")), _scatter,
                                      doc="sets torch's float32 matmul precision to medium")


def _slowing_gather(local, plan, group):
    """Wrap the project's own gather, which padded's timed form calls, with a
    sleep: this plug-in's rows are right, the next point's padded row slow."""
    import time

    from nsa_cp_comm import production

    fn = production.all_gather_into
    if not getattr(fn, "slowed", False):
        def slowed(*args, _fn=fn, **kwargs):
            time.sleep(0.002)
            return _fn(*args, **kwargs)

        slowed.slowed = True
        production.all_gather_into = slowed
    return _gather(local, plan, group)


slows_library_gather = RoundTripImpl("slows_library_gather", _slowing_gather, _scatter,
                                     doc="wraps nsa_cp_comm.production.all_gather_into with a 2 ms sleep")


def _late_change_form(plan, hidden, dtype, device, group):
    """The checked round trips leave the rank as it was; the production
    form's second scatter (in the timed loop) changes the thread count."""
    import dataclasses

    from nsa_cp_comm.production import Production, calls_form

    form: Production = calls_form(changes_in_its_timed_loop, plan, hidden, dtype, device, group)
    calls: list[int] = []

    def scatter():
        calls.append(1)
        if len(calls) == 2:
            _set_threads()
        return form.scatter()

    return dataclasses.replace(form, scatter=scatter)


changes_in_its_timed_loop = RoundTripImpl(
    "changes_in_its_timed_loop", _gather, _scatter, prepare=_late_change_form,
    doc="sets torch's intra-op threads in its timed loop's second round trip, not in its checks")


def _noop_zero() -> None:
    """Break ``Tensor.zero_`` (installed once): every later padded send block
    (a short rank's, zeroed when made) holds nonzero padding rows. It writes
    ones, what a no-op leaves on memory that held data (a fresh buffer's
    pages are zero, so a plain no-op shows only when the allocator hands back
    used memory)."""
    if "zero_" not in vars(torch.Tensor):
        def zero_(self):
            return self.fill_(1)

        torch.Tensor.zero_ = zero_


def _noop_zero_scatter(full, plan, group):
    out = _scatter(full, plan, group)
    _noop_zero()  # after its own gathers: its checks pass, and padded's next send block is not zeroed
    return out


noop_zero = RoundTripImpl("noop_zero", _gather, _noop_zero_scatter, doc="breaks Tensor.zero_ (writes ones) in its scatter")


def _hidden_noop_zero_scatter(full, plan, group):
    """As noop_zero, and the state check's record of torch.Tensor rewritten
    to match: a plug-in that fools the checker (the rank is still not reused)."""
    from nsa_cp_comm.harness import rank_state

    out = _noop_zero_scatter(full, plan, group)
    rank_state._TENSOR_OWN[0] = len(vars(torch.Tensor))
    return out


hidden_noop_zero = RoundTripImpl("hidden_noop_zero", _gather, _hidden_noop_zero_scatter,
                                 doc="breaks Tensor.zero_ and hides it from the state check")


def _traced_gather(local, plan, group):
    """Enter a TorchFunctionMode and leave it entered: every later torch call
    of the rank, padded's staging included, goes through it."""
    from torch.overrides import TorchFunctionMode

    class Tracer(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    out = _gather(local, plan, group)
    if not getattr(torch, "_hostile_tracer", None):
        torch._hostile_tracer = Tracer()
        torch._hostile_tracer.__enter__()
    return out


enters_function_mode = RoundTripImpl("enters_function_mode", _traced_gather, _scatter,
                                     doc="enters a TorchFunctionMode and never leaves it")


def _renice() -> None:
    if os.getpriority(os.PRIO_PROCESS, 0) < 19:
        os.nice(19)


renices_rank = RoundTripImpl("renices_rank", _gathering(_renice, after=True), _scatter,
                             doc="os.nice(19) on its rank")


def _spin() -> None:
    import threading

    if not any(t.name == "hostile-spinner" for t in threading.enumerate()):
        threading.Thread(target=lambda: [None for _ in iter(int, 1)], name="hostile-spinner", daemon=True).start()


leaves_thread_spinning = RoundTripImpl("leaves_thread_spinning", _gathering(_spin, after=True), _scatter,
                                       doc="starts a thread that spins forever")
leaks_env = RoundTripImpl("leaks_env", _gathering(lambda: os.environ.update(NSA_CP_AUTO_MAX_S="0.5")), _scatter,
                          doc="sets NSA_CP_AUTO_MAX_S=0.5 in its rank")

def _deprecated() -> None:
    import warnings

    warnings.warn("this communicator's API is deprecated", FutureWarning, stacklevel=1)


warns_deprecated = RoundTripImpl("warns_deprecated", _gathering(_deprecated), _scatter,
                                 doc="a FutureWarning on every gather, as a deprecated torch name gives")


def _fast_clock() -> None:
    import time

    real = time.perf_counter
    time.perf_counter = lambda: real() / 9  # every interval a ninth: "9x faster"


patches_clock = RoundTripImpl("patches_clock", _gathering(_fast_clock, after=True), _scatter,
                              doc="replaces time.perf_counter on its rank with one that runs 9x slow")


def _fewer_files() -> None:
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))


lowers_nofile = RoundTripImpl("lowers_nofile", _gathering(_fewer_files, after=True), _scatter,
                              doc="lowers its rank's open-file limit to 64")

SESSION_MARK = "876543"
# a daemon in a session of its own, never waited for
spawns_session_helper = RoundTripImpl("spawns_session_helper", _gathering(lambda: _sleep_once(SESSION_MARK, True)),
                                      _scatter, doc="leaves a sleep running in a new session")


# --- plan hooks that take the asking process down -------------------------------------------------
def _raising(exc: BaseException):
    def hook(plan):
        raise exc
    return hook


# os._exit in supports (the sweep ended with exit 0, no row, no summary)
supports_exits = dataclasses.replace(impls.get("padded"), name="supports_exits",
                                     supports=lambda plan: os._exit(0), doc="supports(plan) calls os._exit(0)")
# a row_stride that never answers (the sweep held past timeout_s)
stride_sleeps = dataclasses.replace(impls.get("padded"), name="stride_sleeps",
                                    row_stride=lambda plan: time.sleep(3600) or plan.max_rank_len,
                                    doc="row_stride(plan) sleeps an hour")
# a KeyboardInterrupt from supports (read as the user's Ctrl-C: exit 130, 'interrupted')
supports_interrupts = dataclasses.replace(impls.get("padded"), name="supports_interrupts",
                                          supports=_raising(KeyboardInterrupt()),
                                          doc="supports(plan) raises KeyboardInterrupt")


# --- two plug-ins that declare one name -----------------------------------------------------------
# asked in different jobs (impl=...:one_name_right,...:one_name_wrong), their rows carried one name and a reader
# kept the last row per point and name: PASS over the failed one
one_name_right = dataclasses.replace(impls.get("padded"), name="one_name", doc="padded, declared as one_name")
one_name_wrong = dataclasses.replace(wrong_order, name="one_name", doc="rank blocks reversed, declared as one_name too")


# --- a plan hook that answers one thing where the rows are folded and another on the ranks ---------
def _one_more_on_a_rank(plan):
    import torch.distributed as dist

    return plan.max_rank_len + (1 if dist.is_initialized() else 0)  # a rank's process has its group up


def _strided_gather(local, plan, group):
    from nsa_cp_comm.collectives import all_gather_into

    m = _one_more_on_a_rank(plan)
    block = local.new_zeros((m, local.shape[1]))
    block[: local.shape[0]].copy_(local)
    full = local.new_empty((m * plan.cp_size, local.shape[1]))
    all_gather_into(full, block, group)
    return full


def _strided_scatter(full, plan, group):
    import torch.distributed as dist

    from nsa_cp_comm.collectives import reduce_scatter_into

    m = _one_more_on_a_rank(plan)
    out = full.new_empty((m, full.shape[1]))
    reduce_scatter_into(out, full.contiguous(), group)
    return out[: plan.per_rank_tokens[dist.get_rank(group)]]


# right on its ranks, with the stride they see; one row shorter wherever else it is asked
stride_differs_on_ranks = RoundTripImpl("stride_differs_on_ranks", _strided_gather, _strided_scatter,
                                        row_stride=_one_more_on_a_rank, legacy_bits_on_even=False,
                                        doc="row_stride(plan) one row longer on the ranks than elsewhere")
