"""`python -m matrix`: the sweep (matrix/app/sweep.py)."""

from .app.sweep import main

if __name__ == "__main__":
    import sys

    from nsa_cp_comm.harness.ranks import end_process

    try:
        code = main()
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    end_process(code)  # exit handlers bounded: a plug-in's may never return
