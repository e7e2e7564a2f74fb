"""The app's import name. The folder ``matrix/`` is installed as
``nsa_cp_matrix`` and nothing named ``matrix`` is installed; ``python -m
matrix`` runs the folder from the repository root only. So the app must never
import itself by the absolute name ``matrix``, and every command it prints for
a user to rerun (repro, resume, help, usage) names the package it runs under."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from matrix.app.repro_env import split
from matrix_cli import REPO, run_python

APP = REPO / "matrix"
INSTALLED = "nsa_cp_matrix"


def absolute_self_imports(folder: Path, name: str) -> list[str]:
    """``file:line`` of every import of ``name`` or ``name.*`` by its absolute
    name in the modules of ``folder``, at any depth (function-level too)."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                mods = [node.module or ""]
            else:
                continue
            if any(m == name or m.startswith(name + ".") for m in mods):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_the_app_imports_itself_only_relatively(tmp_path):
    assert absolute_self_imports(APP, "matrix") == []
    # and the check sees each absolute form, in a function too
    for i, line in enumerate(["from matrix.store.results import COLUMNS", "from matrix import plots",
                              "import matrix.app.point", "def f():\n    from matrix.review._review import fmt"]):
        pkg = tmp_path / str(i)
        pkg.mkdir()
        (pkg / "a.py").write_text("from .b import g\n" + line + "\n")
        assert absolute_self_imports(pkg, "matrix") == [f"a.py:{1 + len(line.splitlines())}"], line


# In a fresh interpreter: the app's modules, loaded under the package name
# argv[1], and the commands they print.
PRINTED = textwrap.dedent("""
    import importlib, json, pathlib, sys
    name = sys.argv[1]
    for path in sorted(pathlib.Path(sys.argv[2]).rglob("*.py")):
        parts = path.relative_to(sys.argv[2]).with_suffix("").parts
        importlib.import_module(".".join([name, *parts[:-1]] + ([] if parts[-1] == "__init__" else [parts[-1]])))
    main = sys.modules[f"{name}.app.sweep"]
    point, config, help = (sys.modules[f"{name}.app.{m}"] for m in ("point", "config", "help"))
    main._ACTIVE["argv"] = ["-m", "cp_size=2,4"]
    print(json.dumps({
        "repro": point.repro_command(vars(config.MatrixConfig())),
        "resume": main._resume_hint(),
        "help": help.text().splitlines()[:2],
        "review": [ln for ln in help.text().splitlines() if ln.startswith("review: ")][0],
        "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("matrix", "nsa_cp_matrix")),
    }))
""")


def printed_under(name: str, cwd: Path) -> dict:
    """What the app prints when its folder is imported as package ``name``
    (``cwd`` holds the package)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(REPO / "src")])}
    proc = run_python("-c", PRINTED, name, str(APP), cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_printed_commands_name_the_package_the_app_runs_under(tmp_path):
    """Loaded as ``nsa_cp_matrix`` (the folder linked in under that name),
    every printed command says ``python -m nsa_cp_matrix``, and no module
    named ``matrix`` was loaded; loaded as ``matrix``, they say ``matrix``:
    the name is derived, not written in."""
    (tmp_path / INSTALLED).symlink_to(APP)
    got = printed_under(INSTALLED, tmp_path)
    _, argv = split(got["repro"])  # after the environment the run had (env PYTHONPATH=...)
    assert argv[:3] == ["python", "-m", INSTALLED] and argv[3].startswith("cp_size="), got["repro"]
    assert got["resume"] == f"finish the sweep with: python -m {INSTALLED} -m cp_size=2,4 resume=true"
    # help names the installed commands, and says how this one was started
    assert got["help"][0].startswith("nsa-cp-matrix: check and time")
    assert got["help"][1].endswith(f"; this one runs as python -m {INSTALLED})"), got["help"]
    assert got["review"] == "review: nsa-cp-matrix-report RESULTS_DIR; nsa-cp-matrix-compare BASE_DIR NEW_DIR"
    assert got["loaded"] and all(m.split(".")[0] == INSTALLED for m in got["loaded"]), got["loaded"]

    plain = printed_under("matrix", REPO)
    plain_argv = split(plain["repro"])[1]
    assert plain_argv[:4] == ["python", "-m", "matrix", argv[3]] and plain["resume"].startswith(
        "finish the sweep with: python -m matrix -m ")
    assert plain_argv[3:] == argv[3:]  # only the name differs


def test_the_install_claims_no_top_level_matrix(tmp_path):
    """Outside the checkout, with nothing on PYTHONPATH: the install provides
    ``nsa_cp_matrix`` and no ``matrix``, and the app runs by that name."""
    if importlib.util.find_spec(INSTALLED) is None:
        pytest.skip(f"requires the project installed (pip install -e .): no {INSTALLED} in {sys.executable}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = "import importlib.util as u; print(u.find_spec('matrix') is None, u.find_spec('nsa_cp_matrix') is None)"
    proc = run_python("-c", probe, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    no_matrix, no_app = proc.stdout.split()
    assert no_matrix == "True", "the install claims a top-level `matrix`"
    assert no_app == "False", f"the install has no {INSTALLED}"
    app = run_python("-m", INSTALLED, "--help", cwd=tmp_path, env=env)
    assert app.returncode == 0, app.stderr[-2000:]
    assert app.stdout.startswith("nsa-cp-matrix: ") and f"this one runs as python -m {INSTALLED})" in app.stdout
