"""A point's ids stay what they were when a later results layout adds a configuration column.

``point_id`` (what ``resume`` finds a point done by) and ``effective_id`` leave out each column of
:data:`matrix.store.runs.ADDED_CONFIG_COLUMNS` where it holds what every row before that layout
had, so a sweep resumed across an upgrade finds its points; any other value is another point.
"""

from __future__ import annotations

import copy
from dataclasses import fields, replace

import pytest

from matrix.app.config import MatrixConfig
from matrix.app.point import _RESOLVED_IN_ID, effective_id, point_id
from matrix.app.resolve import resolve
from matrix.store.runs import ADDED_CONFIG_COLUMNS

# a point at every later column's old value (the schema's default shared expert is not its old one)
BASE = {**vars(MatrixConfig()), "device": "cpu", "backend": "gloo", "results_dir": "r", "seq_lens": [1000],
        "cp_size": 2, "shared_expert": "none"}
# the default point's ids as the matrix wrote them (before any of the later columns existed, every
# row had these: a changed id rule would orphan every results folder written since)
PINNED = ("22899850185f28e2", "0251da0f3a1286f0")
# a value other than the old one, per added column
OTHER = {"engine": "vllm_0_33", "shared_expert": "replicated", "engine_model": "deepseek_v4", "graphs": False,
         "max_capture_size": 256, "moe_quant": "fp8_block"}


def ids(cfg: dict) -> tuple[str, str]:
    if cfg.get("engine", "seed_fix") != "seed_fix":
        cfg = {**cfg, "split": "dual_chunk_swap"}
    return point_id(cfg), effective_id(resolve(cfg, gpus=0))


def test_the_default_points_ids_are_the_ones_written_before():
    assert ids(BASE) == PINNED


@pytest.mark.parametrize("column", sorted(ADDED_CONFIG_COLUMNS))
def test_a_later_column_at_its_old_value_keeps_the_id_and_another_value_is_another_point(column):
    assert column in OTHER, f"give {column} another value here"
    before = ADDED_CONFIG_COLUMNS[column].before
    without = {k: v for k, v in BASE.items() if k != column}
    assert point_id({**without, column: before}) == point_id(without) == PINNED[0]
    assert point_id({**without, column: OTHER[column]}) != PINNED[0]


def test_every_field_of_the_spec_a_point_runs_is_in_its_effective_id():
    """A field added to the spec reaches the id without an edit of the id's rule: two points whose
    ranks would run different specs never share an effective id (the second would be skipped)."""
    res = resolve(BASE, gpus=0)
    for f in fields(res.spec):
        if f.name == "bystanders" or f.name in _RESOLVED_IN_ID:  # a larger world: its own rule, held above by
            continue  # point_id; the fields resolve decides are read from what it decided
        changed = copy.copy(res.spec)
        object.__setattr__(changed, f.name, "another value")
        assert effective_id(replace(res, spec=changed)) != effective_id(res), f.name
