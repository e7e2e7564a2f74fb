"""What torch itself does when the legacy buffer sizing meets an uneven plan.

The legacy round trip sizes its buffers as if every rank held ``T / cp`` rows:
the gather output is ``[T, H]`` on every rank, the scatter splits ``[T, H]``
into ``cp`` equal chunks. On an uneven plan rank ``r`` holds ``n_r != T / cp``
rows. This module hands exactly those tensors to torch's own collectives, with
no project code in between, so the tests can record what the backend does:
raise (which text, on which ranks), abort the process, hang, or return.

Two roles:

* **rank**: ``python torch_uneven_probe.py rank RANK TRIAL_JSON`` joins a
  process group through a ``FileStore`` and issues one collective. It reports
  events as JSON lines on stdout (``ready``, ``enter`` just before the
  collective, then ``raised`` or ``returned``), so a rank that is killed while
  blocked is recognisable: it entered and never left.
* **harness**: :func:`run_trial` starts one process per rank, waits with a hard
  deadline, kills what is left (by the pids it started) and returns what each
  rank did. An abort or hang costs one trial, never the test process.

``python torch_uneven_probe.py report`` runs the gloo trials and prints a
markdown table (the findings write-up is regenerated from it after a torch
upgrade).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_SRC = _HERE.parent / "src"

# Collective flavours a trial can issue.
#   gather:        all-gather into the legacy [T, H] output from an [n_r, H] input.
#   scatter_rows:  reduce-scatter of a [T, H] input into the [n_r, H] rows the rank needs.
#   scatter_chunk: reduce-scatter into legacy's own output, the rank's equal chunk
#                  ``full.tensor_split(cp)[rank]`` ([T/cp, H]).
OPS = ("gather", "scatter_rows", "scatter_chunk")
# "single": torch 2.13's names; "tensor": the older names (deprecated in 2.13).
APIS = ("single", "tensor")


@dataclass(frozen=True)
class Trial:
    """One run of one collective on ``cp`` fresh rank processes."""

    seq_lens: tuple[int, ...]
    cp: int
    policy: str
    op: str
    page_size: int = 1
    api: str = "single"
    backend: str = "gloo"
    hidden: int = 4
    # The process group's own timeout: how long gloo/NCCL waits in a blocked
    # collective before raising (torch's default for gloo is 30 minutes).
    pg_timeout_s: float = 600.0
    # After its collective a rank stays alive this long: a peer that raised
    # but keeps running (as a serving process that catches the error would)
    # leaves the others waiting; one that exits closes its connections.
    linger_s: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass
class RankOutcome:
    """What one rank process did.

    ``outcome``: ``raised``, ``returned``, ``hung`` (entered the collective and
    was still inside it when the harness killed it), ``signal:NAME`` (died
    from a signal, e.g. SIGABRT), ``exit:N`` (exited without reporting), or
    ``not_started`` (never reached the collective)."""

    rank: int
    outcome: str
    exc_type: str = ""
    text: str = ""
    ms_in_collective: float | None = None
    returned: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    returncode: int | None = None
    stderr_tail: str = ""


# -- rank role ------------------------------------------------------------------

def _emit(event: str, **data) -> None:
    print(json.dumps({"event": event, **data}), flush=True)


def _die_with_parent() -> None:
    """A rank may be left blocked, or lingering for minutes: it must not
    outlive the harness if that one is killed."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != int(os.environ.get("TORCH_UNEVEN_PARENT", os.getppid())):
        os._exit(1)  # the harness died before the signal was armed


