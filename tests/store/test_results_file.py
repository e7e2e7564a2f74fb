"""The results file under hostile conditions: torn lines, full disks, bad
paths, bytes that are not UTF-8, and what resume reruns."""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from matrix.store import results
from matrix.store.folder import Folder, completed_point_ids, latest_rows
from matrix.store.results import (COLUMNS, ResultsPathError, ResultsWriteError, SchemaError, append_rows, check_schema,
                                  read_header, results_path, torn_path)
from matrix.store.runs import read_runs
from matrix.store.samples import read_samples

from matrix_cli import read_table, run_python


def row(pid: str, status: str = "ok", impl: str = "padded", reason: str = "") -> dict[str, object]:
    return {"point_id": pid, "impl": impl, "status": status, "reason": reason, "seq_lens": "[1001,300]"}


# --- torn and unterminated last lines ----------------------------------------------------


@pytest.mark.parametrize("cut", ["in_a_quote", "bare_cr"])
def test_append_after_a_torn_last_line_sets_it_aside_and_stays_valid_csv(tmp_path, capsys, cut):
    append_rows(tmp_path, [row("a")])
    path = results_path(tmp_path)
    whole = path.read_bytes()
    line = results._render([row("b")], header=False).encode()
    if cut == "in_a_quote":
        # a write cut inside a quoted field: gluing the next row onto it would
        # swallow that row into the open quote
        torn = line[: line.index(b'"') + 4]
        assert torn.count(b'"') == 1
    else:  # bytes csv cannot read at all (a carriage return inside an unquoted field)
        torn = b"b\rc," + line[:20]
    path.write_bytes(whole + torn)
    append_rows(tmp_path, [row("c")])
    assert [r["point_id"] for r in read_table(path)] == ["a", "c"]
    assert path.read_bytes().startswith(whole)
    assert torn_path(path).read_bytes() == torn + b"\n"
    err = capsys.readouterr().err.splitlines()
    assert err == [f"warning: {path} ended in a torn line ({len(torn)} bytes); it was moved to {torn_path(path)}"]


def test_append_after_an_unterminated_whole_row_starts_a_new_line(tmp_path, capsys):
    append_rows(tmp_path, [row("a")])
    path = results_path(tmp_path)
    path.write_bytes(path.read_bytes().rstrip(b"\n"))  # e.g. written by another tool
    append_rows(tmp_path, [row("b")])
    assert [r["point_id"] for r in read_table(path)] == ["a", "b"]
    assert not torn_path(path).exists()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("content, header_kept", [
    (",".join(COLUMNS[:3]), False),  # a torn first write: part of the header
    (",".join(COLUMNS), True),  # the whole header, no newline
])
def test_append_to_a_file_without_a_whole_line(tmp_path, content, header_kept):
    path = results_path(tmp_path)
    path.write_text(content)
    assert read_header(path) is None
    check_schema(path)  # not another schema: nothing was written yet
    append_rows(tmp_path, [row("a")])
    assert [r["point_id"] for r in read_table(path)] == ["a"]
    assert torn_path(path).exists() != header_kept


# --- failed writes leave the file as it was ----------------------------------------------

# append_rows in a process whose files may not grow past argv[2] bytes: the
# kernel's short write, then EFBIG, as on a disk that fills mid-write.
FSIZE_SCRIPT = """
import resource, signal, sys
from matrix.store.results import ResultsWriteError, append_rows
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    append_rows(sys.argv[1], [{"point_id": "big", "impl": "padded", "status": "ok", "reason": "x" * 4000}])
except ResultsWriteError as exc:
    print(f"{exc.errno}|{exc}")
else:
    print("written")
"""


