"""A bad value, a dead rank, a hung collective or a killed sweep costs
one row, never the run or its data. The cases come from tests/reliability_table.py,
which RELIABILITY.md's tables are rendered from; its other fault rows name their tests."""

from __future__ import annotations

import contextlib
import ast
import errno
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

import matrix.app.sweep as cli
import reliability_table as table
from matrix.app import guards, torchrun_point
from matrix.app.config import ConfigError, register_resolvers, run_folder, validate_overrides
from matrix.app.preflight import points, preflight
from matrix.scale.plans import plan_stats
from matrix.scale.workload import Batches, read_trace
from matrix.store import outputs, samples
from matrix.store.results import append_rows
from matrix_cli import (REPO, cli_env, compose_config, config_of, live_processes, processes_left, read_table,
                        run_matrix, run_python)

# A failure is noticed, not waited out: it ends its point well within this, against
# a 600 s timeout. Loose on purpose: the suite runs on loaded 2-core machines.
NOTICED_WITHIN_S = 60.0


# --- no test leaves a process behind ---------------------------------------------------


def ranks_left(pids: set[int], timeout_s: float = 30.0) -> set[int]:
    """Which of ``pids`` are still live (not zombies) after up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (left := pids & set(live_processes(""))) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def forked_ranks(under: Path) -> set[int]:
    """This process's ranks that its fork servers forked for a rendezvous
    under ``under`` (what an exec'd rank's command line names) and have not
    reported ended."""
    from nsa_cp_comm.harness import forkserver

    for server in forkserver.servers():
        server.drain(0)
    return {pid for server in forkserver.servers() for pid in server.children
            if server.stores.get(pid, "").startswith(str(under))}


@pytest.fixture(autouse=True)
def no_leftover_processes(tmp_path):
    """Every rank process a test starts has its rendezvous file (or results_dir)
    under the test's tmp_path, or (forked in this process) is one its fork
    server reports: none may outlive the test."""
    yield
    from nsa_cp_comm.harness.pools import close_pools

    close_pools()  # warm pools of matrix.app.point.run in this process
    assert processes_left(str(tmp_path)) == {}
    assert ranks_left(forked_ranks(tmp_path)) == set()


# --- bad input: the library ------------------------------------------------------------


@pytest.mark.parametrize("case", table.LIBRARY, ids=lambda c: c.code)
def test_library_bad_input_is_a_one_line_value_error(case):
    with pytest.raises(ValueError) as info:
        eval(case.code, table.namespace())  # noqa: S307 - our own table
    msg = str(info.value)
    assert "\n" not in msg
    assert table.matches(msg, case.expect), msg


def test_round_trip_bad_input_raises_on_every_rank_and_no_rank_hangs(rank_pool):
    results = rank_pool(2).run(table.roundtrip_bad_inputs, timeout_s=60)
    assert [r.status for r in results] == ["ok", "ok"], [(r.status, r.error) for r in results]
    for r in results:
        assert r.value.pop("__in_step__") == "2"  # the all-reduce after the bad calls completed
        for case in table.ROUNDTRIP:
            msg = r.value[case.code]
            assert msg.startswith("ValueError: ") and "\n" not in msg, (r.rank, case.code, msg)
            assert table.matches(msg.removeprefix("ValueError: "), case.expect), (r.rank, msg)


# --- bad input: the CLI ----------------------------------------------------------------

def _args(case: table.CliCase, tmp: Path) -> list[str]:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    too_long = "[" + ",".join(["1"] * 65537) + "]"
    return [a.format(tmp=tmp, too_many=gpus + 1, too_long=too_long, name300="a" * 300) for a in case.args]


def _contents(tmp: Path) -> dict[str, bytes | None]:
    """Every path under ``tmp``, with a regular file's bytes (never a FIFO's or a device's)."""
    return {str(p.relative_to(tmp)): p.read_bytes() if p.is_file() else None for p in tmp.rglob("*")}


def _one_line_exit_2_nothing_written(code: int, out: str, err: str, case, tmp: Path, before: dict) -> str:
    """Exit 2, nothing on stdout, the case's one line on stderr (returned), and
    under ``tmp`` no file written or changed (``before``: its :func:`_contents`)."""
    assert code == 2, (code, err[-2000:])
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and table.matches(lines[0], case.expect), err[:2000]
    assert _contents(tmp) == before, "written under tmp"  # not even a directory; no file changed
    return lines[0]


