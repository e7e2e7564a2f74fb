"""An outside implementation's answers about a plan, asked in a child process.

The sweep's own process asks an implementation's plan-level hooks
(``supports``, ``row_stride``, a ``legacy_bits_on_even`` rule) before its
ranks run the point and again while folding its rows. Asked there directly,
a hook that calls ``os._exit(0)`` ended the sweep with exit 0 and no row, one
that sleeps held it past ``timeout_s``, and a ``KeyboardInterrupt`` it raised
read as the user's Ctrl-C. :func:`answering` asks each outside
implementation's hooks once per point in a forked child, bounded by a
timeout, and for the point's duration puts in the registry a copy whose
hooks replay the child's answers: a value, an exception (by its name and
text, as :func:`~nsa_cp_comm.hooks.ask` then reports it), or how the call
ended the child (an exit, a signal, no answer in time). Each is then the
implementation's own ``error`` row naming the hook; the sweep goes on. The
built-ins are the project's own and are asked directly. The ranks, separate
processes under their own bounds, ask the real hooks.

Linux/macOS only (``os.fork``); elsewhere the hooks are asked directly.
Torch-free, as everything the sweep's process imports on the way to a point.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from .. import impls as impl_registry
from ..hooks import HookEnded
from ..plan import CPPlan
from ..protocol import Impl

# The hooks a point's rows read in the sweep's process, each a function of the plan alone.
PLAN_HOOKS: tuple[str, ...] = ("supports", "row_stride", "legacy_bits_on_even")


def _send(fd: int, record: tuple) -> None:
    data = pickle.dumps(record)
    os.write(fd, len(data).to_bytes(8, "little") + data)


def _child(impl: Impl, plan: CPPlan, fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the user's Ctrl-C is the parent's to act on
    for hook in PLAN_HOOKS:
        fn = getattr(impl, hook, None)
        if not callable(fn):
            continue
        _send(fd, ("asking", hook))
        try:
            value = fn(plan)
        except BaseException as exc:  # noqa: BLE001 - outside code: what it raised is its answer
            _send(fd, ("raised", hook, type(exc).__name__, str(exc)))
            continue
        try:
            _send(fd, ("answer", hook, value))
        except Exception as exc:  # noqa: BLE001 - a value that cannot be passed on
            _send(fd, ("raised", hook, "UnpicklableAnswer", f"its answer, a {type(value).__name__}, cannot be "
                                                             f"passed on ({type(exc).__name__})"))
    _send(fd, ("done",))


def _records(fd: int, pid: int, timeout_s: float) -> list[tuple]:
    """The child's records, then how it ended where it ended before ``done``."""
    buf, out, deadline = b"", [], time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return [*out, ("hung", timeout_s)]
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            _, status = os.waitpid(pid, 0)
            return [*out, ("ended", status)]
        buf += chunk
        while len(buf) >= 8 and len(buf) >= 8 + int.from_bytes(buf[:8], "little"):
            size = int.from_bytes(buf[:8], "little")
            out.append(pickle.loads(buf[8 : 8 + size]))
            buf = buf[8 + size :]
            if out[-1] == ("done",):
                os.waitpid(pid, 0)
                return out


def _ask_in_child(impl: Impl, plan: CPPlan, timeout_s: float) -> dict[str, tuple]:
    """``{hook: record}`` for each of ``impl``'s plan hooks: ``("answer", value)``,
    ``("raised", name, text)`` or ``("ended", why)`` for the hook that was
    being asked when the child ended or stopped answering."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer, then leave without running the parent's exit handlers
        os.close(read)
        try:
            _child(impl, plan, write)
        finally:
            os._exit(0)  # a hook's own exit ends the child before "done": that is what tells them apart
    os.close(write)
    try:
        records = _records(read, pid, timeout_s)
    except BaseException:  # the user's Ctrl-C while it answers: no child outlives the sweep
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise
    finally:
        os.close(read)
    answers: dict[str, tuple] = {}
    asking = None
    for record in records:
        if record[0] == "asking":
            asking = record[1]
        elif record[0] in ("answer", "raised"):
            answers[record[1]] = record[:1] + record[2:]
            asking = None
        elif record[0] in ("ended", "hung") and asking is not None:
            answers[asking] = ("ended", _how_it_ended(record))
            # the hooks after it were never asked: asking them here would be unguarded
            for hook in PLAN_HOOKS[PLAN_HOOKS.index(asking) + 1 :]:
                if callable(getattr(impl, hook, None)):
                    answers[hook] = ("ended", f"was not asked: {asking}(plan) ended the process first")
    return answers


def _how_it_ended(record: tuple) -> str:
    if record[0] == "hung":
        return f"gave no answer in {record[1]:g} s (timeout_s)"
    status = record[1]
    if os.WIFSIGNALED(status):
        return f"ended its process with signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"ended its process with exit status {os.WEXITSTATUS(status)} (os._exit in the hook)"


def _replayed(hook: str, record: tuple, plan: CPPlan, real: Any) -> Any:
    def answer(asked: CPPlan) -> Any:
        if asked != plan:  # a plan the child was not asked about: the hook itself
            return real(asked)
        if record[0] == "answer":
            return record[1]
        if record[0] == "ended":
            raise HookEnded(record[1])
        raise type(record[1], (Exception,), {})(record[2])  # as ask() names what the hook raised
    answer.__name__ = getattr(real, "__name__", hook)
    return answer


@contextlib.contextmanager
def answering(names: tuple[str, ...] | list[str], plan: CPPlan, timeout_s: float) -> Iterator[None]:
    """For the ``with`` block, each outside implementation of ``names`` in the
    registry as a copy whose plan hooks replay what a forked child answered
    about ``plan`` (bounded by ``timeout_s``); the registry as it was after."""
    if not hasattr(os, "fork"):
        yield
        return
    saved: dict[str, Any] = {}
    try:
        for name in dict.fromkeys(names):
            impl = impl_registry.REGISTRY.get(name)
            if impl is None or not impl.origin or not any(callable(getattr(impl, h, None)) for h in PLAN_HOOKS):
                continue
            try:
                answers = _ask_in_child(impl, plan, timeout_s)
            except OSError:  # no process to spare (fork refused): the hooks are asked directly, as before
                continue
            parts = {hook: _replayed(hook, record, plan, getattr(impl, hook)) for hook, record in answers.items()}
            saved[name] = impl
            impl_registry.REGISTRY[name] = replace(impl, **parts)
        yield
    finally:
        impl_registry.REGISTRY.update(saved)
