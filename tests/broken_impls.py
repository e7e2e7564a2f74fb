"""Deliberately broken round-trip implementations: each makes one real mistake
that communicator code makes, and the matrix must flag it with the check that
names the mistake (tests/test_plugins.py runs them through ``python -m matrix``
as ``impl=tests.broken_impls:<name>``).

They are written the way outside code is: on torch.distributed directly, with
no help from this project beyond the protocol classes, and each is correct
except for its one mistake, so the named check is the first one to fail.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from nsa_cp_comm.collectives import all_gather_into, reduce_scatter_into
from nsa_cp_comm.impls import RoundTripImpl


def _gather(local, plan, group, *, slot_of=lambda sender, cp: sender, pad=0.0):
    """The padded gather with two knobs for the mistakes below: where each
    sender's block goes in the gathered buffer, and what padding rows hold."""
    cp, m = plan.cp_size, plan.max_rank_len
    block = torch.full((m, local.shape[1]), pad, dtype=local.dtype, device=local.device)
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
def _reversed_gather(local, plan, group):
    # Mistake: the slot counted from the end (a zigzag "mirror" applied to
    # ranks): rank r's rows end up where rank cp-1-r's belong.
    return _gather(local, plan, group, slot_of=lambda sender, cp: cp - 1 - sender)


wrong_order = RoundTripImpl("wrong_order", _reversed_gather, _scatter, doc="rank blocks in reverse order")


# --- padding_zero: padding rows poisoned ---------------------------------------
def _nan_padded_gather(local, plan, group):
    # Mistake: padding filled with NaN "so a read of it shows up downstream";
    # the reduce-scatter sums padding rows too, so they must be zero.
    return _gather(local, plan, group, pad=float("nan"))


dirty_padding = RoundTripImpl("dirty_padding", _nan_padded_gather, _scatter, doc="NaN padding rows")


# --- scatter_chunk: the wrong rows back ----------------------------------------
def _packed_offset_scatter(full, plan, group):
    # Mistake: sums the whole buffer, then slices this rank's rows at the
    # packed offset sum(n_<r) (the allgatherv layout) although the buffer is
    # rank-major padded (rank r at r*m). Right only while no earlier rank is short.
    rank = dist.get_rank(group)
    summed = full.clone()
    dist.all_reduce(summed, group=group)
    start = plan.rank_offset(rank)
    return summed[start : start + plan.per_rank_tokens[rank]]


wrong_chunk = RoundTripImpl("wrong_chunk", _gather, _packed_offset_scatter, doc="scatter slices the packed offset")


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


# --- bad references -------------------------------------------------------------
def raising_factory():
    """A factory (a zero-argument callable) that cannot build its implementation."""
    raise RuntimeError("this communicator needs a GPU it cannot find")
