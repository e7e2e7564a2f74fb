"""`python -m matrix.report`: the command (matrix/report/cli.py)."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