@pytest.mark.parametrize("torn", [False, True])
def test_a_short_write_leaves_the_files_exactly_as_they_were(tmp_path, torn):
    append_rows(tmp_path, [row("a")])
    path = results_path(tmp_path)
    if torn:
        path.write_bytes(path.read_bytes() + b'2,1,"[10')
    before = path.read_bytes()
    run = run_python("-c", FSIZE_SCRIPT, str(tmp_path), str(len(before) + 100), timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    code, _, msg = run.stdout.strip().partition("|")
    assert code == "None", run.stdout
    written = 100 + (8 if torn else 0)  # the torn line was cut off first
    assert msg.startswith(f"cannot append to {path}: short write ({written} of "), msg
    assert msg.endswith(" bytes; is the disk full?); the file is as it was before this point"), msg
    assert path.read_bytes() == before
    if torn:
        assert torn_path(path).read_bytes() == b""  # the set-aside was undone too


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_raises_results_write_error_naming_the_file(tmp_path, monkeypatch):
    def full_disk(fd: int, data: bytes) -> int:  # every write: ENOSPC
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(results.os, "write", full_disk)
    with pytest.raises(ResultsWriteError) as info:
        append_rows(tmp_path, [row("a")])
    exc = info.value
    assert isinstance(exc, OSError) and exc.errno == errno.ENOSPC
    assert str(exc) == (f"cannot append to {tmp_path / 'results.csv'}: No space left on device; "
                        "the file is as it was before this point")


def test_an_error_after_setting_a_torn_line_aside_restores_both_files(tmp_path, monkeypatch):
    append_rows(tmp_path, [row("a")])
    path = results_path(tmp_path)
    path.write_bytes(path.read_bytes() + b'2,1,"[10')
    before = path.read_bytes()
    real_write = os.write
    results_fd: list[int] = []

    def failing_write(fd: int, data: bytes) -> int:
        if os.path.realpath(f"/proc/self/fd/{fd}") == str(path) and not results_fd:
            results_fd.append(fd)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(results.os, "write", failing_write)
    with pytest.raises(ResultsWriteError, match="No space left on device"):
        append_rows(tmp_path, [row("b")])
    assert path.read_bytes() == before
    assert torn_path(path).read_bytes() == b""


# --- paths that cannot hold the file: one line ----------------------------------------------


def _one_line(exc: BaseException) -> str:
    msg = str(exc)
    assert "\n" not in msg
    return msg


def test_results_path_that_is_a_directory(tmp_path):
    results_path(tmp_path).mkdir()
    for call in (lambda: append_rows(tmp_path, [row("a")]), lambda: completed_point_ids(tmp_path),
                 lambda: check_schema(results_path(tmp_path))):
        with pytest.raises(ResultsPathError) as info:
            call()
        assert _one_line(info.value) == f"results_dir={tmp_path}: {results_path(tmp_path)} is a directory, not a results file"
    assert isinstance(info.value, SchemaError)  # the CLI's one-line class


def test_results_path_with_a_name_too_long(tmp_path):
    long_dir = tmp_path / ("x" * 300)
    with pytest.raises(ResultsPathError) as info:
        append_rows(long_dir, [row("a")])
    assert _one_line(info.value) == f"results_dir={long_dir}: a name in the path is too long for the file system"
    with pytest.raises(ResultsPathError, match="too long"):
        completed_point_ids(long_dir)  # resume=true reads it first


def test_results_path_below_a_regular_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ResultsPathError, match=r"^results_dir=.*/file/res: a component of .* is not a directory$"):
        append_rows(tmp_path / "file" / "res", [row("a")])


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a mode-0555 directory")
def test_results_path_in_a_read_only_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    try:
        with pytest.raises(ResultsPathError, match=r"is not writable \(Permission denied\)$"):
            append_rows(ro, [row("a")])
    finally:
        ro.chmod(0o755)


@pytest.mark.skipif(os.access("/proc/sys", os.W_OK), reason="/proc/sys is writable here")
def test_results_path_where_nothing_can_be_created():
    with pytest.raises(ResultsPathError) as info:
        append_rows("/proc/sys/matrix-results", [row("a")])
    assert _one_line(info.value).startswith("results_dir=/proc/sys/matrix-results: ")


# --- resume: what counts as done ------------------------------------------------------------


def test_resume_reruns_points_whose_latest_rows_errored_or_timed_out(tmp_path):
    append_rows(tmp_path, [row("ok1"), row("ok1", impl="legacy", status="refused")])
    append_rows(tmp_path, [row("err", status="error"), row("err", impl="legacy", status="error")])
    append_rows(tmp_path, [row("late", status="timeout")])
    append_rows(tmp_path, [row("fixed", status="timeout")])
    append_rows(tmp_path, [row("fixed", status="ok")])  # the rerun after a resume
    append_rows(tmp_path, [row("broke", status="ok")])
    append_rows(tmp_path, [row("broke", status="error")])  # a later rerun that errored
    append_rows(tmp_path, [row("kept", status=s, impl=s) for s in ("failed", "skipped", "passthrough")])
    assert completed_point_ids(tmp_path) == {"ok1", "fixed", "kept"}


