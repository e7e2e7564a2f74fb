"""Ranks agree on a round trip's inputs, or every rank raises the same ValueError.

A collective whose inputs differ between ranks does not fail cleanly: torch
raises on the ranks whose sizes disagree and leaves the others waiting inside
it (for gloo's 30-minute default timeout), a reduce-scatter into a wrong-sized
chunk can return the wrong rows without an error, and float32 on one rank with
int32 on another gives silent garbage. So before the
round trips of :mod:`.roundtrip` touch a collective, every rank publishes a
small fingerprint of what it is about to do (plan identity, the tensor's rows,
width, dtype and device kind, and whether it is a usable tensor at all: a
tensor, not on the meta device, 2-D, not needing autograd, and for an
in-place form a buffer whose rows own their memory) with
one all-gather of ``world x 9`` int64 values, and every rank checks all of
them. The verdict and its message are computed from the gathered fingerprints
only, so all ranks raise the same error, or none does.

Cost: one tiny all-gather per call (tens of microseconds on NCCL, about a
hundred on gloo), paid by every public round trip whatever its ``check=`` (a
per-rank argument must not decide whether a rank enters a collective). The
matrix's timed loop runs the production forms, sized once from the plan; its
correctness phase runs inside one :func:`agreed` block per point: many calls
on the same plan and tensors then cost one exchange.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import torch
import torch.distributed as dist

from .collectives import all_gather_into, uncounted
from .plan import CPPlan

# Tensor kinds in the fingerprint; anything but USABLE makes every rank raise.
# The layout kinds are decided on the rank from its own tensor, then published
# like the rest: a bad layout on one rank is the same error on every rank,
# before any collective (torch would raise on that rank only, mid-collective,
# and leave its peers waiting in it).
(USABLE, NOT_A_TENSOR, META, WRONG_DIM, NO_PLAN, REQUIRES_GRAD, EXPANDED, OVERLAPPING,
 NOT_CONTIGUOUS, LAZY_VIEW) = range(10)
_KIND_TEXT = {
    NOT_A_TENSOR: "is not a torch.Tensor",
    META: "is on the meta device (no data)",
    WRONG_DIM: "is not 2-D [rows, H]",
    NO_PLAN: "has no CPPlan",
    REQUIRES_GRAD: ("requires grad (the collectives are not differentiable: pass .detach(), "
                    "or call under torch.no_grad())"),
    EXPANDED: ("is expanded (a stride of 0: its rows share one row's memory, so the collective "
               "cannot write into it; pass a padded_buffer)"),
    OVERLAPPING: ("has rows that overlap in memory (its strides alias elements, so the collective "
                  "cannot write into it; pass a padded_buffer)"),
    NOT_CONTIGUOUS: ("is not contiguous (the in-place collective would write into a copy, "
                     "not into it; pass a padded_buffer or .contiguous())"),
    LAZY_VIEW: ("is a lazy negative or conjugate view (its memory holds the values before the sign or "
                "conjugate the view shows, and a collective reads and writes the memory; pass "
                ".resolve_neg() / .resolve_conj(), or a padded_buffer)"),
}
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32, torch.int64, torch.int8,
           torch.uint8, torch.bool)
_DEVICE_TYPES = ("cpu", "cuda")
FIELDS = 9


def plan_fingerprint(plan: CPPlan) -> int:
    """A 62-bit identity of the plan: equal on two ranks iff their plans split the
    batch the same way (policy, sizes, blocks)."""
    key = repr((plan.engine, plan.policy, plan.cp_size, plan.page_size, plan.align, plan.seq_lens, plan.per_rank_tokens,
                plan.blocks))
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 2


def _dtype_code(dtype: torch.dtype) -> int:
    """The same integer in every process for the same dtype, distinct for
    distinct dtypes: the listed ones by position, any other from a digest of
    its name (``hash()`` of a string differs between processes)."""
    if dtype in _DTYPES:
        return _DTYPES.index(dtype)
    digest = hashlib.blake2b(str(dtype).encode(), digest_size=6).digest()
    return len(_DTYPES) + int.from_bytes(digest, "little")


def _dtype_text(code: int) -> str:
    """The dtype a code of :func:`_dtype_code` stands for (``#code`` if none)."""
    for dtype in _all_dtypes():
        if _dtype_code(dtype) == code:
            return str(dtype)
    return f"#{code}"


def _all_dtypes() -> list[torch.dtype]:
    return [v for v in vars(torch).values() if isinstance(v, torch.dtype)]


def layout_kind(tensor: torch.Tensor, *, in_place: bool) -> int:
    """USABLE, or why a 2-D ``tensor`` cannot be handed to a collective: it
    needs autograd (grad mode on), it is a lazy negative or conjugate view
    (``torch._neg_view``, ``.conj()`` of a complex tensor: what it shows is
    not its memory), or, for an in-place form (``in_place``: the
    collective writes into the tensor itself), its rows do not own contiguous
    memory of their own: expanded (a stride of 0), overlapping, or strided."""
    if tensor.requires_grad and torch.is_grad_enabled():
        return REQUIRES_GRAD
    if tensor.is_neg() or tensor.is_conj():  # in or out of place: the collective sees the memory, not the view
        return LAZY_VIEW
    if not in_place or tensor.is_contiguous():
        return USABLE
    if any(st == 0 and n > 1 for n, st in zip(tensor.shape, tensor.stride())):
        return EXPANDED
    if _overlaps(tensor):
        return OVERLAPPING
    return NOT_CONTIGUOUS


def _overlaps(tensor: torch.Tensor) -> bool:
    """Whether two elements of ``tensor`` share memory: with its dims sorted by
    stride, one dim's stride is smaller than the span of the dims inside it."""
    dims = sorted((st, n) for n, st in zip(tensor.shape, tensor.stride()) if n > 1)
    span = 1
    for st, n in dims:
        if st < span:
            return True
        span = st * n
    return False


def fingerprint(what: str, tensor: object, plan: object, expected_rows: int, *, in_place: bool = False) -> list[int]:
    """This rank's ``FIELDS`` integers: kind, plan id, cp, rows, expected rows,
    width, dtype, device kind, name of the argument (hashed). ``in_place``: the
    collective writes into ``tensor`` (its layout is then part of the kind)."""
    what_code = int.from_bytes(hashlib.blake2b(what.encode(), digest_size=4).digest(), "little")
    if not isinstance(plan, CPPlan):
        return [NO_PLAN, 0, 0, 0, 0, 0, 0, 0, what_code]
    pid = plan_fingerprint(plan)
    if not isinstance(tensor, torch.Tensor):
        return [NOT_A_TENSOR, pid, plan.cp_size, -1, expected_rows, -1, -1, -1, what_code]
    if tensor.device.type == "meta":
        kind = META
    elif tensor.dim() != 2:
        kind = WRONG_DIM
    else:
        kind = layout_kind(tensor, in_place=in_place)
    rows = int(tensor.shape[0]) if tensor.dim() >= 1 else -1
    width = int(tensor.shape[1]) if tensor.dim() == 2 else -1
    dev = _DEVICE_TYPES.index(tensor.device.type) if tensor.device.type in _DEVICE_TYPES else 9
    return [kind, pid, plan.cp_size, rows, expected_rows, width, _dtype_code(tensor.dtype), dev, what_code]


def _exchange_device(tensor: object, group: dist.ProcessGroup | None) -> torch.device:
    """Where the fingerprint travels: NCCL moves CUDA tensors only."""
    if isinstance(tensor, torch.Tensor) and tensor.device.type == "cuda":
        return tensor.device
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def verdict(what: str, prints: list[list[int]]) -> str | None:
    """The error every rank raises for these gathered fingerprints, or None when
    the ranks agree and every input is usable. Deterministic in ``prints``."""
    world = len(prints)
    names = {p[8] for p in prints}
    if len(names) > 1:
        return f"{what}: ranks are in different round-trip calls (mismatched gather/scatter order)"
    for r, p in enumerate(prints):
        if p[0] != USABLE:
            return f"{what} on rank {r} {_KIND_TEXT[p[0]]}; no rank entered the collective"
    if len({p[1] for p in prints}) > 1 or len({p[2] for p in prints}) > 1:
        groups: dict[int, list[int]] = {}
        for r, p in enumerate(prints):
            groups.setdefault(p[1], []).append(r)
        ranks = "; ".join(",".join(map(str, rs)) for rs in groups.values())
        return f"{what}: ranks passed different plans (ranks grouped by plan: {ranks}); all ranks must pass the same plan"
    if prints[0][2] != world:
        return f"{what}: group size {world} != plan.cp_size={prints[0][2]}: all ranks must pass the group's plan"
    bad_rows = [(r, p[3], p[4]) for r, p in enumerate(prints) if p[3] != p[4]]
    if bad_rows:
        detail = ", ".join(f"rank {r} has {got} rows, the plan expects {want}" for r, got, want in bad_rows)
        return f"{what}: {detail}"
    labels = ((5, "hidden size H", str), (6, "dtype", _dtype_text), (7, "device type", _device_text))
    for field, label, text in labels:
        if len({p[field] for p in prints}) > 1:
            shown = ", ".join(f"rank {r}={text(p[field])}" for r, p in enumerate(prints))
            return f"{what}: ranks disagree on {label}: {shown}"
    return None


# What the ranks of a process group (by id) agreed on entering agreed():
# (plan fingerprint, width, dtype code, device kind).
_AGREED: dict[int, tuple[int, int, int, int]] = {}


def _group_key(group: dist.ProcessGroup | None) -> int:
    return id(group if group is not None else dist.group.WORLD)


def _covered(what: str, tensor: object, plan: object, expected_rows: int, group: dist.ProcessGroup | None,
             in_place: bool = False) -> bool:
    """Whether an :func:`agreed` block on ``group`` already holds this call's
    agreement: its plan, width, dtype and device kind are the agreed ones. A
    call with the agreed plan and other tensor properties on every rank alike
    (a wider buffer, a float32 sum) exchanges as usual. With the agreed plan,
    what only one rank can get wrong is checked here, on the rank, and raises
    there (its peers may be inside the collective by then): a tensor that is
    unusable (its layout included), or whose rows are not what the plan says
    this rank holds."""
    held = _AGREED.get(_group_key(group))
    if held is None or not isinstance(plan, CPPlan):
        return False
    p = fingerprint(what, tensor, plan, expected_rows, in_place=in_place)
    if p[1] != held[0]:
        return False
    if p[0] != USABLE:
        wrong = _KIND_TEXT[p[0]]
    elif (p[5], p[6], p[7]) != held[1:]:
        return False
    elif p[3] != p[4]:
        wrong = f"has {p[3]} rows, the plan expects {p[4]}"
    else:
        return True
    raise ValueError(f"{what} on this rank {wrong} (inside agreed(): raised on this rank only)")


def _device_text(code: int) -> str:
    return _DEVICE_TYPES[code] if 0 <= code < len(_DEVICE_TYPES) else "other"


@contextlib.contextmanager
def agreed(plan: CPPlan, hidden: int, dtype: torch.dtype, device: torch.device | str,
           group: dist.ProcessGroup | None = None) -> Iterator[None]:
    """One agreement for many checked round trips on ``group``: on entry the
    ranks exchange one fingerprint of ``plan``, the width ``hidden``, ``dtype``
    and the device kind, and every rank raises the same ValueError when they
    differ (as :func:`agree`). Inside, a checked call on ``group`` with that
    plan, width, dtype and device kind skips its own exchange; its rows are
    checked on the rank (a wrong count, or no usable tensor, raises there
    only: the price of the saved exchange, for callers that build every
    rank's inputs from the same plan, like the matrix's checks). A call with
    anything else exchanges as usual, so it must differ on every rank alike.
    Every rank of ``group`` must enter together (a collective)."""
    rank = dist.get_rank(group)
    rows = plan.per_rank_tokens[rank] if isinstance(plan, CPPlan) and 0 <= rank < plan.cp_size else -2
    # the tensors to come, as a shape on the device (one element of storage)
    like = torch.empty_strided((max(rows, 0), hidden), (0, 0), dtype=dtype, device=device)
    mine = fingerprint("agreed", like, plan, rows)
    _exchange("agreed", mine, like, group)
    key = _group_key(group)
    before = _AGREED.get(key)
    _AGREED[key] = (mine[1], mine[5], mine[6], mine[7])
    try:
        yield
    finally:
        if before is None:
            _AGREED.pop(key, None)
        else:
            _AGREED[key] = before


def agree(what: str, tensor: object, plan: object, expected_rows: int, group: dist.ProcessGroup | None = None,
          *, in_place: bool = False) -> None:
    """Exchange fingerprints and raise ValueError, on every rank alike, when any
    rank's ``tensor`` or ``plan`` disagrees with the others' or with the plan,
    or any rank's tensor is unusable: not a tensor, meta, not 2-D, needing
    autograd, or, with ``in_place`` (the collective writes into ``tensor``),
    expanded, overlapping or not contiguous.

    Every rank of ``group`` must call it at the same point (it is a collective),
    except inside an :func:`agreed` block that covers the call.
    ``expected_rows`` is what the caller's own plan says this rank holds."""
    if _covered(what, tensor, plan, expected_rows, group, in_place):
        return
    _exchange(what, fingerprint(what, tensor, plan, expected_rows, in_place=in_place), tensor, group)


def _exchange(what: str, mine: list[int], tensor: object, group: dist.ProcessGroup | None) -> None:
    world = dist.get_world_size(group)
    device = _exchange_device(tensor, group)
    out = torch.empty(world * FIELDS, dtype=torch.int64, device=device)
    with uncounted(group):
        all_gather_into(out, torch.tensor(mine, dtype=torch.int64, device=device), group)
    prints = out.view(world, FIELDS).tolist()
    message = verdict(what, prints)
    if message is not None:
        raise ValueError(message)
