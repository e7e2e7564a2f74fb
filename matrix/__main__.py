"""`python -m matrix`: the sweep (matrix/app/sweep.py)."""

from __future__ import annotations

import sys

# A Ctrl-C before the sweep's own handlers are in place (its imports, the check of every point):
# nothing has run or been written yet.
INTERRUPTED_EARLY = "interrupted before any point ran: nothing was written; run the command again to start the sweep"


def main(argv: list[str] | None = None) -> int:
    try:
        from .app.sweep import main as sweep  # Hydra and the app: seconds of imports on a loaded machine

        return sweep(argv)
    except KeyboardInterrupt:
        print(INTERRUPTED_EARLY, file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    from nsa_cp_comm.harness.pools import end_process

    try:
        code = main()
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    end_process(code)  # exit handlers bounded: a plug-in's may never return
