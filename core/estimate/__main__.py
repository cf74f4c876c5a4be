"""`python -m core.estimate ...`: the memory estimate on the command line (core/estimate/predict.py)."""

from core.estimate.predict import main

if __name__ == "__main__":
    raise SystemExit(main())