@pytest.mark.parametrize("case", table.CLI, ids=lambda c: table.cli_doc(c))
def test_cli_bad_input_is_one_line_exit_2_nothing_written(case, tmp_path, capsys, monkeypatch):
    if "/proc/sys" in " ".join(case.args) and os.access("/proc/sys", os.W_OK):
        pytest.skip("/proc/sys is writable here")
    _file_setup(case.setup, tmp_path)
    before = _contents(tmp_path)
    args = _args(case, tmp_path)

    def hydra_started():  # the one line must come before Hydra starts
        raise AssertionError("the Hydra app started")

    monkeypatch.setattr(cli, "task", lambda machine_checked, points=(): hydra_started)
    code = cli.main(["-m", f"results_dir={tmp_path / 'res'}", *args])
    _one_line_exit_2_nothing_written(code, *capsys.readouterr(), case, tmp_path, before)
    # The table says which check catches it: each value alone, or the composed points.
    try:
        validate_overrides(args)
    except ConfigError:
        stage = table.VALUE
    else:
        stage = table.POINT
    assert stage == case.stage


@pytest.mark.parametrize("writes", ["a results folder", "a byte onto results.csv"])
def test_a_refusal_that_wrote_is_caught(writes, tmp_path, capsys, monkeypatch):
    """The nothing-written check sees a refusal that made a folder or changed
    a file before its one line: an app whose preflight writes, then refuses."""
    case = next(c for c in table.CLI if c.setup == ("old/results.csv:old_schema",))
    _file_setup(case.setup, tmp_path)
    before = _contents(tmp_path)
    refuse = cli.preflight

    def preflight_that_writes(argv, **kw):
        if writes == "a results folder":
            (tmp_path / "res").mkdir()
        else:
            with open(tmp_path / "old" / "results.csv", "ab") as f:
                f.write(b"x")
        return refuse(argv, **kw)

    monkeypatch.setattr(cli, "preflight", preflight_that_writes)
    code = cli.main(["-m", *_args(case, tmp_path)])
    with pytest.raises(AssertionError, match="^written under tmp"):
        _one_line_exit_2_nothing_written(code, *capsys.readouterr(), case, tmp_path, before)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a mode-0555 directory")
