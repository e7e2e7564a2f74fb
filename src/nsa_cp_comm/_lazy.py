"""Names a package exports but loads on first use (so importing it, or printing
the app's help, does not import torch)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def names(package: str, where: dict[str, str], namespace: dict[str, Any]) -> tuple[Callable[[str], object],
                                                                                  Callable[[], list[str]]]:
    """A package's module ``__getattr__`` and ``__dir__``: ``where`` maps each
    exported name to the submodule holding it; a name is imported on first
    access and kept in ``namespace`` (the package's globals) from then on."""
    def __getattr__(name: str) -> object:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
