"""The set-up as a newcomer meets it: one shared nox environment, installer
settings that reach uv as they reach pip, presets that run their sweep, and
quoted times that are the committed measurement."""

from __future__ import annotations

import inspect
import json
import os
import re
import shlex
import sys
import tomllib
import types
from copy import deepcopy

import pytest
import yaml

from matrix_cli import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import compare_power  # noqa: E402
import readme_times  # noqa: E402

README = (REPO / "README.md").read_text()
SETUP_DOC = REPO / "docs" / "setup.md"
NOX = readme_times.noxfile()
SESSIONS = {"tests", "fuzz", "matrix", "report", "compare", "harness", "bench"}
# The committed measurements: the README's times, docs/setup.md's session times, the gate's figures.
TIMES = json.loads(readme_times.JSON_PATH.read_text())
SESSION_TIMES = json.loads(readme_times.SESSIONS_JSON.read_text())
GATE = json.loads(compare_power.JSON_PATH.read_text())


def _squash(text: str) -> str:
    return " ".join(text.split())


# --- README figures: from the committed measurement --------------------------


def test_readme_quotes_exactly_the_committed_times():
    found = readme_times.blocks(README)
    assert set(found) == set(readme_times.RENDERED)
    for name in readme_times.RENDERED:
        assert _squash(found[name]) == _squash(readme_times.render(name, TIMES)), (
            f"README's {name} times differ from {readme_times.JSON_PATH.name}: "
            "run python benchmarks/readme_times.py --render"
        )


