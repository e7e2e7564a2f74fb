"""The import graph: every module of the matrix app imports alone (first, in a
fresh state), the app's modules and the library's (its harness included)
import each other without a cycle (module-level and function-level imports
alike), and the library never imports its harness."""

from __future__ import annotations

import ast
import os
import textwrap
from pathlib import Path

import pytest

from matrix_cli import REPO, run_python
from nsa_cp_comm.harness import machine

LIBRARY = REPO / "src" / "nsa_cp_comm"


def package_modules(folder: Path, package: str) -> dict[str, Path]:
    """``{dotted name: file}`` of the package's own modules (no subpackages)."""
    return {(package if p.stem == "__init__" else f"{package}.{p.stem}"): p for p in sorted(folder.glob("*.py"))}


def imports_of(path: Path, name: str) -> set[str]:
    """Every module ``path`` (module ``name``) imports, anywhere in it: at
    module level, in functions, under TYPE_CHECKING. ``from P import N`` names
    both ``P`` and ``P.N`` (N may be a module)."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            module = ".".join(p for p in (base if node.level else "", node.module or "") if p)
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """A cycle of ``graph`` (its modules, the first repeated at the end), or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str]:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return [*path[path.index(n):], n]
            if n not in state and (cycle := visit(n)):
                return cycle
        state[m] = 2
        path.pop()
        return []

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return []


def all_modules(folder: Path, package: str) -> dict[str, Path]:
    """``{dotted name: file}`` of the package's modules and its subpackages'."""
    mods: dict[str, Path] = {}
    for sub in sorted(p.parent for p in folder.rglob("__init__.py")):
        mods.update(package_modules(sub, ".".join([package, *sub.relative_to(folder).parts])))
    return mods


def import_graph(folder: Path, package: str) -> dict[str, set[str]]:
    """Each module of the package and its subpackages -> the ones it imports.
    A module's own packages are left out: Python imports them before the
    module, and ``from . import sibling`` needs the sibling, not them."""
    mods = all_modules(folder, package)
    return {m: {n for n in imports_of(p, m) if n in mods and n != m and not m.startswith(n + ".")}
            for m, p in mods.items()}


def test_the_matrix_app_has_no_import_cycle():
    graph = import_graph(REPO / "matrix", "matrix")
    assert {"matrix.app.resolve", "matrix.app.budget", "matrix.app.point"} <= set(graph)
    assert find_cycle(graph) == []
    # the resolution is below the point and the budget, and neither imports the other's module
    assert graph["matrix.app.resolve"] & {"matrix.app.point", "matrix.app.budget", "matrix.app.preflight"} == set()
    assert "matrix.app.point" not in graph["matrix.app.budget"]


def test_the_library_and_its_harness_have_no_import_cycle():
    graph = import_graph(LIBRARY, "nsa_cp_comm")
    assert {"nsa_cp_comm.plan", "nsa_cp_comm.harness.ranks", "nsa_cp_comm.harness.rank_state"} <= set(graph)
    assert find_cycle(graph) == []


