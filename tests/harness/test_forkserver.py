"""CPU ranks forked from a fork server keep what an exec'd rank promises.

The server (``_worker.py fork-server``) imports torch once per starter and
forks each CPU rank. Whatever kills the starter kills the server and every
rank it forked (the drill holds them stopped, so only the kernel's death
signal can end them); a rank sees the environment its pool was started
with; the pool reads each forked rank's exit status as it reads an exec'd
one's (tests/harness/test_ranks.py); with ``NSA_CP_COMM_FORK_RANKS=0``
ranks are exec'd, as CUDA ranks are.
Where ranks outnumber the CPUs, each is bound to one (``machine.rank_cpus``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

import rank_tasks
from matrix_cli import REPO, run_python
from nsa_cp_comm.harness import RankPool, forkserver, ranks
from nsa_cp_comm.harness.machine import BIND_ENV, rank_cpus
from nsa_cp_comm.harness.rendezvous import STORE_PREFIX
from orphan_drills import (DEATH_SIGNAL_S, START_S, _driver_env, _read_line, _reap, end_drill, frozen, mutated_worker,
                           start_interrupted, start_reaper, stop, wait_for)

LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server and the death signal are Linux's")

# A sweep-like driver on the fork path: prints the server's pid and its 3 ranks', then sleeps.
DRIVER = """\
import sys, time
from pathlib import Path
from nsa_cp_comm.harness import RankPool, forkserver, ranks
if len(sys.argv) > 2:
    ranks.WORKER_PATH = Path(sys.argv[2])  # a worker file to serve from instead of the real one
