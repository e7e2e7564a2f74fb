"""A regular install runs the app: its configs and sample data ship inside the
package, every tool has a console command, and every dependency is a pinned
range."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from matrix_cli import REPO, run

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
    found |= {".".join(("nsa_cp_matrix", *p.parent.relative_to(REPO / "matrix").parts)) for p in (REPO / "matrix").rglob("*.py")}
    assert found and found <= packages, found - packages


def test_every_dependency_is_a_range():
    project = PYPROJECT["project"]
    deps = project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]
    for dep in deps:
        assert re.search(r">=[\d.]+,\s*<[\d.]+", dep), dep
    names = {re.split(r"[<>=\[ ]", d, maxsplit=1)[0] for d in deps}
    assert {"torch", "numpy", "tabulate", "hypothesis"} <= names
    assert any(m.startswith("fuzz:") for m in PYPROJECT["tool"]["pytest"]["ini_options"]["markers"])


def test_every_console_command_names_a_main():
    import importlib

    scripts = PYPROJECT["project"]["scripts"]
    assert set(scripts) == {"nsa-cp-matrix", "nsa-cp-matrix-report", "nsa-cp-matrix-compare", "nsa-cp-matrix-plans"}
    for target in scripts.values():
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), target


def _run(args, cwd, env, timeout=600):
    """``args`` run in ``cwd``: it must exit 0 (the failure shows its output's tail); ``timeout``: idle
    seconds, scaled by the load (matrix_cli.run)."""
    proc = run(args, timeout, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


# Tests that build the checkout share its build/ folder (setuptools builds there): one worker runs them,
# one after the other (two at once failed copying a file the other had just removed).
BUILDS_THE_CHECKOUT = pytest.mark.xdist_group("builds_the_checkout")


@BUILDS_THE_CHECKOUT
def test_a_wheel_runs_the_app_from_an_empty_folder(tmp_path):
    wheels, site, empty = tmp_path / "wheel", tmp_path / "site", tmp_path / "empty"
    empty.mkdir()
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
          str(REPO)], tmp_path, os.environ)
    (wheel,) = wheels.glob("*.whl")
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)], tmp_path,
         os.environ)
    # Only the install on the path: no checkout, no editable finder's folders.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST"))}
    env["PYTHONPATH"] = str(site)
    where = _run([sys.executable, "-c", "import nsa_cp_matrix, nsa_cp_comm; print(nsa_cp_matrix.__file__); "
                  "print(nsa_cp_comm.__file__)"], empty, env)
    assert where.stdout.split() and all(line.startswith(str(site)) for line in where.stdout.split()), where

    _run([sys.executable, "-m", "nsa_cp_matrix", "+matrix=smoke", "--dry-run"], empty, env)
    results = tmp_path / "results"
    # The shipped preset over two of its points (both layouts' configs, ranks
    # that import the installed library): the whole preset's rows are
    # tests/app/test_matrix_cli.py's, from the checkout.
    narrow = ("cp_size=2", "moe_a2a_backend=none", "seq_lens=[1001,300]")
    sweep = _run([sys.executable, "-m", "nsa_cp_matrix", "+matrix=smoke", *narrow, f"results_dir={results}"], empty,
                 env)
    assert "matrix summary: 2 points, 4 rows: " in sweep.stdout and "failed 0" in sweep.stdout, sweep.stdout[-2000:]
    _run([str(site / "bin" / "nsa-cp-matrix-report"), str(results)], empty, env)
    assert (results / "report.md").is_file()
    # The shipped trace, by its relative path in the shipped config.
    _run([str(site / "bin" / "nsa-cp-matrix-plans"), "--workload", "trace", "--batches", "4", "--cp", "2"], empty, env)
    assert sorted(p.name for p in empty.iterdir()) == []


def test_the_license_ships_and_is_named():
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Copyright (c) the nsa-cp-comm authors" in text
    project = PYPROJECT["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert "[LICENSE](LICENSE)" in (REPO / "README.md").read_text()


def test_the_project_urls_are_the_address_printed_texts_point_to():
    from matrix import REPO_URL, doc_url

    urls = PYPROJECT["project"]["urls"]
    assert set(urls) == {"Homepage", "Repository", "Documentation", "Issues"}
    assert urls["Repository"] == urls["Homepage"] == REPO_URL
    assert urls["Documentation"] == f"{REPO_URL}/tree/main/docs" and urls["Issues"] == f"{REPO_URL}/issues"
    assert doc_url("review.md") == f"{REPO_URL}/blob/main/docs/review.md"


def bare_doc_paths(source: str) -> list[str]:
    """Strings of ``source`` (docstrings and comments apart) naming a doc by its
    path in the checkout (``docs/X.md``), which an installed user cannot open."""
    import ast

    tree = ast.parse(source)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    bare = re.compile(r"(?<!blob/main/)\bdocs/[\w-]+\.md")
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings and bare.search(n.value)]


def test_printed_texts_point_to_the_docs_by_their_address():
    """An install has no docs/ folder: what the app prints names the page in the repository."""
    found = {str(p.relative_to(REPO)): bare_doc_paths(p.read_text()) for p in sorted((REPO / "matrix").rglob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}
    assert bare_doc_paths('x = 1\nmsg = "see docs/plugins.md"\n') == ["see docs/plugins.md"]
    assert bare_doc_paths('"""docs/plugins.md"""\nmsg = "https://h/blob/main/docs/plugins.md"\n') == []


def test_the_folder_the_readme_writes_plans_to_is_ignored():
    out = subprocess.run(["git", "check-ignore", "-q", "plans/plans.json"], cwd=REPO)
    assert out.returncode == 0
    # and nothing of the package: matrix/plans/ is `python -m matrix.plans`
    kept = subprocess.run(["git", "check-ignore", "-q", "matrix/plans/__main__.py"], cwd=REPO)
    assert kept.returncode == 1


# The README's Install section, as written (tests/project/test_readme_commands.py
# accounts for each line by this test).
README_INSTALL = (
    "pip install torch --index-url https://download.pytorch.org/whl/cpu",
    "pip install torch",
    "pip install git+https://github.com/nsa-cp-comm/nsa-cp-comm",
    "nsa-cp-matrix +matrix=smoke",
)


def install_lines() -> list[str]:
    from test_readme_commands import readme_commands

    section = (REPO / "README.md").read_text().split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    return readme_commands(section)


def test_the_readmes_install_lines_are_the_ones_the_fresh_venv_runs():
    assert tuple(install_lines()) == README_INSTALL


@BUILDS_THE_CHECKOUT
def test_the_readmes_install_lines_in_a_fresh_venv(tmp_path):
    """A user without the checkout: a fresh venv, torch of their choice (the CPU
    build, from this machine's wheel folder for PyTorch's CPU index), the
    project (from the checkout, the line's own alternative to the repository
    URL), then the smoke sweep by its console command in an empty folder."""
    venv, empty = tmp_path / "venv", tmp_path / "empty"
    empty.mkdir()
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, os.environ)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    config = _run([sys.executable, "-m", "pip", "config", "list"], tmp_path, env).stdout
    folders = re.findall(r"find-links='([^']+)'", config)
    # the CPU build PyTorch's CPU index would give, from this machine's wheel folder (its dependencies from
    # pip's indexes)
    wheels = sorted(w for f in folders for w in Path(f).glob("torch-*+cpu-*.whl"))
    assert wheels, config
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    _run([*pip, str(wheels[-1])], tmp_path, env)
    # README_INSTALL[1], the CUDA build, is the other choice: this machine has none
    _run([*pip, str(REPO)], tmp_path, env, timeout=900)
    sweep = _run([str(venv / "bin" / "nsa-cp-matrix"), "+matrix=smoke"], empty, env)
    assert "matrix summary: 32 points, 80 rows: ok 43" in sweep.stdout, sweep.stdout[-2000:]
    assert list((empty / "results").glob("*/results.csv")) or (empty / "results" / "results.csv").exists()


def test_the_commands_help_names_are_the_installed_ones():
    from matrix import console

    scripts = PYPROJECT["project"]["scripts"]
    assert scripts[console()] == "nsa_cp_matrix.__main__:main"
    for tool in ("report", "compare", "plans"):
        # the console commands' targets are the modules `python -m nsa_cp_matrix.TOOL` runs
        assert console(tool) == f"nsa-cp-matrix-{tool}"
        assert scripts[console(tool)] == f"nsa_cp_matrix.{tool}.__main__:main"
