"""SIGTERM and SIGHUP end a sweep as Ctrl-C does: a line naming the point that
was running, the command that resumes the sweep, and rank processes reaped."""

from __future__ import annotations

import signal


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM or SIGHUP; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum: int, _frame: object) -> None:
    raise Terminated(signum)


def install() -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise)


def exit_code(exc: KeyboardInterrupt) -> int:
    """128 + the signal's number, as a shell reports a process ended by it."""
    return 128 + (exc.signum if isinstance(exc, Terminated) else signal.SIGINT)


def name(exc: KeyboardInterrupt) -> str:
    return signal.Signals(exc.signum).name if isinstance(exc, Terminated) else "interrupted"
