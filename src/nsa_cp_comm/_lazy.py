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


class Deferred:
    """A function named ``module:function``, imported at its first call.

    The built-in implementations' registry is read by processes that never
    run a collective (a sweep's own process: names, modes, strides, plan
    columns); their gathers and scatters are torch code, imported only where
    one is called (the ranks). Pickles as its name."""

    __slots__ = ("target", "_fn")

    def __init__(self, target: str) -> None:
        module, sep, attr = target.partition(":")
        if not (module and sep and attr):
            raise ValueError(f"Deferred({target!r}): expected module:function")
        self.target = target
        self._fn: Callable[..., Any] | None = None

    def resolve(self) -> Callable[..., Any]:
        """The function itself (imported now if it was not yet)."""
        if self._fn is None:
            module, _, attr = self.target.partition(":")
            self._fn = getattr(importlib.import_module(module), attr)
        return self._fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return (self._fn or self.resolve())(*args, **kwargs)

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return Deferred, (self.target,)

    def __repr__(self) -> str:
        return f"<deferred {self.target}>"
