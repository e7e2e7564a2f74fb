"""The Hydra matrix application (`python -m matrix`) and its review commands.

The folder is `matrix/`; the install names it `nsa_cp_matrix`, so that no
top-level `matrix` is claimed in site-packages. From the repository root
`python -m matrix` runs it from the folder; elsewhere `python -m nsa_cp_matrix`
runs the installed one. The app's modules import each other relatively, so
both names run the same code.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _shipped(name: str) -> Path:
    inside = _PACKAGE / name
    return inside if inside.is_dir() else _PACKAGE.parent / name


# Where the app's configs and sample data are: the repository keeps them at its
# root (``conf/``, ``data/``) beside this folder; a wheel ships them inside the
# package (``nsa_cp_matrix/conf``, ``nsa_cp_matrix/data``, pyproject's
# package-dir), so a regular install runs every command from any folder.
CONF_DIR = _shipped("conf")
DATA_DIR = _shipped("data")
# What a relative path in a shipped config (``data/traces/...``) is relative to.
ROOT = DATA_DIR.parent


def command(tool: str = "") -> list[str]:
    """``["python", "-m", NAME]``: the command that runs this app (``tool``:
    one of its modules, e.g. ``"report"``), NAME being the name this package
    was imported under (``matrix`` or ``nsa_cp_matrix``). Printed commands a
    user reruns (repro, resume, help) use it, so they work where the running
    one was started."""
    return ["python", "-m", f"{__name__}.{tool}" if tool else __name__]


# The console commands an install provides (pyproject's [project.scripts];
# tests/project/test_install.py holds them together): what help names first.
CONSOLE = "nsa-cp-matrix"


def console(tool: str = "") -> str:
    """The installed command of the app (``tool``: one of its review tools, e.g. ``"report"``)."""
    return f"{CONSOLE}-{tool}" if tool else CONSOLE


# Where the project lives: texts printed to users point into it, so that an
# install without the checkout can follow them (pyproject's [project.urls] name
# the same; tests/project/test_install.py holds them together).
REPO_URL = "https://github.com/nsa-cp-comm/nsa-cp-comm"


def doc_url(name: str) -> str:
    """The address of ``docs/NAME`` (``"plugins.md"``, ``"review.md#..."``) in the repository."""
    return f"{REPO_URL}/blob/main/docs/{name}"


def count(n: int, noun: str, plural: str = "") -> str:
    """``n`` and the noun in the number it takes (``plural``: when not noun + s): "1 point", "2 points"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
