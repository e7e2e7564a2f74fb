"""The bad inputs, faults and interruptions the hardening tests try.

One table, two uses: tests/app/test_hardening.py (and test_budget.py) run every
row, and RELIABILITY.md's tables are rendered from the same rows by
``python docs/doc_tables.py`` (:data:`TABLES`), so the document cannot drift (a
test fails when a block differs from its rendering). In the expected texts ``*``
stands for a machine-specific part (a path, a GPU count).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


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
    from nsa_cp_comm.harness.rank_body import rank_device

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
    CliCase(("seed=range(0,1000000000)",), "error: the sweep has 1000000000 points (seed 1000000000), over the "
            "100000 one sweep may hold: split it into smaller sweeps (each into the same results_dir)", VALUE),
    CliCase(("seed=range(0,1000)", "hidden_size=range(32,4032,32)"), "error: the sweep has 125000 points (seed "
            "1000 x hidden_size 125), over the 100000 one sweep may hold: split it into smaller sweeps (each into the "
            "same results_dir)", VALUE),
    CliCase(("+plan_class=even", "+layout=round_robin"), "error: +plan_class=even and +layout=round_robin: a plan "
            "class sets the split, page size and request lengths of its class (in the engine's own split), so the "
            "layout would be replaced: drop one (engine= picks the split a plan class uses)", POINT),
    CliCase(("iters=auto", "+hydra.job.env_set.NSA_CP_AUTO_MAX_S=abc"),
            "error: NSA_CP_AUTO_MAX_S='abc': must be seconds in (0, 30]", POINT),
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
    CliCase(("+layout=../matrix/smoke",), "error: layout=../matrix/smoke: a layout is named by its file in conf/layout/, "
            "not by a path out of that folder (which composes another group's config)", VALUE),
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
    command: str  # "plans", "report", "compare" or "matrix" (python -m matrix.<command> / python -m matrix)
    args: tuple[str, ...]  # {tmp} is the test's folder; files made by ``setup``
    doc: str  # the input, as the document states it
    expect: str  # the one stderr line
    setup: tuple[str, ...] = ()  # what tests/app/test_hardening.py:_file_setup makes under {tmp}
    # "ro_mount": a read-only tmpfs (skipped where none can be mounted), "full_mount": a full one;
    # "proc_sys": /proc/sys not writable
    needs: str = ""


PLANS = ("--batches", "20", "--cp", "8", "--no-plot")
FIFO_SAYS = "is a FIFO, not a regular file"
FILES: tuple[FileCase, ...] = (
    FileCase("plans", ("--workload", "{tmp}/w.yaml", *PLANS), "a trace that is a FIFO",
             f"error: workload.path=*/fifo: {FIFO_SAYS}", ("fifo", "w.yaml:fifo")),
    FileCase("matrix", ("--dry-run", "workload={tmp}/w.yaml"), "a trace that is a FIFO",
             f"error: workload.path=*/fifo: {FIFO_SAYS}", ("fifo", "w.yaml:fifo")),
    FileCase("plans", ("--workload", "{tmp}/w.yaml", *PLANS), "a workload of 1 kB whose YAML aliases expand to "
             "10**9 values", "error: workload=*/w.yaml: a YAML alias (*a0, line *): an input file of this project takes "
             "plain values (aliases can expand without bound)", ("w.yaml:aliases",)),
    FileCase("matrix", ("--dry-run", "workload={tmp}/w.yaml"), "a workload of 1 kB whose YAML aliases expand to "
             "10**9 values", "error: workload=*/w.yaml: a YAML alias (*a0, line *): an input file of this project "
             "takes plain values (aliases can expand without bound)", ("w.yaml:aliases",)),
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
    FileCase("matrix", ("--dry-run", "results_dir={tmp}/full/res"), "`results_dir` on a full filesystem",
             "error: results_dir=*/full/res: */full's filesystem has 0 bytes free, under the 1 MiB this command "
             "needs to write into it", needs="full_mount"),
)


def file_doc(case: FileCase) -> str:
    shown = " ".join(a for a in case.args if a not in PLANS).replace("{tmp}/", "")
    return f"python -m {'matrix.' + case.command if case.command != 'matrix' else 'matrix'} {shown}"


# --- a failing rank in a point: the faults test_hardening injects ---------------------------

# The failing ranks are implementations of the catalogue of broken ones.
BROKEN = "tests.broken_impls"
# A failure must be noticed, not waited out: the faults that are not hangs get a
# timeout far beyond the bound the tests allow (a minute, on a loaded machine).
# Reasons number ranks as the CP group does: in reverse world order, so the
# failing last world rank is the group's rank 0 (an error's own text is quoted).
_CP = " (ranks numbered as in the CP group)"
# where the implementation's own code raised, and in which of its steps (nsa_cp_comm.harness.sites)
_RAISED = " (raised at tests/broken_impls.py:* in _raise, in the implementation's gather)"
POOL_FAULTS = {  # tests.broken_impls attribute -> (timeout_s, status, reason; * matches anything)
    "raise_rank": (600.0, "error", f"in {BROKEN}:raise_rank's checks: rank 0 error: RuntimeError: injected fault on "
                                   f"rank 1{_RAISED}{_CP}"),
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
                   f"in {BROKEN}:raise_rank's checks: rank 0 error: RuntimeError: injected fault on rank 1{_RAISED}{_CP}"),
    # torchrun stops every rank once one exits; rank 1 may go before it posted its outcome
    "crash_rank": (600.0, "error", f"rank 0* crashed: no report: torchrun stopped the point after a rank exited{_CP}"),
    "hang_rank": (3.0, "timeout", f"in {BROKEN}:hang_rank's checks: rank 0,1 timeout: no answer within 3s{_CP}"),
}


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


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(header: str, rows) -> str:
    cols = header.count("|") - 1
    return "\n".join([header, "|" + " --- |" * cols, *rows])


def point_faults() -> str:
    """The faults test_injected_fault_costs_one_row and test_torchrun_fault_costs_one_row inject, as rows."""
    rows = []
    for faults, where, after, test in (
        (POOL_FAULTS, "a point on RankPool ranks (`python -m matrix`)",
         "all of the point's processes gone; the next point runs normally", "test_injected_fault_costs_one_row"),
        (TORCHRUN_FAULTS, "a point on torchrun ranks (`matrix.app.torchrun_point`)", "torchrun exits 1",
         "test_torchrun_fault_costs_one_row"),
    ):
        for f, (t, s, r) in faults.items():
            what = f"impl={BROKEN}:{f}" + (f" timeout_s={t:g}" if s == "timeout" else "")
            rows.append(f"| {what} | {where} | status `{s}`, reason `{_cell(r)}`; {after} | "
                        f"`tests/app/test_hardening.py::{test}` |")
    return _table("| fault | where | what you get | test |", rows)


# RELIABILITY.md's blocks (``<!-- tables:NAME -->``), rendered by docs/doc_tables.py.
TABLES = {
    "reliability_library": lambda: _table("| call | ValueError message |",
                                          [f"| `{_cell(c.code)}` | {_cell(c.expect)} |" for c in LIBRARY + ROUNDTRIP]),
    "reliability_cli": lambda: _table("| ARGS | checked | stderr |",
                                      [f"| `{_cell(cli_doc(c))}` | {c.stage} | `{_cell(c.expect)}` |" for c in CLI]),
    "reliability_files": lambda: _table("| command | input | stderr |", [
        f"| `{_cell(file_doc(c))}` | {_cell(c.doc)} | `{_cell(c.expect)}` |" for c in FILES]),
    "reliability_point_faults": point_faults,
    "reliability_bounds": lambda: _table("| ARGS | refused with |", [
        f"| `{_cell(' '.join(b.args))}` | {f'`{_cell(b.expect)}`' if b.expect else 'accepted'} |" for b in BOUNDS]),
}
