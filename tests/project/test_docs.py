"""The repository explains itself: the design doc's module map is the tree,
every module opens with its one job, the docs' tables are what the code
defines, every link resolves inside the repository, and nothing points to a
document outside it or names a work item instead of saying what the code does.
Each check is also run on a planted mistake, to see it fail."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from matrix_cli import REPO

DESIGN = REPO / "docs" / "design.md"
sys.path.insert(0, str(REPO / "docs"))

import doc_tables  # noqa: E402


def repo_files(*patterns: str) -> list[str]:
    """The repository's files (tracked, or new and not ignored) matching
    ``patterns``; without git, the tree minus hidden and result folders."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns], cwd=REPO,
                         capture_output=True, text=True)
    if out.returncode == 0:
        names = out.stdout.splitlines()
    else:
        names = [str(p.relative_to(REPO)) for pat in patterns for p in REPO.glob(f"**/{pat}")
                 if not any(part.startswith(".") or part == "results" for part in p.relative_to(REPO).parts)]
    return sorted({p for p in names if (REPO / p).is_file()})


def modules() -> list[str]:
    found = [str(p.relative_to(REPO)) for p in (*(REPO / "src" / "nsa_cp_comm").rglob("*.py"),
                                                 *(REPO / "matrix").rglob("*.py"))]
    return sorted(p for p in found if not p.endswith("__init__.py"))


def test_the_module_lists_are_the_tree():
    """The lists the checks below walk are not empty: the library, the harness
    and the app are all in them."""
    assert {"src/nsa_cp_comm/plan.py", "src/nsa_cp_comm/harness/checks.py", "matrix/review/report.py"} <= set(modules())
    assert {"README.md", "docs/design.md"} <= set(repo_files("*.md"))


def test_design_doc_module_map_matches_the_tree():
    text = DESIGN.read_text()
    table = text[text.index(". Module map\n") :]
    named = set(re.findall(r"`((?:src/nsa_cp_comm|matrix)/[\w./]+\.py)`", table))
    for cell in re.findall(r"`((?:src/nsa_cp_comm|matrix)/[\w]+\.py)`, `(_?\w+\.py)`", table):
        named.add(str((REPO / cell[0]).parent.relative_to(REPO) / cell[1]))
    for cell in re.findall(r"^\| `(_?\w+\.py)`(?:, `(_?\w+\.py)`)? \|", table, re.M):  # the harness's own table
        named |= {f"src/nsa_cp_comm/harness/{name}" for name in cell if name}
    for room, cell in re.findall(r"^\| `matrix/(\w+)/` \| (.*?) \|", table, re.M):  # the app's rooms, by module name
        named |= {m for name in re.findall(r"`(_?\w+)`", cell) if (REPO / (m := f"matrix/{room}/{name}.py")).exists()}
    assert set(modules()) - named == set(), "modules missing from docs/design.md's module map"
    assert {n for n in named if not (REPO / n).exists()} == set(), "the map names files that do not exist"


def missing_job(source: str) -> bool:
    """A module without an opening docstring of at least a sentence."""
    doc = ast.get_docstring(ast.parse(source))
    return not doc or len(doc.split()) < 5


def test_every_module_opens_with_its_job():
    assert [p for p in modules() if missing_job((REPO / p).read_text())] == []
    # and the check sees a module without one
    assert missing_job("import os\n") and missing_job('"""Helpers."""\n') and missing_job("# a comment\nx = 1\n")
    assert not missing_job('"""The named correctness checks of a point."""\n')


# A work item's number or a specification outside the repository (its section
# numbers, the folder beside the clone): readers of a clone can follow neither.
# Built from parts so that this file does not match itself.
OUTSIDE = re.compile("|".join([r"\b[Ii]ssue\s*#?\d", r"\bSPEC(?:\.md| section| \d)", "shared" + " folder",
                               r"\.\./" + "shared"]))


def outside_lines(path: str, text: str) -> list[str]:
    return [f"{path}:{n}: {line.strip()[:100]}" for n, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]


def test_nothing_points_outside_the_repository_or_to_a_work_item():
    paths = repo_files("*.py", "*.md", "*.yaml", "*.sh", "*.toml", ".ci/run")
    assert [line for p in paths for line in outside_lines(p, (REPO / p).read_text(errors="replace"))] == []


@pytest.mark.parametrize("line", ["# see iss" + "ue 12", "fixed for Iss" + "ue #3", "as SP" + "EC.md says",
                                  "SP" + "EC section 4", "in the shared" + " folder", "open ../" + "shared/x.md"])
def test_a_line_pointing_outside_is_found(line):
    assert outside_lines("x.md", f"fine\n{line}\n") == [f"x.md:2: {line}"]


def test_words_alike_are_not_pointers():
    assert outside_lines("x.md", "an issue with shapes\nthe shared environment\nspecified\n") == []


