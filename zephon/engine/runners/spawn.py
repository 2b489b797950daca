"""What a worker process of the ``processes`` runner starts with: how to unpickle the stage as ``multiprocessing``'s
spawn would, and the environment of the tokenizer's own thread pool."""
from __future__ import annotations

import os
import sys
from multiprocessing import process as mp_process


def preparation_data() -> dict:
    """What a spawned worker needs to unpickle the stage as ``multiprocessing``'s spawn would (sys.path,
    argv, working directory, the main module), without fixing the parent's start method."""
    orig = mp_process.ORIGINAL_DIR
    d = {"sys_path": [orig if p == "" else p for p in sys.path], "sys_argv": list(sys.argv),
         "dir": os.getcwd(), "orig_dir": orig}
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        d["init_main_from_name"] = name
    elif getattr(main, "__file__", None):
        d["init_main_from_path"] = os.path.normpath(os.path.join(orig or "", main.__file__))
    return d


def tokenizer_threads_env(num_workers: int, environ) -> dict:
    """What a worker's environment sets for the ``tokenizers`` thread pool (Rust rayon), unless ``environ`` (the
    parent's) already says: parallelism on, ``ceil(2 * cores / num_workers)`` threads per worker. A worker alone with
    a unit (the others idle, waiting for work) then still uses every core, as a whole batch spreads over the pool;
    when all are busy the cores are shared at most twice over. Returns the variables to set.

    num_workers: worker processes (>= 1).
    environ: the parent's environment (a mapping)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    out = {}
    if "TOKENIZERS_PARALLELISM" not in environ:
        out["TOKENIZERS_PARALLELISM"] = "true"
    if "RAYON_NUM_THREADS" not in environ:
        out["RAYON_NUM_THREADS"] = str(max(1, min(cores, -(-2 * cores // max(1, num_workers)))))
    return out