def test_cli_read_only_results_dir(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    try:
        assert cli.main(["-m", f"results_dir={ro / 'res'}", "cp_size=1"]) == 2
        err = capsys.readouterr().err.splitlines()
        assert err == [f"error: results_dir={ro / 'res'}: {ro} is not a writable directory"]
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


@pytest.mark.parametrize("which", ["seq_lens=[5,0]", "num_experts", "{tmp}/old", "{tmp}/fifo", "{tmp}/null"])
def test_cli_bad_input_through_the_real_cli(which, tmp_path):
    """The same as a user sees it: a fresh process, no traceback, no Hydra output
    (and no wait on a FIFO, no read of /dev/null)."""
    case = next(c for c in table.CLI if which in " ".join(c.args))
    _file_setup(case.setup, tmp_path)
    before = _contents(tmp_path)
    run = run_matrix(tmp_path / "res", *_args(case, tmp_path), timeout=120)
    _one_line_exit_2_nothing_written(run.returncode, run.stdout, run.stderr, case, tmp_path, before)


# --- bad files and output folders: one line, exit 2, before any work --------------------

# A command that hangs on a FIFO or fills the memory from /dev/zero is stopped here.
HANG_GUARD_S = 30


def _workload_yaml(trace: str) -> str:
    return f"name: t\nkind: trace\npath: {trace}\nbudget: 16384\nbatches: 4\nseed: 0\n"


TRACES = {
    "zero": "seq_len\n10\n0\n",
    "superscript": "seq_len\n10\n\u00b2\n",
    "digits": "seq_len\n10\n" + "9" * 5000 + "\n",
    "wide": "h" * 20_000_000 + "\n10\n",
}
NCCL_JSON = {
    "deep": "[" * 200_000,
    "huge": '{"args": ["all_gather_perf"], "config": {"devices": [0, 1]}, '
            '"results": [{"size": 1' + "0" * 400 + ', "in_place": {"time": 1.0}}]}',
}


def mount_tmpfs(where: Path, options: str) -> bool:
    """A small tmpfs at ``where`` (root only); False where none can be mounted."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    return done.returncode == 0


def umount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _file_setup(specs: tuple[str, ...], tmp: Path) -> None:
    for spec in specs:
        name, _, what = spec.partition(":")
        path = tmp / name
        if name == "w.yaml" and what == "kind":
            path.write_text(_workload_yaml("t.csv").replace("kind: trace", "kind: " + "k" * 1_000_000))
        elif name == "w.yaml" and what == "aliases":  # a kilobyte of lists of lists: 10**9 values loaded
            laughs = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
                f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
            path.write_text(_workload_yaml(str(tmp / "t.csv")) + "\n".join(laughs) + "\n")
        elif name == "w.yaml":
            path.write_text(_workload_yaml(what if what.startswith("/") else str(tmp / what)))
        elif name == "fifo" or what == "fifo":
            path.parent.mkdir(parents=True, exist_ok=True)
            os.mkfifo(path)
        elif what == "dev_null":
            path.parent.mkdir()
            path.symlink_to("/dev/null")
        elif what == "old_schema":
            path.parent.mkdir()
            path.write_text("cp_size,page_size,seq_lens,impl,status,roundtrip_p50_us\n2,1,[1000],padded,ok,123.0\n")
        elif name == "file":
            path.write_text("not a directory\n")
        elif name == "res":
            append_rows(path, [{"point_id": "p", "impl": "padded", "status": "ok", "cp_size": 2,
                                "seq_lens": "[10]", "run_id": "run-1"}])
        elif name == "t.csv":
            path.write_text(TRACES[what])
        elif name == "ag.json":
            path.write_text(NCCL_JSON[what])


def _no_work(monkeypatch) -> None:
    """Every file and folder is checked before the work: the work must not start."""
    import matrix.review.compare
    import matrix.scale.plans
    import matrix.review.report

    def work(*a, **k):
        raise AssertionError("the work started before the bad file or folder was found")

    monkeypatch.setattr(matrix.scale.plans, "plan_stats", work)
    monkeypatch.setattr(matrix.review.report, "build", work)
    monkeypatch.setattr(matrix.review.compare, "compare", work, raising=False)


def _command(name: str):
    return importlib.import_module("matrix.__main__" if name == "matrix" else f"matrix.{name}.__main__").main


class _Hung(Exception):
    pass


@pytest.mark.parametrize("case", table.FILES, ids=lambda c: f"{c.command}: {c.doc}")
def test_a_bad_file_or_output_folder_is_one_line_before_any_work(case, tmp_path, capsys, monkeypatch):
    if case.needs == "proc_sys":
        try:
            fd, name = tempfile.mkstemp(dir="/proc/sys")
        except OSError:
            pass
        else:
            os.close(fd)
            os.unlink(name)
            pytest.skip("/proc/sys is writable here")
    mounted = None
    if case.needs == "ro_mount":
        if not mount_tmpfs(tmp_path / "ro", "ro,size=64k"):
            pytest.skip("no tmpfs can be mounted here (needs root)")
        mounted = tmp_path / "ro"
    if case.needs == "full_mount":
        if not mount_tmpfs(tmp_path / "full", "size=64k"):
            pytest.skip("no tmpfs can be mounted here (needs root)")
        mounted = tmp_path / "full"
        with contextlib.suppress(OSError), open(mounted / "filler", "wb") as f:  # until it is full
            f.write(b"\0" * (1 << 20))
    try:
        _file_setup(case.setup, tmp_path)
        before = _contents(tmp_path)
        _no_work(monkeypatch)
        args = [a.replace("{tmp}", str(tmp_path)) for a in case.args]

        def hung(*_):
            raise _Hung

        old = signal.signal(signal.SIGALRM, hung)
        signal.alarm(HANG_GUARD_S)
        try:
            code = _command(case.command)(args)
        except _Hung:
            pytest.fail(f"still reading after {HANG_GUARD_S} s (a FIFO waited on, or /dev/zero read)")
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        line = _one_line_exit_2_nothing_written(code, *capsys.readouterr(), case, tmp_path, before)
        assert len(line) < 1100  # matrix.store.inputs.ERROR_CHARS_MAX and the stated length
    finally:
        if mounted is not None:
            umount(mounted)


def test_a_trace_with_a_byte_order_mark_reads(tmp_path):
    (tmp_path / "t.csv").write_bytes(b"\xef\xbb\xbfseq_len,batch\r\n10,a\r\n20,a\r\n")
    lens, sizes = read_trace(tmp_path / "t.csv", 100)
    assert lens.tolist() == [10, 20] and sizes.tolist() == [2]


def test_a_batch_id_that_comes_back_is_one_batch(tmp_path, capsys):
    """``a, b, a`` used to be three batches: ``[10, 30]`` never appeared and the
    padding statistics changed."""
    (tmp_path / "t.csv").write_text("seq_len,batch\n10,a\n20,b\n30,a\n")
    lens, sizes = read_trace(tmp_path / "t.csv", 100)
    assert (lens.tolist(), sizes.tolist()) == ([10, 30, 20], [2, 1])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"note: workload.path={tmp_path / 't.csv'}: batch 'a' comes back")
    (tmp_path / "c.csv").write_text("seq_len,batch\n10,a\n30,a\n20,b\n")
    same = plan_stats(Batches(*read_trace(tmp_path / "c.csv", 100)), 2, "zigzag")
    got = plan_stats(Batches(lens, sizes), 2, "zigzag")
    assert got["total"].tolist() == same["total"].tolist() == [40, 20]
    assert all(got["rows"][d].tolist() == same["rows"][d].tolist() for d in got["rows"])
    assert capsys.readouterr().err == ""  # contiguous batches: no note


def test_a_workload_file_by_absolute_path_runs(tmp_path, capsys):
    """The error text offers "or a .yaml path"; Hydra used to look for conf/workload//x.yaml."""
    (tmp_path / "t.csv").write_text("seq_len,batch\n100,a\n200,a\n300,b\n")
    (tmp_path / "w.yaml").write_text(_workload_yaml(str(tmp_path / "t.csv")).replace("batches: 4", "batches: 8"))
    assert cli.main(["--dry-run", f"workload={tmp_path / 'w.yaml'}", f"results_dir={tmp_path / 'res'}"]) == 0
    out, err = capsys.readouterr()
    assert "estimate: 2 points" in out and "seq_lens=[300]" in out, (out, err)  # the batches [100, 200] and [300]
    assert not (tmp_path / "res").exists()


def test_the_resume_hint_of_a_workload_sweep_names_the_workload_file(tmp_path, capsys, monkeypatch):
    """The hint used to repeat the expanded seq_lens (refused with workload=) and
    the name Hydra was given for the file (unknown to a new process)."""
    (tmp_path / "t.csv").write_text("seq_len\n100\n")
    (tmp_path / "w.yaml").write_text(_workload_yaml(str(tmp_path / "t.csv")))

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "task", lambda machine_checked, points=(): interrupted)
    monkeypatch.setattr(guards, "install", lambda: None)
    monkeypatch.setattr(guards, "guard", lambda: None)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")
    assert cli.main([f"workload={tmp_path / 'w.yaml'}", f"results_dir={tmp_path / 'res'}"]) == 130
    hint = capsys.readouterr().err.strip().splitlines()[-1]
    assert hint == (f"interrupted; finish the sweep with: python -m matrix workload={tmp_path / 'w.yaml'} "
                    f"results_dir={tmp_path / 'res'} resume=true"), hint


