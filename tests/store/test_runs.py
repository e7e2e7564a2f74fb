"""Run metadata once per run (runs.jsonl), a schema version in the files, and
readers that give the same columns for the new layout and the previous one."""

from __future__ import annotations

import csv
import errno
import json
import os
from pathlib import Path

import pytest

from matrix.report import cli as report_cli
from matrix.review import _review, report
from matrix.store import results, runs
from matrix.store.results import COLUMNS, PROVENANCE_COLUMNS, ResultsWriteError, SchemaError, append_rows, results_path
from matrix.store.runs import META_COLUMNS, RUNS_FILE, SCHEMA_VERSION, read_runs
from matrix.store.samples import SAMPLES_FILE, read_samples

import compare_rows as tc
import report_rows as tr

# The previous layout (schema 2): the environment in every row, no run_id.
LAYOUT2_PROVENANCE = ("impl_origin", "torch_version", "nccl_version", "device_name", "host", "git_sha", "timestamp",
                      "wall_s", "point_id", "overrides", "repro")
# Columns layout 7 added (the experts' quantization): no earlier layout has them.
LAYOUT7_NEW = ("moe_quant",)
# Columns layout 6 added (the engine's model, its CUDA graphs): no earlier layout has them.
LAYOUT6_NEW = ("engine_model", "graphs", "max_capture_size", "moe_pad_masked_rows", "graph_pad_rows", *LAYOUT7_NEW)
# Columns layout 5 added (a shared expert placement per row): no earlier layout has them.
LAYOUT5_NEW = ("shared_expert", *LAYOUT6_NEW)
# Columns layout 4 added (an engine per row): no earlier layout has them.
LAYOUT4_NEW = ("engine", "attn_pad_masked_rows", *LAYOUT5_NEW)
LAYOUT2_COLUMNS = ([c for c in COLUMNS if c not in PROVENANCE_COLUMNS and c not in LAYOUT4_NEW]
                   + (["fault"] if "fault" not in COLUMNS else []) + list(LAYOUT2_PROVENANCE))
LAYOUT3_COLUMNS = [c for c in COLUMNS if c not in LAYOUT4_NEW]
LAYOUT4_COLUMNS = [c for c in COLUMNS if c not in LAYOUT5_NEW]
LAYOUT5_COLUMNS = [c for c in COLUMNS if c not in LAYOUT6_NEW]
LAYOUT6_COLUMNS = [c for c in COLUMNS if c not in LAYOUT7_NEW]


def _write_csv(results_dir: Path, columns: list[str], rows: list[dict[str, object]]) -> None:
    """``rows`` as the results.csv of ``columns`` (other keys dropped), as an older writer left it."""
    results_dir.mkdir(parents=True, exist_ok=True)
    with results_path(results_dir).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def write_layout_2(results_dir: Path, rows: list[dict[str, object]], **env: object) -> str:
    """``rows`` as a results.csv of schema 2 (the environment of ``tc.RUN``, changed by ``env``, in each row)."""
    env = {**{k: tc.RUN[k] for k in runs.LAYOUT2_ENV}, **env}
    _write_csv(results_dir, LAYOUT2_COLUMNS, [{**env, **row} for row in rows])
    return str(results_dir)


def _write_layout(results_dir: Path, rows: list[dict[str, object]], columns: list[str], version: int) -> str:
    """``rows`` as a results.csv of ``columns`` (each naming tc.RUN's run_id) and its runs.jsonl of ``version``."""
    _write_csv(results_dir, columns, [{"run_id": tc.RUN["run_id"], **row} for row in rows])
    (results_dir / RUNS_FILE).write_text(json.dumps({"schema_version": version, **tc.RUN}) + "\n")
    return str(results_dir)


def run_lines(results_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (results_dir / RUNS_FILE).read_text().splitlines()]


# --- the writer: one line per run


def test_one_metadata_line_per_run_and_every_row_names_it(tmp_path):
    tc.write_run(tmp_path, tc.base_rows()[:2])
    tc.write_run(tmp_path, tc.base_rows()[2:4])  # the same run's next point
    tc.write_run(tmp_path, tc.base_rows()[4:6], run_id="other001", host="box2")  # a second run appends
    lines = run_lines(tmp_path)
    assert [(ln["schema_version"], ln["run_id"], ln["host"]) for ln in lines] == [
        (SCHEMA_VERSION, "base0001", "box1"), (SCHEMA_VERSION, "other001", "box2")]
    ids = [r["run_id"] for _, r in results.read_rows(results_path(tmp_path)).rows]
    assert ids == ["base0001"] * 4 + ["other001"] * 2
    header = results.read_header(results_path(tmp_path))
    assert runs.layout_version(header) == SCHEMA_VERSION
    assert not set(runs.LAYOUT2_ENV) & set(header)  # the environment is no longer in the rows


def test_a_run_line_already_in_the_file_is_not_written_again(tmp_path, monkeypatch):
    """Once per process: a process that forgot it wrote the line (another
    module instance, say) finds it in the file under the lock."""
    tc.write_run(tmp_path, tc.base_rows()[:1])
    monkeypatch.setattr(runs, "_RECORDED", set())
    tc.write_run(tmp_path, tc.base_rows()[1:2])
    assert len(run_lines(tmp_path)) == 1


