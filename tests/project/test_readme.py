"""The README's example runs as written, and its commands are the real ones."""

from __future__ import annotations

import re

from matrix_cli import REPO, run_python

README = (REPO / "README.md").read_text()
# Also run by test_readme_commands.py's example chain, as the README's `python example.py`.
EXAMPLE = re.search(r"```python\n(.*?)```", README.split("A runnable example", 1)[1], re.S).group(1)


def test_readme_example_runs_as_written(tmp_path):
    (tmp_path / "example.py").write_text(EXAMPLE)
    proc = run_python("example.py", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [
        "(488, 512) 512 1024 False",
        "0 ok ((1024, 8), True)",
        "1 ok ((1024, 8), True)",
    ]


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text()
    assert "nox -s tests" in README and re.search(r"^nox -s tests$", ci, re.M)


def test_readme_names_every_preset_and_layout():
    for folder in ("matrix", "layout"):
        for p in (REPO / "conf" / folder).glob("*.yaml"):
            assert f"`{p.stem}`" in README, p
