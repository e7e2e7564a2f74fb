"""Where an implementation comes from, one rule for every reader.

A name with a ``:`` is a ``module:attribute`` reference to outside code
(:func:`is_reference`); every other name is the project's own or an
installed plug-in's entry point. An implementation's origin (a row's
``impl_origin``) is ``"nsa_cp_comm VERSION"`` for the project's own
(:func:`own`) and its module and distribution for outside code, so a row is
from outside the project (:func:`is_outside`) when its origin is another's,
or, in rows written before origins were recorded, when its name is a
reference. Pure Python: the report reads rows without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .protocol import Impl

REFERENCE_SEP = ":"
OWN_DIST = "nsa_cp_comm"


def is_reference(name: object) -> bool:
    """Whether ``name`` is a ``module:attribute`` reference (not a registered name)."""
    return REFERENCE_SEP in str(name)


def own() -> str:
    """The origin of the project's own implementations."""
    from . import __version__

    return f"{OWN_DIST} {__version__}"


def origin(impl: Impl) -> str:
    return impl.origin or own()


def clean(origin: object) -> str:
    """A row's origin cell as text: '' for none (None, NaN, blank)."""
    text = "" if origin is None else str(origin).strip()
    return "" if text.lower() == "nan" else text


def is_own(origin: object) -> bool:
    """Whether a recorded origin is the project's own."""
    return clean(origin).startswith(OWN_DIST + " ")


def is_outside(impl: object, origin: object) -> bool:
    """Whether a row's implementation is from outside the project (a plug-in,
    by reference or entry point): its origin is not the project's own, and is
    recorded, or (an older row) its name is a reference."""
    text = clean(origin)
    return not is_own(text) and (text != "" or is_reference(impl))
