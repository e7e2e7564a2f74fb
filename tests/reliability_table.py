"""The bad inputs, faults and interruptions the hardening tests try.

One table, two uses: tests/app/test_hardening.py runs every row, and RELIABILITY.md
is rendered from the same rows, so the document cannot drift:

    python tests/reliability_table.py > RELIABILITY.md

(a test fails when the file differs from :func:`render`). In the expected
texts ``*`` stands for a machine-specific part (a path, a GPU count).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for _p in (str(REPO / "src"), str(REPO)):
    if _p not in sys.path:  # run as a script
        sys.path.insert(0, _p)


def matches(text: str, pattern: str) -> bool:
    """``pattern`` matches all of ``text``; ``*`` matches anything."""
    return re.fullmatch(".*".join(re.escape(p) for p in pattern.split("*")), text, re.S) is not None


# --- the library: every bad argument is a one-line ValueError naming it ---------------


@dataclass(frozen=True)
class LibCase:
    code: str  # evaluated in namespace(); also the document's text
    expect: str  # the ValueError's message


LIBRARY: tuple[LibCase, ...] = (
    LibCase('plan_split([], 2, policy="zigzag")', "seq_lens=[] must be a non-empty list of positive ints"),
    LibCase('plan_split([1000, -5], 2, policy="zigzag")', "seq_lens[1]=-5 must be a positive int"),
    LibCase('plan_split("1000", 2, policy="zigzag")', "seq_lens='1000' must be a non-empty list of positive ints"),
    LibCase('plan_split([1000.5], 2, policy="zigzag")', "seq_lens[0]=1000.5 must be a positive int"),
    LibCase('plan_split([1000], 0, policy="zigzag")', "cp_size=0 must be a positive int"),
    LibCase('plan_split([1000], -2, policy="zigzag")', "cp_size=-2 must be a positive int"),
    LibCase('plan_split([1000], "2", policy="zigzag")', "cp_size='2' must be a positive int"),
    LibCase('plan_split([1000], 10**7, policy="zigzag")', "cp_size=10000000 is over the 65536 ranks a plan may have"),
    LibCase('plan_split([1] * 20000, 1024, policy="zigzag")',
            "seq_lens has 20000 requests: at cp_size=1024 that is 20480000 request-rank blocks, over the 16777216 a "
            "plan may hold"),
    LibCase('plan_split([1000], 2, policy="zigzag_page", page_size=0)', "page_size=0 must be a positive int"),
    LibCase('plan_split([1000], 2, policy="ring")',
            "policy='ring' is not one of round_robin, zigzag, zigzag_page, dual_chunk_swap, contiguous"),
    LibCase('plan_split([1000], 2, policy="zigzag", align=3)', "align=3 must be a positive multiple of cp_size=2"),
    LibCase('plan_split([1000], 2, policy="zigzag").rank_indices(2)', "rank=2 is not in [0, 2)"),
    LibCase('mlp_mode("nvshmem")', "moe_a2a_backend='nvshmem' is not one of none, deepep, *"),
    LibCase("mlp_mode(None)", "moe_a2a_backend=None is not one of none, deepep, *"),
    LibCase('ScatterMode("PARTIAL")', "mlp_mode='PARTIAL' is not one of SCATTERED, FULL"),
    LibCase('PointSpec((1000,), 2, "zigzag", dtype="fp8")', "dtype='fp8' is not one of float32, bfloat16"),
    LibCase('PointSpec((1000,), 2, "zigzag", impls=("fast",))', "impl='fast' is not one of padded, legacy*"),
    LibCase('PointSpec((1000,), 2, "zigzag", num_experts=3)', "num_experts=3 is not a multiple of cp_size=2"),
    LibCase('run_point(PointSpec((1000,), 2, "zigzag"), pool, timeout_s=60, checks="lite")',
            "checks='lite' is not one of full, light"),
    LibCase('run_point(PointSpec((1000,), 2, "zigzag", mode="SCATTERED"), pool, timeout_s=60, checks="light")',
            "checks='light' covers mode FULL only, not mode=SCATTERED"),
    LibCase('RankPool(0, workdir="/nonexistent")', "world_size=0 must be a positive int"),
    LibCase('RankPool(2, backend="mpi", workdir="/nonexistent")', "backend='mpi' is not one of gloo, nccl"),
    LibCase('RankPool(2, workdir="/nonexistent", start_timeout_s=float("nan"))',
            "start_timeout_s=nan must be a positive finite number of seconds"),
    LibCase('RankPool(2, workdir="/nonexistent", start_timeout_s=float("inf"))',
            "start_timeout_s=inf must be a positive finite number of seconds"),
)


def namespace() -> dict:
    from nsa_cp_comm import ScatterMode, mlp_mode, plan_split
    from nsa_cp_comm.harness import RankPool
    from nsa_cp_comm.harness.measure import PointSpec, run_point

    # ``pool``: refused before any rank is asked, so none is started
    return dict(plan_split=plan_split, mlp_mode=mlp_mode, ScatterMode=ScatterMode, PointSpec=PointSpec,
                RankPool=RankPool, run_point=run_point, pool=None)


# --- the round trips, on 2 real ranks: the same bad input on every rank ---------------
# ``uneven`` = plan_split([10], 2, policy="zigzag_page", page_size=64): n_r = [10, 0];
# ``n`` is this rank's n_r, ``H`` = 16, ``zeros(*shape)`` a tensor on the rank's device.

ROUNDTRIP: tuple[LibCase, ...] = (
    LibCase("legacy_gather(zeros(n, H), uneven)",
            "output tensor size must be equal to world_size times input tensor size (legacy CP gather/scatter "
            "needs even shards; per_rank_tokens=[10, 0])"),
    LibCase("legacy_scatter(zeros(10, H), uneven)",
            "output tensor size must be equal to world_size times input tensor size (*per_rank_tokens=[10, 0])"),
    LibCase("padded_gather(zeros(n + 1, H), uneven)",
            "padded_gather local: rank 0 has 11 rows, the plan expects 10, rank 1 has 1 rows, the plan expects 0"),
    LibCase("padded_gather(zeros(n), uneven)",
            "padded_gather local on rank 0 is not 2-D [rows, H]; no rank entered the collective"),
    LibCase("padded_scatter(zeros(10, H), uneven)",
            "padded_scatter full: rank 0 has 10 rows, the plan expects 20, rank 1 has 10 rows, the plan expects 20"),
    LibCase("padded_gather_(zeros(1, H).expand(20, H), uneven)",
            "padded_gather_ full on rank 0 is expanded (a stride of 0: its rows share one row's memory, so the "
            "collective cannot write into it; pass a padded_buffer); no rank entered the collective"),
    LibCase("padded_gather_(zeros(H, 20).t(), uneven)",
            "padded_gather_ full on rank 0 is not contiguous (the in-place collective would write into a copy, not "
            "into it; pass a padded_buffer or .contiguous()); no rank entered the collective"),
    LibCase("padded_gather(zeros(n, H).requires_grad_(), uneven)",
            "padded_gather local on rank 0 requires grad (the collectives are not differentiable: pass .detach(), "
            "or call under torch.no_grad()); no rank entered the collective"),
    LibCase('padded_gather(zeros(1, H), plan_split([9], 3, policy="round_robin"))',
            "padded_gather local: group size 2 != plan.cp_size=3: all ranks must pass the group's plan"),
    LibCase('CPLayerCommunicator(uneven, "FULL", impl="fast")', "impl='fast' is not one of padded, legacy*"),
    LibCase('CPLayerCommunicator(uneven, "PARTIAL")', "mlp_mode='PARTIAL' is not one of SCATTERED, FULL"),
)


def roundtrip_bad_inputs() -> dict[str, str]:
    """Rank task: every ROUNDTRIP call's error (``"Type: message"``; ``""`` if
    none), then one all-reduce that completes only if no rank was left inside
    a collective by the calls above."""
    import torch
    import torch.distributed as dist

    from nsa_cp_comm import (CPLayerCommunicator, legacy_gather, legacy_scatter, padded_gather, padded_gather_,
                             padded_scatter, plan_split)
    from nsa_cp_comm.harness.ranks import rank_device

    device = rank_device()
    uneven = plan_split([10], 2, policy="zigzag_page", page_size=64)
    ns = dict(
        legacy_gather=legacy_gather, legacy_scatter=legacy_scatter, padded_gather=padded_gather,
        padded_gather_=padded_gather_,
        padded_scatter=padded_scatter, plan_split=plan_split, CPLayerCommunicator=CPLayerCommunicator,
        uneven=uneven, n=uneven.per_rank_tokens[dist.get_rank()], H=16,
        zeros=lambda *shape: torch.zeros(*shape, device=device),
    )
    out: dict[str, str] = {}
    for case in ROUNDTRIP:
        try:
            eval(case.code, ns)  # noqa: S307 - our own table
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out[case.code] = f"{type(exc).__name__}: {exc}"
        else:
            out[case.code] = ""
    t = torch.ones(1, device=device)
    dist.all_reduce(t)
    out["__in_step__"] = str(int(t.item()))
    return out


# --- the CLI: exit 2, exactly this one line on stderr, nothing written ------------------


@dataclass(frozen=True)
class CliCase:
    args: tuple[str, ...]  # after `python -m matrix -m results_dir={tmp}/res`; {tmp}, {too_many}, {too_long} filled in
    expect: str  # the stderr line
    stage: str  # "value": each value on its own; "point": every point of the sweep, composed
    doc: str = ""  # the document's text for args, when they hold placeholders
    setup: tuple[str, ...] = ()  # what tests/app/test_hardening.py:_file_setup makes under {tmp}, as FileCase's


VALUE = "value"
POINT = "point"

CLI: tuple[CliCase, ...] = (
    CliCase(("cp_size=0",), "error: cp_size=0: must be an integer in [1, 1024]", VALUE),
    CliCase(("cp_size=-2",), "error: cp_size=-2: must be an integer in [1, 1024]", VALUE),
    CliCase(("cp_size=two",), "error: cp_size=two: must be an integer in [1, 1024]", VALUE),
    CliCase(("cp_size=1,2,0",), "error: cp_size=0: must be an integer in [1, 1024]", VALUE),
    CliCase(("page_size=0",), "error: page_size=0: must be an integer in [1, 1048576]", VALUE),
    CliCase(("seq_lens=[]",), "error: seq_lens=[]: must be a non-empty list of positive integers, e.g. [1000,300]", VALUE),
    CliCase(("seq_lens=[1000,-5]",), "error: seq_lens[1]=-5: must be an integer in [1, 16777216]", VALUE),
    CliCase(("seq_lens=[5,0]",), "error: seq_lens[1]=0: must be an integer in [1, 16777216]", VALUE),
    CliCase(("cp_size=1180591620717411303424",), "error: cp_size=1180591620717411303424: must be an integer in [1, 1024]",
            VALUE),
    CliCase(("seed=4611686018427387904",), "error: seed=4611686018427387904: must be an integer in [0, 2147483647]",
            VALUE),
    CliCase(("~cp_size",), "error: ~cp_size: a key of the schema cannot be deleted; set it instead (cp_size=VALUE)",
            VALUE),
    CliCase(("results_dir=/tmp/ünïcôde",), "error: cannot parse overrides: * (quote a value with spaces or non-ASCII "
            "characters: key='value')", VALUE),
    CliCase(("hydra.sweep.dir=/proc/nsa-cp-comm",),
            "error: hydra.sweep.dir=/proc/nsa-cp-comm: /proc is not a writable directory", VALUE),
    CliCase(("results_dir=/tmp/{name300}",), "error: results_dir=/tmp/*: a name in the path is 300 characters, over "
            "the 255 a file system allows", VALUE, doc="results_dir=/tmp/NAME (NAME of 300 characters)"),
    CliCase(("seq_lens=[1000,abc]",), "error: seq_lens[1]=abc: must be an integer in [1, 16777216]", VALUE),
    CliCase(("seq_lens=1000",), "error: seq_lens=1000: must be a non-empty list of positive integers, e.g. [1000,300]", VALUE),
    CliCase(("hidden_size=7168.5",), "error: hidden_size=7168.5: must be an integer in [1, 65536]", VALUE),
    CliCase(("timeout_s=soon",), "error: timeout_s=soon: must be a number of seconds in (0, 604800]", VALUE),
    CliCase(("resume=maybe",), "error: resume=maybe: must be true or false", VALUE),
    CliCase(("split=ring",), "error: split=ring: must be one of zigzag, round_robin, dual_chunk_swap, contiguous", VALUE),
    CliCase(("backend=mpi",), "error: backend=mpi: must be one of auto, gloo, nccl", VALUE),
    CliCase(("dtype=fp8",), "error: dtype=fp8: must be one of float32, bfloat16", VALUE),
    CliCase(("shared_expert=both",), "error: shared_expert=both: must be one of none, sharded, replicated", VALUE),
    CliCase(("impl=fast",), "error: impl=fast: must be one of both, all, designs, padded, legacy*", VALUE),
    CliCase(("fault=raise",), "error: unknown key 'fault'; valid keys: cp_size, page_size, seq_lens, *", VALUE),
    CliCase(("cp_sise=2",), "error: unknown key 'cp_sise'; valid keys: cp_size, page_size, seq_lens, *", VALUE),
    CliCase(("+matrix=nope",), "error: cannot compose the config: In 'config': Could not find 'matrix/nope' (options: *)", POINT),
    CliCase(("cp_size=2", "align=3"), "error: align=3: must be a multiple of cp_size=2", POINT),
    CliCase(("cp_size=1,2,3", "num_experts=4"),
            "error: num_experts=4: must be a multiple of cp_size=3 (experts are split evenly)", POINT),
    CliCase(("topk=9",), "error: topk=9: must be at most num_experts=4", POINT),
    CliCase(("backend=nccl", "cp_size={too_many}"), "error: backend=nccl with cp_size=* needs * GPUs, this machine has *",
            POINT, doc="backend=nccl cp_size=N (N > the machine's GPUs)"),
    CliCase(("results_dir={tmp}/file/res",), "error: results_dir=*/file/res: */file is not a writable directory", VALUE,
            doc="results_dir=FILE/res (FILE a regular file)", setup=("file",)),
    CliCase(("seq_lens={too_long}",), "error: seq_lens=[...]: 65537 entries, more than the 65536 requests one batch may hold",
            VALUE, doc="seq_lens=[1,1,...] (65537 entries)"),
    CliCase(("results_dir=x\\${{y}}",),
            "error: results_dir='x\\\\${y}': must not contain '${' (Hydra would read it as an interpolation)", VALUE,
            doc="results_dir=x\\${y}"),
    CliCase(("results_dir={tmp}/fifo",), "error: results_dir=*/fifo: */fifo/results.csv is not a regular file", POINT,
            doc="results_dir=DIR (DIR/results.csv a FIFO)", setup=("fifo/results.csv:fifo",)),
    CliCase(("results_dir={tmp}/null",),
            "error: results_dir=*/null: */null/results.csv (a link to /dev/null) is not a regular file", POINT,
            doc="results_dir=DIR (DIR/results.csv a link to /dev/null)", setup=("null/results.csv:dev_null",)),
    CliCase(("results_dir=/sys/nsa-cp-comm",), "error: results_dir=/sys/nsa-cp-comm: * /sys*", VALUE),
    CliCase(("results_dir=/sys/kernel/nsa/results",), "error: results_dir=/sys/kernel/nsa/results: * /sys/kernel*",
            VALUE),
    CliCase(("results_dir=/proc/nsa",), "error: results_dir=/proc/nsa: /proc is not a writable directory", VALUE),
    CliCase(("results_dir=/proc/sys/matrix-results",),
            "error: results_dir=/proc/sys/matrix-results: /proc/sys is not a writable directory", VALUE),
    CliCase(("results_dir='{tmp}/a\nb'",), "error: results_dir='*/a\\nb': must not contain a line break", VALUE,
            doc="results_dir='DIR/a<newline>b' (a line break in the path, quoted)"),
    CliCase(("results_dir={tmp}/old", "resume=true"),
            "error: results_dir=*/old: results.csv has another schema (missing *); "
            "use a new results_dir or move the old file away", POINT,
            doc="resume=true into a results.csv of an older schema", setup=("old/results.csv:old_schema",)),
)


def cli_doc(case: CliCase) -> str:
    return case.doc or " ".join(case.args)


# --- files the commands read and write: one line, exit 2, before any work ----------------


@dataclass(frozen=True)
class FileCase:
    command: str  # "plans", "report", "compare" or "matrix" (python -m matrix.COMMAND / python -m matrix)
    args: tuple[str, ...]  # {tmp} is the test's folder; files made by ``setup``
    doc: str  # the input, as the document states it
    expect: str  # the one stderr line
    setup: tuple[str, ...] = ()  # what tests/app/test_hardening.py:_file_setup makes under {tmp}
    # "ro_mount": a read-only tmpfs (skipped where none can be mounted); "proc_sys": /proc/sys not writable
    needs: str = ""


PLANS = ("--batches", "20", "--cp", "8", "--no-plot")
FIFO_SAYS = "is a FIFO, not a regular file"
FILES: tuple[FileCase, ...] = (
    FileCase("plans", ("--workload", "{tmp}/w.yaml", *PLANS), "a trace that is a FIFO",
             f"error: workload.path=*/fifo: {FIFO_SAYS}", ("fifo", "w.yaml:fifo")),
    FileCase("matrix", ("--dry-run", "workload={tmp}/w.yaml"), "a trace that is a FIFO",
             f"error: workload.path=*/fifo: {FIFO_SAYS}", ("fifo", "w.yaml:fifo")),
    FileCase("plans", ("--workload", "{tmp}/w.yaml", *PLANS), "a trace that is /dev/zero",
             "error: workload.path=/dev/zero: is a character device, not a regular file", ("w.yaml:/dev/zero",)),
    FileCase("plans", ("--workload", "{tmp}/w.yaml", *PLANS), "a trace with `seq_len` 0",
             "error: workload.path=*/t.csv: line 3: seq_len='0' must be an integer in [1, 16384] (the budget)",
             ("t.csv:zero", "w.yaml:t.csv")),
    FileCase("plans", ("--workload", "{tmp}/w.yaml", *PLANS), "a trace with `seq_len` `²`",
             "error: workload.path=*/t.csv: line 3: seq_len='²' must be an integer in [1, 16384] (the budget)",
             ("t.csv:superscript", "w.yaml:t.csv")),
    FileCase("plans", ("--workload", "{tmp}/w.yaml", *PLANS), "a trace with a `seq_len` of 5000 digits",
             "error: workload.path=*/t.csv: line 3: seq_len='99999*... (5002 characters) must be an integer in "
             "[1, 16384] (the budget)", ("t.csv:digits", "w.yaml:t.csv")),
    FileCase("plans", ("--workload", "{tmp}/w.yaml", *PLANS), "a trace whose header is 20 MB without `seq_len`",
             "error: workload.path=*/t.csv: line 1 is longer than 65536 characters: not a trace (a header with "
             "seq_len, then one request a line)",
             ("t.csv:wide", "w.yaml:t.csv")),
    FileCase("plans", ("--workload", "{tmp}/w.yaml", *PLANS), "a workload file whose `kind` is 1 MB of text",
             "error: workload.kind='kkkk*... (1000* characters)", ("w.yaml:kind",)),
    FileCase("plans", ("--nccl-tests", "{tmp}/fifo", *PLANS), "nccl-tests JSON that is a FIFO",
             f"error: --nccl-tests=*/fifo: {FIFO_SAYS}", ("fifo",)),
    FileCase("report", ("{tmp}/res", "--nccl-tests", "{tmp}/fifo"), "nccl-tests JSON that is a FIFO",
             f"error: --nccl-tests=*/fifo: {FIFO_SAYS}", ("fifo", "res")),
    FileCase("plans", ("--nccl-tests", "{tmp}/ag.json", *PLANS), "nccl-tests JSON nested 200,000 `[` deep",
             "error: --nccl-tests=*/ag.json: nested 200000 deep, over the 64 a JSON file of ours may be",
             ("ag.json:deep",)),
    FileCase("report", ("{tmp}/res", "--nccl-tests", "{tmp}/ag.json"), "nccl-tests JSON with `\"size\": 10**400`",
             "error: --nccl-tests=*/ag.json: a number of 401 characters, over the 40 digits a JSON file of ours "
             "may hold",
             ("ag.json:huge", "res")),
    FileCase("report", ("{tmp}/res",), "`runs.jsonl` beside results.csv that is a FIFO",
             f"error: RESULTS=*/res: */res/runs.jsonl: {FIFO_SAYS}", ("res", "res/runs.jsonl:fifo")),
    FileCase("compare", ("{tmp}/res", "{tmp}/res"), "`samples.jsonl` beside results.csv that is a FIFO",
             f"error: BASE=*/res: */res/samples.jsonl: {FIFO_SAYS}", ("res", "res/samples.jsonl:fifo")),
    FileCase("compare", ("{tmp}/res", "{tmp}/res", "--fail-above=1e6%"), "a `--fail-above` over 100%",
             "error: --fail-above=1e6%: over 100%, the gate could flag nothing sensible (a time more than 2x slower; "
             "no bandwidth drops by more than 100%); use at most 100%", ("res",)),
    FileCase("plans", ("--out", "{tmp}/file", *PLANS), "`--out` onto a regular file",
             "error: --out=*/file: */file exists and is not a directory", ("file",)),
    FileCase("plans", ("--out", "{tmp}/file/plans", *PLANS), "`--out` below a regular file",
             "error: --out=*/file/plans: */file is not a directory", ("file",)),
    FileCase("plans", ("--out", "/proc/sys/plans", *PLANS), "`--out` under /proc/sys",
             "error: --out=/proc/sys/plans: /proc/sys is not a writable directory", needs="proc_sys"),
    FileCase("plans", ("--out", "{tmp}/ro/plans", *PLANS), "`--out` on a read-only mount",
             "error: --out=*/ro/plans: */ro is not a writable directory (Read-only file system)", needs="ro_mount"),
    FileCase("report", ("{tmp}/res", "--out", "{tmp}/file/report"), "`--out` below a regular file",
             "error: --out=*/file/report: */file is not a directory", ("res", "file")),
    FileCase("report", ("{tmp}/res", "--out", "{tmp}/ro/report"), "`--out` on a read-only mount",
             "error: --out=*/ro/report: */ro is not a writable directory (Read-only file system)", ("res",),
             needs="ro_mount"),
)


def file_doc(case: FileCase) -> str:
    shown = " ".join(a for a in case.args if a not in PLANS).replace("{tmp}/", "")
    return f"python -m {'matrix.' + case.command if case.command != 'matrix' else 'matrix'} {shown}"


# --- faults and interruptions ----------------------------------------------------------


@dataclass(frozen=True)
class FaultCase:
    what: str
    where: str
    gives: str
    test: str  # the test that checks this row
    module: str = "test_hardening"  # the test module (tests/<module>.py) holding it


# The failing ranks are implementations of the catalogue of broken ones.
BROKEN = "tests.broken_impls"
# A failure must be noticed, not waited out: the faults that are not hangs get a
# timeout far beyond the bound the tests allow (a minute, on a loaded machine).
# Reasons number ranks as the CP group does: in reverse world order, so the
# failing last world rank is the group's rank 0 (an error's own text is quoted).
_CP = " (ranks numbered as in the CP group)"
POOL_FAULTS = {  # tests.broken_impls attribute -> (timeout_s, status, reason; * matches anything)
    "raise_rank": (600.0, "error", f"in {BROKEN}:raise_rank's checks: rank 0 error: RuntimeError: injected fault on "
                                   f"rank 1{_CP}"),
    "crash_rank": (600.0, "error", f"in {BROKEN}:crash_rank's checks: rank 0 crashed: exited with code 17{_CP}"),
    # where each rank waited, from its stack: the hung one in its sleep, its peer in the all-gather
    "hang_rank": (3.0, "timeout", f"in {BROKEN}:hang_rank's checks: rank 0,1 timeout: no answer within 3s; where they "
                                  f"waited: rank 0 at tests/broken_impls.py:* in _hang; rank 1 waiting in "
                                  f"torch.distributed.*, called at tests/broken_impls.py:* in _gather{_CP}"),
}
# Each rank reports the place it last announced with its failure: the reason
# names the implementation's step, as a rank pool's does. A rank that crashed
# reports nothing, so no place.
TORCHRUN_FAULTS = {
    "raise_rank": (600.0, "error",
                   f"in {BROKEN}:raise_rank's checks: rank 0 error: RuntimeError: injected fault on rank 1{_CP}"),
    # torchrun stops every rank once one exits; rank 1 may go before it posted its outcome
    "crash_rank": (600.0, "error", f"rank 0* crashed: no report: torchrun stopped the point after a rank exited{_CP}"),
    "hang_rank": (3.0, "timeout", f"in {BROKEN}:hang_rank's checks: rank 0,1 timeout: no answer within 3s{_CP}"),
}

FAULTS: tuple[FaultCase, ...] = (
    *(
        FaultCase(
            f"impl={BROKEN}:{f}" + (f" timeout_s={t:g}" if s == "timeout" else ""),
            where,
            f"status `{s}`, reason `{r}`; {after}",
            test,
        )
        for faults, where, after, test in (
            (POOL_FAULTS, "a point on RankPool ranks (`python -m matrix`)",
             "all of the point's processes gone; the next point runs normally", "test_injected_fault_costs_one_row"),
            (TORCHRUN_FAULTS, "a point on torchrun ranks (`matrix.app.torchrun_point`)", "torchrun exits 1",
             "test_torchrun_fault_costs_one_row"),
        )
        for f, (t, s, r) in faults.items()
    ),
    FaultCase(
        f"impl={BROKEN}:raise_rank with padded at the same point (a rank that raises in one implementation's "
        "checks)",
        "a point with several implementations (`run_point`)",
        "the raising implementation's row only (`error`/`timeout`, naming the place: its checks, building its timed "
        "form, its loop turn and iteration, the verification of its outputs); the others rerun on fresh ranks, "
        "their own verdicts",
        "test_a_raising_implementation_costs_its_own_row",
        "test_blame",
    ),
    FaultCase(
        f"impl={BROKEN}:stride_zero,padded (and `stride_raises`, `stride_float`, `stride_huge`, `supports_raises`, "
        "`supports_exits`, `supports_list`, `bits_rule_str`, `bits_rule_raises`: a plug-in hook that raises or "
        "answers out of its contract)",
        "the sweep's own process, folding a point's rows",
        "that implementation's `error` row, one line naming the hook and the value (`row_stride(plan) returned 0, "
        "not an int in [32, 65568] ...`), asked before any rank runs the point; the point's other implementations "
        "run and keep their own verdicts; the sweep ends with its summary",
        "test_every_bad_hook_answer_is_its_own_error_row_and_the_sweep_ends_with_its_summary",
        "test_plugins",
    ),
    FaultCase(
        "an expanded (stride-0), strided or overlapping `full` handed to `padded_gather_` on one rank, or a tensor "
        "that requires grad",
        "the library's round trips, on real ranks",
        "the same one-line `ValueError` on every rank, naming the argument and the rank, before any collective "
        "(the layout is part of the ranks' agreement); torch alone raised on that rank only, mid-collective",
        "test_bad_input_on_one_rank_is_the_same_error_on_every_rank",
        "test_agree",
    ),
    FaultCase(
        f"impl={BROKEN}:extra_barrier_timed (a timed form issuing a barrier on one rank)",
        "a point's timed loop",
        "`timeout`, `collective_skipped`: the rank still in that implementation's turn and iteration while its peers "
        "moved on, and where each waited (`torch.distributed.barrier`, called at the plug-in's line)",
        "test_timed_forms_that_break_the_ranks_are_diagnosed",
        "test_blame",
    ),
    FaultCase(
        f"impl={BROKEN}:default_group_form bystanders=1 (a timed form built on the default group)",
        "building a point's timed form",
        "`error`, `group`: an index out of range only on the ranks whose global rank is past the CP group's ranks, "
        "named with both numbers: the global rank where `dist.get_rank(group)` is meant",
        "test_timed_forms_that_break_the_ranks_are_diagnosed",
        "test_blame",
    ),
    FaultCase(
        "SIGKILL of `python -m matrix -m ...` mid-sweep",
        "the sweep process",
        "results.csv holds whole rows only (valid CSV); no rank process survives it; "
        "the same command with `resume=true` completes the sweep, every point exactly once",
        "test_sigkill_mid_sweep_then_resume_completes_it",
    ),
    FaultCase(
        "SIGKILL of a process starting ranks, with one rank in the rendezvous, one loading torch and one not yet started",
        "the process that starts the ranks",
        "no rank survives it: a rank's first statements (before torch is imported) arm the parent-death "
        "signal (`PR_SET_PDEATHSIG`), then the rank exits if its parent is no longer the process that "
        "started it (the parent died before the signal was armed)",
        "test_sigkill_of_the_starter_at_fixed_points_of_rank_start_up_leaves_no_rank",
        "test_orphans",
    ),
    FaultCase(
        "SIGKILL of a process whose CPU ranks were forked from its fork server, the server and the ranks stopped",
        "the process that starts the ranks",
        "neither the server nor a rank survives it: the server's first statements arm the parent-death signal "
        "as a rank's do, and each forked rank arms its own against the server, then exits if the server is no "
        "longer its parent; served from a worker without the signal, all of them outlive it (the drill fails)",
        "test_sigkill_of_the_starter_ends_the_fork_server_and_every_rank_it_forked",
        "test_forkserver",
    ),
    FaultCase(
        "KeyboardInterrupt (or any exception) while a `RankPool` starts",
        "the process that starts the ranks",
        "the ranks started so far are killed and reaped and the rendezvous file removed; a rank its "
        "starter lost track of exits when its pipe to the starter closes",
        "test_an_interrupted_start_kills_the_started_ranks_and_removes_the_rendezvous",
        "test_orphans",
    ),
    FaultCase(
        "rendezvous files (`.rendezvous-HOST-PID-*`) of starters killed with SIGKILL",
        "a `RankPool` work directory",
        "removed by the next pool started there (files of live starters and other hosts are kept)",
        "test_stale_rendezvous_files_of_dead_starters_are_removed",
        "test_orphans",
    ),
    FaultCase(
        "a rank killed by the kernel's OOM killer",
        "a `RankPool` task",
        "status `crashed`, reason `killed by SIGKILL (out of memory)` when the memory cgroup's (else the "
        "system's) OOM-kill counter rose during the task; `killed by SIGKILL (out of memory?)` where no "
        "counter is readable",
        "test_a_rank_killed_by_the_oom_killer_says_so",
        "test_ranks",
    ),
    FaultCase(
        "a torn last line in results.csv (a write cut short by something else)",
        "the next append (`matrix.store.results.append_rows`)",
        "the torn line is moved to `results.csv.torn` (one warning line on stderr) and the rows start a "
        "line of their own: the file stays valid CSV; an unterminated whole row just gets its newline",
        "test_append_after_a_torn_last_line_sets_it_aside_and_stays_valid_csv",
        "test_results_file",
    ),
    FaultCase(
        "a full disk, or a short write, while appending rows",
        "`matrix.store.results.append_rows`",
        "`ResultsWriteError` (an `OSError`; one line naming the file); the file is exactly as it was",
        "test_a_short_write_leaves_the_files_exactly_as_they_were",
        "test_results_file",
    ),
    FaultCase(
        "results.csv is a directory, below a regular file, in an unwritable place, or has a name too long",
        "`matrix.store.results` (append, schema check, resume)",
        "`ResultsPathError` (a `SchemaError`: one line naming `results_dir`)",
        "test_results_path_that_is_a_directory",
        "test_results_file",
    ),
    FaultCase(
        "`results.csv`, `runs.jsonl` or `samples.jsonl` a FIFO or a link to /dev/null",
        "the preflight (`matrix.store.folder.Folder.check`), before any point runs",
        "`ResultsPathError`, one line naming the file and what it is, exit 2; no point runs, no FIFO waited on",
        "test_a_side_file_that_is_no_regular_file_is_refused_up_front",
        "test_results_file",
    ),
    FaultCase(
        "a file of the results folder not writable (a read-only mount)",
        "the preflight (`matrix.store.folder.Folder.check`)",
        "`ResultsPathError`: `FILE is not writable (Read-only file system)`, exit 2, before any point runs",
        "test_a_side_file_that_is_not_writable_is_refused_up_front",
        "test_results_file",
    ),
    FaultCase(
        "`truncate -s 1G results.csv`, then report or a sweep",
        "every reader of results.csv (`matrix.store.results.records`, 64 MiB a line)",
        "one line naming the line and the file's size, exit 2; memory bounded by one line, never the file",
        "test_a_results_file_of_one_gigabyte_line_is_refused_with_its_size_not_read",
        "test_results_file",
    ),
    FaultCase(
        "a 1 GiB line in `samples.jsonl` (compare) or a 1 GiB `runs.jsonl` (the sweep)",
        "`matrix.store.inputs.lines` (16 MiB a line), `Folder.check` (256 MiB of runs)",
        "one line naming the file and its size, exit 2; never loaded whole",
        "test_a_gigabyte_samples_line_or_runs_file_is_refused_with_its_size",
        "test_results_file",
    ),
    FaultCase(
        "`resume=true` over rows with bytes that are not UTF-8",
        "`matrix.store.folder.Folder.completed`",
        "read as U+FFFD; resume works; a line the csv module cannot parse is one line naming it",
        "test_resume_reads_a_file_with_bytes_that_are_not_utf8",
        "test_results_file",
    ),
    FaultCase(
        "a plug-in raising with a 229 KB message (a compiler log)",
        "a point's row (`matrix.store.results.append_rows`)",
        "status `error`; every free-text cell is cut to 4096 characters stating the whole length, the whole "
        "text goes to `results.full-text.jsonl` beside results.csv; every reader accepts fields past the csv "
        "module's 131072-character limit (a long `seq_lens`); resume and report work",
        "test_a_huge_error_message_leaves_a_resumable_folder",
        "test_hostile_sweeps",
    ),
    FaultCase(
        "one `\"` in a middle row, a row with a field lost or added, a cell of the wrong type",
        "every reader of results.csv (resume, summary, report, compare)",
        "each row is one line (the writer folds newlines), so the line is set aside and counted "
        "(a warning line; a note in report/compare), never merged with the rows after it",
        "test_a_stray_quote_sets_its_line_aside_and_merges_no_rows",
        "test_results_file",
    ),
    FaultCase(
        "a byte-order mark at the start of results.csv",
        "the matrix and report/compare",
        "read past by both",
        "test_a_byte_order_mark_is_read_past",
        "test_results_file",
    ),
    FaultCase(
        "every rank passing int16, uint16, complex64, float8 or any other torch dtype",
        "the ranks' agreement check (`nsa_cp_comm.agree`)",
        "the same dtype code in every process (a digest of the name, not `hash()`): the call runs",
        "test_dtype_codes_are_the_same_in_every_process_and_distinct",
        "test_agree",
    ),
    FaultCase(
        "a plug-in that hands the library's checked gather one row short on one rank",
        "the point's checks, inside its one input agreement (`nsa_cp_comm.agree.agreed`)",
        "refused on that rank before any collective, naming the rows and the plan's; its peer is stopped, not left "
        "waiting in the gather",
        "test_a_short_shard_handed_to_the_library_on_one_rank_is_refused_inside_the_points_agreement",
        "test_checks",
    ),
    FaultCase(
        "a plug-in that starts a helper process (`sleep 987654`) and returns",
        "a point's rank processes",
        "each rank leads its own process group; closing the pool kills the groups whole: no helper outlives the sweep",
        "test_a_plug_ins_helper_processes_end_with_its_ranks",
        "test_hostile_sweeps",
    ),
    FaultCase(
        "a plug-in that destroys the process group, or changes a torch global setting (intra- or inter-op threads, "
        "grad mode, deterministic algorithms, flush-denormal, default dtype or device)",
        "warm ranks reused by the next point",
        "each rank compares its settings with its start after every implementation's checks, the building of its "
        "timed form and each of its timed turns: the implementation after whose step a change was first "
        "found gets a `failed` row (`failed_check` `rank_state`) naming each change, its old and new value and the "
        "ranks; the changed ranks are closed and the point's other implementations rerun on fresh ones; after every "
        "point the pool checks again (group alive by one all-reduce), and a change no step showed fails the point's "
        "ok rows",
        "test_a_point_that_changes_its_ranks_gets_the_failure_not_the_next_point",
        "test_hostile_sweeps",
    ),
    FaultCase(
        "a plug-in that wraps a `torch.distributed` function (the all-gather, in `torch.distributed` and "
        "`distributed_c10d`) and leaves the wrapper installed",
        "warm ranks reused by the next point (every later all-gather through the wrapper)",
        "every `torch.distributed` and `distributed_c10d` function the harness calls, and the process group's "
        "methods, must be the objects the rank started with: as above, the implementation that wrapped it gets "
        "`failed` (`rank_state`) naming the wrapper and what it replaced, the others are rerun on fresh ranks; "
        "the check's own all-reduce uses the originals",
        "test_a_plug_in_that_changes_its_ranks_gets_the_failed_row_and_the_others_are_rerun_on_fresh_ranks",
        "test_rank_state",
    ),
    FaultCase(
        "a plug-in that calls `torch.manual_seed(1234)` or draws from torch's global RNG",
        "the next point's draws on the same warm ranks",
        "every point first seeds torch's global RNG from (its `seed`, the CP group rank): a point draws the same "
        "whatever ran before it",
        "test_a_point_is_seeded_from_its_seed_and_rank_whatever_ran_before",
        "test_rank_state",
    ),
    FaultCase(
        "`impl=sys:exit` (a factory raising SystemExit or KeyboardInterrupt)",
        "`python -m matrix`",
        "a bad reference: one line naming it, exit 2, nothing runs",
        "test_bad_reference_is_one_line_exit_2_nothing_written",
        "test_plugins",
    ),
    FaultCase(
        "`hydra.job.chdir=true` with a relative `results_dir`",
        "`python -m matrix -m`",
        "`results_dir` is made absolute before Hydra changes directory: every row in one results.csv, resume works",
        "test_relative_results_dir_with_hydra_chdir_keeps_every_row_in_one_place",
        "test_hostile_sweeps",
    ),
    FaultCase(
        "Hydra's job folder cannot be written (a full disk, a file in the way)",
        "`python -m matrix -m`",
        "one line naming the error and the command that finishes the sweep, exit 1",
        "test_a_job_folder_that_cannot_be_written_is_one_line_with_the_resume_hint",
        "test_hostile_sweeps",
    ),
    FaultCase(
        "stdout into `head -c 100` (a pipe closed early)",
        "`python -m matrix -m`",
        "the sweep runs on and writes every row; one warning line on stderr at the end, no traceback",
        "test_stdout_into_a_closed_pipe_is_one_line_and_the_rows_are_written",
        "test_hostile_sweeps",
    ),
    FaultCase(
        "SIGTERM or SIGHUP to the sweep",
        "`python -m matrix -m`",
        "as Ctrl-C: the running point named, the command that finishes the sweep, exit 128 + the signal; no rank left",
        "test_sigterm_and_sighup_say_what_was_running_and_how_to_resume",
        "test_hostile_sweeps",
    ),
    FaultCase(
        "a rank stopped while the ranks start",
        "a point's rank start-up",
        "bounded by `startup_timeout_s` (null: ten times the estimate for the world on this machine, scaled by its "
        "load, at least 60 s); ranks still starting at the bound are started again once, a rank that failed is "
        "not; then the point's rows say `error`",
        "test_a_point_bounds_rank_start_up_by_its_own_key_or_the_machine",
        "test_rank_state",
    ),
    FaultCase(
        "ranks slow to start on a loaded machine",
        "a point's rank start-up",
        "a start whose ranks were all still starting (none failed) at the bound is tried once more",
        "test_a_start_that_times_out_is_retried_and_one_that_fails_is_not",
        "test_rank_state",
    ),
    FaultCase(
        "a rank stopped (SIGSTOP) while its peers wait for it",
        "a `RankPool` task (and start-up)",
        "status `timeout`; the reason adds `rank N never answered: its process is stopped (SIGSTOP?)`",
        "test_hanging_and_stopped_ranks_time_out_promptly_the_stopped_one_is_named_and_all_are_killed",
        "test_ranks",
    ),
    FaultCase(
        "`seq_lens` with thousands of entries",
        "the preflight (Hydra's override parser)",
        "parsed in time linear in its length (Hydra's list visitor replaced by one that walks the list once); "
        "over 65536 entries refused in one line before any parser runs",
        "test_a_list_parses_in_linear_time_to_the_same_values",
        "test_hydra_lists",
    ),
    FaultCase(
        "a NaN, infinite, negative or non-numeric metric in BASE or NEW",
        "`python -m matrix.compare`",
        "bad data: one line naming the run, the metric, its value and the first point; exit 2",
        "test_a_nan_or_impossible_metric_is_bad_data",
        "test_compare",
    ),
    FaultCase(
        "`resume=true` after points errored or timed out",
        "`matrix.store.folder.Folder.completed`",
        "a point whose latest row (file order) for some impl is `error` or `timeout` runs again; "
        "`ok`, `failed`, `refused`, `passthrough` and `skipped` points are kept",
        "test_resume_reruns_points_whose_latest_rows_errored_or_timed_out",
        "test_results_file",
    ),
    FaultCase(
        "`resume=true` over a results.csv with a malformed line (a stray quote from an editor)",
        "`matrix.store.folder.Folder.completed`",
        "the line is moved to `results.csv.torn` and results.csv rewritten without it (a temporary file renamed "
        "into place, under the append lock; an append waiting on the lock follows the new file): "
        "`pandas.read_csv` reads it; one warning line",
        "test_resume_moves_malformed_lines_aside_so_pandas_reads_the_file",
        "test_results_file",
    ),
    FaultCase(
        "a full disk while a resume rewrites results.csv",
        "`matrix.store.results.set_aside_malformed`",
        "results.csv and its side file exactly as they were (the set-aside undone); one warning line saying the "
        "lines stay in the file; the readers still skip them and the resume goes on",
        "test_a_resume_that_cannot_rewrite_leaves_both_files_as_they_were",
        "test_results_file",
    ),
    FaultCase(
        "an append that opened results.csv just before a resume rewrote it",
        "`matrix.store.results.append_rows`",
        "once it holds the lock it sees the name holds another file, opens it again and appends there: no row lost",
        "test_an_append_waiting_on_the_lock_follows_a_rewrite",
        "test_results_file",
    ),
    FaultCase(
        "a full disk while writing samples.jsonl",
        "`matrix.store.samples.append_samples`",
        "`ResultsWriteError`: one line naming the file (no bare `[Errno 28]`); the file is as it was",
        "test_a_full_disk_while_writing_samples_names_the_file",
    ),
    FaultCase(
        "a full disk under `python -m matrix.plans --out`",
        "the plot, after the work",
        "one line naming the file and the error, exit 2; plans.json whole, no PNG and no temporary file left",
        "test_plans_out_on_a_full_disk_is_one_line_and_leaves_no_partial_file",
    ),
    FaultCase(
        "a full disk under `python -m matrix.report --out`",
        "report.md, its appendix, the PNGs",
        "one line, exit 2; every file there whole (written under a temporary name and renamed), none truncated",
        "test_report_out_on_a_full_disk_is_one_line_and_leaves_no_partial_file",
    ),
    FaultCase(
        "a write that fails half way (a full disk, without a tmpfs to fill)",
        "`matrix.store.outputs.write_atomic`",
        "an OSError naming the file; the old file unchanged, the temporary file removed",
        "test_write_atomic_on_a_full_disk_leaves_the_old_file",
    ),
    FaultCase(
        "a trace starting with a UTF-8 byte-order mark (a spreadsheet's CSV export)",
        "`matrix.scale.workload.read_trace`",
        "read past: the header is `seq_len`",
        "test_a_trace_with_a_byte_order_mark_reads",
    ),
    FaultCase(
        "a trace whose batch ids come back (`a, b, a`)",
        "`matrix.scale.workload.read_trace`",
        "one batch per id, in order of first appearance, requests in file order (`[10, 30]`, `[20]`): the padding "
        "statistics are those of the grouped batches; one note line on stderr",
        "test_a_batch_id_that_comes_back_is_one_batch",
    ),
    FaultCase(
        "`workload=/abs/x.yaml` (a workload file outside conf/workload)",
        "`python -m matrix`",
        "runs, as the error text offers: the file's mapping is given to Hydra's `workload` group under a name of "
        "its own; rows record its `name` (else its path)",
        "test_a_workload_file_by_absolute_path_runs",
    ),
    FaultCase(
        "Ctrl-C in a `workload=/abs/x.yaml` sweep",
        "`python -m matrix` (the resume hint)",
        "the hint repeats `workload=/abs/x.yaml` and the pinned `results_dir`, not the `seq_lens` it expands to "
        "(which `workload=` refuses) nor the name Hydra was given for the file",
        "test_the_resume_hint_of_a_workload_sweep_names_the_workload_file",
    ),
    FaultCase(
        "a plug-in that breaks `Tensor.zero_` after its own checks (or patches any torch, c10d or Tensor attribute, "
        "swaps a function's code, enters a torch function or dispatch mode, renices its rank, narrows its CPU "
        "affinity, leaves a thread running, sets an `NSA_*` variable)",
        "a point on warm ranks, and the next point",
        "the plug-in's own row `failed` (`rank_state`) naming what changed; the point's other implementations rerun "
        "on fresh ranks, `ok`; the next point's `padded` `ok`",
        "test_a_plug_in_that_breaks_zero_gets_its_own_failed_row_and_the_next_points_padded_is_ok",
        "test_rank_state",
    ),
    FaultCase(
        "a plug-in that also fools the state check (rewrites its record)",
        "the next point",
        "its own row may say `ok`, but ranks that ran outside code are never reused: the next point starts fresh "
        "ranks and its `padded` is `ok`",
        "test_a_plug_in_that_fools_the_state_check_still_leaves_the_next_point_fresh_ranks",
        "test_rank_state",
    ),
    FaultCase(
        "a plug-in's child started in a new session (`start_new_session=True`, `os.setsid`)",
        "`python -m matrix -m`",
        "killed with its ranks: every rank (and the fork server) is a child subreaper, and the rank's descendants "
        "are stopped and killed before the rank; none left after the sweep",
        "test_a_plug_ins_helper_processes_end_with_its_ranks",
        "test_hostile_sweeps",
    ),
    FaultCase(
        "a plug-in's `atexit` handler that never returns",
        "`python -m matrix -m`, after its summary",
        "ranks end without exit handlers; the sweep gives its own 10 s, then one warning line, and exits with its "
        "status",
        "test_a_plug_ins_exit_handler_that_never_returns_does_not_hang_the_sweep",
        "test_hostile_sweeps",
    ),
    FaultCase(
        "nine 120 kB environment variables",
        "CPU ranks forked from the fork server",
        "the spawn request names a file holding the environment (read and removed by the server): the ranks "
        "start and see it",
        "test_a_huge_environment_reaches_forked_ranks_by_file",
        "test_forkserver",
    ),
    FaultCase(
        "the fork server stopped (SIGSTOP)",
        "the next pool's start",
        "its health check fails: one warning line naming its pid and that it is stopped; it is killed and "
        "replaced, and the pool's ranks start by exec",
        "test_a_stopped_fork_server_is_named_and_replaced_and_the_ranks_start_by_exec",
        "test_forkserver",
    ),
    FaultCase(
        "`NSA_CP_COMM_FORK_RANKS=false` (or `BIND_RANKS`, `REUSE_RANKS`: 0/false/no/off, 1/true/yes/on, any case); "
        "`=flase`",
        "a pool's start",
        "read as booleans; anything else one `ValueError` line naming the variable and the words it takes",
        "test_switches_read_as_booleans_and_anything_else_is_one_line_naming_the_variable",
        "test_forkserver",
    ),
    FaultCase(
        "a newline in an `NSA_*` variable",
        "a row's `repro`",
        "written in bash's `$'...'` form on one line, read back (and by bash) whole",
        "test_a_newline_in_a_carried_variable_is_kept_in_the_repro",
        "test_repro_env",
    ),
    FaultCase(
        "two sweeps into one `results_dir`",
        "Hydra's records (`multirun.yaml`, each job's `.hydra`)",
        "each command's under `results_dir/hydra/START-PID/`: neither overwrites the other's",
        "test_hydra_records_go_to_a_folder_per_command",
    ),
)


# --- sweeps beyond the machine: refused before anything starts ----------------------------


@dataclass(frozen=True)
class BoundCase:
    args: tuple[str, ...]  # the sweep's command line (after ``python -m matrix -m``)
    expect: str  # matrix.app.budget.check_sweep's one line on BOUND_MACHINE ("" for accepted)


# The CI-sized machine the rows are computed for (nsa_cp_comm.harness.machine.Machine fields).
BOUND_MACHINE = dict(cores=2, memory_bytes=23.4 * (1 << 30), memory_source="available memory", max_ranks=8,
                     max_ranks_source="4 per core, 2 cores", gpus=0, gpu_bytes=0.0)
FORCE = "(set force=true to run anyway)"
BOUNDS: tuple[BoundCase, ...] = (
    BoundCase(("cp_size=1024", "hidden_size=64"),
              f"cp_size=1024: 1024 rank processes exceed this machine's limit of 8 (4 per core, 2 cores) {FORCE}"),
    BoundCase(("hidden_size=65536", "seq_lens=[100000]"),
              f"hidden_size=65536: 2 ranks x ~* GiB exceed this machine's 23.4 GiB available memory {FORCE}"),
    BoundCase(("cp_size=8", "hidden_size=4096", "num_experts=65536", "seq_lens=[100]"),
              f"num_experts=65536: 8 ranks x ~* GiB exceed this machine's 23.4 GiB available memory {FORCE}"),
    BoundCase(("hidden_size=64", "seq_lens=[16000000]"),
              f"seq_lens=[16000000]: 2 ranks x ~* GiB exceed this machine's 23.4 GiB available memory {FORCE}"),
    BoundCase(("hidden_size=4096", "seq_lens=[100]", "align=16777216"),
              f"align=16777216: 2 ranks x ~* GiB exceed this machine's 23.4 GiB available memory {FORCE}"),
    BoundCase(("+matrix=deepseek_v32",),
              "cp_size=8 hidden_size=7168 seq_lens=[16384]: the sweep's 8 points would take ~* min on this machine "
              f"(cpu/gloo at ~0.075 GB/s busbw; this point ~* min), over the 60 min limit {FORCE}"),
    BoundCase(("+matrix=deepseek_v32", "force=true"), ""),
    BoundCase(("+matrix=default",), ""),
)


NOTES = """\
## Notes

