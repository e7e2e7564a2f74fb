"""Test-only fault for benchmarks/compare_power.py: the padded path made slower.

Loaded by Python at start-up (``site`` imports ``sitecustomize`` from the path)
in every process of a sweep whose PYTHONPATH starts with this folder, rank
processes included. When ``NSA_SLOW_PADDED`` holds a fraction ``f`` (``0.3``),
every rank of the padded implementation's production form sleeps, before
each round trip's reduce-scatter, ``f`` times what its local and gather
phases took on that rank in that round trip and its scatter in the one
before. The reduce-scatter starts when the last rank is back, so the round
trip (its slowest rank's time) grows by about ``f`` times its own at every
cp and load, as slower code would; the checks still pass, and nothing else
changes. Two faults before it were uneven across cp: rank 0 alone busy-
waiting after the scatter was hidden in part where another rank's phases ran
above its own (cp 4 read 1.12x-1.35x for f = 0.4, cp 2 1.17x-1.67x), and
every rank busy-waiting took the cores the others needed for their own
phases (cp 4 read 1.4x-1.5x where cp 2 read 1.2x). Never on the product's
path: only this benchmark puts this folder on PYTHONPATH.
"""

import os
import time

_FRACTION = os.environ.get("NSA_SLOW_PADDED")
if _FRACTION:
    import dataclasses

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
        last_scatter = [0.0]

        def scatter():
            # every rank sleeps before the reduce-scatter, which then starts
            # when the last one is back: the round trip (its slowest rank's
            # time) grows by the longest sleep, about f times its own time
            time.sleep(_fraction * (spent[0] + last_scatter[0]))
            t0 = time.perf_counter()
            out = form.scatter()
            last_scatter[0] = time.perf_counter() - t0
            return out

        stage = timed(form.stage, first=True) if form.stage is not None else None
        return dataclasses.replace(form, gather=gather, scatter=scatter, stage=stage)

    _impls.REGISTRY["padded"] = dataclasses.replace(_padded, prepare=_slow_prepare)
