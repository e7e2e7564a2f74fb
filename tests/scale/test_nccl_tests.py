"""nccl-tests JSON in (matrix.scale.nccl_tests) and the report's design comparison (matrix.review.designs)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from matrix.report import cli as report_cli
from matrix.review import designs, report
from matrix.scale.nccl_tests import NcclTestsError, load_model, read
from matrix_cli import REPO

AG = REPO / "benchmarks" / "data" / "nccl_tests_sample_all_gather.json"
RS = REPO / "benchmarks" / "data" / "nccl_tests_sample_reduce_scatter.json"


def test_sample_files_read_as_the_format_says():
    ag, rs = read(AG), read(RS)
    assert (ag.op, ag.nranks, ag.placement) == ("all_gather", 8, "out_of_place")
    assert rs.op == "reduce_scatter"
    doc = json.loads(AG.read_text())
    first = doc["results"][3]
    assert ag.time_us(first["size"], 8) == pytest.approx(first["out_of_place"]["time"])


def test_interpolation_and_extrapolation():
    ag = read(AG)
    s0, s1 = ag.sizes[5], ag.sizes[6]
    mid = ag.time_us(np.sqrt(s0 * s1))
    assert ag.times_us[5] < mid < ag.times_us[6]
    assert ag.time_us(1) == pytest.approx(ag.times_us[0])  # latency floor below the smallest size
    assert ag.time_us(4 * ag.sizes[-1]) == pytest.approx(4 * ag.times_us[-1])  # linear beyond the largest
    ratio = ag.time_us(1 << 20, 16) / ag.time_us(1 << 20, 8)
    assert ratio == pytest.approx((15 / 16) / (7 / 8))  # bus bandwidth kept at another rank count
    m = load_model([AG, RS])
    assert m.predict(np.array([1 << 20]), 8)[0] == pytest.approx(ag.time_us(1 << 20) + read(RS).time_us(1 << 20))
    assert "a model" in m.describe()


def _write(tmp_path, doc, name="all_gather.json"):
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


@pytest.mark.parametrize("edit, needle", [
    (lambda d: "{not json", "not JSON"),
    (lambda d: {**d, "results": []}, "no results list"),
    (lambda d: {**d, "config": {**d["config"], "devices": []}}, "config.devices"),
    (lambda d: {**d, "results": [{**d["results"][0], "size": -1}]}, "results[0].size=-1"),
    (lambda d: {**d, "results": [{**d["results"][0], "in_place": {**d["results"][0]["in_place"], "time": 0}}]},
     "results[0].in_place.time=0"),
    (lambda d: {**d, "results": [{**d["results"][0], "in_place": {**d["results"][0]["in_place"], "nwrong": 3}}]},
     "nwrong=3"),
    (lambda d: {**d, "args": ["./build/alltoall_perf"]}, "names neither"),
])
def test_bad_files_are_refused_with_one_line(tmp_path, edit, needle):
    doc = json.loads(AG.read_text())
    name = "x.json" if needle == "names neither" else "all_gather.json"
    p = _write(tmp_path, edit(doc), name)
    with pytest.raises(NcclTestsError) as exc:
        read(p)
    assert needle in str(exc.value) and str(p) in str(exc.value) and "\n" not in str(exc.value)


def _results(doc, keep):
    """``doc`` with each result's placements filtered by ``keep(index, placement)``."""
    out = []
    for i, r in enumerate(doc["results"]):
        out.append({k: v for k, v in r.items() if k not in ("in_place", "out_of_place") or keep(i, k)})
    return {**doc, "results": out}


def test_out_of_place_makes_the_model_even_beside_a_stray_in_place_size(tmp_path):
    """in_place on one 8-byte size beside 12 out_of_place sizes made a model
    of the single size (280412 us predicted against 14 us from the curve)."""
    doc = json.loads(AG.read_text())
    stray = _results(doc, lambda i, k: (k == "in_place") == (i == 0))  # in_place at size 8 only, the rest out
    c = read(_write(tmp_path, stray))
    assert c.placement == "out_of_place" and len(c.sizes) == len(doc["results"]) - 1
    mid = doc["results"][6]
    assert c.time_us(mid["size"]) == pytest.approx(mid["out_of_place"]["time"])
    # a file of in_place times only: those are the curve
    only_in = read(_write(tmp_path, _results(doc, lambda i, k: k == "in_place"), "all_gather_in.json"))
    assert only_in.placement == "in_place" and only_in.time_us(mid["size"]) == pytest.approx(mid["in_place"]["time"])


