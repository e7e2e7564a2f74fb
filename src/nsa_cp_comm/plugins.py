"""Outside code made an implementation: a ``package.module:attribute``
reference imported, or an installed entry point's object, called first when
it is a factory, and given its origin (its module and distribution).

Anything that goes wrong is an :class:`ImplError`, one line naming the
reference or the entry point. The registry (:mod:`.impls`) registers what
comes back.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from .protocol import DispatchImpl, Impl, RoundTripImpl

# Implementations loaded by reference: "module:attribute" -> the name its object
# declares (it is registered, and found by the ranks, under the reference).
DECLARED: dict[str, str] = {}


class ImplError(ValueError):
    """A bad implementation reference: the message is one line naming it."""


@functools.lru_cache(maxsize=1)
def installed_packages() -> Mapping[str, list[str]]:
    """``importlib.metadata.packages_distributions()``, read once per process
    (the fork server reads it before it forks, so every rank has it): it
    reads every installed distribution's file list, torch's thousands of
    lines among them, and a rank loading a point's outside implementations
    spent most of its time reading it once per implementation."""
    try:
        return importlib.metadata.packages_distributions()
    except Exception:  # noqa: BLE001 - metadata is best effort
        return {}


def _origin(module_name: str) -> str:
    top = module_name.split(".")[0]
    try:
        dists = installed_packages().get(top, [])
        if dists:
            return f"{module_name} {importlib.metadata.version(dists[0])}"
    except Exception:  # noqa: BLE001 - metadata is best effort
        pass
    return f"{module_name} (no installed distribution)"


def _materialise(ref: str, obj: object, module_name: str) -> Impl:
    if not isinstance(obj, (RoundTripImpl, DispatchImpl)) and callable(obj):
        try:
            obj = obj()
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - the user's factory
            # sys.exit as a factory would otherwise end the sweep silently, with status 0
            raise ImplError(f"impl={ref}: calling the factory raised {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, (RoundTripImpl, DispatchImpl)):
        raise ImplError(
            f"impl={ref}: {type(obj).__name__} is not a RoundTripImpl or DispatchImpl (nsa_cp_comm.impls)"
        )
    return replace(obj, origin=obj.origin or _origin(module_name))


def _beside_hint(module_name: str, exc: BaseException) -> str:
    """Why a module in the working directory is not found: an installed console
    command's path starts at its own bin folder, not at the working directory
    (``python -m`` puts the working directory first)."""
    top = module_name.split(".")[0]
    cwd = Path.cwd()
    if not (isinstance(exc, ModuleNotFoundError) and exc.name == top
            and ((cwd / f"{top}.py").is_file() or (cwd / top / "__init__.py").is_file())):
        return ""
    return (f" ({top} is in the working directory, which this command does not import from: "
            f"set PYTHONPATH=$PWD, or run python -m nsa_cp_matrix)")


def load_reference(ref: str) -> Impl:
    """``package.module:attribute`` -> the implementation, named ``ref`` (so rows and
    ranks find it again by that name). Raises ImplError (one line)."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ImplError(f"impl={ref}: expected package.module:attribute")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - ImportError or the module's own
        raise ImplError(f"impl={ref}: cannot import {module_name}: {type(exc).__name__}: {exc}"
                        f"{_beside_hint(module_name, exc)}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImplError(f"impl={ref}: {module_name} has no attribute {attr}")
        obj = getattr(obj, part)
    impl = _materialise(ref, obj, module_name)
    DECLARED[ref] = impl.name
    return replace(impl, name=ref)
