"""`python -m matrix.compare`: the command (matrix/compare/cli.py)."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
