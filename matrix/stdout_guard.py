"""Standard output that may be closed under the sweep (``| head -c 100``).

A closed pipe must not turn into tracebacks (Python's, and logging's for every
later line) or end the sweep: the rows go to results.csv whatever happens to
stdout. :func:`guard` wraps ``sys.stdout`` so that the first broken pipe
points file descriptor 1 at ``/dev/null`` and everything after it is dropped;
:func:`closed` says whether that happened.
"""

from __future__ import annotations

import os
import sys
from typing import Any


class _Guarded:
    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.closed_pipe = False

    def _drop(self) -> None:
        self.closed_pipe = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError):
            pass

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
    """Wrap ``sys.stdout`` (once)."""
    if not isinstance(sys.stdout, _Guarded):
        sys.stdout = _Guarded(sys.stdout)


def closed() -> bool:
    """Whether a write to stdout found the pipe closed."""
    return isinstance(sys.stdout, _Guarded) and sys.stdout.closed_pipe