def rank_main(rank: int, trial: Trial, store_path: str) -> None:
    _die_with_parent()
    import warnings
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from nsa_cp_comm.plan import plan_split

    plan = plan_split(list(trial.seq_lens), trial.cp, policy=trial.policy, page_size=trial.page_size)
    if trial.backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        extra = {"device_id": device}
    else:
        device = torch.device("cpu")
        extra = {}
    store = dist.FileStore(store_path, trial.cp)
    dist.init_process_group(trial.backend, store=store, rank=rank,
                            world_size=trial.cp, timeout=timedelta(seconds=trial.pg_timeout_s), **extra)
    # gloo connects its full mesh inside init: a rank that raised and exited
    # while a slower peer was still connecting made that peer fail in init
    # ("connectFullMesh failed"), which is start-up, not the collective under
    # test. Every rank waits here, on the store, until all are connected.
    store.add("connected", 1)
    while store.add("connected", 0) < trial.cp:
        time.sleep(0.01)
    T, H, n = plan.total_tokens, trial.hidden, plan.per_rank_tokens[rank]
    if trial.op == "gather":
        out = torch.zeros(T, H, device=device)
        inp = torch.full((n, H), float(rank + 1), device=device)
        fn = dist.all_gather_single if trial.api == "single" else dist.all_gather_into_tensor
    else:
        # Row i holds the value i on every rank, so after the sum a returned
        # row names its source row: value / cp.
        inp = torch.arange(T, dtype=torch.float32, device=device).repeat_interleave(H).reshape(T, H)
        out = torch.zeros(n, H, device=device) if trial.op == "scatter_rows" else inp.tensor_split(trial.cp)[rank]
        fn = dist.reduce_scatter_single if trial.api == "single" else dist.reduce_scatter_tensor
    _emit("ready", n=n, T=T, out_rows=out.shape[0], in_rows=inp.shape[0], fn=fn.__name__)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        _emit("enter")
        try:
            fn(out, inp)
            if device.type == "cuda":
                torch.cuda.synchronize()
        except BaseException as exc:  # noqa: BLE001 - recorded, this is the experiment
            ms = (time.perf_counter() - t0) * 1e3
            _emit("raised", type=type(exc).__name__, text=str(exc), ms=ms,
                  warnings=[str(w.message) for w in caught])
        else:
            ms = (time.perf_counter() - t0) * 1e3
            data: dict = {"out_rows": out.shape[0]}
            if trial.op == "gather":
                # Which rank's value landed in each row, as runs (value, count).
                data["runs"] = [[v, len(list(g))] for v, g in itertools.groupby(out[:, 0].cpu().tolist())]
            elif out.shape[0]:
                src = (out[:, 0].cpu() / trial.cp).tolist()
                data["source_rows"] = [int(src[0]), int(src[-1])]
                own = plan.rank_offset(rank)
                data["own_rows"] = [own, own + n - 1]
            _emit("returned", ms=ms, warnings=[str(w.message) for w in caught], **data)
    if trial.linger_s:
        time.sleep(trial.linger_s)
    # Leave without tearing the group down: a destroy would wait on peers
    # that may be blocked, which is not what is under test.
    os._exit(0)


# -- harness role ---------------------------------------------------------------