def test_committed_times_say_where_and_when():
    for name in readme_times.NAMES:
        part = TIMES[name]
        assert part["wall_s"] > 0 and part["machine"]["nproc"] >= 1 and part["machine"]["cpu"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", part["date"])
        assert part["load_before"] >= 0 and part["load_after"] >= 0
    assert TIMES["sweep"]["points"] > 0 and TIMES["tests"]["counts"]["passed"] > 0
    # The quoted suite time is of a passing suite.
    assert not TIMES["tests"]["counts"].get("failed") and not TIMES["tests"]["counts"].get("error")


def test_times_are_of_the_commands_nox_runs():
    # The run readme_times is timing replaces the suite's figure with its own,
    # of today's command: checking the old figure there would refuse every
    # change to the command's arguments.
    if os.environ.get(readme_times.MEASURING) != "tests":
        assert TIMES["tests"]["command"] == "pytest " + shlex.join(NOX.PYTEST_ARGS)
    assert TIMES["sweep"]["command"] == "python -m matrix " + " ".join(NOX.matrix_overrides([]))


def test_render_changes_with_the_figures():
    slower = deepcopy(TIMES)
    slower["sweep"]["wall_s"] += 100
    slower["tests"]["wall_s"] += 100
    for name in readme_times.NAMES:
        assert readme_times.render(name, TIMES) != readme_times.render(name, slower)
    assert readme_times.rendered_readme(README, TIMES) != readme_times.rendered_readme(README, slower)


def test_setup_doc_quotes_exactly_the_committed_session_times():
    """docs/setup.md's table of every nox session's time is the committed
    measurement rendered, one row per session the noxfile registers."""
    block = readme_times.sessions_block(SETUP_DOC.read_text())
    assert block is not None, "docs/setup.md has no <!-- nox_times --> block"
    names = readme_times.session_names()
    assert _squash(block) == _squash(readme_times.render_sessions(SESSION_TIMES, names)), (
        "docs/setup.md's session times differ from nox_times.json: run python benchmarks/readme_times.py --render")
    rows = [ln for ln in block.splitlines() if ln.startswith("| `nox -s ")]
    assert [re.match(r"\| `nox -s (\w+)`", ln).group(1) for ln in rows] == names
    assert {"tests", "slow", "fuzz", "matrix"} <= set(names)
    # at least the two a newcomer runs first are measured
    assert {"tests", "matrix"} <= set(SESSION_TIMES["sessions"])


def test_session_times_say_where_when_at_what_load_and_of_todays_commands():
    for name, part in SESSION_TIMES["sessions"].items():
        assert part["wall_s"] > 0 and part["machine"]["nproc"] >= 1 and part["machine"]["cpu"], name
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", part["date"]) and part["commit"], name
        ld = part["load_during"]
        assert 0 <= ld["min"] <= ld["median"] <= ld["max"] and ld["samples"] >= 2, name
        # the command the noxfile runs for the session today (the run timing
        # the suite is today's command by definition)
        if name == "tests" and os.environ.get(readme_times.MEASURING) == "tests":
            continue
        posargs = [a.format(tmp="TMP", results="TMP/run") for a in readme_times.SESSION_POSARGS.get(name, [])]
        argv, _, _ = readme_times.session_command(name, posargs)
        shown = [a.replace(f"{REPO}{os.sep}", "") for a in argv[1:]]
        assert part["command"] == "python " + shlex.join(shown), name


def test_session_table_changes_with_the_figures():
    names = readme_times.session_names()
    slower = deepcopy(SESSION_TIMES)
    for part in slower["sessions"].values():
        part["wall_s"] += 100
    assert readme_times.render_sessions(SESSION_TIMES, names) != readme_times.render_sessions(slower, names)
    louder = deepcopy(SESSION_TIMES)
    next(iter(louder["sessions"].values()))["load_during"]["median"] += 5
    assert readme_times.render_sessions(SESSION_TIMES, names) != readme_times.render_sessions(louder, names)
    # a session measured as failing says so
    failing = deepcopy(SESSION_TIMES)
    part = failing["sessions"]["matrix"]
    part.update(ok=False, exit=1)
    assert "**exited 1**" in readme_times.render_sessions(failing, names).split("`nox -s matrix`", 2)[1]
    assert "not measured yet" in readme_times.render_sessions({"sessions": {}}, names)


def test_session_command_is_what_the_noxfile_runs(fake):
    for name in readme_times.session_names():
        posargs = [a.format(tmp="/T", results="/T/run") for a in readme_times.SESSION_POSARGS.get(name, [])]
        args, kwargs = fake(name, *posargs)
        argv, env, codes = readme_times.session_command(name, posargs)
        assert argv[1:] == list(args[1:]) and env == kwargs.get("env", {}), name
        assert codes == kwargs.get("success_codes", [0]), name


@pytest.mark.parametrize("load", compare_power.measured_loads(), ids=lambda v: f"load{v:g}" if v else "as-is")
def test_docs_quote_exactly_the_committed_gate_figures(load):
    path = compare_power.json_path(load)
    data = json.loads(path.read_text())
    assert data.get("load_target") == load
    block = compare_power.block(load).search(compare_power.DOC.read_text())
    assert block, f"{compare_power.DOC.name} has no block for {path.name}"
    assert _squash(block.group(2)) == _squash(compare_power.render(data)), (
        f"the quoted gate figures differ from {path.name}: run python benchmarks/compare_power.py --render")


def test_gate_figures_are_of_the_readme_review_flow():
    """compare_power measures the sweep the README's review flow runs, as written."""
    base = next(ln for ln in README.splitlines() if ln.startswith("nsa-cp-matrix -m") and "results/base" in ln)
    argv = tuple(a for a in shlex.split(base)[1:] if not a.startswith("results_dir="))
    assert argv == compare_power.SWEEP
    assert GATE["sweep"] == "python -m matrix " + " ".join(compare_power.SWEEP)


def test_gate_figures_are_of_the_documented_defaults_and_read_from_the_trials():
    """The figures are of compare's current defaults, and the text counts the
    trials' own exits: one A/A pair that failed, or one slowed run that passed,
    reads as such whatever totals the file stores."""
    from matrix.review import compare

    assert GATE["defaults"] == {"metric": compare.DEFAULT_METRIC, "threshold": compare.DEFAULT_THRESHOLD}
    n = len(GATE["trials"])
    alarm, missed = deepcopy(GATE), deepcopy(GATE)
    alarm["trials"][0]["aa"]["exit"] = 1
    # one padded point a slowed run did not flag: not detected "on every padded point"
    caught = next(i for i, t in enumerate(GATE["trials"]) if compare_power.detected(t))
    missed["trials"][caught]["slowed"]["padded_flagged"] = missed["trials"][caught]["padded_points"] - 1
    false_alarms, detected = compare_power.verdicts(GATE["trials"])
    assert f"**{false_alarms + 1} false alarms in {n} pairs**" in compare_power.render(alarm)
    assert f"**flagged on every padded point in {detected - 1} of {n} runs**" in compare_power.render(missed)


def test_gate_figures_quote_each_points_own_slowdown():
    """The slowdown quoted is every padded point's own, read from the trials:
    one point that saw less than the rest moves the quoted range."""
    seen = deepcopy(GATE)
    for t in seen["trials"]:
        t.setdefault("slowdown_per_point", {"cp=2 [1000]": 1.3})
        t.setdefault("aa_per_point", {"cp=2 [1000]": 1.0})
    low = deepcopy(seen)
    low["trials"][-1]["slowdown_per_point"]["cp=2 [1000]"] = 1.04
    low["trials"][-1]["aa_per_point"]["cp=2 [1000]"] = 0.71
    assert "saw as 1.04x-" in compare_power.render(low) and "moved 0.71x-" in compare_power.render(low)
    assert "saw as 1.04x-" not in compare_power.render(seen)


def test_pytest_closing_line_is_counted():
    out = "....\n924 passed, 3 skipped, 1 deselected, 2 warnings in 100.23s (0:01:40)\n"
    assert readme_times.parse_pytest_counts(out) == {"passed": 924, "skipped": 3, "deselected": 1}
    assert readme_times.parse_pytest_counts("no tests ran in 0.01s") == {}


# --- nox: one environment for every session -----------------------------------


def test_every_session_runs_in_the_one_shared_environment():
    import nox.registry

    registered = {name: fn for name, fn in nox.registry.get().items() if name in SESSIONS}
    assert set(registered) == SESSIONS
    for name, fn in registered.items():
        # nox makes no environment of its own for the session...
        assert fn.venv_backend == "none", name
        # ...which runs the shared environment's python
        assert re.search(r"\b_run\(\s*session\b", inspect.getsource(fn.func)), name
    assert NOX.SHARED_ENV == REPO / ".nox" / "_shared"
    assert NOX.STAMP.parent == NOX.SHARED_ENV


@pytest.fixture
def fake(monkeypatch):
    """A session of the noxfile run on a stand-in: its one run call, ``(args, kwargs)``."""
    monkeypatch.setattr(NOX, "shared_python", lambda session: "PY")

    def call(session_name, *posargs):
        s = types.SimpleNamespace(posargs=list(posargs), env={}, calls=[])
        s.run = lambda *args, **kwargs: s.calls.append((args, kwargs))
        getattr(NOX, session_name)(s)
        assert len(s.calls) == 1 and s.calls[0][0][0] == "PY"
        return s.calls[0]

    return call


def test_bare_test_run_that_collects_nothing_fails(fake):
    args, kwargs = fake("tests")
    assert list(args[1:]) == ["-m", "pytest", *NOX.PYTEST_ARGS]
    assert kwargs["success_codes"] == [0]
    _, kwargs = fake("tests", "-k", "plan")
    assert kwargs["success_codes"] == [0, 5]


def test_the_fast_set_and_the_slow_set_split_the_suite_and_ci_runs_both(fake):
    """`nox -s tests` leaves the slow set out, `nox -s slow` runs only it, and
    .ci/run runs both, failing on either (set -e)."""
    fast, _ = fake("tests")
    slow, kwargs = fake("slow")
    assert " ".join(fast[1:]).endswith("-m not slow") and " ".join(slow[1:]).endswith("-m slow")
    assert kwargs["success_codes"] == [0]
    assert "-v" in slow and "-q" not in slow  # the slow set names each test as it finishes, no silent minutes
    lines = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()]
    assert "set -euo pipefail" in lines and "nox -s tests" in lines and "nox -s slow" in lines


