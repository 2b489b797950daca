"""``python -m benchmarks``: the side-by-side suite (see benchmarks/suite.py)."""
import sys

from .suite import main

sys.exit(main())
