"""What torch's own collectives do with the legacy buffer sizing on uneven plans.

The legacy round trip allocates a ``[T, H]`` gather output on every rank and
splits ``[T, H]`` into ``cp`` equal chunks for the reduce-scatter. These tests
give exactly those tensors to torch (no project code on the path) in fresh
rank processes (tests/torch_uneven_probe.py), so an abort or a hang costs one
trial, and pin what torch does today. A torch upgrade that changes a text, or
turns a raise into a hang (or the reverse), fails here and must be written up.

What the project relies on: its own refusal (``LEGACY_UNEVEN_ERROR``) is raised
on every rank before any collective, whatever the backend would have done; its
text is NCCL's, and gloo's differs, which the design doc must say.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from nsa_cp_comm import LEGACY_UNEVEN_ERROR, plan_split
from torch_uneven_probe import MIXED_4, PAGE_10, PAGE_1000, Trial, run_trial

ROOT = Path(__file__).resolve().parents[2]
H = 4


def gloo_gather_text(n: int, chunk: int) -> str:
    # gloo views the [T, H] output as cp chunks of [T/cp, H] and compares each
    # with the input's shape, on this rank alone, before sending anything.
    return f"ProcessGroupGloo::allgather: invalid tensor size at index 0 (expected ({n}, {H}), got ({chunk}, {H}))"


# gloo's reduce-scatter check is a CHECK-style line (glog format: rank, F for
# fatal, a timestamp, source line) raised as a RuntimeError; the process lives.
GLOO_SCATTER_RE = re.compile(
    r"^\[rank(?P<rank>\d+)\]:\[F\d{4} [\d:.]+ ProcessGroupGloo\.cpp:\d+\] "
    r"Check failed: outputShape\[0\] \* worldSize == inputShape\[0\] \((?P<got>\d+) vs\. (?P<want>\d+)\)\.\s*$"
)
GLOO_SCATTER_FRAGMENT = "Check failed: outputShape[0] * worldSize == inputShape[0]"
GLOO_GATHER_FRAGMENT = "ProcessGroupGloo::allgather: invalid tensor size at index 0"
# NCCL's reduce-scatter text (ProcessGroupNCCL::_reduce_scatter_base).
NCCL_SCATTER_TEXT = "input tensor must be the same size as output size times world size"


def plan_of(case: dict):
    return plan_split(list(case["seq_lens"]), case["cp"], policy=case["policy"], page_size=case.get("page_size", 1))


def describe(results) -> str:
    return "\n".join(f"rank {r.rank}: {r.outcome} {r.exc_type} {r.text!r} rc={r.returncode} "
                     f"{r.stderr_tail[-300:]!r}" for r in results)


def trial(tmp_path, case: dict, op: str, **kw):
    # Trials that should finish at once get a long window: a slow, loaded
    # machine must not turn a raise into a "hang".
    hang_s = kw.pop("hang_s", 60.0 if kw.get("linger_s", 0) == 0 else 8.0)
    return run_trial(Trial(**case, op=op, hidden=H, **kw), hang_s=hang_s, workdir=tmp_path)


# -- gloo: every rank's shape differs from T/cp ------------------------------------

TWO_RANK_CASES = {"n=(488,512)": PAGE_1000, "n=(10,0)": PAGE_10}
# torch 2.13's names on both cases; the deprecated names (thin wrappers of the
# new ones) on one, to show they behave the same.
CASE_APIS = [("n=(488,512)", "single"), ("n=(488,512)", "tensor"), ("n=(10,0)", "single")]


@pytest.mark.parametrize("op", ["gather", "scatter_rows"])
@pytest.mark.parametrize("case_id,api", CASE_APIS)
def test_gloo_legacy_buffer_on_uneven_plan_raises_on_every_rank(tmp_path, case_id, api, op):
    # the gather into legacy's [T, H] output, the reduce-scatter of [T, H] into the rank's own rows
    case = TWO_RANK_CASES[case_id]
    plan = plan_of(case)
    assert not plan.is_even
    results = trial(tmp_path, case, op, api=api)
    for r in results:
        assert r.outcome == "raised", describe(results)
        assert r.returncode == 0, describe(results)  # no SIGABRT: the process carries on
        assert r.exc_type == "RuntimeError"
        # Not the texts NCCL raises (the project's refusal carries NCCL's gather text).
        assert NCCL_SCATTER_TEXT not in r.text and LEGACY_UNEVEN_ERROR not in r.text
        if op == "gather":
            assert r.text == gloo_gather_text(plan.per_rank_tokens[r.rank], plan.total_tokens // plan.cp_size)
        else:
            m = GLOO_SCATTER_RE.match(r.text)
            assert m, r.text
            assert int(m["rank"]) == r.rank
            assert (int(m["got"]), int(m["want"])) == (plan.per_rank_tokens[r.rank] * plan.cp_size, plan.total_tokens)
        if api == "tensor":
            old = "all_gather_into_tensor" if op == "gather" else "reduce_scatter_tensor"
            assert any(f"{old}` is deprecated" in w for w in r.warnings), r.warnings
        else:
            assert r.warnings == []


def test_gloo_reduce_scatter_into_equal_chunks_returns_the_wrong_rows(tmp_path):
    # Legacy's own scatter output is the rank's equal chunk of [T, H]; torch
    # sees consistent shapes and succeeds. Rank r gets rows [r*T/cp, (r+1)*T/cp)
    # of the sum, not the n_r rows it holds: silent wrong data, no error.
    plan = plan_of(PAGE_1000)
    results = trial(tmp_path, PAGE_1000, "scatter_chunk")
    chunk = plan.total_tokens // plan.cp_size
    for r in results:
        assert r.outcome == "returned", describe(results)
        own = plan.rank_offset(r.rank)
        assert r.returned == {"out_rows": chunk, "source_rows": [r.rank * chunk, (r.rank + 1) * chunk - 1],
                              "own_rows": [own, own + plan.per_rank_tokens[r.rank] - 1]}
        assert r.returned["source_rows"] != r.returned["own_rows"]


# -- gloo: some ranks' shape happens to equal T/cp -----------------------------------

def test_mixed_plan_gather_peers_that_pass_the_shape_check_hang(tmp_path):
    # n = (2, 1, 1, 0), T/cp = 1: ranks 0 and 3 raise at once; ranks 1 and 2
    # see consistent shapes, enter the collective and wait for peers that
    # never come. With the peers still alive nothing wakes them before the
    # process group's timeout (gloo's default: 30 minutes).
    plan = plan_of(MIXED_4)
    results = trial(tmp_path, MIXED_4, "gather", linger_s=600, hang_s=8.0)
    assert [r.outcome for r in results] == ["raised", "hung", "hung", "raised"], describe(results)
    for r in (results[0], results[3]):
        assert r.text == gloo_gather_text(plan.per_rank_tokens[r.rank], 1)


def test_mixed_plan_gather_blocked_ranks_raise_at_the_process_group_timeout(tmp_path):
    plan = plan_of(MIXED_4)
    results = trial(tmp_path, MIXED_4, "gather", linger_s=30, pg_timeout_s=3, hang_s=20.0)
    assert [r.outcome for r in results] == ["raised"] * 4, describe(results)
    for r in (results[1], results[2]):
        assert re.search(r"Timed out waiting 3000ms for (recv|send) operation to complete", r.text), r.text
        assert r.ms_in_collective >= 2900
    for r in (results[0], results[3]):
        assert r.text == gloo_gather_text(plan.per_rank_tokens[r.rank], 1)


def test_mixed_plan_gather_blocked_ranks_raise_when_the_refusing_peers_exit(tmp_path):
    results = trial(tmp_path, MIXED_4, "gather")
    assert [r.outcome for r in results] == ["raised"] * 4, describe(results)
    for r in (results[1], results[2]):
        # "Connection closed by peer" or "Read error ...: Connection reset by
        # peer", whichever socket event arrives first.
        assert r.exc_type == "RuntimeError" and "by peer" in r.text, r.text


# -- the project's documentation of the difference -------------------------------------

def test_design_doc_records_the_gloo_texts():
    # The refusal carries NCCL's text; a reader who meets gloo's must find it
    # in the design doc next to it.
    design = ROOT / "docs" / "design.md"
    if not design.exists():
        pytest.skip("docs/design.md is not written yet")
    for text in (LEGACY_UNEVEN_ERROR, GLOO_GATHER_FRAGMENT, GLOO_SCATTER_FRAGMENT):
        assert text in design.read_text(), text


# -- NCCL ----------------------------------------------------------------------------

def _nccl_skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs CUDA GPUs and NCCL: none here"
    if not torch.distributed.is_nccl_available():
        return "needs NCCL: this torch build has none"
    if torch.cuda.device_count() < 2:
        return ("needs >= 2 GPUs: NCCL refuses two ranks on one GPU ('Duplicate GPU detected'), "
                "so the two-rank uneven case cannot run on one")
    return None


@pytest.mark.requires_gpu
@pytest.mark.parametrize("op", ["gather", "scatter_rows"])
@pytest.mark.parametrize("case_id", list(TWO_RANK_CASES))
def test_nccl_legacy_buffer_on_uneven_plan(tmp_path, case_id, op):
    reason = _nccl_skip_reason()
    if reason:
        pytest.skip(reason)
    case = TWO_RANK_CASES[case_id]
    results = trial(tmp_path, case, op, backend="nccl", pg_timeout_s=60)
    want = LEGACY_UNEVEN_ERROR if op == "gather" else NCCL_SCATTER_TEXT
    for r in results:
        # NCCL checks numel on each rank before launching: every rank of these
        # plans fails it, so every rank raises, and the gather's text is the
        # one the project's refusal carries.
        assert r.outcome == "raised", describe(results)
        assert want in r.text, describe(results)