pool = RankPool(3, backend="gloo", device="cpu", workdir=sys.argv[1])
print(forkserver.servers()[0].proc.pid, *pool.pids, flush=True)
time.sleep(600)
"""


def fork_drill(tmp_path: Path, worker: Path | None = None) -> dict[str, int | None]:
    """Start a driver's 3 forked ranks, SIGSTOP the server and the ranks,
    SIGKILL the driver; each one's exit code (-9: SIGKILL) or None if it
    lives on, as ``{"server": .., "rank0": .., ...}``."""
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {k: v for k, v in _driver_env().items() if k != forkserver.FORK_ENV}
    reaper = start_reaper(tmp_path, env, str(tmp_path / "work"), *([str(worker)] if worker else []))
    ended: dict[int, int] = {}
    said: list[str] = []
    named: dict[str, int] = {}
    try:
        driver = int(_read_line(reaper, START_S) or 0)
        assert driver, "the drill's driver did not start"
        wait_for("the driver's pool start", lambda: _reap(reaper, ended, said, {-1}, 1.0) or said)
        server, *rank_pids = map(int, said[0].split())
        named = {"server": server, **{f"rank{r}": pid for r, pid in enumerate(rank_pids)}}
        for pid in named.values():
            stop(pid)
        os.kill(driver, signal.SIGKILL)
        _reap(reaper, ended, said, {driver, *named.values()}, DEATH_SIGNAL_S,
              settled=lambda: driver in ended and frozen(named.values(), ended, reaper.pid))
        assert ended.get(driver) == -signal.SIGKILL, (driver, ended)
    finally:
        end_drill(reaper, named.values(), ended)
    return {name: ended.get(pid) for name, pid in named.items()}


@LINUX
@pytest.mark.parametrize("guard, ends", [
    # Stopped, neither the server nor a rank can act: the death signal
    # (starter -> server -> rank) is all that ends them.
    (None, -signal.SIGKILL),
    # The drill can fail: served from a worker file whose guard arms no death
    # signal, the server and its ranks outlive their starter.
    ("libc.prctl(1, 9)", None),
], ids=["intact", "no_death_signal"])
def test_sigkill_of_the_starter_ends_the_fork_server_and_every_rank_it_forked(tmp_path, guard, ends):
    want = dict.fromkeys(("server", "rank0", "rank1", "rank2"), ends)
    assert fork_drill(tmp_path, mutated_worker(tmp_path, guard)) == want


@LINUX
def test_cpu_ranks_are_forked_from_one_server_per_environment(tmp_path, monkeypatch):
    """The ranks' parent is the server, run by path as a rank is; a second
    pool reuses it; a pool started under another environment gets another
    server, and its ranks see that environment."""
    monkeypatch.delenv(forkserver.FORK_ENV, raising=False)
    monkeypatch.setattr(forkserver, "MAX_SERVERS", len(forkserver.servers()) + 2)  # room for two
    with RankPool(2, workdir=tmp_path / "a") as first:
        server = forkserver.find(ranks.rank_env(), ranks.WORKER_PATH)
        parents = [rank_tasks.parent_pid(pid) for pid in first.pids]
        argv = Path(f"/proc/{first.pids[0]}/cmdline").read_bytes().split(b"\0")
    assert parents == [server.proc.pid] * 2
    assert argv[1:4] == [str(ranks.WORKER_PATH).encode(), b"fork-server", str(os.getpid()).encode()], argv
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "a later test")  # left out of the server's key, as pytest's own
    with RankPool(1, workdir=tmp_path / "b") as again:
        assert rank_tasks.parent_pid(again.pids[0]) == server.proc.pid
        # ... but the rank gets the pool's value
        assert again.run(rank_tasks.environment_variable, "PYTEST_CURRENT_TEST", timeout_s=60)[0].value == \
            "a later test"
    mark = uuid.uuid4().hex
    monkeypatch.setenv("NSA_TEST_FORK_MARK", mark)
    with RankPool(2, workdir=tmp_path / "c") as other:
        seen = other.run(rank_tasks.environment_variable, "NSA_TEST_FORK_MARK", timeout_s=60)
        assert rank_tasks.parent_pid(other.pids[0]) != server.proc.pid
    assert [r.value for r in seen] == [mark, mark]


# Two spellings: the words a switch takes are test_switches_read_as_booleans'
# (env_switch reads this one too); here, that the pool obeys it.
@pytest.mark.parametrize("off", ["0", " OFF "])
def test_with_fork_off_ranks_are_execd_children_of_the_starter(tmp_path, monkeypatch, off):
    monkeypatch.setenv(forkserver.FORK_ENV, off)
    with RankPool(2, workdir=tmp_path) as pool:
        for pid in pool.pids:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert argv[1:3] == [str(ranks.WORKER_PATH).encode(), str(os.getpid()).encode()], argv
            assert rank_tasks.parent_pid(pid) == os.getpid()


def test_ranks_outnumbering_the_cpus_are_bound_one_cpu_each_round_robin():
    assert rank_cpus(0, 3, [0, 1]) == {0} and rank_cpus(1, 3, [0, 1]) == {1} and rank_cpus(2, 3, [0, 1]) == {0}
    assert rank_cpus(5, 8, [2, 5, 7]) == {7}
    assert rank_cpus(0, 2, [0, 1]) is None  # as many CPUs as ranks: the kernel places them
    assert rank_cpus(0, 1, [0, 1, 2, 3]) is None
    # on a loaded machine ranks that fit are bound too (the paired ratio's noise halves)
    assert rank_cpus(0, 2, [0, 1], loaded=True) == {0} and rank_cpus(1, 2, [0, 1], loaded=True) == {1}


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) > 3,
                    reason="needs CPU affinity and at most 3 CPUs (to outnumber them with few ranks)")
@pytest.mark.parametrize("bind", ["1", "0"])
def test_ranks_outnumbering_the_cpus_run_on_their_own_cpu(tmp_path, monkeypatch, bind):
    """Bound (the default), each rank's CPUs are its share; with
    NSA_CP_COMM_BIND_RANKS=0, every rank keeps the starter's."""
    monkeypatch.setenv(BIND_ENV, bind)
    cpus = sorted(os.sched_getaffinity(0))
    world = len(cpus) + 1
    with RankPool(world, workdir=tmp_path) as pool:
        got = [r.value for r in pool.run(rank_tasks.cpus, timeout_s=60)]
    want = [sorted(rank_cpus(r, world, cpus)) if bind == "1" else cpus for r in range(world)]
    assert got == want