# --- links: every one resolves inside the repository ----------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def broken_links(path: Path) -> list[str]:
    """Links of a markdown file that leave the repository, name no file, or
    name an anchor the target lacks."""
    text = path.read_text()
    bad = []
    for target in LINK.findall(re.sub(r"```.*?```", "", text, flags=re.S)):
        if re.match(r"[a-z]+:", target):  # a URL: not a file of the repository
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if REPO.resolve() not in dest.parents and dest != REPO.resolve():
            bad.append(f"{target}: outside the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            bad.append(f"{target}: no such heading")
    return bad


def test_every_link_resolves_inside_the_repository():
    assert {p: bad for p in repo_files("*.md") if (bad := broken_links(REPO / p))} == {}


def test_a_broken_link_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A title\n\n## The `x` part (y.py)\n")
    doc = tmp_path / "docs" / "b.md"
    doc.write_text("[ok](a.md) [ok](a.md#the-x-part-ypy) [web](https://x.org/a) [up](../docs/a.md)\n"
                   "[gone](c.md) [anchor](a.md#nope) [out](../../elsewhere.md)\n```\n[code](z.md)\n```\n")
    assert broken_links(doc) == ["c.md: no such file", "a.md#nope: no such heading",
                                 "../../elsewhere.md: outside the repository"]


def test_the_readme_is_short_and_reaches_every_doc():
    """The README is what a newcomer reads first: about 200 lines at most, and
    every doc the README's sections moved to is one link away."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    linked = {(REPO / t.partition("#")[0]).resolve() for t in LINK.findall(readme)}
    docs = {p.resolve() for p in (REPO / "docs").glob("*.md")} | {REPO / "RELIABILITY.md", REPO / "PERF.md"}
    assert {str(p.relative_to(REPO)) for p in docs - linked} == set()


# --- generated tables: one home each, the docs quote it -------------------------


def test_docs_tables_are_rendered_from_the_code():
    assert doc_tables.out_of_date() == [], "run python docs/doc_tables.py"
    assert doc_tables.undescribed() == []


def test_a_table_differing_from_the_code_is_found(monkeypatch):
    monkeypatch.setitem(doc_tables.CHECKS, "new_check", "proves something new")
    assert doc_tables.out_of_date() == ["docs/design.md: checks"]
    monkeypatch.delitem(doc_tables.CHECKS, "new_check")
    monkeypatch.setattr(doc_tables.results, "COLUMNS", (*doc_tables.results.COLUMNS, "new_column"))
    assert doc_tables.undescribed() == ["new_column: no meaning in docs/doc_tables.py"]
    monkeypatch.setitem(doc_tables.report.STATUS_MEANING, "ok", "something else")
    assert doc_tables.out_of_date() == ["docs/columns.md: statuses"]
    monkeypatch.undo()
    monkeypatch.setattr(doc_tables.reliability_table, "BOUNDS", doc_tables.reliability_table.BOUNDS[:-1])
    assert doc_tables.out_of_date() == ["RELIABILITY.md: reliability_bounds"]


def test_a_sweep_exit_column_follows_the_exit_code(monkeypatch):
    """The statuses table's exit codes come from the summary's exit_code, not
    from the text: a status the summary treated as bad would read 1."""
    table = doc_tables.statuses_table()
    assert "| `skipped` |" in table and "0 (5 when every row is `skipped`)" in table
    monkeypatch.setattr(doc_tables.summary, "BAD_STATUSES", (*doc_tables.summary.BAD_STATUSES, "refused"))
    row = next(line for line in doc_tables.statuses_table().splitlines() if line.startswith("| `refused` |"))
    assert row.endswith("| 1 |")


# Where the harness names a failed check: ``rep.fail("x", ...)`` on a rank
# (checks.py); ``check = "x"``, ``return "x", reason`` and ``[("x", f"...")]``
# over ranks (measure.py, blame.py, fold.py); ``yield "x", ...`` (checks.py's layout walk).
EMITTED = re.compile(r"""\.fail\(\s*"(\w+)"|\bcheck = "(\w+)"|return "(\w+)", |\[\("(\w+)", f"|yield "(\w+)", """)


def emitted_checks() -> set[str]:
    names = set()
    for module in ("checks.py", "measure.py", "blame.py", "fold.py", "rank_state.py"):
        path = REPO / "src" / "nsa_cp_comm" / "harness" / module
        names |= {name for groups in EMITTED.findall(path.read_text()) for name in groups if name}
    return names


def test_every_check_the_harness_can_name_is_documented():
    found = emitted_checks()
    assert len(found) >= 14 and "production_form" in found and "collective_skipped" in found
    documented = set(doc_tables.CHECKS)
    assert found == documented, (sorted(found - documented), sorted(documented - found))


def test_doc_store_resume_matches_its_json_and_reads_the_folder_once():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import store_resume

    data = json.loads(store_resume.JSON_PATH.read_text())
    assert store_resume.block(store_resume.DOC.read_text()) == store_resume.render(data), (
        "docs/benchmarks.md's store_resume block differs from its JSON: run python benchmarks/store_resume.py --render")
    runs = data["runs"]
    assert [r["points"] for r in runs] == [1250, 2500, 5000]
    assert all(r["bytes_read"] == r["file_bytes"] for r in runs)  # one read of the file, whatever the points
    # linear: per point no dearer at 5,000 points than twice its cost at 1,250
    assert runs[-1]["resume_us_per_point"] <= 2 * runs[0]["resume_us_per_point"]
    assert runs[-1]["dry_run_ms_per_point"] <= 2 * runs[0]["dry_run_ms_per_point"]  # the dry run too
