"""Where the app's configs and sample data are: beside the package in a
checkout, inside it when installed.

The repository keeps them at its root (``conf/``, ``data/``) beside the app's
folder ``matrix/``; a wheel ships them inside the package (``nsa_cp_matrix/conf``,
``nsa_cp_matrix/data``, pyproject's package-dir), so a regular install runs
every command from any folder.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _shipped(name: str) -> Path:
    inside = _PACKAGE / name
    return inside if inside.is_dir() else _PACKAGE.parent / name


CONF_DIR = _shipped("conf")
DATA_DIR = _shipped("data")
# What a relative path in a shipped config (``data/traces/...``) is relative to.
ROOT = DATA_DIR.parent
