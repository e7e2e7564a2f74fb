"""Asking an implementation's hooks and holding their answers to the protocol.

A hook is outside code, so what it answers is data: an exception (SystemExit
included) or an answer its contract does not allow is a :class:`HookError`
naming the hook and the value, that implementation's ``error`` row and no
other's (docs/design.md, "Implementations").
"""

from __future__ import annotations

import numbers
from typing import Any

from .plan import CPPlan


def skip_reason(impl: Any, backend: str, plan: CPPlan | None = None) -> str | None:
    """Why ``impl`` cannot run on ``backend`` (or, given one, ``plan``: its
    ``supports``), else None. A ``supports`` that raises, or returns other
    than a str, raises :class:`HookError` (an error row: it is the
    implementation's fault); its reason is folded to one line."""
    if backend not in impl.backends:
        return f"impl={impl.name} needs backend {'/'.join(impl.backends)}, not {backend}"
    if plan is not None and getattr(impl, "supports", None) is not None:
        why = ask(impl, "supports", plan)
        if not isinstance(why, str):
            raise HookError(f"impl {impl.name!r}: supports(plan) returned {_shown(why)}, not a str "
                            "('' when it runs the plan)")
        why = " ".join(why.split())[:_SHOWN_CHARS * 8]
        return f"impl={impl.name}: {why}" if why else None
    return None


class HookError(ValueError):
    """An implementation's hook raised, or answered what its contract does
    not allow: that implementation's ``error`` row, its reason this one line
    (the hook, and the value or the exception)."""


# How much of a bad answer or a hook's exception a reason shows.
_SHOWN_CHARS = 80
# The most rows a ``row_stride`` may give each rank's block beyond the longest
# shard: generous for any alignment (pages, cp-aligned physical lengths), and
# far below what would make the gathered buffer the machine's memory.
MAX_STRIDE_SLACK = 1 << 16


def _shown(value: object) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


class HookEnded(Exception):
    """A hook's call that ended the process answering it, or gave no answer in
    time (asked in a child: :mod:`.harness.hook_child`); its text says how."""


def ask(impl: Any, hook: str, plan: CPPlan) -> Any:
    """``impl.<hook>(plan)``: an exception from it (SystemExit included) is a
    :class:`HookError` naming the hook."""
    try:
        return getattr(impl, hook)(plan)
    except HookEnded as exc:
        raise HookError(f"impl {impl.name!r}: {hook}(plan) {exc}") from exc
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - outside code: its answer is data
        msg = " ".join(str(exc).split())
        msg = msg if len(msg) <= _SHOWN_CHARS * 2 else msg[: _SHOWN_CHARS * 2] + "..."
        raise HookError(f"impl {impl.name!r}: {hook}(plan) raised {type(exc).__name__}"
                        f"{': ' + msg if msg else ''}") from exc


def _valid_stride(impl: Any, plan: CPPlan, stride: object) -> int:
    """``row_stride``'s answer, held to its range: an int (not a bool) that
    holds the longest shard, at most :data:`MAX_STRIDE_SLACK` rows beyond it."""
    lo = max(plan.max_rank_len, 1)
    hi = plan.max_rank_len + MAX_STRIDE_SLACK
    if isinstance(stride, bool) or not isinstance(stride, numbers.Integral) or not lo <= stride <= hi:
        raise HookError(f"impl {impl.name!r}: row_stride(plan) returned {_shown(stride)}, not an int in "
                        f"[{lo}, {hi}] (max_rank_len={plan.max_rank_len}, +{MAX_STRIDE_SLACK} at most)")
    return int(stride)


def hook_error(impl: Any, backend: str, plan: CPPlan) -> str:
    """What is wrong with ``impl``'s answers about ``plan`` (``''`` when
    nothing): every hook that is a function of the plan alone (``supports``,
    ``row_stride`` through the rows it sizes, a ``legacy_bits_on_even``
    rule), asked as the checks and the fold will ask them. Asked in the
    process that folds the point's rows, before any rank runs it, so a bad
    answer is that implementation's ``error`` row and no other's."""
    try:
        if skip_reason(impl, backend, plan):
            return ""  # it does not run the plan: none of its other answers is read
        if impl.mode == "FULL":  # a RoundTripImpl
            impl.claims_legacy_bits(plan)
            impl.starts(plan)
            impl.plan_columns(plan)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - outside code: its answer is data
        if isinstance(exc, HookError):
            return str(exc)
        return f"impl {impl.name!r}: its answers about the plan raised {type(exc).__name__}: {_shown(str(exc))}"
    return ""