@LINUX
def test_an_interrupted_start_on_the_fork_path_forks_no_rank_and_leaves_no_rendezvous(tmp_path, monkeypatch):
    """Interrupted while its new server still imports torch, a pool forks no
    rank and leaves no rendezvous file; the server serves the next pool."""
    monkeypatch.delenv(forkserver.FORK_ENV, raising=False)
    monkeypatch.setenv("NSA_TEST_FORK_MARK", uuid.uuid4().hex)  # a new server
    monkeypatch.setattr(forkserver, "MAX_SERVERS", len(forkserver.servers()) + 1)  # room for it
    start_interrupted(tmp_path, 0.3)
    server = forkserver.find(ranks.rank_env(), ranks.WORKER_PATH)
    assert server is not None and not server.ready and not server.children  # not ready yet: nothing forked
    assert list(tmp_path.glob(f"{STORE_PREFIX}*")) == []
    with RankPool(2, workdir=tmp_path) as pool:
        assert [rank_tasks.parent_pid(pid) for pid in pool.pids] == [server.proc.pid] * 2


@LINUX
def test_a_forked_rank_that_ends_while_its_server_is_stopped_is_read_from_the_kernel(tmp_path, monkeypatch):
    """The server reaps and reports; stopped, it cannot, and the rank's
    status is read from its zombie: killing and waiting never hang on it."""
    monkeypatch.delenv(forkserver.FORK_ENV, raising=False)
    monkeypatch.setattr(forkserver, "MAX_SERVERS", len(forkserver.servers()) + 1)
    pool = RankPool(2, workdir=tmp_path)
    server = forkserver.find(ranks.rank_env(), ranks.WORKER_PATH)
    assert server is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        rank = pool._procs[1]
        rank.kill()
        assert rank.wait(timeout=30) == -signal.SIGKILL
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        pool.close()


