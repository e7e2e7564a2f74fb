"""The repository explains itself: the design doc's module map is the tree,
every module opens with its one job, and nothing points to a document outside
the repository or names a work item instead of saying what the code does."""

from __future__ import annotations

import ast
import re
import subprocess

import pytest

from matrix_cli import REPO

DESIGN = REPO / "docs" / "design.md"


def tracked(*patterns: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("needs a git checkout")
    return [p for p in out.stdout.splitlines() if (REPO / p).exists()]


def modules() -> list[str]:
    return sorted(p for p in tracked("src/nsa_cp_comm/*.py", "matrix/*.py") if not p.endswith("__init__.py"))


def test_design_doc_module_map_matches_the_tree():
    text = DESIGN.read_text()
    table = text[text.index(". Module map\n") :]
    named = set(re.findall(r"`((?:src/nsa_cp_comm|matrix)/[\w./]+\.py)`", table))
    for cell in re.findall(r"`((?:src/nsa_cp_comm|matrix)/[\w]+\.py)`, `(_?\w+\.py)`", table):
        named.add(str((REPO / cell[0]).parent.relative_to(REPO) / cell[1]))
    assert set(modules()) - named == set(), "modules missing from docs/design.md's module map"
    assert {n for n in named if not (REPO / n).exists()} == set(), "the map names files that do not exist"


@pytest.mark.parametrize("path", modules())
def test_every_module_opens_with_its_job(path):
    doc = ast.get_docstring(ast.parse((REPO / path).read_text()))
    assert doc and len(doc.split()) >= 5, f"{path} has no opening docstring saying what it holds"


# A work item's number or a specification outside the repository (its section
# numbers, the folder beside the clone): readers of a clone can follow neither.
# Built from parts so that this file does not match itself.
OUTSIDE = re.compile("|".join([r"\b[Ii]ssue\s*#?\d", r"\bSPEC(?:\.md| section| \d)", "shared" + " folder",
                               r"\.\./" + "shared"]))


def test_nothing_points_outside_the_repository_or_to_a_work_item():
    offenders = []
    for path in tracked("*.py", "*.md", "*.yaml", "*.sh", "*.toml", ".ci/run"):
        for n, line in enumerate((REPO / path).read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path}:{n}: {line.strip()[:100]}")
    assert offenders == []
