"""Hydra's override parser reads a list in time linear in its length.

Its visitor fetches list element ``i`` with ``ctx.element(i)``, which walks
the list's children from the start each time: a ``seq_lens`` of 16,000
entries took over a minute, and it is parsed several times per sweep (the
checks, every composition, Hydra's own launch). :func:`install` replaces that
one method with one that takes every element in a single walk; the values it
returns are the same.
"""

from __future__ import annotations

from typing import Any


def _visit_list_container(self: Any, ctx: Any) -> list[Any]:
    return [self.visitElement(element) for element in ctx.element()]


def install() -> None:
    from hydra.core.override_parser.overrides_visitor import HydraOverrideVisitor

    HydraOverrideVisitor.visitListContainer = _visit_list_container