def test_hydra_records_go_to_a_folder_per_command(tmp_path):
    """Two sweeps into one results_dir overwrote each other's multirun.yaml and
    job records (results_dir/0/.hydra)."""
    cfg = compose_config(f"results_dir={tmp_path}")
    folder = str(tmp_path / "hydra" / run_folder())
    assert (cfg.hydra.sweep.dir, cfg.hydra.run.dir) == (folder, folder)
    assert run_folder().endswith(f"-{os.getpid()}")  # another process: another folder


def _full_disk(tmp_path: Path, free: int) -> Path:
    """A tmpfs with about ``free`` bytes left (skipped where none can be mounted)."""
    where = tmp_path / "full"
    if not mount_tmpfs(where, "size=256k"):
        pytest.skip("no tmpfs can be mounted here (needs root)")
    st = os.statvfs(where)
    (where / "filler").write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - free))
    return where


@pytest.mark.parametrize("command, free", [("plans", 8 << 10), ("report", 16 << 10)])  # plans.json fits, no plot
def test_out_on_a_full_disk_is_one_line_and_leaves_no_partial_file(command, free, tmp_path, capsys, monkeypatch):
    from matrix.store import outputs

    _file_setup(("res",), tmp_path)
    disk = _full_disk(tmp_path, free)
    plans = ["--batches", "20", "--cp", "8", "--engine", "seed_fix", "--policy", "zigzag"]
    args = plans if command == "plans" else [str(tmp_path / "res")]
    try:
        # refused up front, under the free space every output folder must have ...
        assert _command(command)([*args, "--out", str(disk / "out")]) == 2
        assert "filesystem has" in capsys.readouterr().err
        # ... and a disk that fills while the command writes (let past that check) is one line too
        monkeypatch.setattr(outputs, "MIN_FREE_BYTES", 0)
        assert _command(command)([*args, "--out", str(disk / "out")]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: --out={disk / 'out'}: cannot write "), err
        assert "No space left on device" in err[0]
        left = sorted(p.name for p in (disk / "out").iterdir())
        assert not any(name.endswith(".tmp") or name.startswith(".") for name in left), left
        for name in left:  # whole files or none, never a truncated one
            data = (disk / "out" / name).read_bytes()
            assert data.endswith(b"IEND\xaeB`\x82") if name.endswith(".png") else data, name
        assert command != "plans" or left == ["plans.json"]  # no PNG
    finally:
        umount(disk)


def test_write_atomic_on_a_full_disk_leaves_the_old_file(tmp_path, monkeypatch):
    """Without a mountable tmpfs: the write fails half way, as on a full disk."""
    target = tmp_path / "plot.png"
    target.write_bytes(b"old")
    real = os.fdopen

    class Half:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(outputs.os, "fdopen", lambda fd, mode: Half(real(fd, mode)))
    with pytest.raises(OSError) as info:
        outputs.write_atomic(target, b"new data")
    assert info.value.errno == errno.ENOSPC and str(target) in str(info.value)
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]


