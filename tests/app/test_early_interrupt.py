"""A Ctrl-C before the sweep's own handlers are in place is one line and exit 130.

In its first second a sweep imports Hydra and the app, then checks every point; a Ctrl-C there
printed a 34-line traceback and no word on what was left (the process died by the signal). It is
one line saying nothing ran or was written, exit 130, as a Ctrl-C later is one line with the
resume command (tests/app/test_hostile_sweeps.py drills those with real signals).
"""

from __future__ import annotations

import matrix.__main__ as entry
from matrix.app import sweep
from matrix_cli import run_python

# A Ctrl-C landing while Hydra is imported: the import itself raises it, as the signal would.
DURING_IMPORT = """\
import sys

class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "hydra":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, Interrupt())
import matrix.__main__ as entry
sys.exit(entry.main(sys.argv[1:]))
"""


def test_a_ctrl_c_while_the_app_imports_is_one_line(tmp_path):
    run = run_python("-c", DURING_IMPORT, "-m", f"results_dir={tmp_path / 'r'}", "cp_size=2", "seq_lens=[64]")
    assert run.returncode == 130, run.stderr[-2000:]
    assert run.stderr.strip() == entry.INTERRUPTED_EARLY and "Traceback" not in run.stdout + run.stderr, run.stderr


def test_a_ctrl_c_while_the_points_are_checked_is_one_line(tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "preflight", interrupted)
    assert entry.main(["-m", f"results_dir={tmp_path / 'r'}", "cp_size=2", "seq_lens=[64]"]) == 130
    assert capsys.readouterr().err.strip() == entry.INTERRUPTED_EARLY
    assert not (tmp_path / "r").exists()