def write_files(root: Path, files: dict[str, str]) -> None:
    """``{path under root: text}`` written, folders made as needed."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def make_package(root: Path, **sources: str) -> Path:
    """A package ``pkg`` under ``root`` with modules of these sources
    (``sub__x``: module ``x`` of the subpackage ``pkg.sub``)."""
    files = {f"pkg/{name.replace('__', '/')}.py": text for name, text in sources.items()}
    write_files(root, {**{f"{folder}/__init__.py": "" for f in files for folder in Path(f).parents[:-1]}, **files})
    return root / "pkg"


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    """The checks above can fail: a function-level import closing a loop
    counts, also through a subpackage."""
    pkg = make_package(tmp_path, a="from .b import f\n", b="def f():\n    from . import a\n", c="from pkg.a import f\n",
                       sub__x="def g():\n    from ..c import f\n", sub__y="from .x import g\n")
    assert find_cycle(import_graph(pkg, "pkg")) == ["pkg.a", "pkg.b", "pkg.a"]
    (pkg / "b.py").write_text("def f():\n    pass\n")
    assert find_cycle(import_graph(pkg, "pkg")) == []
    (pkg / "c.py").write_text("from pkg.a import f\n\ndef h():\n    from .sub.y import g\n")
    assert find_cycle(import_graph(pkg, "pkg")) == ["pkg.c", "pkg.sub.y", "pkg.sub.x", "pkg.c"]


def harness_imports(folder: Path, package: str) -> list[str]:
    """Modules of the library (outside harness/) that import its harness."""
    return [m for m, p in package_modules(folder, package).items()
            if any(n == f"{package}.harness" or n.startswith(f"{package}.harness.") for n in imports_of(p, m))]


def test_the_library_never_imports_its_harness(tmp_path):
    assert harness_imports(LIBRARY, "nsa_cp_comm") == []
    # and the check sees each way of writing such an import
    for i, line in enumerate(["from .harness import RankPool", "from . import harness", "import nsa_cp_comm.harness.ranks",
                              "def f():\n    from nsa_cp_comm.harness.spec import PointSpec"]):
        write_files(tmp_path / str(i), {"nsa_cp_comm/plan.py": line + "\n"})
        assert harness_imports(tmp_path / str(i) / "nsa_cp_comm", "nsa_cp_comm") == ["nsa_cp_comm.plan"], line


# Per module: drop the package's modules, import this one first, note a failure.
ALONE = textwrap.dedent("""
    import importlib, sys, traceback
    package, failed = sys.argv[1], []
    for name in sys.argv[2:]:
        for loaded in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
            del sys.modules[loaded]
        try:
            importlib.import_module(name)
        except BaseException:
            failed.append(name + ": " + traceback.format_exc().strip().splitlines()[-1])
    print("\\n".join(failed))
