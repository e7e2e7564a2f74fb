"""Test-only fault for benchmarks/compare_power.py: the padded path made slower.

Loaded by Python at start-up (``site`` imports ``sitecustomize`` from the path)
in every process of a sweep whose PYTHONPATH starts with this folder, rank
processes included. When ``NSA_SLOW_PADDED`` names a JSON file of
``{"cp:total_tokens:max_rank_len:hidden": delay_us}``, the padded path's local
stage sleeps that long at each call: the padded round trip grows by about the
delay, the checks still pass, and nothing else changes. Never on the product's
path: only this benchmark puts this folder on PYTHONPATH.
"""

import json
import os
import time

_MAP = os.environ.get("NSA_SLOW_PADDED")
if _MAP:
    with open(_MAP) as _f:
        _DELAYS = json.load(_f)

    import nsa_cp_comm.roundtrip as _rt

    _original = _rt.padded_stage

    def _slow_padded_stage(full, local, plan, rank, *args, **kwargs):
        out = _original(full, local, plan, rank, *args, **kwargs)
        key = f"{plan.cp_size}:{plan.total_tokens}:{plan.max_rank_len}:{full.shape[1]}"
        delay = _DELAYS.get(key, 0.0) * 1e-6
        end = time.perf_counter() + delay
        while time.perf_counter() < end:  # a busy wait: as a slower kernel would
            pass
        return out

    _rt.padded_stage = _slow_padded_stage
    import sys

    for _name, _mod in list(sys.modules.items()):  # modules that bound the original already
        if _name.startswith("nsa_cp_comm") and getattr(_mod, "padded_stage", None) is _original:
            _mod.padded_stage = _slow_padded_stage