def test_the_rank_start_benchmark_runs(tmp_path):
    """benchmarks/rank_start.py (the figures of design.md's "Starting ranks") still runs, and
    leaves none of its pools' rendezvous folders behind."""
    env = {k: v for k, v in _driver_env().items() if k != forkserver.FORK_ENV}
    env["TMPDIR"] = str(tmp_path)
    run = run_python(str(REPO / "benchmarks" / "rank_start.py"), "--cp", "2", "--reps", "3", env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert not list(tmp_path.glob("rank-start-*")), sorted(p.name for p in tmp_path.iterdir())
    row = run.stdout.splitlines()[-1].split()
    assert row[0] == "2" and len(row) == 6 and all("/" in cell for cell in row[3:]), run.stdout


def test_switches_read_as_booleans_and_anything_else_is_one_line_naming_the_variable(tmp_path, monkeypatch):
    from nsa_cp_comm.harness.switches import env_switch

    for word, value in (("0", False), ("false", False), ("NO", False), ("off", False), ("1", True), ("True", True),
                        ("yes", True), ("ON", True), ("", True)):
        assert env_switch("NSA_CP_COMM_BIND_RANKS", True, {"NSA_CP_COMM_BIND_RANKS": word}) is value, word
    assert env_switch("NSA_CP_COMM_BIND_RANKS", False, {}) is False
    monkeypatch.setenv("NSA_CP_COMM_BIND_RANKS", "flase")
    with pytest.raises(ValueError) as err:
        RankPool(2, workdir=tmp_path)
    assert str(err.value) == ("NSA_CP_COMM_BIND_RANKS='flase': must be one of 0, false, no, off (off) or "
                              "1, true, yes, on (on)")


@LINUX
def test_a_huge_environment_reaches_forked_ranks_by_file(tmp_path, monkeypatch):
    """Nine 120 kB variables: the spawn request names a file, not the
    environment (before: the pickled request was cut at the socket's bound,
    UnpicklingError in the server, every point an error)."""
    monkeypatch.delenv(forkserver.FORK_ENV, raising=False)
    monkeypatch.setattr(forkserver, "MAX_SERVERS", len(forkserver.servers()) + 1)
    for i in range(9):
        monkeypatch.setenv(f"NSA_TEST_BIG_{i}", str(i) * 120_000)
    with RankPool(2, workdir=tmp_path) as pool:
        server = forkserver.find(ranks.rank_env(), ranks.WORKER_PATH)
        assert server is not None and all(rank_tasks.parent_pid(p) == server.proc.pid for p in pool.pids)
        seen = pool.run(rank_tasks.environment_variable, "NSA_TEST_BIG_8", timeout_s=120)
    assert [r.value for r in seen] == ["8" * 120_000] * 2
    assert not list(tmp_path.glob(".rank-env-*"))  # read and removed


@LINUX
def test_a_stopped_fork_server_is_named_and_replaced_and_the_ranks_start_by_exec(tmp_path, monkeypatch, capfd):
    """A SIGSTOPped server fails its health check: one warning line names it,
    the pool's ranks start by exec (children of the starter) and work; a
    fresh server takes its place (before: every later start a StartTimeout
    after twice the start bound)."""
    monkeypatch.delenv(forkserver.FORK_ENV, raising=False)
    monkeypatch.setattr(forkserver, "MAX_SERVERS", len(forkserver.servers()) + 1)
    monkeypatch.setenv("NSA_TEST_STOPPED_SERVER", uuid.uuid4().hex)  # a server of this test's own
    with RankPool(1, workdir=tmp_path / "a"):
        server = forkserver.find(ranks.rank_env(), ranks.WORKER_PATH)
    os.kill(server.proc.pid, signal.SIGSTOP)
    while not server.stopped():  # the signal is delivered asynchronously
        time.sleep(0.01)
    try:
        with RankPool(2, workdir=tmp_path / "b", start_timeout_s=120) as pool:
            assert [rank_tasks.parent_pid(p) for p in pool.pids] == [os.getpid()] * 2
            assert all(r.ok for r in pool.run(rank_tasks.environment_variable, "HOME", timeout_s=60))
    finally:
        with contextlib.suppress(OSError):
            os.kill(server.proc.pid, signal.SIGCONT)
    err = capfd.readouterr().err
    assert f"warning: the rank fork server (pid {server.proc.pid}) does not answer: it is stopped (SIGSTOP?); " \
           "it is replaced, and these ranks start by exec" in err, err
    fresh = forkserver.find(ranks.rank_env(), ranks.WORKER_PATH)
    assert fresh is not None and fresh is not server and server.proc.poll() is not None


@LINUX
def test_installed_packages_are_read_once_per_process_and_forked_ranks_inherit_them(tmp_path, monkeypatch):
    """Each outside implementation's origin names its distribution: reading the installed packages'
    table (every distribution's file list) once per implementation was most of a rank's time at a
    point of eight plug-ins. It is read once per process, and the fork server reads it before it
    forks: a fresh rank holds it before its first task."""
    from nsa_cp_comm import plugins

    monkeypatch.delenv(forkserver.FORK_ENV, raising=False)
    reads = []
    real = plugins.importlib.metadata.packages_distributions
    monkeypatch.setattr(plugins.importlib.metadata, "packages_distributions", lambda: reads.append(1) or real())
    plugins.installed_packages.cache_clear()
    try:
        origins = {plugins.load_reference(f"broken_impls:{name}").origin for name in ("wrong_order", "skips_cp3")}
        assert origins == {"broken_impls (no installed distribution)"} and len(reads) == 1, (origins, reads)
    finally:
        plugins.installed_packages.cache_clear()  # the next reader reads the real table again
    with RankPool(2, workdir=tmp_path) as pool:
        assert [r.value for r in pool.run(rank_tasks.installed_packages_read, timeout_s=60)] == [1, 1]
