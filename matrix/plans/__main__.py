"""`python -m matrix.plans`: the command of matrix/scale/plans.py."""

from ..scale.plans import main

if __name__ == "__main__":
    raise SystemExit(main())
