"""A regular install runs the app: its configs and sample data ship inside the
package, and every tool has a console command."""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SHIPPED = {"conf": "nsa_cp_matrix.conf", "data": "nsa_cp_matrix.data"}


def _tracked(folder: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", folder], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [Path(line) for line in out.split()]


def unshipped(config: dict) -> list[str]:
    """Files under conf/ and data/ that the install would leave out."""
    tool = config["tool"]["setuptools"]
    packages, data = set(tool["packages"]), tool.get("package-data", {})
    missing = []
    for folder, package in SHIPPED.items():
        if tool["package-dir"].get(package) != folder:
            return [f"{folder}/ (not installed as {package})"]
        for path in _tracked(folder):
            pkg = ".".join([package, *path.parent.parts[1:]])
            if pkg not in packages or not any(fnmatch.fnmatch(path.name, g) for g in data.get(pkg, ())):
                missing.append(str(path))
    return missing


def test_every_config_and_sample_file_ships():
    assert _tracked("conf") and _tracked("data")
    assert unshipped(PYPROJECT) == []
    # A new config group not listed in pyproject: caught.
    broken = {"tool": {"setuptools": {**PYPROJECT["tool"]["setuptools"]}}}
    broken["tool"]["setuptools"]["packages"] = [p for p in broken["tool"]["setuptools"]["packages"]
                                                if p != "nsa_cp_matrix.conf.layout"]
    assert "conf/layout/zigzag.yaml" in unshipped(broken)


def test_every_library_package_ships():
    # A subpackage added to the library (its folder has an __init__.py) but not to pyproject's list would be
    # missing from every regular install.
    packages = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO / "src").parts) for p in (REPO / "src").rglob("__init__.py")}
    assert found and found <= packages, found - packages


def test_every_console_command_names_a_main():
    import importlib

    scripts = PYPROJECT["project"]["scripts"]
    assert set(scripts) == {"nsa-cp-matrix", "nsa-cp-matrix-report", "nsa-cp-matrix-compare", "nsa-cp-matrix-plans"}
    for target in scripts.values():
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), target


def _run(args, cwd, env, timeout=600):
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_wheel_runs_the_app_from_an_empty_folder(tmp_path):
    wheels, site, empty = tmp_path / "wheel", tmp_path / "site", tmp_path / "empty"
    empty.mkdir()
    build = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                  str(REPO)], tmp_path, os.environ)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("*.whl")
    inst = _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                tmp_path, os.environ)
    assert inst.returncode == 0, inst.stderr[-3000:]
    # Only the install on the path: no checkout, no editable finder's folders.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST"))}
    env["PYTHONPATH"] = str(site)
    where = _run([sys.executable, "-c", "import nsa_cp_matrix, nsa_cp_comm; print(nsa_cp_matrix.__file__); "
                  "print(nsa_cp_comm.__file__)"], empty, env)
    assert where.stdout.split() and all(line.startswith(str(site)) for line in where.stdout.split()), where

    dry = _run([sys.executable, "-m", "nsa_cp_matrix", "+matrix=smoke", "--dry-run"], empty, env)
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    results = tmp_path / "results"
    # The shipped preset over two of its points (both layouts' configs, ranks
    # that import the installed library): the whole preset's rows are
    # tests/test_matrix_cli.py's, from the checkout.
    narrow = ("cp_size=2", "moe_a2a_backend=none", "seq_lens=[1001,300]")
    sweep = _run([sys.executable, "-m", "nsa_cp_matrix", "+matrix=smoke", *narrow, f"results_dir={results}"], empty,
                 env)
    assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-2000:]
    assert "matrix summary: 2 points, 4 rows: " in sweep.stdout and "failed 0" in sweep.stdout, sweep.stdout[-2000:]
    report = _run([str(site / "bin" / "nsa-cp-matrix-report"), str(results)], empty, env)
    assert report.returncode == 0 and (results / "report.md").is_file(), report.stderr[-2000:]
    # The shipped trace, by its relative path in the shipped config.
    plans = _run([str(site / "bin" / "nsa-cp-matrix-plans"), "--workload", "trace", "--batches", "4", "--cp", "2"],
                 empty, env)
    assert plans.returncode == 0, plans.stdout[-2000:] + plans.stderr[-2000:]
    assert sorted(p.name for p in empty.iterdir()) == []


@pytest.mark.parametrize("tool", ["report", "compare", "plans"])
def test_each_tool_runs_as_a_module_of_the_installed_name(tool):
    # The console commands' targets are the modules `python -m nsa_cp_matrix.TOOL` runs.
    assert PYPROJECT["project"]["scripts"][f"nsa-cp-matrix-{tool}"] == f"nsa_cp_matrix.{tool}:main"
