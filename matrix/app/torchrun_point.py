"""One matrix point on ranks started by ``torchrun``: for multi-node allocations.

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m matrix.torchrun_point cp_size=16 +layout=zigzag seq_lens=[8192] results_dir=results/cp16

Run the same command on every node of the allocation. Not a Hydra app (torchrun
starts one process per rank; a Hydra app would sweep in each of them): it takes
``python -m matrix``'s ``key=value`` overrides for ONE point, composes and
checks them the same way (matrix.app.config, matrix.app.preflight), and runs
:func:`nsa_cp_comm.harness.measure.point_on_rank` on every rank (``cp_size`` must be
torchrun's world size). Rank 0 appends the rows with matrix.app.point's code.

torchrun owns the processes, so failures are handled here, never by hanging:
every rank runs the point in a thread and waits at most ``timeout_s``; each
posts its outcome (its reports, or its error) to torchrun's rendezvous store,
and a rank whose peer failed stops waiting after a short grace. Rank 0 folds
the outcomes into rows (``ok``, ``error`` naming the rank, ``timeout``) and
every rank exits without tearing down a group that may be stuck. A rank that
dies makes torchrun stop the others (SIGTERM): rank 0 then writes an ``error``
row naming the ranks that never reported. Exit status: 0 ok or skipped, 1 a
failed point, 2 a bad configuration (one line on stderr, from rank 0).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Any, NoReturn

from nsa_cp_comm.harness.rank_body import implementation_site, one_line_error
from nsa_cp_comm.harness.ranks import FAILURE_GRACE_S

from .config import ConfigError, validate_overrides
from ..store.results import SchemaError

REPORT_MARGIN_S = 5.0  # rank 0 waits this long past the deadline for late reports
_POLL_S = 0.05
_STOP: dict[str, int] = {}


def _env(name: str) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        raise ConfigError(f"{name} is not set: start this module with torchrun (see its docstring)") from None


def config_of(argv: list[str]) -> dict[str, Any]:
    """The point's config, composed and checked as ``python -m matrix ARGV``
    would; raises ConfigError / SchemaError (one line)."""
    from .config import validate
    from .preflight import points

    if any(a.startswith("-") for a in argv):
        raise ConfigError(f"{next(a for a in argv if a.startswith('-'))}: takes key=value overrides only (one point)")
    validate_overrides([a for a in argv if "=" in a])
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for ov in OverridesParser.create().parse_overrides(argv):
        if ov.is_sweep_override():
            raise ConfigError(f"{ov.input_line}: one point per torchrun run, no sweeps")
    (cfg, _), = points(argv)
    validate(cfg)
    return cfg


class _Outcomes:
    """Each rank's outcome of the point, through the rendezvous store (no
    collective: a peer may be dead or stuck inside one)."""

    def __init__(self, world: int) -> None:
        import torch.distributed as dist

        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        run = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        # A client of the store torchrun's env:// rendezvous already serves.
        store = dist.TCPStore(addr, port, world, is_master=False, timeout=timedelta(seconds=60), wait_for_workers=False)
        self.store = dist.PrefixStore(f"nsa_cp_comm/torchrun_point/{run}/", store)
        self.world = world

    def post(self, rank: int, outcome: tuple[str, Any, str, str]) -> None:
        with contextlib.suppress(Exception):  # rank 0 reports a silent rank as crashed
            self.store.set(f"outcome/{rank}", pickle.dumps(outcome))
            if outcome[0] != "ok":
                self.store.add("failed", 1)

    def peer_failed(self) -> bool:
        try:
            return self.store.add("failed", 0) > 0
        except Exception:  # noqa: BLE001
            return True

    def done(self) -> None:
        with contextlib.suppress(Exception):
            self.store.set("done", b"1")

    def wait_done(self, timeout_s: float) -> None:
        """Stay up (and connected) until rank 0 has every outcome: a failed rank
        that left at once would make its peers' collectives fail too, and
        rank 0 would name the wrong rank."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.store.check(["done"]):
                    return
            except Exception:  # noqa: BLE001 - rank 0 is gone
                return
            time.sleep(_POLL_S)

    def collect(self, deadline: float) -> dict[int, tuple[str, Any, str, str]]:
        got: dict[int, tuple[str, Any, str, str]] = {}
        while len(got) < self.world and time.monotonic() < deadline and "signal" not in _STOP:
            for r in range(self.world):
                if r not in got and self.store.check([f"outcome/{r}"]):
                    got[r] = pickle.loads(self.store.get(f"outcome/{r}"))
            time.sleep(_POLL_S)
        return got


def _run_rank(spec: Any, backend: str, device: Any, timeout_s: float,
              outcomes: _Outcomes) -> tuple[str, Any, str, str]:
    """This rank's ``(status, reports, error, doing)``; returns by
    ``timeout_s`` (or a grace after a peer failed) even if the point is stuck
    in a collective. ``doing``: on a failure, the place the rank last
    announced (its point's place marker), so the failure is blamed on the
    implementation whose turn it was, as in a rank pool."""
    from nsa_cp_comm.harness.rank_body import last_announced

    outcome = _point_outcome(spec, backend, device, timeout_s, outcomes)
    return (*outcome, "" if outcome[0] == "ok" else last_announced())


