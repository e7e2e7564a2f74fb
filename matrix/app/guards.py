"""What the sweep's process survives: a closed stdout, SIGTERM and SIGHUP.

Standard output may be closed under the sweep (``| head -c 100``): a closed
pipe must not turn into tracebacks (Python's, and logging's for every later
line) or end the sweep: the rows go to results.csv whatever happens to
stdout. :func:`guard` wraps ``sys.stdout`` so that the first broken pipe
points file descriptor 1 at ``/dev/null`` and everything after it is dropped;
:func:`closed` says whether that happened.

SIGTERM and SIGHUP end a sweep as Ctrl-C does: a line naming the point that
was running, the command that resumes the sweep, and rank processes reaped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any


class _Guarded:
    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.closed_pipe = False

    def _drop(self) -> None:
        self.closed_pipe = True
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)

    def write(self, text: str) -> int:
        if not self.closed_pipe:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.closed_pipe:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard() -> None:
    if not isinstance(sys.stdout, _Guarded):
        sys.stdout = _Guarded(sys.stdout)


def closed() -> bool:
    return isinstance(sys.stdout, _Guarded) and sys.stdout.closed_pipe


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