def test_resume_reads_a_file_with_bytes_that_are_not_utf8(tmp_path):
    append_rows(tmp_path, [row("a", reason="caf\u00e9")])
    path = results_path(tmp_path)
    path.write_bytes(path.read_bytes().replace("caf\u00e9".encode(), b"caf\xe9\xff"))
    append_rows(tmp_path, [row("b")])
    assert completed_point_ids(tmp_path) == {"a", "b"}


def _quote_row_b(results_dir: Path, ids: str) -> tuple[Path, str]:
    """The results file of one row per letter of ``ids``, row b (line 3) given
    a ``"`` that is never closed; returns the file and that line."""
    append_rows(results_dir, [row(pid) for pid in ids])
    path = results_path(results_dir)
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = lines[2].replace(",b,", ',"b,', 1)
    path.write_text("".join(lines))
    return path, lines[2]


def test_a_stray_quote_sets_its_line_aside_and_merges_no_rows(tmp_path, capsys):
    """One ``"`` in a middle row used to join the rows after it into one record
    (a fake point, and the real one called "already in results")."""
    path, _ = _quote_row_b(tmp_path, "abcd")
    read = results.read_rows(path)
    assert [r["point_id"] for _, r in read.rows] == ["a", "c", "d"]
    assert read.malformed == [3]
    assert completed_point_ids(tmp_path) == {"a", "c", "d"}  # b runs again
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1 malformed row(s) set aside (line 3)" in err[0], err


def test_resume_moves_malformed_lines_aside_so_pandas_reads_the_file(tmp_path, capsys):
    """Resume used to leave a line with a stray quote in results.csv and append
    after it: the project's readers skipped it, ``pandas.read_csv`` failed."""
    import pandas as pd

    path, bad = _quote_row_b(tmp_path, "abc")
    assert completed_point_ids(tmp_path) == {"a", "c"}
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(f"1 malformed row(s) set aside (line 3): not whole rows of this schema; "
                                             f"moved to {torn_path(path)}"), err
    assert torn_path(path).read_text() == bad
    append_rows(tmp_path, [row("b")])  # the rerun
    frame = pd.read_csv(path)
    assert frame["point_id"].tolist() == ["a", "c", "b"]
    assert [r["point_id"] for r in read_table(path)] == ["a", "c", "b"]
    assert completed_point_ids(tmp_path) == {"a", "b", "c"} and capsys.readouterr().err == ""


def test_a_resume_that_cannot_rewrite_leaves_both_files_as_they_were(tmp_path, monkeypatch, capsys):
    path, _ = _quote_row_b(tmp_path, "ab")
    before = path.read_bytes()

    def full(p, data):
        raise OSError(errno.ENOSPC, f"cannot write {p}: No space left on device")

    monkeypatch.setattr(results, "write_atomic", full)
    assert completed_point_ids(tmp_path) == {"a"}
    assert path.read_bytes() == before and torn_path(path).read_bytes() == b""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "they stay in the file: cannot rewrite it" in err[0], err


def test_an_append_waiting_on_the_lock_follows_a_rewrite(tmp_path, monkeypatch):
    """A sweep appending while a resume rewrote the file: its rows go to the new file."""
    path, _ = _quote_row_b(tmp_path, "ab")
    real = results._open_for_append
    opened = []

    def open_then_rewrite(p):
        fd = real(p)
        opened.append(fd)
        if len(opened) == 1:  # this append opened the old file; a resume rewrites it before the lock is taken
            monkeypatch.setattr(results, "_open_for_append", real)
            results.set_aside_malformed(p)
            monkeypatch.setattr(results, "_open_for_append", open_then_rewrite)
        return fd

    monkeypatch.setattr(results, "_open_for_append", open_then_rewrite)
    append_rows(tmp_path, [row("c")])
    assert len(opened) == 2  # opened again: the name held another file once locked
    assert [r["point_id"] for r in read_table(path)] == ["a", "c"]


@pytest.mark.parametrize("damage", ["missing_field", "extra_field", "bad_status", "bad_cp_size", "bad_hidden_size",
                                    "bad_dtype", "bad_engine"])
