"""Every verdict has its pair of tests (tests/verdicts.py): one that breaks the thing checked,
one that breaks the checker, each a test that exists; a new check, gate or coverage rule
without a pair fails here."""

from __future__ import annotations

import ast

import pytest

from matrix.review import compare, coverage
from matrix_cli import REPO
from nsa_cp_comm.harness.checks import CHECKS
from verdicts import VERDICTS

OWN = ("report verdict", "bench gate")


def every_verdict() -> list[str]:
    return [*CHECKS, *compare.GATES, coverage.RAN_NOTHING, coverage.NO_UNEVEN, *OWN]


def missing(verdicts: dict[str, tuple[str, str]]) -> list[str]:
    """Each verdict without both tests, and each test named that is not a test function of its file."""
    out = [f"{v}: no pair" for v in every_verdict() if v not in verdicts or not all(verdicts[v])]
    out += [f"{v}: not a verdict" for v in verdicts if v not in every_verdict()]
    tests: dict[str, set[str]] = {}
    for verdict, pair in verdicts.items():
        for node in filter(None, pair):
            path, _, name = node.partition("::")
            if path not in tests:
                file = REPO / path
                tree = ast.parse(file.read_text()) if file.is_file() else ast.Module(body=[], type_ignores=[])
                tests[path] = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")}
            if name not in tests[path]:
                out.append(f"{verdict}: {node} is not a test")
    return out


def test_every_verdict_has_a_test_that_breaks_the_thing_and_one_that_breaks_the_checker():
    assert missing(VERDICTS) == []


@pytest.mark.parametrize("broken, says", [
    ({k: v for k, v in VERDICTS.items() if k != "rank_agreement"}, "rank_agreement: no pair"),
    ({**VERDICTS, "regressed": (VERDICTS["regressed"][0], "")}, "regressed: no pair"),
    ({**VERDICTS, "gather_rows": ("tests/lib/test_checks.py::test_gone", VERDICTS["gather_rows"][1])},
     "gather_rows: tests/lib/test_checks.py::test_gone is not a test"),
    ({**VERDICTS, "vibes": VERDICTS["missing"]}, "vibes: not a verdict"),
])
def test_a_verdict_without_its_pair_is_named(broken, says):
    assert missing(broken) == [says]