def test_a_full_disk_while_writing_samples_names_the_file(tmp_path, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(samples.os, "write", full)
    with pytest.raises(OSError) as info:
        samples.append_samples(tmp_path, [{"point_id": "p", "impl": "padded", "timestamp": "t"}],
                               [{"roundtrip": [1.0], "control": [1.0]}])
    monkeypatch.undo()
    msg = str(info.value)
    assert info.value.errno == errno.ENOSPC and str(tmp_path / "samples.jsonl") in msg, msg
    assert "\n" not in msg and (tmp_path / "samples.jsonl").read_bytes() == b""


# --- injected faults: one row each, nothing left behind, the next point runs -------------


def _point_cfg(tmp_path: Path, **over) -> dict:
    return config_of(**{"cp_size": 2, "seq_lens": [64], "hidden_size": 32, "iters": 2, "warmup": 0, "impl": "padded",
                        "results_dir": str(tmp_path / "res"), **over})


@pytest.mark.parametrize("fault", list(table.POOL_FAULTS))
def test_injected_fault_costs_one_row(fault, tmp_path):
    from matrix.app.point import run
    from nsa_cp_comm.harness.pools import get_pool

    timeout_s, status, reason = table.POOL_FAULTS[fault]
    job = tmp_path / "job"
    # timeout_s counts once the ranks are up: start them first (as an earlier point of the sweep would).
    started = set(get_pool(2, backend="gloo", device="cpu", workdir=job).pids)
    t0 = time.monotonic()
    impl = f"{table.BROKEN}:{fault}"
    (row,) = run(_point_cfg(tmp_path, impl=impl, timeout_s=timeout_s), job_dir=job)
    took = time.monotonic() - t0
    assert row["status"] == status and table.matches(row["reason"], reason), (row["status"], row["reason"])
    bound = (timeout_s if status == "timeout" else 0) + NOTICED_WITHIN_S
    assert took < bound and row["wall_s"] < bound, (took, row["wall_s"])
    if status == "timeout":
        assert took >= timeout_s, took
    assert processes_left(str(job)) == {} and ranks_left(started) == set()  # killed and reaped
    # The next point of the sweep runs normally, on fresh ranks.
    (nxt,) = run(_point_cfg(tmp_path, seq_lens=[100]), job_dir=job)
    assert nxt["status"] == "ok" and nxt["correct"] is True, nxt["reason"]
    rows = read_table(tmp_path / "res" / "results.csv")
    # A plug-in loaded by reference is recorded under its declared name.
    assert [(r["impl"], r["status"]) for r in rows] == [(fault, status), ("padded", "ok")]


def _wait_rows(path: Path, at_least: int, proc: subprocess.Popen, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists():
            n = path.read_bytes().count(b"\n") - 1
            if n >= at_least:
                return n
        time.sleep(0.01)
    return -1


def test_sigkill_mid_sweep_then_resume_completes_it(tmp_path):
    from matrix.app.point import point_id

    res = tmp_path / "res"
    sweep = ["cp_size=1,2", "seq_lens=[64],[100],[1000],[1001,300],[37,512]", "hidden_size=32", "iters=2",
             "warmup=0", "impl=both"]
    every = {point_id(cfg) for cfg, _ in points(["-m", f"results_dir={res}", *sweep])}
    assert len(every) == 10
    cmd = [sys.executable, "-m", "matrix", "-m", f"results_dir={res}", *sweep]
    proc = subprocess.Popen(cmd, cwd=REPO, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        got = _wait_rows(res / "results.csv", 2, proc, timeout_s=120)
        # exec'd ranks name the results folder; the fork server and the ranks it forked name the sweep
        server = f"_worker.py fork-server {proc.pid} "
        running = [*live_processes(str(res)).values(), *live_processes(server).values()]
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert got > 0, "the sweep wrote no row (or ended) before the kill"
    assert any("nsa_cp_comm/harness/_worker.py" in p for p in running), running  # its ranks were up
    # Its ranks die with it (PR_SET_PDEATHSIG, through the fork server): nothing of the run survives.
    assert processes_left(str(res)) == {} and processes_left(server) == {}
    rows = read_table(res / "results.csv")
    done = {r["point_id"] for r in rows}
    assert 0 < len(done) < len(every), "kill the sweep midway"
    assert sorted((r["point_id"], r["impl"]) for r in rows) == sorted((p, i) for p in done for i in ("padded", "legacy"))

    again = run_matrix(res, *sweep, "resume=true")
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.count("already in results, not rerun (resume=true)") == len(done), again.stdout
    rows = read_table(res / "results.csv")
    keys = [(r["point_id"], r["impl"]) for r in rows]
    assert len(keys) == len(set(keys)), "a point written twice"
    assert {p for p, _ in keys} == every, "a point missing"
    assert len(keys) == 2 * len(every)
    assert {r["status"] for r in rows} <= {"ok", "refused"}  # legacy refuses the uneven plans


# --- torchrun: one point on ranks torchrun started --------------------------------------


def _torchrun(tmp_path: Path, *overrides: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_python("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                      "-m", "matrix.torchrun_point", "cp_size=2", "hidden_size=32", "iters=2", "warmup=0",
                      f"results_dir={tmp_path / 'res'}", *overrides, env=cli_env(OMP_NUM_THREADS="1"), timeout=timeout)


def test_torchrun_point_writes_the_rows(tmp_path):
    run = _torchrun(tmp_path, "seq_lens=[1001,300]")
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {r["impl"]: r for r in read_table(tmp_path / "res" / "results.csv")}
    assert set(rows) == {"padded", "legacy"}
    padded, legacy = rows["padded"], rows["legacy"]
    assert padded["status"] == "ok" and padded["correct"] == "True" and float(padded["roundtrip_p50_us"]) > 0
    assert padded["padded_total"] == "1304" and padded["backend"] == "gloo"
    assert legacy["status"] == "refused" and "output tensor size must be equal" in legacy["reason"], legacy["reason"]
    assert "[matrix] cp=2 zigzag seq_lens=[1001, 300]" in run.stdout
    (line,) = (tmp_path / "res" / "runs.jsonl").read_text().splitlines()  # rank 0's run, once
    assert {padded["run_id"], legacy["run_id"]} == {json.loads(line)["run_id"]}


@pytest.mark.parametrize("fault", list(table.TORCHRUN_FAULTS))
def test_torchrun_fault_costs_one_row(fault, tmp_path):
    timeout_s, status, reason = table.TORCHRUN_FAULTS[fault]
    run = _torchrun(tmp_path, "seq_lens=[64]", f"impl={table.BROKEN}:{fault}", f"timeout_s={timeout_s:g}")
    assert run.returncode == 1, run.stderr[-3000:]
    (row,) = read_table(tmp_path / "res" / "results.csv")
    assert row["status"] == status and table.matches(row["reason"], reason), (row["status"], row["reason"])
    # Once the ranks are up, a failure is noticed, not waited out; a hang ends at timeout_s.
    bound = (timeout_s if status == "timeout" else 0) + NOTICED_WITHIN_S
    assert float(row["wall_s"]) < bound, row["wall_s"]


@pytest.mark.parametrize("rank", [0, 1])
def test_torchrun_point_refuses_a_world_that_is_not_cp_size(rank, tmp_path, capsys, monkeypatch):
    """Checked on every rank before any rendezvous: no rank waits for the others."""
    for key, value in dict(RANK=rank, WORLD_SIZE=2, LOCAL_WORLD_SIZE=2, LOCAL_RANK=rank).items():
        monkeypatch.setenv(key, str(value))
    assert torchrun_point.main(["cp_size=3", f"results_dir={tmp_path / 'res'}"]) == 2
    want = ["error: cp_size=3: torchrun started 2 ranks (nnodes x nproc-per-node); they must be equal"]
    assert capsys.readouterr().err.splitlines() == (want if rank == 0 else [])
    assert torchrun_point.main(["cp_size=2,4"]) == 2
    want = ["error: cp_size=2,4: one point per torchrun run, no sweeps"]
    assert capsys.readouterr().err.splitlines() == (want if rank == 0 else [])
    assert not (tmp_path / "res").exists()


def test_torchrun_point_needs_torchrun(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert torchrun_point.main(["cp_size=2"]) == 2
    assert capsys.readouterr().err.startswith("error: WORLD_SIZE is not set: start this module with torchrun")


# --- SLURM: the launcher preset composes (no SLURM needed) -----------------------------


SUBMITIT = "hydra_plugins.hydra_submitit_launcher"


def _need_submitit():
    pytest.importorskip(SUBMITIT, reason="hydra-submitit-launcher is not installed (pip install -e '.[slurm]')")


@pytest.mark.parametrize("overrides, gpus, minutes", [
    ((), 2, 12),
    (("cp_size=4", "timeout_s=3000"), 4, 60),
    (("+matrix=deepseek_v32",), 8, 20),  # cp_size and timeout_s from the preset
])
def test_slurm_launcher_preset_composes(overrides, gpus, minutes):
    _need_submitit()
    from hydra.utils import instantiate

    cfg = compose_config("hydra/launcher=slurm", *overrides)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == f"{SUBMITIT}.submitit_launcher.SlurmLauncher"
    assert (launcher.gpus_per_node, launcher.timeout_min) == (gpus, minutes)
    assert (launcher.nodes, launcher.tasks_per_node) == (1, 1)
    for key in ("partition", "account", "qos", "constraint"):
        assert key in launcher  # site-specific, overridable
    built = instantiate(launcher)  # the launcher object, without submitting anything
    assert type(built).__name__ == "SlurmLauncher" and built.params["gpus_per_node"] == gpus


def test_slurm_request_covers_the_largest_point_of_a_sweep():
    """A job array has one request: the sweep's largest cp_size and timeout_s,
    from the command line over the preset's sweeper params."""
    register_resolvers()
    cfg = OmegaConf.create({
        "cp_size": 2, "timeout_s": 120.0,
        "hydra": {"sweeper": {"params": {"cp_size": "8", "seq_lens": "[1],[2]"}},
                  "overrides": {"task": ["cp_size=1,4,2", "timeout_s=30,600"]}},
        "gpus": "${matrix.sweep_max:cp_size}", "minutes": "${matrix.job_minutes:${matrix.sweep_max:timeout_s}}",
    })
    assert (cfg.gpus, cfg.minutes) == (4, 20)
    cfg.hydra.overrides.task = []
    assert (cfg.gpus, cfg.minutes) == (8, 12)


def test_slurm_request_counts_the_ranks_a_swept_group_and_bystanders_add():
    """The conformance preset sets cp_size through a swept group (its
    ``largest`` option resolved per point, on the node) and sweeps
    bystanders: a GPU per rank of its largest world, not the primary
    config's cp_size."""
    register_resolvers()
    slurm = yaml.safe_load((REPO / "conf" / "hydra" / "launcher" / "slurm.yaml").read_text())
    params = yaml.safe_load((REPO / "conf" / "matrix" / "conformance.yaml").read_text())["hydra"]["sweeper"]["params"]
    cfg = OmegaConf.create({"cp_size": 2, "bystanders": 0, "gpus": slurm["gpus_per_node"],
                            "hydra": {"sweeper": {"params": params}, "overrides": {"task": []}}})
    assert cfg.gpus == 8 + 1  # largest cp, plus a bystander
    cfg.hydra.overrides.task = ["+conformance_cp=cp2,cp3", "bystanders=0"]
    assert cfg.gpus == 3
    cfg.hydra.sweeper.params = {}
    cfg.hydra.overrides.task = ["cp_size=1,4"]
    assert cfg.gpus == 4


def test_remote_launcher_leaves_the_machine_check_to_the_job(tmp_path):
    """The submit host has no GPUs: an nccl sweep for SLURM passes the preflight
    (each job checks its own node); a bad value is still refused."""
    _need_submitit()
    argv = ["-m", "hydra/launcher=slurm", "+matrix=deepseek_v32", "backend=nccl", f"results_dir={tmp_path / 'r'}"]
    assert len(preflight(argv)) == 8
    with pytest.raises(ConfigError, match=r"^num_experts=7: must be a multiple of cp_size=8"):
        preflight([*argv, "num_experts=7"])
    assert not (tmp_path / "r").exists()


# --- RELIABILITY.md's written fault rows each name a test ----------------------------------

# A fault row's last cell: the pytest node id of the test that checks it.
NODE_ID = re.compile(r"^\|.*\| `(tests/[\w/]+\.py)::(\w+)` \|$", re.M)


def named_tests_missing(doc: str) -> tuple[int, list[str]]:
    """How many rows of ``doc`` name a test, and the named tests that do not exist."""
    named = NODE_ID.findall(doc)
    defined = {path: {n.name for n in ast.parse((REPO / path).read_text()).body if isinstance(n, ast.FunctionDef)}
               for path in {path for path, _ in named} if (REPO / path).is_file()}
    return len(named), [f"{path}::{test}" for path, test in named if test not in defined.get(path, ())]


def test_every_fault_row_names_an_existing_test():
    rows, missing = named_tests_missing((REPO / "RELIABILITY.md").read_text())
    assert rows >= 65 and missing == []


def test_a_fault_row_naming_a_missing_test_is_found():
    doc = (REPO / "RELIABILITY.md").read_text()
    renamed = doc.replace("::test_sigkill_mid_sweep_then_resume_completes_it`", "::test_sigkill_mid_sweep`")
    moved = doc.replace("tests/harness/test_blame.py::", "tests/app/test_blame.py::")
    assert named_tests_missing(renamed)[1] == ["tests/app/test_hardening.py::test_sigkill_mid_sweep"]
    timed = "test_timed_forms_that_break_the_ranks_are_diagnosed"
    assert named_tests_missing(moved)[1] == ["tests/app/test_blame.py::" + t for t in (
        "test_a_raising_implementation_costs_its_own_row", timed, timed)]