def test_a_row_of_the_wrong_shape_or_types_is_set_aside(tmp_path, damage):
    append_rows(tmp_path, [row("a"), {**row("b"), "cp_size": 2}, row("c")])
    path = results_path(tmp_path)
    lines = path.read_text().splitlines(keepends=True)
    fields = next(csv.reader([lines[2]]))
    if damage == "missing_field":
        del fields[COLUMNS.index("reason")]
    elif damage == "extra_field":
        fields.append("x")
    elif damage == "bad_status":
        fields[COLUMNS.index("status")] = "1001"
    elif damage in ("bad_dtype", "bad_engine"):  # outside the column's values
        fields[COLUMNS.index(damage[4:])] = {"bad_dtype": "float99", "bad_engine": "vllm_9"}[damage]
    elif damage == "bad_hidden_size":  # no cast takes it: the readers' one rule for integer cells
        fields[COLUMNS.index("hidden_size")] = "1e400"
    else:
        fields[COLUMNS.index("cp_size")] = "[1001"
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(fields)
    lines[2] = buf.getvalue()
    path.write_text("".join(lines))
    read = results.read_rows(path)
    assert [r["point_id"] for _, r in read.rows] == ["a", "c"] and read.malformed == [3]


def test_a_long_reason_is_cut_with_its_length_and_kept_whole_beside(tmp_path):
    """A 229 KB error message (a compiler log) made a row no reader could read."""
    long = "E" * 229_000
    append_rows(tmp_path, [row("a", status="error", reason=long)])
    cell = latest_rows(tmp_path)["a"]["padded"]["reason"]
    assert len(cell) <= results.MAX_CELL_CHARS
    assert "[cut: 229000 characters; the whole text is in results.full-text.jsonl]" in cell
    kept = [json.loads(x) for x in (tmp_path / results.FULL_TEXT_FILE).read_text().splitlines()]
    assert kept == [{"point_id": "a", "impl": "padded", "column": "reason", "chars": 229_000, "text": long}]
    assert completed_point_ids(tmp_path) == set()  # readable: the error point runs again


def test_a_configuration_cell_over_the_csv_modules_limit_reads_back(tmp_path):
    """Configuration columns are not cut (they are the key): the readers accept
    any row the writer can write, past the csv module's default 131072."""
    seq = "[" + ",".join(["1000"] * 40_000) + "]"
    append_rows(tmp_path, [{**row("a"), "seq_lens": seq}])
    assert latest_rows(tmp_path)["a"]["padded"]["seq_lens"] == seq
    assert completed_point_ids(tmp_path) == {"a"}
    code = "import csv,sys; csv.field_size_limit(131072); list(csv.reader(open(sys.argv[1])))"
    refused = subprocess.run([sys.executable, "-c", code, str(results_path(tmp_path))], capture_output=True)
    assert refused.returncode != 0  # the limit these rows need lifted


def test_a_byte_order_mark_is_read_past(tmp_path):
    append_rows(tmp_path, [row("a")])
    path = results_path(tmp_path)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    check_schema(path)
    append_rows(tmp_path, [row("b")])
    assert completed_point_ids(tmp_path) == {"a", "b"}


# Every file of a results folder by one set of rules (matrix.store.folder): each
# is held to them before any point runs, and each rule, broken, flips the verdict.
SIDE_FILES = ("results.csv", "runs.jsonl", "samples.jsonl")


@pytest.mark.parametrize("name", SIDE_FILES)
def test_a_side_file_that_is_no_regular_file_is_refused_up_front(tmp_path, name):
    append_rows(tmp_path, [row("a")])
    (tmp_path / "samples.jsonl").write_text("")
    Folder(tmp_path).check()  # regular files pass
    (tmp_path / name).unlink(missing_ok=True)
    os.mkfifo(tmp_path / name)
    with pytest.raises(ResultsPathError) as info:
        Folder(tmp_path).check()  # without waiting on the FIFO for a writer
    assert _one_line(info.value).endswith("not a regular file") and name in str(info.value)
    (tmp_path / name).unlink()
    (tmp_path / name).symlink_to(os.devnull)
    with pytest.raises(ResultsPathError, match=r"a link to /dev/null\).* not a regular file"):
        Folder(tmp_path).check()


