"""Whose failure a point's failure is, and what the evidence says it did.

Before each place of a point a rank says where it is
(:func:`announce_place`, through :func:`.rank_body.announce`); when the point
fails, the pool hands back each rank's last place and, for a rank that hung,
where it waited (its stack). :func:`diagnose` reads them with the ranks'
errors: the earliest place any CP rank was in names the implementation whose
turn it was, and the reason what it did, every rank numbered as the CP group
numbers them. :func:`.measure.run_point` then gives that implementation the
row and reruns the others on fresh ranks; :func:`failed_run` is for ranks no
one can restart (torchrun).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..errors import LEGACY_UNEVEN_ERROR
from .cpgroup import cp_ranks, group_rank_of
from .fold import ImplResult, origin_of
from .rank_result import RankResult, rank_list, summarize_failure
from .rank_state import STATE_KEY
from .rank_body import announce
from .spec import PointSpec
from .timing import CONTROL, Steps

# What a rank is about to run, in the order a point runs it (the first element
# of ``at``). When a point fails, the earliest place any CP rank was in is where
# the ranks parted: a rank that skipped a collective moves on, one that issued
# an extra one stays, and no rank is ever before the place where they parted.
AT_SETUP, AT_CHECKS, AT_AGREEMENT, AT_PREPARE, AT_TIMED = range(5)
PLACES = {
    AT_SETUP: "setting up the point (its groups, the reference MoE)",
    AT_CHECKS: "{impl}'s checks",
    AT_AGREEMENT: "the ranks' agreement on what to time, after the checks",
    AT_PREPARE: "building {impl}'s timed form (prepare)",
    AT_TIMED: "{impl}'s turn in the timed loop",
}


def announce_place(at: tuple[int, ...], impl: str = "", detail: str = "") -> None:
    """Say this rank is about to run the place ``at`` (``(AT_..., index...)``)
    of ``impl``; ``detail`` says more (the loop's iteration)."""
    announce(json.dumps({"at": list(at), "impl": impl, "detail": detail}))


def announce_turns(steps: list[Steps], warmup: int) -> None:
    """Before each turn of the timed loop (its untimed ``reset``): say whose
    turn it is. The loop's first barrier of each turn is on a group no timed
    form is handed (``timed_loop(turn_group=...)``): a rank whose timed form
    issued one collective more (or fewer) than its peers' then stays in that
    turn, and the point's failure is blamed on it, not on a later turn its
    extra collective happened to meet."""
    turns = itertools.count()
    for s in steps:
        def reset(it: int, name: str = s.name, inner: Callable[[int], object] | None = s.reset) -> None:
            announce_place((AT_TIMED, next(turns)), name, f"iteration {it}{' (warmup)' if it < warmup else ''}")
            if inner is not None:
                inner(it)

        s.reset = reset


# The correctness group's consistency check, as each rank reports itself (its
# text holds its own fingerprint and one peer's).
_MISMATCH = "Detected mismatch between collectives on ranks"
_FINGERPRINT = re.compile(
    r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=\d+, OpType=(\w+)"
    r"(?:, TensorShape=\[(.*?)\], TensorDtypes=([^,]+), TensorDeviceTypes=TensorOptions\(.*?device=(\w+))?"
)
# What a collective whose ranks pass different sizes does when nothing compares
# them first (each rank checks only its own sizes), as seen on gloo here and
# by torch's NCCL size checks.
_MISMATCHED_COUNTS = "ranks whose sizes agree with themselves but not with their peers' exchange mismatched counts: " \
    "a hang or wrong rows"
_UNCHECKED = {
    "gather": (
        "without the consistency check: on gloo a rank whose output is not world_size x its input raises 'invalid "
        "tensor size' while its peers wait in the all-gather forever; on NCCL such a rank raises torch's "
        f"'{LEGACY_UNEVEN_ERROR}' while its peers hang, and {_MISMATCHED_COUNTS}"
    ),
    "scatter": (
        "without the consistency check: on gloo a rank aborts its process (SIGABRT, 'Received data size doesn't "
        "match expected size') and its peers fail with a connection reset; on NCCL a rank whose input is not "
        f"world_size x its output raises torch's size error while its peers hang, and {_MISMATCHED_COUNTS}"
    ),
    "other": (
        "without the consistency check: on gloo a rank aborts its process (SIGABRT) or waits forever; on NCCL "
        f"{_MISMATCHED_COUNTS}"
    ),
}


def _fingerprints(results: list[RankResult]) -> dict[int, tuple[str, str, str, str]]:
    """``{rank: (op, shape, dtype, device)}`` of every rank some rank's
    consistency-check text names."""
    seen: dict[int, tuple[str, str, str, str]] = {}
    for r in results:
        if _MISMATCH in r.error:
            for m in _FINGERPRINT.finditer(r.error):
                fp = (m.group(2), m.group(3) or "", (m.group(4) or "").strip(), m.group(5) or "")
                seen.setdefault(int(m.group(1)), fp)
    return seen


def _mismatch(results: list[RankResult]) -> tuple[str, str]:
    """``(failed_check, reason)`` when the correctness group found the ranks'
    collectives differ, else ``("", "")``. The same collective with other
    shapes, dtypes or devices is ``collective_shapes``, naming each rank's;
    different collectives are ``collective_skipped``, naming the ranks that
    never entered the collective most ranks are in (with a tie, every rank
    and its collective)."""
    prints = _fingerprints(results)
    if not prints:
        return "", ""
    ops = {rank: fp[0] for rank, fp in sorted(prints.items())}
    if len(set(ops.values())) == 1:
        op = next(iter(ops.values()))
        differ = [what for i, what in ((1, "shapes"), (2, "dtypes"), (3, "devices"))
                  if len({fp[i] for fp in prints.values()}) > 1] or ["shapes"]
        each = "; ".join(
            f"rank {rank} [{fp[1]}] {fp[2]} on {fp[3]}" if fp[1] else f"rank {rank}" for rank, fp in sorted(prints.items())
        )
        kind = "gather" if "ALLGATHER" in op else "scatter" if "REDUCE_SCATTER" in op else "other"
        return "collective_shapes", (
            f"every rank issued the same collective ({op}) with different {' and '.join(differ)}: {each}; "
            f"{_UNCHECKED[kind]}"
        )
    by_op: dict[str, list[int]] = {}
    for rank, op in ops.items():
        by_op.setdefault(op, []).append(rank)
    where = "; ".join(f"rank {','.join(map(str, rs))} in {op}" for op, rs in by_op.items())
    counts = sorted((len(rs) for rs in by_op.values()), reverse=True)
    if len(counts) > 1 and counts[0] > counts[1]:
        common = max(by_op, key=lambda op: len(by_op[op]))
        never = [rank for rank, op in ops.items() if op != common]
        head = f"rank {','.join(map(str, never))} never entered {common}"
    elif len(by_op) == 2 and sum(_round_trip_step(op) is not None for op in by_op) == 2:
        # a tie in a round trip's two steps: the ranks already in the later
        # step skipped the earlier one their peers wait in
        early, late = sorted(by_op, key=_round_trip_step)  # type: ignore[arg-type]
        head = f"rank {','.join(map(str, by_op[late]))} skipped {early} (already in {late})"
    else:
        head = "ranks issued different collectives"
    return "collective_skipped", f"{head} ({where}): a decision taken from local state, not the shared plan"


def _round_trip_step(op: str) -> int | None:
    """Where a collective comes in a round trip: the gather (0) before the
    reduce-scatter (1; an all-reduce where gloo emulates it); None for others."""
    return 0 if "ALLGATHER" in op else 1 if "REDUCE_SCATTER" in op or "ALLREDUCE" in op else None


@dataclass
class _Where:
    """Where a rank said it was (its last :func:`_announce`)."""

    at: tuple[int, ...]
    impl: str
    detail: str

    @property
    def phase(self) -> int:
        return self.at[0]

    def describe(self) -> str:
        impl = "the A/A control" if self.impl == CONTROL else self.impl
        what = PLACES.get(self.phase, "an unknown phase").format(impl=impl)
        return f"{what} ({self.detail})" if self.detail else what


def _where(doing: str) -> _Where | None:
    try:
        d = json.loads(doing)
        return _Where(tuple(int(x) for x in d["at"]), str(d["impl"]), str(d["detail"]))
    except (ValueError, KeyError, TypeError):
        return None


@dataclass
class Failure:
    """A failed point, diagnosed: its status, reason and check, and the
    implementation whose turn it was (``culprit``; '' when the failure is
    not one implementation's: the point's setup, the A/A control, ranks that
    never said what they ran)."""

    status: str
    reason: str
    failed_check: str = ""
    culprit: str = ""
    # the first raising rank's traceback ('' where none raised): a single-point run prints it
    traceback: str = ""


def _ranks(ranks: list[int], cp_size: int) -> str:
    """Ranks named as the CP group numbers them; bystanders (numbers >= cp_size
    here) as bystander k."""
    cp = [r for r in ranks if r < cp_size]
    by = [r - cp_size for r in ranks if r >= cp_size]
    parts = [f"rank {','.join(map(str, cp))}"] if cp else []
    if by:
        parts.append(f"bystander {','.join(map(str, by))}")
    return " and ".join(parts)


NUMBERING = "ranks numbered as in the CP group"


def _grouped(by_rank: dict[int, str]) -> str:
    """``rank a,b what; rank c other``: ranks with the same text together."""
    texts: dict[str, list[int]] = {}
    for rank, text in sorted(by_rank.items()):
        texts.setdefault(text, []).append(rank)
    return "; ".join(f"{rank_list(ranks)} {text}" for text, ranks in texts.items())


def _parted(first: _Where, known: dict[int, _Where], culprit: str) -> str:
    """How the ranks parted, when some had moved past the earliest place."""
    behind = [rank for rank, w in sorted(known.items()) if w.at == first.at]
    ahead = {rank: f"in {w.describe()}" for rank, w in known.items() if w.at != first.at}
    if not ahead:
        return ""
    text = f"{rank_list(behind)} still in {first.describe()} while the others had moved on ({_grouped(ahead)})"
    if culprit:
        text += (f": {culprit} issued a collective on {rank_list(behind)} that the others did not, or the others "
                 f"skipped one")
    return text


def diagnose(spec: PointSpec, results: list[RankResult]) -> Failure:
    """What a point whose ranks raised, died or hung did, and whose turn it
    was. Ranks that answered while others timed out skipped a collective
    their peers wait in; ranks the correctness group found in different
    collectives skipped one too; ranks that had said (:func:`announce_place`)
    they were in different places parted in the earliest of them; hung ranks
    waiting in different collectives (their stacks) issued different ones.
    Every rank in the reason is numbered as in the CP group (the correctness
    group's fingerprints number them so), bystanders as ``bystander k``, and
    the reason says so."""
    cp = spec.cp_size
    ours = {r.rank: group_rank_of(r.rank, cp, spec.bystanders) for r in results}
    # Bystanders after the CP ranks, as cp + k (bystander k is global rank k).
    renumbered = sorted((replace(r, rank=ours[r.rank] if ours[r.rank] is not None else cp + r.rank) for r in results),
                        key=lambda r: r.rank)
    status, reason = summarize_failure(renumbered, lambda ranks: _ranks(ranks, cp))
    cp_results = [r for r in renumbered if r.rank < cp]
    check = ""
    done = [r.rank for r in cp_results if r.ok]
    stuck = [r.rank for r in cp_results if r.status == "timeout"]
    failed = [r for r in cp_results if r.status in ("error", "crashed")]
    mismatch_check, mismatch = _mismatch(cp_results)
    wheres = {r.rank: _where(r.doing) for r in cp_results}
    known = {rank: w for rank, w in wheres.items() if w is not None}
    first = min(known.values(), key=lambda w: w.at) if known and len(known) == len(wheres) else None
    culprit = first.impl if first is not None and first.impl not in ("", CONTROL) else ""
    # Only where no rank failed by itself: a rank that raised or died is the story.
    parted = _parted(first, known, culprit) if first is not None and not done and not failed else ""
    waits = {r.rank: r.waiting for r in cp_results if r.waiting}
    calls = {what.split(",")[0] for what in waits.values() if what.startswith("waiting in ")}
    global_of = cp_ranks(cp, spec.bystanders)
    # Only the ranks whose global rank is past the CP group's ranks indexed out
    # of range: what dist.get_rank() does where dist.get_rank(group) is meant.
    oob = failed and all(r.error.startswith("IndexError") and global_of[r.rank] >= cp for r in failed)
    if spec.bystanders and stuck and not done and all(r.ok for r in renumbered if r.rank >= cp):
        check = "group"
        reason = (
            f"every CP rank still waiting in a collective that only the {spec.bystanders} bystander rank(s), in the "
            f"world but outside the CP group, could complete: a collective on the default group; {reason}"
        )
    elif mismatch:
        check = mismatch_check
        # Each rank's text repeats the fingerprints just summarised.
        reason = f"{mismatch}; {reason.split(_MISMATCH)[0]}{_MISMATCH}"
    elif done and stuck:
        check = "collective_skipped"
        reason = (f"{rank_list(stuck)} still waiting in a collective that {rank_list(done)} never entered (they "
                  f"returned); {reason}")
    elif parted:
        check = "collective_skipped"
        reason = f"{parted}; {reason}"
        first = None  # told
    elif len(calls) > 1 and len(waits) == len(cp_results):
        check = "collective_skipped"
        reason = (f"the ranks wait in different collectives ({_grouped(waits)}): a collective not every rank issued; "
                  f"{reason}")
        waits = {}  # told
    elif oob:
        check = "group"
        each = ", ".join(f"rank {r.rank} is global rank {global_of[r.rank]}" for r in failed)
        reason = (f"an index out of range only on the ranks whose global rank (dist.get_rank()) is not a CP group rank "
                  f"(0..{cp - 1}; {each}): a plan indexed with the global rank where dist.get_rank(group) is meant; "
                  f"{reason}")
    if waits:
        reason = f"{reason}; where they waited: {_grouped(waits)}"
    if first is not None:
        reason = f"in {first.describe()}: {reason}"
    raised = next((r for r in cp_results if r.status == "error" and r.traceback), None)
    trace = f"rank {raised.rank} ({NUMBERING}):\n{raised.traceback.rstrip()}" if raised else ""
    return Failure(status, f"{reason} ({NUMBERING})", check, culprit, trace)


def state_change(spec: PointSpec, results: list[RankResult]) -> Failure | None:
    """None when no rank's state changed during the point
    (:class:`.rank_state.Watch`); else a ``failed`` (``rank_state``) blamed
    on the implementation after whose step a rank first found the change
    (the earliest step over the ranks), naming what changed on which ranks."""
    found = {group_rank_of(r.rank, spec.cp_size, spec.bystanders): r.value[STATE_KEY]
             for r in results if isinstance(r.value, dict) and STATE_KEY in r.value}
    if not found:
        return None
    first = min(found.values(), key=lambda f: f["seq"])
    by_what: dict[str, list[int]] = {}
    for rank, f in sorted(found.items()):
        if f["impl"] == first["impl"]:
            by_what.setdefault(f["what"], []).append(rank)
    what = "; ".join(f"{_ranks(ranks, spec.cp_size)}: {change}" for change, ranks in by_what.items())
    culprit = first["impl"] if first["impl"] in spec.impls else ""
    return Failure("failed", f"changed its ranks (found after {first['where']}; {NUMBERING}): {what}",
                   "rank_state", culprit)


def every_row(spec: PointSpec, failure: Failure) -> list[ImplResult]:
    """Every implementation's row for a failure blamed on none of them: the row a culprit would get."""
    return [culprit_row(replace(failure, culprit=name)) for name in spec.impls]


def failed_run(spec: PointSpec, results: list[RankResult]) -> list[ImplResult]:
    """Rows for a point whose ranks raised, died or hung, where no fresh ranks
    can rerun the others (ranks started by torchrun): the culprit's row
    carries the failure (:func:`diagnose`), the others say they were not run;
    with no culprit every row carries it."""
    failure = diagnose(spec, results)
    if not failure.culprit:
        return every_row(spec, failure)
    return [culprit_row(failure) if name == failure.culprit else
            not_run_row(name, failure, "no fresh ranks here to rerun it on") for name in spec.impls]


def culprit_row(failure: Failure) -> ImplResult:
    return ImplResult(failure.culprit, failure.status, reason=failure.reason, failed_check=failure.failed_check,
                      origin=origin_of(failure.culprit), traceback=failure.traceback)


def not_run_row(name: str, failure: Failure, why: str) -> ImplResult:
    return ImplResult(name, "error", origin=origin_of(name),
                      reason=f"not run: {failure.culprit} brought the point's ranks down ({failure.status}) and {why}")