""")


def failing_alone(package: str, names: list[str], *path: Path) -> list[str]:
    """The modules of ``names`` that fail to import when each is the first of
    ``package`` imported (one interpreter; other libraries stay loaded)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
    proc = run_python("-c", ALONE, package, *names, cwd=path[-1], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split("\n")[:-1] if proc.stdout.strip() else []


def test_every_matrix_module_imports_alone():
    names = sorted(all_modules(REPO / "matrix", "matrix"))
    assert len(names) > 20 and failing_alone("matrix", names, REPO / "src", REPO) == []


def test_a_module_that_fails_alone_is_named(tmp_path):
    """The check above can fail: a module-level cycle breaks the import of its modules."""
    make_package(tmp_path, a="from .b import f\n\ndef g():\n    pass\n", b="from .a import g\n\ndef f():\n    pass\n", c="X = 1\n")
    failed = failing_alone("pkg", ["pkg.a", "pkg.b", "pkg.c"], tmp_path)
    assert [f.split(":")[0] for f in failed] == ["pkg.a", "pkg.b"], failed


def imported(importtime_stderr: str) -> set[str]:
    """The modules a ``python -X importtime`` run imported, from its stderr."""
    return {line.rsplit("|", 1)[1].strip() for line in importtime_stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


def test_help_answers_without_importing_torch():
    """``python -m matrix --help`` is what a user runs first: it reads the
    schema, the presets and the library's pure-Python limits, never torch
    (seconds of imports on a loaded machine)."""
    proc = run_python("-X", "importtime", "-m", "matrix", "--help")
    assert proc.returncode == 0 and "keys:" in proc.stdout, proc.stderr[-2000:]
    modules = imported(proc.stderr)
    assert {"matrix.app.help", "matrix.app.config", "nsa_cp_comm.harness.calibrate"} <= modules
    assert not {m for m in modules if m.split(".")[0] == "torch"}, sorted(m for m in modules if "torch" in m)[:5]
    assert imported("import time:       425 |     119160 |       torch\n") == {"torch"}


@pytest.mark.skipif(not machine.gpu_driver_absent(), reason="needs a machine without a GPU driver (with one, the "
                    "sweep's own process asks torch for its GPUs)")
def test_a_sweeps_own_process_never_imports_torch(tmp_path):
    """The ranks import torch (their fork server, once); the process that
    composes, resolves, sends the point to its ranks, folds and writes the
    rows does not: it would pay seconds of imports for nothing, at every
    sweep. A built-in implementation's functions are imported where called."""
    proc = run_python("-X", "importtime", "-m", "matrix", "-m", "cp_size=2", "seq_lens=[64]", "hidden_size=32",
                      "iters=2", "warmup=0", f"results_dir={tmp_path / 'res'}")
    assert proc.returncode == 0 and "ok 2, failed 0" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    modules = imported(proc.stderr)
    assert {"nsa_cp_comm.impls", "nsa_cp_comm.harness.on_pool", "nsa_cp_comm.harness.fold"} <= modules
    assert not {m for m in modules if m.split(".")[0] == "torch"}, sorted(m for m in modules if "torch" in m)[:5]


def test_the_librarys_names_load_on_first_use():
    probe = textwrap.dedent("""
        import sys
        import nsa_cp_comm
        from nsa_cp_comm.harness import calibrate, spec
        before = "torch" in sys.modules
        from nsa_cp_comm import *
        from nsa_cp_comm.harness import run_on_ranks
        assert callable(padded_gather) and callable(run_on_ranks) and "plan_split" in dir(nsa_cp_comm)
        assert set(nsa_cp_comm.__all__) <= set(dir(nsa_cp_comm))
        assert str(spec.DTYPES["bfloat16"]) == "torch.bfloat16" and tuple(spec.DTYPES) == spec.DTYPE_NAMES
        try:
            nsa_cp_comm.no_such_name
        except AttributeError as exc:
            assert "no_such_name" in str(exc)
        else:
            raise AssertionError("an unknown name was found")
        print(before, "torch" in sys.modules)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = run_python("-c", probe, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "True"]


# The rooms of matrix/ (docs/design.md, Module map) and what each may import of
# the others: the store nothing, scale the store (and review's figure and table
# helpers, for its plot and a workload's table), review the store and scale,
# the app all of them.
ROOMS_MAY_IMPORT = {"store": set(), "scale": {"store"}, "review": {"store", "scale"},
                    "app": {"store", "scale", "review"}}
ALSO_ALLOWED = {("matrix.scale.plans", "matrix.review.plots"), ("matrix.scale.workload", "matrix.review._review")}
# Outside the store, what opens a file, and the files it may be: none of a results folder.
OPENS = {"open", "read_csv", "read_text", "read_bytes", "write_text", "write_bytes", "open_binary", "open_text",
         "to_csv", "fdopen"}
OPENS_ALLOWED = {("matrix.app.help", "read_text"),  # the shipped configs
                 ("matrix.app.guards", "open"),  # /dev/null under a closed stdout
                 ("matrix.review._review", "read_csv"),  # the bytes the store read
                 ("matrix.scale.workload", "read_text"), ("matrix.scale.workload", "open_text"),  # input files
                 ("matrix.scale.nccl_tests", "read_bytes")}


def room_violations(folder: Path, package: str) -> list[str]:
    """``module -> what`` for each import across rooms the rules forbid, and
    each call outside the store that opens a file the rules do not allow."""
    found = []
    for m, path in sorted(all_modules(folder, package).items()):
        room = m.split(".")[1] if m.count(".") > 1 else ""
        for n in sorted(imports_of(path, m)):
            other = n.split(".")[1] if n.startswith(package + ".") and n.count(".") > 1 else ""
            if room in ROOMS_MAY_IMPORT and other in ROOMS_MAY_IMPORT and other != room \
                    and other not in ROOMS_MAY_IMPORT[room] \
                    and not any(m == a and (n == b or n.startswith(b + ".")) for a, b in ALSO_ALLOWED):
                found.append(f"{m} -> {n}")
        if room != "store":
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    f = node.func
                    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                    if name in OPENS and (m, name) not in OPENS_ALLOWED:
                        found.append(f"{m} opens ({name})")
    return found


def test_each_room_imports_only_what_its_line_in_the_map_allows(tmp_path):
    assert room_violations(REPO / "matrix", "matrix") == []
    # and the check sees a broken rule of each kind
    pkg = make_package(tmp_path, store__a="from ..app import b\n", app__b="X = 1\n", review__c="from ..app.b import X\n",
                       scale__d="def f():\n    from ..review import c\n", review__e="open('results.csv').read()\n")
    assert room_violations(pkg, "pkg") == ["pkg.review.c -> pkg.app.b", "pkg.review.c -> pkg.app.b.X",
                                           "pkg.review.e opens (open)", "pkg.scale.d -> pkg.review.c",
                                           "pkg.store.a -> pkg.app.b"]


TEST_ROOMS = {"lib", "harness", "app", "store", "review", "scale", "project"}


def misplaced_tests(tests: Path) -> list[str]:
    """Test files outside the rooms docs/design.md names, and rooms it does not name."""
    found = [str(p.relative_to(tests)) for p in sorted(tests.rglob("test_*.py"))
             if p.parent.parent != tests or p.parent.name not in TEST_ROOMS]
    design = (REPO / "docs" / "design.md").read_text()
    return found + [f"{room}/ (not in docs/design.md)" for room in sorted(TEST_ROOMS) if f"`tests/{room}/`" not in design]


def test_tests_live_in_the_rooms_of_the_code_they_test(tmp_path):
    assert misplaced_tests(REPO / "tests") == []
    # and the check sees a test at the top, in a room of its own, and one level too deep
    write_files(tmp_path, dict.fromkeys(("test_top.py", "misc/test_x.py", "app/deep/test_y.py", "app/test_ok.py"), ""))
    assert misplaced_tests(tmp_path) == ["app/deep/test_y.py", "misc/test_x.py", "test_top.py"]


def cross_room_test_imports(tests: Path) -> list[str]:
    """Test modules importing a test module of another room: which one pytest
    finds depends on what it collected first, so shared helpers live in the
    support modules at tests/."""
    bad = []
    for path in sorted(tests.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for name in names:
                if name.startswith("test_") and not (path.parent / f"{name}.py").exists():
                    bad.append(f"{path.relative_to(tests)}: {name}")
    return bad


def test_tests_share_helpers_through_support_modules_not_other_rooms_tests(tmp_path):
    assert cross_room_test_imports(REPO / "tests") == []
    # and the check sees an import of another room's test module, not one of its own room's
    write_files(tmp_path, {"review/test_compare.py": "", "store/test_own.py": "",
                           "store/test_runs.py": "import test_compare as tc\nfrom test_own import x\n"})
    assert cross_room_test_imports(tmp_path) == ["store/test_runs.py: test_compare"]


def test_a_deferred_function_is_imported_at_its_first_call_and_pickles_as_its_name():
    import pickle

    from nsa_cp_comm import impls, roundtrip
    from nsa_cp_comm._lazy import Deferred

    later = Deferred("json:dumps")
    assert later._fn is None and later([1]) == "[1]" and later._fn is not None
    again = pickle.loads(pickle.dumps(later))
    assert again.target == "json:dumps" and again._fn is None
    with pytest.raises(ValueError, match="expected module:function"):
        Deferred("json.dumps")
    # the built-ins call the library's own functions
    impls.load_builtins()
    assert impls.get("padded").gather.resolve() is roundtrip.padded_gather
