"""`python -m matrix.report`: the command of matrix/review/report.py."""

from ..review.report import main

if __name__ == "__main__":
    raise SystemExit(main())
