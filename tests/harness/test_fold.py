"""Folding every rank's findings into one row (nsa_cp_comm.harness.fold): ranks that reached
different outcomes (one refused or passed through while others ran) are one failed row naming
``rank_agreement``, never the first rank's outcome; with the agreement rule broken (a rank's
outcome taken for all) the same reports pass."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from nsa_cp_comm.harness import fold
from nsa_cp_comm.harness.checks import ImplReport
from nsa_cp_comm.harness.spec import PointSpec

SPEC = PointSpec(seq_lens=(8,), cp_size=2, policy="zigzag", impls=("padded",), hidden_size=32, warmup=0, iters=1)


def _fold(*statuses: str):
    per_rank = [{"padded": asdict(ImplReport(status=s, correct=True))} for s in statuses]
    (row,) = fold.fold_reports(SPEC, SPEC.plan(), per_rank)
    return row


@pytest.mark.parametrize("statuses, status", [(("", ""), "ok"), (("refused", "refused"), "refused"),
                                              (("passthrough", "passthrough"), "passthrough")])
def test_ranks_that_agree_give_their_outcome(statuses, status):
    row = _fold(*statuses)
    assert (row.status, row.failed_check) == (status, "")


@pytest.mark.parametrize("statuses", [("refused", ""), ("", "passthrough"), ("refused", "passthrough")])
def test_ranks_that_disagree_are_a_failed_row_naming_rank_agreement(statuses):
    row = _fold(*statuses)
    assert (row.status, row.failed_check, row.correct) == ("failed", "rank_agreement", False), row.reason
    assert "ranks disagree on the outcome" in row.reason


def test_with_the_agreement_rule_broken_the_first_ranks_outcome_passes(monkeypatch):
    monkeypatch.setattr(fold, "agreed_status", lambda statuses: {"": "ok"}.get(sorted(statuses)[0], "refused"))
    row = _fold("refused", "")
    assert row.failed_check != "rank_agreement" and row.status != "failed", (row.status, row.reason)
