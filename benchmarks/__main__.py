"""``python -m benchmarks``: the one entry point (sections and options: benchmarks/cli.py, ``--list``)."""
import sys

from .cli import main

sys.exit(main())
