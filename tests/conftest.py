"""Fixtures of the distributed tests: warm gloo RankPools, one per world size,
shared by the tests of one xdist worker (starting ranks costs seconds); and
the hypothesis profiles of the property tests.

Profiles (``HYPOTHESIS_PROFILE=...``, default ``ci``):

* ``ci``: bounded and deterministic, what ``nox -s tests`` runs: the same
  examples on every run and machine (derandomized), no deadline (a loaded
  2-core CI box is slow, not wrong), no example database written.
* ``fuzz``: thousands of random examples per property, for ``nox -s fuzz``
  (``pytest -m fuzz``); a failure prints the shrunk counterexample and the
  blob that replays it (``@reproduce_failure``).
"""

from __future__ import annotations

import os

import pytest

from nsa_cp_comm.harness import RankPool

try:  # a GPU node may lack hypothesis: its GPU tests must still start
    from hypothesis import HealthCheck, Verbosity, settings
except ImportError:  # pragma: no cover - the property tests importorskip it
    settings = None
else:
    settings.register_profile("ci", max_examples=50, deadline=None, derandomize=True, database=None,
                              print_blob=True)
    settings.register_profile("fuzz", max_examples=3000, deadline=None, database=None, print_blob=True,
                              verbosity=Verbosity.normal, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.hookimpl(optionalhook=True)  # xdist's hook: a run without xdist (-p no:xdist) has none
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker more than the CPUs this process may use. Much
    of the suite waits on its rank processes and fresh interpreters; with a
    worker per CPU a 2-core machine was busy 175% of the fast set's run, with
    three 190% (133 s -> 111 s). The noxfile's --maxprocesses caps it."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cpus + 1


@pytest.fixture(scope="session")
def rank_pool(tmp_path_factory):
    """``rank_pool(cp)``: a live gloo/CPU pool of ``cp`` ranks, started on first
    use and restarted if a failed task closed it. All are closed at session end."""
    pools: dict[int, RankPool] = {}

    def get(cp: int) -> RankPool:
        pool = pools.get(cp)
        if pool is None or not pool.alive:
            if pool is not None:
                pool.close()
            pool = RankPool(cp, backend="gloo", device="cpu", workdir=tmp_path_factory.mktemp(f"pool{cp}"))
            pools[cp] = pool
        return pool

    yield get
    for pool in pools.values():
        pool.close()


@pytest.fixture
def pool_workdir(tmp_path):
    """Rendezvous directory of a test's own, short-lived pool."""
    return tmp_path


# What a plot's file holds in a test that reads a report's text, not its pictures.
NOT_DRAWN = b"\x89PNG\r\n\x1a\n(not drawn in this test)"


@pytest.fixture
def plots_not_drawn(monkeypatch):
    """The report's plots are built (their code runs on the run's rows) but
    not drawn: each file holds :data:`NOT_DRAWN`. Drawing is most of a
    report's time; tests/review/test_report.py and test_plots_read.py draw them."""
    from matrix.review import plots

    monkeypatch.setattr(plots, "png", lambda fig: NOT_DRAWN)


@pytest.fixture
def column_wise(monkeypatch):
    """``column_wise(module, name)``: from now on in the test, row-wise
    iteration over any DataFrame raises, and the calls of ``module.name`` (a
    per-cell helper) are counted in the returned dict under ``name``."""
    import pandas as pd

    def forbidden(*_a, **_k):
        raise AssertionError("row-wise iteration over the results")

    def start(module, name: str) -> dict[str, int]:
        monkeypatch.setattr(pd.DataFrame, "iterrows", forbidden)
        monkeypatch.setattr(pd.DataFrame, "itertuples", forbidden)
        calls = {name: 0}
        real = getattr(module, name)

        def counted(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
        return calls

    return start


# --- the slow set --------------------------------------------------------------
#
# `nox -s tests` runs everything but these; `nox -s slow` runs only these, and
# .ci/run runs both. Each entry is a test file, or a test (a node id prefix:
# every parametrisation of it, or one when the id names it), with why it is
# slow. What belongs here proves things the fast set cannot afford to: torch's
# own behaviour, fault drills that wait out hangs and kills, whole sweeps
# through fresh interpreters (each imports torch and starts its own ranks).
# Every verdict the matrix reports keeps a test that flips it in one of the two
# sets. An entry that matches no test is an error (a renamed test would
# otherwise leave the fast set without anyone noticing).
SLOW: dict[str, str] = {
    "tests/lib/test_torch_uneven.py": "torch's own behaviour: fresh multi-process probes, one waits out a hang",
    "tests/harness/test_orphans.py::test_sigkill_of_the_starter": "kill drill: the starter killed at fixed points of rank "
                                                          "start-up; again with each of the worker's guards removed",
    "tests/project/test_readme_commands.py::test_readme_commands_run_as_written": "the README's commands, run as printed",
    "tests/project/test_readme_commands.py::test_readme_sweeps_compose_as_written": "the README's sweeps, each a fresh interpreter",
    "tests/app/test_hostile_sweeps.py": "whole sweeps under signals, closed pipes, huge errors",
    "tests/app/test_field_bugs.py::test_the_preset_at_cp_2": "the field-bugs preset at cp 2 through the app: 20 "
                                                             "rows, a hang and two raises diagnosed among them",
    "tests/app/test_hardening.py::test_sigkill_mid_sweep": "kill drill: a sweep killed, then resumed",
    "tests/app/test_hardening.py::test_torchrun": "points on ranks started by torchrun",
    "tests/app/test_hardening.py::test_injected_fault": "fault drill: a crashing, hanging and raising point in a sweep",
    "tests/app/test_matrix_cli.py::test_ctrl_c": "a sweep interrupted mid-point",
    "tests/app/test_matrix_cli.py::test_resume": "two sweeps",
    "tests/app/test_matrix_cli.py::test_smoke_sweep": "the smoke preset through the CLI, twice, then compare",
    "tests/project/test_install.py::test_the_readmes_install_lines_in_a_fresh_venv": "a fresh venv: torch, the project, "
                                                                         "the smoke sweep",
    "tests/app/test_matrix_cli.py::test_repro": "a sweep, then its repro command",
    "tests/app/test_repro_env.py::test_a_plugins_repro_reruns": "a point through the CLI, then its repro in a fresh shell",
    "tests/app/test_conformance.py::test_the_preset_through_the_cli": "a sweep of the conformance preset (4 points at "
                                                                  "the largest cp)",
    "tests/app/test_matrix_cli.py::test_any_launcher": "sweeps through two launchers",
    "tests/app/test_matrix_cli.py::test_contradictory_mlp_mode": "a sweep through the CLI",
    "tests/app/test_plugins.py::test_what_outside_code_slips_past": "a sweep of every broken example",
    "tests/app/test_plugins.py::test_broken_impls_are_flagged": "a sweep of broken implementations",
    "tests/app/test_plugins.py::test_example_plugin": "the example installed as a plug-in, two sweeps",
    "tests/app/test_plugins.py::test_even_bits": "a sweep through the CLI",
    "tests/app/test_plugins.py::test_bystanders": "a sweep with bystander ranks",
    "tests/app/test_plugins.py::test_a_timed_form_that_diverges": "a sweep through the CLI",
    "tests/app/test_summary.py::test_the_console_the_summary_and_the_report_count_the_same_points": "the conformance "
        "preset through the CLI: its dry run, a sweep and its report",
    "tests/app/test_declared_names.py::test_rows_console_and_resume_of_a_plugin_by_reference": "two sweeps",
    "tests/project/test_bench.py::test_bench_quick_runs": "the benchmark as a user runs it, in a fresh interpreter",
    "tests/project/test_bench.py::test_a_broken_padded_path_exits_1": "the benchmark run, broken, in a fresh "
                                                                     "interpreter",
    "tests/project/test_bench.py::test_a_rank_that_raises_exits_1": "the benchmark run in a fresh interpreter",
    "tests/project/test_bench.py::test_a_slow_padded_path_fails_the_gate": "the benchmark run twice in fresh "
                                                                           "interpreters",
    "tests/app/test_app_name.py::test_printed_commands_name_the_package_the_app_runs_under": "two fresh interpreters, "
        "the app loaded under each of its names (no verdict: what the printed commands say)",
    "tests/app/test_main_job.py::test_a_sweep_with_checked_rows_exits_0_and_composes_each_choice_of_groups_once": "a "
        "fresh interpreter counting Hydra's composes (no verdict: the sweep's cost; its exit code is the CLI tests')",
    "tests/harness/test_forkserver.py::test_the_rank_start_benchmark_runs": "a benchmark as a user runs it: a fresh "
        "interpreter starting pools forked, exec'd, bound and unbound",
    "tests/app/test_budget.py::test_the_memory_estimate_bounds": "a production-sized point's memory peak on real ranks",
    "tests/lib/test_roundtrip.py::test_gather_byte_exact_and_moe_round_trip[8]": "8 ranks",
    "tests/lib/test_roundtrip.py::test_gather_byte_exact_and_moe_round_trip[4]": "4 ranks (2 and 3 stay fast)",
    "tests/lib/test_roundtrip.py::test_legacy_on_uneven_raises_on_every_rank_then_pool_still_works[4]": "4 ranks (2 stays fast)",
    "tests/project/test_readme.py::test_readme_example_runs_as_written": "a fresh interpreter starting ranks",
    "tests/app/test_hardening.py::test_cli_bad_input_through_the_real_cli": "fresh interpreters (the same cases run in-process in the fast set)",
    "tests/lib/test_moe_timing.py::test_point_fault_on_a_rank_is_reported": "fault drill: a raising rank mid-point",
    "tests/app/test_main_job.py::test_a_sweep_straddling_seconds": "a sweep through the CLI with a ticking clock",
    "tests/lib/test_pad_at_split.py::test_designs_rows_match": "a designs sweep through the CLI",
    "tests/lib/test_agree.py::test_dtype_codes_are_the_same_in_every_process": "fresh interpreters",
    "tests/lib/test_properties.py::test_strategy_reaches_the_corners": "a search over the strategy",
    "tests/scale/test_plans.py::test_cli_writes_stats_and_plot": "a fresh interpreter (bad input runs in-process, fast)",
    "tests/app/test_plugins.py::test_broken_plugin_is_one_line": "an installed plug-in, a fresh interpreter",
    "tests/app/test_main_job.py::test_a_sweep_that_checks_nothing_exits_5": "a sweep through the CLI",
    "tests/harness/test_ranks.py::test_hanging_and_stopped_ranks_time_out": "fault drill: waits out a hang",
    "tests/project/test_install.py::test_a_wheel_runs_the_app_from_an_empty_folder": "builds and installs a wheel, then a "
                                                                             "sweep in a fresh interpreter",
    "tests/harness/test_blame.py::test_a_failure_in_the_timed_loop_is_the_row_of_whose_turn_it_was": "fault drill: waits out "
                                                                                             "two hangs, six pools",
    "tests/harness/test_blame.py::test_timed_forms_that_break_the_ranks_are_diagnosed": "fault drill: waits out a hang, "
                                                                                "four pools",
}


# The slow set's longest tests, longest first: they start first. xdist hands
# each worker a test when it is nearly idle, in collection order; one of these
# handed out last would run alone at the end while the other worker waits.
# Each entry is a SLOW test (a node id prefix, as there); order by durations
# (`pytest -m slow --durations=20`).
LONGEST: tuple[str, ...] = (
    "tests/project/test_install.py::test_the_readmes_install_lines_in_a_fresh_venv",
    "tests/app/test_matrix_cli.py::test_ctrl_c",
    "tests/project/test_readme_commands.py::test_readme_commands_run_as_written[engine_comm]",
    "tests/project/test_readme_commands.py::test_readme_commands_run_as_written[review]",
    "tests/app/test_matrix_cli.py::test_smoke_sweep",
    "tests/app/test_plugins.py::test_what_outside_code_slips_past",
    "tests/app/test_hardening.py::test_torchrun",
    "tests/harness/test_blame.py::test_a_failure_in_the_timed_loop_is_the_row_of_whose_turn_it_was",
    "tests/project/test_install.py::test_a_wheel_runs_the_app_from_an_empty_folder",
    "tests/app/test_hostile_sweeps.py::test_a_huge_error_message_leaves_a_resumable_folder",
)


def _slow_entry(nodeid: str) -> str | None:
    return next((e for e in SLOW if nodeid.startswith(e)), None)


# tryfirst: xdist's worker reads the xdist_group marks in its own hook of this
# name; run after it, the marks added here would group nothing.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    used = set()
    grouped = config.pluginmanager.hasplugin("xdist")
    # stable: the rest keep their order
    items[:] = sorted(items, key=lambda item: next((i for i, e in enumerate(LONGEST) if item.nodeid.startswith(e)),
                                                   len(LONGEST)))
    longest = {e for e in LONGEST for item in items if item.nodeid.startswith(e)}
    for item in items:
        if grouped and "rank_pool" in getattr(item, "fixturenames", ()):
            # Two xdist workers run the tests on the warm pools (`--dist
            # loadgroup`), the library's (tests/lib/) and the rest's: each
            # worker would otherwise start its own ranks of every size, and one
            # worker holding all of them (about 115 s) was the fast set's longest.
            lib = item.nodeid.startswith("tests/lib/")
            item.add_marker(pytest.mark.xdist_group("rank_pool_lib" if lib else "rank_pool"))
        entry = _slow_entry(item.nodeid)
        if entry is not None:
            used.add(entry)
            item.add_marker(pytest.mark.slow)
    # Only a run that collected every file can tell that an entry matches nothing.
    args = [a for a in config.args if not a.startswith("-")]
    whole = not config.option.keyword and all(os.path.abspath(a) == str(config.rootpath / "tests") for a in args)
    stale = sorted(set(SLOW) - used) if whole else []
    if stale:
        raise pytest.UsageError(f"tests/conftest.py SLOW names no collected test: {', '.join(stale)}")
    not_slow = [e for e in LONGEST if not _slow_entry(e)]
    stale = sorted(set(LONGEST) - longest) if whole else []
    if not_slow or stale:
        raise pytest.UsageError(f"tests/conftest.py LONGEST names no collected slow test: "
                                f"{', '.join(not_slow + stale)}")


# --- the fast set's duration budget ----------------------------------------------
#
# Every run prints its slowest ten (pyproject.toml's --durations=10). A fast-set
# test should take at most BUDGET_S on an idle 2-core machine; one that needs
# more carries `@pytest.mark.long(reason)`. Over-budget tests are listed at the
# end of the run as a warning, never a failure: a loaded machine is slow, not
# wrong.
BUDGET_S = 10.0


def over_budget(reports) -> list[tuple[str, float]]:
    """``(node id, seconds)`` of each passed or failed call of a fast-set test
    (no ``slow`` marker) over :data:`BUDGET_S` without a ``long`` marker,
    longest first."""
    found = [(r.nodeid, r.duration) for r in reports
             if r.when == "call" and r.duration > BUDGET_S and "slow" not in r.keywords and "long" not in r.keywords]
    return sorted(found, key=lambda item: -item[1])


@pytest.hookimpl(trylast=True)  # after the slowest ten, just above the closing line
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    reports = [r for key in ("passed", "failed") for r in terminalreporter.stats.get(key, ())]
    over = over_budget(reports)
    if over:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        terminalreporter.write_sep("-", f"duration budget: {len(over)} fast-set test(s) over {BUDGET_S:g} s without a "
                                        f"`long` marker (1-minute load {load:.1f}; a warning, not a failure)")
        for nodeid, seconds in over:
            terminalreporter.write_line(f"{seconds:6.1f}s {nodeid}")
