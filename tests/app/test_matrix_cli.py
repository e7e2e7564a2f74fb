"""The matrix as users run it: Hydra presets, real sweeps on real ranks, results.csv."""

from __future__ import annotations

import csv
import os
import shlex
import signal
import time

import pytest
from omegaconf import OmegaConf

from matrix.app.config import GROUPS, KEYS, ConfigError, validate_overrides
from matrix.app.repro_env import split
from matrix.store.results import COLUMNS, CONFIG_COLUMNS
from nsa_cp_comm import engines
from nsa_cp_comm.harness import machine as load_rule

from matrix_cli import MID_POINT_ITERS, REPO, compose_config, config_of, run_matrix, run_python, sweep_in_background

PRESETS = sorted(p.stem for p in (REPO / "conf" / "matrix").glob("*.yaml"))
LAYOUTS = sorted(p.stem for p in (REPO / "conf" / "layout").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_to_a_valid_sweep(preset):
    cfg = compose_config(f"+matrix={preset}")
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    assert params, f"{preset} sweeps nothing"
    for key in params:
        assert key.lstrip("+") in set(KEYS) | set(GROUPS), key
    validate_overrides([f"{k}={v}" for k, v in params.items()])


def test_default_preset_crosses_every_axis_without_duplicates():
    params = OmegaConf.to_container(compose_config("+matrix=default").hydra.sweeper.params)
    assert params["cp_size"] == "1,2,4,8"
    # every layout of the default engine's splits (the others' are their engines': engine=vllm_0_33, vllm_ascend)
    own = [n for n in LAYOUTS if compose_config(f"+layout={n}").split in engines.get(engines.DEFAULT).strategies]
    assert set(params["+layout"].split(",")) == set(own)
    assert set(params["moe_a2a_backend"].split(",")) == {"none", "deepep"}
    lens = params["seq_lens"]
    assert "[1000]" in lens and lens.count("[") >= 3  # single request and several batches
    assert "page_size" not in params and "shared_kv" not in params  # only via layouts, never crossed
    pages: dict[bool, set] = {}
    for name in own:
        c = compose_config(f"+layout={name}")
        pages.setdefault(c.shared_kv, set()).add((c.page_size, c.split))
    assert pages[False] == {(1, "zigzag"), (1, "round_robin")}
    assert {p for p, _ in pages[True]} == {1, 16, 64}


def test_smoke_sweep_through_the_cli_then_again_and_compare(tmp_path):
    """The smoke preset's rows, as the README promises them; then its A/A
    (two_smoke_runs_compare_clean): one sweep serves both."""
    run = run_matrix(tmp_path / "res", "+matrix=smoke")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = run.rows()
    header = run.csv.read_text().splitlines()[0].split(",")
    assert tuple(header) == COLUMNS
    # 16 all-gather points x (padded, legacy) + 16 DeepEP points x (padded, legacy, a2a)
    assert len(rows) == 16 * 2 + 16 * 3
    assert {r["status"] for r in rows} == {"ok", "refused", "passthrough"}
    assert all(r["correct"] == "True" for r in rows)
    assert all(r["failed_check"] == "" for r in rows)
    by = {(r["cp_size"], r["policy"], r["seq_lens"], r["moe_a2a_backend"], r["impl"]): r for r in rows}
    # cp=2, [1001,300]: uneven; the legacy row refused on every rank, the padded row is exact.
    legacy = by[("2", "zigzag", "[1001,300]", "none", "legacy")]
    assert legacy["is_even"] == "False" and legacy["claim_holds"] == "False"
    assert legacy["status"] == "refused"
    assert "output tensor size must be equal to world_size times input tensor size" in legacy["reason"]
    assert legacy["roundtrip_p50_us"] == "" and legacy["busbw_padded_GBps"] == ""
    padded = by[("2", "zigzag", "[1001,300]", "none", "padded")]
    assert padded["status"] == "ok"
    assert float(padded["max_rel_err"]) <= 1e-5 and float(padded["roundtrip_p50_us"]) > 0
    assert float(padded["local_p50_us"]) > 0 and float(padded["collective_p50_us"]) > 0
    assert float(padded["roundtrip_iqr_us"]) >= 0 and padded["impl_origin"].startswith("nsa_cp_comm ")
    assert padded["padded_total"] == "1304" and padded["total_tokens"] == "1302"
    # Even plan: bitwise equal to legacy, through the general padded path.
    even = by[("2", "zigzag", "[1000]", "none", "padded")]
    assert even["even_bitwise_equal"] == "True" and even["padding_frac"] == "0.0"
    assert by[("2", "zigzag", "[1000]", "none", "legacy")]["status"] == "ok"
    # Page-aligned split of one request: uneven, claim fails (docs/design.md, section 2).
    page = by[("2", "zigzag_page", "[1000]", "none", "padded")]
    assert page["max_rank_len"] == "512" and page["claim_holds"] == "False"
    # DeepEP path: SCATTERED, the communicator moves nothing; the a2a stand-in is measured.
    dee = by[("2", "zigzag", "[1001,300]", "deepep", "legacy")]
    assert dee["mlp_mode"] == "SCATTERED" and dee["status"] == "passthrough" and dee["correct"] == "True"
    assert dee["rows_moved"] == "" and dee["roundtrip_p50_us"] == ""
    a2a = by[("2", "zigzag", "[1001,300]", "deepep", "a2a")]
    assert a2a["status"] == "ok" and int(a2a["rows_moved"]) > 0 and float(a2a["roundtrip_p50_us"]) > 0
    for r in rows:
        assert split(r["repro"])[1][:3] == ["python", "-m", "matrix"] and f"cp_size={r['cp_size']}" in r["repro"]
        # a repro reruns into the folder its row is in (absolute: it runs from any directory)
        assert f"results_dir={(tmp_path / 'res').resolve()}" in split(r["repro"])[1], r["repro"]
        assert r["run_id"] and r["timestamp"]
    # cp=2, [1] padded to 2 tokens, page-aligned: one page, all on rank 0, rank 1 empty
    empty = by[("2", "zigzag_page", "[1]", "none", "padded")]
    assert empty["status"] == "ok" and "empty_rank" in empty["plan_class"], empty
    assert "matrix summary: 32 points, 80 rows: ok 43, refused 5, passthrough 32, failed 0" in run.stdout
    # Hydra's own per-job files sit beside the table.
    assert len(list((tmp_path / "res" / "hydra").glob("*/0/.hydra/config.yaml"))) == 1
    two_smoke_runs_compare_clean(tmp_path / "res", tmp_path / "b")


def two_smoke_runs_compare_clean(first: Path, second: Path) -> None:
    """A/A of the smoke preset (``first`` swept already): its iters=3 can show
    no significant change, so compare gates the two runs' status and
    correctness, not their times, and exits 0, saying what to run to gate on time."""
    run = run_matrix(second, "+matrix=smoke")
    assert run.returncode == 0, run.stderr[-2000:]
    cmp = run_python("-m", "matrix.compare", str(first), str(second), timeout=240)
    assert cmp.returncode == 0, cmp.stdout[-3000:] + cmp.stderr[-2000:]
    last = cmp.stdout.strip().splitlines()[-1]
    assert last.endswith("smoke-untimed=43 -> PASS") and "unverified=0" in last, last
    assert "iters=auto" in cmp.stdout


def test_repro_reruns_the_same_point(tmp_path):
    first = run_matrix(tmp_path / "a", "cp_size=2", "seq_lens=[300,77]", "hidden_size=32", "iters=2", "warmup=0",
                       "shared_kv=true", "page_size=16", multirun=False)
    assert first.returncode == 0, first.stderr[-2000:]
    row, written = first.rows()[0], len(first.rows())
    args = split(row["repro"])[1][3:]
    # into the same folder (absolute: the repro runs from anywhere), from scratch
    assert [a for a in args if a.startswith(("results_dir=", "resume="))] == [f"results_dir={(tmp_path / 'a').resolve()}"]
    second = run_matrix(tmp_path / "a", *[a for a in args if not a.startswith("results_dir=")], multirun=False)
    assert second.returncode == 0, second.stderr[-2000:]
    rows = second.rows()
    again = rows[written]  # appended after the first run's rows
    assert len(rows) == 2 * written and again["run_id"] != row["run_id"]
    for col in CONFIG_COLUMNS + ("policy", "total_tokens", "max_rank_len", "padded_total", "point_id"):
        assert again[col] == row[col], col


def test_resume_skips_points_already_done(tmp_path):
    res = tmp_path / "res"
    args = ("seq_lens=[100]", "hidden_size=32", "iters=2", "warmup=0")
    first = run_matrix(res, "cp_size=1,2", *args)
    assert first.returncode == 0, first.stderr[-2000:]
    assert len(first.rows()) == 4
    more = run_matrix(res, "cp_size=1,2,3", *args, "resume=true")
    assert more.returncode == 0, more.stderr[-2000:]
    assert more.stdout.count("already in results, not rerun (resume=true)") == 2
    assert "matrix summary: 3 points, 6 rows: ok 6" in more.stdout
    rows = more.rows()
    assert sorted(r["cp_size"] for r in rows) == ["1", "1", "2", "2", "3", "3"]
    keys = [(r["point_id"], r["impl"]) for r in rows]
    assert len(keys) == len(set(keys))


def test_contradictory_mlp_mode_is_a_skipped_row(tmp_path):
    run = run_matrix(tmp_path / "res", "cp_size=2", "seq_lens=[64]", "hidden_size=32",
                     "moe_a2a_backend=deepep,none", "mlp_mode=FULL", "iters=2")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = run.rows()
    skipped = [r for r in rows if r["moe_a2a_backend"] == "deepep"]
    assert skipped and all(r["status"] == "skipped" for r in skipped)
    assert "mlp_mode=FULL contradicts moe_a2a_backend=deepep" in skipped[0]["reason"]
    assert all(r["status"] == "ok" for r in rows if r["moe_a2a_backend"] == "none")


def test_ctrl_c_prints_one_line_per_point_and_the_resume_command(tmp_path):
    """SIGINT to the whole process group (what a terminal's Ctrl-C does): no
    traceback from the parent or a rank, the interrupted point, and the exact
    command that finishes the sweep."""

    def interrupted_sweep(res):
        """The sweep, SIGINT sent mid-point; whether it was still running then."""
        proc = sweep_in_background(res, iters=MID_POINT_ITERS)  # returns at the first point's row
        # Hydra makes the next job's folder as that job starts; its point then runs
        # for seconds (MID_POINT_ITERS iterations), so the signal lands mid-point, not between points.
        deadline = time.monotonic() + 120
        # Hydra's records: a folder per command under results_dir/hydra/, a folder per job in it
        while not list(res.glob("hydra/*/1/matrix.log")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        running = proc.poll() is None
        os.killpg(proc.pid, signal.SIGINT)
        return proc, running, *proc.communicate(timeout=120)

    res = tmp_path / "res"
    proc, running, out, err = interrupted_sweep(res)
    if not running:  # the sweep ended before the signal (a starved test process): nothing was tested; once more
        res = tmp_path / "again"
        proc, running, out, err = interrupted_sweep(res)
    assert running and proc.returncode == 130, (running, out[-2000:], err[-2000:])
    assert "Traceback" not in err and "Traceback" not in out, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 2 and "interrupted, no row written" in lines[0], lines
    # The point named is one the sweep had not written, whichever the signal caught.
    written = {r["seq_lens"] for r in csv.DictReader((res / "results.csv").open())}
    named = [s for s in ("[2000]", "[4000]") if s in lines[0]]
    assert len(named) == 1 and named[0] not in written and "[64]" in written, (lines, written)
    hint = lines[1].split("finish the sweep with: ", 1)[1]
    assert shlex.split(hint)[:3] == ["python", "-m", "matrix"] and shlex.split(hint)[-1] == "resume=true"
    again = run_python(*shlex.split(hint)[1:])
    assert again.returncode == 0, again.stderr[-2000:]
    assert "matrix summary: 3 points, 6 rows: ok 6" in again.stdout


def test_dry_run_lists_every_point_and_starts_no_rank(tmp_path, capsys, monkeypatch):
    from matrix.app import sweep as cli

    monkeypatch.setattr(cli, "task", lambda machine_checked, points=(): (_ for _ in ()).throw(AssertionError("the Hydra app started")))
    res = tmp_path / "res"
    assert cli.main(["+matrix=smoke", "--dry-run", f"results_dir={res}"]) == 0
    out = capsys.readouterr().out.splitlines()
    listed = [ln for ln in out if ln.strip()[:1].isdigit()]
    assert len(listed) == 32, out
    assert any("gloo/cpu zigzag_page page=64 FULL impls=padded,legacy" in ln for ln in listed)
    assert any("SCATTERED impls=padded,legacy,a2a" in ln for ln in listed)
    assert out[-1].startswith("estimate: 32 points, about ")
    assert not res.exists()
    # A no-effect page size is listed with its effective value, then deduped.
    assert cli.main(["-m", "--dry-run", "cp_size=2", "page_size=1,64", "seq_lens=[100]",
                     f"results_dir={res}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "zigzag page=1" in out[0] and "skipped" not in out[0]
    assert "same effective configuration as point 0" in out[1], out


def test_dry_run_says_how_long_the_sweep_takes_at_the_machines_load_now(tmp_path, capsys, monkeypatch):
    """Idle, the estimate alone; on a machine loaded past its cores, also the
    time at that load (the idle figure is what the sweep's time bound reads)."""
    from matrix.app import sweep as cli
    from nsa_cp_comm.harness.machine import this_machine

    cores = this_machine().cores
    argv = ["-m", "--dry-run", "cp_size=2", "seq_lens=[100]", f"results_dir={tmp_path / 'res'}"]
    monkeypatch.setattr(load_rule.os, "getloadavg", lambda: (cores * 0.5, 0.0, 0.0))
    assert cli.main(argv) == 0
    idle = capsys.readouterr().out.splitlines()[-1]
    assert idle.startswith("estimate: 1 point, about ") and "at its load now" not in idle, idle
    minutes = float(idle.split("about ", 1)[1].split(" min", 1)[0])
    monkeypatch.setattr(load_rule.os, "getloadavg", lambda: (cores * 4.0, 0.0, 0.0))
    assert cli.main(argv) == 0
    loaded = capsys.readouterr().out.splitlines()[-1]
    assert loaded.startswith(idle.split("; at")[0]), (idle, loaded)
    head, _, clause = loaded.partition(f"; at its load now ({cores * 4.0:.1f} on {cores} cores) about ")
    assert head == idle and clause.endswith(" min"), (idle, loaded)
    assert abs(float(clause.removesuffix(" min")) - 4 * minutes) <= 4 * 0.05 + 0.05  # each printed to 0.1 min


def test_dry_run_of_a_sweep_beyond_the_machine_lists_it_then_refuses(tmp_path, capsys, monkeypatch):
    from matrix.app import sweep as cli
    from matrix.app import budget

    monkeypatch.setattr(budget, "MAX_SWEEP_S", 0.0)  # any sweep is "too long" here
    assert cli.main(["+matrix=smoke", "--dry-run", f"results_dir={tmp_path / 'res'}"]) == 2
    out, err = capsys.readouterr()
    assert "estimate: 32 points" in out
    assert err.startswith("error: the sweep would be refused: ") and "force=true" in err
    assert len(err.strip().splitlines()) == 1
    # Without --dry-run the same sweep is refused before anything starts.
    assert cli.main(["+matrix=smoke", f"results_dir={tmp_path / 'res'}"]) == 2
    assert not (tmp_path / "res").exists()


def test_a_job_checks_the_machine_it_runs_on(tmp_path, monkeypatch):
    """A remote launcher's job: preflight could not see its node; a point its
    node cannot hold is an error row naming why, and the sweep goes on."""
    from matrix.app import budget, point

    checked = []

    def refuse(points, *, runs_here, machine=None):
        checked.append([p.spec.cp_size for p in points])
        raise ConfigError("cp_size=2: 2 ranks x ~9 GiB exceed this machine's 4 GiB available memory")

    monkeypatch.setattr(budget, "check_sweep", refuse)
    cfg = config_of(cp_size=2, hidden_size=32, seq_lens=[64], results_dir=str(tmp_path))
    rows = point.run(cfg, job_dir=tmp_path)
    assert [r["status"] for r in rows] == ["error", "error"] and checked == [[2]]
    assert rows[0]["reason"].startswith("this machine cannot run the point: cp_size=2: 2 ranks")
    # A job of a sweep preflight checked against this machine is not checked again.
    monkeypatch.setattr(point, "_results_for", lambda cfg, res, job_dir: point.every_impl(res, "ok", ""))
    rows = point.run({**cfg, "results_dir": str(tmp_path / "checked")}, job_dir=tmp_path, machine_checked=True)
    assert [r["status"] for r in rows] == ["ok", "ok"] and checked == [[2]]


def test_any_launcher_prints_the_summary_and_fails_on_bad_points(tmp_path):
    """Jobs run by another launcher (submitit, as on SLURM; here its local
    flavour) never report to this process: the summary is read back from the
    results, and a failing point still makes the sweep exit 1."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    run = run_matrix(tmp_path / "res", "hydra/launcher=submitit_local", "cp_size=1", "seq_lens=[64]",
                     "hidden_size=32", "iters=1", "warmup=0", "impl=padded,tests.broken_impls:raise_rank", timeout=600)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    # one configuration, a job per impl: one point, two rows
    assert "matrix summary: 1 point, 2 rows: ok 1, failed 0, error 1, timeout 0" in run.stdout
    assert "[matrix]" not in run.stdout  # the jobs' own lines stay in their logs


def test_repro_quotes_every_value_so_it_round_trips():
    """shlex, then Hydra's own parser, give back every value of the point."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from matrix.app.point import repro_command

    cfg = config_of(seq_lens=[1001, 300], impl="tests.broken_impls:wrong_order", align=None,
                    results_dir="/tmp/a,b'c d", timeout_s=12.5)
    argv = split(repro_command(cfg))[1]
    assert argv[:3] == ["python", "-m", "matrix"]
    parsed = {ov.key_or_group: ov.value() for ov in OverridesParser.create().parse_overrides(argv[3:])}
    # a repro reruns into its row's folder (a value with a comma, quote and space round-trips), from scratch
    assert parsed["results_dir"] == "/tmp/a,b'c d" and "resume" not in parsed
    for key, value in parsed.items():
        assert value == cfg[key], (key, value, cfg[key])
    assert parsed["impl"] == "tests.broken_impls:wrong_order"


def test_a_sweep_resolves_each_point_once(tmp_path, monkeypatch, capsys):
    """Preflight validates and resolves every point before the sweep starts; each job ran the
    same again (twice per point, and two resolutions that could differ). The job now runs the
    point preflight resolved for its config."""
    from matrix.app import point, resolve
    from matrix_cli import sweep_here

    calls = []
    real = resolve.resolve

    def counted(cfg, **kw):
        calls.append(cfg["cp_size"])
        return real(cfg, **kw)

    monkeypatch.setattr(resolve, "resolve", counted)
    monkeypatch.setattr(point, "resolve", counted)
    run = sweep_here(tmp_path / "r", "cp_size=1,2", "seq_lens=[64]", "hidden_size=32", "iters=1", "warmup=0",
                     monkeypatch=monkeypatch, capsys=capsys)
    assert run.returncode == 0 and sorted(calls) == [1, 2], (calls, run.stdout[-1500:])
