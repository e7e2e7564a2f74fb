"""`python -m matrix.torchrun_point`: the command of matrix/app/torchrun_point.py."""

from ..app.torchrun_point import main

if __name__ == "__main__":
    raise SystemExit(main())
