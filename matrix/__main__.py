"""`python -m matrix`: the sweep (matrix/app/sweep.py)."""

from .app.sweep import main

if __name__ == "__main__":
    raise SystemExit(main())