def test_the_duration_budget_lists_only_unmarked_fast_tests_over_it():
    """The checker can fail: a fast test over the budget is listed, longest
    first; one marked `long` (its reason given), a slow-set test, one within
    the budget and a setup phase are not. Every run prints its slowest ten."""
    import conftest

    def report(nodeid, seconds, *markers, when="call"):
        return types.SimpleNamespace(nodeid=nodeid, duration=seconds, when=when,
                                     keywords=dict.fromkeys([nodeid.rsplit("::", 1)[-1], *markers], 1))

    over = conftest.BUDGET_S + 1
    reports = [report("t::a", over), report("t::b", over + 5), report("t::c", over, "long"),
               report("t::d", over, "slow"), report("t::e", conftest.BUDGET_S), report("t::f", over, when="setup")]
    assert conftest.over_budget(reports) == [("t::b", over + 5), ("t::a", over)]
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--durations=10" in ini["addopts"] and any(m.startswith("long(reason): ") for m in ini["markers"])


def test_the_warm_pool_tests_share_their_xdist_worker(request, rank_pool):
    """Under `nox -s tests` (xdist, `--dist loadgroup`) the tests on the warm
    pools run on two workers (the library's, tests/lib/, and the rest's), so
    each world size's ranks start twice at most. Grouping fails silently: the
    conftest hook that marks the tests must run before xdist reads the marks,
    and pytest 9.2 stopped honouring the renamed node ids xdist groups by
    (pyproject.toml pins pytest below it). Either way the suite started ~50%
    more ranks, each importing torch, and this test sees the missing group
    suffix. (`rank_pool` is requested to be grouped; no rank starts.)"""
    if not (os.environ.get("PYTEST_XDIST_WORKER") and getattr(request.config.option, "loadgroup", False)):
        pytest.skip("requires an xdist worker under --dist loadgroup (what nox -s tests runs)")
    assert request.node.nodeid.endswith("@rank_pool"), (
        f"{request.node.nodeid!r}: the warm-pool tests are not grouped")


