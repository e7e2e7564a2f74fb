"""A row's repro command carries what the point needed besides its keys
(matrix/app/repro_env.py): the directory an outside implementation was imported
from, the run's PYTHONPATH, and the variables that steer torch, its
collectives and threads (or that the user names), shell-quoted; the point's
identity (``point_id``) ignores all of it.

In-process, the prefix for each kind of origin; through a fresh shell (slow
set), a plug-in's repro from another directory with a clean environment."""

from __future__ import annotations

import importlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

from matrix.app import repro_env
from matrix.app.config import MatrixConfig, override_value
from matrix.app.point import repro_command
from matrix.app.repro_env import env_prefix, join, split
from nsa_cp_comm import impls

from matrix_cli import REPO, run_matrix

PLUGIN = '''\
import dataclasses

from nsa_cp_comm import impls

# the project's padded round trip under another name: a plug-in that passes
impl = dataclasses.replace(impls.get("padded"), name="{name}", origin="")
'''


def _plugin(where: Path, name: str) -> str:
    """A plug-in module ``name`` in ``where``; returns its ``impl=`` reference."""
    where.mkdir(parents=True, exist_ok=True)
    (where / f"{name}.py").write_text(PLUGIN.format(name=name))
    return f"{name}:impl"


def test_a_plugin_imported_from_off_the_path_leads_the_pythonpath(tmp_path, monkeypatch):
    # Imported from a directory no fresh interpreter has (as `python -m matrix`
    # imports from its working directory): the repro must name it.
    ref = _plugin(tmp_path / "plug", "repro_env_plugin_a")
    monkeypatch.syspath_prepend(str(tmp_path / "plug"))
    importlib.import_module("repro_env_plugin_a")
    environ = {
        "PYTHONPATH": os.pathsep.join(["src", "", "/abs/lib"]), "OMP_NUM_THREADS": "1", "NCCL_ALGO": "Ring",
        "HOME": "/root", "SECRET_TOKEN": "x", "MY_FLAG": "a b'c", "NSA_REPRO_ENV": "MY_FLAG",
    }
    prefix = env_prefix(ref, environ, cwd="/run/dir")
    assert prefix[0] == "env"
    carried = dict(kv.split("=", 1) for kv in prefix[1:])
    assert carried == {
        # the plug-in's directory first, then the run's entries made absolute (empty: the working directory)
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "plug"), "/run/dir/src", "/run/dir", "/abs/lib"]),
        "OMP_NUM_THREADS": "1", "NCCL_ALGO": "Ring", "MY_FLAG": "a b'c", "NSA_REPRO_ENV": "MY_FLAG",
    }
    # In a row: shell-quoted before the command, and taken apart again.
    monkeypatch.setattr(os, "environ", environ)
    monkeypatch.chdir(tmp_path)
    cfg = {**vars(MatrixConfig()), "impl": ref}
    repro = repro_command(cfg)
    env, argv = split(repro)
    assert env["MY_FLAG"] == "a b'c" and env["PYTHONPATH"].startswith(str(tmp_path / "plug") + os.pathsep)
    assert argv[:3] == ["python", "-m", "matrix"] and f"impl={override_value(ref)}" in argv
    assert shlex.split(repro)[0] == "env"
    # run with nothing in the environment: the plug-in's directory alone, before the same command
    monkeypatch.setattr(os, "environ", {})
    assert split(repro_command(cfg)) == ({"PYTHONPATH": str(tmp_path / "plug")}, argv)


def test_what_a_fresh_interpreter_finds_is_not_carried(monkeypatch):
    # The project's own implementations, and modules of the interpreter's own
    # directories (an installed distribution is found from anywhere).
    assert env_prefix("padded", {"HOME": "/x", "LANG": "C"}, cwd="/") == []
    assert env_prefix("json:dumps", {}, cwd="/") == []
    assert env_prefix("both", {"TORCH_SHOW_CPP_STACKTRACES": "1"}, cwd="/") == [
        "env", "TORCH_SHOW_CPP_STACKTRACES=1"]


def test_an_entry_points_module_is_found(monkeypatch, tmp_path):
    _plugin(tmp_path / "site", "repro_env_plugin_b")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(impls.ENTRY_POINT_OF, "engine_x", "repro_env_plugin_b:impl")
    assert repro_env.plugin_module("engine_x") == "repro_env_plugin_b"
    assert env_prefix("engine_x", {}, cwd="/") == ["env", f"PYTHONPATH={tmp_path / 'site'}"]


def test_a_plugins_repro_reruns_from_another_directory_in_a_clean_environment(tmp_path):
    """The plug-in is importable only through a directory on PYTHONPATH; its
    row's repro, run by a shell with nothing but PATH set, in another
    directory, finds the app and the plug-in (a dry run: the points it would
    run, resolved)."""
    ref = _plugin(tmp_path / "plug", "repro_env_plugin_c")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO), str(tmp_path / "plug")])}
    first = run_matrix(tmp_path / "res", f"impl={ref}", "cp_size=2", "seq_lens=[3,3]", "hidden_size=32", "iters=1",
                       "warmup=0", multirun=False, env=env, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    (row,) = first.rows()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    clean = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])}
    again = subprocess.run(["sh", "-c", row["repro"] + " --dry-run"], cwd=elsewhere, env=clean, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, (row["repro"], again.stderr[-2000:])
    assert f"impls={ref}" in again.stdout, again.stdout


def test_a_newline_in_a_carried_variable_is_kept_in_the_repro():
    """A repro is one line of a row: a newline in an NSA_* variable is
    written in bash's $'...' form (not folded to a space), and read back
    whole; bash reads it the same."""
    value = "line one\nline 'two'\tend\\"
    command = join([*env_prefix("padded", {"NSA_NOTE": value}, "/"), "python", "-c", "x"])
    assert "\n" not in command and "$'NSA_NOTE=line one\\nline \\'two\\'\\tend\\\\'" in command, command
    env, argv = split(command)
    assert env["NSA_NOTE"] == value and argv == ["python", "-c", "x"]
    shown = subprocess.run(["bash", "-c", command.replace("python -c x", "printenv NSA_NOTE")],
                           capture_output=True, text=True, check=True).stdout
    assert shown == value + "\n"


def test_bytes_that_are_not_utf8_in_a_carried_variable_are_kept_in_the_repro_and_the_row_is_written(
        tmp_path):
    """An NSA_* variable holding bytes that are not UTF-8 (Python reads them as lone surrogates):
    writing the row raised UnicodeEncodeError, a traceback and results.csv left empty (the row
    lost). The repro carries the bytes in bash's $'\\xHH' form, read back as Python reads them,
    and bash hands the same bytes on; any other cell holding such a byte is written \\xHH."""
    from compare_rows import make_row
    from matrix.store.results import append_rows, read_rows

    value = "a\udcff\udcfeb"  # os.environ's text of the bytes b"a\xff\xfeb"
    command = join([*env_prefix("padded", {"NSA_RAW": value}, "/"), "python", "-c", "x"])
    assert "$'NSA_RAW=a\\xff\\xfeb'" in command, command
    assert split(command)[0]["NSA_RAW"] == value
    shown = subprocess.run(["bash", "-c", command.replace("python -c x", "printenv NSA_RAW")], capture_output=True,
                           check=True).stdout
    assert shown == b"a\xff\xfeb\n"
    append_rows(tmp_path, [make_row("padded", repro=command, reason=f"seen {value}")])
    ((_, row),) = read_rows(tmp_path / "results.csv").rows
    assert row["repro"] == command and row["reason"] == "seen a\\xff\\xfeb", row
