"""A long command's sign of life: which stage it is in, once it has been quiet too long.

A report over a large folder, or a dry run of a large sweep, can work for
minutes before printing anything; at a high load a user cannot tell that from
a hang. :class:`Progress` says nothing while a command is quick, and after
:data:`QUIET_S` seconds, and every :data:`QUIET_S` seconds after, one line on
stderr naming the stage and the seconds so far. stdout is left to the
command's output (a report's markdown, the dry run's listing). Like other
tools' progress lines, it speaks to a terminal: a stderr that is a file or a
pipe (a script, a CI log, a test reading the command's one error line) gets
none.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

# The longest a command stays silent.
QUIET_S = 10.0


class Progress:
    """``with Progress("report") as p: p.stage("reading RESULTS"); ...``: a
    ticker thread that, once the command has run ``quiet_s`` seconds, writes
    ``report: reading RESULTS (12 s so far)`` and again every ``quiet_s``
    seconds, always naming the latest stage; a stage begun after the first
    line is said as it begins."""

    def __init__(self, tool: str, quiet_s: float = QUIET_S, stream: TextIO | None = None) -> None:
        self.tool, self.quiet_s = tool, quiet_s
        self.stream = stream
        self._stage = "starting"
        self._start = time.monotonic()
        self._spoke = False
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._tick, name=f"{tool}-progress", daemon=True)
        self.enabled = stream is not None or _is_terminal(sys.stderr)

    def _say(self) -> None:
        with self._lock:
            stream = self.stream if self.stream is not None else sys.stderr
            try:
                print(f"{self.tool}: {self._stage} ({time.monotonic() - self._start:.0f} s so far)", file=stream,
                      flush=True)
            except (OSError, ValueError):  # a closed stderr: the command goes on without its sign of life
                pass
            self._spoke = True

    def _tick(self) -> None:
        while not self._done.wait(self.quiet_s):
            self._say()

    def stage(self, name: str) -> None:
        """The command is now at ``name``."""
        self._stage = name
        if self._spoke:
            self._say()

    def __enter__(self) -> Progress:
        self._start = time.monotonic()
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self.enabled:
            self._thread.join()


def run_command(name: str, parser: argparse.ArgumentParser, body: Callable[[argparse.Namespace, Progress], int],
                argv: list[str] | None) -> int:
    """A review command: ``argv`` parsed (a usage error is its exit code 2, already printed;
    ``--help`` 0: returned, not raised), then ``body(args, progress)`` under the command's
    :class:`Progress`."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    with Progress(name) as progress:
        return body(args, progress)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):  # replaced, or closed
        return False