def test_a_row_of_another_run_or_a_run_without_id_is_refused(tmp_path):
    with pytest.raises(ValueError, match="row names run_id=zzz, written by run base0001"):
        tc.write_run(tmp_path, [{**tc.make_row(), "run_id": "zzz"}])
    with pytest.raises(ValueError, match="needs a run_id"):
        append_rows(tmp_path, [tc.make_row()], run={"host": "box1"})
    assert not results_path(tmp_path).exists() and not (tmp_path / RUNS_FILE).exists()


def test_a_failed_metadata_write_writes_no_row(tmp_path, monkeypatch):
    """No row may name a run without a line: the run's line goes first, and
    when it cannot be written the rows are not either."""
    tc.write_run(tmp_path, tc.base_rows()[:1])
    before = results_path(tmp_path).read_bytes(), (tmp_path / RUNS_FILE).read_bytes()
    real_write = os.write

    def full_for_runs(fd: int, data: bytes) -> int:
        if os.path.realpath(f"/proc/self/fd/{fd}").endswith(RUNS_FILE):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_for_runs)
    with pytest.raises(ResultsWriteError, match=f"cannot append to {tmp_path / RUNS_FILE}: No space left"):
        tc.write_run(tmp_path, tc.base_rows()[1:2], run_id="second01")
    assert (results_path(tmp_path).read_bytes(), (tmp_path / RUNS_FILE).read_bytes()) == before


def test_the_point_builds_its_run_once_per_process():
    from matrix.app import point

    meta = point.environment()
    assert point.environment() is meta  # computed once
    assert set(META_COLUMNS) <= set(meta) and meta["run_id"]
    assert meta["command"] and meta["python_version"] and meta["cpu_count"] >= 1 and meta["load_1m"] >= 0


def test_resume_into_a_folder_of_the_previous_layout_says_which_schema(tmp_path):
    write_layout_2(tmp_path / "old", tc.base_rows())
    with pytest.raises(SchemaError, match=rf"schema 2 of an earlier version \(this one writes {SCHEMA_VERSION}; report "
                                          r"and compare still read it\)"):
        results.check_schema(results_path(tmp_path / "old"))


# --- the readers: the same columns from either layout


def test_both_layouts_load_with_the_same_columns_and_environment(tmp_path):
    new = tc.write_run(tmp_path / "new", tc.base_rows())
    old = write_layout_2(tmp_path / "old", tc.base_rows())
    a, b = _review.load_run("NEW", new), _review.load_run("OLD", old)
    visible = lambda run: sorted(c for c in run.raw.columns if not c.startswith("_"))  # noqa: E731
    assert visible(a) == visible(b) == sorted(_review.READ_COLUMNS)
    for col in runs.LAYOUT2_ENV:
        assert set(a.latest[col].astype(str)) == set(b.latest[col].astype(str)) == {str(tc.RUN[col])}, col
    assert set(a.latest["command"].astype(str)) == {tc.RUN["command"]}  # kept only by the new layout
    assert set(b.latest["command"].astype(str)) == {""}
    assert a.unknown_runs == {} == b.unknown_runs


@pytest.mark.parametrize("version, columns, column, was, other", [
    # Layout 3 has no engine column: its rows were planned by the seed fix's engine.
    (3, LAYOUT3_COLUMNS, "engine", "seed_fix", "sglang_0_5_23"),
    # Layout 4 has no shared_expert column: its reference MoE had no shared expert.
    (4, LAYOUT4_COLUMNS, "shared_expert", "none", "replicated"),
    # Layout 5 has no engine_model column: its rows were planned for DeepSeek-V3.2.
    (5, LAYOUT5_COLUMNS, "engine_model", "deepseek_v32", "deepseek_v4"),
    # Layout 6 has no moe_quant column: its experts computed on the rows' own dtype.
    (6, LAYOUT6_COLUMNS, "moe_quant", "none", "fp8_block"),
], ids=["engine", "shared_expert", "engine_model", "moe_quant"])
def test_rows_before_a_column_read_as_what_they_ran_and_join_new_ones(tmp_path, capsys, version, columns, column, was,
                                                                      other):
    """A file of a layout without ``column`` reads it as what its rows ran
    (``was``), and its rows join a new run's rows of that value, not of another."""
    old = _write_layout(tmp_path / "old", tc.base_rows(), columns, version)
    assert runs.layout_version(results.read_header(results_path(tmp_path / "old"))) == version
    assert set(_review.load_run("OLD", old).latest[column].astype(str)) == {was}
    code, out, err = tc.run([old, tc.write_run(tmp_path / "same", tc.base_rows())], capsys)
    assert code == 0 and tc.counts(out)["joined"] == "10", out + err
    changed = [{**r, column: other} for r in tc.base_rows()]
    code, out, err = tc.run([old, tc.write_run(tmp_path / "other", changed)], capsys)
    assert tc.counts(out).get("joined", "0") == "0", out + err


