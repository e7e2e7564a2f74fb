"""What a repro command carries besides the point's keys: the environment the
point ran in, where it changes what runs.

- Variables that steer torch, its collectives and its threads, by prefix
  (:data:`PREFIXES`) or name (:data:`NAMES`), and any the user names in
  :data:`USER_VAR` (comma-separated), as the run had them.
- ``PYTHONPATH``: the run's entries, absolute (a relative entry or an empty
  one meant the working directory the run had), and, first, the directory an
  outside implementation (``impl=package.module:attribute``, or an entry
  point's module) was imported from, unless that is a directory of the
  interpreter's own (its standard library or site-packages), where an
  installed distribution is found from any working directory.

:func:`env_prefix` is ``["env", "K=V", ...]`` (empty when nothing is carried);
:func:`split` takes a repro command apart again. Neither ``point_id`` nor
resume reads any of it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import site
import sys
import sysconfig
from collections.abc import Mapping

from nsa_cp_comm.origins import REFERENCE_SEP, is_reference

PREFIXES: tuple[str, ...] = ("NSA_", "TORCH_", "PYTORCH_", "NCCL_", "GLOO_", "OMP_", "MKL_")
NAMES: tuple[str, ...] = ("CUDA_VISIBLE_DEVICES", "CUBLAS_WORKSPACE_CONFIG", "PYTHONPATH")
USER_VAR = "NSA_REPRO_ENV"  # more variables a repro carries, e.g. NSA_REPRO_ENV=MY_ENGINE_FLAGS,HF_HOME


def _names(environ: Mapping[str, str]) -> list[str]:
    named = {n.strip() for n in environ.get(USER_VAR, "").split(",") if n.strip()}
    return sorted(k for k in environ if k.startswith(PREFIXES) or k in NAMES or k in named)


def _absolute(entry: str, cwd: str) -> str:
    return os.path.normpath(os.path.join(cwd, entry)) if entry else cwd


def _interpreter_dirs() -> set[str]:
    """Directories every interpreter of this installation has on its path."""
    dirs = {*site.getsitepackages(), site.getusersitepackages()}
    dirs |= {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return {os.path.normpath(d) for d in dirs if d}


def import_root(module_name: str) -> str | None:
    """The directory on the path that ``module_name``'s top-level package
    (or module) was imported from; None for a built-in or unknown module."""
    top = module_name.split(".")[0]
    module = sys.modules.get(top)
    if module is not None:
        locations: list[str] = list(getattr(module, "__path__", []) or [])
        if not locations and getattr(module, "__file__", None):
            return os.path.normpath(os.path.dirname(os.path.abspath(module.__file__)))
    else:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        locations = list(spec.submodule_search_locations or [])
        if not locations and spec.origin and os.path.isabs(spec.origin):
            return os.path.normpath(os.path.dirname(spec.origin))
    return os.path.normpath(os.path.dirname(os.path.abspath(locations[0]))) if locations else None


def plugin_module(impl: str) -> str | None:
    """The module an outside implementation comes from: ``package.module`` of
    a ``package.module:attribute`` reference, or an entry point's module;
    None for the project's own implementations and keywords."""
    if is_reference(impl):
        return impl.partition(REFERENCE_SEP)[0]
    from nsa_cp_comm import impls

    value = impls.ENTRY_POINT_OF.get(impl)
    return value.partition(":")[0] if value else None


def pythonpath(impl: str, environ: Mapping[str, str], cwd: str) -> str:
    """The ``PYTHONPATH`` a repro of a point of ``impl`` needs ("" for none)."""
    entries = [_absolute(e, cwd) for e in environ.get("PYTHONPATH", "").split(os.pathsep)] \
        if environ.get("PYTHONPATH") else []
    module = plugin_module(impl)
    root = import_root(module) if module else None
    if root and root not in entries and root not in _interpreter_dirs():
        entries.insert(0, root)
    return os.pathsep.join(dict.fromkeys(entries))


def env_prefix(impl: str, environ: Mapping[str, str] | None = None, cwd: str | None = None) -> list[str]:
    """``["env", "K=V", ...]`` for a repro of a point of ``impl`` run with
    ``environ`` (default: this process's) in ``cwd``; ``[]`` when nothing is carried."""
    environ = os.environ if environ is None else environ
    cwd = os.getcwd() if cwd is None else cwd
    carried = {k: environ[k] for k in _names(environ) if k != "PYTHONPATH"}
    path = pythonpath(impl, environ, cwd)
    if path:
        carried["PYTHONPATH"] = path
    return ["env", *(f"{k}={carried[k]}" for k in sorted(carried))] if carried else []


_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "'": "\\'"}
_ANSI_C = re.compile(r"\$'((?:[^'\\]|\\.)*)'")
_UNESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|.)", re.S)


def _raw_byte(c: str) -> int | None:
    """The byte a character stands for that was not UTF-8 where Python read it
    (an environment variable's, decoded with surrogateescape), or None."""
    return ord(c) - 0xDC00 if 0xDC80 <= ord(c) <= 0xDCFF else None


def _escaped(c: str) -> bool:
    return ord(c) < 32 or ord(c) == 127 or _raw_byte(c) is not None


def quote(arg: str) -> str:
    """``arg`` quoted for a POSIX shell, on one line: ``shlex.quote``, or
    where it holds a control character (a newline in a variable) or a byte
    that is not UTF-8 bash's ``$'...'`` form, which keeps every character and
    byte (a row's text is one line of UTF-8: a newline in plain quotes would
    be folded to a space there, and the byte could not be written at all)."""
    if not any(_escaped(c) for c in arg):
        return shlex.quote(arg)
    body = "".join(_ESCAPES.get(c) or (f"\\x{_raw_byte(c) if _raw_byte(c) is not None else ord(c):02x}"
                                       if _escaped(c) else c) for c in arg)
    return f"$'{body}'"


def join(parts: list[str]) -> str:
    return " ".join(quote(p) for p in parts)


def _byte_char(byte: int) -> str:
    # a byte past ASCII alone is not UTF-8: Python reads it from the environment as a lone surrogate
    return chr(byte) if byte < 0x80 else chr(0xDC00 + byte)


def _ansi_c_to_plain(repro: str) -> str:
    """Each ``$'...'`` word of ``repro`` as ``shlex`` reads quoted words."""
    def decode(m: re.Match[str]) -> str:
        text = _UNESCAPE.sub(lambda e: _byte_char(int(e[1][1:], 16)) if e[1][0] == "x" and len(e[1]) == 3 else
                             {"n": "\n", "t": "\t", "r": "\r"}.get(e[1], e[1]), m[1])
        return shlex.quote(text)

    return _ANSI_C.sub(decode, repro)


def split(repro: str) -> tuple[dict[str, str], list[str]]:
    """A repro command taken apart: the variables it sets, and the command
    (``["python", "-m", "matrix", "key=value", ...]``); ``$'...'`` words
    (:func:`quote`) read as bash reads them."""
    argv = shlex.split(_ansi_c_to_plain(repro))
    env: dict[str, str] = {}
    if argv[:1] == ["env"]:
        argv = argv[1:]
        while argv and "=" in argv[0] and argv[0].split("=", 1)[0].isidentifier():
            key, _, value = argv.pop(0).partition("=")
            env[key] = value
    return env, argv