- Bad values of the command line are refused before Hydra starts: `value` rows by
  `matrix.app.config.validate_overrides` (each value of each key, sweeps included),
  `point` rows by `matrix.app.preflight` (every point of the sweep composed as Hydra
  will, then `matrix.app.config.validate`, the machine checks and the results file's
  schema). Nothing is written: no results directory, no Hydra job directory.
  With a remote launcher (`hydra/launcher=slurm`) the machine checks run in the
  job, on the node that runs the point.
- Non-writable `results_dir`: the tests run as root, where `os.access` calls
  every ordinary directory writable and no read-only mount is available. Tried:
  a path below a regular file (works for root), a directory of `/proc/sys`
  (not writable even for root; skipped where it is), and a mode-0555 directory
  (skipped when running as root). Output folders (`--out` of plans and report)
  are also tried on a read-only tmpfs, mounted by the test where it can be
  (root), and a full disk on a small tmpfs filled by the test.
- A failed point costs its rows, never the sweep: its rank processes are killed
  and reaped, the next point starts fresh ranks, and the sweep exits 1 at the
  end. Rows are appended with one `write(2)` under `flock`, so a kill at any
  moment leaves whole rows only.
- No rank outlives its starter on Linux (the parent-death signal is Linux's;
  elsewhere a rank notices only when its pipe closes). The signal follows the
  thread that started the ranks: start pools from a thread that outlives them.
  CPU ranks forked from a fork server are tied to it, and it to the starter's
  thread, in the same way (one server per starting thread).