def _events(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():  # created before its rank started
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # torch may print to stdout too, or a line is half written
    return out


def _kill(proc: subprocess.Popen) -> None:
    """Kill a rank we started, and anything it started (its own session)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):  # a zombie we cannot reap
        proc.wait(timeout=10)


def run_trial(trial: Trial, *, hang_s: float | None = None, start_timeout_s: float = 180.0,
              workdir: str | os.PathLike[str] | None = None) -> list[RankOutcome]:
    """Run ``trial`` on ``trial.cp`` fresh rank processes.

    Start-up (importing torch, the rendezvous) may take long on a loaded
    machine and gets ``start_timeout_s``; once every rank has entered the
    collective, ranks still inside it after ``hang_s`` count as hung (by
    default 8 s, or the process group's timeout plus 8 s when that is short
    enough to wait for). Every process started here is killed before returning."""
    if hang_s is None:
        hang_s = trial.pg_timeout_s + 8.0 if trial.pg_timeout_s < 60 else 8.0
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmpdir = Path(tmp)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(_SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.setdefault("OMP_NUM_THREADS", "1")
        env["TORCH_UNEVEN_PARENT"] = str(os.getpid())
        store = tmpdir / "store"
        procs, outs, errs = [], [], []
        try:
            for r in range(trial.cp):
                outs.append(tmpdir / f"rank{r}.out")
                errs.append(tmpdir / f"rank{r}.err")
                with open(outs[r], "w") as o, open(errs[r], "w") as e:
                    procs.append(subprocess.Popen(
                        [sys.executable, str(Path(__file__).resolve()), "rank", str(r), trial.to_json(), str(store)],
                        stdout=o, stderr=e, stdin=subprocess.DEVNULL, env=env, start_new_session=True))
            start_deadline = time.monotonic() + start_timeout_s
            all_entered_at: float | None = None
            while True:
                now = time.monotonic()
                if all(p.poll() is not None for p in procs):
                    break
                evs = [_events(o) for o in outs]
                entered = [any(e["event"] == "enter" for e in ev) or p.poll() is not None for ev, p in zip(evs, procs)]
                if all_entered_at is None and all(entered):
                    all_entered_at = now
                if all_entered_at is not None:
                    done = [any(e["event"] in ("raised", "returned") for e in ev) or p.poll() is not None
                            for ev, p in zip(evs, procs)]
                    # Ranks that finished their collective and now linger do not count as hung.
                    if all(done) and trial.linger_s and now >= all_entered_at + 0.5:
                        break
                    if now >= all_entered_at + hang_s:
                        break
                elif now >= start_deadline:
                    break
                time.sleep(0.05)
            # Judge "still inside the collective" now, before any kill: a
            # rank killed first closes its sockets and would wake the others.
            at_deadline = [_events(o) for o in outs]
        finally:
            for p in procs:
                _kill(p)
        results = []
        for r, p in enumerate(procs):
            evs = at_deadline[r]
            kinds = [e["event"] for e in evs]
            rc = p.returncode
            res = RankOutcome(r, "", returncode=rc, stderr_tail=errs[r].read_text(errors="replace")[-2000:])
            last = next((e for e in evs if e["event"] in ("raised", "returned")), None)
            if last is not None:
                res.outcome = last["event"]
                res.ms_in_collective = last["ms"]
                res.warnings = last.get("warnings", [])
                if last["event"] == "raised":
                    res.exc_type, res.text = last["type"], last["text"]
                else:
                    res.returned = {k: v for k, v in last.items() if k not in ("event", "ms", "warnings")}
            elif "enter" in kinds and rc == -signal.SIGKILL:
                # Inside the collective when the harness gave up on it.
                res.outcome = "hung"
            elif rc is not None and rc < 0:
                res.outcome = f"signal:{signal.Signals(-rc).name}"
            elif "enter" in kinds or "ready" in kinds:
                res.outcome = f"exit:{rc}"
            else:
                res.outcome = "not_started"
            results.append(res)
        return results


# -- the recorded trials ----------------------------------------------------------

# Two ranks, both uneven: n = (488, 512), T = 1000 (T / cp = 500 rows on neither rank).
PAGE_1000 = dict(seq_lens=(1000,), cp=2, policy="zigzag_page", page_size=64)
# Two ranks, one of them empty: n = (10, 0), T = 10.
PAGE_10 = dict(seq_lens=(10,), cp=2, policy="zigzag_page", page_size=64)
# Four ranks, n = (2, 1, 1, 0), T = 4: ranks 1 and 2 hold exactly T / cp rows,
# so their local shape check passes while ranks 0 and 3 fail theirs.
MIXED_4 = dict(seq_lens=(1, 1), cp=4, policy="zigzag")

REPORT_TRIALS: list[tuple[str, Trial]] = [
    *[(f"{name}/{op}/{api}", Trial(**case, op=op, api=api))
      for name, case in (("page1000", PAGE_1000), ("page10", PAGE_10))
      for op in OPS for api in APIS],
    ("mixed4/gather/peers-exit", Trial(**MIXED_4, op="gather")),
    ("mixed4/gather/peers-stay", Trial(**MIXED_4, op="gather", linger_s=600)),
    ("mixed4/gather/peers-stay-pg5s", Trial(**MIXED_4, op="gather", linger_s=12, pg_timeout_s=5)),
    ("mixed4/scatter_rows/peers-stay", Trial(**MIXED_4, op="scatter_rows", linger_s=600)),
]


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def report() -> None:
    import torch

    print(f"torch {torch.__version__}, gloo, python {sys.version.split()[0]}\n")
    print("| trial | rank | n_r | outcome | ms | text / returned |")
    print("| --- | --- | --- | --- | --- | --- |")
    from nsa_cp_comm.plan import plan_split

    for name, trial in REPORT_TRIALS:
        plan = plan_split(list(trial.seq_lens), trial.cp, policy=trial.policy, page_size=trial.page_size)
        t0 = time.monotonic()
        res = run_trial(trial)
        wall = time.monotonic() - t0
        for r in res:
            detail = f"{r.exc_type}: {r.text}" if r.outcome == "raised" else json.dumps(r.returned)
            if r.warnings:
                detail += f" [warning: {r.warnings[0]}]"
            ms = "" if r.ms_in_collective is None else f"{r.ms_in_collective:.1f}"
            print(f"| {name} ({wall:.1f}s) | {r.rank} | {plan.per_rank_tokens[r.rank]} | {r.outcome} | {ms} | "
                  f"{_cell(detail if r.outcome in ('raised', 'returned') else r.stderr_tail[-200:])} |")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "rank":
        rank_main(int(sys.argv[2]), Trial(**{k: tuple(v) if k == "seq_lens" else v
                                            for k, v in json.loads(sys.argv[3]).items()}), sys.argv[4])
    elif sys.argv[1:] == ["report"]:
        sys.path.insert(0, str(_SRC))
        report()
    else:
        sys.exit(f"usage: {sys.argv[0]} rank RANK TRIAL_JSON STORE | report")
