"""Error texts the library raises and the harness's diagnosis quotes, here
without torch: the diagnosis runs in a sweep's own process, which never
imports it."""

from __future__ import annotations

# What torch's NCCL backend raises when all-gather sizes disagree; the legacy
# path raises it (with the plan's sizes appended) on every rank of an uneven plan.
LEGACY_UNEVEN_ERROR = "output tensor size must be equal to world_size times input tensor size"
