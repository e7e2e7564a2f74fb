"""The warnings a plug-in's ranks raise are said once per sweep, with how often
(nsa_cp_comm.harness.rank_warnings): a rank records each task's warnings instead
of printing them and sends them with its answer; the sweep prints each distinct
one once after its summary. A plug-in using a deprecated torch name no longer
prints a line per rank per point; nor does Hydra's launcher print a line per job."""

from __future__ import annotations

import warnings

from matrix_cli import sweep_here
from nsa_cp_comm.harness import rank_warnings
from tests import hostile_impls


def test_recording_keeps_the_warnings_and_leaves_the_module_as_it_was():
    before = (warnings.filters[:], warnings.showwarning)
    with rank_warnings.recording() as raised:
        warnings.warn("once", UserWarning, stacklevel=1)
        warnings.warn("twice", DeprecationWarning, stacklevel=1)
    assert [r.split(" (")[0] for r in raised] == ["UserWarning: once", "DeprecationWarning: twice"]
    assert raised[0].endswith(f"({__file__}:{raised and _line_of('once')})")
    assert (warnings.filters[:], warnings.showwarning) == before


def _line_of(text: str, path: str = __file__) -> int:
    return next(i for i, ln in enumerate(open(path).read().splitlines(), 1) if f'warnings.warn("{text}' in ln)


def test_each_distinct_warning_once_with_its_count_the_rest_in_one_line():
    rank_warnings.clear()
    rank_warnings.count(["A: x (f.py:1)"] * 4 + ["B: y (g.py:2)"] + [f"C: z{i} (h.py:{i})" for i in range(6)])
    got = rank_warnings.lines(shown=2)
    assert got == ["warnings raised on the ranks: 11 (8 distinct), each shown once:", "  4 x A: x (f.py:1)",
                   "  1 x B: y (g.py:2)", "  ... 6 more distinct warning(s), 6 in all"]
    rank_warnings.clear()
    assert rank_warnings.lines() == []


def test_a_plugins_warning_is_said_once_after_the_sweep_with_its_count(tmp_path, monkeypatch, capsys):
    run = sweep_here(tmp_path / "res", "impl=tests.hostile_impls:warns_deprecated", "cp_size=2",
                     "seq_lens=[64],[1001,300]", "hidden_size=32", "iters=1", "warmup=0", monkeypatch=monkeypatch,
                     capsys=capsys)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    # and no line of Hydra's launcher per job repeating the overrides beside the matrix's own (conf/config.yaml)
    assert "[HYDRA]" not in run.stdout + run.stderr and run.stdout.count("[matrix] cp=2") == 2, run.stdout
    said = [ln for ln in run.stderr.splitlines() if "deprecated" in ln or ln.startswith("warnings raised")]
    assert said[0].startswith("warnings raised on the ranks: ") and len(said) == 2, said
    n = int(said[1].split(" x ")[0])
    where = f"{hostile_impls.__file__}:{_line_of('this communicator', hostile_impls.__file__)}"
    # at least 2 points x 2 ranks
    assert n >= 4 and said[1].endswith(f"FutureWarning: this communicator's API is deprecated ({where})"), said