@pytest.mark.parametrize("case, needle", [
    ("duplicate", "size 2048 has 2 out_of_place times (results repeat 1 size(s)): one measurement per size"),
    ("two sizes", "2 size(s) with an out_of_place time: a model needs at least 3"),
])
def test_a_file_that_is_no_curve_is_refused_in_one_line(tmp_path, capsys, case, needle):
    doc = json.loads(AG.read_text())
    if case == "duplicate":  # the last of two times for one size won, silently
        again = {**doc["results"][4], "out_of_place": {**doc["results"][4]["out_of_place"], "time": 1e6}}
        doc = {**doc, "results": doc["results"] + [again]}
    else:
        doc = {**doc, "results": doc["results"][:2]}
    p = _write(tmp_path, doc)
    with pytest.raises(NcclTestsError) as exc:
        read(p)
    assert str(exc.value).startswith(f"--nccl-tests={p}: {needle}") and "\n" not in str(exc.value)
    # at the command line: one line, exit 2, nothing written
    code = report_cli.main([str(tmp_path / "results"), "--nccl-tests", str(p)])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [f"error: {exc.value}"]
    assert not (tmp_path / "results").exists()
    # three distinct sizes are a curve
    doc = json.loads(AG.read_text())
    assert len(read(_write(tmp_path, {**doc, "results": doc["results"][:3]})).sizes) == 3


def test_two_files_of_one_collective_are_refused():
    with pytest.raises(NcclTestsError, match="a second all_gather_perf"):
        load_model([AG, AG])


# -- the design comparison -------------------------------------------------------

def _pair(point, cp, bytes_a, bytes_b, t_a, t_b, iqr=1.0):
    base = dict(cp_size=cp, policy="zigzag", page_size=1, seq_lens="[1001,300]", status="ok", _pair=point,
                roundtrip_iqr_us=iqr, collective_p50_us=1.0)
    return [
        dict(base, impl="padded", bytes_padded=bytes_a, attn_pad_rows=0, moe_pad_rows=0, roundtrip_p50_us=t_a),
        dict(base, impl="pad_at_split", bytes_padded=bytes_b, attn_pad_rows=4, moe_pad_rows=12, roundtrip_p50_us=t_b),
    ]


def test_design_verdicts_follow_the_rows():
    df = pd.DataFrame(_pair(0, 3, 1000, 1200, 10.0, 20.0) + _pair(1, 3, 1000, 1000, 10.0, 10.5))
    text = "\n".join(designs.section(df, "_pair"))
    assert "`padded` moves fewer bytes on 1, `pad_at_split` on 0, the same on 1" in text
    assert "+20.00%" in text
    assert "`padded` is faster beyond the spread on 1, `pad_at_split` on 0, a tie on 1" in text
    # flipped rows flip the verdict: it reads the rows, it does not assume the rule
    flipped = pd.DataFrame(_pair(0, 3, 1200, 1000, 20.0, 10.0))
    text = "\n".join(designs.section(flipped, "_pair"))
    assert "`padded` moves fewer bytes on 0, `pad_at_split` on 1" in text
    assert "`pad_at_split` on 1, a tie on 0" in text


def test_design_verdicts_follow_each_rows_engine():
    """The attention padding is computed under the seed fix's engine and zeroed under SGLang 0.5.23,
    whose round-robin split is named interleave; the table has a line per engine."""
    seed = _pair(0, 4, 1000, 1200, 10.0, 20.0)
    sgl = [dict(r, engine="sglang_0_5_23", policy="round_robin") for r in _pair(1, 4, 1000, 1200, 10.0, 20.0)]
    text = "\n".join(designs.section(pd.DataFrame(seed + sgl), "_pair"))
    assert "over 2 point(s) (seed_fix, sglang_0_5_23)" in text
    assert "(computed: up to 4, zeroed by the engine: up to 4)" in text
    table = [line for line in text.splitlines() if line.startswith("| seed_fix") or line.startswith("| sglang")]
    assert [line.split("|")[3].strip() for line in table] == ["zigzag", "interleave"]
    assert [line.split("|")[8].strip() for line in table] == ["4", "0"]  # attention padding computed
    assert [line.split("|")[9].strip() for line in table] == ["0", "4"]  # and zeroed
    only_sgl = "\n".join(designs.section(pd.DataFrame(sgl), "_pair"))
    assert "(computed: up to 0, zeroed by the engine: up to 4)" in only_sgl


def test_design_section_absent_without_pad_at_split_rows():
    df = pd.DataFrame(_pair(0, 2, 1, 1, 1.0, 1.0)[:1])
    assert designs.section(df, "_pair") == []
    only_failed = pd.DataFrame([dict(r, status="failed") for r in _pair(0, 2, 1, 1, 1.0, 1.0)])
    assert "No point has both designs `ok`" in "\n".join(designs.section(only_failed, "_pair"))
