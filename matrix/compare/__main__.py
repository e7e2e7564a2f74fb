"""`python -m matrix.compare`: the command of matrix/review/compare.py."""

from ..review.compare import main

if __name__ == "__main__":
    raise SystemExit(main())