def test_a_side_file_that_is_not_writable_is_refused_up_front(tmp_path, monkeypatch):
    (tmp_path / "runs.jsonl").write_text("")
    Folder(tmp_path).check()
    real = os.open

    def read_only(path, flags, *args):  # as a read-only mount answers, for root too
        if str(path).endswith("runs.jsonl") and flags & os.O_WRONLY:
            raise OSError(30, "Read-only file system")
        return real(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(ResultsPathError, match=r"runs.jsonl is not writable \(Read-only file system\)"):
        Folder(tmp_path).check()


def _peak_rss_mb(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    code = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
            "print(p.returncode); print(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    proc = run_python("-c", code, *cmd, timeout=600)
    rc, line, rss = proc.stdout.strip().splitlines()
    return subprocess.CompletedProcess(cmd, int(rc), "", line), int(rss) / 1024


def test_a_results_file_of_one_gigabyte_line_is_refused_with_its_size_not_read(tmp_path):
    """``truncate -s 1G results.csv`` then report: 7.6 GB of memory over 160 s."""
    append_rows(tmp_path, [row("a")])
    report = [sys.executable, "-m", "matrix.report", str(tmp_path), "--out", str(tmp_path / "out")]
    assert _peak_rss_mb(report)[0].returncode == 0  # a whole file reports
    os.truncate(results_path(tmp_path), 1 << 30)  # its last line now a gigabyte of NULs
    with pytest.raises(ResultsPathError, match=r"line 3 is longer than 64 MiB \(the file is 1073741824 bytes\)"):
        results.read_rows(results_path(tmp_path))
    done, rss = _peak_rss_mb(report)
    assert done.returncode == 2 and "line 3 is longer than 64 MiB (the file is 1073741824 bytes)" in done.stderr, done
    assert rss < 700, rss  # the line bound, not the file
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    results_path(fresh).touch()
    os.truncate(results_path(fresh), 1 << 30)  # no header at all: the sweep refuses before any point
    with pytest.raises(ResultsPathError, match=r"first line is longer than 64 MiB \(the file is 1073741824 bytes\)"):
        Folder(fresh).check()


def test_a_gigabyte_samples_line_or_runs_file_is_refused_with_its_size(tmp_path):
    append_rows(tmp_path, [row("a")])
    for name in ("samples.jsonl", "runs.jsonl"):
        (tmp_path / name).write_text('{"point_id": "a"}\n')
    Folder(tmp_path).check()
    read_samples(tmp_path / "samples.jsonl"), read_runs(tmp_path)
    os.truncate(tmp_path / "samples.jsonl", 1 << 30)
    with pytest.raises(ValueError, match=r"samples.jsonl: line 2 is longer than 16 MiB \(the file is 1073741824 bytes\)"):
        read_samples(tmp_path / "samples.jsonl")
    other = tmp_path / "b"
    append_rows(other, [row("a")])
    (other / "samples.jsonl").write_text("")
    done, rss = _peak_rss_mb([sys.executable, "-m", "matrix.compare", str(other), str(tmp_path)])
    assert done.returncode == 2 and "line 2 is longer than 16 MiB" in done.stderr and rss < 700, (done, rss)
    os.truncate(tmp_path / "runs.jsonl", 1 << 30)
    with pytest.raises(ResultsPathError, match=r"runs.jsonl is 1073741824 bytes, over the 256 MiB it may hold"):
        Folder(tmp_path).check()


def test_a_measured_field_with_no_column_fails_the_write_instead_of_vanishing(tmp_path, monkeypatch):
    """Every field of a point's result is a column of its own name or has its place named
    (point.RESULT_ELSEWHERE); a new one with neither reaches the row and the write refuses it in
    one line (it was filtered out by the column list, without a word)."""
    from dataclasses import fields

    from matrix.app import point
    from matrix.app.config import MatrixConfig, validate
    from matrix.app.resolve import resolve
    from matrix.store.results import COLUMNS, append_rows
    from nsa_cp_comm.harness.fold import ImplResult

    assert {f.name for f in fields(ImplResult)} <= set(COLUMNS) | set(point.RESULT_ELSEWHERE)
    assert set(point.RESULT_SAME_NAME) <= set(COLUMNS)
    cfg = {**vars(MatrixConfig()), "device": "cpu", "backend": "gloo", "impl": "padded", "results_dir": str(tmp_path),
           "cp_size": 2, "seq_lens": [100]}
    validate(cfg)
    res = resolve(cfg, gpus=0)
    result = ImplResult("padded", "ok", stats={"roundtrip": {"p50": 1.0, "p99": 2.0}, "gather": {"p50": 0.5,
                                                                                                  "p99": 0.9}})
    (row,) = point.build_rows(cfg, res, [result], "", 0.0)
    assert row["roundtrip_p99_us"] == 2.0 and "gather_p99_us" not in row  # a statistic kept in the samples only
    append_rows(tmp_path, [row])
    result.new_measure = 7  # a field the result gained, and no column
    monkeypatch.setattr(point, "RESULT_SAME_NAME", (*point.RESULT_SAME_NAME, "new_measure"))
    (row,) = point.build_rows(cfg, res, [result], "", 0.0)
    with pytest.raises(ValueError, match=r"row has columns outside the schema: \['new_measure'\]"):
        append_rows(tmp_path, [row])
