"""Deliberately broken implementations, the one catalogue that the tests and the
benchmark share: each makes one real mistake, and the matrix must flag it with
the check that names the mistake, or with the status of the rank it brings
down. Loaded by reference, as outside code is: ``impl=tests.broken_impls:NAME``
(``python -m matrix``, tests/app/test_plugins.py, tests/app/test_hardening.py), in a
PointSpec's ``impls`` (tests/lib/test_checks.py), or in the padded path's place
(``benchmarks/bench_comm.py --padded tests.broken_impls:NAME``, tests/project/test_bench.py).

- Outside code (the first sections): written on torch.distributed directly,
  with no help from this project beyond the protocol classes, each correct
  except for its one mistake, so the named check is the first one to fail.
- The project's own paths with one part broken (``offset_by_one``,
  ``chunk_off_by_one``, ``one_ulp_off``, ``accepts_uneven``, ``drops_a_row``,
  ``slow_stage``): what a regression of padded, legacy or a2a would look like.
- Ranks that fail (``raise_rank``, ``crash_rank``, ``hang_rank``): on the
  world's last rank the gather raises, exits or hangs once its peers are
  inside the all-gather.
- A replicated shared expert added in the wrong place (``shared_before_rs``,
  ``shared_twice``) beside the right form (``shared_after_rs``).
- :data:`MUTATIONS`: what no implementation can stand in for (legacy's own
  refusal text, the SCATTERED-mode communicator, the reference MoE), patched on the ranks by
  :func:`point_with_mutation`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from unittest import mock

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed import distributed_c10d as c10d

from examples.field_bugs.bugs import packed_side

import nsa_cp_comm.harness.checks as checks
from nsa_cp_comm import alternatives, impls, moe
from nsa_cp_comm.collectives import all_gather_into, reduce_scatter_into
from nsa_cp_comm.communicator import CPLayerCommunicator
from nsa_cp_comm.harness.measure import point_on_rank
from nsa_cp_comm.alternatives import a2a_combine, a2a_dispatch
from nsa_cp_comm.impls import DispatchImpl, RoundTripImpl
from nsa_cp_comm.production import Production, padded_form
from nsa_cp_comm.roundtrip import padded_gather, padded_scatter


def _gather(local, plan, group, *, slot_of=lambda sender, cp: sender, pad=0.0):
    """The padded gather with two knobs for the mistakes below: where each
    sender's block goes in the gathered buffer, and what padding rows hold
    (``None``: whatever new_empty's memory held)."""
    cp, m = plan.cp_size, plan.max_rank_len
    block = local.new_empty((m, local.shape[1])) if pad is None else local.new_full((m, local.shape[1]), pad)
    block[: local.shape[0]].copy_(local)
    # The all-gather puts sender s's block at s*m; the layout may move it.
    received = torch.empty((m * cp, local.shape[1]), dtype=local.dtype, device=local.device)
    all_gather_into(received, block, group)
    full = torch.empty_like(received)
    for sender, rows in enumerate(received.tensor_split(cp)):
        slot = slot_of(sender, cp)
        full[slot * m : (slot + 1) * m].copy_(rows)
    return full


def _scatter(full, plan, group):
    rank, m = dist.get_rank(group), plan.max_rank_len
    full = full.contiguous()
    out = torch.empty((m, full.shape[1]), dtype=full.dtype, device=full.device)
    reduce_scatter_into(out, full, group)
    return out[: plan.per_rank_tokens[rank]]


# --- gather_rows: rank blocks in the wrong order -------------------------------
# Mistake: the slot counted from the end (a zigzag "mirror" applied to
# ranks): rank r's rows end up where rank cp-1-r's belong.
wrong_order = RoundTripImpl("wrong_order", functools.partial(_gather, slot_of=lambda sender, cp: cp - 1 - sender),
                            _scatter, doc="rank blocks in reverse order")


# --- padding_zero: padding rows poisoned ---------------------------------------
# Mistake: padding filled with NaN "so a read of it shows up downstream";
# the reduce-scatter sums padding rows too, so they must be zero.
dirty_padding = RoundTripImpl("dirty_padding", functools.partial(_gather, pad=float("nan")), _scatter,
                              doc="NaN padding rows")


# --- gather_shape: a row lost ----------------------------------------------------
def _short_gather(local, plan, group):
    # Mistake: the buffer handed back one row short ("the last row is padding").
    return _gather(local, plan, group)[:-1]


drops_last_row = RoundTripImpl("drops_last_row", _short_gather, _scatter, doc="gathered buffer one row short")


# --- scatter_chunk: the wrong rows back ----------------------------------------
def _summed_rows_at(start_of):
    """A scatter that sums the whole buffer, then slices this rank's rows
    from row ``start_of(rank, plan)``."""

    def scatter(full, plan, group):
        rank = dist.get_rank(group)
        summed = full.clone()
        dist.all_reduce(summed, group=group)
        start = start_of(rank, plan)
        return summed[start : start + plan.per_rank_tokens[rank]]

    return scatter


# Mistake: this rank's rows sliced at the packed offset sum(n_<r) (the
# allgatherv layout) although the buffer is rank-major padded (rank r at
# r*m). Right only while no earlier rank is short.
_packed_offset_scatter = _summed_rows_at(lambda rank, plan: plan.rank_offset(rank))
wrong_chunk = RoundTripImpl("wrong_chunk", _gather, _packed_offset_scatter, doc="scatter slices the packed offset")

# Mistake: this rank's rows sliced from the next rank's slot (a slot index
# off by one). With the CP group in reverse world order, on some ranks
# that slot is the one the global rank names; on others it is not.
_next_slot_scatter = _summed_rows_at(lambda rank, plan: (rank + 1) % plan.cp_size * plan.max_rank_len)
neighbour_scatter = RoundTripImpl("neighbour_scatter", _gather, _next_slot_scatter,
                                  doc="scatter returns the next rank's slot")


# --- collective_skipped: a branch on a local shape -----------------------------
def _skip_if_empty_gather(local, plan, group):
    # Mistake: "an empty shard has nothing to send", decided from the local
    # shape. Its peers enter the all-gather and wait for a rank that never comes.
    if local.shape[0] == 0:
        return torch.zeros((plan.padded_total, local.shape[1]), dtype=local.dtype, device=local.device)
    return _gather(local, plan, group)


skip_empty = RoundTripImpl("skip_empty", _skip_if_empty_gather, _scatter, doc="skips the gather on an empty shard")


def _skip_if_empty_scatter(full, plan, group):
    # The same mistake on the way back: "no rows to receive". The empty rank
    # then skips every collective of the round trip and waits in whatever
    # collective comes next, while its peers wait in the all-gather.
    if plan.per_rank_tokens[dist.get_rank(group)] == 0:
        return full[:0]
    return _scatter(full, plan, group)


skip_empty_both = RoundTripImpl(
    "skip_empty_both", _skip_if_empty_gather, _skip_if_empty_scatter, doc="skips gather and scatter on an empty shard"
)


# --- input_mutated: the caller's rows used as scratch --------------------------
def _scratch_gather(local, plan, group):
    full = _gather(local, plan, group)
    # Mistake: "the shard has been sent, reuse its memory": the caller still owns it.
    local.zero_()
    return full


mutates_input = RoundTripImpl("mutates_input", _scratch_gather, _scatter, doc="zeroes its input after sending")


# --- even_bitwise: an even-plan shortcut with other bits -----------------------
def _shortcut_scatter(full, plan, group):
    # Mistake: on an even plan (nothing to strip) a "simpler" path: gather
    # every rank's partials and sum them locally in float64. Within tolerance,
    # but not legacy's bytes, which a padded-family implementation promises.
    # Only elements with three or more non-zero partials show it: two summands
    # round the same in any order and precision.
    if not plan.is_even:
        return _scatter(full, plan, group)
    rank, cp = dist.get_rank(group), plan.cp_size
    everyone = torch.empty((cp * full.shape[0], full.shape[1]), dtype=full.dtype, device=full.device)
    all_gather_into(everyone, full.contiguous(), group)
    total = everyone.view(cp, *full.shape).double().sum(0).to(full.dtype)
    m = plan.max_rank_len
    return total[rank * m : rank * m + plan.per_rank_tokens[rank]]


even_shortcut = RoundTripImpl("even_shortcut", _gather, _shortcut_scatter, doc="even plans summed in float64")


# --- refusal: an even-only path that refuses after a collective ---------------
def _refuse(plan):
    if not plan.is_even:
        raise ValueError(f"output tensor size must be equal to world_size times input tensor size ({plan.per_rank_tokens})")


def _check_then_refuse(all_reduce_max):
    # Mistake: "agree on the row count first" (``all_reduce_max(n, group)``),
    # and only then refuse.
    def gather(local, plan, group):
        n = torch.tensor([float(local.shape[0])], device=local.device)
        all_reduce_max(n, group)
        _refuse(plan)
        return _gather(local, plan, group)

    return gather


def _c10d_refusing_scatter(full, plan, group):
    _refuse(plan)
    return _scatter(full, plan, group)


# Through distributed_c10d (not torch.distributed's own name).
refuses_late_c10d = RoundTripImpl(
    "refuses_late_c10d", _check_then_refuse(lambda n, group: c10d.all_reduce(n, op=dist.ReduceOp.MAX, group=group)),
    _c10d_refusing_scatter, needs_even=True, doc="refuses an uneven plan after an all-reduce through distributed_c10d",
)
# The same mistake through the functional collectives (as compiled code issues them).
refuses_late_functional = RoundTripImpl(
    "refuses_late_functional", _check_then_refuse(lambda n, group: funcol.all_reduce(n, "max", group).wait()),
    _c10d_refusing_scatter, needs_even=True, doc="refuses an uneven plan after a functional all-reduce",
)


# --- group: the default group or the global rank -------------------------------
# Mistake: the group argument ignored; every collective on the default
# group, whose rank order is not the CP group's.
default_group = RoundTripImpl("default_group", lambda local, plan, group: _gather(local, plan, None),
                              lambda full, plan, group: _scatter(full, plan, None), doc="talks on the default group")


def _global_rank_scatter(full, plan, group):
    # Mistake: collectives on the CP group, but "my rows" counted with
    # dist.get_rank(), the global rank, where dist.get_rank(group) is meant.
    rank, m = dist.get_rank(), plan.max_rank_len
    out = torch.empty((m, full.shape[1]), dtype=full.dtype, device=full.device)
    reduce_scatter_into(out, full.contiguous(), group)
    return out[: plan.per_rank_tokens[rank]]


global_rank = RoundTripImpl("global_rank", _gather, _global_rank_scatter, doc="slices its rows by the global rank")


# --- collective_shapes: the same collective, other shapes ----------------------
def _raw_gather(local, plan, group):
    # The serving engine's communicator before the fix: every rank all-gathers
    # its own rows into the [T, H] buffer, as if the shards were equal.
    full = torch.empty((plan.total_tokens, local.shape[1]), dtype=local.dtype, device=local.device)
    all_gather_into(full, local.contiguous(), group)
    return full


def _split_scatter(full, plan, group):
    # ... and reduce-scatters tensor_split chunks of it, returning this rank's.
    rank = dist.get_rank(group)
    full = full.contiguous()
    chunk = full.tensor_split(plan.cp_size)[rank]
    out = torch.empty_like(chunk)
    reduce_scatter_into(out, full, group)
    return out


raw_allgather = RoundTripImpl(
    "raw_allgather", _raw_gather, _split_scatter, layout="rank_major_packed",
    doc="the unfixed serving communicator: raw all-gather of unequal shards into [T, H]",
)


def _own_rows_scatter(full, plan, group):
    # Mistake: the reduce-scatter sized from this rank's own row count
    # (n_r rows out of n_r * cp), which differs between ranks of an uneven plan.
    n = plan.per_rank_tokens[dist.get_rank(group)]
    out = torch.empty((n, full.shape[1]), dtype=full.dtype, device=full.device)
    reduce_scatter_into(out, full[: n * plan.cp_size].contiguous(), group)
    return out


own_rows_scatter = RoundTripImpl(
    "own_rows_scatter", _gather, _own_rows_scatter, doc="reduce-scatter sized from the local row count"
)


# --- scatter_chunk, named for its dtype ------------------------------------------
def _float64_scatter(full, plan, group):
    # Mistake: "sum in double for accuracy" and the result left in double.
    return _scatter(full.double(), plan, group)


float64_scatter = RoundTripImpl("float64_scatter", _gather, _float64_scatter, doc="returns float64 rows")


# --- production_form: the timed form is not the checked one --------------------
def _reused_form(plan, hidden, dtype, device, group, *, slot_at):
    """The padded round trip as serving code runs it: one [m*cp, H] buffer
    for every layer, this rank's rows staged into it at ``slot_at(plan, rank)``
    before an in-place all-gather; the reduce-scatter into a reused chunk."""
    rank, m, cp = dist.get_rank(group), plan.max_rank_len, plan.cp_size
    n = plan.per_rank_tokens[rank]
    full = torch.zeros((m * cp, hidden), dtype=dtype, device=device)
    partials = torch.empty_like(full)
    chunk = torch.empty((m, hidden), dtype=dtype, device=device)

    def stage(local):
        full[rank * m : (rank + 1) * m].zero_()
        at = slot_at(plan, rank)
        full[at : at + n].copy_(local)

    def gather(local):
        all_gather_into(full, full[rank * m : (rank + 1) * m], group)
        return full

    def scatter():
        reduce_scatter_into(chunk, partials, group)
        return chunk[:n]

    return Production(gather, scatter, partials, stage=stage)


def _padded_slot(plan, rank):
    return rank * plan.max_rank_len


def _packed_slot(plan, rank):
    # Mistake: the reused buffer's slot computed with the packed offset
    # sum(n_<r) (copied from the allgatherv path), while the checked gather
    # (written separately, per call) puts the rows at r*m. Right only while
    # no earlier rank is short.
    return plan.rank_offset(rank)


reused_buffer = RoundTripImpl(
    "reused_buffer", _gather, _scatter, prepare=functools.partial(_reused_form, slot_at=_padded_slot),
    doc="a production form with reused buffers, the same as its checked calls")
diverging_form = RoundTripImpl(
    "diverging_form", _gather, _scatter, prepare=functools.partial(_reused_form, slot_at=_packed_slot),
    doc="a production form whose reused buffer takes the rows at the packed offset")


# --- timed forms that cheat: right when checked, wrong when timed -----------------
# Each wraps padded's own production form (buffers reused across calls, as
# serving code runs it) and cheats the way a timed form can: the checked calls
# are padded's, so only the check of every timed iteration can see it.
def _cheating(name, cheat, doc):
    def prepare(plan, hidden, dtype, device, group):
        return cheat(padded_form(plan, hidden, dtype, device, group), plan, hidden, dtype, device, group)

    return RoundTripImpl(name, _gather, _scatter, prepare=prepare, doc=doc)


def _counted(fn, when):
    """``fn`` on the calls ``when(count)`` allows (counting from 1); else what
    the last real call returned, without its collective (a stale buffer)."""
    calls, last = [0], [None]

    def call(*args):
        calls[0] += 1
        if calls[0] == 1 or when(calls[0]):
            last[0] = fn(*args)
        return last[0]

    return call


def _wrong_way(form, plan, hidden, dtype, device, group):
    # The staging copy the wrong way round: the caller's rows overwritten by
    # the slot's (zeros), and zeros gathered.
    from nsa_cp_comm.roundtrip import padded_buffer

    full, slot = padded_buffer(plan, hidden, dtype=dtype, device=device, group=group)
    rank, m = dist.get_rank(group), plan.max_rank_len

    def gather(local):
        all_gather_into(full, full[rank * m : (rank + 1) * m], group)
        return full

    return dataclasses.replace(form, gather=gather, stage=lambda local: local.copy_(slot))


def _stops_gathering(form, plan, hidden, dtype, device, group):
    # The workspace is reused; after three calls the all-gather is no longer issued.
    return dataclasses.replace(form, gather=_counted(form.gather, lambda n: n <= 3))


def _memoised(form, plan, hidden, dtype, device, group):
    # Results remembered per input buffer (its address), as a cache keyed on
    # a tensor's identity does: the same buffer with new rows gets old results.
    seen: dict[int, torch.Tensor] = {}
    gather = form.gather

    def memo(local):
        key = local.data_ptr()
        if key not in seen:
            seen[key] = gather(local).clone()
        return seen[key]

    return dataclasses.replace(form, gather=memo)


def _zeroes_caller(form, plan, hidden, dtype, device, group):
    gather = form.gather

    def gather_then_zero(local):
        out = gather(local)
        local.zero_()  # "done with it": the caller's rows are gone
        return out

    return dataclasses.replace(form, gather=gather_then_zero)


def _idle_between(form, plan, hidden, dtype, device, group):
    # Works in warm-up, the first timed iteration and from the fifth call on;
    # idle on calls 3 and 4 (stale buffers, no collectives).
    works = lambda n: not 3 <= n <= 4  # noqa: E731
    return dataclasses.replace(form, gather=_counted(form.gather, works), scatter=_counted(form.scatter, works))


def _every_other(form, plan, hidden, dtype, device, group):
    return dataclasses.replace(form, gather=_counted(form.gather, lambda n: n % 2 == 1))


def _corrupting(when, element):
    """A cheat whose scatter output, on the calls ``when(count)`` picks
    (counting from 1), has element ``element`` changed by one."""

    def cheat(form, plan, hidden, dtype, device, group):
        calls, scatter = [0], form.scatter

        def corrupt(*args):
            calls[0] += 1
            out = scatter(*args)
            if when(calls[0]) and out.numel():
                out.view(-1)[element] += 1
            return out

        return dataclasses.replace(form, scatter=corrupt)

    return cheat


# One call in ten returns a scatter output with one element changed.
_rare_corruption = _corrupting(lambda n: n % 10 == 7, -1)

# The timed loop of tests/lib/test_timed_check.py: one warm-up and 12 timed iterations.
LOOP_CALLS = 13

# Right on every call but the timed loop's last: one element changed there.
_last_only = _corrupting(lambda n: n == LOOP_CALLS, 0)


CHEATS = {
    "wrong_way_stage": (_wrong_way, "stages the wrong way round: local.copy_(slot)"),
    "stops_gathering": (_stops_gathering, "reuses its workspace and stops issuing the all-gather after 3 calls"),
    "memoised": (_memoised, "remembers results per input buffer address"),
    "zeroes_caller": (_zeroes_caller, "zeroes the caller's rows after gathering them"),
    "idle_between": (_idle_between, "idle (stale buffers) on calls 3 and 4"),
    "every_other": (_every_other, "the all-gather on odd calls only"),
    "rare_corruption": (_rare_corruption, "one scatter output in ten has one element changed"),
    "last_only": (_last_only, f"its {LOOP_CALLS}th scatter output (the last of a 1 + 12 loop) has one element changed"),
}
for _name, (_cheat, _doc) in CHEATS.items():
    globals()[_name] = _cheating(_name, _cheat, _doc)


# --- dispatch implementations whose timed calls cheat ----------------------------
# The stand-in all-to-all (a2a), right on its first call with a buffer (the
# checked calls pass fresh tensors), cheating when a buffer comes back, as the
# timed loop's do: only the check of every timed iteration can see it. State
# is per tensor object (held, so its address is not reused), never per
# process: warm ranks run many points.
class _PerBuffer:
    def __init__(self) -> None:
        self.seen: dict[int, list] = {}

    def visit(self, t: torch.Tensor) -> list:
        """``[tensor, calls so far with it, what the cheat keeps]``, calls counted from 1."""
        entry = self.seen.get(id(t))
        if entry is None or entry[0] is not t:
            entry = self.seen[id(t)] = [t, 0, None]
        entry[1] += 1
        return entry


def _a2a_memoised():
    seen = _PerBuffer()

    def dispatch(local, idx, weight, per, group):
        entry = seen.visit(local)
        if entry[2] is None:
            entry[2] = a2a_dispatch(local, idx, weight, per, group)
        return entry[2]

    return DispatchImpl("a2a_memoised", dispatch, a2a_combine, doc="remembers its dispatch per input buffer")


def _a2a_cached_routing():
    # Rows sent every call; the routing (expert ids, weights) kept from a buffer's first call.
    seen = _PerBuffer()

    def dispatch(local, idx, weight, per, group):
        entry = seen.visit(local)
        recv, handle = a2a_dispatch(local, idx, weight, per, group)
        if entry[2] is None:
            entry[2] = handle
        return recv, dataclasses.replace(handle, recv_idx=entry[2].recv_idx, recv_weight=entry[2].recv_weight)

    return DispatchImpl("a2a_cached_routing", dispatch, a2a_combine, doc="sends the routing on a buffer's first call only")


def _a2a_idle_combine():
    seen = _PerBuffer()

    def combine(y, handle, group):
        entry = seen.visit(y)
        if not 3 <= entry[1] <= 4:
            entry[2] = a2a_combine(y, handle, group)
        return entry[2]

    return DispatchImpl("a2a_idle_combine", a2a_dispatch, combine,
                        doc="the combine idle (stale output) on a buffer's calls 3 and 4")


def _a2a_zeroes_caller():
    seen = _PerBuffer()

    def dispatch(local, idx, weight, per, group):
        out = a2a_dispatch(local, idx, weight, per, group)
        if seen.visit(local)[1] > 1:
            local.zero_()  # "done with it"
        return out

    return DispatchImpl("a2a_zeroes_caller", dispatch, a2a_combine,
                        doc="zeroes the caller's rows after sending them, from a buffer's second call")


DISPATCH_CHEATS = {"a2a_memoised": _a2a_memoised, "a2a_cached_routing": _a2a_cached_routing,
                   "a2a_idle_combine": _a2a_idle_combine, "a2a_zeroes_caller": _a2a_zeroes_caller}
for _name, _make in DISPATCH_CHEATS.items():
    globals()[_name] = _make()

# --- written from docs/plugins.md, right on even plans only --------------------
# Each passes every even point (a sweep whose plans are all even, such as zigzag
# batches of one request, calls it ok); the conformance preset's uneven plan
# classes must catch each at every cp (tests/app/test_conformance.py).
def _local_sized_gather(local, plan, group):
    # Mistake: the gathered buffer sized from this rank's own rows, as if every
    # rank held as many; each rank all-gathers a block of its own length.
    cp = plan.cp_size
    full = torch.empty((local.shape[0] * cp, local.shape[1]), dtype=local.dtype, device=local.device)
    all_gather_into(full, local.contiguous(), group)
    return full


local_sized_buffer = RoundTripImpl("local_sized_buffer", _local_sized_gather, _scatter,
                                   doc="gather buffer sized from local.shape[0] * cp")


# Mistake: the padded block allocated with new_empty: its padding rows
# hold whatever the allocator's memory held, and the reduce-scatter sums them.
new_empty_padding = RoundTripImpl("new_empty_padding", functools.partial(_gather, pad=None), _scatter,
                                  doc="padding rows allocated with new_empty")


def _neighbour_scatter(full, plan, group):
    # Mistake: even plans take the reduce-scatter; uneven ones sum the whole
    # buffer and slice "my" rows, with the slot counted from 1: the next rank's.
    if plan.is_even:
        return _scatter(full, plan, group)
    return _next_slot_scatter(full, plan, group)


neighbour_rows = RoundTripImpl("neighbour_rows", _gather, _neighbour_scatter,
                               doc="uneven plans: the scatter returns the next rank's rows")


# --- bad references -------------------------------------------------------------
def raising_factory():
    """A factory (a zero-argument callable) that cannot build its implementation."""
    raise RuntimeError("this communicator needs a GPU it cannot find")


# --- the project's own paths with one part broken ------------------------------
_PADDED = impls.get("padded")


def _offset_gather(local, plan, group):
    # Every row one slot late: a slot computed off by one.
    return padded_gather(local, plan, group).roll(1, dims=0)


offset_by_one = dataclasses.replace(_PADDED, gather=_offset_gather, doc="padded, every gathered row one slot late")


def _late_scatter(full, plan, group):
    # This rank's rows handed back one slot late: the same slip on the way back.
    # (Not a neighbour's chunk: with two ranks in reverse world order, that is
    # the chunk the global rank names, which the group check diagnoses.)
    return padded_scatter(full, plan, group).roll(1, dims=0)


chunk_off_by_one = dataclasses.replace(_PADDED, scatter=_late_scatter,
                                       doc="padded, every scattered row one slot late")


def _one_ulp_off_scatter(full, plan, group):
    # Within every tolerance; only a byte-exact check sees it.
    out = padded_scatter(full, plan, group)
    if out.numel():
        out.view(-1)[0] = torch.nextafter(out.view(-1)[0], torch.tensor(float("inf"), dtype=out.dtype))
    return out


one_ulp_off = dataclasses.replace(_PADDED, scatter=_one_ulp_off_scatter, doc="padded, one element one ulp off")


accepts_uneven = dataclasses.replace(
    impls.get("legacy"), gather=lambda local, plan, group: padded_gather(local, plan, group),
    doc="legacy whose gather no longer refuses an uneven plan",
)


def _dispatch_drops_a_row(local, idx, weight, experts_per_rank, group):
    x_recv, handle = alternatives.a2a_dispatch(local, idx, weight, experts_per_rank, group)
    if x_recv.shape[0]:
        x_recv = x_recv.clone()
        x_recv[-1].zero_()
    return x_recv, handle


drops_a_row = dataclasses.replace(impls.get("a2a"), dispatch=_dispatch_drops_a_row,
                                  doc="a2a whose dispatch loses the last received row")


# --- reference_moe: a replicated shared expert in the wrong place -----------------
# The MoE step hands scatter_replicated the shared expert's whole output on the
# gathered rows, the same on every rank (impls.RoundTripImpl.scatter_moe).
def _own_rows(replicated, plan, group):
    rank, m = dist.get_rank(group), plan.max_rank_len
    return replicated[rank * m : rank * m + plan.per_rank_tokens[rank]]


def _shared_before_rs(partials, replicated, plan, group):
    # Mistake: the replicated term added to this rank's partials before the
    # reduce-scatter, as a sharded expert's share would be: every rank adds it,
    # so the sum counts it cp times.
    return padded_scatter(partials + replicated, plan, group)


shared_before_rs = dataclasses.replace(_PADDED, scatter_replicated=_shared_before_rs,
                                       doc="padded that adds the replicated shared expert before the reduce-scatter")


def _shared_after_rs(partials, replicated, plan, group):
    # Right: the partials summed over the ranks, then this rank's rows of the term, once.
    return padded_scatter(partials, plan, group) + _own_rows(replicated, plan, group)


shared_after_rs = dataclasses.replace(_PADDED, scatter_replicated=_shared_after_rs,
                                      doc="padded that adds the replicated shared expert once after the "
                                          "reduce-scatter: right")


def _shared_twice(partials, replicated, plan, group):
    # Mistake: added after the sum, and once more (as if the layer added it too):
    # counted twice, whatever cp is.
    return _shared_after_rs(partials, replicated, plan, group) + _own_rows(replicated, plan, group)


shared_twice = dataclasses.replace(_PADDED, scatter_replicated=_shared_twice,
                                   doc="padded that adds the replicated shared expert twice after the reduce-scatter")

SLOW_STAGE_S = 0.25


def _slow_form(plan, hidden, dtype, device, group):
    # Right results, a slow staging copy: the local phase of the timed form
    # (one of its own on an even plan, where padded stages nothing).
    form = padded_form(plan, hidden, dtype, device, group)
    stage = form.stage

    def slow_stage(local):
        time.sleep(SLOW_STAGE_S)
        return stage(local) if stage is not None else None

    return dataclasses.replace(form, stage=slow_stage)


slow_stage = dataclasses.replace(_PADDED, prepare=_slow_form,
                                 doc=f"padded whose timed staging copy sleeps {SLOW_STAGE_S} s: right, and slow")


# --- right wherever they run, but they run too little ------------------------------
# What the sweep's coverage verdict (matrix.review.coverage.gaps) is for: every row
# they write is ok or skipped, and a sweep of them alone proves nothing at a
# cp where they skip everything, or every uneven plan.
skips_cp3 = dataclasses.replace(
    _PADDED, supports=lambda plan: "not built for cp=3" if plan.cp_size == 3 else "",
    doc="padded that refuses every plan at cp=3 (supports)")
even_only = dataclasses.replace(
    _PADDED, supports=lambda plan: "" if plan.is_even else "uneven shards are not supported",
    doc="padded that refuses every uneven plan (supports)")


# --- answers that are no data the matrix can use ---------------------------------
# Every plug-in hook's answer is validated where the point's rows are folded,
# before any rank runs it: each is that implementation's error row (naming the
# hook and the value), and the point's other implementations still run.
def _raises(plan):
    raise RuntimeError("hook exploded")


def _exits(plan):
    raise SystemExit(3)


BAD_ANSWERS = {  # name -> what its error row's reason says
    "stride_zero": "row_stride(plan) returned 0, not an int in",
    "stride_raises": "row_stride(plan) raised RuntimeError: hook exploded",
    "stride_float": "row_stride(plan) returned 2.5, not an int in",
    "stride_huge": "row_stride(plan) returned 1000000000000, not an int in",
    "supports_raises": "supports(plan) raised RuntimeError: hook exploded",
    "supports_exits": "supports(plan) raised SystemExit: 3",
    "supports_list": "supports(plan) returned ['no'], not a str",
    "bits_rule_str": "legacy_bits_on_even(plan) returned 'yes', not a bool",
    "bits_rule_raises": "legacy_bits_on_even(plan) raised RuntimeError: hook exploded",
}
stride_zero = dataclasses.replace(_PADDED, row_stride=lambda plan: 0, doc="a row_stride of 0")
stride_raises = dataclasses.replace(_PADDED, row_stride=_raises, doc="a row_stride that raises")
stride_float = dataclasses.replace(_PADDED, row_stride=lambda plan: 2.5, doc="a row_stride that is no int")
stride_huge = dataclasses.replace(_PADDED, row_stride=lambda plan: 10**12, doc="a row_stride of 10^12 rows")
supports_raises = dataclasses.replace(_PADDED, supports=_raises, doc="a supports that raises")
supports_exits = dataclasses.replace(_PADDED, supports=_exits, doc="a supports that calls sys.exit")
supports_list = dataclasses.replace(_PADDED, supports=lambda plan: ["no"], doc="a supports that is no str")
bits_rule_str = dataclasses.replace(_PADDED, legacy_bits_on_even=lambda plan: "yes", doc="a bits rule that is no bool")
bits_rule_raises = dataclasses.replace(_PADDED, legacy_bits_on_even=_raises, doc="a bits rule that raises")
prepare_raises = dataclasses.replace(_PADDED, prepare=lambda plan, hidden, dtype, device, group: _raises(plan),
                                     doc="a prepare that raises (on the ranks: blamed on its place)")


# --- timed forms that bring the ranks down ---------------------------------------
def _with_call(act, *, after_scatter=False):
    """padded's production form that calls ``act(call, group)`` before its
    gather, or after its scatter (its timed calls counted from 1)."""

    def prepare(plan, hidden, dtype, device, group):
        form = padded_form(plan, hidden, dtype, device, group)
        calls = [0]

        def gather(local):
            calls[0] += 1
            if not after_scatter:
                act(calls[0], group)
            return form.gather(local)

        def scatter():
            out = form.scatter()
            if after_scatter:
                act(calls[0], group)
            return out

        return dataclasses.replace(form, gather=gather, scatter=scatter)

    return prepare


def _extra_barrier(call, group):
    # Mistake: "sync after the reduce-scatter", decided from local state: only
    # the CP group's rank 0 issues it, in its second timed round trip. Its
    # peers' next collective is the barrier that starts the next turn.
    if call == 2 and dist.get_rank(group) == 0:
        dist.barrier(group=group)


def _raise_in_loop(call, group):
    if call == 2 and dist.get_rank() == dist.get_world_size() - 1:
        raise RuntimeError(f"injected fault in the timed loop on rank {dist.get_rank()}")


def _hang_in_loop(call, group):
    if call == 2 and dist.get_rank() == dist.get_world_size() - 1:
        _hang()


def _default_group_prepare(plan, hidden, dtype, device, group):
    # Mistake: the timed form built for the default group (the group argument
    # dropped): its rank is the global rank, past the plan's ranks with bystanders.
    return _reused_form(plan, hidden, dtype, device, None, slot_at=_padded_slot)


extra_barrier_timed = dataclasses.replace(_PADDED, prepare=_with_call(_extra_barrier, after_scatter=True),
                                          doc="padded whose timed scatter issues a barrier on one rank")
raise_in_loop = dataclasses.replace(_PADDED, prepare=_with_call(_raise_in_loop),
                                    doc="padded whose timed gather raises on the last rank")
hang_in_loop = dataclasses.replace(_PADDED, prepare=_with_call(_hang_in_loop),
                                   doc="padded whose timed gather never returns on the last rank")
default_group_form = RoundTripImpl("default_group_form", _gather, _scatter, prepare=_default_group_prepare,
                                   doc="a production form on the default group")


# --- ranks that fail: raise, exit or hang ---------------------------------------
def _failing_gather(fail):
    # The world's last rank fails: never rank 0, which writes a torchrun point's rows.
    def gather(local, plan, group):
        if dist.get_rank() == dist.get_world_size() - 1:
            time.sleep(0.2)  # let the healthy ranks enter the all-gather first
            fail()
        return _gather(local, plan, group)

    return gather


def _raise():
    raise RuntimeError(f"injected fault on rank {dist.get_rank()}")


def _hang():
    while True:
        time.sleep(3600)


raise_rank = RoundTripImpl("raise_rank", _failing_gather(_raise), _scatter, doc="the last rank raises")
crash_rank = RoundTripImpl("crash_rank", _failing_gather(lambda: os._exit(17)), _scatter,
                           doc="the last rank exits with code 17")
hang_rank = RoundTripImpl("hang_rank", _failing_gather(_hang), _scatter, doc="the last rank never returns")


# --- mutations: the project's own code patched on the ranks ----------------------
def _legacy_wrong_text(local, plan, group=None, check=True):
    # The check holds legacy, by name, to torch's text.
    raise ValueError("uneven shards")


class _CopyingCommunicator(CPLayerCommunicator):
    def prepare_mlp(self, hidden):
        return hidden.clone()  # "moves" rows in SCATTERED mode: not a pass-through


# name: (registered implementation, its field, replacement) or (module, attribute, replacement)
def _reference_without_shared(self, x):
    # The checker's truth missing a term: the routed experts only, whatever shared_expert says.
    return self._apply(x, range(self.num_experts))


MUTATIONS = {
    "legacy_wrong_text": ("legacy", "gather", _legacy_wrong_text),
    "passthrough_copies": (checks, "CPLayerCommunicator", _CopyingCommunicator),
    "reference_without_shared": (moe.ReferenceMoE, "reference", _reference_without_shared),
}


def ref(name: str) -> str:
    """The reference that loads implementation ``name`` of this catalogue, as outside code is loaded."""
    return f"tests.broken_impls:{name}"


def point_with_mutation(spec, backend, mutation="none"):
    """``point_on_rank`` with one of :data:`MUTATIONS` applied on this rank, then undone."""
    if mutation == "none":
        return point_on_rank(spec, backend)
    where, attr, repl = MUTATIONS[mutation]
    patched = (mock.patch.dict(impls.REGISTRY, {where: dataclasses.replace(impls.REGISTRY[where], **{attr: repl})})
               if isinstance(where, str) else mock.patch.object(where, attr, repl))
    with patched:
        return point_on_rank(spec, backend)


# --- a caller's mistake on one rank, inside the library's checked call --------
def _drops_a_row_on_rank_1(local, plan, group):
    # Mistake: one rank hands the library one row short (e.g. a shard trimmed
    # by a local length); the library's checked call must refuse it.
    return padded_gather(local[:-1] if dist.get_rank(group) == 1 else local, plan, group)


short_on_one_rank = RoundTripImpl("short_on_one_rank", _drops_a_row_on_rank_1, padded_scatter,
                                  doc="gives the library one row short on rank 1")


# --- side_tensors: the router logits gathered in another layout than the rows ------------------
# The mistake (vllm-ascend #16834), as the field bugs' catalog writes it: the logits gathered packed.
side_packed = dataclasses.replace(_PADDED, gather_side=packed_side,
                                  doc="padded whose router logits are gathered packed, its rows padded")
# Mistake: the side tensor handed back as this rank's own, never gathered.
side_not_gathered = dataclasses.replace(_PADDED, gather_side=lambda tensor, plan, group: tensor,
                                        doc="padded that leaves the router logits ungathered")
# Mistake: one side tensor of several gathered packed, the float32 one (at a bfloat16 DeepSeek-V3.2
# point on vLLM 0.34's monolithic block-fp8 path: the fp8 rows' scales; its logits are bfloat16).
scales_packed = dataclasses.replace(
    _PADDED, gather_side=lambda tensor, plan, group: (packed_side if tensor.dtype == torch.float32
                                                      else padded_gather)(tensor, plan, group),
    doc="padded whose float32 side tensors (the fp8 rows' scales) are gathered packed")


# --- padding_routing: the rows the runner marks as padding, for a router that masks them ----------
def rank_major_padding(plan):
    """The gathered buffer's padding rows as vLLM marks them (``pcp_manager.py:630-635``, 0.33.0):
    rank-major, ``rows >= n_r`` in each rank's block of ``max_rank_len`` rows."""
    rows = torch.arange(plan.max_rank_len)
    return (rows >= torch.tensor(plan.per_rank_tokens)[:, None]).flatten()


marks_padding = dataclasses.replace(_PADDED, is_padding=rank_major_padding,
                                    doc="padded that marks its gathered padding rows for the router")
# Mistake (SGLang #31838, vLLM #38128): the mask left unset, so the router routes every padding row,
# identical rows all to the same experts.
marks_no_padding = dataclasses.replace(_PADDED, is_padding=lambda plan: torch.zeros(
    plan.max_rank_len * plan.cp_size, dtype=torch.bool), doc="padded whose padding mask marks nothing")
# Mistake: a real row marked too (a mask shifted or built from an off-by-one length).
marks_a_real_row = dataclasses.replace(_PADDED, is_padding=lambda plan: rank_major_padding(plan).index_fill(
    0, torch.tensor([0]), True), doc="padded whose padding mask marks the first real row too")
# Mistake: one bool per rank's row, not per row of the gathered buffer.
marks_a_short_mask = dataclasses.replace(_PADDED, is_padding=lambda plan: torch.zeros(plan.max_rank_len,
                                                                                      dtype=torch.bool),
                                         doc="padded whose padding mask has one rank's rows")