def test_fuzz_session_runs_the_marked_tests_on_the_long_profile(fake):
    args, kwargs = fake("fuzz")
    assert kwargs["env"] == {**NOX.SESSION_ENV, "HYPOTHESIS_PROFILE": "fuzz"}
    line = " ".join(args[1:])
    assert "-m pytest -m fuzz -p no:xdist -x" in line
    assert kwargs["success_codes"] == [0]


@pytest.mark.parametrize(
    ("posargs", "expected"),
    [
        ((), ["-m", "+matrix=default"]),
        (("+matrix=smoke",), ["-m", "+matrix=smoke"]),
        (("-m", "+matrix=smoke"), ["-m", "+matrix=smoke"]),
        (("cp_size=2", "iters=1"), ["-m", "+matrix=default", "cp_size=2", "iters=1"]),
    ],
)
def test_matrix_session_passes_one_multirun_flag(fake, posargs, expected):
    args, _ = fake("matrix", *posargs)
    assert list(args[1:]) == ["-m", "matrix", *expected]


def test_stamp_sees_every_input():
    base = (b"pyproject", "torch==2.13.0", "", "/usr/bin/python3")
    ref = NOX.stamp(*base)
    assert ref == NOX.stamp(*base)
    for i, other in enumerate((b"pyproject2", "torch==2.11.0", "file:///idx", "/other/python")):
        assert ref != NOX.stamp(*base[:i], other, *base[i + 1:]), other


