"""One measurement in this process: ``python -m benchmarks.child KIND JSON``; prints ``RESULT_TAG {json}``.

Run it by hand to profile one configuration, e.g.
``python -m benchmarks.child pipeline.zephon '{"runner": "threads", "format": "jsonl", "profile": 40,
"manifest": ...}'`` (the suite prints the exact JSON of every child with ``--verbose``).
"""
from __future__ import annotations

import importlib
import json
import sys
import traceback

from .common import emit


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    kind, cfg = argv[0], json.loads(argv[1])
    mod, fn = kind.split(".")
    try:
        res = getattr(importlib.import_module(f"benchmarks.{mod}"), f"child_{fn}")(cfg)
    except Exception as e:  # reported as a failed configuration, with the reason
        traceback.print_exc()
        emit({"error": f"{type(e).__name__}: {e}"[:500]})
        return 1
    emit(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
