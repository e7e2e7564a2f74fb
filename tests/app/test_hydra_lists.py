"""Hydra's override parser reads a list in linear time (matrix.app.config):
a long seq_lens took minutes of silent checks, parsed several times a sweep."""

from __future__ import annotations

import matrix.app.config  # noqa: F401 - installs the linear list reader
from antlr4.ParserRuleContext import ParserRuleContext
from hydra.core.override_parser.overrides_parser import OverridesParser


def children_walked(n: int, monkeypatch) -> tuple[int, list]:
    walked = [0]
    real = ParserRuleContext.getChildren

    def counted(self, predicate=None):
        for child in real(self, predicate):
            walked[0] += 1
            yield child

    monkeypatch.setattr(ParserRuleContext, "getChildren", counted)
    (ov,) = OverridesParser.create().parse_overrides([f"seq_lens=[{','.join(map(str, range(1, n + 1)))}]"])
    monkeypatch.setattr(ParserRuleContext, "getChildren", real)
    return walked[0], ov.value()


def test_a_list_parses_in_linear_time_to_the_same_values(monkeypatch):
    small, values = children_walked(500, monkeypatch)
    assert values == list(range(1, 501))
    large, values = children_walked(2000, monkeypatch)
    assert values == list(range(1, 2001))
    # 4x the entries: about 4x the walk when linear, 16x when quadratic
    assert large < 6 * small, (small, large)