def _point_outcome(spec: Any, backend: str, device: Any, timeout_s: float,
                   outcomes: _Outcomes) -> tuple[str, Any, str]:
    from nsa_cp_comm.harness.measure import point_on_rank

    box: dict[str, tuple[str, Any, str]] = {}

    def body() -> None:
        try:
            if device.type == "cuda":
                # CUDA's current device is per host thread: set it in the thread
                # that runs the point, so nothing defaults to GPU 0.
                import torch

                torch.cuda.set_device(device)
            box["out"] = ("ok", point_on_rank(spec, backend), "")
        except BaseException as exc:  # noqa: BLE001 - reported to rank 0
            box["out"] = ("error", None, one_line_error(exc) + implementation_site(exc.__traceback__))

    thread = threading.Thread(target=body, name="matrix-point", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    failed_at = None
    while True:
        thread.join(_POLL_S)
        if "out" in box:
            return box["out"]
        now = time.monotonic()
        if now >= deadline:
            return ("timeout", None, f"no answer within {timeout_s:g}s")
        if "signal" in _STOP:
            return ("aborted", None, "stopped by torchrun")
        if failed_at is None and outcomes.peer_failed():
            failed_at = now
        if failed_at is not None and now >= failed_at + FAILURE_GRACE_S:
            return ("aborted", None, "stopped after another rank failed")


def _rank_results(got: dict[int, tuple[str, Any, str, str]], world: int) -> list[Any]:
    from nsa_cp_comm.harness.ranks import RankResult

    stopped = "signal" in _STOP
    out = []
    for r in range(world):
        if r in got:
            status, value, error, doing = got[r]
            out.append(RankResult(r, status, value=value, error=error, doing=doing))
        else:
            why = "torchrun stopped the point after a rank exited" if stopped else "the process died"
            out.append(RankResult(r, "crashed", error=f"no report: {why}"))
    return out


def _exit(code: int) -> NoReturn:
    # No interpreter teardown: a thread may still sit inside a collective.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rank = int(os.environ.get("RANK", "0"))
    try:
        world = _env("WORLD_SIZE")
        rank = _env("RANK")
        local_world = _env("LOCAL_WORLD_SIZE")
        cfg = config_of(argv)
        if cfg["cp_size"] != world:
            raise ConfigError(f"cp_size={cfg['cp_size']}: torchrun started {world} ranks (nnodes x nproc-per-node); "
                              "they must be equal")
        import torch

        from .resolve import resolve

        local_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        res = resolve(cfg, gpus=world if local_gpus >= local_world else local_gpus)
    except (ConfigError, SchemaError) as exc:
        if rank == 0:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    return _run(cfg, res, rank, world, " ".join(argv))


def _run(cfg: dict[str, Any], res: Any, rank: int, world: int, overrides: str) -> int:
    import torch
    import torch.distributed as dist

    from nsa_cp_comm.harness.fold import fold_reports
    from nsa_cp_comm.harness.blame import failed_run
    from nsa_cp_comm.harness.rank_body import set_rank_device

    from .point import build_rows, point_id, skipped_results, write_point
    from ..store.folder import Folder
    from ..store.results import BAD_STATUSES
    from .summary import live_line

    if res.device == "cuda":
        # An explicit device everywhere: the point runs in another thread.
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    set_rank_device(device)
    if rank == 0:
        signal.signal(signal.SIGTERM, lambda signum, frame: _STOP.setdefault("signal", signum))
    kwargs: dict[str, Any] = {"device_id": device} if res.backend == "nccl" else {}
    timeout = timedelta(seconds=max(60.0, cfg["timeout_s"] + 30.0))
    dist.init_process_group(res.backend, init_method="env://", rank=rank, world_size=world, timeout=timeout, **kwargs)
    outcomes = _Outcomes(world)
    spec = res.spec

    # Rank 0 owns the results file: it decides, everyone follows.
    decision: list[str] = ["run"]
    skipped = None
    if rank == 0:
        try:
            folder = Folder.of(cfg["results_dir"])
            folder.check()
            if cfg["resume"] and folder.done(point_id(cfg)):
                decision = ["resumed"]
            elif (skipped := skipped_results(cfg, res)) is not None:
                decision = ["skip"]
        except SchemaError as exc:
            decision = [f"error: {exc}"]
    dist.broadcast_object_list(decision, src=0)
    if decision[0] != "run":
        if rank == 0:
            if decision[0].startswith("error: "):
                print(decision[0], file=sys.stderr, flush=True)
            elif decision[0] == "resumed":
                print(live_line(cfg, None), flush=True)
            else:
                rows = build_rows(cfg, res, skipped or [], overrides, 0.0)
                write_point(cfg["results_dir"], rows, skipped or [])
                print(live_line(cfg, rows), flush=True)
        dist.destroy_process_group()
        return 2 if decision[0].startswith("error: ") else 0

    t0 = time.perf_counter()
    mine = _run_rank(spec, res.backend, device, cfg["timeout_s"], outcomes)
    outcomes.post(rank, mine)
    if rank != 0:
        if mine[0] == "ok":
            dist.destroy_process_group()
            return 0
        outcomes.wait_done(FAILURE_GRACE_S + REPORT_MARGIN_S + 1.0)
        _exit(0)  # rank 0 reports it

    got = outcomes.collect(time.monotonic() + FAILURE_GRACE_S + REPORT_MARGIN_S)
    outcomes.done()
    ranks = _rank_results(got, world)
    if all(r.ok for r in ranks):
        results = fold_reports(spec, spec.plan(), [r.value for r in ranks])
    else:  # the rank pool's failure policy: the first rank that failed by itself names it
        results = failed_run(spec, ranks)
    rows = build_rows(cfg, res, results, overrides, time.perf_counter() - t0)
    write_point(cfg["results_dir"], rows, results)
    print(live_line(cfg, rows), flush=True)
    if any(r["status"] in BAD_STATUSES for r in rows):
        _exit(1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