@pytest.mark.parametrize("order", ["as pip lists them", "reversed"])
def test_pip_settings_reach_uv(order):
    lines = [
        ":env:.find-links='/env/wheels'",
        "global.find-links='/global/wheels'",
        "global.extra-index-url='file:///a/simple file:///b/simple'",
        "global.constraint='/etc/c.txt'",
        "install.index-url=\"file:///mirror/simple\"",
        "global.index-url='file:///ignored/simple'",
        "global.cert='/etc/ssl/ca.pem'",
    ]
    # Precedence is by section, never by line order: a "first wins" or "last
    # wins" reading passes one order and fails the other.
    if order == "reversed":
        lines.reverse()
    settings = NOX.pip_settings(lines, {"PIP_TRUSTED_HOST": "mirror.local"})
    assert settings["find-links"] == ["/env/wheels"]  # the environment wins, as in pip
    assert settings["index-url"] == ["file:///mirror/simple"]  # [install] over [global]
    args = NOX.uv_args(settings)
    pairs = set(zip(args[::2], args[1::2]))
    assert {("--find-links", "/env/wheels"), ("--extra-index-url", "file:///a/simple"),
            ("--extra-index-url", "file:///b/simple"), ("--index-url", "file:///mirror/simple"),
            ("--constraint", "/etc/c.txt"), ("--allow-insecure-host", "mirror.local")} <= pairs
    assert args[-2:] == ["--index-strategy", "unsafe-best-match"]
    assert "--no-index" in NOX.uv_args(NOX.pip_settings([], {"PIP_NO_INDEX": "1"}))


# --- torch: documented, overridable -------------------------------------------


def test_torch_settings_are_documented_and_read():
    """Each setting the noxfile reads is in the set-up doc's table with the
    noxfile's own default, and the route without nox pins that same torch."""
    setup = SETUP_DOC.read_text()
    noxfile = (REPO / "noxfile.py").read_text()
    read = dict(re.findall(r'os\.environ\.get\("(NSA_\w+)", "([^"]*)"\)', noxfile))
    assert set(read) == {"NSA_TORCH_SPEC", "NSA_TORCH_INDEX"}
    documented = dict(re.findall(r"^\| `(NSA_\w+)` \| ([^|]*) \|", setup, re.M))
    assert set(documented) == set(read)
    assert documented["NSA_TORCH_SPEC"].strip() == f"`{read['NSA_TORCH_SPEC']}`"
    assert read["NSA_TORCH_INDEX"] == "" and documented["NSA_TORCH_INDEX"].startswith("empty")
    # The route without nox installs the same torch before the project.
    assert setup.index(f"pip install {read['NSA_TORCH_SPEC']}") < setup.index("pip install -e '.[test]'")
    assert "`NSA_TORCH_SPEC`" in README and "docs/setup.md" in README


# --- presets ------------------------------------------------------------------


@pytest.mark.parametrize("preset", sorted(p.stem for p in (REPO / "conf" / "matrix").glob("*.yaml")))
def test_a_preset_with_a_sweep_runs_it_without_dash_m(preset):
    cfg = yaml.safe_load((REPO / "conf" / "matrix" / f"{preset}.yaml").read_text())
    if cfg.get("hydra", {}).get("sweeper", {}).get("params"):
        assert cfg["hydra"].get("mode") == "MULTIRUN", preset


def test_gate_figures_append_only_to_a_measurement_of_the_same_setting(tmp_path, capsys):
    """--append joins new trials to a file only when it measured the same
    sweep, fault and held load: trials of two settings never mix in one count."""
    out = tmp_path / "p.json"
    out.write_text(json.dumps(GATE))
    other = GATE["fault_fraction"] + 0.1
    argv = ["--append", "--pairs", "1", "--json", str(out), "--no-doc", "--fault-fraction", f"{other:g}"]
    assert compare_power.main(argv) == 2
    assert "fault_fraction" in capsys.readouterr().err
    assert compare_power.main(["--append", "--pairs", "1", "--json", str(tmp_path / "none.json"), "--no-doc"]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("session", sorted(SESSIONS))
def test_every_session_writes_the_checkouts_bytecode(fake, session):
    """A CI image's PYTHONDONTWRITEBYTECODE=1 would have pytest rewrite every test
    module in every worker at every run, and each fresh interpreter compile the
    project again: every session's command runs with it emptied (unset)."""
    posargs = ("x", "y") if session == "compare" else ()
    _, kwargs = fake(session, *posargs)
    assert kwargs["env"]["PYTHONDONTWRITEBYTECODE"] == ""
