"""A long command says which stage it is in once it has been quiet too long,
and nothing while it is quick (matrix.progress)."""

from __future__ import annotations

import io
import time

from matrix.progress import Progress
from nsa_cp_comm.harness import machine as load_rule


def _wait_for(stream: io.StringIO, text: str, bound_s: float = 60.0) -> str:
    """``stream``'s text once it holds ``text`` (polled; the bound only ends a broken run)."""
    end = time.monotonic() + bound_s
    while text not in stream.getvalue() and time.monotonic() < end:
        time.sleep(0.01)
    return stream.getvalue()


def test_a_quick_command_says_nothing():
    out = io.StringIO()
    with Progress("report", quiet_s=60.0, stream=out) as progress:
        progress.stage("reading RESULTS=x")
    assert out.getvalue() == ""


def test_a_long_stage_is_named_with_the_seconds_so_far_and_a_later_stage_as_it_begins():
    out = io.StringIO()
    with Progress("report", quiet_s=0.05, stream=out) as progress:
        progress.stage("reading RESULTS=big")
        seen = _wait_for(out, "report: reading RESULTS=big (")
        assert seen.splitlines()[0].startswith("report: reading RESULTS=big (") and seen.endswith(" s so far)\n")
        progress.stage("writing to out")  # said at once: the command has spoken already
        assert "report: writing to out (" in out.getvalue()
    lines = out.getvalue().count("\n")
    time.sleep(0.2)
    assert out.getvalue().count("\n") == lines  # the ticker ended with the command


def test_a_closed_stream_costs_the_line_not_the_command():
    out = io.StringIO()
    out.close()
    with Progress("matrix", quiet_s=0.01, stream=out) as progress:
        progress.stage("composing")
        time.sleep(0.1)
    # no exception: the command went on


def test_a_stderr_that_is_no_terminal_gets_no_line(capsys):
    """A script, a CI log or a test reads a command's stderr as its error lines: progress is for a terminal."""
    with Progress("report", quiet_s=0.01) as progress:
        assert not progress.enabled
        progress.stage("reading RESULTS=x")
        time.sleep(0.1)
    assert capsys.readouterr().err == ""


def test_a_terminal_gets_the_line(monkeypatch):
    import os
    import select

    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as term:
            monkeypatch.setattr("sys.stderr", term)
            with Progress("matrix", quiet_s=0.01) as progress:
                assert progress.enabled
                progress.stage("starting 2 gloo/cpu ranks")
                got = b""
                end = time.monotonic() + 60
                while b"so far)" not in got and time.monotonic() < end:
                    if select.select([master], [], [], 0.5)[0]:  # never blocks past the bound
                        got += os.read(master, 4096)
        assert got.startswith(b"matrix: starting 2 gloo/cpu ranks ("), got
    finally:
        os.close(master)
        os.close(slave)


def test_a_tests_own_wait_scales_with_the_load_and_its_timeout_says_the_load(monkeypatch):
    """As the matrix scales its ranks' start bound (budget.load_factor): idle, the wait as given; at a load
    past the cores, longer; running past it, the failure names the load."""
    import os
    import sys

    import pytest

    from matrix_cli import run, under_load
    from nsa_cp_comm.harness.machine import this_machine

    cores = this_machine().cores
    monkeypatch.setattr(load_rule.os, "getloadavg", lambda: (cores / 2, 0.0, 0.0))
    assert under_load(30)[0] == 30
    monkeypatch.setattr(load_rule.os, "getloadavg", lambda: (cores * 3.0, 0.0, 0.0))
    seconds, why = under_load(30)
    assert seconds == 90 and why == f"30 s idle x 3.0 for the 1-minute load {cores * 3.0:.1f} on {cores} cores"
    with pytest.raises(AssertionError, match=r"ran past 0 s \(0.1 s idle x 3.0 for the 1-minute load"):
        run([sys.executable, "-c", "import time; time.sleep(30)"], 0.1, env=dict(os.environ))
