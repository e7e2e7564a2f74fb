"""Every dotted ``matrix.`` / ``nsa_cp_comm.`` name a docstring or comment of the
tree gives names a module or attribute that exists: a module moved into a room
(the app's point module into ``matrix.app``) or a function renamed leaves no
comment pointing a reader at nothing."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import re
import tokenize
from pathlib import Path

import pytest

from matrix_cli import REPO

ROOTS = ("src", "matrix", "tests", "benchmarks", "examples", "docs")
# A dotted name of the project's, not inside a path, a longer name, or an
# OmegaConf resolver's call (``${matrix.plan_lens:...}``: a resolver's name).
NAME = re.compile(r"(?<![\w/.\-])(?<!\$\{)((?:matrix|nsa_cp_comm)(?:\.[A-Za-z_]\w*)+)")


def prose(text: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every comment and docstring of ``text`` (a string a
    statement holds, not one handed to code: a probe's source is code)."""
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found.append((node.lineno, node.value.value))
    return sorted(found)


def resolves(name: str) -> bool:
    """Whether ``name`` is a module of the project, or an attribute chain of one
    (a ``__main__`` module is found, never imported: importing it runs it)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        if parts[i - 1] == "__main__":
            if importlib.util.find_spec(module) is not None and i == len(parts):
                return True
            continue
        try:
            obj = importlib.import_module(module)
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def unresolved(text: str) -> list[tuple[int, str]]:
    return [(line, m.group(1)) for line, chunk in prose(text) for m in NAME.finditer(chunk)
            if not resolves(m.group(1))]


def test_every_dotted_name_in_docstrings_and_comments_exists():
    files = sorted(p for root in ROOTS for p in (REPO / root).rglob("*.py")) + [REPO / "noxfile.py"]
    bad = [f"{path.relative_to(REPO)}:{line}: {name}" for path in files
           for line, name in unresolved(path.read_text())]
    assert not bad, "names that do not exist:\n" + "\n".join(bad)


@pytest.mark.parametrize("text, names", [
    ('"""See matrix.point.run."""\n', ["matrix.point.run"]),  # the module moved to matrix.app.point
    ('def f():\n    """Calls matrix.app.point.gone."""\n', ["matrix.app.point.gone"]),
    ("x = 1  # nsa_cp_comm.roundtrip.no_such_function\n", ["nsa_cp_comm.roundtrip.no_such_function"]),
    ('"""matrix.app.point.run and nsa_cp_comm.plan.plan_split."""\n', []),
    # not the project's names: a path, a resolver, a file, plain code
    ('"""results/hydra/1/matrix.log; ${matrix.plan_lens:even,2}; python -m matrix."""\n', []),
    ('y = "matrix.point.nothing"\nprobe("""nsa_cp_comm.no_such_name""")\n', []),
])
def test_a_name_that_does_not_exist_is_found_and_only_such_a_name(text, names):
    assert [name for _, name in unresolved(text)] == names
