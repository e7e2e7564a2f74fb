"""Test-only fault for benchmarks/compare_power.py: the padded path made slower.

Loaded by Python at start-up (``site`` imports ``sitecustomize`` from the path)
in every process of a sweep whose PYTHONPATH starts with this folder, rank
processes included. When ``NSA_SLOW_PADDED`` holds a fraction ``f`` (``0.3``),
the padded implementation's production form on rank 0, at the end of every
round trip, busy-waits ``f`` times what its local, gather and scatter phases
took on that rank in that round trip. Each phase ends for the job when its
slowest rank is done, so each point's round trip takes up to ``1 + f`` times
its own time whatever the machine's load (less where the slowest rank's
phases run above rank 0's own), as slower code would; the checks still pass,
and nothing else changes. One rank spins, not every one: with
more ranks than cores, every rank spinning took the cores the others needed
for their own phases, and the cp 4 points read 1.4x-1.5x in the paired
metric where the cp 2 points read 1.2x. Never on the product's path: only
this benchmark puts this folder on PYTHONPATH.
"""

import os
import time

_FRACTION = os.environ.get("NSA_SLOW_PADDED")
if _FRACTION:
    import dataclasses

    import torch.distributed as dist

    from nsa_cp_comm import impls as _impls

    _fraction = float(_FRACTION)
    _padded = _impls.REGISTRY["padded"]
    _prepare = _padded.prepare

    def _slow_prepare(*args, **kwargs):
        form = _prepare(*args, **kwargs)
        spent = [0.0]

        def timed(fn, first=False):
            def run(*a):
                t0 = time.perf_counter()
                out = fn(*a)
                spent[0] = (0.0 if first else spent[0]) + time.perf_counter() - t0
                return out
            return run

        gather = timed(form.gather, first=form.stage is None)

        def scatter():
            out = timed(form.scatter)()
            if dist.get_rank() != 0:
                return out
            # a busy wait, as slower code would: a sleep gives the core away,
            # and on a loaded machine the rank comes back late for the next
            # step (the control's), which then hides part of the slowdown
            end = time.perf_counter() + _fraction * spent[0]
            while time.perf_counter() < end:
                pass
            return out

        stage = timed(form.stage, first=True) if form.stage is not None else None
        return dataclasses.replace(form, gather=gather, scatter=scatter, stage=stage)

    _impls.REGISTRY["padded"] = dataclasses.replace(_padded, prepare=_slow_prepare)