def test_a_file_of_the_previous_layout_reports(tmp_path, capsys):
    write_layout_2(tmp_path, tr.mixed_rows())
    md, _, _ = tr.run_report(tmp_path, code=1)  # the mixed rows fail: verdict FAIL
    env = tr.section(md, "Environment")
    assert "torch_version `2.13.0`" in env and "host `box1`" in env and "git_sha `abc1234`" in env
    assert "run(s) wrote these rows" not in env  # that layout kept no runs
    assert "Unknown environment" not in md


def test_a_file_of_the_previous_layout_compares_with_the_new_one(tmp_path, capsys):
    old = write_layout_2(tmp_path / "old", tc.base_rows())
    same = tc.write_run(tmp_path / "same", tc.base_rows())
    code, out, err = tc.run([old, same], capsys)
    assert code == 0 and err == "" and tc.counts(out)["joined"] == "10", out + err
    moved = tc.write_run(tmp_path / "moved", tc.changed(tc.FIRST, roundtrip_p50_us=210.0 * 1.5),
                         run_id="moved001", host="box2")
    code, out, err = tc.run([old, moved], capsys)
    assert code == 1 and tc.counts(out)["regressed"] == "1"
    assert "warning: environments differ: host: BASE box1 vs NEW box2" in err


def test_each_row_gets_the_environment_of_its_own_run(tmp_path):
    """Two runs in one file: the join is per row, not one run's fields for all."""
    rows = tc.base_rows()
    tc.write_run(tmp_path, rows[:3])
    tc.write_run(tmp_path, rows[3:], run_id="second01", host="box2", torch_version="2.14.0")
    latest = _review.load_run("RESULTS", str(tmp_path)).latest
    got = list(zip(latest["run_id"].astype(str), latest["host"].astype(str), latest["torch_version"].astype(str)))
    assert got == [("base0001", "box1", "2.13.0")] * 3 + [("second01", "box2", "2.14.0")] * (len(rows) - 3)


def test_the_environment_check_flips_when_the_join_is_broken(tmp_path, capsys, monkeypatch):
    """compare's environment warning and the report's environment read the
    joined metadata: without the join they lose it, and say so."""
    base = tc.write_run(tmp_path / "b", tc.base_rows())
    new = tc.write_run(tmp_path / "n", tc.base_rows(), run_id="new00001", host="box2")
    warning = "warning: environments differ: host: BASE box1 vs NEW box2"
    assert warning in tc.run([base, new], capsys)[2]

    monkeypatch.setattr(_review, "read_runs", lambda results_dir: runs.Runs())  # no metadata found
    code, out, err = tc.run([base, new], capsys)
    assert warning not in err
    assert f"note: BASE={base}: 10 row(s) name a run_id with no line in {RUNS_FILE}" in out
    md = tr.run_report(Path(new))[0]
    assert "host `box2`" not in tr.section(md, "Environment")


def test_a_row_whose_run_has_no_metadata_is_reported(tmp_path, capsys):
    tr.append(tmp_path, tr.mixed_rows()[:4])
    append_rows(tmp_path, [tr.make_row(cp=8, run_id="ghost001")])  # a run that wrote no line
    append_rows(tmp_path, [tr.make_row(cp=16)])  # a row that names no run
    assert report_cli.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    md, appendix = tr.md_of(tmp_path)
    said = (f"2 row(s) name a run_id with no line in {RUNS_FILE} (rows by run_id: (empty): 1, ghost001: 1): "
            "their environment (torch_version, nccl_version, host, git_sha, ...) is unknown")
    assert f"**Unknown environment:** {said}." in md
    assert f"note: RESULTS={tmp_path}: {said}" in out
    assert tr.table_row(appendix[appendix.index("## Runs"):], "ghost001")[1:3] == ["1", ""]


def test_unreadable_and_newer_run_lines_are_skipped_and_counted(tmp_path, capsys):
    tc.write_run(tmp_path, tc.base_rows())
    with (tmp_path / RUNS_FILE).open("a") as f:
        f.write("not json\n")
        f.write(json.dumps({"schema_version": SCHEMA_VERSION + 1, "run_id": "future01"}) + "\n")
    assert set(read_runs(tmp_path).by_id) == {"base0001"} and read_runs(tmp_path).skipped_lines == 2
    run = _review.load_run("RESULTS", str(tmp_path))
    assert f"2 unreadable line(s) of {RUNS_FILE} skipped" in " ".join(run.notes())
    assert set(run.latest["host"].astype(str)) == {"box1"}


# --- samples.jsonl


@pytest.mark.parametrize("version, read", [({"v": 1}, True), ({"schema_version": SCHEMA_VERSION}, True),
                                           ({"schema_version": SCHEMA_VERSION + 1}, False)])
def test_sample_lines_of_each_schema(tmp_path, version, read):
    line = {**version, "point_id": "a", "impl": "padded", "roundtrip_us": [1.0], "control_us": [2.0]}
    (tmp_path / SAMPLES_FILE).write_text(json.dumps(line) + "\n")
    got = read_samples(tmp_path / SAMPLES_FILE)
    assert (got.roundtrip("a", "padded") is not None, got.skipped_lines) == (read, 0 if read else 1)
