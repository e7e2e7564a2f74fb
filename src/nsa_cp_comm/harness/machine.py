"""What a timing was measured on: CPU model, GPU name, NCCL version."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import torch


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def nccl_version() -> str:
    """``"2.21.5"``, or ``""`` where torch has no CUDA/NCCL."""
    if not torch.cuda.is_available():
        return ""
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - a build without NCCL
        return ""


def device_name(device: str) -> str:
    """The GPU's name for ``cuda``, the CPU model otherwise."""
    return torch.cuda.get_device_name(0) if device == "cuda" else cpu_model()
