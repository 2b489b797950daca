"""Internal: one measurement in a subprocess the suite starts, ``python -m benchmarks.child KIND JSON``.

KIND is ``module.fn`` under benchmarks/ (e.g. ``throughput.peers.zephon`` calls
``benchmarks.throughput.peers.child_zephon(cfg)``); prints ``RESULT_TAG {json}``. Not an entry point of its own
(``python -m benchmarks`` is): run it by hand only to profile one configuration, e.g.
``python -m benchmarks.child throughput.peers.zephon '{"runner": "threads", "format": "jsonl", "profile": 40,
"manifest": ...}'``.
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
    mod, fn = kind.rsplit(".", 1)
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