- The sweep bounds are estimates from stated constants (`matrix/app/budget.py`),
  meant to catch a sweep off by an order of magnitude, not to predict run
  times; `force=true` skips them. With a remote launcher only what no node can
  hold is refused at submission.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    out = [
        "# Reliability",
        "",
        "What a bad input, a failing rank or a killed sweep gives. Every row is a test:",
        "`tests/app/test_hardening.py` (and the modules the fault rows name) run the rows of",
        "`tests/reliability_table.py`, and this file is generated from them",
        "(`python tests/reliability_table.py > RELIABILITY.md`; a test fails when it",
        "drifts). `*` stands for a machine-specific part.",
        "",
        "## Bad input: the library",
        "",
        "A `ValueError` whose message is one line naming the argument and its value.",
        "The round trips raise on every rank, from the plan all ranks share, so no rank",
        'is left inside a collective (`uneven` = `plan_split([10], 2, policy="zigzag_page",',
        "page_size=64)`, ranks hold 10 and 0 rows; run on 2 gloo ranks).",
        "",
        "| call | ValueError message |",
        "| --- | --- |",
    ]
    out += [f"| `{_cell(c.code)}` | {_cell(c.expect)} |" for c in LIBRARY + ROUNDTRIP]
    out += [
        "",
        "## Bad input: the CLI",
        "",
        "`python -m matrix -m results_dir=DIR ARGS` exits 2 and prints exactly this one",
        "line on stderr; nothing is written.",
        "",
        "| ARGS | checked | stderr |",
        "| --- | --- | --- |",
    ]
    out += [f"| `{_cell(cli_doc(c))}` | {c.stage} | `{_cell(c.expect)}` |" for c in CLI]
    out += [
        "",
        "## Bad files and output folders",
        "",
        "Every file a command reads (a trace, nccl-tests JSON, results.csv, samples.jsonl,",
        "runs.jsonl) is opened without waiting and checked to be a regular file of bounded",
        "size before it is read, and JSON is parsed with bounded nesting and number size",
        "(`matrix.store.inputs`); every output folder is checked writable before the work and",
        "every output file is written under a temporary name and renamed",
        "(`matrix.store.outputs`). The command exits 2 with exactly this one line on stderr",
        "and writes nothing (`test_a_bad_file_or_output_folder_is_one_line_before_any_work`).",
        "",
        "| command | input | stderr |",
        "| --- | --- | --- |",
    ]
    out += [f"| `{_cell(file_doc(c))}` | {_cell(c.doc)} | `{_cell(c.expect)}` |" for c in FILES]
    out += [
        "",
        "## Faults and interruptions",
        "",
        "A failing rank is a test-only implementation of `tests/broken_impls.py`, loaded",
        "by reference like any outside one: on the world's last rank its gather raises,",
        "exits (`os._exit(17)`) or hangs once its peers are inside the all-gather. A",
        "failure is noticed, not waited out (the tests allow a minute on a loaded",
        "machine, against a 600 s timeout); a hang ends at `timeout_s`. Each row names",
        "its test.",
        "",
        "| fault | where | what you get | test |",
        "| --- | --- | --- | --- |",
    ]
    out += [f"| {_cell(f.what)} | {_cell(f.where)} | {_cell(f.gives)} | `{f.module}` |" for f in FAULTS]
    out += [
        "",
        "## Sweeps beyond the machine",
        "",
        "Before anything starts, `matrix.app.budget.check_sweep` (called by the preflight) puts",
        "figures on every point (rank processes, memory per rank from the plan and the",
        "buffers, seconds on this machine's device) and refuses a sweep beyond the machine in",
        "one line naming the key, the estimate and the limit. For a 2-core, 23.4 GiB machine",
        "without a GPU (`tests/app/test_budget.py`):",
        "",
        "| ARGS | refused with |",
        "| --- | --- |",
    ]
    out += [f"| `{_cell(' '.join(b.args))}` | {f'`{_cell(b.expect)}`' if b.expect else 'accepted'} |" for b in BOUNDS]
    out += ["", NOTES]
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render())
